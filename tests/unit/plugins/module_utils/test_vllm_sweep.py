"""The speculative-decoding sweep: variants, the correctness gate, spread, the decision and the schedule."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ansible_collections.sparkfleet.vllm.plugins.filter.sweep import vllm_sweep_plan, vllm_sweep_record
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import busy_problem, parse_samples
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_sweep import (
    decide,
    measurement_notes,
    objective_problems,
    plan_sweep,
    plan_variants,
    record_problems,
    report_markdown,
    schedule,
    spread,
    summarise_variant,
    sweep_report,
)

ROOT = pathlib.Path(__file__).resolve().parents[4]
COLLECTIONS = ROOT / ".cache" / "collections"
REPORT_MODULE = COLLECTIONS / "ansible_collections" / "sparkfleet" / "vllm" / "plugins" / "modules" / "vllm_sweep_report.py"
BASE = {"name": "chat", "speculative": {"method": "mtp", "model": "/models/assistant", "num_speculative_tokens": 2}}
# playbooks/mtp_sweep.yml's defaults, as its validation task passes them.
SETTINGS = dict(sweep_instance="chat", sweep_label="chat-sweep", sweep_draft_counts=[0, 1, 2, 3, 4, 5], sweep_variants=[],
                sweep_repeats=3, sweep_concurrencies=[1, 8], sweep_target_concurrency=8, sweep_single_stream=1,
                sweep_ttft_budget_ms=None, sweep_noise_floor_pct=0, sweep_max_changed_answers=0, sweep_prompts_per_concurrency=4,
                sweep_input_tokens=1000, sweep_output_tokens=256, sweep_acceptance_max_tokens=128, sweep_correctness_max_tokens=96,
                sweep_prefix_cache="disjoint", sweep_runner="auto", sweep_keep_winner=True,
                sweep_documents_dir=str(ROOT / "docs"), sweep_prompts_file=str(ROOT / "playbooks" / "files" / "sweep_prompts.yml"),
                sweep_drain_tasks=str(ROOT / "playbooks" / "tasks" / "gateway_drain.yml"), sweep_undrain_tasks="")
OBJECTIVE = {"target_concurrency": 8, "single_stream": 1, "ttft_budget_ms": None, "noise_floor_pct": 0.0}


def run(concurrency, throughput, tpot=10.0, ttft=100.0, acceptance=None):
    return {"concurrency": concurrency, "output_throughput": throughput, "mean_tpot_ms": tpot, "mean_ttft_ms": ttft, "median_ttft_ms": ttft,
            "mean_itl_ms": tpot, "acceptance": acceptance, "failed": 0,
            "acceptance_per_position": [{"position": 0, "accepted": 8, "rate": 0.8}] if acceptance else None}


def result(name, count, rank, throughputs, tpots=(10.0, 10.0), status="ok", gate_ok=True, ttft=100.0, queued_ttft=None):
    """A variant measured twice: throughputs per repeat at c=8, TPOT per repeat at c=1; TTFT at c=1, and at c=8 (queued_ttft)."""
    repeats = [{"runs": [run(1, 50.0, tpot, ttft), run(8, throughput, 20.0, queued_ttft or ttft)], "reasons": []}
               for throughput, tpot in zip(throughputs, tpots, strict=True)]
    return {"name": name, "rank": rank, "draft_count": count, "status": status, "settings": {},
            "gate": {"ok": gate_ok, "reason": "fewer passes" if not gate_ok else "ok"},
            "summary": {str(c): e for c, e in summarise_variant(repeats).items()}}


def test_draft_counts_become_ranked_variants_with_stable_ids():
    planned = plan_variants(BASE, [4, 0, 2])
    assert planned["errors"] == []
    assert [(v["name"], v["draft_count"], v["rank"]) for v in planned["variants"]] == [("k0", 0, 0), ("k2", 2, 1), ("k4", 4, 2)]
    assert planned["variants"][1]["settings"] == {"speculative": {**BASE["speculative"], "num_speculative_tokens": 2}}
    assert planned["variants"][0]["settings"] == {"speculative": {"num_speculative_tokens": 0}}
    assert plan_variants(BASE, [4, 0, 2])["variants"][2]["id"] == planned["variants"][2]["id"], "ids are stable across runs"
    assert [v["name"] for v in plan_variants(BASE)["variants"]] == ["k0", "k1", "k2", "k3", "k4", "k5"]


def test_bad_sweeps_are_refused():
    assert "no speculative method to vary" in plan_variants({"name": "chat"}, [0, 2])["errors"][0]
    assert "sweep_draft_counts[1]: 'two' is not a whole number; give a whole number from 0 to 16" in plan_variants(BASE, [0, "two"])["errors"][0]
    found = plan_variants(BASE, variants=[{"name": "Big", "settings": {}}, {"name": "port", "settings": {"port": 9}},
                                          {"name": "a", "settings": {}}, {"name": "a", "settings": {"max_num_seqs": 4}}])["errors"]
    assert any("must be lower-case" in e for e in found) and any("port cannot change between variants" in e for e in found)
    assert any("variant name a is used twice" in e for e in found)


def test_named_variants_rank_by_draft_count_then_order():
    planned = plan_variants(BASE, variants=[{"name": "mnbt16k", "settings": {"max_num_batched_tokens": 16384}},
                                            {"name": "off", "settings": {"speculative": {"num_speculative_tokens": 0}}}])
    assert [(v["name"], v["draft_count"]) for v in planned["variants"]] == [("off", 0), ("mnbt16k", 2)]


def test_spread_is_the_range_in_percent_of_the_mean():
    assert spread([95.0, 105.0]) == {"mean": 100.0, "min": 95.0, "max": 105.0, "spread_pct": 10.0, "n": 2, "outliers": []}
    assert spread([None])["mean"] is None


@pytest.mark.parametrize("values", [[100.0], [None, 100.0], [100.0, None, None]])
def test_one_run_has_no_spread_never_a_spread_of_zero(values):
    assert spread(values) == {"mean": 100.0, "min": 100.0, "max": 100.0, "spread_pct": None, "n": 1, "outliers": []}


# A run far outside its siblings, in every spelling: values by repeat, and the repeats named with their median of the others.
OUTLIERS = {
    "a-tenth-of-two-others": ([100.0, 104.0, 10.0], [(3, 10.0, 102.0)]),
    "a-tenth-among-four": ([100.0, 10.0, 98.0, 102.0], [(2, 10.0, 100.0)]),
    "a-slow-token-beside-two-steady": ([10.0, 10.0, 31.0], [(3, 31.0, 10.0)]),
    "two-of-four-low": ([100.0, 100.0, 10.0, 10.0], [(3, 10.0, 100.0), (4, 10.0, 100.0)]),
    "far-above": ([100.0, 250.0, 104.0], [(2, 250.0, 102.0)]),
    "zero": ([0.0, 100.0, 100.0], [(1, 0.0, 100.0)]),
    "numbered-past-a-missing-repeat": ([None, 100.0, 100.0, 10.0], [(4, 10.0, 100.0)]),
    "a-pair-too-far-apart": ([100.0, 10.0], [(1, 100.0, 10.0), (2, 10.0, 100.0)]),
    "a-pair-of-zero-and-some": ([0.0, 50.0], [(1, 0.0, 50.0), (2, 50.0, 0.0)]),
}


@pytest.mark.parametrize(("values", "named"), OUTLIERS.values(), ids=OUTLIERS.keys())
def test_a_run_far_outside_its_siblings_is_named(values, named):
    found = spread(values)["outliers"]
    assert [(o["repeat"], o["value"], o["median_of_others"]) for o in found] == named


@pytest.mark.parametrize("values", [[100.0, 60.0, 100.0], [100.0, 190.0], [100.0], [0.0, 0.0, 0.0], [100.0, None, 51.0], []])
def test_runs_within_a_factor_of_two_of_their_siblings_are_no_outliers(values):
    assert spread(values)["outliers"] == []


def bench_repeat(*runs, reasons=()):
    return {"runs": list(runs), "reasons": list(reasons)}


def failed_run(concurrency, reason):
    # vllm_bench's run that was not recorded: its figures are what the file held (here all zero), never a measurement.
    return {**run(concurrency, 0.0, 0.0, 0.0), "reasons": [reason]}


def test_a_repeat_that_recorded_nothing_is_named_and_never_averaged_in():
    repeats = [bench_repeat(run(1, 50.0), run(8, 100.0)),
               bench_repeat(run(1, 52.0), failed_run(8, "concurrency 8: 32 prompts sent, 29 completed, 0 failed: 3 unaccounted for"),
                            reasons=["concurrency 8: 32 prompts sent, 29 completed, 0 failed: 3 unaccounted for"]),
               bench_repeat(reasons=["http://127.0.0.1:8000/v1/models did not answer"]),
               {"skipped": True, "changed": False},
               {"failed": True, "msg": "the module crashed"}]
    summary = summarise_variant(repeats, expected=6)
    entry = summary[8]
    assert entry["output_throughput"]["mean"] == 100.0 and entry["output_throughput"]["n"] == 1
    assert entry["repeats"] == 6 and [(m["repeat"], m["why"]) for m in entry["missing"]] == [
        (2, "concurrency 8: 32 prompts sent, 29 completed, 0 failed: 3 unaccounted for"),
        (3, "http://127.0.0.1:8000/v1/models did not answer"),
        (4, "it left no benchmark result"), (5, "it left no benchmark result"), (6, "it left no benchmark result")]
    assert [m["repeat"] for m in summary[1]["missing"]] == [3, 4, 5, 6]
    assert summary[1]["output_throughput"]["mean"] == 51.0


def test_every_repeat_recorded_names_none_missing():
    summary = summarise_variant([bench_repeat(run(8, 100.0)), bench_repeat(run(8, 102.0))])
    assert summary[8]["missing"] == [] and summary[8]["repeats"] == 2


def test_a_variant_with_a_repeat_that_recorded_nothing_is_out():
    k0 = result("k0", 0, 0, [100.0, 104.0])
    k2 = result("k2", 2, 1, [200.0, 204.0])
    failed = failed_run(8, "concurrency 8: no request succeeded")
    repeats = [bench_repeat(run(1, 50.0), run(8, 200.0)), bench_repeat(run(1, 50.0), failed, reasons=["concurrency 8: no request succeeded"])]
    k2["summary"] = {str(c): e for c, e in summarise_variant(repeats).items()}
    decision = decide([k0, k2], OBJECTIVE)
    assert decision["winner"] == "k0"
    assert decision["reasons"][0] == ("k2: out, 1 of 2 repeat(s) recorded no run at concurrency 8 (repeat 2: concurrency 8: no request "
                                      "succeeded)")


@pytest.mark.parametrize(("throughputs", "tpots", "named"), [
    ([200.0, 204.0, 20.0], (10.0, 10.0, 10.0),
     "k2: out, output throughput at concurrency 8: repeat 3 ran at 20.0 against 202.0, the median of the others (beyond 2x)"),
    ([200.0, 204.0, 202.0], (10.0, 10.0, 31.0), "k2: out, mean TPOT at concurrency 1: repeat 3 ran at 31.0 against 10.0, the median "
                                                "of the others (beyond 2x)"),
])
def test_a_variant_with_a_run_far_outside_its_siblings_is_out_and_the_run_named(throughputs, tpots, named):
    k0 = result("k0", 0, 0, [100.0, 104.0])
    k2 = result("k2", 2, 1, throughputs, tpots=tpots)
    decision = decide([k0, k2], OBJECTIVE)
    assert decision["winner"] == "k0" and decision["reasons"][0] == named


def test_two_repeats_that_disagree_are_named_in_the_report_and_widen_the_margin_but_rule_nothing_out():
    """Two runs beyond 2x apart name no run to rule out (on two busy cores two one-prompt runs differed 78 to 717 tok/s):
    the report names them, and the spread they make is the margin a challenger must beat."""
    k0 = result("k0", 0, 0, [100.0, 104.0])
    k2 = result("k2", 2, 1, [200.0, 20.0])
    decision = decide([k0, k2], OBJECTIVE)
    assert not any(reason.startswith("k2: out") for reason in decision["reasons"]), decision["reasons"]
    assert decision["winner"] == "k0", "a spread of 164 % is beaten by nothing"
    assert any("repeats 1 and 2 disagree, 200.0 and 20.0" in note for note in measurement_notes(k2["summary"]))


def test_one_run_a_variant_is_compared_on_the_floor_and_says_its_spread_was_not_measured():
    k0 = result("k0", 0, 0, [100.0], tpots=(10.0,))
    k2 = result("k2", 2, 1, [104.0], tpots=(10.0,))
    assert k2["summary"]["8"]["output_throughput"]["spread_pct"] is None
    decision = decide([k0, k2], {**OBJECTIVE, "noise_floor_pct": 5.0})
    assert decision["winner"] == "k0" and decision["reasons"][-1] == (
        "k2: does not beat k0 by more than the spread (spread not measured: one run, so the margin is sweep_noise_floor_pct alone); "
        "the simpler one stays")
    clear = result("k4", 4, 2, [120.0], tpots=(10.0,))
    decision = decide([k0, clear], {**OBJECTIVE, "noise_floor_pct": 5.0})
    assert decision["winner"] == "k4" and decision["reasons"][-1].endswith(
        "beyond the spread (spread not measured: one run, so the margin is sweep_noise_floor_pct alone)")
    assert "not measured" not in " ".join(decide([result("k0", 0, 0, [100.0, 101.0]), result("k2", 2, 1, [99.0, 100.0])], OBJECTIVE)["reasons"])


def test_a_record_names_the_repeat_that_failed_among_its_registered_results():
    variant = {"name": "k2", "id": "k2-abc", "rank": 1, "draft_count": 2, "settings": {}}
    bench = [{"runs": [run(1, 50.0)], "reasons": []}, {"runs": [], "reasons": ["the endpoint did not answer"], "failed": True}]
    record = vllm_sweep_record(variant, "ok", None, {"passed": 18, "total": 20}, {"passed": 18, "total": 20}, bench)
    assert record["summary"]["1"]["missing"] == [{"repeat": 2, "why": "the endpoint did not answer"}]
    assert record["summary"]["1"]["output_throughput"]["spread_pct"] is None


def test_a_more_complex_variant_wins_only_beyond_the_spread():
    k0 = result("k0", 0, 0, [100.0, 104.0])
    close = result("k2", 2, 1, [105.0, 107.0])
    clear = result("k4", 4, 2, [130.0, 131.0])
    decision = decide([k0, close], OBJECTIVE)
    assert decision["winner"] == "k0" and "does not beat k0 by more than the spread" in decision["reasons"][-1]
    decision = decide([k0, close, clear], OBJECTIVE)
    assert decision["winner"] == "k4" and any("k4: wins over k0" in r for r in decision["reasons"])
    assert decide([k0, close], {**OBJECTIVE, "noise_floor_pct": 5.0})["winner"] == "k0"


def test_within_the_spread_a_lower_single_stream_tpot_decides():
    k0 = result("k0", 0, 0, [100.0, 101.0], tpots=(20.0, 20.2))
    k2 = result("k2", 2, 1, [100.5, 101.0], tpots=(12.0, 12.1))
    decision = decide([k0, k2], OBJECTIVE)
    assert decision["winner"] == "k2" and "lower TPOT at concurrency 1" in decision["reasons"][-1]


def test_failed_gated_and_slow_variants_are_out():
    k0 = result("k0", 0, 0, [100.0, 100.0])
    broken = result("k3", 3, 1, [0.0, 0.0], status="failed")
    broken["reason"] = "the gate failed: engine exited"
    wrong = result("k4", 4, 2, [200.0, 200.0], gate_ok=False)
    slow = result("k5", 5, 3, [300.0, 300.0], ttft=5000.0)
    decision = decide([k0, broken, wrong, slow], {**OBJECTIVE, "ttft_budget_ms": 1000})
    assert decision["winner"] == "k0"
    assert "k3: out, the gate failed" in decision["reasons"][0] and "k4: out, correctness gate" in decision["reasons"][1]
    assert decision["reasons"][2] == "k5: out, median TTFT 5000.0 ms at concurrency 1 (the repeats' mean) is over the budget of 1000 ms"
    # The budget is the latency a user sees at one stream: time queued for a batch slot at the target does not count.
    queued = result("k6", 6, 4, [300.0, 300.0], ttft=200.0, queued_ttft=9000.0)
    assert decide([k0, queued], {**OBJECTIVE, "ttft_budget_ms": 1000})["winner"] == "k6"
    assert decide([broken], OBJECTIVE) == {"ok": False, "winner": None,
                                           "reasons": ["k3: out, the gate failed: engine exited", "no variant passed; the starting settings stay"]}


def test_schedule_recommends_draft_counts_by_batch_size():
    k2 = {**result("k2", 2, 1, [100.0, 100.0], tpots=(10.0, 10.0))}
    k4 = {**result("k4", 4, 2, [90.0, 90.0], tpots=(7.0, 7.0))}
    # At one stream k4 is faster (its TPOT; throughput at c=1 equal), at eight k2 has the throughput.
    assert schedule([k2, k4], [1, 8], 64, 0.0) == [[1, 1, 4], [2, 64, 2]]
    assert schedule([k2], [1, 8], 64, 0.0) is None


def test_records_gate_on_passes_and_changed_answers():
    variant = {"name": "k2", "id": "k2-abc", "rank": 1, "draft_count": 2, "settings": {}}
    baseline = {"passed": 18, "total": 20}
    bench = [{"runs": [run(1, 50.0, acceptance=0.6)]}, {"runs": [run(1, 54.0, acceptance=0.7)]}]
    same = vllm_sweep_record(variant, "ok", None, {"passed": 18, "total": 20, "changed_cases": []}, baseline, bench)
    assert same["gate"]["ok"] and same["summary"]["1"]["output_throughput"]["mean"] == 52.0
    assert same["summary"]["1"]["acceptance"]["mean"] == pytest.approx(0.65) and same["summary"]["1"]["acceptance_per_position"] == [0.8]
    changed = vllm_sweep_record(variant, "ok", None, {"passed": 18, "total": 20, "changed_cases": [{"id": "str-1"}]}, baseline, bench)
    assert not changed["gate"]["ok"] and "str-1" in changed["gate"]["reason"] and "more than 0 changed" in changed["gate"]["reason"]
    assert vllm_sweep_record(variant, "ok", None, {"passed": 18, "total": 20, "changed_cases": [{"id": "str-1"}]}, baseline, bench,
                             max_changed_answers=1)["gate"]["ok"]
    fewer = vllm_sweep_record(variant, "ok", None, {"passed": 17, "total": 20}, baseline, bench)
    assert not fewer["gate"]["ok"] and "17 of 20 cases pass, the baseline 18" in fewer["gate"]["reason"]
    failed = vllm_sweep_record(variant, "failed", "the gate failed")
    assert failed["status"] == "failed" and failed["gate"] == {"ok": False, "reason": "the gate failed"}
    # Seed 003: a variant that scrambles its streams or no longer calls the tool is out, however it scores.
    scrambled = vllm_sweep_record(variant, "ok", None, {"passed": 18, "total": 20, "stream_mismatches": [{"id": "arith-1"}]}, baseline, bench)
    assert not scrambled["gate"]["ok"] and scrambled["gate"]["reason"].endswith("; 1 streamed answers differ from the whole ones (arith-1)")
    corrupted = vllm_sweep_record(variant, "ok", None, {"passed": 18, "total": 20, "load": {"concurrency": 8, "corrupted": [
        {"id": "json-1", "reason": "a repetition loop under load, none alone"}]}}, baseline, bench)
    assert not corrupted["gate"]["ok"] and corrupted["gate"]["reason"].endswith(
        "; 1 answers right alone went wrong with 8 requests in flight (json-1: a repetition loop under load, none alone)")
    no_call = vllm_sweep_record(dict(variant, rank=0), "ok", None, {"passed": 18, "total": 20, "tool_call": {"pass": False, "reason": "no tool"}})
    assert no_call["gate"] == {"ok": False, "passed": 18, "baseline_passed": None, "changed": [],
                               "reason": "the baseline itself; the tool-call case failed: no tool"}


def test_report_has_a_table_per_variant_with_spread_and_categories():
    k0 = result("k0", 0, 0, [100.0, 104.0])
    k2 = result("k2", 2, 1, [140.0, 150.0])
    k2["categories"] = {"code": {"requests": 2, "output_tokens": 200, "acceptance": 0.5, "mean_acceptance_length": 2.0}}
    failed = {**result("k9", 9, 2, [0.0, 0.0], status="failed"), "reason": "engine exited"}
    decision = decide([k0, k2, failed], OBJECTIVE)
    text = report_markdown("lab sweep", [k0, k2, failed], decision, OBJECTIVE)
    assert "**Winner: k2**" in text and "## k2 (draft tokens 2): ok" in text and "| 8 |" in text
    assert "145.0 ±3.4%" in text and "| code | 2 | 200 | 50.0% | 2.00 |" in text and "Not measured: engine exited." in text


def test_report_names_what_is_not_sound_beside_a_variants_table():
    k0 = result("k0", 0, 0, [100.0, 104.0])
    far = result("k2", 2, 1, [200.0, 204.0, 20.0], tpots=(10.0, 10.0, 10.0))
    single = result("k4", 4, 2, [150.0], tpots=(10.0,))
    missing = result("k5", 5, 3, [150.0, 151.0])
    missing["summary"]["8"]["missing"] = [{"repeat": 3, "why": "concurrency 8: no request succeeded"}]
    missing["summary"]["8"]["repeats"] = 3
    text = report_markdown("lab sweep", [k0, far, single, missing], decide([k0, far, single, missing], OBJECTIVE), OBJECTIVE)
    sections = {section.split("\n", 1)[0]: section for section in text.split("\n## ")[1:]}
    assert "Not sound" not in sections["k0 (draft tokens 0): ok"]
    assert ("- output throughput at concurrency 8: repeat 3 ran at 20.0 against 202.0, the median of the others (beyond 2x)"
            in sections["k2 (draft tokens 2): ok"])
    assert "- spread not measured at concurrency 1: one run\n- spread not measured at concurrency 8: one run" in sections["k4 (draft tokens 4): ok"]
    assert ("- 1 of 3 repeat(s) recorded no run at concurrency 8 (repeat 3: concurrency 8: no request succeeded)"
            in sections["k5 (draft tokens 5): ok"])


def test_busy_servers_are_refused_for_measurement():
    idle = parse_samples("vllm:num_requests_running{model_name=\"m\"} 0.0\nvllm:num_requests_waiting{model_name=\"m\"} 0.0\n")
    assert busy_problem(idle) is None
    busy = parse_samples("vllm:num_requests_running{model_name=\"m\"} 3.0\nvllm:num_requests_waiting{model_name=\"m\"} 1.0\n")
    assert "3 requests running and 1 waiting that are not ours" in busy_problem(busy)


def test_without_a_measured_baseline_no_variant_passes_the_gate():
    variant = {"name": "k2", "id": "k2-abc", "rank": 1, "draft_count": 2, "settings": {}}
    record = vllm_sweep_record(variant, "ok", None, {"passed": 20, "total": 20}, None, [])
    assert not record["gate"]["ok"] and "nothing to compare with" in record["gate"]["reason"]
    baseline = vllm_sweep_record({**variant, "name": "k0", "rank": 0, "draft_count": 0}, "ok", None, {"passed": 3, "total": 20}, None, [])
    assert baseline["gate"]["ok"] and baseline["correctness"] == {"passed": 3, "total": 20}


def test_a_variant_the_gate_rejects_is_reported_without_figures():
    k0 = result("k0", 0, 0, [100.0, 104.0])
    rejected = {"name": "other", "rank": 1, "draft_count": 0, "status": "ok", "settings": {"model": "/models/other"},
                "gate": {"ok": False, "reason": "0 of 20 cases pass, the baseline 0; 20 answers changed"}, "summary": {}}
    decision = decide([k0, rejected], OBJECTIVE)
    text = report_markdown("lab sweep", [k0, rejected], decision, OBJECTIVE)
    assert decision["winner"] == "k0" and "other: out, correctness gate" in " ".join(decision["reasons"])
    assert "(fails the gate).\n\nNot benchmarked: the correctness gate rejected it." in text


def swept(**changes):
    return vllm_sweep_plan([{"name": "embed"}, BASE], {**SETTINGS, **changes})


def test_the_playbook_defaults_plan_the_draft_lengths_and_text_numbers_become_numbers():
    planned = swept()
    assert planned["errors"] == [] and planned["base"] == {**BASE, "state": "present"}
    assert [v["name"] for v in planned["variants"]] == ["k0", "k1", "k2", "k3", "k4", "k5"]
    # Extra vars arrive as text (-e sweep_repeats=5); the variants read the checked numbers.
    settings = swept(sweep_repeats="5", sweep_noise_floor_pct="2.5", sweep_ttft_budget_ms="1500")["settings"]
    assert (settings["sweep_repeats"], settings["sweep_noise_floor_pct"], settings["sweep_ttft_budget_ms"]) == (5, 2.5, 1500)


def test_the_swept_instance_is_merged_as_the_plan_merges_it():
    """Found when read: a drafter set in vllm_instance_defaults was invisible to the sweep."""
    defaults = {"speculative": BASE["speculative"], "max_num_seqs": 16}
    planned = vllm_sweep_plan([{"name": "chat"}], {**SETTINGS, "sweep_draft_counts": [0, 3]}, defaults)
    assert planned["errors"] == [] and planned["base"]["speculative"] == BASE["speculative"] and planned["base"]["max_num_seqs"] == 16
    assert [v["settings"]["speculative"] for v in planned["variants"]] == [
        {"num_speculative_tokens": 0}, {**BASE["speculative"], "num_speculative_tokens": 3}]
    catalog = vllm_sweep_plan([{"name": "chat", "catalog": "gemma-4-26b-a4b-it-nvfp4", "speculative": {"method": "mtp"}}],
                              {**SETTINGS, "sweep_draft_counts": [0, 2]})
    assert catalog["errors"] == [] and catalog["base"]["speculative"]["model"] == "/models/gemma-4-26B-A4B-it-assistant", \
        "the drafter the catalog brings is the one swept"


def test_a_catalog_extra_the_plan_refuses_is_left_to_the_plan_not_a_traceback():
    planned = vllm_sweep_plan([BASE], SETTINGS, {}, {"broken": {"weights_gib": -5}})
    assert planned["errors"] == [] and planned["base"]["speculative"] == BASE["speculative"]


@pytest.mark.parametrize(("changes", "expected"), [
    pytest.param({"sweep_noise_floor_pct": "5%"}, "sweep_noise_floor_pct: '5%' is not a number; give a number from 0 to 50 percent",
                 id="percent-sign-is-not-zero"),
    pytest.param({"sweep_noise_floor_pct": 80}, "sweep_noise_floor_pct: 80 is out of range; give a number from 0 to 50", id="floor-too-high"),
    pytest.param({"sweep_noise_floor_pct": -1}, "sweep_noise_floor_pct: -1 is out of range", id="negative-floor"),
    pytest.param({"sweep_repeats": 0}, "sweep_repeats: 0 is out of range; give a whole number from 1 to 20", id="no-repeats"),
    pytest.param({"sweep_repeats": 2.5}, "sweep_repeats: 2.5 is not a whole number", id="fractional-repeats"),
    pytest.param({"sweep_draft_counts": [0, 2_000_000]}, "sweep_draft_counts[1]: 2000000 is out of range; give a whole number "
                 "from 0 to 16 (0 is the baseline without speculation; a draft token counts only when every one before it was "
                 "accepted", id="draft-count-in-the-millions"),
    pytest.param({"sweep_draft_counts": []}, "sweep_draft_counts: [] is not a list of draft counts", id="no-draft-counts"),
    pytest.param({"sweep_concurrencies": [1, 5_000_000]}, "sweep_concurrencies[1]: 5000000 is out of range; give a whole number from 1 to 1024",
                 id="concurrency-in-the-millions"),
    pytest.param({"sweep_concurrencies": [1, 8, 8]}, "sweep_concurrencies: [1, 8, 8] repeats a concurrency", id="repeated-concurrency"),
    pytest.param({"sweep_target_concurrency": 4}, "sweep_target_concurrency: 4 is not one of the concurrencies measured (1, 8)",
                 id="target-not-measured"),
    pytest.param({"sweep_single_stream": "one"}, "sweep_single_stream: 'one' is not one of the concurrencies measured", id="single-stream"),
    pytest.param({"sweep_ttft_budget_ms": 0}, "sweep_ttft_budget_ms: 0 is out of range; give a number above 0 and at most 600000 ms",
                 id="zero-budget"),
    pytest.param({"sweep_max_changed_answers": 20}, "sweep_max_changed_answers: 20 is out of range; give a whole number from 0 to 5 "
                 "(greedy answers should not change", id="gate-switched-off"),
    pytest.param({"sweep_prompts_per_concurrency": 10**6}, "sweep_prompts_per_concurrency: 1000000 is out of range", id="prompts"),
    pytest.param({"sweep_input_tokens": 0}, "sweep_input_tokens: 0 is out of range; give a whole number from 1 to 262144 tokens",
                 id="input-tokens"),
    pytest.param({"sweep_output_tokens": -5}, "sweep_output_tokens: -5 is out of range", id="output-tokens"),
    pytest.param({"sweep_acceptance_max_tokens": "lots"}, "sweep_acceptance_max_tokens: 'lots' is not a whole number", id="acceptance"),
    pytest.param({"sweep_correctness_max_tokens": 10**6}, "sweep_correctness_max_tokens: 1000000 is out of range", id="correctness"),
    pytest.param({"sweep_prefix_cache": "off"}, "sweep_prefix_cache: 'off' is not one of disjoint, reset", id="prefix-cache"),
    pytest.param({"sweep_runner": "ssh"}, "sweep_runner: 'ssh' is not one of auto, exec, container, local", id="runner"),
    pytest.param({"sweep_keep_winner": "yes"}, "sweep_keep_winner: 'yes' is not true or false", id="keep-winner"),
    pytest.param({"sweep_label": "a b"}, "sweep_label: 'a b' is not a plain label", id="label"),
    pytest.param({"sweep_instance": "caht"}, "sweep_instance: 'caht' is not an instance of this host's vllm_instances (embed, chat)",
                 id="unknown-instance"),
    pytest.param({"sweep_documents_dir": "/nonexistent"}, "sweep_documents_dir: '/nonexistent' is no directory on the controller",
                 id="documents"),
    pytest.param({"sweep_prompts_file": str(ROOT / "docs")}, "is no file on the controller; give the controller file of the acceptance",
                 id="prompts-file"),
    pytest.param({"sweep_undrain_tasks": "/nonexistent.yml"}, "sweep_undrain_tasks: '/nonexistent.yml' is no file on the controller",
                 id="undrain-tasks"),
    pytest.param({"sweep_variants": [{"name": "a", "settings": {}}, {"name": "b", "settings": {}},
                                     {"name": "c", "settings": {"speculative": {"method": "mtp", "num_speculative_tokens": 40}}}]},
                 "sweep_variants[2].settings.speculative.num_speculative_tokens: 40 is out of range; give a whole number from 0 to 16",
                 id="variant-draft-count"),
    pytest.param({"sweep_variants": [{"name": "seqs", "settings": {"max_num_seqs": 2_000_000}}]},
                 "sweep_variants[0].settings.max_num_seqs: 2000000 is out of range; give a whole number from 1 to 4096", id="variant-seqs"),
    pytest.param({"sweep_variants": [{"name": "seqs", "settings": {"max_num_seqs": "64"}}]},
                 "sweep_variants[0].settings.max_num_seqs: '64' is not a whole number", id="variant-number-as-text"),
    pytest.param({"sweep_variants": [{"name": "gmu", "settings": {"gpu_memory_utilization": 1.5}}]},
                 "sweep_variants[0].settings.gpu_memory_utilization: 1.5 is out of range; give a number above 0 and below 1",
                 id="variant-gmu"),
    pytest.param({"sweep_variants": [{"name": "spec", "settings": {"speculative": "mtp"}}]},
                 "sweep_variants[0].settings.speculative: 'mtp' is not a mapping", id="variant-speculative"),
])
def test_each_sweep_setting_is_refused_before_the_first_variant(changes, expected):
    planned = swept(**changes)
    assert planned["variants"] == [], "no variant runs when any setting is wrong"
    assert any(e.startswith(expected) or expected in e for e in planned["errors"]), planned["errors"]


def test_every_problem_is_named_at_once_even_without_the_instance():
    found = swept(sweep_instance=None, sweep_noise_floor_pct="5%", sweep_draft_counts=[0, 99])["errors"]
    assert [e.split(":")[0] for e in found] == ["sweep_instance", "sweep_noise_floor_pct", "sweep_draft_counts[1]"]
    assert found[1].endswith("write the percent without %")


def test_the_sweep_plan_checks_paths_through_the_given_check():
    checked = []
    plan_sweep([BASE], SETTINGS, lambda kind, path: checked.append(kind) or True)
    assert checked == ["directory", "file", "file"], "the documents folder, the prompts file and the drain tasks; no undrain tasks"


def test_the_report_options_are_checked_like_the_settings():
    objective, found = objective_problems({"target_concurrency": 8, "noise_floor_pct": "abc"}, [1, 8], 256)
    assert found == ["objective.noise_floor_pct: 'abc' is not a number; give a number from 0 to 50 percent (seed 001 saw 5 % run "
                     "to run; no variant wins by more than 50 %, so the simplest would always stay)"]
    objective, found = objective_problems({"target_concurrency": "8", "noise_floor_pct": "2"}, [1, 8], 256)
    assert found == [] and objective == {"target_concurrency": 8, "single_stream": 1, "ttft_budget_ms": None, "noise_floor_pct": 2}
    found = objective_problems({"single_stream": 1}, [1, 8], 10**7)[1]
    assert found[0].startswith("objective.target_concurrency: missing") and found[1].startswith("max_num_seqs: 10000000 is out of range")


def reported(*results, **changes):
    options = {"title": "lab sweep", "results": list(results) or [result("k0", 0, 0, [100.0, 104.0])],
               "objective": {"target_concurrency": 8, "noise_floor_pct": 0}, "concurrencies": [1, 8], "max_num_seqs": 256,
               "vllm_version": "", **changes}
    return sweep_report(**options)


def test_the_report_holds_the_decision_the_schedule_and_the_winners_settings():
    k0 = result("k0", 0, 0, [100.0, 104.0])
    k2 = {**result("k2", 2, 1, [100.0, 100.0]), "settings": {"speculative": {"num_speculative_tokens": 2}}}
    k4 = {**result("k4", 4, 2, [130.0, 131.0]), "settings": {"speculative": {"num_speculative_tokens": 4}}}
    done = reported(k4, k0, k2, vllm_version="0.32.0", max_num_seqs=64)
    assert done["errors"] == [] and done["decision"]["winner"] == "k4"
    assert done["decision"]["winner_settings"] == {"speculative": {"num_speculative_tokens": 4}}
    # At one stream k2 and k4 tie (same throughput and TPOT), so the simpler one keeps the small batches.
    assert done["decision"]["schedule"] == [[1, 1, 2], [2, 64, 4]]
    assert done["decision"]["schedule_note"] == ("Per-batch-size schedule (speculative options num_speculative_tokens_per_batch_size, "
                                                 "ranges inclusive): [[1, 1, 2], [2, 64, 4]].")
    document = json.loads(done["files"]["decision.json"])
    assert {"variants", "winner", "ok", "schedule_note", "reasons", "objective", "winner_settings"} <= set(document)
    assert [v["name"] for v in document["variants"]] == ["k0", "k2", "k4"], "simplest first"
    assert document["objective"] == {"target_concurrency": 8, "single_stream": 1, "ttft_budget_ms": None, "noise_floor_pct": 0}
    assert done["files"]["report.md"].decode() == done["markdown"] and "## k0 (draft tokens 0): ok" in done["markdown"]
    assert done["plot"]["draft_counts"] == [0, 2, 4]
    assert [label for label, _values in done["plot"]["series"]] == ["output tok/s at c=8", "mean TPOT ms at c=1", "acceptance % at c=8"]
    assert done["plot"]["series"][0][1] == [102.0, 100.0, 130.5] and done["plot"]["series"][2][1] == [0, 0, 0]


def test_without_a_measured_variant_there_is_no_winner_and_nothing_to_plot():
    failed = {**result("k2", 2, 0, [0.0, 0.0], status="failed"), "reason": "engine exited"}
    done = reported(failed)
    assert done["decision"]["ok"] is False and done["decision"]["winner_settings"] == {} and done["plot"] is None


@pytest.mark.parametrize(("version", "note"), [
    ("0.32.0rc1", "No per-batch-size schedule: fewer than two speculative variants passed."),
    ("0.33.0.dev5+g1a2b3c", "No per-batch-size schedule: fewer than two speculative variants passed."),
    ("0.31.9rc2", "No per-batch-size schedule: vLLM 0.31.9rc2 is not known to have num_speculative_tokens_per_batch_size "
                  "(vLLM 0.32.0 has it)."),
    ("", "No per-batch-size schedule: vLLM (release unknown; set vllm_version) is not known to have"),
])
def test_pre_release_and_local_versions_count_as_their_release(version, note):
    done = reported(vllm_version=version)
    assert done["errors"] == [] and done["decision"]["schedule"] is None and done["decision"]["schedule_note"].startswith(note)


def test_every_problem_of_the_options_is_named_at_once():
    found = reported(objective={"target_concurrency": 3, "noise_floor_pct": "5%"}, vllm_version="latest")["errors"]
    assert [e.split(":")[0] for e in found] == ["objective.target_concurrency", "objective.noise_floor_pct", "vllm_version"]
    assert found[2].startswith("vllm_version: 'latest' is not a vLLM release; give the image's release")


def test_records_the_decision_cannot_read_are_refused_by_name():
    k0 = result("k0", 0, 0, [100.0, 104.0])
    assert record_problems([k0, {**result("k9", 9, 1, [0.0, 0.0], status="failed"), "gate": None, "summary": None}]) == []
    found = record_problems([{"name": "k0", "rank": "0"}, {**k0, "gate": {"ok": "yes"}},
                             {**k0, "summary": {"8": {"output_throughput": 104.0}}}, {**k0, "summary": {"eight": {}}}])
    assert found == [
        "results[0]: rank, draft_count, status missing or of the wrong type; give the records vllm_sweep_record wrote",
        "results[1] (k0).gate: {'ok': 'yes'} is not a verdict with ok and reason; give the records vllm_sweep_record wrote",
        "results[2] (k0).summary: not figures per concurrency (each figure with mean and spread_pct); give the records "
        "vllm_sweep_record wrote",
        "results[3] (k0).summary: not figures per concurrency (each figure with mean and spread_pct); give the records "
        "vllm_sweep_record wrote",
    ]
    assert reported({"name": "k0"})["errors"][0].startswith("results[0]: rank, draft_count, status missing")


def report(tmp_path, **args):
    options = {"dest": str(tmp_path), "title": "lab sweep", "results": [result("k0", 0, 0, [100.0, 104.0])],
               "objective": {"target_concurrency": 8, "noise_floor_pct": 0}, "concurrencies": [1, 8], "plot": False, **args}
    payload = {"ANSIBLE_MODULE_ARGS": {"_ansible_check_mode": False, **options}}
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS)}
    done = subprocess.run([sys.executable, str(REPORT_MODULE)], input=json.dumps(payload), capture_output=True, text=True,
                          env=env, check=False)
    return json.loads(done.stdout)


def test_vllm_sweep_report_writes_the_decision_and_the_report(tmp_path):
    done = report(tmp_path, vllm_version="0.32.0rc1")
    assert not done.get("failed") and done["changed"] and done["winner"] == "k0", done
    assert sorted(path.name for path in tmp_path.iterdir()) == ["decision.json", "report.md"]
    assert json.loads((tmp_path / "decision.json").read_text())["schedule_note"] == done["schedule_note"]
    assert not report(tmp_path, vllm_version="0.32.0rc1")["changed"], "the same decision writes nothing"


def test_vllm_sweep_report_refuses_what_it_cannot_decide_without_a_traceback(tmp_path):
    refused = report(tmp_path, objective={"target_concurrency": 8, "noise_floor_pct": "abc"}, vllm_version="latest")
    assert refused["failed"] and "Traceback" not in json.dumps(refused) and not refused["ok"]
    assert refused["msg"].startswith("objective.noise_floor_pct: 'abc' is not a number; give a number from 0 to 50 percent")
    assert refused["reasons"][1].startswith("vllm_version: 'latest' is not a vLLM release")
    assert report(tmp_path, results=[{"name": "k0"}])["msg"].startswith("results[0]: rank, draft_count, status missing")
    assert list(tmp_path.iterdir()) == [], "nothing written"
    blocked = tmp_path / "file"
    blocked.write_text("")
    refused = report(blocked / "sweep")
    assert refused["failed"] and refused["msg"].startswith(f"dest: cannot write {blocked / 'sweep'}")
