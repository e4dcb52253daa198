"""The one reader of a unit's plan file: what the plan builder writes is read whole, anything else is refused naming the
file's path, what is unusable and the fix; and every program that reads a plan file refuses it through this reader."""

import copy
import importlib.util
import json
import pathlib

import pytest
from plan_files import CLUSTER_HOSTS, gateway_unit_plan, rank_plan, unit_plan, write_plan

from ansible_collections.sparkfleet.vllm.plugins.module_utils import _boot_check, _host_runtime, _soak, _vllm_client
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import (
    FIX,
    GATEWAY,
    PLAN_SCHEMA_VERSION,
    START_LEDGER_DIR,
    PlanFileError,
    parsed_plan,
    read_plan,
    start_record,
)

ROOT = pathlib.Path(__file__).resolve().parents[4]
UNIT = "sparkfleet-vllm-llm.service"


def refusal(path, read=read_plan):
    with pytest.raises(PlanFileError) as refused:
        read(str(path))
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and message.endswith(FIX), message
    return message


@pytest.mark.parametrize("plan", [
    pytest.param(unit_plan(), id="instance"),
    pytest.param(unit_plan("gpu", options={"gpus": True}), id="instance-with-gpus"),
    pytest.param(rank_plan(0), id="native-head"),
    pytest.param(rank_plan(1), id="native-worker"),
    pytest.param(rank_plan(2, hosts=CLUSTER_HOSTS, backend="ray"), id="ray-worker"),
])
def test_what_the_plan_builder_writes_is_read_whole(tmp_path, plan):
    assert plan["schema_version"] == PLAN_SCHEMA_VERSION == 2
    assert plan["start_bound"]["path"] == start_record(plan["unit"]) == f"{START_LEDGER_DIR}/{plan['unit']}.json"
    assert read_plan(write_plan(tmp_path, plan)) == plan


def test_a_plan_file_that_is_not_there_or_cannot_be_read_is_named(tmp_path):
    assert "no such plan file" in refusal(tmp_path / "llm.json")
    assert "no such plan file" in refusal(tmp_path / "absent-folder" / "llm.json")
    (tmp_path / "folder.json").mkdir()
    assert "cannot be read (Is a directory); read it as root (become: true), or re-apply" in refusal(tmp_path / "folder.json")


@pytest.mark.parametrize(("text", "fragment"), [
    ("{", "not valid JSON"), ("", "not valid JSON"), ("{'name': 'llm'}", "not valid JSON"), ('{"name": "llm",}', "not valid JSON"),
    ("[]", "holds no plan object"), ("null", "holds no plan object"), ('"plan"', "holds no plan object"), ("2", "holds no plan object"),
    ("NaN", "holds no plan object"),
])
def test_a_file_that_holds_no_json_object_is_refused(tmp_path, text, fragment):
    (tmp_path / "llm.json").write_text(text)
    assert fragment in refusal(tmp_path / "llm.json")


@pytest.mark.parametrize("version", [1, "2", None, 2.0, True, 3, 0, [2]])
def test_a_plan_file_of_another_schema_is_refused_naming_its_version(tmp_path, version):
    path = write_plan(tmp_path, unit_plan(schema_version=version))
    assert f"schema_version {version!r}, this release reads 2 (another release of sparkfleet.vllm wrote it)" in refusal(path)


def test_a_plan_file_without_a_schema_version_is_refused(tmp_path):
    plan = unit_plan()
    del plan["schema_version"]
    assert "schema_version None, this release reads 2" in refusal(write_plan(tmp_path, plan))


REQUIRED = ("name", "model", "weights", "unit", "container", "url", "container_url", "env_path", "maintenance_flag", "drop_caches",
            "memory_admission", "paused_containers", "bind_addresses", "start_after", "run_image", "docker_run", "memory_probe",
            "gpu_memory_utilization", "served_names", "port", "health_timeout", "launch_check", "cold_start", "start_bound")


@pytest.mark.parametrize("key", REQUIRED)
def test_each_key_a_reader_relies_on_is_required(tmp_path, key):
    plan = unit_plan()
    del plan[key]
    message = refusal(write_plan(tmp_path, plan, "llm"))
    assert f"no usable {key}" in message or f", {key}" in message, message


@pytest.mark.parametrize(("key", "value"), [
    ("name", ""), ("name", 7), ("model", ["tiny"]), ("weights", None),
    ("unit", "../../etc/cron.d/x"), ("unit", "a.service; rm -rf /"), ("container", "--format={{json .Config.Env}}"), ("container", ""),
    ("url", "file:///etc/shadow"), ("url", "https://127.0.0.1:8000"), ("url", 8000), ("container_url", "127.0.0.1:8000"),
    ("env_path", "relative.env"), ("env_path", "/etc/../root/.env"), ("maintenance_flag", "run/flag"), ("maintenance_flag", None),
    ("drop_caches", "yes"), ("drop_caches", 1), ("memory_admission", "true"), ("memory_admission", None),
    ("paused_containers", "nvidia_gpu_exporter"), ("paused_containers", [1]), ("bind_addresses", [None]), ("start_after", "sparkfleet-vllm-a.service"),
    ("run_image", "--privileged"), ("run_image", ""), ("docker_run", ["/bin/sh", "-c", "reboot"]), ("docker_run", ["docker", "run"]),
    ("docker_run", []), ("docker_run", "/usr/bin/docker run"), ("memory_probe", ["/usr/bin/timeout", "1", "/bin/sh"]), ("memory_probe", []),
    ("gpu_memory_utilization", 1.5), ("gpu_memory_utilization", 0), ("gpu_memory_utilization", "0.5"), ("gpu_memory_utilization", True),
    ("served_names", []), ("served_names", "tiny"), ("served_names", [""]), ("port", "8000"), ("port", 0), ("port", 70000), ("port", True),
    ("health_timeout", "1200"), ("health_timeout", 0), ("health_timeout", -5), ("health_timeout", False),
    ("launch_check", None), ("launch_check", []),
    ("cold_start", {"stamp": "relative"}), ("cold_start", None), ("cold_start", "cold"),
])
def test_a_key_of_another_type_or_value_is_named(tmp_path, key, value):
    plan = unit_plan()
    plan[key] = value
    assert f"no usable {key}" in refusal(write_plan(tmp_path, plan, "llm"))


@pytest.mark.parametrize("change", [
    {"timeout": "30"}, {"restarts": -1}, {"restart_window": None}, {"stamp": "/var/cache/../../etc/passwd"}, {"kv_cache_warn_share": None},
    {"kv_cache_warn_share": 0}, {"kv_cache_warn_share": 1.5},
])
def test_a_cold_start_not_whole_is_named(tmp_path, change):
    plan = unit_plan()
    plan["cold_start"].update(change)
    assert "no usable cold_start;" in refusal(write_plan(tmp_path, plan))


@pytest.mark.parametrize("path", [
    "/tmp/sparkfleet-vllm-llm.service.json", f"{START_LEDGER_DIR}/../../../etc/{UNIT}.json", f"{START_LEDGER_DIR}/sparkfleet-vllm-other.service.json",
    f"starts/{UNIT}.json", f"{START_LEDGER_DIR}//{UNIT}.json", f"/etc/cron.d/{UNIT}.json", None,
])
def test_a_start_record_outside_the_ledger_folder_is_refused(tmp_path, path):
    plan = unit_plan()
    plan["start_bound"]["path"] = path
    message = refusal(write_plan(tmp_path, plan))
    assert f"no usable start_bound (its starts and window, and its record {START_LEDGER_DIR}/{UNIT}.json)" in message


@pytest.mark.parametrize("change", [{"starts": 0}, {"window": "1800"}, {"starts": True}])
def test_a_start_bound_without_its_counts_is_refused(tmp_path, change):
    plan = unit_plan()
    plan["start_bound"].update(change)
    assert "no usable start_bound" in refusal(write_plan(tmp_path, plan))


def damaged_cluster(change):
    plan = rank_plan(1)
    cluster = copy.deepcopy(plan["cluster"])
    if callable(change):
        change(cluster)
    else:
        cluster = change
    return {**plan, "cluster": cluster}


@pytest.mark.parametrize("change", [
    pytest.param(lambda cluster: cluster.update(nodes=[]), id="no-nodes"),
    pytest.param(lambda cluster: cluster.pop("nodes"), id="nodes-missing"),
    pytest.param(lambda cluster: cluster.update(nodes="spark-1,spark-2"), id="nodes-as-text"),
    pytest.param(lambda cluster: cluster["nodes"][0].update(rank="0"), id="rank-as-text"),
    pytest.param(lambda cluster: cluster["nodes"][1].pop("address"), id="node-without-address"),
    pytest.param(lambda cluster: cluster["nodes"][0].update(address="spark-1-fast-address"), id="node-address-a-name"),
    pytest.param(lambda cluster: cluster.update(host_ip="spark-2"), id="host-ip-a-name"),
    pytest.param(lambda cluster: cluster.pop("head"), id="head-missing"),
    pytest.param(lambda cluster: cluster.update(rank=-1), id="rank-negative"),
    pytest.param(lambda cluster: cluster.pop("backend"), id="backend-missing"),
    pytest.param(lambda cluster: cluster.update(backend="mpi"), id="backend-unknown"),
    pytest.param(lambda cluster: cluster.update(backend="Native"), id="backend-spelt-otherwise"),
    pytest.param("head", id="cluster-as-text"),
    pytest.param([], id="cluster-as-list"),
])
def test_a_cluster_part_without_its_nodes_and_addresses_is_refused(tmp_path, change):
    message = refusal(write_plan(tmp_path, damaged_cluster(change)))
    assert "no usable cluster (its rank, head, backend, host_ip and nodes, each with its rank and address)" in message


def test_every_unusable_key_is_named_at_once():
    plan = unit_plan(port="8000", served_names=[], url="ftp://x")
    with pytest.raises(PlanFileError, match=r"^/etc/sparkfleet/vllm/llm.json: no usable url, served_names, port; re-apply site.yml"):
        parsed_plan("/etc/sparkfleet/vllm/llm.json", json.dumps(plan))


def watchdog_daemon():
    spec = importlib.util.spec_from_file_location("sparkfleet_watchdog", ROOT / "roles" / "watchdog" / "files" / "sparkfleet_watchdog.py")
    daemon = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(daemon)
    return daemon


@pytest.mark.parametrize("damage", [
    pytest.param({"schema_version": 1}, id="older-release"),
    pytest.param({"start_bound": {"starts": 3, "window": 1800, "path": "/etc/cron.d/job.json"}}, id="start-record-elsewhere"),
    pytest.param({"cluster": {"rank": 1, "head": False, "host_ip": "192.168.100.12", "nodes": []}}, id="cluster-without-nodes"),
    pytest.param({"served_names": "tiny"}, id="served-names-as-text"),
])
def test_every_reader_refuses_a_bad_plan_file_through_the_one_reader(tmp_path, capsys, damage):
    path = write_plan(tmp_path, unit_plan(**damage))
    (tmp_path / "llm.env").write_text("VLLM_API_KEY=" + "k" * 32 + "\n")
    message = refusal(path)
    # The start door and the readiness wait: the message alone in the unit's journal, the start refused, not retried.
    assert _host_runtime.main(["start", "--plan", path]) == _host_runtime.REFUSED and _host_runtime.main(["ready", "--plan", path]) == 1
    assert capsys.readouterr().err.splitlines() == [message, message]
    # The watchdog's daemon: not watched, and named.
    assert watchdog_daemon().watched_plans([str(tmp_path)], str(tmp_path / "peer")) == ([], [], [message])
    # The reboot test's checks: a damaged plan file.
    assert _boot_check.deployed_plans([str(tmp_path)], _boot_check.read_text) == ([], [message])
    # The measurement modules (the soak's unit too).
    with pytest.raises(PlanFileError) as refused:
        _vllm_client.resolve({"instance": "llm", "config_dir": str(tmp_path)})
    assert str(refused.value) == message
    with pytest.raises(PlanFileError) as refused:
        _soak.instance_unit(str(tmp_path), "llm")
    assert str(refused.value) == message


@pytest.mark.parametrize(("content", "named"), [
    pytest.param(b'{"schema_version": 2, "name": "caf\xe9"}', "not UTF-8 text", id="latin-1-byte"),
    pytest.param(b"\xff\xfe{}", "not UTF-8 text", id="utf-16-mark"),
    pytest.param(b"[" * 100000 + b"]" * 100000, "not valid JSON", id="nested-beyond-the-parser"),
])
def test_a_file_the_parser_cannot_take_is_refused_not_a_traceback(tmp_path, content, named):
    path = tmp_path / "llm.json"
    path.write_bytes(content)
    assert f"{path}: {named}" in refusal(path)


@pytest.mark.parametrize("names", [
    pytest.param(["vllm-other"], id="the-collections-own-instance"),
    pytest.param(["sparkfleet-gateway"], id="the-collections-own-gateway"),
    pytest.param(["--all"], id="an-option-to-docker"),
    pytest.param(["nvidia_gpu_exporter", "nvidia_gpu_exporter"], id="twice"),
    pytest.param(["exporter; reboot"], id="a-shell-line"),
])
def test_a_paused_container_the_door_must_never_stop_is_refused(tmp_path, names):
    assert "no usable paused_containers" in refusal(write_plan(tmp_path, unit_plan(paused_containers=names)))


def test_the_gateways_unit_plan_is_read_whole_as_the_gateway_kind_and_never_as_an_instances(tmp_path):
    path = write_plan(tmp_path, gateway_unit_plan(), "unit-plan")
    assert read_plan(path, kind=GATEWAY) == json.loads(pathlib.Path(path).read_text())
    assert "no usable model, weights, container_url" in refusal(path)
    instance = write_plan(tmp_path, unit_plan())
    assert "no usable kind, key_env;" in refusal(instance, read=lambda where: read_plan(where, kind=GATEWAY))


@pytest.mark.parametrize(("change", "named"), [
    ({"kind": "instance"}, "kind"), ({"kind": None}, "kind"),
    ({"url": "https://127.0.0.1:4000"}, "url"), ({"url": None}, "url"), ({"url": ["http://127.0.0.1:4000"]}, "url"),
    ({"health_timeout": True}, "health_timeout"), ({"health_timeout": 0}, "health_timeout"), ({"health_timeout": "120"}, "health_timeout"),
    ({"key_env": "master key"}, "key_env"), ({"key_env": "$(reboot)"}, "key_env"), ({"key_env": ""}, "key_env"),
    ({"container": "sparkfleet gateway"}, "container"), ({"container": "--rm"}, "container"), ({"unit": None}, "unit"),
    ({"schema_version": 1}, "schema_version 1"), ({"schema_version": "2"}, "schema_version '2'"),
])
def test_a_gateway_unit_plan_its_gate_cannot_read_is_refused_naming_the_key(tmp_path, change, named):
    path = write_plan(tmp_path, gateway_unit_plan(**change), "unit-plan")
    message = refusal(path, read=lambda where: read_plan(where, kind=GATEWAY))
    assert named in message and "m" * 40 not in message, message
