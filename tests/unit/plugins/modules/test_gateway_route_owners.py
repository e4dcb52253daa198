"""The gateway's routing written by two hands at once (issue 37): the gateway_route module, run as
Ansible runs it, and the watchdog daemon's drain (its route_here, as its peer command runs it), each
recording its owner, under one lock, and the daemon's route budget."""

import importlib
import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest
from runtime_layout import install_runtime

from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import backend_reports, gateway_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway_routes import ROUTE_LOCK, drained_file
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import DAEMON, DAEMON_SOURCE

ROOT = pathlib.Path(__file__).resolve().parents[4]
MODULE = ROOT / "plugins" / "modules" / "gateway_route.py"
COLLECTIONS = ROOT / ".cache" / "collections"
KEY = "k" * 40


def endpoint(name, port):
    return {"name": name, "port": port, "bind_addresses": ["0.0.0.0"], "served_names": ["qwen"], "api_key": KEY, "head": True}


@pytest.fixture
def gateway(tmp_path):
    hostvars = {host: {"ansible_host": f"192.0.2.{index}", "vllm_endpoints": [endpoint("chat", 8000)]}
                for index, host in enumerate(("spark-1", "spark-2", "spark-3"), start=1)}
    settings = {"image": "ghcr.io/berriai/litellm:v1.110.2@sha256:" + "ab" * 32, "master_key": "sk-" + "m" * 40,
                "backends": ["spark-1", "spark-2", "spark-3"], "model_groups": {"fast": ["qwen"]}}
    plan = {k: v for k, v in gateway_plan(settings, backend_reports(settings["backends"], hostvars), "spark-1").items()
            if k not in ("env_file", "errors")}
    assert run(tmp_path, plan=plan)["ok"]
    return tmp_path


def run(config_dir, wait=True, **args):
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": {"config_dir": str(config_dir), **args}})
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS)}
    process = subprocess.Popen([sys.executable, str(MODULE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if not wait:
        process.stdin.write(payload)
        process.stdin.close()
        return process
    out, _err = process.communicate(payload, timeout=120)
    return json.loads(out)


def record(config_dir):
    return json.loads((config_dir / "drained.json").read_text())["owners"]


@pytest.fixture
def daemon(tmp_path_factory, gateway):
    """The watchdog daemon as the role installs it, on the gateway's host, systemctl stood in for."""
    host = tmp_path_factory.mktemp("host")
    folder = install_runtime(host, [{"path": DAEMON, "source": DAEMON_SOURCE}])
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module("sparkfleet_watchdog")
        calls = []
        module.run_command = lambda argv, timeout: calls.append(argv) or (0, "", "")
        settings = {"gateway_config_dir": str(gateway), "state_dir": str(host / "state"), "route_budget": 3, "route_budget_window": 3600}
        yield module, settings, calls
    finally:
        # The daemon puts its folder first on the path as well.
        sys.path[:] = [entry for entry in sys.path if entry != str(folder)]
        sys.modules.pop("sparkfleet_watchdog", None)


def test_a_hooks_undrain_leaves_the_operators_drain_and_says_so(gateway):
    assert run(gateway, drain=["spark-2"])["changed"]
    drained = run(gateway, drain=["spark-2", "spark-3"], owner="bench@r1")
    assert record(gateway) == {"spark-2": ["bench@r1", "operator"], "spark-3": ["bench@r1"]}
    assert drained["config_changed"]
    undrained = run(gateway, undrain=["spark-2", "spark-3"], owner="bench@r1")
    assert undrained["ok"] and undrained["drained"] == ["spark-2"] and undrained["held"] == {"spark-2": ["operator"]}
    assert record(gateway) == {"spark-2": ["operator"]}
    assert "spark-2 stays out of rotation: drained by operator, whose drain bench@r1 does not undo" in json.dumps(undrained["warnings"])
    assert run(gateway, undrain=["spark-2"])["drained"] == [], "the operator's undrain puts it back"


@pytest.mark.parametrize(("left", "by"), [
    (["spark-2"], "sweep@20261205T2200Z-0a1b"), (["spark-2/chat", "spark-3"], "rollout@r9"), (["spark-3"], "bench@r1"),
])
def test_drains_a_stopped_run_left_behind_are_named_by_every_later_run_with_the_undrain_to_give(gateway, left, by):
    """Found in a review: a bench, sweep or rollout stopped before its undrain hook left its drains for good (only its own
    run may release them), and nothing said so."""
    run(gateway, drain=left, owner=by)
    later = run(gateway)
    assert later["left_by_runs"] == {name: [by] for name in left} and not later["changed"]
    for name in left:
        assert f"{name} is out of rotation only for {by}, a run that never undrained it" in json.dumps(later["warnings"])
    assert run(gateway, drain=left, owner=by)["left_by_runs"] == {}, "a run's own drains are no leftovers to itself"
    run(gateway, drain=[left[0]])
    assert left[0] not in run(gateway)["left_by_runs"], "held by the operator too: no leftover of a run"
    assert run(gateway, undrain=left)["drained"] == [], "the operator's undrain puts them back"


@pytest.mark.parametrize("owner", ["watchdog@spark-2", "bench", "root"])
def test_a_module_call_as_the_watchdog_or_as_no_known_owner_is_refused_and_changes_nothing(gateway, owner):
    before = (gateway / "drained.json").read_text()
    result = run(gateway, drain=["spark-2"], owner=owner)
    assert result["failed"] and result["reasons"][0].startswith(f"gateway drain: owner {owner!r} is neither")
    assert (gateway / "drained.json").read_text() == before


def test_an_older_releases_drain_is_the_operators_and_a_watchdog_keeps_it(gateway, daemon):
    module, settings, _calls = daemon
    (gateway / "drained.json").write_text('{"schema_version": 1, "drained": ["spark-2/chat"]}\n')
    assert module.route_here(settings, "undrain", "spark-2/chat")["result"] == "kept"
    assert json.loads((gateway / "drained.json").read_text())["drained"] == ["spark-2/chat"]


def waiters(path):
    """The processes blocked on the flock of ``path`` (/proc/locks' '->' lines name the file's inode)."""
    inode = os.stat(path).st_ino
    return [line for line in pathlib.Path("/proc/locks").read_text().splitlines() if "->" in line and line.split()[6].endswith(f":{inode}")]


def test_the_module_waits_for_the_watchdogs_drain_and_neither_loses_the_others_update(gateway, daemon):
    module, settings, _calls = daemon
    (gateway / "drained.json").write_text(drained_file({"spark-2/chat": ["watchdog@spark-2"]}))
    started, seen = threading.Event(), {}

    def restart_once_the_module_waits(argv, timeout):
        # Inside the watchdog's read-modify-write, after its write: the module, started now, must wait on the same lock.
        started.set()
        for _poll in range(6000):
            if waiters(gateway / ROUTE_LOCK):
                seen["waiting"] = True
                break
            threading.Event().wait(0.01)
        return 0, "", ""

    module.run_command = restart_once_the_module_waits
    watchdog = threading.Thread(target=lambda: seen.update(reply=module.route_here(settings, "undrain", "spark-2/chat")))
    watchdog.start()
    assert started.wait(60)
    operator = run(gateway, wait=False, drain=["spark-3"])
    watchdog.join(120)
    out, err = operator.stdout.read(), operator.stderr.read()
    operator.wait(120)
    assert seen.get("waiting"), "the module did not wait on the watchdog's lock"
    assert seen["reply"]["result"] == "undrained" and json.loads(out)["ok"], err
    assert record(gateway) == {"spark-3": ["operator"]}, "the watchdog's undrain and the operator's drain both landed"
    assert "192.0.2.3" not in (gateway / "litellm" / "config.yaml").read_text(), "spark-3 is out of the routing"
    assert oct((gateway / ROUTE_LOCK).stat().st_mode & 0o777) == "0o600"


def test_a_watchdogs_changes_past_its_budget_are_refused_and_its_undrain_deferred(gateway, daemon):
    module, settings, calls = daemon
    replies = [module.route_here(settings, verb, "spark-2/chat") for verb in ("drain", "undrain", "drain", "undrain")]
    assert [reply["result"] for reply in replies] == ["drained", "undrained", "drained", "deferred"]
    assert "budget (watchdog_route_budget 3)" in replies[3]["why"] and len(calls) == 3, "three LiteLLM restarts, no fourth"
    assert record(gateway) == {"spark-2/chat": ["watchdog@spark-2"]}, "deferred: still drained, undrained on a later sample"
    assert module.route_here(settings, "drain", "spark-3/chat")["result"] == "drained", "the budget is per backend"
    spent = json.loads((pathlib.Path(settings["state_dir"]) / "route-budget.json").read_text())
    assert sorted(spent) == ["spark-2", "spark-3"] and len(spent["spark-2"]) == 3 and len(spent["spark-3"]) == 1
    assert module.route_here(settings, "drain", "spark-2/chat")["result"] == "already_drained", "no change, no budget spent"


@pytest.mark.parametrize("settings_change", [{"route_budget": None}, {"route_budget_window": "3600"}, {"route_budget": True}])
def test_a_configuration_without_a_route_budget_is_refused_naming_the_fix(gateway, daemon, settings_change):
    module, settings, calls = daemon
    reply = module.route_here({**settings, **settings_change}, "drain", "spark-2/chat")
    assert reply == {"result": "error", "why": "the watchdog's configuration has no route budget (an older release wrote it): re-apply the watchdog role"}
    assert calls == []
