# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The speculative-decoding sweep (seed 000 Step 3), as data and decisions. Private to the collection.

``plan_variants`` turns draft counts or setting overrides into variants, each with a stable id
(so a rerun skips what is done) and a simplicity rank (fewer draft tokens is simpler).
``summarise_variant`` folds a variant's repeated benchmark runs into mean, min, max and spread
per concurrency; ``correctness_gate`` holds it to the baseline's passes; ``decide`` applies
the objective: a more complex variant only wins by more than the measured spread (seed 001
saw 5 % run to run). ``schedule`` recommends vLLM's per-batch-size draft counts.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import typing as t

VARIANT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")
FIGURES = ("output_throughput", "mean_tpot_ms", "mean_ttft_ms", "mean_itl_ms", "p99_ttft_ms", "p99_itl_ms", "acceptance")
# Settings a variant may change; the rest (name, port, key, addresses, served names) is the instance's.
OVERRIDABLE = frozenset({"speculative", "max_num_batched_tokens", "max_num_seqs", "attention_backend", "moe_backend",
                         "kv_cache_dtype", "catalog", "model", "quantization", "prefix_caching", "extra_args", "env",
                         "gpu_memory_utilization", "max_model_len", "enforce_eager", "dtype"})
CATEGORIES = ("code", "prose", "chat", "structured")


def variant_id(overrides: t.Mapping[str, t.Any]) -> str:
    return hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:10]


def draft_count(instance: t.Mapping[str, t.Any]) -> int:
    speculative = instance.get("speculative")
    return speculative.get("num_speculative_tokens", 0) if isinstance(speculative, dict) else 0


def plan_variants(base: t.Mapping[str, t.Any], draft_counts: t.Any = None, variants: t.Any = None) -> dict[str, t.Any]:
    """``{"variants": [...], "errors": [...]}``. ``draft_counts`` keeps the base's drafter and changes
    num_speculative_tokens (0 turns speculation off, the baseline); ``variants`` is a list of
    ``{"name": ..., "settings": {...}}`` overrides. Each variant: name, id (of its settings),
    settings (the overrides), draft_count, rank (0 = simplest)."""
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
            planned.append({"name": name, "settings": variant["settings"]})
    else:
        counts = [0, 1, 2, 3, 4, 5] if draft_counts is None else draft_counts
        if not isinstance(counts, list) or not counts or not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= 16 for k in counts):
            return {"variants": [], "errors": [f"sweep_draft_counts: {counts!r} must be a list of whole numbers from 0 to 16"]}
        speculative = base.get("speculative") if isinstance(base.get("speculative"), dict) else {}
        if any(counts) and not speculative.get("method"):
            errors.append("sweep_draft_counts: the instance has no speculative method to vary; give it speculative "
                          "(method, and model for a drafter) or use sweep_variants")
        for count in sorted(set(counts)):
            settings = {"speculative": {**speculative, "num_speculative_tokens": count}} if count else {"speculative": {"num_speculative_tokens": 0}}
            planned.append({"name": f"k{count}", "settings": settings})
    names = [variant["name"] for variant in planned]
    errors += [f"sweep: variant name {name} is used twice" for name in sorted({n for n in names if names.count(n) > 1})]
    for variant in planned:
        merged = {**base, **variant["settings"]}
        variant["draft_count"] = draft_count(merged)
        variant["id"] = f"{variant['name']}-{variant_id(variant['settings'])}"
    # Fewer draft tokens is simpler; among equals, the order given.
    for rank, variant in enumerate(sorted(planned, key=lambda v: (v["draft_count"], planned.index(v)))):
        variant["rank"] = rank
    return {"variants": sorted(planned, key=lambda v: v["rank"]) if not errors else [], "errors": errors}


def spread(values: t.Sequence[float]) -> dict[str, t.Any]:
    """mean, min, max and spread (max - min, in percent of the mean) of repeated figures."""
    numbers = [v for v in values if isinstance(v, (int, float))]
    if not numbers:
        return {"mean": None, "min": None, "max": None, "spread_pct": None, "n": 0}
    mean = statistics.fmean(numbers)
    return {"mean": mean, "min": min(numbers), "max": max(numbers),
            "spread_pct": (max(numbers) - min(numbers)) / mean * 100 if mean else 0.0, "n": len(numbers)}


def summarise_variant(repeats: t.Sequence[t.Sequence[t.Mapping[str, t.Any]]]) -> dict[int, dict[str, t.Any]]:
    """Per concurrency, each figure of FIGURES over the repeats (each repeat is vllm_bench's runs),
    and acceptance per draft position averaged over the repeats."""
    by_concurrency: dict[int, list[t.Mapping[str, t.Any]]] = {}
    for runs in repeats:
        for run in runs:
            by_concurrency.setdefault(int(run["concurrency"]), []).append(run)
    summary = {}
    for concurrency, runs in sorted(by_concurrency.items()):
        entry: dict[str, t.Any] = {figure: spread([run.get(figure) for run in runs]) for figure in FIGURES}
        # vllm_bench reports each position as {position, accepted, rate}.
        positions = [[p["rate"] for p in run.get("acceptance_per_position") or []] for run in runs]
        width = max((len(p) for p in positions), default=0)
        entry["acceptance_per_position"] = [spread([p[i] for p in positions if len(p) > i])["mean"] for i in range(width)]
        entry["failed"] = sum(int(run.get("failed") or 0) for run in runs)
        summary[concurrency] = entry
    return summary


def correctness_gate(baseline: t.Mapping[str, t.Any] | None, variant: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The variant passes no fewer cases than the baseline; its changed greedy answers are listed either way."""
    changed = [case.get("id") for case in variant.get("changed_cases") or []]
    if baseline is None:
        return {"ok": True, "passed": variant.get("passed"), "baseline_passed": None, "changed": changed,
                "reason": "the baseline itself"}
    ok = (variant.get("passed") or 0) >= (baseline.get("passed") or 0)
    reason = (f"{variant.get('passed')} of {variant.get('total')} cases pass, the baseline {baseline.get('passed')}"
              + (f"; {len(changed)} answers changed: {', '.join(map(str, changed))}" if changed else "; no answer changed"))
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


def decide(results: t.Sequence[t.Mapping[str, t.Any]], objective: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The winner among the variants that started and passed the gate (and the TTFT budget).

    ``results``: per variant name, rank, draft_count, status ("ok" or "failed"), gate, summary.
    ``objective``: target_concurrency, single_stream (concurrency of the TPOT tie-break, 1),
    ttft_budget_ms (or None) and noise_floor_pct. Simplest first; a more complex variant takes
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
        ttft = figure(result["summary"], target, "mean_ttft_ms")
        if budget is not None and ttft and ttft["mean"] is not None and ttft["mean"] > budget:
            reasons.append(f"{name}: out, mean TTFT {ttft['mean']:.1f} ms at concurrency {target} is over the budget of {budget} ms")
            continue
        candidates.append(result)
    if not candidates:
        return {"ok": False, "winner": None, "reasons": reasons + ["no variant passed; the starting settings stay"]}
    winner = candidates[0]
    reasons.append(f"{winner['name']}: the simplest variant that passed")
    for challenger in candidates[1:]:
        challenger_throughput = figure(challenger["summary"], target, "output_throughput")
        winner_throughput = figure(winner["summary"], target, "output_throughput")
        if beats(challenger_throughput, winner_throughput, True, floor):
            reasons.append(f"{challenger['name']}: wins over {winner['name']}, {challenger_throughput['mean']:.1f} against "
                           f"{winner_throughput['mean']:.1f} tok/s at concurrency {target}, beyond the spread")
            winner = challenger
            continue
        if not beats(winner_throughput, challenger_throughput, True, floor) and beats(
                figure(challenger["summary"], single, "mean_tpot_ms"), figure(winner["summary"], single, "mean_tpot_ms"), False, floor):
            reasons.append(f"{challenger['name']}: wins over {winner['name']}, throughput within the spread and a lower TPOT "
                           f"at concurrency {single} beyond the spread")
            winner = challenger
            continue
        reasons.append(f"{challenger['name']}: does not beat {winner['name']} by more than the spread; the simpler one stays")
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


def report_markdown(title: str, results: t.Sequence[t.Mapping[str, t.Any]], decision: t.Mapping[str, t.Any],
                    objective: t.Mapping[str, t.Any]) -> str:
    """The sweep report: the decision, then a table per variant (spread is half the min-max range, in
    percent of the mean) and acceptance per draft position and per category."""
    lines = [f"# {title}", "",
             f"Objective: highest output throughput at concurrency {objective['target_concurrency']}, then lowest TPOT at "
             f"concurrency {objective.get('single_stream', 1)}; a more complex variant must win by more than the measured "
             f"spread (floor {objective.get('noise_floor_pct', 0)} %)"
             + (f"; mean TTFT at most {objective['ttft_budget_ms']} ms" if objective.get("ttft_budget_ms") is not None else "")
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
        lines += ["",
                  "| concurrency | mean TTFT ms | mean TPOT ms | mean ITL ms | output tok/s | acceptance | per position |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
        for concurrency, entry in sorted((int(c), e) for c, e in result["summary"].items()):
            positions = ", ".join(f"{rate * 100:.0f}%" for rate in entry.get("acceptance_per_position") or [] if rate is not None)
            lines.append(f"| {concurrency} | {cell(entry['mean_ttft_ms'], '{:.1f}')} | {cell(entry['mean_tpot_ms'], '{:.2f}')} "
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
