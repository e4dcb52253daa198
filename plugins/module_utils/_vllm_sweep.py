# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The speculative-decoding sweep (seed 000 Step 3), as data and decisions. Private to the collection.

``plan_variants`` turns draft counts or setting overrides into variants, each with a stable id
(so a rerun skips what is done) and a simplicity rank (fewer draft tokens is simpler).
``summarise_variant`` folds a variant's repeated benchmark runs into mean, min, max and spread
per concurrency, naming each repeat that recorded nothing and each run far outside its siblings
(no verdict on missing data: one run has no spread, never a spread of zero); ``correctness_gate``
holds it to the baseline's passes; ``decide`` applies the objective: a more complex variant only
wins by more than the measured spread (seed 001 saw 5 % run to run), and a variant with a repeat
missing or a run far off is out. ``schedule`` recommends vLLM's per-batch-size draft counts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import statistics
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import (
    DRAFT_TOKENS_WHY,
    MAX_DRAFT_TOKENS,
    VERSION,
    Range,
    as_number,
    version_tuple,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import BENCH_RANGES, CONCURRENCY
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_correctness import BUILTIN_CASES
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import KEYS_BY_NAME

VARIANT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,60}")
DRAFT_COUNT = Range(0, MAX_DRAFT_TOKENS, "0 is the baseline without speculation; " + DRAFT_TOKENS_WHY, whole=True)
# The numbers a variant may change, bounded as the instance plan bounds them, so that a typo is
# refused before the first variant rather than when its turn comes hours later.
VARIANT_RANGES: dict[str, Range] = {
    **{name: Range(1, KEYS_BY_NAME[name].maximum or 1, KEYS_BY_NAME[name].bound, whole=True)
       for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len")},
    "gpu_memory_utilization": Range(0, 1, "a share of the whole memory pool", low_open=True, high_open=True),
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of playbooks/mtp_sweep.yml: how it is checked and documented."""

    name: str
    kind: str
    doc: str
    range: Range | None = None
    choices: tuple[str, ...] = ()


SWEEP_SETTINGS: tuple[Setting, ...] = (
    Setting("sweep_instance", "instance", "The instance to sweep, by name in the host's vllm_instances."),
    Setting("sweep_label", "label", "Names the result folder and the benchmark labels: letters, digits and _.- (61 at most)."),
    Setting("sweep_draft_counts", "draft_counts", f"Draft counts to try, 0 (the baseline) to {MAX_DRAFT_TOKENS}.",
            DRAFT_COUNT),
    Setting("sweep_variants", "variants", "Named setting overrides instead of draft counts: [{name, settings}]."),
    Setting("sweep_repeats", "number", "Benchmark runs of each variant; the spread needs at least two.",
            Range(1, 20, "each repeat reruns every concurrency; past 20 it adds hours, not precision", whole=True)),
    Setting("sweep_concurrencies", "concurrencies", "Concurrencies benchmarked, each once.", CONCURRENCY),
    Setting("sweep_target_concurrency", "concurrency", "The concurrency whose throughput decides; one of sweep_concurrencies."),
    Setting("sweep_single_stream", "concurrency", "The concurrency of the TPOT tie-break; one of sweep_concurrencies."),
    Setting("sweep_ttft_budget_ms", "optional", "Highest median TTFT at sweep_single_stream (the latency a user sees) a winner "
            "may have, in ms; null for none.",
            Range(0, 600_000, "a budget of 0 or less refuses every variant, past 10 minutes it refuses none", low_open=True,
                  unit="ms")),
    Setting("sweep_noise_floor_pct", "number", "Least margin in percent, on top of the measured spread, a more complex "
            "variant must win by.", Range(0, 50, "seed 001 saw 5 % run to run; no variant wins by more than 50 %, so the "
                                          "simplest would always stay", unit="percent")),
    Setting("sweep_max_changed_answers", "number", "Changed greedy answers the correctness gate accepts.",
            Range(0, len(BUILTIN_CASES) // 4, f"greedy answers should not change with the draft length; past a quarter of "
                  f"the {len(BUILTIN_CASES)} cases the gate no longer gates", whole=True)),
    Setting("sweep_prompts_per_concurrency", "number", "Prompts per concurrency in each benchmark run.",
            BENCH_RANGES["prompts_per_concurrency"]),
    Setting("sweep_input_tokens", "number", "Prompt size of the benchmark, in tokens.",
            BENCH_RANGES["input_tokens"]),
    Setting("sweep_output_tokens", "number", "Tokens generated per benchmark request.",
            BENCH_RANGES["output_tokens"]),
    Setting("sweep_acceptance_max_tokens", "number", "Tokens generated per acceptance prompt.",
            Range(1, 4096, "acceptance per category is a rate; more tokens only lengthen the sweep", whole=True, unit="tokens")),
    Setting("sweep_correctness_max_tokens", "number", "Tokens generated per correctness case.",
            Range(1, 4096, "the cases' answers are short; more tokens only lengthen the sweep", whole=True, unit="tokens")),
    Setting("sweep_prefix_cache", "choice", "How benchmark prompts avoid the prefix cache.", choices=("disjoint", "reset")),
    Setting("sweep_runner", "choice", "Where vllm bench runs.", choices=("auto", "exec", "container", "local")),
    Setting("sweep_keep_winner", "bool", "Leave the winner deployed (else the starting settings come back)."),
    Setting("sweep_documents_dir", "directory", "The controller folder of the benchmark's documents."),
    Setting("sweep_prompts_file", "file", "The controller file of the acceptance prompts per category."),
    Setting("sweep_drain_tasks", "tasks", "The task file that drains the host at its gateway; empty for none."),
    Setting("sweep_undrain_tasks", "tasks", "The task file that undrains it; empty for none."),
)
# A run beyond this factor of the median of its siblings (under half or over twice) is named, never averaged away:
# seed 001 saw 5 % run to run, so such a run measured something else (a throttled box, a restart, another load).
OUTLIER_FACTOR = 2.0
FIGURES = ("output_throughput", "mean_tpot_ms", "mean_ttft_ms", "median_ttft_ms", "mean_itl_ms", "p99_ttft_ms", "p99_itl_ms", "acceptance")
# Settings a variant may change; the rest (name, port, key, addresses, served names) is the instance's.
OVERRIDABLE = frozenset({"speculative", "max_num_batched_tokens", "max_num_seqs", "attention_backend", "moe_backend",
                         "kv_cache_dtype", "catalog", "model", "quantization", "prefix_caching", "extra_args", "env",
                         "gpu_memory_utilization", "max_model_len", "enforce_eager", "dtype", "async_scheduling"})
# The first release whose SpeculativeConfig has num_speculative_tokens_per_batch_size, as checked in the lab's image.
SCHEDULE_SINCE = "0.32.0"


def variant_id(overrides: t.Mapping[str, t.Any]) -> str:
    return hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:10]


def draft_count(instance: t.Mapping[str, t.Any]) -> int:
    speculative = instance.get("speculative")
    return speculative.get("num_speculative_tokens", 0) if isinstance(speculative, dict) else 0


def variant_setting_problems(where: str, settings: t.Mapping[str, t.Any]) -> list[str]:
    """A variant's settings reach the instance plan as given, so numbers must be numbers, not text."""
    errors = [p for key, bound in VARIANT_RANGES.items() if key in settings
              for p in bound.problems(f"{where}.settings.{key}", settings[key], text=False)]
    speculative = settings.get("speculative")
    if speculative is None:
        return errors
    if not isinstance(speculative, dict):
        return errors + [f"{where}.settings.speculative: {speculative!r} is not a mapping; give method, num_speculative_tokens "
                         "(and model for a drafter), as in vllm_instances"]
    if "num_speculative_tokens" in speculative:
        errors += DRAFT_COUNT.problems(f"{where}.settings.speculative.num_speculative_tokens", speculative["num_speculative_tokens"],
                                       text=False)
    return errors


def plan_variants(base: t.Mapping[str, t.Any] | None, draft_counts: t.Any = None, variants: t.Any = None) -> dict[str, t.Any]:
    """``{"variants": [...], "errors": [...]}``. ``draft_counts`` keeps the base's drafter and changes
    num_speculative_tokens (0 turns speculation off, the baseline); ``variants`` is a list of
    ``{"name": ..., "settings": {...}}`` overrides. Each variant: name, id (of its settings),
    settings (the overrides), draft_count, rank (0 = simplest). A base of None (no such instance,
    refused by the caller) still has the counts and variants checked, against no drafter."""
    errors: list[str] = []
    planned: list[dict[str, t.Any]] = []
    if variants:
        if not isinstance(variants, list):
            return {"variants": [], "errors": ["sweep_variants: a list of {name, settings}"]}
        for index, variant in enumerate(variants):
            where = f"sweep_variants[{index}]"
            if not isinstance(variant, dict) or not isinstance(variant.get("settings"), dict):
                errors.append(f"{where}: needs name and settings (a mapping of instance keys)")
                continue
            name = variant.get("name")
            if not isinstance(name, str) or not VARIANT_ID.fullmatch(name):
                errors.append(f"{where}.name: {name!r} must be lower-case letters, digits and dashes (it names result files)")
                continue
            unknown = sorted(set(variant["settings"]) - OVERRIDABLE)
            if unknown:
                errors.append(f"{where}.settings: {', '.join(unknown)} cannot change between variants "
                              "(they name or address the instance); overridable: " + ", ".join(sorted(OVERRIDABLE)))
                continue
            problems = variant_setting_problems(where, variant["settings"])
            if problems:
                errors += problems
                continue
            planned.append({"name": name, "settings": variant["settings"]})
    else:
        given = [0, 1, 2, 3, 4, 5] if draft_counts is None else draft_counts
        if not isinstance(given, list) or not given:
            return {"variants": [], "errors": [f"sweep_draft_counts: {given!r} is not a list of draft counts; give a non-empty "
                                               f"list of {DRAFT_COUNT.span()} ({DRAFT_COUNT.why})"]}
        problems = [p for index, k in enumerate(given) for p in DRAFT_COUNT.problems(f"sweep_draft_counts[{index}]", k)]
        if problems:
            return {"variants": [], "errors": problems}
        counts = [as_number(k, whole=True) for k in given]
        speculative = (base or {}).get("speculative") if isinstance((base or {}).get("speculative"), dict) else {}
        if any(counts) and base is not None and not speculative.get("method"):
            errors.append("sweep_draft_counts: the instance has no speculative method to vary; give it speculative "
                          "(method, and model for a drafter) or use sweep_variants")
        for count in sorted(set(counts)):
            settings = {"speculative": {**speculative, "num_speculative_tokens": count}} if count else {"speculative": {"num_speculative_tokens": 0}}
            planned.append({"name": f"k{count}", "settings": settings})
    names = [variant["name"] for variant in planned]
    errors += [f"sweep: variant name {name} is used twice" for name in sorted({n for n in names if names.count(n) > 1})]
    for variant in planned:
        merged = {**(base or {}), **variant["settings"]}
        variant["draft_count"] = draft_count(merged)
        variant["id"] = f"{variant['name']}-{variant_id(variant['settings'])}"
    # Fewer draft tokens is simpler; among equals, the order given.
    for rank, variant in enumerate(sorted(planned, key=lambda v: (v["draft_count"], planned.index(v)))):
        variant["rank"] = rank
    return {"variants": sorted(planned, key=lambda v: v["rank"]) if not errors else [], "errors": errors}


SETTINGS_BY_NAME = {setting.name: setting for setting in SWEEP_SETTINGS}
# vllm_sweep_report's objective, as the playbook fills it from its settings.
OBJECTIVE_SETTINGS = {"target_concurrency": "sweep_target_concurrency", "single_stream": "sweep_single_stream",
                      "ttft_budget_ms": "sweep_ttft_budget_ms", "noise_floor_pct": "sweep_noise_floor_pct"}
PathCheck = t.Callable[[str, str], bool]


def setting_value(setting: Setting, field: str, value: t.Any, concurrencies: t.Sequence[int],
                  exists: PathCheck) -> tuple[t.Any, str | None]:
    """One setting's value (numbers as numbers: extra vars arrive as text) and its problem, or None."""
    kind = setting.kind
    if kind in ("number", "optional"):
        if kind == "optional" and value in (None, ""):
            return None, None
        problem = setting.range.problem(field, value)
        if problem and isinstance(value, str) and value.strip().endswith("%"):
            problem += "; write the percent without %"
        return (None, problem) if problem else (as_number(value, setting.range.whole), None)
    if kind == "concurrencies":
        if not isinstance(value, list) or not value:
            return None, f"{field}: {value!r} is not a list of concurrencies; give a non-empty list of {CONCURRENCY.span()}"
        problems = [p for index, c in enumerate(value) for p in CONCURRENCY.problems(f"{field}[{index}]", c)]
        if problems:
            return None, "; ".join(problems)
        numbers = [as_number(c, whole=True) for c in value]
        if len(set(numbers)) != len(numbers):
            return None, f"{field}: {value!r} repeats a concurrency; give each once"
        return numbers, None
    if kind == "concurrency":
        number = as_number(value, whole=True)
        if number is None or number not in concurrencies:
            return None, f"{field}: {value!r} is not one of the concurrencies measured ({', '.join(map(str, concurrencies))}); give one"
        return number, None
    if kind == "label":
        ok = isinstance(value, str) and LABEL.fullmatch(value)
        return value, None if ok else (f"{field}: {value!r} is not a plain label; give letters, digits and _.- (at most 61, it "
                                       "names the result folder)")
    if kind == "choice":
        return value, None if value in setting.choices else f"{field}: {value!r} is not one of {', '.join(setting.choices)}; give one"
    if kind == "bool":
        # -e NAME=true arrives as text; only the two words are read as a switch, never a typo.
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true", None
        return value, None if isinstance(value, bool) else f"{field}: {value!r} is not true or false; give one"
    if kind == "tasks" and value == "":
        return value, None
    wanted = "directory" if kind == "directory" else "file"
    found = isinstance(value, str) and bool(value) and exists(wanted, value)
    what = setting.doc[0].lower() + setting.doc[1:].rstrip(".")
    return value, None if found else f"{field}: {value!r} is no {wanted} on the controller; give {what}"


def plan_sweep(instances: t.Any, settings: t.Mapping[str, t.Any], exists: PathCheck) -> dict[str, t.Any]:
    """Every setting of playbooks/mtp_sweep.yml checked at once, before the first variant, and the
    variants planned: ``{"base", "variants", "settings", "errors"}``; ``settings`` holds the checked
    values (numbers as numbers), ``variants`` is empty when there is any error. ``exists(kind, path)``
    says whether the controller has that directory or file."""
    present = [i for i in instances if isinstance(i, dict)] if isinstance(instances, list) else []
    name = settings.get("sweep_instance")
    base = next((i for i in present if isinstance(name, str) and i.get("name") == name), None)
    errors = [] if base is not None else [
        f"sweep_instance: {name!r} is not an instance of this host's vllm_instances "
        f"({', '.join(str(i.get('name')) for i in present) or 'none'}); give one with -e sweep_instance=NAME"]
    values: dict[str, t.Any] = {"sweep_instance": name}
    for setting in SWEEP_SETTINGS:
        # The draft counts and the variants are plan_variants' to check; a concurrency is only
        # judged against concurrencies that are themselves right.
        if setting.kind in ("instance", "draft_counts", "variants") or (
                setting.kind == "concurrency" and values.get("sweep_concurrencies") is None):
            continue
        value, problem = setting_value(setting, setting.name, settings.get(setting.name), values.get("sweep_concurrencies"), exists)
        values[setting.name] = value
        errors += [problem] if problem else []
    planned = plan_variants(base, settings.get("sweep_draft_counts"), settings.get("sweep_variants") or None)
    errors += planned["errors"]
    return {"base": base or {}, "variants": [] if errors else planned["variants"], "settings": values, "errors": errors}


def objective_problems(objective: t.Mapping[str, t.Any], concurrencies: t.Any,
                       max_num_seqs: t.Any) -> tuple[dict[str, t.Any], list[str]]:
    """vllm_sweep_report's options checked as the sweep's settings are, each named by its option:
    the objective with its numbers as numbers, and every problem."""
    errors = []
    measured, problem = setting_value(SETTINGS_BY_NAME["sweep_concurrencies"], "concurrencies", concurrencies, [],
                                      lambda _kind, _path: False)
    errors += [problem] if problem else []
    checked = {"single_stream": 1, "ttft_budget_ms": None, "noise_floor_pct": 0.0, **objective}
    for key, name in OBJECTIVE_SETTINGS.items():
        if key == "target_concurrency" and key not in objective:
            errors.append("objective.target_concurrency: missing; give the concurrency whose throughput decides")
            continue
        if measured is None and SETTINGS_BY_NAME[name].kind == "concurrency":
            continue
        checked[key], found = setting_value(SETTINGS_BY_NAME[name], f"objective.{key}", checked.get(key), measured,
                                            lambda _kind, _path: False)
        errors += [found] if found else []
    return checked, errors + VARIANT_RANGES["max_num_seqs"].problems("max_num_seqs", max_num_seqs)


def is_number(value: t.Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def far_from(value: float, median: float) -> bool:
    """Beyond OUTLIER_FACTOR of the median either way; against a median of zero, anything above it."""
    if median <= 0:
        return value > 0
    return value < median / OUTLIER_FACTOR or value > median * OUTLIER_FACTOR


def outliers(values: t.Sequence[t.Any]) -> list[dict[str, t.Any]]:
    """The runs of one figure far outside their siblings, by repeat (``values`` in repeat order, None where a repeat
    has no figure), each with the median of the others. With three runs or more, a run beyond OUTLIER_FACTOR of the
    median of all of them (which one run far off cannot move, where the median of the other two would be pulled
    halfway to it); with two that far apart, both, since two runs cannot tell which is off; one run has no sibling."""
    measured = [(repeat, value) for repeat, value in enumerate(values, start=1) if is_number(value)]
    if len(measured) < 2:
        return []
    middle = statistics.median(value for _repeat, value in measured)
    found = []
    for repeat, value in measured:
        others = statistics.median(other for number, other in measured if number != repeat)
        if far_from(value, others if len(measured) == 2 else middle):
            found.append({"repeat": repeat, "value": value, "median_of_others": others, "runs": len(measured)})
    return found


def spread(values: t.Sequence[t.Any]) -> dict[str, t.Any]:
    """mean, min, max and spread (max - min, in percent of the mean) of repeated figures, given in repeat order (None
    where a repeat has none), with the runs far outside their siblings. One run has no spread: spread_pct is None,
    never a zero it did not measure."""
    numbers = [v for v in values if is_number(v)]
    if not numbers:
        return {"mean": None, "min": None, "max": None, "spread_pct": None, "n": 0, "outliers": []}
    mean = statistics.fmean(numbers)
    measured_spread = ((max(numbers) - min(numbers)) / mean * 100 if mean else 0.0) if len(numbers) > 1 else None
    return {"mean": mean, "min": min(numbers), "max": max(numbers), "spread_pct": measured_spread, "n": len(numbers),
            "outliers": outliers(values)}


def repeat_runs(repeat: t.Any) -> tuple[list[t.Mapping[str, t.Any]], str]:
    """A vllm_bench result's runs and, for a repeat that recorded none, why."""
    if not isinstance(repeat, dict) or not isinstance(repeat.get("runs"), list):
        return [], "it left no benchmark result"
    why = "; ".join(str(reason) for reason in repeat.get("reasons") or []) or repeat.get("msg") or "it recorded no run there"
    return [run for run in repeat["runs"] if isinstance(run, dict)], why


def summarise_variant(repeats: t.Sequence[t.Any], expected: int = 0) -> dict[int, dict[str, t.Any]]:
    """Per concurrency, each figure of FIGURES over the repeats (each a vllm_bench result; a run it did not record,
    one with reasons, gives no figure), acceptance per draft position averaged over them, the failed requests of the
    runs recorded, ``repeats`` (how many there were) and ``missing``: each repeat, numbered from 1, that recorded no
    run at that concurrency, and why. ``expected`` is the repeats asked for: one that left no result at all is missing too."""
    count = max(len(repeats), expected)
    read = [repeat_runs(repeats[index]) if index < len(repeats) else ([], "it left no benchmark result") for index in range(count)]
    concurrencies = sorted({int(run["concurrency"]) for runs, _why in read for run in runs})
    summary = {}
    for concurrency in concurrencies:
        chosen: list[t.Mapping[str, t.Any] | None] = []
        missing = []
        for number, (runs, why) in enumerate(read, start=1):
            found = next((run for run in runs if int(run["concurrency"]) == concurrency), None)
            recorded = found is not None and not found.get("reasons")
            chosen.append(found if recorded else None)
            if not recorded:
                missing.append({"repeat": number, "why": "; ".join(found["reasons"]) if found else why})
        entry: dict[str, t.Any] = {figure: spread([run.get(figure) if run else None for run in chosen]) for figure in FIGURES}
        # vllm_bench reports each position as {position, accepted, rate}.
        positions = [[p["rate"] for p in run.get("acceptance_per_position") or []] for run in chosen if run]
        width = max((len(p) for p in positions), default=0)
        entry["acceptance_per_position"] = [spread([p[i] for p in positions if len(p) > i])["mean"] for i in range(width)]
        entry["failed"] = sum(int(run.get("failed") or 0) for run in chosen if run)
        entry.update(repeats=count, missing=missing)
        summary[concurrency] = entry
    return summary


def unsteady(entry: t.Mapping[str, t.Any] | None, name: str, where: str, pairs: bool = True) -> list[str]:
    """Each run of a figure far outside its siblings, named with its figure and the median of the others; with ``pairs``
    also two runs that disagree beyond the factor (which of them is off, two runs cannot tell)."""
    found = (entry or {}).get("outliers") or []
    if len(found) == 2 and all(o["runs"] == 2 for o in found):
        if not pairs:
            return []
        first, second = found
        return [f"{name} {where}: repeats {first['repeat']} and {second['repeat']} disagree, {first['value']:.1f} and "
                f"{second['value']:.1f}, more than {OUTLIER_FACTOR:g}x apart (two runs cannot tell which is off)"]
    return [f"{name} {where}: repeat {o['repeat']} ran at {o['value']:.1f} against {o['median_of_others']:.1f}, the median of "
            f"the others (beyond {OUTLIER_FACTOR:g}x)" for o in found]


def not_recorded(summary: t.Mapping[t.Any, t.Any], concurrency: int, where: str) -> str | None:
    """The repeats that recorded nothing at a concurrency, named with why; None when every repeat did."""
    entry = summary.get(concurrency) or summary.get(str(concurrency)) or {}
    missing = entry.get("missing") or []
    if not missing:
        return None
    named = "; ".join(f"repeat {m['repeat']}: {m['why']}" for m in missing)
    return f"{len(missing)} of {entry.get('repeats', '?')} repeat(s){' ' + where if where else ''} recorded no run at concurrency {concurrency} ({named})"


def correctness_gate(baseline: t.Mapping[str, t.Any] | None, variant: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The variant passes no fewer cases than the baseline, streams what it answers whole, keeps under load the answers
    it gave right alone (vllm 46669: async scheduling with drafts corrupts answers only above concurrency 1) and, where
    the instance has a tool-call parser, calls the tool (seed 003: a speculative MoE variant can scramble streams); its
    changed greedy answers are listed either way. The baseline is held to the last three itself."""
    changed = [case.get("id") for case in variant.get("changed_cases") or []]
    broken = [f"{len(variant['stream_mismatches'])} streamed answers differ from the whole ones"
              f" ({', '.join(str(m.get('id')) for m in variant['stream_mismatches'])})"] if variant.get("stream_mismatches") else []
    tool_call = variant.get("tool_call")
    broken += [f"the tool-call case failed: {tool_call.get('reason')}"] if isinstance(tool_call, dict) and tool_call.get("pass") is False else []
    load = variant.get("load") if isinstance(variant.get("load"), dict) else {}
    corrupted = [c for c in load.get("corrupted") or [] if isinstance(c, dict)]
    if corrupted:
        named = ", ".join(f"{c.get('id')}: {c.get('reason')}" for c in corrupted)
        broken.append(f"{len(corrupted)} answers right alone went wrong with {load.get('concurrency')} requests in flight ({named})")
    if baseline is None:
        return {"ok": not broken, "passed": variant.get("passed"), "baseline_passed": None, "changed": changed,
                "reason": "; ".join(["the baseline itself", *broken])}
    ok = (variant.get("passed") or 0) >= (baseline.get("passed") or 0) and not broken
    reason = (f"{variant.get('passed')} of {variant.get('total')} cases pass, the baseline {baseline.get('passed')}"
              + (f"; {len(changed)} answers changed: {', '.join(map(str, changed))}" if changed else "; no answer changed")
              + "".join(f"; {problem}" for problem in broken))
    return {"ok": ok, "passed": variant.get("passed"), "baseline_passed": baseline.get("passed"), "changed": changed,
            "reason": reason}


def figure(summary: t.Mapping[t.Any, t.Any], concurrency: int, name: str) -> dict[str, t.Any] | None:
    entry = summary.get(concurrency) or summary.get(str(concurrency))
    return entry.get(name) if entry else None


def beats(challenger: t.Mapping[str, t.Any] | None, holder: t.Mapping[str, t.Any] | None, higher_is_better: bool,
          noise_floor_pct: float) -> bool:
    """Whether ``challenger`` is better than ``holder`` by more than the larger of their spreads (and the floor)."""
    if not challenger or not holder or challenger["mean"] is None or holder["mean"] is None or not holder["mean"]:
        return False
    margin = max(challenger["spread_pct"] or 0.0, holder["spread_pct"] or 0.0, noise_floor_pct) / 100
    if higher_is_better:
        return challenger["mean"] > holder["mean"] * (1 + margin)
    return challenger["mean"] < holder["mean"] * (1 - margin)


def single_run_note(entries: t.Sequence[t.Mapping[str, t.Any] | None], floor_setting: str) -> str:
    """Said beside a comparison of figures one of which has a single run: its spread was not measured (never taken
    as zero), so the margin is the floor alone."""
    if any(entry and entry.get("mean") is not None and entry.get("n", 0) < 2 for entry in entries):
        return f" (spread not measured: one run, so the margin is {floor_setting} alone)"
    return ""


def decide(results: t.Sequence[t.Mapping[str, t.Any]], objective: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The winner among the variants that started and passed the gate (and the TTFT budget).

    ``results``: per variant name, rank, draft_count, status ("ok" or "failed"), gate, summary.
    ``objective``: target_concurrency, single_stream (concurrency of the TPOT tie-break, 1),
    ttft_budget_ms (or None: the highest median TTFT at the single stream, what a user waits for the first token) and
    noise_floor_pct. Simplest first; a more complex variant takes
    over only when its throughput at the target concurrency is higher by more than the spread,
    or, within the spread, its TPOT at one stream is lower by more than the spread."""
    target, single = objective["target_concurrency"], objective.get("single_stream", 1)
    floor, budget = objective.get("noise_floor_pct", 0.0), objective.get("ttft_budget_ms")
    reasons, candidates = [], []
    for result in sorted(results, key=lambda r: r["rank"]):
        name = result["name"]
        if result["status"] != "ok":
            reasons.append(f"{name}: out, {result.get('reason') or 'it did not start'}")
            continue
        if not result["gate"]["ok"]:
            reasons.append(f"{name}: out, correctness gate: {result['gate']['reason']}")
            continue
        throughput = figure(result["summary"], target, "output_throughput")
        if not throughput or throughput["mean"] is None:
            reasons.append(f"{name}: out, no throughput measured at concurrency {target}")
            continue
        # A repeat that recorded nothing, or a run far outside its siblings, counts against the variant.
        unmeasured = [found for found in (not_recorded(result["summary"], concurrency, "") for concurrency in sorted({target, single})) if found]
        # Two repeats that disagree name no run to rule out: the report's notes name them, and their spread widens the
        # margin a challenger must beat (on a busy box two short runs can differ several times over).
        unmeasured += unsteady(throughput, "output throughput", f"at concurrency {target}", pairs=False)
        unmeasured += unsteady(figure(result["summary"], single, "mean_tpot_ms"), "mean TPOT", f"at concurrency {single}", pairs=False)
        if unmeasured:
            reasons.append(f"{name}: out, " + "; ".join(unmeasured))
            continue
        ttft = figure(result["summary"], single, "median_ttft_ms")
        if budget is not None and (not ttft or ttft["mean"] is None):
            reasons.append(f"{name}: out, no median TTFT measured at concurrency {single} to hold against the budget of {budget} ms")
            continue
        if budget is not None and ttft["mean"] > budget:
            reasons.append(f"{name}: out, median TTFT {ttft['mean']:.1f} ms at concurrency {single} (the repeats' mean) is over "
                           f"the budget of {budget} ms")
            continue
        candidates.append(result)
    if not candidates:
        return {"ok": False, "winner": None, "reasons": reasons + ["no variant passed; the starting settings stay"]}
    winner = candidates[0]
    reasons.append(f"{winner['name']}: the simplest variant that passed")
    for challenger in candidates[1:]:
        challenger_throughput = figure(challenger["summary"], target, "output_throughput")
        winner_throughput = figure(winner["summary"], target, "output_throughput")
        compared = (challenger_throughput, winner_throughput, figure(challenger["summary"], single, "mean_tpot_ms"),
                    figure(winner["summary"], single, "mean_tpot_ms"))
        note = single_run_note(compared, "sweep_noise_floor_pct")
        if beats(challenger_throughput, winner_throughput, True, floor):
            reasons.append(f"{challenger['name']}: wins over {winner['name']}, {challenger_throughput['mean']:.1f} against "
                           f"{winner_throughput['mean']:.1f} tok/s at concurrency {target}, beyond the spread{note}")
            winner = challenger
            continue
        if not beats(winner_throughput, challenger_throughput, True, floor) and beats(compared[2], compared[3], False, floor):
            reasons.append(f"{challenger['name']}: wins over {winner['name']}, throughput within the spread and a lower TPOT "
                           f"at concurrency {single} beyond the spread{note}")
            winner = challenger
            continue
        reasons.append(f"{challenger['name']}: does not beat {winner['name']} by more than the spread{note}; the simpler one stays")
    return {"ok": True, "winner": winner["name"], "reasons": reasons}


def schedule(results: t.Sequence[t.Mapping[str, t.Any]], concurrencies: t.Sequence[int], max_num_seqs: int,
             noise_floor_pct: float) -> list[list[int]] | None:
    """vLLM's num_speculative_tokens_per_batch_size: for each measured concurrency the draft count that
    wins there (same spread rule), as inclusive batch-size ranges up to max_num_seqs. None when fewer
    than two speculative variants passed."""
    passed = [r for r in results if r["status"] == "ok" and r["gate"]["ok"] and r["draft_count"] > 0]
    if len(passed) < 2:
        return None
    chosen = []
    for concurrency in sorted(concurrencies):
        best = decide(passed, {"target_concurrency": concurrency, "single_stream": concurrency, "noise_floor_pct": noise_floor_pct})
        winner = next(r for r in passed if r["name"] == best["winner"]) if best["ok"] else None
        chosen.append((concurrency, winner["draft_count"] if winner else 0))
    ranges, start = [], 1
    for index, (concurrency, count) in enumerate(chosen):
        end = max_num_seqs if index == len(chosen) - 1 else concurrency
        if ranges and ranges[-1][2] == count:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, count])
        start = end + 1
    return ranges


def cell(entry: t.Mapping[str, t.Any] | None, pattern: str, scale: float = 1.0) -> str:
    """A figure as mean with its spread, for the report."""
    if not entry or entry.get("mean") is None:
        return "-"
    text = pattern.format(entry["mean"] * scale)
    return text + (f" ±{entry['spread_pct'] / 2:.1f}%" if entry.get("n", 0) > 1 else "")


def measurement_notes(summary: t.Mapping[t.Any, t.Any]) -> list[str]:
    """What the report says of a variant's figures beside its table: the repeats that recorded nothing, the runs far
    outside their siblings, and the concurrencies whose figures had one run, so no spread."""
    notes = []
    for concurrency in sorted(int(c) for c in summary):
        entry = figure(summary, concurrency, "output_throughput") or {}
        notes += [found for found in (not_recorded(summary, concurrency, ""),) if found]
        notes += [found for name, label in (("output_throughput", "output throughput"), ("mean_tpot_ms", "mean TPOT"))
                  for found in unsteady(figure(summary, concurrency, name), label, f"at concurrency {concurrency}")]
        if entry.get("n") == 1:
            notes.append(f"spread not measured at concurrency {concurrency}: one run")
    return notes


def report_markdown(title: str, results: t.Sequence[t.Mapping[str, t.Any]], decision: t.Mapping[str, t.Any],
                    objective: t.Mapping[str, t.Any]) -> str:
    """The sweep report: the decision, then a table per variant (spread is half the min-max range, in
    percent of the mean) and acceptance per draft position and per category."""
    lines = [f"# {title}", "",
             f"Objective: highest output throughput at concurrency {objective['target_concurrency']}, then lowest TPOT at "
             f"concurrency {objective.get('single_stream', 1)}; a more complex variant must win by more than the measured "
             f"spread (floor {objective.get('noise_floor_pct', 0)} %)"
             + (f"; median TTFT at concurrency {objective.get('single_stream', 1)} at most {objective['ttft_budget_ms']} ms"
                if objective.get("ttft_budget_ms") is not None else "")
             + ".", "",
             f"**Winner: {decision.get('winner') or 'none'}**", ""]
    lines += [f"- {reason}" for reason in decision.get("reasons", [])]
    if decision.get("schedule_note"):
        lines += ["", decision["schedule_note"]]
    for result in sorted(results, key=lambda r: r["rank"]):
        gate = result.get("gate") or {}
        lines += ["", f"## {result['name']} (draft tokens {result['draft_count']}): {result['status']}", "",
                  f"Settings: `{json.dumps(result.get('settings', {}), sort_keys=True)}`", ""]
        if result["status"] != "ok":
            lines.append(f"Not measured: {result.get('reason') or 'it did not start'}.")
            continue
        lines.append(f"Correctness: {gate.get('reason', '-')} ({'passes' if gate.get('ok') else 'fails'} the gate).")
        if not result["summary"]:
            lines += ["", "Not benchmarked: the correctness gate rejected it."]
            continue
        unsound = measurement_notes(result["summary"])
        if unsound:
            lines += ["", "Not sound:", "", *[f"- {note}" for note in unsound]]
        lines += ["",
                  "| concurrency | median TTFT ms | mean TTFT ms | mean TPOT ms | mean ITL ms | output tok/s | acceptance | per position |",
                  "|---:|---:|---:|---:|---:|---:|---:|---|"]
        for concurrency, entry in sorted((int(c), e) for c, e in result["summary"].items()):
            positions = ", ".join(f"{rate * 100:.0f}%" for rate in entry.get("acceptance_per_position") or [] if rate is not None)
            lines.append(f"| {concurrency} | {cell(entry.get('median_ttft_ms'), '{:.1f}')} | {cell(entry['mean_ttft_ms'], '{:.1f}')} "
                         f"| {cell(entry['mean_tpot_ms'], '{:.2f}')} "
                         f"| {cell(entry['mean_itl_ms'], '{:.2f}')} | {cell(entry['output_throughput'], '{:.1f}')} "
                         f"| {cell(entry['acceptance'], '{:.1f}%', 100)} | {positions or '-'} |")
        categories = result.get("categories") or {}
        if categories:
            lines += ["", "| category | requests | output tokens | acceptance | mean acceptance length |", "|---|---:|---:|---:|---:|"]
            for name, found in categories.items():
                rate = found.get("acceptance")
                length = found.get("mean_acceptance_length")
                lines.append(f"| {name} | {found.get('requests')} | {found.get('output_tokens')} "
                             f"| {f'{rate * 100:.1f}%' if rate is not None else '-'} | {f'{length:.2f}' if length else '-'} |")
    return "\n".join(lines) + "\n"


def figures_readable(entry: t.Any) -> bool:
    return isinstance(entry, dict) and all(
        entry.get(name) is None or (isinstance(entry[name], dict) and {"mean", "spread_pct"} <= set(entry[name])) for name in FIGURES)


def record_problems(results: t.Sequence[t.Any]) -> list[str]:
    """Why variant records cannot be decided on or reported, each named. The records are files a
    rerun keeps from earlier runs, so one from an interrupted run or edited by hand is refused here."""
    errors = []
    for index, record in enumerate(results):
        where = f"results[{index}]"
        wrong = [key for key, kind in (("name", str), ("rank", int), ("draft_count", int), ("status", str))
                 if not isinstance(record, dict) or not isinstance(record.get(key), kind) or isinstance(record.get(key), bool)]
        if wrong:
            errors.append(f"{where}: {', '.join(wrong)} missing or of the wrong type; give the records vllm_sweep_record wrote")
            continue
        if record["status"] != "ok":
            continue
        gate, summary = record.get("gate"), record.get("summary")
        if not isinstance(gate, dict) or not isinstance(gate.get("ok"), bool) or "reason" not in gate:
            errors.append(f"{where} ({record['name']}).gate: {gate!r} is not a verdict with ok and reason; give the records "
                          "vllm_sweep_record wrote")
        if not isinstance(summary, dict) or not all(str(c).isdigit() and figures_readable(e) for c, e in summary.items()):
            errors.append(f"{where} ({record['name']}).summary: not figures per concurrency (each figure with mean and "
                          "spread_pct); give the records vllm_sweep_record wrote")
    return errors


def schedule_note(results: t.Sequence[t.Mapping[str, t.Any]], concurrencies: t.Sequence[int], max_num_seqs: int,
                  noise_floor_pct: float, vllm_version: str) -> tuple[list[list[int]] | None, str]:
    """The per-batch-size schedule, when the release served has it, and the sentence saying why there is one or none."""
    if not vllm_version or version_tuple(vllm_version) < version_tuple(SCHEDULE_SINCE):
        return None, (f"No per-batch-size schedule: vLLM {vllm_version or '(release unknown; set vllm_version)'} is not known "
                      f"to have num_speculative_tokens_per_batch_size (vLLM {SCHEDULE_SINCE} has it).")
    recommended = schedule(results, concurrencies, max_num_seqs, noise_floor_pct)
    return recommended, ("Per-batch-size schedule (speculative options num_speculative_tokens_per_batch_size, ranges inclusive): "
                         f"{json.dumps(recommended)}." if recommended else
                         "No per-batch-size schedule: fewer than two speculative variants passed.")


def plot_series(results: t.Sequence[t.Mapping[str, t.Any]], target: int, single: int) -> dict[str, t.Any] | None:
    """What sweep.png draws against the draft count of each measured variant: throughput at the target
    concurrency, TPOT at one stream and acceptance; None when no variant was measured."""
    measured = sorted((r for r in results if r["status"] == "ok"), key=lambda r: r["draft_count"])
    if not measured:
        return None

    def means(concurrency: int, name: str, scale: int = 1) -> list[float]:
        return [((figure(r["summary"], concurrency, name) or {}).get("mean") or 0) * scale for r in measured]

    return {"draft_counts": [r["draft_count"] for r in measured],
            "series": [(f"output tok/s at c={target}", means(target, "output_throughput")),
                       (f"mean TPOT ms at c={single}", means(single, "mean_tpot_ms")),
                       (f"acceptance % at c={target}", means(target, "acceptance", 100))]}


def sweep_report(title: str, results: t.Sequence[t.Any], objective: t.Mapping[str, t.Any], concurrencies: t.Any,
                 max_num_seqs: t.Any, vllm_version: str) -> dict[str, t.Any]:
    """vllm_sweep_report's decision and files, but the drawing: ``errors`` (every problem of the options,
    each named by its option; when any, nothing else is filled in), ``decision`` (ok, winner, reasons,
    schedule, schedule_note, winner_settings), ``markdown``, ``files`` (decision.json and report.md as
    bytes) and ``plot`` (plot_series)."""
    checked, errors = objective_problems(objective, concurrencies, max_num_seqs)
    if vllm_version and not VERSION.fullmatch(vllm_version):
        errors.append(f"vllm_version: {vllm_version!r} is not a vLLM release; give the image's release such as 0.32.0 "
                      "(0.32.0rc1, 0.33.0.dev5 and 0.32.0+cpu are read as their release), or leave it empty")
    errors += record_problems(results)
    if errors:
        return {"errors": errors}
    decision = decide(results, checked)
    recommended, note = schedule_note(results, concurrencies, max_num_seqs, checked["noise_floor_pct"], vllm_version)
    winner = next((r for r in results if r["name"] == decision["winner"]), None)
    decision.update(schedule=recommended, schedule_note=note, winner_settings=(winner or {}).get("settings") or {})
    markdown = report_markdown(title, results, decision, checked)
    document = {**decision, "objective": checked, "variants": sorted(results, key=lambda r: r["rank"])}
    return {"errors": [], "decision": decision, "markdown": markdown,
            "files": {"decision.json": (json.dumps(document, indent=1, sort_keys=True) + "\n").encode(), "report.md": markdown.encode()},
            "plot": plot_series(results, checked["target_concurrency"], checked["single_stream"])}
