"""The gateway_route module run as Ansible runs it (its arguments on stdin) on real files in a
temporary folder: the plan written, a drain and an undrain, a refused drain and check mode
changing nothing."""

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import backend_reports, gateway_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway_routes import ROUTE_LOCK

ROOT = pathlib.Path(__file__).resolve().parents[4]
COLLECTIONS = ROOT / ".cache" / "collections"
MODULE = COLLECTIONS / "ansible_collections" / "sparkfleet" / "vllm" / "plugins" / "modules" / "gateway_route.py"
KEY = "k" * 40


def endpoint(name, port):
    return {"name": name, "port": port, "bind_addresses": ["0.0.0.0"], "served_names": ["qwen"], "api_key": KEY, "head": True}


def planned(backends=("spark-1", "gx10-1"), gateway="gateway-1"):
    hostvars = {"spark-1": {"ansible_host": "192.0.2.10", "vllm_endpoints": [endpoint("chat", 8000)]},
                "gx10-1": {"ansible_host": "192.0.2.20", "vllm_endpoints": [endpoint("chat", 8000)]}}
    settings = {"image": "ghcr.io/berriai/litellm:v1.110.2@sha256:" + "ab" * 32, "master_key": "sk-" + "m" * 40,
                "backends": list(backends), "model_groups": {"fast": ["qwen"]}}
    value = gateway_plan(settings, backend_reports(settings["backends"], hostvars), gateway)
    return {k: v for k, v in value.items() if k not in ("env_file", "errors")}


@pytest.fixture
def plan():
    return planned()


def run(config_dir, check_mode=False, **args):
    payload = {"ANSIBLE_MODULE_ARGS": {"config_dir": str(config_dir), "_ansible_check_mode": check_mode, "_ansible_diff": True, **args}}
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS)}
    done = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(payload), capture_output=True, text=True, env=env, check=False)
    return json.loads(done.stdout)


def files(config_dir):
    """The routing files; the lock file (empty, 0600) holds nothing to compare."""
    return {path.relative_to(config_dir).as_posix(): (path.read_text(), stat.S_IMODE(path.stat().st_mode))
            for path in sorted(config_dir.rglob("*")) if path.is_file() and path.name != ROUTE_LOCK}


def test_the_plan_is_written_once_and_a_rerun_changes_nothing(tmp_path, plan):
    first = run(tmp_path, plan=plan)
    assert first["changed"] and first["config_changed"] and first["ok"]
    assert first["in_rotation"] == {"fast": ["spark-1/chat/qwen/fast", "gx10-1/chat/qwen/fast"]}
    written = files(tmp_path)
    assert set(written) == {"plan.json", "drained.json", "litellm/config.yaml"}
    assert {mode for _text, mode in written.values()} == {0o600}
    assert all(KEY not in text for text, _mode in written.values())
    again = run(tmp_path, plan=plan)
    assert not again["changed"] and not again["config_changed"]


def test_a_drain_reads_the_plan_on_the_host_and_an_undrain_restores_the_routes(tmp_path, plan):
    run(tmp_path, plan=plan)
    before = files(tmp_path)
    drained = run(tmp_path, drain=["gx10-1"])
    assert drained["changed"] and drained["config_changed"] and drained["drained"] == ["gx10-1"]
    assert drained["in_rotation"] == {"fast": ["spark-1/chat/qwen/fast"]}
    assert "192.0.2.20" not in files(tmp_path)["litellm/config.yaml"][0]
    assert [d["before_header"].rsplit("/", 1)[-1] for d in drained["diff"]] == ["drained.json", "config.yaml"]
    undrained = run(tmp_path, undrain=["gx10-1"])
    assert undrained["config_changed"] and files(tmp_path) == before


def test_a_refused_drain_and_a_check_run_write_nothing(tmp_path, plan):
    run(tmp_path, plan=plan)
    run(tmp_path, drain=["gx10-1"])
    before = files(tmp_path)
    refused = run(tmp_path, drain=["spark-1"])
    assert refused["failed"] and refused["reasons"] and "leaves model group(s) fast with nothing to route to" in refused["msg"]
    checked = run(tmp_path, check_mode=True, undrain=["gx10-1"])
    assert checked["changed"] and checked["config_changed"] and checked["drained"] == []
    assert files(tmp_path) == before
    forced = run(tmp_path, drain=["spark-1"], force=True)
    assert forced["in_rotation"] == {"fast": []}


def test_a_hooks_run_drains_only_the_units_this_gateway_routes_and_names_its_own_fix(tmp_path, plan):
    """A bench, sweep or rollout run names the unit it measures at every gateway routing to its host: one this gateway
    does not route is left alone and named (not_routed); the operator's unknown name is refused. A hook's refusal leaves
    the fix to the hook's own variables: no gateway_drain_force advice."""
    run(tmp_path, plan=plan)
    hook = "bench@20261206T120000Z-1a2b"
    drained = run(tmp_path, drain=["gx10-1/chat", "gx10-1/embed"], owner=hook)
    assert drained["drained"] == ["gx10-1/chat"] and drained["not_routed"] == ["gx10-1/embed"]
    assert run(tmp_path, undrain=["gx10-1/chat", "gx10-1/embed"], owner=hook)["drained"] == []
    operator = run(tmp_path, drain=["gx10-1/embed"])
    assert operator["failed"] and "'gx10-1/embed' is not a backend of this gateway" in operator["msg"]
    run(tmp_path, drain=["gx10-1"])
    refused = run(tmp_path, drain=["spark-1/chat"], owner=hook)
    assert refused["failed"] and refused["msg"].endswith("so every client request for them would fail.")
    assert "gateway_drain_force" in run(tmp_path, drain=["spark-1/chat"])["msg"], "the operator is told how to force it"


def test_a_drain_without_a_gateway_on_the_host_says_so(tmp_path):
    result = run(tmp_path / "none", drain=["spark-1"])
    assert result["failed"] and "this host runs no gateway yet" in result["msg"]


def test_the_files_carry_their_schema_version(tmp_path, plan):
    run(tmp_path, plan=plan)
    run(tmp_path, drain=["gx10-1"])
    written = files(tmp_path)
    assert json.loads(written["plan.json"][0])["schema_version"] == 1
    assert json.loads(written["drained.json"][0]) == {"schema_version": 2, "drained": ["gx10-1"], "owners": {"gx10-1": ["operator"]}}


def test_an_older_releases_drained_list_keeps_its_nodes_drained_and_gains_the_schema(tmp_path, plan):
    run(tmp_path, plan=plan)
    (tmp_path / "drained.json").write_text('["gx10-1"]\n')
    upgraded = run(tmp_path, plan=plan)
    assert upgraded["ok"] and upgraded["in_rotation"] == {"fast": ["spark-1/chat/qwen/fast"]}
    assert json.loads((tmp_path / "drained.json").read_text()) == {"schema_version": 2, "drained": ["gx10-1"], "owners": {"gx10-1": ["operator"]}}


@pytest.mark.parametrize(("name", "damage", "expected"), [
    ("plan.json", lambda text: text[: len(text) // 2], "plan.json: not a gateway plan ("),
    ("plan.json", lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k not in ("schema_version", "settings")}),
     "plan.json: schema_version missing, while this collection reads 1: another (older) sparkfleet.vllm wrote it; re-run site.yml "
     "--tags gateway, which rewrites it from the inventory"),
    ("plan.json", lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "settings"}),
     "plan.json: lacks settings: the file is incomplete or was edited; re-run site.yml --tags gateway"),
    ("drained.json", lambda text: text[:20], "drained.json: not a drained list ("),
])
def test_a_damaged_or_older_file_is_refused_naming_it_the_cause_and_the_fix(tmp_path, plan, name, damage, expected):
    run(tmp_path, plan=plan)
    run(tmp_path, drain=["gx10-1"])
    path = tmp_path / name
    path.write_text(damage(path.read_text()))
    before = files(tmp_path)
    for args in ({"undrain": ["gx10-1"]}, {"drain": ["spark-1"], "check_mode": True}):
        result = run(tmp_path, **args)
        assert result["failed"] and not result["ok"] and result["msg"].startswith(f"{path.parent}/{expected}"), result["msg"]
        assert result["reasons"] == [result["msg"]] and "Traceback" not in result["msg"] and "exception" not in result
    assert files(tmp_path) == before


def test_a_plan_file_is_rewritten_from_the_inventory_and_keeps_the_drained_list(tmp_path, plan):
    run(tmp_path, plan=plan)
    run(tmp_path, drain=["gx10-1"])
    (tmp_path / "plan.json").write_text('{"deployments": [')
    rewritten = run(tmp_path, plan=plan)
    assert rewritten["ok"] and rewritten["drained"] == ["gx10-1"] and not rewritten["config_changed"]


def test_a_contradictory_request_is_refused_in_check_mode_too_and_writes_nothing(tmp_path, plan):
    run(tmp_path, plan=plan)
    before = files(tmp_path)
    for check_mode in (True, False):
        result = run(tmp_path, check_mode=check_mode, drain=["gx10-1"], undrain=["gx10-1/chat"])
        assert result["failed"] and result["ok"] is False
        assert result["reasons"] == ["gateway drain: gx10-1 (drain) and gx10-1/chat (undrain) asked at once: a host and one of its "
                                     "instances leave each other in place (a drained host keeps all its instances out, a drained "
                                     "instance stays out when its host goes back), so one request would do nothing. Name either "
                                     "the host or its instances"]
    assert files(tmp_path) == before


def test_an_instance_drained_by_name_stays_out_when_its_host_goes_back_and_says_so(tmp_path, plan):
    run(tmp_path, plan=plan)
    run(tmp_path, drain=["gx10-1/chat"])
    run(tmp_path, drain=["gx10-1"])
    result = run(tmp_path, undrain=["gx10-1"])
    assert result["drained"] == ["gx10-1/chat"]
    warnings = [w["event"]["msg"] if isinstance(w, dict) else w for w in result["warnings"]]
    assert warnings == ["gx10-1/chat: drained by name, so still out of rotation; undrain by name to put back"]


def test_a_file_readable_by_others_is_rewritten_0600_and_no_temporary_file_is_left(tmp_path, plan):
    run(tmp_path, plan=plan)
    (tmp_path / "drained.json").write_text('["gx10-1"]\n')
    (tmp_path / "drained.json").chmod(0o644)
    run(tmp_path, plan=plan)
    written = files(tmp_path)
    assert set(written) == {"plan.json", "drained.json", "litellm/config.yaml"}
    assert {mode for _text, mode in written.values()} == {0o600}


def test_a_folder_that_cannot_be_written_is_named_and_nothing_is_written(tmp_path, plan):
    (tmp_path / "litellm").write_text("a file where the folder should be")
    result = run(tmp_path, plan=plan)
    assert result["failed"] and result["ok"] is False and result["config_changed"] is False
    assert result["msg"] == (f"{tmp_path}: the gateway's files cannot be written ([Errno 17] File exists: '{tmp_path}/litellm'); give a "
                             "config_dir the task's user can write (become: true), then re-run")
    assert result["reasons"] == [result["msg"]] and "exception" not in result
    assert set(files(tmp_path)) == {"litellm"}


def test_a_drain_one_gateway_refuses_changes_no_gateway(tmp_path):
    """The gateway role's drain task file on two gateways (local connections, each folder written by
    this module) routing to one backend: the first could let it go, the second would be left with
    nothing to route to. Every gateway judges first, so neither changes, and the refusal names the one.
    A gateway is any host with gateway_backends: the second is outside the gateway group."""
    backends = {"gw-both": ["spark-1", "gx10-1"], "gw-one": ["spark-1"]}
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    gateways = {}
    for gateway, names in backends.items():
        assert run(tmp_path / gateway, plan=planned(names, gateway))["changed"]
        gateways[gateway] = {**local, "gateway_backends": names, "gateway_config_dir": str(tmp_path / gateway)}
    inventory = {"all": {"children": {"gateway": {"hosts": {"gw-both": gateways["gw-both"]}}, "edge": {"hosts": {"gw-one": gateways["gw-one"]}},
                                      "serving": {"hosts": {"spark-1": local, "gx10-1": local}}}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    play = [{"name": "Drain spark-1", "hosts": "spark-1", "gather_facts": False, "tasks": [
        {"name": "Drain at every gateway", "ansible.builtin.include_role": {"name": "sparkfleet.vllm.gateway", "tasks_from": "drain.yml"},
         "vars": {"gateway_drain": ["spark-1"], "gateway_undrain": []}}]}]
    (tmp_path / "drain.yml").write_text(json.dumps(play))
    before = {gateway: files(tmp_path / gateway) for gateway in backends}
    result = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "inventory.json"), str(tmp_path / "drain.yml")],
                            cwd=ROOT, capture_output=True, text=True, check=False,
                            env={**os.environ, "NO_COLOR": "1", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS)})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "Drain or undrain refused, no gateway was changed: gw-one:" in output, output[-3000:]
    assert "gw-both:" not in output.split("no gateway was changed:", 1)[1].split("\n", 1)[0], "only gw-one refused"
    assert {gateway: files(tmp_path / gateway) for gateway in backends} == before
