# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A change rolled out across the fleet one batch at a time (playbooks/rollout.yml), as data and
decisions. Private to the collection.

``plan_rollout`` checks every rollout_* setting once and cuts the units that differ from their
plan into batches: a single instance is one unit, a cluster (every rank of it) is one unit, so a
cluster is always whole within one batch; the first batch is the canary. ``judge_unit`` holds a
relaunched unit to what it did before the change on the same machine the same day (seed 001
re-measured each release against the previous one there): no fewer correct answers and at most
the allowed changed ones, throughput and TPOT no worse than the measured spread plus a floor, and
no verdict on missing data: a repeat on either side that recorded nothing, or a run far outside
its siblings, keeps the last good settings.
``rollout_report`` is the Markdown page on the controller. Standard library only.
"""

from __future__ import annotations

import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import Range
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import BENCH_RANGES, CONCURRENCY
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_correctness import BUILTIN_CASES
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_sweep import (
    PathCheck,
    Setting,
    correctness_gate,
    figure,
    not_recorded,
    setting_value,
    single_run_note,
    summarise_variant,
    unsteady,
)

ROLLOUT_SETTINGS: tuple[Setting, ...] = (
    Setting("rollout_label", "label", "Names the report folder and the measurements' labels: letters, digits and _.- (61 at most)."),
    Setting("rollout_canary_size", "number", "Units in the first batch, the canary.",
            Range(1, 1000, "the canary is at least one unit", whole=True)),
    Setting("rollout_batch_size", "number", "Units in each batch after the canary.",
            Range(1, 1000, "a batch is at least one unit", whole=True)),
    Setting("rollout_repeats", "number", "Benchmark runs before and after each change; the spread needs at least two.",
            Range(1, 10, "each repeat reruns every concurrency on a drained unit; past 10 it adds time, not precision", whole=True)),
    Setting("rollout_concurrencies", "concurrencies", "Concurrencies benchmarked before and after, each once.", CONCURRENCY),
    Setting("rollout_noise_floor_pct", "number", "Least margin in percent, on top of the measured spread, a figure may worsen by "
            "before it is a regression.", Range(0, 50, "seed 001 saw 5 % run to run; past 50 % no regression is caught",
                                                unit="percent")),
    Setting("rollout_judge_speed", "bool", "Judge throughput and time per output token against the spread plus the floor; "
            "false judges answers, streams and failed requests only (figures that are not comparable, a box shared with "
            "other work) and the report says so."),
    Setting("rollout_max_changed_answers", "number", "Changed greedy answers against the settings before that a unit may show.",
            Range(0, len(BUILTIN_CASES) // 4, f"past a quarter of the {len(BUILTIN_CASES)} cases the diff no longer gates",
                  whole=True)),
    Setting("rollout_prompts_per_concurrency", "number", "Prompts per concurrency in each benchmark run.",
            BENCH_RANGES["prompts_per_concurrency"]),
    Setting("rollout_input_tokens", "number", "Prompt size of the benchmark, in tokens.", BENCH_RANGES["input_tokens"]),
    Setting("rollout_output_tokens", "number", "Tokens generated per benchmark request.", BENCH_RANGES["output_tokens"]),
    Setting("rollout_correctness_max_tokens", "number", "Tokens generated per correctness case.",
            Range(1, 4096, "the cases' answers are short; more tokens only lengthen the rollout", whole=True, unit="tokens")),
    Setting("rollout_prefix_cache", "choice", "How benchmark prompts avoid the prefix cache.", choices=("disjoint", "reset")),
    Setting("rollout_runner", "choice", "Where vllm bench runs.", choices=("auto", "exec", "container", "local")),
    Setting("rollout_documents_dir", "directory", "The controller folder of the benchmark's documents."),
    Setting("rollout_drain_force", "bool", "Drain a unit that is the only backend of a model group (its clients get the "
            "gateway's error instead of a relaunching backend); false refuses the batch."),
    Setting("rollout_drain_tasks", "tasks", "The task file that drains a batch's units at their gateways; empty for none."),
    Setting("rollout_undrain_tasks", "tasks", "The task file that undrains them; empty for none."),
)
# What decides a regression, per concurrency: (figure, higher is better).
JUDGED = (("output_throughput", True), ("mean_tpot_ms", False))


def host_units(host: str, facts: t.Mapping[str, t.Any]) -> list[dict[str, t.Any]]:
    """The single instances of one host as units, from its published vllm_drift (the plan's order)."""
    drift = facts.get("vllm_drift") if isinstance(facts.get("vllm_drift"), dict) else {}
    deployed = drift.get("deployed") or {}
    return [{"id": f"{host}/{name}", "kind": "instance", "name": name, "head": host, "hosts": [host], "config_dir": drift.get("config_dir"),
             "drift": list(reasons or []), "deployed": bool(deployed.get(name))}
            for name, reasons in (drift.get("drift") or {}).items()]


def cluster_units(hosts: t.Sequence[str], facts: t.Mapping[str, t.Mapping[str, t.Any]]) -> list[dict[str, t.Any]]:
    """Each cluster among the hosts as one unit, named after its head as the gateway routes it; it
    drifts when any node does, and counts as deployed when every node has last good settings."""
    units: dict[str, dict[str, t.Any]] = {}
    for host in hosts:
        own = facts.get(host) or {}
        name, nodes, drift = own.get("cluster_name"), own.get("cluster_nodes"), own.get("cluster_drift")
        if not name or not isinstance(nodes, list) or not nodes or not isinstance(drift, dict):
            continue
        unit = units.setdefault(name, {"id": f"{nodes[0]}/{name}", "kind": "cluster", "name": name, "head": nodes[0],
                                       "hosts": list(nodes), "config_dir": drift.get("config_dir"), "drift": [], "deployed": True})
        unit["drift"] += [f"{host}: {reason}" for reason in drift.get("drift") or []]
        unit["deployed"] = unit["deployed"] and bool(drift.get("deployed"))
    return list(units.values())


def measuring_slots(batch: t.Sequence[dict[str, t.Any]]) -> int:
    """Give each unit of a batch the first measuring slot no unit sharing a host with it holds (an
    instance and a cluster with a rank on its host would share its memory and cores while measured),
    and say how many slots the batch needs."""
    for unit in batch:
        taken = {other["slot"] for other in batch if "slot" in other and set(other["hosts"]) & set(unit["hosts"])}
        unit["slot"] = next(slot for slot in range(len(batch) + 1) if slot not in taken)
    return max((unit["slot"] for unit in batch), default=-1) + 1


def plan_rollout(hosts: t.Sequence[str], facts: t.Mapping[str, t.Mapping[str, t.Any]], settings: t.Mapping[str, t.Any],
                 exists: PathCheck) -> dict[str, t.Any]:
    """Every rollout_* setting checked, and the changed units cut into batches: ``{"settings",
    "batches" [{number, canary, units, hosts, drain}], "unchanged", "new", "errors"}``. A unit that was
    never deployed has nothing to be compared with: it is listed in ``new`` and left to site.yml."""
    values: dict[str, t.Any] = {}
    errors = []
    for setting in ROLLOUT_SETTINGS:
        value, problem = setting_value(setting, setting.name, settings.get(setting.name), [], exists)
        values[setting.name] = value
        errors += [problem] if problem else []
    units = [unit for host in hosts for unit in host_units(host, facts.get(host) or {})]
    units += cluster_units(hosts, facts)
    errors += [f"cluster {unit['name']}: {', '.join(sorted(set(unit['hosts']) - set(hosts)))} not in the play; a cluster rolls out whole, "
               "so give every node (rollout_hosts, --limit)" for unit in units if unit["kind"] == "cluster" and not set(unit["hosts"]) <= set(hosts)]
    changed = [unit for unit in units if unit["drift"] and unit["deployed"]]
    for number, unit in enumerate(changed, start=1):
        unit["key"] = f"u{number}"
    batches: list[dict[str, t.Any]] = []
    if not errors:
        canary, size = values["rollout_canary_size"], values["rollout_batch_size"]
        cuts = [changed[:canary]] + [changed[start:start + size] for start in range(canary, len(changed), size)]
        batches = [{"number": number, "canary": number == 1, "units": batch,
                    "hosts": sorted({host for unit in batch for host in unit["hosts"]}, key=list(hosts).index),
                    "drain": [unit["id"] for unit in batch], "slots": measuring_slots(batch)}
                   for number, batch in enumerate(cuts, start=1) if batch]
    unchanged = [unit["id"] for unit in units if not unit["drift"]]
    new = [unit["id"] for unit in units if unit["drift"] and not unit["deployed"]]
    shown = [f"batch {batch['number']}{' (canary)' if batch['canary'] else ''}: "
             + ", ".join(f"{unit['id']} ({'; '.join(unit['drift'])})" for unit in batch["units"]) for batch in batches]
    shown += [f"unchanged: {', '.join(unchanged) or 'none'}", f"never deployed, left to site.yml: {', '.join(new) or 'none'}"]
    return {"settings": values, "batches": batches, "errors": errors, "unchanged": unchanged, "new": new, "shown": shown}


def measured(correctness: t.Any, bench: t.Any, repeats: int) -> dict[str, t.Any]:
    """One side of a comparison: the correctness result and the benchmark's figures over the ``repeats`` asked for
    (a repeat that left no result is a missing one, not one fewer)."""
    return {"correctness": correctness if isinstance(correctness, dict) else None,
            "summary": summarise_variant(list(bench or []), repeats)}


# How each side's missing or unsteady measurement weighs: the new settings carry the burden of proof, so a failed
# repeat after the change counts against them; one before leaves nothing sound to compare with, and the change is
# not kept either (no verdict on missing data).
SIDES = (("before", "before the change", "the comparison is incomplete, so the change is not kept"),
         ("after", "after the change", "it counts against the new settings"))


def measurement_problems(before: t.Mapping[str, t.Any], after: t.Mapping[str, t.Any], concurrency: int,
                         settings: t.Mapping[str, t.Any]) -> list[str]:
    """Each repeat on either side that recorded nothing at ``concurrency``, and, when speed is judged, each run far
    outside its siblings in a judged figure, named with its figure and the median of the others."""
    problems = []
    for side, where, weight in SIDES:
        summary = (before if side == "before" else after)["summary"]
        # A concurrency no repeat recorded has no entry at all: every repeat is missing, not none.
        recorded = concurrency in summary or str(concurrency) in summary
        missing = not_recorded(summary, concurrency, where) if recorded else f"no repeat {where} recorded a run at concurrency {concurrency}"
        found = [missing] if missing else []
        if settings["rollout_judge_speed"]:
            found += [problem for name, _higher in JUDGED
                      for problem in unsteady(figure(summary, concurrency, name), name, f"at {concurrency} {where}")]
        problems += [f"{problem}: {weight}" for problem in found]
    return problems


def judge_unit(unit: t.Mapping[str, t.Any], launch: t.Mapping[str, t.Any], before: t.Mapping[str, t.Any] | None,
               after: t.Mapping[str, t.Any] | None, settings: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The unit's verdict: ``upgraded`` (keep the new settings), ``regressed`` (roll back to the last
    good ones) or ``failed`` (it did not serve; the transaction already rolled it back), with the reasons
    and the figures before and after. A repeat that recorded nothing or a run far outside its siblings, on
    either side, is regressed; a figure with one run a side is judged against the floor alone, and the
    verdict says its spread was not measured."""
    record = {"id": unit["id"], "kind": unit["kind"], "key": unit["key"], "drift": unit["drift"],
              "before": before, "after": after}
    if not launch.get("ok"):
        return {**record, "verdict": "failed", "ok": False,
                "reasons": [f"the new settings did not serve: {launch.get('msg') or 'the relaunch failed'}"]}
    if not before or not after or before.get("correctness") is None or after.get("correctness") is None:
        return {**record, "verdict": "regressed", "ok": False,
                "reasons": ["the unit could not be measured before and after the change, so nothing shows it is no worse"]}
    reasons = []
    gate = correctness_gate(before["correctness"], after["correctness"])
    limit = settings["rollout_max_changed_answers"]
    if not gate["ok"]:
        reasons.append(f"correctness: {gate['reason']}")
    elif len(gate["changed"]) > limit:
        reasons.append(f"correctness: {len(gate['changed'])} greedy answers changed ({', '.join(map(str, gate['changed']))}), "
                       f"more than rollout_max_changed_answers ({limit})")
    floor = settings["rollout_noise_floor_pct"]
    judged = JUDGED if settings["rollout_judge_speed"] else ()
    single_runs = []
    for concurrency in settings["rollout_concurrencies"]:
        reasons += measurement_problems(before, after, concurrency, settings)
        for name, higher_is_better in judged:
            old, new = figure(before["summary"], concurrency, name), figure(after["summary"], concurrency, name)
            if not old or not new or old.get("mean") is None or new.get("mean") is None:
                reasons.append(f"{name} at {concurrency}: not measured {'before' if not old or old.get('mean') is None else 'after'}")
                continue
            note = single_run_note((old, new), "rollout_noise_floor_pct")
            single_runs += [f"{name} at {concurrency}"] if note else []
            allowed = max(old["spread_pct"] or 0.0, new["spread_pct"] or 0.0) + floor
            change = (new["mean"] - old["mean"]) / old["mean"] * 100 if old["mean"] else 0.0
            worse = -change if higher_is_better else change
            if worse > allowed:
                reasons.append(f"{name} at {concurrency}: {old['mean']:.1f} before, {new['mean']:.1f} after, {worse:.1f} % worse "
                               f"(allowed: the spread plus rollout_noise_floor_pct, {allowed:.1f} %){note}")
        failed_old = (before["summary"].get(concurrency) or {}).get("failed", 0)
        failed_new = (after["summary"].get(concurrency) or {}).get("failed", 0)
        if failed_new > failed_old:
            reasons.append(f"failed requests at {concurrency}: {failed_old} before, {failed_new} after")
    if reasons:
        return {**record, "verdict": "regressed", "ok": False, "reasons": reasons}
    speed = (f"every figure within its spread plus {floor} %" if judged else
             "speed not judged (rollout_judge_speed false), no more failed requests")
    if single_runs:
        speed += (f"; spread not measured (one run) for {', '.join(single_runs)}: judged against rollout_noise_floor_pct "
                  "alone, set rollout_repeats to 2 or more to measure it")
    return {**record, "verdict": "upgraded", "ok": True, "reasons": [f"no worse than before: {gate['reason']}; {speed}"]}


def cell(side: t.Mapping[str, t.Any] | None, concurrency: int, name: str) -> str:
    entry = figure((side or {}).get("summary") or {}, concurrency, name)
    if not entry or entry.get("mean") is None:
        return "-"
    return f"{entry['mean']:.1f}" + (f" ±{entry['spread_pct'] / 2:.1f}%" if entry.get("n", 0) > 1 else "")


def passed(side: t.Mapping[str, t.Any] | None) -> str:
    correctness = (side or {}).get("correctness") or {}
    return f"{correctness['passed']}/{correctness.get('total', '?')}" if correctness.get("passed") is not None else "-"


def rollout_report(title: str, plan: t.Mapping[str, t.Any], records: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """The rollout's outcome: per unit its batch, the figures before and after, the verdict and why;
    units of batches that never started say so. ``ok`` is true when every batch ran and every unit
    upgraded."""
    by_id = {record["id"]: record for record in records}
    concurrencies = plan["settings"].get("rollout_concurrencies") or []
    lines = [f"# {title}", "", "| batch | unit | verdict | correct before | correct after | "
             + " | ".join(f"tok/s @{c} before | after | TPOT ms @{c} before | after" for c in concurrencies) + " |",
             "|" + "---|" * (5 + 4 * len(concurrencies))]
    rows, notes = [], []
    for batch in plan["batches"]:
        for unit in batch["units"]:
            record = by_id.get(unit["id"])
            verdict = record["verdict"] if record else "not started"
            figures = " | ".join(f"{cell(record and record['before'], c, 'output_throughput')} | "
                                 f"{cell(record and record['after'], c, 'output_throughput')} | "
                                 f"{cell(record and record['before'], c, 'mean_tpot_ms')} | "
                                 f"{cell(record and record['after'], c, 'mean_tpot_ms')}" for c in concurrencies)
            lines.append(f"| {batch['number']}{' (canary)' if batch['canary'] else ''} | {unit['id']} | {verdict} | "
                         f"{passed(record and record['before'])} | {passed(record and record['after'])} | {figures} |")
            rows.append({"batch": batch["number"], "id": unit["id"], "verdict": verdict,
                         "reasons": record["reasons"] if record else ["an earlier batch failed, so this batch never started"]})
            notes.append(f"- {unit['id']} ({verdict}): " + "; ".join(rows[-1]["reasons"]))
    lines += ["", "## Why", "", *notes]
    if plan.get("new"):
        lines += ["", "Never deployed, so nothing to compare with (left to site.yml): " + ", ".join(plan["new"])]
    ok = all(row["verdict"] == "upgraded" for row in rows)
    return {"ok": ok, "units": rows, "markdown": "\n".join(lines) + "\n"}
