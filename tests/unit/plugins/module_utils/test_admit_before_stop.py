"""The admission a relaunch asks before anything of the running unit is stopped (issue 38): the stray holders of the GPU's
device nodes and the memory the image's vLLM will read, credited with what the running engine's stop gives back; a
refusal stops nothing and puts the last good files back. Docker and systemd are a stand-in answering by name, as
test_host_runtime's; the real probe and holder on the lab: molecule/vllm/tests/test_plan.py."""

import json
import pathlib

from plan_files import rank_plan, unit_plan

from ansible_collections.sparkfleet.vllm.plugins.module_utils import _host_runtime as runtime
from ansible_collections.sparkfleet.vllm.plugins.module_utils import _serving_unit as serving_unit
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import unjudged_mark

GIB = 1024**3
EXPORTER_ID = "e" * 64


class Docker:
    """Containers by name -> (id, running), the probe's figures, every call in order."""

    def __init__(self, containers=None, free=10 * GIB, total=40 * GIB):
        self.containers, self.free, self.total, self.calls = dict(containers or {}), free, total, []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[0] == "/usr/bin/timeout":
            return 0, json.dumps({"device": "cpu", "figure": "MemAvailable (CPU build)", "free": self.free, "total": self.total}), ""
        if argv[0] in ("systemctl", "/usr/bin/sync") or argv[1] == "ps":
            return 0, "", ""
        if argv[1:3] == ["container", "inspect"] and argv[-1] in self.containers:
            container_id, up = self.containers[argv[-1]]
            return 0, json.dumps([{"Id": container_id, "Name": "/" + argv[-1], "State": {"Running": up, "Status": "running" if up else "exited"}}]), ""
        if argv[1:3] == ["container", "inspect"]:
            return 1, "[]", f"Error: No such container: {argv[-1]}"
        return 2, "", f"unexpected {argv}"

    def probed(self):
        return any(call[0] == "/usr/bin/timeout" for call in self.calls)


def holders(*entries):
    """The processes holding files (pid, command, paths) and each one's cgroup, as /proc reads them."""
    return (lambda: [(pid, command, ["/dev/nvidia0"]) for pid, command, _cgroup in entries],
            {pid: cgroup for pid, _command, cgroup in entries}.get)


def test_the_memory_is_credited_with_what_the_running_engines_stop_gives_back():
    plan = unit_plan(memory_admission=True, paused_containers=[], drop_caches=False, gpu_memory_utilization=0.7)
    assert runtime.before_stop(plan, Docker(), 0.5, *holders()) == [], "10 GiB free and 20 given back hold 0.7 of 40 GiB"
    refused = runtime.before_stop({**plan, "gpu_memory_utilization": 0.8}, Docker(), 0.5, *holders())
    assert refused == ["llm: gpu_memory_utilization 0.8 asks for 32.00 GiB of the kernel's MemTotal of 40.00 GiB in the image, but the "
                       "free memory its vLLM compares that with, MemAvailable (CPU build) with the 20.00 GiB its running engine gives back "
                       "at its stop, is 30.00 GiB now; lower it, or free the memory first (stop what holds it)"]
    assert runtime.before_stop({**plan, "gpu_memory_utilization": 0.25}, Docker(), 0.0, *holders()) == [], "nothing runs: 10 of 10 GiB"


def test_a_stray_holder_is_refused_and_the_containers_the_start_pauses_are_not_strays():
    plan = unit_plan(memory_admission=True, paused_containers=["nvidia_gpu_exporter"], drop_caches=False, gpu_memory_utilization=0.9)
    exporter = (4242, "nvidia_gpu_expo", f"0::/system.slice/docker-{EXPORTER_ID}.scope\n")
    stray = (777, "python3", "0::/user.slice/session-1.scope\n")
    docker = Docker({"nvidia_gpu_exporter": (EXPORTER_ID, True)})
    assert runtime.before_stop(plan, docker, 0.5, *holders(exporter)) == []
    assert not docker.probed(), "while a container the start pauses runs, what it gives back is unknown: the start judges the memory"
    refused = runtime.before_stop(plan, Docker({"nvidia_gpu_exporter": (EXPORTER_ID, True)}), 0.5, *holders(exporter, stray))
    assert len(refused) == 1 and refused[0].startswith("llm: pid 777 (python3) holds /dev/nvidia0: the start was not attempted")


def test_a_stopped_exporter_is_no_reason_to_skip_the_memory_and_a_rank_pauses_through_its_role():
    stopped = Docker({"nvidia_gpu_exporter": (EXPORTER_ID, False)}, free=30 * GIB)
    assert runtime.before_stop(unit_plan(memory_admission=True, paused_containers=["nvidia_gpu_exporter"], drop_caches=False), stopped, 0.0,
                               *holders()) == []
    assert stopped.probed()
    rank = rank_plan(1, memory_admission=True, paused_containers=["nvidia_gpu_exporter"], drop_caches=False)
    running = Docker({"nvidia_gpu_exporter": (EXPORTER_ID, True)})
    runtime.before_stop(rank, running, 0.0, *holders())
    assert running.probed() and not any(call[1:3] == ["container", "inspect"] for call in running.calls), \
        "a rank's role paused the exporters on every node before this"


def test_the_page_cache_is_dropped_before_the_memory_is_read_as_the_start_drops_it(tmp_path):
    plan = unit_plan(memory_admission=True, paused_containers=[], drop_caches=True)
    drop = tmp_path / "drop_caches"
    drop.touch()
    docker = Docker(free=30 * GIB)
    assert runtime.before_stop(plan, docker, 0.0, *holders(), drop_caches_path=str(drop)) == [] and drop.read_text() == "3\n"
    assert [call[0] for call in docker.calls if call[0].startswith("/usr/bin/")][:2] == ["/usr/bin/sync", "/usr/bin/docker"]
    assert docker.calls[-1][0] == "/usr/bin/timeout", "the probe reads the memory last"
    unknown, untouched = Docker(), tmp_path / "untouched"
    untouched.touch()
    runtime.before_stop(plan, unknown, None, *holders(), drop_caches_path=str(untouched))
    assert untouched.read_text() == "" and not unknown.probed(), "no memory read, no cache dropped"


def test_an_unknown_hold_leaves_the_memory_to_the_start_and_no_admission_asks_nothing():
    plan = unit_plan(memory_admission=True, paused_containers=[], drop_caches=False, gpu_memory_utilization=0.99)
    docker = Docker()
    assert runtime.before_stop(plan, docker, None, *holders()) == [] and not docker.probed()
    off = Docker()
    assert runtime.before_stop({**plan, "memory_admission": False}, off, 0.0, *holders()) == [] and off.calls == []


def deployed(tmp_path, last_good_share=0.5, **changes):
    """A single instance's plan with its files under tmp_path; its last good files (share ``last_good_share``) written."""
    plan = unit_plan(options={"config_dir": str(tmp_path / "config"), "memory_admission": True}, paused_containers=[], drop_caches=False,
                     **changes)
    unit_kept = plan["kept_files"][2]
    plan["kept_files"][2] = {**unit_kept, "path": str(tmp_path / "units" / plan["unit"]),
                             "last_good": str(tmp_path / "config" / "last-good" / plan["unit"])}
    before = {**plan, "gpu_memory_utilization": last_good_share}
    for kind, kept in zip(serving_unit.FILE_KINDS, plan["kept_files"], strict=True):
        path = pathlib.Path(kept["last_good"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(serving_unit.plan_text(before) if kind == "plan" else f"last good {kind}\n")
        pathlib.Path(kept["path"]).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(kept["path"]).write_text(serving_unit.plan_text(plan) if kind == "plan" else f"new {kind}\n")
    return plan


def test_the_running_engine_holds_its_last_good_share_unless_it_runs_settings_never_judged(tmp_path):
    plan = deployed(tmp_path, last_good_share=0.4)
    running = Docker({plan["container"]: ("c" * 64, True)})
    assert serving_unit.held_share(plan, running) == 0.4
    assert serving_unit.held_share(plan, Docker({plan["container"]: ("c" * 64, False)})) == 0.0
    assert serving_unit.held_share(plan, Docker()) == 0.0
    mark = unjudged_mark(str(pathlib.Path(plan["kept_files"][1]["last_good"]).parent), plan["name"])
    pathlib.Path(mark).write_text(json.dumps({"since": "2026-12-06T10:00:00Z", "config_hash": plan["config_hash"]}))
    assert serving_unit.held_share(plan, running) is None
    pathlib.Path(mark).unlink()
    pathlib.Path(plan["kept_files"][1]["last_good"]).write_text(serving_unit.plan_text({**plan, "schema_version": 1}))
    assert serving_unit.held_share(plan, running) is None, "a last good plan file of another release is not read as a share"


def test_a_relaunch_refused_before_its_stop_stops_nothing_and_puts_the_last_good_files_back(tmp_path):
    plan = deployed(tmp_path, last_good_share=0.1, gpu_memory_utilization=0.9)
    docker = Docker({plan["container"]: ("c" * 64, True)})
    result = serving_unit.relaunch(plan, str(tmp_path / "flag"), False, docker)
    assert result["failed"] and result["msg"].startswith(
        "vLLM instance llm was not relaunched, nothing of it was stopped (its last good files are back in place): llm: "
        "gpu_memory_utilization 0.9 asks for 36.00 GiB")
    assert "with the 4.00 GiB its running engine gives back at its stop, is 14.00 GiB now" in result["msg"]
    assert [call for call in docker.calls if call[0] == "systemctl"] == [["systemctl", "daemon-reload"]], "no stop, no start"
    for kept in plan["kept_files"]:
        assert pathlib.Path(kept["path"]).read_text() == pathlib.Path(kept["last_good"]).read_text()
    assert not (tmp_path / "flag").exists(), "no maintenance flag raised for a relaunch that never began"


def test_check_mode_runs_no_probe_container_and_still_names_a_stray(tmp_path, monkeypatch):
    plan = deployed(tmp_path, gpu_memory_utilization=0.99)
    # A process of no container's cgroup holding the GPU, as /proc would show it.
    monkeypatch.setattr(runtime, "device_holders", lambda _processes, _nodes: [{"pid": 777, "command": "python3", "paths": ["/dev/nvidia0"]}])
    docker = Docker({plan["container"]: ("c" * 64, True)})
    refusals = serving_unit.admit(plan, docker, check_mode=True)["refusals"]
    assert len(refusals) == 1 and refusals[0].startswith("llm: pid 777 (python3) holds /dev/nvidia0") and not docker.probed()


def test_a_ranks_refusal_names_its_node_for_the_clusters_joined_message(monkeypatch):
    monkeypatch.setattr(runtime, "device_holders", lambda _processes, _nodes: [{"pid": 777, "command": "python3", "paths": ["/dev/nvidia0"]}])
    refusals = serving_unit.admit(rank_plan(1, memory_admission=True, drop_caches=False), Docker(), check_mode=True)["refusals"]
    assert len(refusals) == 1 and refusals[0].startswith("spark-2 (rank 1): tp: pid 777 (python3) holds /dev/nvidia0"), refusals


def test_the_gateway_is_admitted_without_a_question():
    docker = Docker()
    assert serving_unit.admit({"kind": "gateway", "name": "gateway"}, docker) == {"changed": False, "refusals": []} and docker.calls == []
