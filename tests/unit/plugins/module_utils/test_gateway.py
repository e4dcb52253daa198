"""The gateway's plan from the serving hosts' instance plans: deployments, config, keys, drains and refusals."""

import json

import pytest
import yaml

from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import (
    backend_reports,
    config_document,
    drain_problems,
    gateway_plan,
    render_config,
    routers,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import quote_exec_argument
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import build_plan

IMAGE = "ghcr.io/berriai/litellm:v1.110.2@sha256:" + "ab" * 32
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0@sha256:" + "cd" * 32
MASTER = "sk-" + "m" * 40
KEYS = {"spark-1": "a" * 40, "gx10-1": "b" * 40}


def endpoints(host, binds, served=("qwen",), port=8000):
    """A host's endpoints as the vllm role publishes them: from its real instance plan."""
    instance = {"name": "chat", "model": "/models/qwen", "served_model_names": list(served), "port": port,
                "api_key": KEYS[host], "bind_addresses": binds, "gpu_memory_utilization": 0.5}
    plan = build_plan([instance], {}, image=VLLM_IMAGE, host_addresses=None, allow_wildcard_bind=True)
    assert plan["errors"] == []
    return plan["endpoints"]


HOSTVARS = {
    "spark-1": {"ansible_host": "192.0.2.10", "vllm_endpoints": endpoints("spark-1", ["192.0.2.10"])},
    "gx10-1": {"ansible_host": "192.0.2.20", "vllm_endpoints": endpoints("gx10-1", ["0.0.0.0"])},
}


def plan_for(hostvars=None, gateway="gateway-1", **settings):
    value = {"image": IMAGE, "master_key": MASTER, "backends": ["spark-1", "gx10-1"],
             "model_groups": {"fast": ["qwen"], "code": ["qwen"]}, **settings}
    return gateway_plan(value, backend_reports(value["backends"], hostvars or HOSTVARS), gateway)


def test_every_node_is_a_deployment_of_every_group_with_its_own_address():
    plan = plan_for()
    assert plan["errors"] == []
    assert [(d["group"], d["node"], d["api_base"]) for d in plan["deployments"]] == [
        ("code", "spark-1", "http://192.0.2.10:8000/v1"), ("code", "gx10-1", "http://192.0.2.20:8000/v1"),
        ("fast", "spark-1", "http://192.0.2.10:8000/v1"), ("fast", "gx10-1", "http://192.0.2.20:8000/v1")]
    assert {d["id"] for d in plan["deployments"]} >= {"spark-1/chat/qwen/fast", "gx10-1/chat/qwen/code"}
    assert plan["groups"] == {"code": ["qwen"], "fast": ["qwen"]}


def test_keys_live_only_in_the_env_file():
    plan = plan_for()
    config = render_config(plan, [])
    assert plan["env_file"].splitlines()[1:] == [f"LITELLM_MASTER_KEY={MASTER}", f"SPARKFLEET_BACKEND_KEY_1={KEYS['spark-1']}",
                                                 f"SPARKFLEET_BACKEND_KEY_2={KEYS['gx10-1']}"]
    public = json.dumps({k: v for k, v in plan.items() if k != "env_file"}) + config
    assert MASTER not in public and KEYS["spark-1"] not in public and KEYS["gx10-1"] not in public
    document = yaml.safe_load(config)
    assert document == config_document(plan, [])
    assert document["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    keys = {d["litellm_params"]["api_key"] for d in document["model_list"]}
    assert keys == {"os.environ/SPARKFLEET_BACKEND_KEY_1", "os.environ/SPARKFLEET_BACKEND_KEY_2"}


def test_health_checks_and_cooldowns_take_a_silent_node_out_of_rotation():
    document = config_document(plan_for(routing_strategy="simple-shuffle", health_check_interval=15, cooldown_seconds=60), [])
    assert document["general_settings"]["background_health_checks"] is True
    assert document["general_settings"]["enable_health_check_routing"] is True
    assert document["general_settings"]["health_check_interval"] == 15
    assert document["router_settings"] == {"routing_strategy": "simple-shuffle", "num_retries": 2, "allowed_fails": 1, "cooldown_time": 60}


def test_the_container_runs_the_digest_on_the_bound_address():
    plan = plan_for(bind_address="192.0.2.30", port=4001)
    run = plan["docker_run"]
    assert run[run.index("--network") + 1] == "host" and IMAGE in run
    assert run[-6:] == ["--host", "192.0.2.30", "--port", "4001", "--num_workers", "1"]
    assert plan["url"] == "http://192.0.2.30:4001"
    assert "ExecStart=" + " ".join(quote_exec_argument(a) for a in run) in plan["unit_file"]


def test_without_groups_each_served_name_is_a_group():
    hostvars = {**HOSTVARS, "gx10-1": {**HOSTVARS["gx10-1"], "vllm_endpoints": endpoints("gx10-1", ["0.0.0.0"], served=("coder",))}}
    plan = plan_for(hostvars, model_groups={})
    assert plan["groups"] == {"coder": ["coder"], "qwen": ["qwen"]}
    assert [(d["group"], d["node"]) for d in plan["deployments"]] == [("coder", "gx10-1"), ("qwen", "spark-1")]


def test_a_backend_on_the_gateway_host_is_reached_on_loopback_and_a_cluster_head_is_a_backend():
    head = [{"name": "big", "port": 8010, "bind_addresses": ["127.0.0.1"], "served_names": ["big"], "api_key": "c" * 40, "head": True}]
    worker = [{**head[0], "head": False}]
    hostvars = {"spark-1": {"vllm_endpoints": endpoints("spark-1", ["127.0.0.1"]), "cluster_endpoints": head},
                "gx10-1": {"ansible_host": "192.0.2.20", "vllm_endpoints": [], "cluster_endpoints": worker}}
    plan = plan_for(hostvars, gateway="spark-1", model_groups={})
    assert [(d["group"], d["api_base"]) for d in plan["deployments"]] == [("big", "http://127.0.0.1:8010/v1"), ("qwen", "http://127.0.0.1:8000/v1")]


def test_every_bad_setting_is_refused_at_once_naming_the_variable():
    plan = plan_for(image="ghcr.io/berriai/litellm:main-stable", bind_address="0.0.0.0", port=70000, master_key="sk-short",
                    routing_strategy="round-robin", health_check_interval=1, retries=-1, config_dir="etc/gw",
                    model_groups={"bad name": []})
    assert plan["deployments"] == [] and "env_file" not in plan
    text = " | ".join(plan["errors"])
    for fragment in ("gateway_image: 'ghcr.io/berriai/litellm:main-stable' is not pinned by digest",
                     "gateway_bind_address: 0.0.0.0 listens on every interface", "gateway_port: 70000",
                     "gateway_master_key: missing, shorter than 32 characters or not starting with 'sk-'",
                     "gateway_routing_strategy: 'round-robin'", "gateway_health_check_interval: 1 must be a whole number of at least 5",
                     "gateway_retries: -1", "gateway_config_dir: 'etc/gw'", "gateway_model_groups: group name 'bad name'",
                     "gateway_model_groups.bad name: [] must list served model names"):
        assert fragment in text
    assert "short" not in text.replace("shorter", "")
    assert plan_for(master_key="sk-" + "x" * 40 + "\nEXTRA=1")["errors"] == [
        "gateway_master_key: contains whitespace or a non-printable character; it is one line of the env file, where a newline "
        "would add settings. Use printable ASCII without spaces"]
    assert plan_for(bind_address="0.0.0.0", allow_wildcard_bind=True)["errors"] == []


@pytest.mark.parametrize(("hostvars", "backends", "fragment"), [
    (HOSTVARS, ["spark-1", "ghost"], "gateway_backends: ghost is not a host of the inventory"),
    ({**HOSTVARS, "gx10-1": {"ansible_host": "192.0.2.20"}}, ["spark-1", "gx10-1"],
     "gateway_backends: gx10-1 has no instance plan in this run"),
    ({**HOSTVARS, "gx10-1": {**HOSTVARS["gx10-1"], "vllm_endpoints": endpoints("gx10-1", ["127.0.0.1"])}}, ["spark-1", "gx10-1"],
     "instance chat on gx10-1 binds only 127.0.0.1, which the gateway on gateway-1 cannot reach"),
    ({**HOSTVARS, "gx10-1": {**HOSTVARS["gx10-1"], "cluster_name": "big", "cluster_nodes": ["gx10-1", "spark-1"]}},
     ["spark-1", "gx10-1"], "gateway_backends: gx10-1 heads cluster big, which was not planned in this run; run the cluster play too"),
    ({**HOSTVARS, "gx10-1": {**HOSTVARS["gx10-1"], "gateway_backend_address": "10.0.0.1/8?x="}}, ["spark-1", "gx10-1"],
     "gateway_backend_address of gx10-1: '10.0.0.1/8?x=' must be a host name or IP address"),
])
def test_a_backend_the_gateway_cannot_route_to_is_refused(hostvars, backends, fragment):
    plan = plan_for(hostvars, backends=backends)
    assert any(fragment in error for error in plan["errors"]), plan["errors"]
    assert plan["deployments"] == []


def test_a_group_naming_a_model_nobody_serves_is_refused():
    plan = plan_for(model_groups={"fast": ["qwen"], "vision": ["qwen-vl"]})
    assert plan["errors"] == ["gateway_model_groups.vision: no backend serves qwen-vl (served: qwen); name served model names of "
                              "gateway_backends' instances"]
    assert plan["deployments"] == []


def test_draining_a_node_or_one_instance_takes_it_out_of_every_group():
    plan = plan_for()
    assert {d["litellm_params"]["api_base"] for d in config_document(plan, ["gx10-1"])["model_list"]} == {"http://192.0.2.10:8000/v1"}
    assert {d["litellm_params"]["api_base"] for d in config_document(plan, ["spark-1/chat"])["model_list"]} == {"http://192.0.2.20:8000/v1"}
    assert render_config(plan, ["gx10-1"]).startswith("# Managed by Ansible (sparkfleet.vllm.gateway): LiteLLM's config; drained: gx10-1\n")


def test_a_drain_that_empties_a_group_is_refused_unless_forced():
    plan = plan_for()
    assert drain_problems(plan, [], ["gx10-1"], [], False) == []
    assert drain_problems(plan, ["gx10-1"], ["spark-1"], [], False) == [
        "gateway drain: draining spark-1 leaves model group(s) code, fast with nothing to route to, so every client request for "
        "them would fail. Undrain another node first, or force the drain (gateway_drain_force: true) for a planned outage"]
    assert drain_problems(plan, ["gx10-1"], ["spark-1"], [], True) == []
    assert drain_problems(plan, ["gx10-1", "spark-1"], [], ["spark-1"], False) == [], "undraining is never refused"
    assert drain_problems(plan, [], ["spark-9", "spark-1/other"], [], False) == [
        "gateway drain: 'spark-9' is not a backend of this gateway (known: gx10-1, gx10-1/chat, spark-1, spark-1/chat); name an "
        "inventory host, or host/instance",
        "gateway drain: 'spark-1/other' is not a backend of this gateway (known: gx10-1, gx10-1/chat, spark-1, spark-1/chat); name "
        "an inventory host, or host/instance"]
    assert drain_problems(plan, [], ["spark-1"], ["spark-1"], False) == ["gateway drain: spark-1 asked to be drained and undrained at once"]


def test_a_drain_reaches_the_gateways_routing_to_the_node():
    backends = {"gw-a": ["spark-1", "gx10-1"], "gw-b": ["spark-2"], "gw-c": []}
    assert routers(["gw-a", "gw-b", "gw-c"], backends, ["gx10-1/chat"]) == ["gw-a"]
    assert routers(["gw-a", "gw-b", "gw-c"], backends, ["spark-2", "spark-1"]) == ["gw-a", "gw-b"]
    assert routers(["gw-a"], backends, ["spark-9"]) == []
