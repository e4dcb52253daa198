"""The gateway role's drain task file on the controller: two gateways (local connections, each with
its own folder written by the real gateway_route module) route to one backend; the first could let
it go, the second would be left with nothing to route to. Every gateway judges first, so neither
changes, and the refusal names the gateway that refused."""

import json
import os
import pathlib
import subprocess
import sys

from tool_runner import COLLECTIONS_ROOT, ROOT

from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import backend_reports, gateway_plan

MODULE = ROOT / "plugins" / "modules" / "gateway_route.py"
KEY = "k" * 40
BACKENDS = {"gw-both": ["spark-1", "gx10-1"], "gw-one": ["spark-1"]}


def endpoint(name, port):
    return {"name": name, "port": port, "bind_addresses": ["0.0.0.0"], "served_names": ["qwen"], "api_key": KEY, "head": True}


def write_plan(config_dir, gateway, backends):
    hostvars = {"spark-1": {"ansible_host": "192.0.2.10", "vllm_endpoints": [endpoint("chat", 8000)]},
                "gx10-1": {"ansible_host": "192.0.2.20", "vllm_endpoints": [endpoint("chat", 8000)]}}
    settings = {"image": "ghcr.io/berriai/litellm:v1.110.2@sha256:" + "ab" * 32, "master_key": "sk-" + "m" * 40,
                "backends": backends, "model_groups": {"fast": ["qwen"]}}
    value = gateway_plan(settings, backend_reports(backends, hostvars), gateway)
    plan = {k: v for k, v in value.items() if k not in ("env_file", "errors")}
    payload = {"ANSIBLE_MODULE_ARGS": {"config_dir": str(config_dir), "plan": plan}}
    done = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(payload), capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(COLLECTIONS_ROOT)}, check=False)
    assert json.loads(done.stdout)["changed"], done.stdout + done.stderr


def folder_state(config_dir):
    return {path.name: path.read_text() for path in sorted(pathlib.Path(config_dir).rglob("*")) if path.is_file()}


def test_a_drain_one_gateway_refuses_changes_no_gateway(tmp_path):
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    gateways = {}
    for gateway, backends in BACKENDS.items():
        config_dir = tmp_path / gateway
        write_plan(config_dir, gateway, backends)
        gateways[gateway] = {**local, "gateway_backends": backends, "gateway_config_dir": str(config_dir)}
    inventory = {"all": {"children": {"gateway": {"hosts": gateways},
                                      "serving": {"hosts": {"spark-1": local, "gx10-1": local}}}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    play = [{"name": "Drain spark-1", "hosts": "spark-1", "gather_facts": False, "tasks": [
        {"name": "Drain at every gateway", "ansible.builtin.include_role": {"name": "sparkfleet.vllm.gateway", "tasks_from": "drain.yml"},
         "vars": {"gateway_drain": ["spark-1"], "gateway_undrain": []}}]}]
    (tmp_path / "drain.yml").write_text(json.dumps(play))
    before = {gateway: folder_state(tmp_path / gateway) for gateway in BACKENDS}
    result = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "inventory.json"), str(tmp_path / "drain.yml")],
                            cwd=ROOT, capture_output=True, text=True, check=False,
                            env={**os.environ, "NO_COLOR": "1", "ANSIBLE_NOCOLOR": "1"})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "Drain or undrain refused, no gateway was changed: gw-one:" in output, output[-3000:]
    assert "gw-both:" not in output.split("no gateway was changed:", 1)[1].split("\n", 1)[0], "only gw-one refused"
    assert {gateway: folder_state(tmp_path / gateway) for gateway in BACKENDS} == before
