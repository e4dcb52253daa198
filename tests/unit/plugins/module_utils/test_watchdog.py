"""The watchdog's judgement, sample by sample: down and wedged units acted on at the third failing
sample, progress from counters or a probe, the maintenance flag fresh and stale, sleeping engines,
systemd's own starts, the grace after a start (cold, then warm), the restart budget and the give-up,
and the role's plan with its refusals."""

import json
from pathlib import Path

import pytest
import yaml

from ansible_collections.sparkfleet.vllm.plugins.filter.watchdog import watchdog_plan_filter
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import STACKS_DIR
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import (
    SETTINGS,
    STATE_DIR,
    WatchdogError,
    acted,
    assess,
    counters_moved,
    deployed_ranks,
    engine_hold,
    has_peers,
    host_addresses,
    journal_line,
    needs_probe,
    new_memory,
    next_sample_in,
    other_probe_kind,
    parse_metrics,
    peer_access,
    peer_request,
    person_needed_path,
    planned_probe_kind,
    probe_kind,
    probe_request,
    recently_restarted,
    routed_backends,
    settings_problems,
    watchdog_plan,
    worth_a_line,
)

ROOT = Path(__file__).resolve().parents[4]
SETTINGS_DEFAULT = {"interval": 30, "failures": 3, "probe_timeout": 15, "probe_tokens": 4, "budget": 3, "budget_window": 21600,
                    "warm_grace": 600, "maintenance_max_age": 7200, "bundle_time_limit": 60, "route_budget": 8, "route_budget_window": 3600}
PLAN = {"unit": "sparkfleet-vllm-llm.service", "container": "sparkfleet-vllm-llm", "config_hash": "h1", "health_timeout": 1200}
# A page as vLLM 0.32's CPU build serves it (recorded on the lab, trimmed to the families read here).
METRICS_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 120.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 300.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 42.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 420.0
# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; ...
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="discard_all"} 0.0
"""


def seen(**changes):
    return {"person_needed": False, "flag_age": None, "container": "running", "active_state": "active", "sub_state": "running",
            "job_pending": False, "metrics": None, "probe": None, **changes}


def metrics(generated, running=1.0, **extra):
    return {"vllm:generation_tokens_total": generated, "vllm:prompt_tokens_total": 10.0, "vllm:iteration_tokens_total_count": generated,
            "vllm:num_requests_running": running, **extra}


TIMEOUT = {"outcome": "timeout", "seconds": 15.0, "detail": "timed out"}
OK = {"outcome": "ok", "seconds": 0.04, "detail": ""}


def samples(memory, observations, start=1000.0, settings=None):
    return [assess(PLAN, memory, observation, settings or SETTINGS_DEFAULT, start + 30 * index) for index, observation in enumerate(observations)]


def test_the_metrics_page_parses_to_the_summed_counters_and_gauges():
    values = parse_metrics(METRICS_PAGE + 'vllm:generation_tokens_total{engine="1",model_name="tiny"} 5.0\nbroken line here\n')
    assert values["vllm:generation_tokens_total"] == 125.0
    assert values["vllm:iteration_tokens_total_count"] == 42.0
    assert values["vllm:num_requests_running"] == 1.0
    assert "vllm:iteration_tokens_total_sum" not in values
    assert values["sleeping"] == 0.0, "an awake engine's sleep series (awake 1, the levels 0) is no sleep"


@pytest.mark.parametrize(("awake", "level_one", "level_two"), [("0.0", "1.0", "0.0"), ("0.0", "0.0", "1.0"), ("0.0", "0.0", "0.0")])
def test_an_engine_put_to_sleep_reads_as_sleeping(awake, level_one, level_two):
    page = METRICS_PAGE.replace('sleep_state="awake"} 1.0', f'sleep_state="awake"}} {awake}')
    page = page.replace('sleep_state="weights_offloaded"} 0.0', f'sleep_state="weights_offloaded"}} {level_one}')
    page = page.replace('sleep_state="discard_all"} 0.0', f'sleep_state="discard_all"}} {level_two}')
    assert parse_metrics(page)["sleeping"] == 1.0


def test_counters_moved_only_when_one_grew():
    assert counters_moved({"vllm:generation_tokens_total": 1.0}, {"vllm:generation_tokens_total": 2.0})
    assert not counters_moved({"vllm:generation_tokens_total": 2.0}, {"vllm:generation_tokens_total": 2.0})
    assert not counters_moved({"vllm:generation_tokens_total": 9.0}, {"vllm:generation_tokens_total": 2.0}), "a reset is no progress"
    assert not counters_moved(None, {"vllm:generation_tokens_total": 2.0})


def test_a_container_down_for_three_samples_is_started_and_then_given_its_cold_grace():
    memory = new_memory()
    down = seen(container="exited", active_state="inactive", sub_state="dead")
    first, second, third = samples(memory, [down, down, down])
    assert [first["action"], second["action"]] == ["none", "none"] and first["verdict"] == "down"
    assert third["action"] == "start" and "failing sample 3 of 3" in third["why"] and "cold grace of 1200 s" in third["why"]
    assert memory["grace_until"] == 1060.0 + 1200 and len(memory["restarts"]) == 1
    during = assess(PLAN, memory, down, SETTINGS_DEFAULT, 1100.0)
    assert during["verdict"] == "grace" and during["action"] == "none"


def test_a_container_gone_under_a_unit_systemd_holds_active_is_restarted_not_started():
    memory = new_memory()
    third = samples(memory, [seen(container="missing")] * 3)[-1]
    assert third["verdict"] == "down" and third["action"] == "restart"


def test_docker_not_answering_judges_nothing_and_counts_nothing():
    memory = new_memory()
    decisions = samples(memory, [seen(container="unknown", metrics=None)] * 4)
    assert {(d["verdict"], d["action"]) for d in decisions} == {("inconclusive", "none")} and memory["failures"] == 0


def test_the_actions_are_read_back_from_the_journal_lines():
    lines = [
        json.dumps({"sparkfleet_watchdog": 1, "unit": "sparkfleet-vllm-llm.service", "action": "none", "verdict": "progress"}),
        journal_line({"unit": "sparkfleet-vllm-llm.service", "verdict": "wedged", "action": "restart", "why": "wedged"}, 1.0),
        "Started sparkfleet-watchdog.service",
        json.dumps({"sparkfleet_watchdog": 1, "unit": "sparkfleet-vllm-llm.service", "action": "give_up"}),
        json.dumps(["start"]),
    ]
    assert [decision["action"] for decision in acted(lines)] == ["restart", "give_up"]


def test_the_journal_gets_actions_failures_and_changes_but_not_an_idle_engine_alternating_between_counters_and_probes():
    def line(verdict, action="none"):
        return {"verdict": verdict, "action": action}

    assert not worth_a_line(line("answers"), "progress") and not worth_a_line(line("progress"), "answers")
    assert worth_a_line(line("progress"), "grace") and worth_a_line(line("wedged"), "wedged") and worth_a_line(line("down", "start"), "down")
    assert not worth_a_line(line("grace"), "grace")


def test_systemd_starting_the_unit_is_not_down():
    memory = new_memory()
    auto_restart = seen(container="exited", active_state="activating", sub_state="auto-restart")
    queued = seen(container="missing", active_state="inactive", sub_state="dead", job_pending=True)
    decisions = samples(memory, [auto_restart, queued, auto_restart, queued])
    assert {d["verdict"] for d in decisions} == {"starting"} and memory["failures"] == 0


def test_one_good_sample_resets_the_count():
    memory = new_memory()
    down = seen(container="exited", active_state="failed", sub_state="failed")
    decisions = samples(memory, [down, down, seen(metrics=metrics(5.0), probe=OK), down, down])
    assert [d["action"] for d in decisions] == ["none"] * 5 and memory["failures"] == 2


def test_a_fresh_maintenance_flag_silences_it_and_a_stale_one_does_not():
    memory = new_memory()
    down = seen(container="exited", active_state="inactive", sub_state="dead")
    flagged = [{**down, "flag_age": 60.0}] * 5
    assert {d["verdict"] for d in samples(memory, flagged)} == {"maintenance"} and memory["failures"] == 0
    stale = [{**down, "flag_age": 7300.0}] * 3
    decisions = samples(memory, stale)
    assert decisions[-1]["action"] == "start" and "a maintenance flag 7300 s old was ignored" in decisions[-1]["why"]


def test_counters_frozen_and_the_probe_timing_out_while_the_container_runs_is_a_wedge():
    memory = new_memory()
    frozen = seen(metrics=metrics(120.0), probe=TIMEOUT)
    decisions = samples(memory, [seen(metrics=metrics(120.0), probe=OK), frozen, frozen, frozen])
    assert decisions[0]["verdict"] == "answers"
    assert [d["verdict"] for d in decisions[1:]] == ["wedged"] * 3
    assert decisions[-1]["action"] == "restart" and "no answer in 15 s while the container runs" in decisions[-1]["why"]
    assert decisions[-1]["kill_first"], "a frozen engine is killed, not given docker stop's grace"


def test_the_probes_own_tokens_are_no_progress_of_the_next_sample():
    memory = new_memory()
    answered = {**seen(metrics=metrics(120.0), probe=OK), "after_probe": metrics(124.0)}
    assert samples(memory, [answered])[0]["verdict"] == "answers"
    assert needs_probe(memory, metrics(124.0)), "an engine that froze after answering its probe is probed, not taken for busy"
    assert not needs_probe(memory, metrics(125.0)), "a token beyond the probe's own is progress"
    frozen = seen(metrics=metrics(124.0), probe=TIMEOUT)
    assert [d["verdict"] for d in samples(memory, [frozen] * 3)] == ["wedged"] * 3


def test_a_failing_unit_is_sampled_again_after_the_probe_timeout_until_it_is_acted_on():
    settings = {**SETTINGS_DEFAULT, "interval": 30, "probe_timeout": 15, "failures": 3}
    healthy, failing_once, acted_on = new_memory(), {**new_memory(), "failures": 1}, {**new_memory(), "failures": 0}
    assert next_sample_in({"a": healthy, "b": acted_on}, settings) == 30
    assert next_sample_in({"a": healthy, "b": failing_once}, settings) == 15
    assert next_sample_in({"b": {**failing_once, "failures": 2}}, settings) == 15
    assert next_sample_in({"b": failing_once}, {**settings, "interval": 5}) == 5, "never slower than the interval"
    assert next_sample_in({}, settings) == 30


def test_moving_counters_are_progress_without_a_probe():
    memory = new_memory()
    decisions = samples(memory, [seen(metrics=metrics(float(n)), probe=OK if n == 1 else None) for n in range(1, 6)])
    assert [d["verdict"] for d in decisions] == ["answers", "progress", "progress", "progress", "progress"]
    assert not needs_probe(memory, metrics(6.0)) and needs_probe(memory, metrics(5.0))


def test_an_idle_engine_that_answers_its_probe_is_healthy():
    memory = new_memory()
    idle = seen(metrics=metrics(7.0, running=0.0), probe=OK)
    assert {d["verdict"] for d in samples(memory, [idle] * 6)} == {"answers"} and memory["failures"] == 0


def test_a_sleeping_engine_is_left_alone_and_not_probed():
    memory = new_memory()
    sleeping = metrics(7.0, running=0.0, sleeping=1.0)
    assert not needs_probe(memory, sleeping)
    assert {d["verdict"] for d in samples(memory, [seen(metrics=sleeping)] * 5)} == {"sleeping"}


def test_a_refused_probe_cannot_judge_and_counts_nothing():
    memory = new_memory()
    refused = seen(metrics=metrics(1.0), probe={"outcome": "refused", "seconds": 0.01, "detail": "HTTP 401"})
    decisions = samples(memory, [refused] * 5)
    assert {d["verdict"] for d in decisions} == {"inconclusive"} and memory["failures"] == 0


def test_a_page_without_vllms_series_is_judged_by_the_probe_alone():
    """Found in a reading: --disable-log-stats leaves /metrics without vLLM's series; a hanging probe then ended in a
    traceback instead of a restart."""
    memory = new_memory()
    assert parse_metrics("# HELP process_cpu_seconds_total x\nprocess_cpu_seconds_total 12.5\n") == {}
    assert needs_probe(memory, {})
    decisions = samples(memory, [seen(metrics={}, probe=OK), *[seen(metrics={}, probe=TIMEOUT)] * 3])
    assert [d["verdict"] for d in decisions] == ["answers", "wedged", "wedged", "wedged"] and decisions[-1]["action"] == "restart"
    assert decisions[1]["why"].startswith("/metrics carries no vLLM series (--disable-log-stats) and a probe got no answer in 15 s")
    unanswered = samples(new_memory(), [seen(metrics={}, probe={"outcome": "error", "seconds": 0.0, "detail": ""})] * 3)
    assert unanswered[-1]["why"].startswith("the container running but the server does not answer: /metrics carries no vLLM series")


@pytest.mark.parametrize("serve_args, kind", [
    (["/models/e5", "--runner", "pooling"], "pooling"),
    (["/models/e5", "--runner=pooling"], "pooling"),
    (["/models/e5", "--convert", "embed"], "pooling"),
    (["/models/e5", "--convert=classify"], "pooling"),
    (["/models/llm", "--convert", "none"], "generate"),
    (["/models/llm", "--convert=auto"], "generate"),
    (["/models/llm"], "generate"),
    (["/models/llm", "--runner", "generate"], "generate"),
    (["/models/llm", "--served-model-name", "pooling"], "generate"),
    (["/models/llm", "--runner"], "generate"),
    ("--runner pooling", "generate"),
])
def test_the_probe_asks_what_the_plan_serves(serve_args, kind):
    assert planned_probe_kind(serve_args) == kind
    assert probe_kind({"serve_args": serve_args}, new_memory()) == kind
    assert probe_kind({"serve_args": serve_args}, {**new_memory(), "probe_kind": "pooling"}) == "pooling", "what answered wins"
    assert probe_kind({"serve_args": serve_args}, {**new_memory(), "probe_kind": "nonsense"}) == kind


def test_a_route_refused_as_the_wrong_task_is_asked_of_the_other_task_but_a_refused_key_is_not():
    assert probe_request("pooling", "e5", 4) == ("/v1/embeddings", {"model": "e5", "input": "ping"})
    assert probe_request("generate", "llm", 4)[0] == "/v1/completions"
    assert [other_probe_kind("generate", status) for status in (400, 404, 405)] == ["pooling"] * 3
    assert other_probe_kind("pooling", 404) == "generate"
    assert [other_probe_kind("generate", status) for status in (None, 401, 403, 429, 500)] == [None] * 5


def test_a_server_that_does_not_answer_is_restarted():
    memory = new_memory()
    silent = seen(metrics=None, probe={"outcome": "error", "seconds": 0.0, "detail": "Connection refused"})
    decisions = samples(memory, [silent] * 3)
    assert decisions[-1]["verdict"] == "unanswered" and decisions[-1]["action"] == "restart" and decisions[-1]["kill_first"]
    gone = samples(new_memory(), [seen(container="missing", active_state="active", sub_state="running")] * 3)
    assert gone[-1]["verdict"] == "down" and gone[-1]["action"] == "restart" and "kill_first" not in gone[-1], "nothing to kill"


def test_the_grace_ends_once_the_unit_serves_and_the_next_start_is_warm():
    memory = new_memory()
    wedge = seen(metrics=metrics(1.0), probe=TIMEOUT)
    samples(memory, [wedge] * 3)
    assert memory["grace_until"] > 0
    # The old container answering while systemd still restarts the unit does not end the grace.
    old = assess(PLAN, memory, seen(metrics=metrics(1.0), probe=OK, active_state="activating", job_pending=True), SETTINGS_DEFAULT, 1150.0)
    assert old["verdict"] == "grace" and memory["grace_until"] > 0
    served = assess(PLAN, memory, seen(metrics=metrics(1.0), probe=OK), SETTINGS_DEFAULT, 1200.0)
    assert served["verdict"] == "answers" and memory["grace_until"] == 0.0 and memory["warm_hashes"] == ["h1"]
    decisions = samples(memory, [wedge] * 3, start=1300.0)
    assert "warm grace of 600 s" in decisions[-1]["why"]


def test_past_the_budget_it_gives_up_and_stays_quiet_until_handed_back():
    memory = new_memory()
    settings = {**SETTINGS_DEFAULT, "budget": 2}
    down = seen(container="exited", active_state="failed", sub_state="failed")
    actions = []
    for round_start in (0.0, 2000.0, 4000.0):
        actions += [d["action"] for d in samples(memory, [down] * 3, start=round_start, settings=settings)]
        memory["grace_until"] = 0.0
    assert actions.count("start") == 2 and actions[-1] == "give_up" and memory["person_needed"]
    quiet = assess(PLAN, memory, {**down, "person_needed": True}, settings, 5000.0)
    assert quiet["verdict"] == "person_needed" and quiet["action"] == "none"
    handed_back = assess(PLAN, memory, down, settings, 6000.0)
    assert handed_back["verdict"] == "handed_back" and memory["restarts"] == [] and memory["grace_until"] == 6000.0 + 1200


def test_restarts_older_than_the_window_leave_the_budget():
    memory = new_memory()
    memory["restarts"] = [0.0, 10.0, 20.0]
    down = seen(container="dead", active_state="failed", sub_state="failed")
    decisions = samples(memory, [down] * 3, start=30000.0)
    assert decisions[-1]["action"] == "start" and memory["restarts"] == [30060.0]


def test_each_decision_is_one_json_line():
    memory = new_memory()
    line = journal_line(samples(memory, [seen(container="exited", active_state="inactive")])[0], 1000.0)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["sparkfleet_watchdog"] == 1 and parsed["verdict"] == "down" and parsed["unit"] == PLAN["unit"]


def test_the_plan_lays_out_the_daemon_beside_the_host_runtime_its_config_and_unit():
    plan = watchdog_plan(SETTINGS_DEFAULT, ["/etc/sparkfleet/vllm", "/etc/sparkfleet/cluster"], ["/etc/sparkfleet/vllm", None], "spark-1", "")
    assert plan["errors"] == []
    assert plan["daemon"] == {"path": "/usr/local/libexec/sparkfleet/sparkfleet_watchdog.py", "mode": "0644",
                              "source": "roles/watchdog/files/sparkfleet_watchdog.py"}
    assert plan["retired"] == "/opt/sparkfleet/watchdog" and plan["retired"] in plan["removed"]
    assert "/usr/local/libexec/sparkfleet" not in plan["removed"], "the runtime stays for the serving units"
    config = json.loads(plan["config"]["content"])
    assert config["interval"] == 30 and config["plan_dirs"] == ["/etc/sparkfleet/vllm", "/etc/sparkfleet/cluster"]
    assert (config["node"], config["gateway_config_dir"]) == ("spark-1", "")
    assert "Restart=always" in plan["unit"]["content"]
    assert "ExecStart=/usr/bin/python3 -I /usr/local/libexec/sparkfleet/sparkfleet_watchdog.py run" in plan["unit"]["content"]
    assert person_needed_path("/var/lib/sparkfleet/watchdog", "u.service") == "/var/lib/sparkfleet/watchdog/u.service.person-needed.json"


@pytest.mark.parametrize(("changes", "plan_dirs", "fragment"), [
    ({"interval": 1}, None, "watchdog_interval is 1: give a whole number from 5 to 3600"),
    ({"probe_timeout": 1}, None, "watchdog_probe_timeout is 1: give a whole number from 10 to 300 (seconds a probe completion may take; probes of 1 s"),
    ({"failures": 1}, None, "watchdog_failures is 1: give a whole number from 2 to 20"),
    ({"budget": True}, None, "watchdog_budget is True"),
    ({"probe_tokens": 64}, None, "watchdog_probe_tokens is 64"),
    ({"route_budget": 1}, None, "watchdog_route_budget is 1: give a whole number from 2 to 100 (changes of a gateway's routing"),
    ({"route_budget": "8"}, None, "watchdog_route_budget is '8': give a whole number from 2 to 100"),
    ({"route_budget": False}, None, "watchdog_route_budget is False"),
    ({"route_budget_window": 59}, None, "watchdog_route_budget_window is 59: give a whole number from 60 to 86400"),
    ({"route_budget_window": 86_401}, None, "watchdog_route_budget_window is 86401"),
    ({"interval": 3600, "failures": 20, "budget_window": 3600}, None, "exceeds watchdog_budget_window"),
    ({}, ["relative/dir"], "watchdog_plan_dirs is ['relative/dir']: give a list of absolute folders"),
    ({}, ["/etc/sparkfleet/../x"], "give a list of absolute folders"),
    ({}, ["/etc/sparkfleet/cluster"], "leaves out /srv/vllm-conf, where the serving roles keep their plans here"),
    ({"node": 'spark-1" ssh'}, None, "the host's inventory name 'spark-1\" ssh' is not a name the watchdog's peer command can carry"),
    ({"gateway_config_dir": "etc/gw"}, None, "gateway_config_dir is 'etc/gw': give the gateway's absolute folder"),
])
def test_bad_settings_are_refused_naming_the_variable_and_the_fix(changes, plan_dirs, fragment):
    host = {"node": changes.pop("node", "spark-1"), "gateway_config_dir": changes.pop("gateway_config_dir", "/etc/sparkfleet/gateway")}
    plan = watchdog_plan({**SETTINGS_DEFAULT, **changes}, plan_dirs or ["/srv/vllm-conf", "/etc/sparkfleet/cluster"], ["/srv/vllm-conf"],
                         host["node"], host["gateway_config_dir"])
    assert any(fragment in error for error in plan["errors"]), plan["errors"]
    assert set(plan) == {"errors"}


@pytest.mark.parametrize(("name", "text"), [("interval", "30"), ("failures", " 3 "), ("warm_grace", "600.0"), ("route_budget", "8")])
def test_a_number_given_as_text_by_extra_vars_is_read_as_the_argument_spec_reads_it(name, text):
    """Found in a reading: -e watchdog_interval=30 (extra variables are text) was refused although the role's argument spec
    types it int."""
    plan = watchdog_plan_filter({**SETTINGS_DEFAULT, name: text}, ["/etc/sparkfleet/vllm"], [], "spark-1", "")
    assert plan["errors"] == [] and plan == watchdog_plan_filter({**SETTINGS_DEFAULT, name: int(float(text))}, ["/etc/sparkfleet/vllm"], [],
                                                                 "spark-1", "")
    refused = watchdog_plan_filter({**SETTINGS_DEFAULT, name: "soon"}, ["/etc/sparkfleet/vllm"], [], "spark-1", "")["errors"]
    assert any("is 'soon'" in error for error in refused)


@pytest.mark.parametrize("serving", ["/srv//vllm-conf", "/srv/vllm-conf/", "//srv/vllm-conf"])
def test_plan_folders_are_compared_in_one_spelling(serving):
    assert watchdog_plan(SETTINGS_DEFAULT, ["/srv/vllm-conf"], [serving], "spark-1", "")["errors"] == []


def test_every_setting_has_bounds_the_role_documents():
    assert set(SETTINGS) == set(SETTINGS_DEFAULT)
    role = ROOT / "roles" / "watchdog"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    assert SETTINGS_DEFAULT == {name: defaults[f"watchdog_{name}"] for name in SETTINGS}
    assert settings_problems(SETTINGS_DEFAULT) == []
    options = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for name, (least, most, _why) in SETTINGS.items():
        assert f"({least} to {most}" in options[f"watchdog_{name}"]["description"], name


NODES = [{"name": "spark-1", "rank": 0, "address": "10.0.0.1"}, {"name": "spark-3", "rank": 2, "address": "10.0.0.3"},
         {"name": "spark-2", "rank": 1, "address": "10.0.0.2"}]


def rank_plan(rank, backend="native"):
    return {**PLAN, "unit": "sparkfleet-cluster-tp.service", "url": "http://127.0.0.1:8000", "env_path": "/etc/sparkfleet/cluster/tp.env",
            "cluster": {"rank": rank, "head": rank == 0, "backend": backend, "host_ip": next(n["address"] for n in NODES if n["rank"] == rank), "nodes": NODES}}


def test_a_worker_rank_is_judged_by_its_container_and_its_failure_restarts_every_rank():
    memory = new_memory()
    worker = rank_plan(1)
    assert assess(worker, memory, seen(), SETTINGS_DEFAULT, 1000.0)["verdict"] == "rank_runs"
    down = seen(container="exited", active_state="failed", sub_state="failed")
    decisions = [assess(worker, memory, down, SETTINGS_DEFAULT, 1000.0 + 30 * index) for index in range(3)]
    assert [d["action"] for d in decisions] == ["none", "none", "restart_cluster"]
    memory = new_memory()
    head = [assess(rank_plan(0), memory, down, SETTINGS_DEFAULT, 1000.0 + 30 * index) for index in range(3)]
    assert head[-1]["action"] == "restart_cluster" and "every rank restarted" in head[-1]["why"]


def test_a_worker_ranks_grace_ends_once_its_container_runs_so_a_second_kill_is_judged_at_once():
    memory, worker = new_memory(), rank_plan(1)
    down = seen(container="exited", active_state="failed", sub_state="failed")
    samples_down = [assess(worker, memory, down, SETTINGS_DEFAULT, 1000.0 + 30 * index) for index in range(3)]
    assert samples_down[-1]["action"] == "restart_cluster" and memory["grace_until"] > 1060.0 + 500
    starting = assess(worker, memory, seen(active_state="activating", job_pending=True), SETTINGS_DEFAULT, 1090.0)
    assert starting["verdict"] == "grace", "still starting: the grace holds"
    assert assess(worker, memory, seen(), SETTINGS_DEFAULT, 1120.0)["verdict"] == "rank_runs" and memory["grace_until"] == 0.0
    again = [assess(worker, memory, down, SETTINGS_DEFAULT, 1150.0 + 30 * index)["verdict"] for index in range(2)]
    assert again == ["down", "down"], "killed again 30 s later: judged, not waited out"


def test_a_peer_request_names_a_verb_and_a_rank_planned_here():
    plans = [rank_plan(1), {**PLAN, "cluster": None}]
    verb, plan = peer_request("stop sparkfleet-cluster-tp.service", plans)
    assert verb == "stop" and plan is plans[0]
    for text in (None, "", "stop", "kill sparkfleet-cluster-tp.service", "stop sparkfleet-vllm-llm.service", "start a b"):
        with pytest.raises(WatchdogError, match="^refused"):
            peer_request(text, plans)
    with pytest.raises(WatchdogError, match="only the cluster's head restarts every rank"):
        peer_request("restart sparkfleet-cluster-tp.service", plans)
    assert peer_request("restart sparkfleet-cluster-tp.service", [rank_plan(0)])[0] == "restart"


def test_a_restart_of_every_rank_moments_ago_is_the_same_failures():
    # interval 30 x (3 failures + 2) + 30 s.
    assert recently_restarted(1000.0, 1179.0, SETTINGS_DEFAULT) and not recently_restarted(1000.0, 1181.0, SETTINGS_DEFAULT)
    assert not recently_restarted(None, 1000.0, SETTINGS_DEFAULT)


USER_KEY = "ssh-ed25519 " + "A" * 68
HOST_KEY = "ssh-ed25519 " + "B" * 68


def reports(**changes):
    """Three nodes of one cluster as the role reads them: each one's deployed rank, its watchdog's key and its host key."""
    found = {}
    for node in NODES:
        found[node["name"]] = {"ranks": deployed_ranks([{**rank_plan(node["rank"])}]), "user_key": f"ssh-ed25519 {'A' * 67}{node['rank']} c",
                               "host_key": f"ssh-ed25519 {'B' * 67}{node['rank']} root@{node['name']}\n", **changes.get(node["name"], {})}
    return found


def test_each_peer_may_run_only_the_peer_command_from_its_own_address_and_only_its_host_key_is_trusted():
    access = peer_access("spark-1", reports())
    assert access["errors"] == [] and access["peers"] == ["spark-2", "spark-3"]
    assert access["authorized_keys"][0] == {"peer": "spark-2", "key_id": "spark-2:cluster", "line": (
        'restrict,from="10.0.0.2",command="/usr/bin/python3 -I /usr/local/libexec/sparkfleet/sparkfleet_watchdog.py peer --from spark-2 --cluster" '
        f"ssh-ed25519 {'A' * 67}1 sparkfleet-watchdog@spark-2:cluster")}
    assert access["key_ids"] == ["spark-2:cluster", "spark-3:cluster"]
    assert access["known_hosts"] == f"10.0.0.2 ssh-ed25519 {'B' * 67}1\n10.0.0.3 ssh-ed25519 {'B' * 67}2\n"
    assert peer_access("spark-9", {"spark-9": {"ranks": [], "user_key": "", "host_key": ""}}) == {
        "errors": [], "peers": [], "key_ids": [], "authorized_keys": [], "known_hosts": "", "gateways": []}


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"spark-3": {"ranks": []}}, "no host of the play runs its rank 2 at 10.0.0.3; keep every node of the cluster in the play"),
    ({"spark-2": {"user_key": "ssh-rsa AAAA"}}, "peer 'spark-2' of spark-1: no usable name, watchdog key, ed25519 host key or address"),
    ({"spark-2": {"host_key": ""}}, "peer 'spark-2' of spark-1: no usable"),
])
def test_a_peer_missing_from_the_play_or_without_usable_keys_is_refused(changes, fragment):
    found = reports(**changes)
    access = peer_access("spark-1", found)
    assert "authorized_keys" not in access and any(fragment in error for error in access["errors"]), access
    assert peer_access("spark-1", {k: v for k, v in found.items() if k != "spark-1"})["errors"][0].startswith("spark-1: no report")


def test_a_gateways_backends_may_drain_their_own_units_there_from_their_own_addresses():
    found = reports()
    for name, index in (("spark-1", 1), ("spark-2", 2), ("spark-3", 3)):
        found[name]["addresses"] = [{"address": f"192.168.1.{index}", "prefix": 24}, {"address": f"10.0.0.{index}", "prefix": 24}]
    found["spark-1"]["gateway"] = {"spark-1": ["127.0.0.1"], "spark-3": ["192.168.1.3"], "spark-2": ["spark-2.lan"]}
    gateway = peer_access("spark-1", found)
    lines = {entry["key_id"]: entry["line"] for entry in gateway["authorized_keys"]}
    assert sorted(lines) == ["spark-2:backend", "spark-2:backend+cluster", "spark-3:backend", "spark-3:backend+cluster"]
    assert lines["spark-3:backend+cluster"].startswith(
        'restrict,from="10.0.0.3",command="/usr/bin/python3 -I /usr/local/libexec/sparkfleet/sparkfleet_watchdog.py peer --from spark-3 --backend --cluster" ')
    assert lines["spark-3:backend"].startswith(
        'restrict,from="192.168.1.3",command="/usr/bin/python3 -I /usr/local/libexec/sparkfleet/sparkfleet_watchdog.py peer --from spark-3 --backend" ')
    assert gateway["gateways"] == [{"name": "spark-1", "address": "local"}], "its own units drain without SSH"
    backend = peer_access("spark-3", found)
    assert backend["gateways"] == [{"name": "spark-1", "address": "192.168.1.1"}], "the gateway's address on the network it reaches spark-3 on"
    assert "192.168.1.1 ssh-ed25519" in backend["known_hosts"] and "10.0.0.1 ssh-ed25519" in backend["known_hosts"]
    assert peer_access("spark-2", found)["gateways"] == [{"name": "spark-1", "address": "192.168.1.1"}], "a name: the gateway's first address"
    del found["spark-3"]
    found["spark-1"]["ranks"] = []
    assert peer_access("spark-1", found)["errors"] == [
        "the gateway on spark-1 routes to spark-3, which is not in the play: keep the gateway and its backends in the play (as site.yml runs them), "
        "so each backend's watchdog may drain its own units there"]


def test_a_backends_request_names_its_own_unit_and_a_cluster_step_needs_a_cluster_peer():
    assert peer_request("drain spark-2/llm", [], "spark-2", ["backend"]) == ("drain", "spark-2/llm")
    for text, may in (("drain spark-1/llm", ["backend"]), ("undrain spark-2", ["backend"]), ("drain spark-2/llm", ["cluster"]),
                      ("stop sparkfleet-cluster-tp.service", ["backend"]), ("drain spark-2/../x", ["backend"])):
        with pytest.raises(WatchdogError, match="^refused"):
            peer_request(text, [rank_plan(1)], "spark-2", may)


def test_the_host_addresses_come_from_the_network_facts_without_loopback():
    facts = {"default_ipv4": {"address": "192.168.1.5", "prefix": "24"}, "interfaces": ["lo", "enP7s7", "br-x"],
             "lo": {"ipv4": {"address": "127.0.0.1", "prefix": "8"}}, "enP7s7": {"ipv4": {"address": "192.168.1.5", "prefix": "24"}},
             "br_x": {"ipv4": {"address": "10.0.0.5", "prefix": "24"}, "ipv4_secondaries": [{"address": "10.0.1.5", "prefix": "16"}]}}
    assert host_addresses(facts) == [{"address": "192.168.1.5", "prefix": 24}, {"address": "10.0.0.5", "prefix": 24},
                                     {"address": "10.0.1.5", "prefix": 16}]
    assert host_addresses(None) == []


def test_a_deployed_gateway_plan_names_where_it_reaches_each_backend():
    plan = {"deployments": [{"node": "spark-1", "api_base": "http://127.0.0.1:8001/v1"}, {"node": "spark-2", "api_base": "http://[fd00::2]:8001/v1"},
                            {"node": "spark-2", "api_base": "http://[fd00::2]:8002/v1"}]}
    assert routed_backends(plan) == {"spark-1": ["127.0.0.1"], "spark-2": ["fd00::2"]}
    assert routed_backends(None) == {} and routed_backends({"deployments": "x"}) == {}


def test_a_host_has_peers_through_a_cluster_or_a_gateway_in_either_direction():
    deployed = {"gw": {"ranks": [], "gateway": {"gw": ["127.0.0.1"], "b": ["10.0.0.2"]}}, "b": {"ranks": [], "gateway": None},
                "solo": {"ranks": [], "gateway": None}, "own": {"ranks": [], "gateway": {"own": ["127.0.0.1"]}},
                "rank": {"ranks": [{"unit": "u"}], "gateway": None}}
    assert [host for host in deployed if has_peers(host, deployed)] == ["gw", "b", "rank"]


def test_the_caches_warm_stamp_decides_the_grace_not_the_watchdogs_memory(tmp_path):
    """Caches wiped under a config hash that served before compile again: the stamp is gone, so the grace is the cold one."""
    stamp = tmp_path / "jit" / "a" / "warm" / "b"
    plan = {**PLAN, "cold_start": {"timeout": 2700, "stamp": str(stamp)}}
    memory = {**new_memory(), "warm_hashes": [PLAN["config_hash"]]}
    down = seen(container="exited", active_state="inactive", sub_state="dead")
    compiling = [assess(plan, memory, down, SETTINGS_DEFAULT, 1000.0 + 30 * index) for index in range(3)][-1]
    assert "cold grace of 2700 s" in compiling["why"], compiling["why"]
    stamp.parent.mkdir(parents=True)
    stamp.write_text("1\n")
    memory = new_memory()
    warm = [assess(plan, memory, down, SETTINGS_DEFAULT, 1000.0 + 30 * index) for index in range(3)][-1]
    assert f"warm grace of {SETTINGS_DEFAULT['warm_grace']} s" in warm["why"], warm["why"]


# vLLM 0.34.0's answers, read in its wheel (entrypoints/serve/checkpoint/api_router.py, rl/online/api_router.py): GET
# /checkpoint/status is {state, error?}, 200 once prepared, 500 failed, 503 otherwise; GET /is_paused is {is_paused}.
@pytest.mark.parametrize(("route", "status", "body", "hold"), [
    ("/checkpoint/status", 200, {"state": "prepared"}, "checkpoint prepared"),
    ("/checkpoint/status", 503, {"state": "preparing"}, "checkpoint preparing"),
    ("/checkpoint/status", 503, {"state": "restoring"}, "checkpoint restoring"),
    ("/checkpoint/status", 503, {"state": "running"}, None),
    ("/checkpoint/status", 500, {"state": "failed", "error": "cuda"}, None),
    ("/checkpoint/status", 404, {"detail": "Not Found"}, None),
    ("/checkpoint/status", 401, {"error": {"message": "Unauthorized"}}, None),
    ("/is_paused", 200, {"is_paused": True}, "paused"),
    ("/is_paused", 200, {"is_paused": False}, None),
    ("/is_paused", 200, {"is_paused": "true"}, None),
    ("/is_paused", 500, {"error": "x"}, None),
    ("/checkpoint/status", 200, ["prepared"], None),
], ids=["prepared", "preparing", "restoring", "running", "failed", "no-route", "key-refused", "paused", "not-paused",
        "paused-as-text", "pause-unknown", "other-shape"])
def test_an_engine_held_on_purpose_is_told_from_its_answers(route, status, body, hold):
    assert engine_hold(route, status, json.dumps(body)) == hold
    assert engine_hold(route, None, "") is None and engine_hold(route, 200, "<html>") is None


def test_a_held_engine_is_not_restarted_as_wedged_and_judged_again_once_released():
    memory = new_memory()
    held = seen(metrics=metrics(7.0, running=0.0), probe=TIMEOUT, hold="checkpoint prepared")
    decisions = samples(memory, [held] * 5)
    assert {d["verdict"] for d in decisions} == {"held"} and {d["action"] for d in decisions} == {"none"}
    assert "checkpoint prepared" in decisions[0]["why"] and memory["failures"] == 0
    released = samples(memory, [seen(metrics=metrics(7.0, running=0.0), probe=TIMEOUT)] * 3, start=2000.0)
    assert [d["verdict"] for d in released] == ["wedged"] * 3 and released[-1]["action"] == "restart"
    assert "held_since" not in memory, "the hold ended with the first sample that did not see it"


def test_an_engine_held_longer_than_the_maintenance_limit_is_judged_again():
    """An engine stuck restoring, or a checkpoint nobody restores, would otherwise never serve again."""
    memory = new_memory()
    held = seen(metrics=metrics(7.0, running=0.0), probe=TIMEOUT, hold="checkpoint restoring")
    assert assess(PLAN, memory, held, SETTINGS_DEFAULT, 1000.0)["verdict"] == "held"
    assert assess(PLAN, memory, held, SETTINGS_DEFAULT, 1000.0 + 7200)["verdict"] == "held"
    late = assess(PLAN, memory, held, SETTINGS_DEFAULT, 1000.0 + 7230)
    assert late["verdict"] == "wedged" and "(held as checkpoint restoring for 7230 s, longer than 7200 s); failing sample 1" in late["why"]


def test_the_daemon_asks_a_silent_engine_whether_it_is_held(tmp_path):
    """The daemon's own reader against a real HTTP server answering as vLLM 0.34 does: the checkpoint route first, with
    the unit's key, then dev mode's pause route; a server without either route (the lab's 0.32) holds nothing."""
    import http.server

    from threaded_server import serving

    daemon = load_daemon()
    answers = {}
    asked = []

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append((self.path, self.headers.get("Authorization")))
            status, body = answers.get(self.path, (404, {"detail": "Not Found"}))
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    (tmp_path / "llm.env").write_text("VLLM_API_KEY=" + "k" * 32 + "\n")
    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)) as server:
        plan = {**PLAN, "url": f"http://127.0.0.1:{server.server_address[1]}", "env_path": str(tmp_path / "llm.env")}
        assert daemon.read_hold(plan, 5) is None
        assert [path for path, _key in asked] == ["/checkpoint/status", "/is_paused"]
        answers["/checkpoint/status"] = (503, {"state": "preparing"})
        assert daemon.read_hold(plan, 5) == "checkpoint preparing"
        answers["/checkpoint/status"] = (503, {"state": "running"})
        answers["/is_paused"] = (200, {"is_paused": True})
        assert daemon.read_hold(plan, 5) == "paused"
    assert {key for _path, key in asked} == {"Bearer " + "k" * 32}


def load_daemon():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sparkfleet_watchdog", ROOT / "roles" / "watchdog" / "files" / "sparkfleet_watchdog.py")
    daemon = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(daemon)
    return daemon


@pytest.mark.parametrize("verdict, stacks_read", [("wedged", True), ("unanswered", True), ("down", False)])
def test_a_wedged_engines_stacks_are_read_before_it_is_killed(monkeypatch, tmp_path, verdict, stacks_read):
    """The daemon's act on a restart: the stacks first (the same reading as a bundle's), then the kill and the restart; a
    stack that cannot be read never holds the restart back."""
    daemon = load_daemon()
    steps = []

    def run(argv, timeout):
        steps.append(argv[0] + " " + argv[1])
        return 0, "", ""

    def stacks(container, unit, folders, now, folder):
        steps.append(f"stacks {container} into {folder}")
        raise OSError("disk full")

    monkeypatch.setattr(daemon, "run_command", run)
    monkeypatch.setattr(daemon, "save_engine_stacks", stacks)
    monkeypatch.setattr(daemon, "drain", lambda plan, settings: [])
    decision = {"action": "restart", "verdict": verdict, **({"kill_first": True} if verdict != "down" else {})}
    daemon.act(decision, PLAN, {"plan_dirs": [str(tmp_path)], "state_dir": str(tmp_path / "state")}, str(tmp_path / "state"), {}, 1_796_380_000)
    killed = [f"stacks {PLAN['container']} into {tmp_path / 'state' / 'stacks'}", "docker kill"] if stacks_read else []
    assert steps == [*killed, "systemctl restart"]
    assert decision.get("stacks") == ("no stacks: disk full" if stacks_read else None)


def test_the_bundles_read_the_stacks_where_the_watchdog_keeps_them():
    assert STACKS_DIR == f"{STATE_DIR}/{load_daemon().STACKS_FOLDER}"
