"""The rollout: its settings checked at once, the changed units cut into batches (a cluster whole,
the canary first), each unit judged against its own figures before the change, and the report."""

import pathlib

import pytest
import yaml

from ansible_collections.sparkfleet.vllm.plugins.filter.rollout import rollout_failed, rollout_settled, rollout_verdict
from ansible_collections.sparkfleet.vllm.plugins.filter.sweep import controller_has
from ansible_collections.sparkfleet.vllm.plugins.module_utils._rollout import ROLLOUT_SETTINGS, plan_rollout, rollout_report

ROOT = pathlib.Path(__file__).resolve().parents[4]
PLAYBOOK_VARS = yaml.safe_load((ROOT / "roles" / "measure_defaults" / "defaults" / "main.yml").read_text())
PLAYBOOK_DIR = str(ROOT / "playbooks")
# playbooks/rollout.yml's defaults (the measure_defaults role's), as its planning task passes them.
SETTINGS = {setting.name: (PLAYBOOK_VARS[setting.name].replace("{{ playbook_dir }}", PLAYBOOK_DIR)
                           if isinstance(PLAYBOOK_VARS[setting.name], str) else PLAYBOOK_VARS[setting.name]) for setting in ROLLOUT_SETTINGS}
HOSTS = ["spark-1", "spark-2", "spark-3", "spark-4"]


def instances(drift=None, deployed=None):
    """A host's vllm_drift: instance name -> drift reasons, and whether each was deployed before."""
    drift = drift or {}
    return {"vllm_drift": {"config_dir": "/etc/sparkfleet/vllm", "drift": drift,
                           "deployed": {name: (deployed or {}).get(name, True) for name in drift}}}


def node(cluster, nodes, drift=(), deployed=True):
    return {"cluster_name": cluster, "cluster_nodes": nodes,
            "cluster_drift": {"config_dir": "/srv/cluster", "drift": list(drift), "deployed": deployed}}


def fleet():
    """Four hosts: each serves chat (changed on all but spark-4), spark-3 and spark-4 also a cluster that changed on one node."""
    return {"spark-1": instances({"chat": ["the env file changes"], "code": []}),
            "spark-2": instances({"chat": ["the env file changes"]}),
            "spark-3": {**instances({"chat": ["the env file changes"], "new": ["no container"]}, {"new": False}),
                        **node("big", ["spark-3", "spark-4"], ["the unit changes"])},
            "spark-4": {**instances({"chat": []}), **node("big", ["spark-3", "spark-4"])}}


def plan(facts=None, **settings):
    return plan_rollout(HOSTS, facts or fleet(), {**SETTINGS, **settings}, controller_has)


def test_the_playbooks_defaults_pass_and_the_changed_units_are_cut_into_batches_the_canary_first():
    planned = plan()
    assert planned["errors"] == []
    assert [[unit["id"] for unit in batch["units"]] for batch in planned["batches"]] == [
        ["spark-1/chat"], ["spark-2/chat", "spark-3/chat"], ["spark-3/big"]]
    assert [batch["canary"] for batch in planned["batches"]] == [True, False, False]
    assert planned["unchanged"] == ["spark-1/code", "spark-4/chat"]
    assert planned["new"] == ["spark-3/new"], "a unit never deployed has nothing to be compared with"
    assert planned["shown"] == ["batch 1 (canary): spark-1/chat (the env file changes)",
                                "batch 2: spark-2/chat (the env file changes), spark-3/chat (the env file changes)",
                                "batch 3: spark-3/big (spark-3: the unit changes)", "unchanged: spark-1/code, spark-4/chat",
                                "never deployed, left to site.yml: spark-3/new"]


def test_a_cluster_is_one_unit_with_every_node_led_by_its_head_and_drained_as_the_gateway_routes_it():
    cluster = plan()["batches"][2]
    assert cluster["hosts"] == ["spark-3", "spark-4"] and cluster["drain"] == ["spark-3/big"]
    unit = cluster["units"][0]
    assert (unit["kind"], unit["head"], unit["config_dir"]) == ("cluster", "spark-3", "/srv/cluster"), "each host's own folder"
    assert unit["drift"] == ["spark-3: the unit changes"]


def test_the_canary_and_batch_sizes_shape_the_batches_and_units_sharing_a_host_are_measured_in_turn():
    planned = plan(rollout_canary_size=2, rollout_batch_size=5)
    assert [len(batch["units"]) for batch in planned["batches"]] == [2, 2]
    assert [unit["key"] for batch in planned["batches"] for unit in batch["units"]] == ["u1", "u2", "u3", "u4"]
    assert [(unit["id"], unit["slot"]) for unit in planned["batches"][0]["units"]] == [("spark-1/chat", 0), ("spark-2/chat", 0)]
    assert planned["batches"][0]["slots"] == 1, "units on different hosts are measured together"
    assert [(unit["id"], unit["slot"]) for unit in planned["batches"][1]["units"]] == [("spark-3/chat", 0), ("spark-3/big", 1)]
    assert planned["batches"][1]["slots"] == 2, "the cluster has a rank on spark-3: measured after its instance"


def test_a_cluster_with_a_node_outside_the_play_is_refused():
    planned = plan_rollout(HOSTS[:3], fleet(), SETTINGS, controller_has)
    assert planned["batches"] == []
    assert planned["errors"] == ["cluster big: spark-4 not in the play; a cluster rolls out whole, so give every node (rollout_hosts, --limit)"]


def test_a_switch_given_as_extra_vars_text_is_read_as_the_switch():
    assert plan(rollout_drain_force="True")["settings"]["rollout_drain_force"] is True
    assert plan(rollout_drain_force="false")["settings"]["rollout_drain_force"] is False


def test_nothing_changed_plans_no_batch():
    planned = plan({host: instances({"chat": []}) for host in HOSTS})
    assert planned["batches"] == [] and planned["errors"] == []


@pytest.mark.parametrize(("name", "value", "fragment"), [
    ("rollout_canary_size", 0, "rollout_canary_size: 0"),
    ("rollout_batch_size", "two", "rollout_batch_size: 'two'"),
    ("rollout_repeats", 11, "rollout_repeats: 11"),
    ("rollout_concurrencies", [], "rollout_concurrencies: [] is not a list of concurrencies"),
    ("rollout_noise_floor_pct", "5%", "write the percent without %"),
    ("rollout_max_changed_answers", 6, "rollout_max_changed_answers: 6"),
    ("rollout_label", "../etc", "rollout_label: '../etc' is not a plain label"),
    ("rollout_drain_force", "yes", "rollout_drain_force: 'yes' is not true or false"),
    ("rollout_documents_dir", "/no/such/folder", "rollout_documents_dir: '/no/such/folder' is no directory on the controller"),
    ("rollout_runner", "ssh", "rollout_runner: 'ssh' is not one of auto, exec, container, local"),
])
def test_a_bad_setting_is_named_with_the_fix_and_no_batch_is_planned(name, value, fragment):
    planned = plan(**{name: value})
    assert planned["batches"] == []
    assert len(planned["errors"]) == 1 and planned["errors"][0].startswith(name + ":") and fragment in planned["errors"][0], planned["errors"]


def bench(*throughputs, tpot=10.0):
    """vllm_bench results of repeats at concurrency 1 and 4: throughput at 4 as given, TPOT at both."""
    return [{"runs": [{"concurrency": 1, "output_throughput": 20.0, "mean_tpot_ms": tpot, "failed": 0},
                      {"concurrency": 4, "output_throughput": value, "mean_tpot_ms": tpot, "failed": 0}]} for value in throughputs]


CORRECT = {"passed": 20, "total": 20, "changed_cases": [], "stream_mismatches": []}
UNIT = {"id": "spark-1/chat", "kind": "instance", "key": "u1", "drift": ["the env file changes"]}
JUDGED = {**SETTINGS, "rollout_concurrencies": [1, 4], "rollout_noise_floor_pct": 5, "rollout_max_changed_answers": 0}


def verdict(after_bench, after_correctness=None, launch=None, before_bench=None):
    return rollout_verdict(UNIT, launch or {"ok": True}, CORRECT, before_bench or bench(100.0, 104.0),
                           after_correctness or CORRECT, after_bench, JUDGED)


def test_a_unit_as_fast_and_as_correct_as_before_is_upgraded():
    record = verdict(bench(97.0, 101.0))
    assert record["verdict"] == "upgraded" and record["ok"]
    assert record["after"]["summary"]["4"]["output_throughput"]["mean"] == 99.0
    assert record["after"]["correctness"] == {"passed": 20, "total": 20}, "only the counts travel to the report"


def test_throughput_worse_than_the_spread_plus_the_floor_is_a_regression_within_it_is_not():
    # Before: 100 and 104, a 3.9 % spread; after 93: 8.8 % worse against 3.9 + 5 allowed.
    assert verdict(bench(94.0, 94.0))["ok"], "8.0 % worse is within 3.9 % spread + 5 % floor"
    record = verdict(bench(92.0, 92.0))
    assert record["verdict"] == "regressed"
    assert record["reasons"] == ["output_throughput at 4: 102.0 before, 92.0 after, 9.8 % worse "
                                 "(allowed: the spread plus rollout_noise_floor_pct, 8.9 %)"]


def test_speed_is_not_judged_when_the_operator_says_the_figures_are_not_comparable():
    slower = bench(50.0, 52.0, tpot=40.0)
    assert not verdict(slower)["ok"]
    record = rollout_verdict(UNIT, {"ok": True}, CORRECT, bench(100.0, 104.0), CORRECT, slower, {**JUDGED, "rollout_judge_speed": False})
    assert record["verdict"] == "upgraded" and record["reasons"][0].endswith("speed not judged (rollout_judge_speed false), no more failed requests")


def test_a_slower_token_is_a_regression():
    record = verdict(bench(100.0, 104.0, tpot=12.0))
    assert [reason.split(":")[0] for reason in record["reasons"]] == ["mean_tpot_ms at 1", "mean_tpot_ms at 4"]


def test_changed_answers_beyond_the_allowed_count_are_a_regression():
    changed = {**CORRECT, "passed": 20, "changed_cases": [{"id": "capital-france"}]}
    record = verdict(bench(100.0, 104.0), changed)
    assert record["verdict"] == "regressed"
    assert record["reasons"] == ["correctness: 1 greedy answers changed (capital-france), more than rollout_max_changed_answers (0)"]
    fewer = verdict(bench(100.0, 104.0), {**CORRECT, "passed": 18})
    assert fewer["reasons"][0].startswith("correctness: 18 of 20 cases pass, the baseline 20")


def test_scrambled_streams_are_a_regression():
    record = verdict(bench(100.0, 104.0), {**CORRECT, "stream_mismatches": [{"id": "count"}]})
    assert "1 streamed answers differ from the whole ones (count)" in record["reasons"][0]


def test_answers_corrupted_under_load_are_a_regression_naming_the_cases():
    """vllm 46669: a draft with async scheduling corrupts answers only above concurrency 1; the correctness step asks
    again under the benchmark's load, and a case it got right alone going wrong there regresses the change."""
    load = {"concurrency": 4, "requests": 40, "corrupted": [{"id": "arith-2", "reason": "its known answer was right alone and wrong "
                                                             "under load"}, {"id": "str-1", "reason": "token soup under load, none alone"}]}
    record = verdict(bench(100.0, 104.0), {**CORRECT, "load": load})
    assert record["verdict"] == "regressed"
    assert ("2 answers right alone went wrong with 4 requests in flight (arith-2: its known answer was right alone and wrong under "
            "load, str-1: token soup under load, none alone)") in record["reasons"][0]
    assert verdict(bench(100.0, 104.0), {**CORRECT, "load": {**load, "corrupted": []}})["verdict"] == "upgraded"


def test_a_unit_that_did_not_serve_failed_and_one_not_measured_is_not_upgraded():
    failed = verdict([], launch={"ok": False, "msg": "vLLM instance chat failed its relaunch"})
    assert failed["verdict"] == "failed" and failed["reasons"] == ["the new settings did not serve: vLLM instance chat failed its relaunch"]
    unmeasured = rollout_verdict(UNIT, {"ok": True}, CORRECT, bench(100.0), None, [], JUDGED)
    assert unmeasured["verdict"] == "regressed" and "could not be measured" in unmeasured["reasons"][0]


def failing(reason):
    """A vllm_bench repeat whose run at 4 was not recorded: its file's zero figures are no measurement."""
    return {"runs": [{"concurrency": 1, "output_throughput": 20.0, "mean_tpot_ms": 10.0, "failed": 0, "reasons": []},
                     {"concurrency": 4, "output_throughput": 0.0, "mean_tpot_ms": 0.0, "failed": None, "reasons": [f"concurrency 4: {reason}"]}],
            "reasons": [f"concurrency 4: {reason}"]}


# Every way a repeat leaves nothing to judge: its run not recorded (requests unaccounted for, none succeeded), no run at
# all (the endpoint did not answer), no result (a crashed module, filtered out by the playbook), fewer results than asked.
MISSING_AFTER = {
    "unaccounted": ([*bench(100.0), failing("32 prompts sent, 29 completed, 0 failed: 3 unaccounted for")],
                    "1 of 2 repeat(s) after the change recorded no run at concurrency 4 (repeat 2: concurrency 4: 32 prompts sent, "
                    "29 completed, 0 failed: 3 unaccounted for): it counts against the new settings"),
    "none-succeeded": ([failing("no request succeeded (8 failed: Error 0: Internal Server Error)"), *bench(100.0)],
                       "1 of 2 repeat(s) after the change recorded no run at concurrency 4 (repeat 1: concurrency 4: no request succeeded"),
    "no-run": ([*bench(100.0), {"runs": [], "reasons": ["http://127.0.0.1:8000/v1/models did not answer"]}],
               "(repeat 2: http://127.0.0.1:8000/v1/models did not answer): it counts against the new settings"),
    "crashed": ([*bench(100.0), {"failed": True, "msg": "MODULE FAILURE"}],
                "(repeat 2: it left no benchmark result): it counts against the new settings"),
    "fewer-results": (bench(100.0), "(repeat 2: it left no benchmark result): it counts against the new settings"),
}


@pytest.mark.parametrize(("after_bench", "fragment"), MISSING_AFTER.values(), ids=MISSING_AFTER.keys())
def test_a_repeat_after_the_change_that_recorded_nothing_counts_against_the_new_settings(after_bench, fragment):
    record = verdict(after_bench)
    assert record["verdict"] == "regressed" and not record["ok"]
    assert any(fragment in reason for reason in record["reasons"]), record["reasons"]
    assert record["after"]["summary"]["4"]["output_throughput"]["mean"] == 100.0, "the failed run is not averaged in"


@pytest.mark.parametrize("before_bench", [[*bench(100.0), failing("20 prompts sent, 17 completed, 0 failed: 3 unaccounted for")],
                                          bench(100.0), [{"runs": [], "reasons": ["refused"]}, *bench(100.0)]])
def test_a_repeat_before_the_change_that_recorded_nothing_leaves_the_comparison_incomplete(before_bench):
    record = verdict(bench(100.0, 104.0), before_bench=before_bench)
    assert record["verdict"] == "regressed" and not record["ok"]
    assert any(reason.startswith("1 of 2 repeat(s) before the change recorded no run at concurrency 4")
               and reason.endswith(": the comparison is incomplete, so the change is not kept") for reason in record["reasons"])


def test_a_missing_repeat_counts_even_when_speed_is_not_judged():
    record = rollout_verdict(UNIT, {"ok": True}, CORRECT, bench(100.0, 104.0), CORRECT, bench(100.0), {**JUDGED, "rollout_judge_speed": False})
    assert record["verdict"] == "regressed" and record["reasons"] == [
        "1 of 2 repeat(s) after the change recorded no run at concurrency 1 (repeat 2: it left no benchmark result): it counts against the "
        "new settings",
        "1 of 2 repeat(s) after the change recorded no run at concurrency 4 (repeat 2: it left no benchmark result): it counts against the "
        "new settings"]


@pytest.mark.parametrize("judge_speed", [True, False])
@pytest.mark.parametrize(("before_bench", "after_bench", "where", "weight"), [
    (bench(100.0, 104.0), [], "after the change", "it counts against the new settings"),
    (bench(100.0, 104.0), None, "after the change", "it counts against the new settings"),
    ([], bench(100.0, 104.0), "before the change", "the comparison is incomplete, so the change is not kept"),
])
def test_a_side_whose_every_repeat_recorded_nothing_is_never_upgraded(before_bench, after_bench, where, weight, judge_speed):
    """Found in a review: with every repeat of a side missing there was no summary entry to find a missing repeat in, and
    with rollout_judge_speed false (the lab's) the unit was upgraded on its correctness alone."""
    record = rollout_verdict(UNIT, {"ok": True}, CORRECT, before_bench, CORRECT, after_bench, {**JUDGED, "rollout_judge_speed": judge_speed})
    assert record["verdict"] == "regressed"
    for concurrency in JUDGED["rollout_concurrencies"]:
        assert f"no repeat {where} recorded a run at concurrency {concurrency}: {weight}" in record["reasons"]


THREE = {**JUDGED, "rollout_repeats": 3}


@pytest.mark.parametrize(("before_bench", "after_bench", "named"), [
    (bench(100.0, 104.0, 102.0), bench(100.0, 104.0, 10.0),
     "output_throughput at 4 after the change: repeat 3 ran at 10.0 against 102.0, the median of the others (beyond 2x): it counts "
     "against the new settings"),
    (bench(100.0, 104.0, 102.0), bench(300.0, 104.0, 102.0),
     "output_throughput at 4 after the change: repeat 1 ran at 300.0 against 103.0, the median of the others (beyond 2x): it counts "
     "against the new settings"),
    (bench(10.0, 104.0, 102.0), bench(100.0, 104.0, 102.0),
     "output_throughput at 4 before the change: repeat 1 ran at 10.0 against 103.0, the median of the others (beyond 2x): the comparison "
     "is incomplete, so the change is not kept"),
])
def test_a_run_far_outside_its_siblings_is_named_never_averaged_away(before_bench, after_bench, named):
    record = rollout_verdict(UNIT, {"ok": True}, CORRECT, before_bench, CORRECT, after_bench, THREE)
    assert record["verdict"] == "regressed" and named in record["reasons"], record["reasons"]


def test_two_runs_too_far_apart_are_both_named():
    record = verdict(bench(100.0, 10.0))
    assert ("output_throughput at 4 after the change: repeats 1 and 2 disagree, 100.0 and 10.0, more than 2x apart (two runs cannot "
            "tell which is off): it counts against the new settings") in record["reasons"]


def test_outliers_are_not_judged_when_speed_is_not():
    record = rollout_verdict(UNIT, {"ok": True}, CORRECT, bench(100.0, 104.0, 102.0), CORRECT, bench(100.0, 104.0, 10.0),
                             {**THREE, "rollout_judge_speed": False})
    assert record["verdict"] == "upgraded"


ONE = {**JUDGED, "rollout_repeats": 1}


def test_one_run_a_side_is_judged_on_the_floor_and_the_verdict_says_the_spread_was_not_measured():
    record = rollout_verdict(UNIT, {"ok": True}, CORRECT, bench(100.0), CORRECT, bench(97.0), ONE)
    assert record["verdict"] == "upgraded"
    assert record["after"]["summary"]["4"]["output_throughput"]["spread_pct"] is None, "one run claims no spread of zero"
    assert record["reasons"][0].endswith(
        "; spread not measured (one run) for output_throughput at 1, mean_tpot_ms at 1, output_throughput at 4, mean_tpot_ms at 4: judged "
        "against rollout_noise_floor_pct alone, set rollout_repeats to 2 or more to measure it")
    slower = rollout_verdict(UNIT, {"ok": True}, CORRECT, bench(100.0), CORRECT, bench(94.0), ONE)
    assert slower["verdict"] == "regressed" and slower["reasons"] == [
        "output_throughput at 4: 100.0 before, 94.0 after, 6.0 % worse (allowed: the spread plus rollout_noise_floor_pct, 5.0 %) "
        "(spread not measured: one run, so the margin is rollout_noise_floor_pct alone)"]


def test_a_step_that_failed_after_the_judgement_fails_the_unit_keeping_its_reasons():
    judged = verdict(bench(100.0, 104.0))
    record = rollout_failed(UNIT, [judged], "batch 1 stopped: the rollback failed")
    assert record["verdict"] == "failed" and not record["ok"] and record["reasons"][-1] == "batch 1 stopped: the rollback failed"
    fresh = rollout_failed(UNIT, [], "batch 1 stopped: drain refused")
    assert fresh["reasons"] == ["batch 1 stopped: drain refused"] and fresh["before"] is None


def test_a_rollback_says_whether_the_last_good_settings_serve_again():
    regressed = verdict(bench(92.0, 92.0))
    settled = [{"__vllm_settled": {"key": "chat", "value": "roll_back"}, "served": True, "msg": "The last good settings were relaunched and serve again."}]
    assert rollout_settled(regressed, settled, "spark-1")["reasons"][-1] == "rolled back: the last good settings serve again"
    down = [{"__vllm_settled": {"key": "chat", "value": "roll_back"}, "failed": True, "msg": "... do not serve either; the instance is down."}]
    record = rollout_settled(regressed, down, "spark-1")
    assert record["verdict"] == "failed" and record["reasons"][-1] == "roll_back: ... do not serve either; the instance is down."
    assert rollout_settled(regressed, down, "spark-2") == regressed, "another host's instance of the same name is another unit"
    kept = verdict(bench(100.0, 104.0))
    assert rollout_settled(kept, [{"__vllm_settled": {"key": "chat", "value": "keep"}}], "spark-1") == kept
    cluster = {**regressed, "id": "spark-3/big"}
    failed = rollout_settled(cluster, [], "", {"id": "spark-3/big", "step": "roll_back", "failed": True, "msg": "the cluster is down"})
    assert failed["verdict"] == "failed" and failed["reasons"][-1] == "roll_back: the cluster is down"


def test_the_report_gives_each_unit_its_batch_figures_and_verdict_and_names_the_batches_never_started():
    planned = plan()
    record = verdict(bench(92.0, 92.0))
    report = rollout_report("Rollout r1", {**planned, "settings": JUDGED}, [record])
    assert not report["ok"]
    assert [(row["batch"], row["id"], row["verdict"]) for row in report["units"]] == [
        (1, "spark-1/chat", "regressed"), (2, "spark-2/chat", "not started"), (2, "spark-3/chat", "not started"), (3, "spark-3/big", "not started")]
    lines = report["markdown"].splitlines()
    assert lines[4] == ("| 1 (canary) | spark-1/chat | regressed | 20/20 | 20/20 | 20.0 ±0.0% | 20.0 ±0.0% | 10.0 ±0.0% | 10.0 ±0.0% "
                        "| 102.0 ±2.0% | 92.0 ±0.0% | 10.0 ±0.0% | 10.0 ±0.0% |")
    assert lines[3].count("|") == lines[4].count("|") == lines[2].count("|")
    assert "- spark-2/chat (not started): an earlier batch failed, so this batch never started" in lines
    assert lines[-1] == "Never deployed, so nothing to compare with (left to site.yml): spark-3/new"


def test_docs_list_every_setting_with_the_playbooks_default():
    page = (ROOT / "docs" / "rollout.md").read_text()
    for setting in ROLLOUT_SETTINGS:
        default = PLAYBOOK_VARS[setting.name]
        assert f"`{setting.name}`" in page, setting.name
        if not isinstance(default, str) or "{{" not in default:
            text = default if isinstance(default, str) else yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
            shown = f"`{text}`"
            row = next(line for line in page.splitlines() if line.startswith("|") and f"`{setting.name}`" in line)
            assert shown.lower() in row.lower(), (setting.name, shown, row)
