"""The host runtime every unit start runs: its refusal of a plan file the one reader refuses, the admission's order and journal lines, the ledger of
the containers stopped for starts, a refused start that is recorded and not retried, and the readiness wait."""

import ast
import json
import os
import pathlib

import pytest
from plan_files import rank_plan, unit_plan, write_plan

from ansible_collections.sparkfleet.vllm.plugins.module_utils import _host_runtime as runtime
from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import memory_probe_argv
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import PlanFileError, read_plan, start_record
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import Reply

ROOT = pathlib.Path(__file__).resolve().parents[4]
GIB = 1024**3


def test_the_runtime_is_its_listed_files_which_import_only_each_other_and_the_standard_library():
    folders, files = runtime.runtime_files()
    listed = {pathlib.PurePosixPath(entry["source"]).stem for entry in files if entry["source"].startswith("plugins/")}
    assert listed == set(runtime.RUNTIME_MODULES)
    for name in runtime.RUNTIME_MODULES:
        tree = ast.parse((ROOT / "plugins" / "module_utils" / f"{name}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ansible"):
                assert node.module.startswith("ansible_collections.sparkfleet.vllm.plugins.module_utils."), (name, node.module)
                assert node.module.rsplit(".", 1)[1] in runtime.RUNTIME_MODULES, f"{name} imports {node.module}, not in the runtime"
            if isinstance(node, ast.Import):
                assert not any(alias.name.startswith("ansible") for alias in node.names), name
    assert all(entry["path"].startswith(runtime.RUNTIME_DIR + "/") for entry in files)
    assert [entry["path"] for entry in folders][-1] == f"{runtime.RUNTIME_DIR}/{runtime.PACKAGE}"
    assert (ROOT / runtime.ENTRY_SOURCE).is_file() and runtime.ENTRY in [entry["path"] for entry in files]


def plan_of(tmp_path, **changes):
    """The plan file the vllm role writes (plan_files.unit_plan), its env file and warm stamp under tmp_path."""
    return unit_plan(**{"env_path": str(tmp_path / "llm.env"), "paused_containers": ["nvidia_gpu_exporter"], "drop_caches": True,
                        "memory_admission": True, "health_timeout": 20, **changes,
                        "cold_start": {**unit_plan()["cold_start"], "timeout": 30, "stamp": str(tmp_path / "jit" / "warm" / "key"),
                                       **changes.get("cold_start", {})}})


def test_the_entry_refuses_a_plan_file_through_the_one_reader(tmp_path, capsys):
    plan = plan_of(tmp_path, schema_version=1)
    path = write_plan(tmp_path, plan)
    assert runtime.main(["start", "--plan", path]) == runtime.REFUSED and runtime.main(["ready", "--plan", path]) == 1
    with pytest.raises(PlanFileError) as refused:
        read_plan(path)
    assert capsys.readouterr().err.splitlines() == [str(refused.value)] * 2
    assert runtime.read_plan is read_plan and runtime.PlanFileError is PlanFileError


class Host:
    """docker as it answers for containers by name -> running; the memory probe's figures; every call in order."""

    def __init__(self, running=None, free=20 * GIB, total=40 * GIB, stuck=()):
        self.running, self.free, self.total, self.stuck, self.calls = dict(running or {}), free, total, set(stuck), []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[0] == "/usr/bin/timeout":
            return 0, json.dumps({"device": "cpu", "figure": "MemAvailable (CPU build)", "free": self.free, "total": self.total}), ""
        if argv[0] == "/usr/bin/sync" or argv[1] == "ps":
            return 0, "", ""
        name = argv[-1]
        if argv[1:3] == ["container", "inspect"]:
            if name not in self.running:
                return 1, "", f"Error: No such container: {name}"
            return 0, json.dumps([{"Name": f"/{name}", "State": {"Running": self.running[name]}}]), ""
        if name in self.stuck:
            return 1, "", f"Error response from daemon: cannot {argv[1]} container {name}"
        self.running[name] = argv[1] == "start"
        return 0, name + "\n", ""

    def kinds(self):
        return [call[1] if call[0] == "/usr/bin/docker" else call[0].rsplit("/", 1)[1] for call in self.calls]


def admit(tmp_path, plan, host, lines, holders=()):
    (tmp_path / "drop_caches").touch()
    return runtime.admit(plan, host, lines.append, str(tmp_path / "state" / "paused.json"), str(tmp_path / "drop_caches"),
                         ("/dev/nvidia*",), lambda: list(holders), lambda pid: "0::/init.scope\n")


def test_an_admitted_start_drops_the_cache_stops_the_exporter_and_logs_each_figure_in_order(tmp_path):
    host, lines = Host({"nvidia_gpu_exporter": True}), []
    assert admit(tmp_path, plan_of(tmp_path), host, lines) == []
    assert host.kinds() == ["sync", "container", "stop", "ps", "timeout"], "cache, exporter, holders, memory: in that order"
    assert (tmp_path / "drop_caches").read_text() == "3\n"
    assert lines == ["page cache dropped", "nvidia_gpu_exporter stopped for the start", "no stray holder of /dev/nvidia*",
                     "memory: MemAvailable (CPU build) 20.00 GiB free, gpu_memory_utilization 0.5 of 40.00 GiB wants 20.00 GiB: admitted"]
    ledger = json.loads((tmp_path / "state" / "paused.json").read_text())
    assert ledger == {"nvidia_gpu_exporter": ["sparkfleet-vllm-llm.service"]} and not host.running["nvidia_gpu_exporter"]


def test_a_refused_start_names_the_figures_and_the_fix_and_starts_the_exporter_again(tmp_path):
    host, lines = Host({"nvidia_gpu_exporter": True}, free=10 * GIB), []
    holder = (4242, "python3", ["/dev/nvidia0"])
    problems = admit(tmp_path, plan_of(tmp_path), host, lines, [holder])
    assert len(problems) == 2 and problems[0].startswith("llm: pid 4242 (python3) holds /dev/nvidia0: the start was not attempted")
    assert problems[1].startswith("llm: gpu_memory_utilization 0.5 asks for 20.00 GiB") and "is 10.00 GiB now; lower it" in problems[1]
    assert host.running["nvidia_gpu_exporter"] and lines[-1] == "nvidia_gpu_exporter started again"
    assert json.loads((tmp_path / "state" / "paused.json").read_text()) == {}


def test_nothing_is_checked_that_the_plan_switches_off_and_a_rank_stops_no_exporter(tmp_path):
    host, lines = Host({"nvidia_gpu_exporter": True}), []
    plan = plan_of(tmp_path, drop_caches=False, memory_admission=False, cluster=rank_plan(1)["cluster"])
    assert admit(tmp_path, plan, host, lines) == [] and host.calls == []
    assert lines == ["page cache kept (vllm_drop_caches is off for this host)"]


def test_a_container_two_starts_need_runs_again_only_after_both(tmp_path):
    host, ledger = Host({"nvidia_gpu_exporter": True}), str(tmp_path / "paused.json")
    assert runtime.pause("a.service", ["nvidia_gpu_exporter"], host, print, ledger) == (["nvidia_gpu_exporter"], [])
    assert runtime.pause("b.service", ["nvidia_gpu_exporter"], host, print, ledger) == ([], [])
    assert runtime.release("a.service", host, print, ledger) == [] and not host.running["nvidia_gpu_exporter"]
    assert runtime.release("b.service", host, print, ledger) == [] and host.running["nvidia_gpu_exporter"]
    assert runtime.release("b.service", host, print, ledger) == [] and host.kinds().count("start") == 1, "released once"


def test_only_a_container_of_that_very_name_is_stopped_and_a_stuck_one_fails_the_start(tmp_path):
    host, ledger = Host({"vllm-llm": True}), str(tmp_path / "paused.json")
    assert runtime.pause("a.service", ["absent", "vllm"], host, print, ledger) == ([], [])
    stuck = Host({"nvidia_gpu_exporter": True}, stuck={"nvidia_gpu_exporter"})
    assert runtime.pause("a.service", ["nvidia_gpu_exporter"], stuck, print, ledger) == ([], [
        "nvidia_gpu_exporter could not be stopped for the start: Error response from daemon: cannot stop container nvidia_gpu_exporter"])
    assert json.loads(pathlib.Path(ledger).read_text()) == {}, "a container not stopped is not recorded"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only folder")
def test_a_ledger_that_cannot_be_written_stops_nothing_and_says_so(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o500)
    host, lines = Host({"nvidia_gpu_exporter": True}), []
    try:
        problems = runtime.admit(plan_of(tmp_path, drop_caches=False), host, lines.append, str(state / "paused.json"))
    finally:
        state.chmod(0o700)
    assert problems and "cannot be written" in problems[0] and "so nothing was stopped; free the disk" in problems[0]
    assert host.running["nvidia_gpu_exporter"] and "stop" not in host.kinds()


def test_a_full_disk_under_the_ledger_stops_nothing(tmp_path, monkeypatch):
    host, lines = Host({"nvidia_gpu_exporter": True}), []

    def full(path, text, mode):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runtime, "write_atomically", full)
    problems = runtime.admit(plan_of(tmp_path, drop_caches=False), host, lines.append, str(tmp_path / "paused.json"))
    assert problems[0].endswith("cannot be written (No space left on device), so nothing was stopped; free the disk")
    assert host.running["nvidia_gpu_exporter"] and "stop" not in host.kinds()


@pytest.mark.parametrize("fails_at", [2, 3], ids=["recording the second", "closing the ledger"])
def test_a_disk_that_fills_after_one_stop_names_what_was_stopped_and_keeps_its_record(tmp_path, monkeypatch, fails_at):
    host, writes, ledger = Host({"nvidia_gpu_exporter": True, "dcgm_exporter": True}), [], str(tmp_path / "paused.json")
    written = runtime.write_atomically

    def filling(path, text, mode):
        writes.append(text)
        if len(writes) >= fails_at:
            raise OSError(28, "No space left on device")
        written(path, text, mode)

    monkeypatch.setattr(runtime, "write_atomically", filling)
    stopped, problems = runtime.pause("a.service", ["nvidia_gpu_exporter", "dcgm_exporter"], host, print, ledger)
    stopped_now = ["nvidia_gpu_exporter"] if fails_at == 2 else ["nvidia_gpu_exporter", "dcgm_exporter"]
    assert stopped == stopped_now and problems == [
        f"{ledger}: the ledger of the containers stopped for starts cannot be written (No space left on device), so "
        f"{', '.join(stopped_now)} stopped for the start before it failed; free the disk"]
    assert json.loads(pathlib.Path(ledger).read_text())["nvidia_gpu_exporter"] == ["a.service"], "its release starts it again"


def test_a_refused_start_is_recorded_for_its_own_invocation_and_an_admitted_one_becomes_the_docker_run(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(runtime, "admit", lambda plan, run, log: ["llm: too little memory"])
    recorded = []
    monkeypatch.setattr(runtime, "record_refusal", lambda *args: recorded.append(args))
    assert runtime.start(plan_of(tmp_path), Host(), lines.append, "inv-1", ledger_dir=str(tmp_path)) == runtime.REFUSED == 78
    assert lines == ["start of llm refused, not retried: llm: too little memory"] and recorded == [("vllm-llm", "llm: too little memory", "inv-1")]
    monkeypatch.setattr(runtime, "admit", lambda plan, run, log: [])
    monkeypatch.setattr(runtime.os, "execv", became)
    plan = plan_of(tmp_path)
    with pytest.raises(BecameDockerRun) as executed:
        runtime.start(plan, Host(), lines.append, "inv-2", ledger_dir=str(tmp_path))
    assert executed.value.args == ("/usr/bin/docker", plan["docker_run"])


def test_a_refusal_is_read_only_by_its_own_start(tmp_path):
    folder = str(tmp_path / "admission")
    runtime.record_refusal("vllm-llm", "llm: too little memory", "inv-1", folder)
    assert runtime.refusal("vllm-llm", "inv-1", folder) == "the start was refused: llm: too little memory"
    assert runtime.refusal("vllm-llm", "inv-2", folder) is None, "another start's refusal"
    assert runtime.refusal("vllm-llm", None, folder) == "the start was refused: llm: too little memory"
    runtime.clear_refusal("vllm-llm", folder)
    runtime.clear_refusal("vllm-llm", folder)
    assert runtime.refusal("vllm-llm", None, folder) is None


def test_the_readiness_wait_ends_at_once_on_its_starts_refusal(tmp_path, monkeypatch):
    (tmp_path / "llm.env").write_text("VLLM_API_KEY=" + "k" * 20 + "\n")
    monkeypatch.setattr(runtime, "refusal", lambda container, invocation: "the start was refused: llm: too little memory")
    asked, lines = [], []
    status = runtime.ready(plan_of(tmp_path), Host(), lines.append, "inv-1", lambda url, key: asked.append(url) or Reply(None, "", "refused"))
    assert status == 1 and len(asked) == 1, "one poll, not a wait for the timeout"
    assert lines == ["vllm-llm: cold start, the start was refused: llm: too little memory after 0.0 s"]


def test_a_gb10_start_a_stray_holder_and_the_memory_refuse_is_named_with_seed_002s_figures(tmp_path):
    """Figures scaled to a GB10's 121.69 GiB of which 99 are free (seed 002): a share of 0.85 is refused with the numbers,
    and a process outside the collection's containers holding a device node is named in the same refusal."""
    figures = {"device": "cuda", "figure": "MemAvailable (integrated GPU, torch's is_integrated)", "free": 99 * GIB,
               "total": int(121.69 * GIB)}
    ran = []

    def tools(argv):
        ran.append(argv)
        if argv[0] == "/usr/bin/timeout":
            return 0, json.dumps(figures) + "\n", ""
        return (0, "c0ffee\n", "") if argv[1:2] == ["ps"] else (0, "", "")

    exporter = (4242, "nvidia_gpu_expo", ["/dev/nvidia0", "/dev/nvidiactl", "/dev/null"])
    persistenced = (1580, "nvidia-persistenced", ["/dev/nvidia0"])
    other_instance = (3131, "VLLM::EngineCore", ["/dev/nvidia0"])
    cgroups = {4242: "0::/system.slice/docker-beef.scope\n", 3131: "0::/system.slice/docker-c0ffee.scope\n"}
    gpus = unit_plan("tiny", options={"gpus": True})
    plan = plan_of(tmp_path, name="tiny", gpu_memory_utilization=0.85, paused_containers=[], drop_caches=False,
                   memory_probe=gpus["memory_probe"], docker_run=gpus["docker_run"])
    assert plan["memory_probe"] == memory_probe_argv(plan["run_image"], True)
    problems = runtime.admit(plan, tools, print, str(tmp_path / "paused.json"), str(tmp_path / "drop"), ("/dev/nvidia*",),
                             lambda: [exporter, persistenced, other_instance], cgroups.get)
    assert " | ".join(problems) == (
        "tiny: pid 4242 (nvidia_gpu_expo) holds /dev/nvidia0, /dev/nvidiactl: the start was not attempted; stop them first (a stale "
        "container: docker rm; a GPU exporter: stop it for the launch; what persists after that: reboot, seed 002) | tiny: "
        "gpu_memory_utilization 0.85 asks for 103.44 GiB of CUDA's total of 121.69 GiB in the image, but the free memory its vLLM "
        "compares that with, MemAvailable (integrated GPU, torch's is_integrated), is 99.00 GiB now; lower it, or free the memory "
        "first (stop what holds it; residue of failed starts on a GB10: reboot, and if the figure is still short after the reboot, "
        "cut the AC power, seed 002)")
    bounded = ["/usr/bin/timeout", "--signal=TERM", "--kill-after=10", "120", "/usr/bin/docker", "run", "--rm"]
    assert ran[-1] == plan["memory_probe"] and plan["memory_probe"][:7] == bounded and "--network" in plan["memory_probe"]


def started(ledger, plan, at, monkeypatch, admitted=True):
    """One start through the door at time ``at``, its starts counted in the folder ``ledger``: its exit status (None: it
    became the docker run)."""
    monkeypatch.setattr(runtime, "admit", lambda plan, run, log: [] if admitted else ["llm: too little memory"])
    monkeypatch.setattr(runtime.os, "execv", became)
    monkeypatch.setattr(runtime, "record_refusal", lambda *args: None)
    lines = []
    try:
        return runtime.start(plan, Host(), lines.append, "inv", clock=lambda: at, ledger_dir=str(ledger)), lines
    except BecameDockerRun:
        return None, lines


class BecameDockerRun(BaseException):
    """What execv does to the door in these tests: it never comes back."""


def became(path, argv):
    raise BecameDockerRun(path, argv)


def test_starts_are_bounded_whoever_causes_them_and_a_start_that_hangs_each_time_is_too(tmp_path, monkeypatch):
    """A boot, systemd's restart and the watchdog's restart all pass the door: the fourth start within the window is refused,
    also when each start hung until systemd gave up (2760 s apart, longer than systemd's former 1800 s window)."""
    plan = plan_of(tmp_path)
    window = plan["start_bound"]["window"]
    assert plan["start_bound"]["starts"] == 3 and window > 3 * 2760, "the role's bound holds three starts that each hang"
    hung = 2760 + 10
    assert [started(tmp_path, plan, 1000 + n * hung, monkeypatch)[0] for n in range(3)] == [None, None, None]
    status, lines = started(tmp_path, plan, 1000 + 3 * hung - 1, monkeypatch)
    assert status == runtime.REFUSED and lines == [
        f"start of llm refused, not retried: 3 starts within the last {window} s already, the bound on its starts whoever causes them "
        "(vllm_start_limit_burst); look at its journal, fix the cause, then re-apply site.yml, which relaunches it"]
    assert started(tmp_path, plan, 1000 + window + 1, monkeypatch)[0] is None, "the first start left the window"


def test_a_refused_start_counts_and_a_persons_relaunch_clears_the_count(tmp_path, monkeypatch):
    plan = plan_of(tmp_path)
    assert [started(tmp_path, plan, 10 + n, monkeypatch, admitted=False)[0] for n in range(3)] == [runtime.REFUSED] * 3
    assert "3 starts within the last" in started(tmp_path, plan, 20, monkeypatch)[1][0], "refusals by the admission are starts too"
    assert len(json.loads(pathlib.Path(start_record(plan["unit"], str(tmp_path))).read_text())) == 3, "a start refused by the bound is not one"
    runtime.clear_starts(plan["unit"], str(tmp_path))
    runtime.clear_starts(plan["unit"], str(tmp_path))
    assert started(tmp_path, plan, 21, monkeypatch)[0] is None


def test_a_start_that_cannot_be_counted_is_not_made(tmp_path, monkeypatch):
    plan = plan_of(tmp_path)

    def full(path, text, mode):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runtime, "write_atomically", full)
    status, lines = started(tmp_path, plan, 10, monkeypatch)
    assert status == runtime.REFUSED and lines[0].endswith(
        "the start cannot be counted (No space left on device), so it is not made; free the disk")


def test_a_container_recorded_as_stopped_but_running_again_is_stopped_again_and_one_that_will_not_start_is_kept(tmp_path):
    host, ledger = Host({"nvidia_gpu_exporter": True}), str(tmp_path / "paused.json")
    pathlib.Path(ledger).write_text(json.dumps({"nvidia_gpu_exporter": ["a.service"]}))
    assert runtime.pause("b.service", ["nvidia_gpu_exporter"], host, print, ledger) == (["nvidia_gpu_exporter"], [])
    assert json.loads(pathlib.Path(ledger).read_text()) == {"nvidia_gpu_exporter": ["a.service", "b.service"]}
    host.stuck.add("nvidia_gpu_exporter")
    assert runtime.release("a.service", host, print, ledger) == []
    problems = runtime.release("b.service", host, print, ledger)
    assert problems and "could not be started again" in problems[0]
    assert json.loads(pathlib.Path(ledger).read_text()) == {"nvidia_gpu_exporter": []}, "kept for the next release to try"
    host.stuck.clear()
    assert runtime.release("c.service", host, print, ledger) == [] and host.running["nvidia_gpu_exporter"]
    assert json.loads(pathlib.Path(ledger).read_text()) == {}


def test_a_docker_that_does_not_answer_is_named_not_taken_for_strays(tmp_path):
    def tools(argv):
        if argv[1:2] == ["ps"]:
            return 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
        return Host()(argv)

    problems = runtime.admit(plan_of(tmp_path, drop_caches=False, paused_containers=[]), tools, print, str(tmp_path / "paused.json"))
    assert problems[0].startswith("llm: docker ps did not answer (Cannot connect to the Docker daemon") and "check the Docker daemon" in problems[0]


def test_a_door_that_breaks_is_a_refusal_the_readiness_wait_hears_at_once(tmp_path, monkeypatch):
    recorded, lines = [], []
    monkeypatch.setattr(runtime, "record_refusal", lambda *args: recorded.append(args))
    monkeypatch.setattr(runtime, "clear_refusal", lambda container: recorded.append(("cleared", container)))
    monkeypatch.setattr(runtime, "admit", lambda plan, run, log: [])

    def broken(path, argv):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(runtime.os, "execv", broken)
    plan = plan_of(tmp_path, paused_containers=[])
    assert runtime.start(plan, Host(), lines.append, "inv-1", clock=lambda: 10, ledger_dir=str(tmp_path)) == runtime.REFUSED
    assert recorded[0] == ("cleared", "vllm-llm"), "a start forgets the last start's refusal first"
    assert recorded[1][0] == "vllm-llm" and "the start could not run (FileNotFoundError" in recorded[1][1]


def test_a_start_recorded_in_the_future_after_the_clock_stepped_back_still_counts(tmp_path, monkeypatch):
    plan = plan_of(tmp_path)
    assert [started(tmp_path, plan, 5000 + n, monkeypatch)[0] for n in range(3)] == [None, None, None]
    assert started(tmp_path, plan, 4000, monkeypatch)[0] == runtime.REFUSED
