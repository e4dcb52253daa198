"""The gateway's plan from the serving hosts' instance plans: deployments, config, keys, drains and refusals."""

import json
from pathlib import Path

import pytest
import yaml
from plan_options import plan_options

from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import (
    DEFAULT_SETTINGS,
    GATEWAY_SETTINGS,
    backend_reports,
    drain_requests,
    gateway_plan,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway_routes import (
    SCHEMA_VERSION,
    config_document,
    drain_problems,
    drained_file,
    kept_out,
    plan_file,
    read_drained,
    read_plan,
    render_config,
    watchdog_route,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit import plan_problem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import bounds_table
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
    plan = build_plan([instance], {}, **plan_options(image=VLLM_IMAGE, host_addresses=None, allow_wildcard_bind=True))
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
    assert run[run.index("--ulimit") + 1] == "core=0" and "LimitCORE=0" in plan["unit_file"].splitlines(), "no core fills the disk"


def test_the_plan_names_the_files_the_container_reads():
    """Found when read: the gateway's unit and folder were named in two places."""
    plan = plan_for(config_dir="/etc/sparkfleet/gw/")
    run = plan["docker_run"]
    assert plan["files"]["env"] == "/etc/sparkfleet/gw/gateway.env" == run[run.index("--env-file") + 1]
    assert run[run.index("--volume") + 1] == f"{plan['files']['litellm_dir']}:/etc/litellm:ro"
    assert plan["files"]["config"] == plan["files"]["litellm_dir"] + "/config.yaml"
    assert plan["files"]["unit"] == "/etc/systemd/system/" + plan["unit"]


def test_the_gateway_is_one_unit_of_the_serving_transaction_its_container_carrying_its_hash():
    plan = plan_for(config_dir="/etc/sparkfleet/gw")
    unit = plan["serving_unit"]
    assert plan_problem(unit) is None, "serving_unit takes it as it is"
    assert [kept["path"] for kept in unit["kept_files"]] == [plan["files"]["env"], "/etc/sparkfleet/gw/unit-plan.json", plan["files"]["unit"]]
    assert [kept["mode"] for kept in unit["kept_files"]] == ["0600", "0644", "0644"]
    assert all(kept["last_good"].startswith("/etc/sparkfleet/gw/last-good/") for kept in unit["kept_files"])
    run = plan["docker_run"]
    assert f"sparkfleet.vllm.config-hash={unit['config_hash']}" == run[run.index(IMAGE) - 1], "the label precedes the image"
    assert (unit["unit_file"], unit["run_image"], unit["url"], unit["key_env"]) == (plan["unit_file"], IMAGE, plan["url"], "LITELLM_MASTER_KEY")
    assert MASTER not in json.dumps(unit), "the unit's plan file holds no key"
    rekeyed = plan_for(config_dir="/etc/sparkfleet/gw", master_key="sk-" + "n" * 40)["serving_unit"]
    assert rekeyed["config_hash"] != unit["config_hash"], "a new key is a new configuration"


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


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "localhost",
                                     "LOCALHOST.", "spark.localhost", "localhost.localdomain", "ip6-localhost", "127.1", "2130706433",
                                     "0x7f000001", "0177.0.0.1", "127.0.0.1.", "localhost4", "localhost6.localdomain6"])
@pytest.mark.parametrize("variable", ["ansible_host", "gateway_backend_address"])
def test_a_backend_reached_through_the_controllers_loopback_is_refused_not_routed_to_the_gateway_itself(address, variable):
    """Found in a reading: a backend whose ansible_host is 127.0.0.1 (an SSH tunnel on the controller) got the route
    http://127.0.0.1:8000/v1 on the gateway host, which is the gateway's own loopback."""
    hostvars = {**HOSTVARS, "gx10-1": {variable: address, "vllm_endpoints": endpoints("gx10-1", ["0.0.0.0"])}}
    plan = plan_for(hostvars)
    assert plan["deployments"] == []
    assert plan["errors"] == [
        f"gateway_backend_address of gx10-1: {address!r} (its gateway_backend_address, else its ansible_host) is this host only "
        "as the controller reaches it; on gateway-1 it is the gateway itself. Set gateway_backend_address of gx10-1 to the "
        "address gateway-1 reaches it on"]
    assert plan_for(hostvars, gateway="gx10-1")["errors"] == [], "on the gateway's own host loopback is right"


def test_every_bad_setting_is_refused_at_once_naming_the_variable():
    plan = plan_for(image="ghcr.io/berriai/litellm:main-stable", bind_address="0.0.0.0", port=70000, master_key="sk-short",
                    routing_strategy="round-robin", health_check_interval=1, retries=-1, config_dir="etc/gw",
                    model_groups={"bad name": []})
    assert plan["deployments"] == [] and "env_file" not in plan
    text = " | ".join(plan["errors"])
    for fragment in ("gateway_image: 'ghcr.io/berriai/litellm:main-stable' is not pinned by digest",
                     "gateway_bind_address: 0.0.0.0 listens on every interface", "gateway_port: 70000",
                     "gateway_master_key: missing, shorter than 32 characters or not starting with 'sk-'",
                     "gateway_routing_strategy: 'round-robin'", "gateway_health_check_interval: 1 must be a whole number from 5 to 3600",
                     "gateway_retries: -1", "gateway_config_dir: 'etc/gw' must be an absolute path",
                     "gateway_model_groups: group name 'bad name'",
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
     "gateway_backend_address of gx10-1: '10.0.0.1/8?x=' must be the host's name or one of its IP addresses"),
    ({**HOSTVARS, "gx10-1": {**HOSTVARS["gx10-1"], "gateway_backend_address": "::0"}}, ["spark-1", "gx10-1"],
     "gateway_backend_address of gx10-1: '::0' must be the host's name or one of its IP addresses (a wildcard reaches the "
     "gateway's own host)"),
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


def ops(*names):
    """A drained record of the operator's drains."""
    return {name: ["operator"] for name in names}


def test_draining_a_node_or_one_instance_takes_it_out_of_every_group():
    plan = plan_for()
    assert {d["litellm_params"]["api_base"] for d in config_document(plan, ["gx10-1"])["model_list"]} == {"http://192.0.2.10:8000/v1"}
    assert {d["litellm_params"]["api_base"] for d in config_document(plan, ["spark-1/chat"])["model_list"]} == {"http://192.0.2.20:8000/v1"}
    assert render_config(plan, ["gx10-1"]).startswith("# Managed by Ansible (sparkfleet.vllm.gateway): LiteLLM's config; who drained")
    assert render_config(plan, ["gx10-1", "gx10-1/chat"]) == render_config(plan, ["gx10-1"]), "a drain that changes no route changes nothing"


def test_a_drain_that_empties_a_group_is_refused_unless_forced():
    plan = plan_for()
    assert drain_problems(plan, {}, ["gx10-1"], [], False) == []
    assert drain_problems(plan, ops("gx10-1"), ["spark-1"], [], False) == [
        "gateway drain: draining spark-1 leaves model group(s) code, fast with nothing to route to, so every client request for "
        "them would fail. Undrain another node first, or force the drain (gateway_drain_force: true) for a planned outage"]
    assert drain_problems(plan, ops("gx10-1"), ["spark-1"], [], True) == []
    assert drain_problems(plan, ops("gx10-1", "spark-1"), [], ["spark-1"], False) == [], "undraining is never refused"
    assert drain_problems(plan, {}, ["spark-9", "spark-1/other"], [], False) == [
        "gateway drain: 'spark-9' is not a backend of this gateway (known: gx10-1, gx10-1/chat, spark-1, spark-1/chat); name an "
        "inventory host, or host/instance",
        "gateway drain: 'spark-1/other' is not a backend of this gateway (known: gx10-1, gx10-1/chat, spark-1, spark-1/chat); name "
        "an inventory host, or host/instance"]
    assert drain_problems(plan, {}, ["spark-1"], ["spark-1"], False) == ["gateway drain: spark-1 asked to be drained and undrained at once"]


def test_a_watchdog_drains_its_unit_never_the_last_replica_and_undrains_only_its_own_drain():
    plan = plan_for()
    mine = {"gx10-1/chat": ["watchdog@gx10-1"]}
    assert watchdog_route(plan, {}, "drain", "gx10-1/chat") == (mine, {"result": "drained", "why": "gx10-1/chat out of rotation"})
    refused, reply = watchdog_route(plan, mine, "drain", "spark-1/chat")
    assert refused is None and reply["result"] == "refused" and "leaves model group(s) code, fast with nothing to route to" in reply["why"]
    assert watchdog_route(plan, ops("gx10-1"), "drain", "gx10-1/chat")[0] is None, "an operator's drain of the host covers it"
    assert watchdog_route(plan, ops("gx10-1"), "drain", "gx10-1/chat")[1] == {
        "result": "already_drained", "why": "gx10-1/chat was out of rotation already, drained by operator, whose drain stays"}
    assert watchdog_route(plan, {}, "drain", "gx10-1/other") == (None, {"result": "not_routed", "why": "gx10-1/other is no backend of this gateway"})
    assert watchdog_route(plan, {**mine, **ops("spark-1")}, "undrain", "gx10-1/chat") == (
        ops("spark-1"), {"result": "undrained", "why": "gx10-1/chat back in rotation"})
    assert watchdog_route(plan, ops("gx10-1"), "undrain", "gx10-1/chat")[1]["result"] == "kept", "the operator's host drain stays"
    assert watchdog_route(plan, {}, "undrain", "gx10-1/chat") == (None, {"result": "not_drained", "why": "gx10-1/chat was not drained by name"})
    after, reply = watchdog_route(plan, {**ops("gx10-1"), **mine}, "undrain", "gx10-1/chat")
    assert after == ops("gx10-1") and reply == {
        "result": "kept", "why": "the watchdog's drain of gx10-1/chat released; it stays out of rotation, drained by operator"}


def test_a_drain_reaches_the_gateways_routing_to_the_node_each_with_its_own_backends():
    backends = {"gw-a": ["spark-1", "gx10-1"], "gw-b": ["spark-2"], "gw-c": []}
    gateways = ["gw-a", "gw-b", "gw-c"]
    assert drain_requests(gateways, backends, ["gx10-1/chat"], []) == [{"gateway": "gw-a", "drain": ["gx10-1/chat"], "undrain": []}]
    assert drain_requests(gateways, backends, ["spark-2", "spark-1"], ["gx10-1"]) == [
        {"gateway": "gw-a", "drain": ["spark-1"], "undrain": ["gx10-1"]}, {"gateway": "gw-b", "drain": ["spark-2"], "undrain": []}]
    assert drain_requests(["gw-a"], backends, ["spark-9"], []) == []


def test_a_backend_listed_twice_is_refused():
    errors = plan_for(backends=["spark-1", "gx10-1", "spark-1"])["errors"]
    assert errors == ["gateway_backends: spark-1 listed more than once; each would be a second deployment of the same endpoint in "
                      "every group, taking twice its share. List each host once"]


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "::0", "0:0::0", "0000:0000:0000:0000:0000:0000:0000:0000"])
def test_a_wildcard_bind_in_any_spelling_needs_the_opt_in(wildcard):
    assert plan_for(bind_address=wildcard)["errors"] == [
        f"gateway_bind_address: {wildcard} listens on every interface, the LAN included; bind the address clients use, or set "
        "gateway_allow_wildcard_bind: true if a firewall guards the port"]
    plan = plan_for(bind_address=wildcard, allow_wildcard_bind=True)
    run = plan["docker_run"]
    host = "0.0.0.0" if "." in wildcard else "::"
    assert run[run.index("--host") + 1] == host and plan["url"] == ("http://127.0.0.1:4000" if host == "0.0.0.0" else "http://[::1]:4000")


def test_a_backend_on_the_gateway_host_bound_to_a_wildcard_in_any_spelling_is_reached_on_loopback():
    hostvars = {"spark-1": {"ansible_host": "192.0.2.10", "vllm_endpoints": [{**HOSTVARS["spark-1"]["vllm_endpoints"][0],
                                                                             "bind_addresses": ["0:0::0"]}]},
                "gx10-1": HOSTVARS["gx10-1"]}
    plan = plan_for(hostvars, gateway="spark-1")
    assert {d["api_base"] for d in plan["deployments"] if d["node"] == "spark-1"} == {"http://[::1]:8000/v1"}


@pytest.mark.parametrize(("setting", "value", "expected"), [
    ("port", 0, "gateway_port: 0 must be a port number between 1 and 65535; the proxy listens on it"),
    ("health_check_interval", 3601, "gateway_health_check_interval: 3601 must be a whole number from 5 to 3600; seconds between "
                                    "LiteLLM's checks"),
    ("allowed_fails", 0, "gateway_allowed_fails: 0 must be a whole number from 1 to 100"),
    ("cooldown_seconds", 86400, "gateway_cooldown_seconds: 86400 must be a whole number from 1 to 3600"),
    ("retries", 11, "gateway_retries: 11 must be a whole number from 0 to 10; each retry is another whole request"),
    ("request_timeout", 0, "gateway_request_timeout: 0 must be a whole number from 1 to 86400"),
    ("ready_timeout", 1, "gateway_ready_timeout: 1 must be a whole number from 2 to 3600; seconds the gateway may take to answer "
                         "after a (re)start, polled every 2 s"),
    ("config_dir", "/etc", "gateway_config_dir: '/etc' is too close to / (give at least 2 levels"),
    ("config_dir", "/etc/sparkfleet/../gw", "gateway_config_dir: '/etc/sparkfleet/../gw' must not step through '.' or '..'"),
    ("config_dir", "/etc/gw:/x", "gateway_config_dir: '/etc/gw:/x' has 'gw:', which a unit file, an env file or a docker volume "
                                 "spec (host:container:mode) would not carry unchanged"),
    ("admin_ui", "maybe", "gateway_admin_ui: 'maybe' must be true or false"),
    ("api_docs", 1, "gateway_api_docs: 1 must be true or false"),
    ("allow_outbound", "perhaps", "gateway_allow_outbound: 'perhaps' must be true or false"),
])
def test_every_setting_is_bounded_saying_why(setting, value, expected):
    errors = plan_for(**{setting: value})["errors"]
    assert len(errors) == 1 and errors[0].startswith(expected), errors


@pytest.mark.parametrize(("setting", "text", "read"), [
    ("port", "4001", 4001), ("retries", " 3 ", 3), ("admin_ui", "no", False), ("allow_outbound", "yes", True), ("ready_timeout", "120.0", 120),
])
def test_settings_given_as_text_by_extra_vars_read_as_the_argument_spec_reads_them(setting, text, read):
    """-e gateway_port=4001 arrives as text; the role's argument spec takes it as an int, and so does the plan."""
    assert plan_for(**{setting: text})["errors"] == []
    assert plan_for(**{setting: text})["docker_run"] == plan_for(**{setting: read})["docker_run"]


def test_the_admin_ui_and_the_api_docs_are_off_unless_opted_in():
    plan = plan_for()
    run = plan["docker_run"]
    envs = [run[i + 1] for i, argument in enumerate(run) if argument == "--env"]
    assert envs == ["DISABLE_ADMIN_UI=True", "NO_DOCS=True", "NO_REDOC=True", "NO_OPENAPI=True", "LITELLM_OFFLINE_MODE=true"]
    assert run.index("--env") < run.index(IMAGE), "docker's options come before the image"
    general = config_document(plan, [])["general_settings"]
    assert general["disable_env_credential_login"] is True and general["hide_default_credentials_hint"] is True
    opened = plan_for(admin_ui=True, api_docs=True, allow_outbound=True)
    assert "--env" not in opened["docker_run"]
    assert config_document(opened, [])["general_settings"]["disable_env_credential_login"] is False
    docs_only = plan_for(api_docs=True)["docker_run"]
    assert [docs_only[i + 1] for i, a in enumerate(docs_only) if a == "--env"] == ["DISABLE_ADMIN_UI=True", "LITELLM_OFFLINE_MODE=true"]
    online = plan_for(allow_outbound=True)["docker_run"]
    assert "LITELLM_OFFLINE_MODE=true" not in online and "NO_DOCS=True" in online
    assert "--env LITELLM_OFFLINE_MODE=true" in plan["unit_file"], "opting in changes the unit, so it restarts the gateway"
    assert "--env DISABLE_ADMIN_UI=True" in plan["unit_file"]


def test_a_host_and_its_instance_drained_and_undrained_at_once_are_refused():
    plan = plan_for()
    crossed = ("gateway drain: {} asked at once: a host and one of its instances leave each other in place (a drained host keeps "
               "all its instances out, a drained instance stays out when its host goes back), so one request would do nothing. "
               "Name either the host or its instances")
    assert drain_problems(plan, {}, ["gx10-1"], ["gx10-1/chat"], False) == [crossed.format("gx10-1 (drain) and gx10-1/chat (undrain)")]
    assert drain_problems(plan, ops("gx10-1"), ["gx10-1/chat"], ["gx10-1"], False) == [
        crossed.format("gx10-1/chat (drain) and gx10-1 (undrain)")]
    assert drain_problems(plan, ops("gx10-1"), [], ["gx10-1/chat"], False) == [
        "gateway undrain: gx10-1/chat would stay out of rotation, because the host stays drained; undrain the host (and drain by "
        "name those of its instances that must stay out)"]
    assert drain_problems(plan, ops("gx10-1/chat"), [], ["gx10-1/chat"], False) == []
    assert kept_out(["gx10-1/chat"], ["gx10-1"]) == ["gx10-1/chat"] and kept_out(["gx10-1/chat"], ["gx10-1/chat"]) == []


def test_the_plan_and_drained_files_carry_their_schema_and_read_back():
    plan = {k: v for k, v in plan_for().items() if k not in ("env_file", "errors")}
    assert plan["schema_version"] == SCHEMA_VERSION
    assert read_plan(plan_file(plan), "/gw/plan.json") == (plan, None)
    record = {"spark-1": ["operator", "bench@r1"], "gx10-1/chat": ["watchdog@gx10-1"]}
    assert json.loads(drained_file(record)) == {"schema_version": 2, "drained": ["gx10-1/chat", "spark-1"],
                                                "owners": {"gx10-1/chat": ["watchdog@gx10-1"], "spark-1": ["bench@r1", "operator"]}}
    assert read_drained(drained_file(record), "/gw/drained.json") == ({"gx10-1/chat": ["watchdog@gx10-1"], "spark-1": ["bench@r1", "operator"]}, None)
    assert read_drained(None, "/gw/drained.json") == ({}, None)


@pytest.mark.parametrize(("text", "expected"), [
    ('{"deployments": [', "/gw/plan.json: not a gateway plan (Expecting value: line 1 column 18 (char 17)): the file is truncated "
                          "or was edited; re-run site.yml --tags gateway, which rewrites it from the inventory"),
    ('{"deployments": [], "groups": {}, "url": "http://127.0.0.1:4000"}',
     "/gw/plan.json: schema_version missing, while this collection reads 1: another (older) sparkfleet.vllm wrote it; re-run "
     "site.yml --tags gateway"),
    ('{"schema_version": 1, "deployments": [], "groups": {}, "url": "http://127.0.0.1:4000"}',
     "/gw/plan.json: lacks settings: the file is incomplete or was edited; re-run site.yml --tags gateway"),
    ('[]', "/gw/plan.json: not a gateway plan (a JSON object was expected)"),
])
def test_a_plan_file_this_collection_did_not_write_is_refused_naming_the_fix(text, expected):
    plan, problem = read_plan(text, "/gw/plan.json")
    assert plan is None and problem.startswith(expected), problem


def test_an_older_releases_drained_list_reads_as_the_operators_drains():
    expected = ({"spark-2": ["operator"], "gx10-1/chat": ["operator"]}, None)
    assert read_drained('["spark-2", "gx10-1/chat"]', "/gw/drained.json") == expected
    assert read_drained('{"schema_version": 1, "drained": ["spark-2", "gx10-1/chat"]}', "/gw/drained.json") == expected


@pytest.mark.parametrize("address", ["::ffff:0.0.0.0", "::ffff:192.0.2.1", "fe80::1%eth0"])
def test_a_mapped_or_zoned_bind_address_is_refused(address):
    (problem,) = plan_for(bind_address=address, allow_wildcard_bind=True)["errors"]
    assert problem.startswith(f"gateway_bind_address: {address!r} is an IPv4-mapped or zoned IPv6 address")


@pytest.mark.parametrize(("text", "expected"), [
    ('{"schema_version": 1, "drained": ["spark', "/gw/drained.json: not a drained list (Unterminated string"),
    ('{"schema_version": 3, "drained": []}', "/gw/drained.json: schema_version 3, while this collection reads 2 (and 1)"),
    ('{"drained": []}', "/gw/drained.json: schema_version missing, while this collection reads 2 (and 1)"),
    ('{"schema_version": 1, "drained": "spark-2"}', "/gw/drained.json: its drained entry must list hosts or host/instance names"),
    ('{"schema_version": 2, "drained": ["spark-2"]}', "/gw/drained.json: its owners entry must give every drained name"),
    ('{"schema_version": 2, "drained": ["spark-2"], "owners": {"spark-2": []}}', "/gw/drained.json: its owners entry must give"),
    ('{"schema_version": 2, "drained": ["spark-2"], "owners": {"spark-3": ["operator"]}}', "/gw/drained.json: its owners entry must give"),
    ('{"schema_version": 2, "drained": ["spark-2"], "owners": {"spark-2": [""]}}', "/gw/drained.json: its owners entry must give"),
])
def test_a_drained_list_this_collection_did_not_write_is_refused_never_guessed(text, expected):
    drained, problem = read_drained(text, "/gw/drained.json")
    assert drained == {} and problem.startswith(expected), problem
    assert problem.endswith("move it aside (every node then goes back into rotation) and re-run site.yml --tags gateway, then "
                            "drain again what must stay out (playbooks/gateway.yml -e '{\"gateway_drain\": [...]}')")


def test_docs_show_the_bounds_of_every_setting_as_the_table_checks_them():
    doc = (Path(__file__).parents[4] / "docs" / "gateway.md").read_text()
    shown = doc.split("<!-- gateway settings: begin -->\n")[1].split("\n<!-- gateway settings: end -->")[0]
    assert shown == bounds_table("gateway_", GATEWAY_SETTINGS), "docs/gateway.md's bounds table is stale: paste bounds_table's"


def test_the_python_defaults_are_the_roles_and_the_role_passes_every_setting():
    role = Path(__file__).parents[4] / "roles" / "gateway"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    assert DEFAULT_SETTINGS == {name: defaults[f"gateway_{name}"] for name in DEFAULT_SETTINGS}
    passed = yaml.safe_load((role / "vars" / "main.yml").read_text())["__gateway_settings"]
    assert passed == {name: f"{{{{ gateway_{name} }}}}" for name in DEFAULT_SETTINGS}


def test_the_drain_filter_gives_each_gateway_its_names_and_folder():
    from ansible_collections.sparkfleet.vllm.plugins.filter.gateway import gateway_routers

    hostvars = {"gw-a": {"gateway_backends": ["spark-1"], "gateway_config_dir": "/srv/gw"}, "gw-b": {"gateway_backends": ["gx10-1"]}}
    assert gateway_routers(["gw-a", "gw-b", "gw-gone"], hostvars, ["spark-1/chat"], ["gx10-1"]) == [
        {"gateway": "gw-a", "drain": ["spark-1/chat"], "undrain": [], "config_dir": "/srv/gw"},
        {"gateway": "gw-b", "drain": [], "undrain": ["gx10-1"], "config_dir": DEFAULT_SETTINGS["config_dir"]}]
