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

ROOT = pathlib.Path(__file__).resolve().parents[4]
COLLECTIONS = ROOT / ".cache" / "collections"
MODULE = COLLECTIONS / "ansible_collections" / "sparkfleet" / "vllm" / "plugins" / "modules" / "gateway_route.py"
KEY = "k" * 40


def endpoint(name, port):
    return {"name": name, "port": port, "bind_addresses": ["0.0.0.0"], "served_names": ["qwen"], "api_key": KEY, "head": True}


@pytest.fixture
def plan():
    hostvars = {"spark-1": {"ansible_host": "192.0.2.10", "vllm_endpoints": [endpoint("chat", 8000)]},
                "gx10-1": {"ansible_host": "192.0.2.20", "vllm_endpoints": [endpoint("chat", 8000)]}}
    settings = {"image": "ghcr.io/berriai/litellm:v1.110.2@sha256:" + "ab" * 32, "master_key": "sk-" + "m" * 40,
                "backends": ["spark-1", "gx10-1"], "model_groups": {"fast": ["qwen"]}}
    value = gateway_plan(settings, backend_reports(settings["backends"], hostvars), "gateway-1")
    return {k: v for k, v in value.items() if k not in ("env_file", "errors")}


def run(config_dir, check_mode=False, **args):
    payload = {"ANSIBLE_MODULE_ARGS": {"config_dir": str(config_dir), "_ansible_check_mode": check_mode, "_ansible_diff": True, **args}}
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS)}
    done = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(payload), capture_output=True, text=True, env=env, check=False)
    return json.loads(done.stdout)


def files(config_dir):
    return {path.relative_to(config_dir).as_posix(): (path.read_text(), stat.S_IMODE(path.stat().st_mode))
            for path in sorted(config_dir.rglob("*")) if path.is_file()}


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


def test_a_drain_without_a_gateway_on_the_host_says_so(tmp_path):
    result = run(tmp_path / "none", drain=["spark-1"])
    assert result["failed"] and "this host runs no gateway yet" in result["msg"]
