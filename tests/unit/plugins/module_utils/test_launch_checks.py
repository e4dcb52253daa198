"""The checks right before a vLLM start: the memory probe's own text run by a real python3 (this machine has no GPU,
so it takes the CPU build's branch, as the lab image does), its figures judged, and the device nodes' holders."""

import json
import subprocess
import sys

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import (
    MEMORY_PROBE,
    holders_problem,
    memory_probe_argv,
    memory_problem,
    pause_containers,
    paused_containers_problems,
    probe_figures,
    resume_containers,
)

GIB = 1024**3


def test_the_probe_reports_the_kernels_available_memory_without_a_gpu():
    done = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, check=False)
    figures = probe_figures(done.returncode, done.stdout, done.stderr)
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo", encoding="ascii"))
    assert figures["device"] == "cpu" and figures["total"] == int(meminfo["MemTotal"].split()[0]) * 1024
    assert 0 < figures["free"] <= figures["total"]


def test_the_probe_is_the_plans_image_without_network_and_the_gpu_only_when_the_instance_gets_one():
    cpu, gpu = memory_probe_argv("registry.local/vllm@sha256:" + "a" * 64, False), memory_probe_argv("img", True)
    assert cpu[:9] == ["/usr/bin/docker", "run", "--rm", "--pull", "never", "--network", "none", "--security-opt", "no-new-privileges"]
    assert "--gpus" not in cpu and gpu[9:11] == ["--gpus", "all"] and cpu[-3:-1] == ["registry.local/vllm@sha256:" + "a" * 64, "-c"]


@pytest.mark.parametrize(("rc", "out", "err", "fragment"), [
    (125, "", "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].\n",
     "exited 125: docker: Error response from daemon: could not select device driver"),
    (1, "", "Traceback (most recent call last):\nRuntimeError: No CUDA GPUs are available\n", "exited 1: RuntimeError: No CUDA GPUs"),
    (0, "hello\n", "", "printed no memory figures: hello"),
    (0, json.dumps({"device": "cuda", "free": -1, "total": 10}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "free": 1, "total": 0}), "", "printed no memory figures"),
    (0, json.dumps({"device": "tpu", "free": 1, "total": 2}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "free": True, "total": 2}), "", "printed no memory figures"),
])
def test_a_probe_that_says_nothing_usable_is_named_and_refuses_the_start(rc, out, err, fragment):
    figures = probe_figures(rc, out, err)
    assert isinstance(figures, str) and figures.startswith(fragment), figures
    problem = memory_problem("llm", 0.5, figures)
    assert problem.startswith(f"llm: the memory check in a throwaway container of the image {fragment}")
    assert "the start was not attempted (vllm_memory_admission: false skips the check)" in problem


def test_the_share_is_judged_against_what_the_image_sees():
    gb10 = {"device": "cuda", "free": int(103.5 * GIB), "total": int(121.69 * GIB)}
    assert memory_problem("llm", 0.85, gb10) is None, "103.44 GiB wanted, 103.5 free"
    refused = memory_problem("llm", 0.90, gb10)
    assert refused.startswith("llm: gpu_memory_utilization 0.9 wants 109.52 GiB of the 121.69 GiB CUDA in the image sees, but only 103.50")
    lab = {"device": "cpu", "free": 19 * GIB, "total": 24 * GIB}
    assert "the CPU build in the image (the kernel's MemAvailable) sees" in memory_problem("tiny", 0.95, lab)


def test_only_holders_outside_the_collections_containers_block_a_start():
    holders = [{"pid": 10, "command": "python3", "paths": ["/dev/nvidia0"]}, {"pid": 11, "command": "exporter", "paths": ["/dev/nvidia0"]}]
    cgroups = {10: "0::/system.slice/docker-c0ffee.scope\n", 11: "0::/system.slice/docker-beef.scope\n"}
    problem = holders_problem("llm", holders, ["c0ffee"], cgroups.get)
    assert problem.startswith("llm: pid 11 (exporter) holds /dev/nvidia0: the start was not attempted") and "pid 10" not in problem
    assert holders_problem("llm", holders, ["c0ffee", "beef"], cgroups.get) is None
    assert holders_problem("llm", [], [], cgroups.get) is None


@pytest.mark.parametrize(("value", "fragment"), [
    ("nvidia_gpu_exporter", "must be a list of at most 16 container names"),
    (["x"] * 17, "must be a list of at most 16"),
    (["vllm-tiny"], "names one of the collection's own containers"),
    (["sparkfleet-gateway"], "names one of the collection's own containers"),
    (["a b"], "is not a container name"),
    (["--rm"], "is not a container name"),
    ([7], "is not a container name"),
    (["exporter", "exporter"], "names a container twice"),
])
def test_only_other_programs_containers_may_be_paused_for_a_launch(value, fragment):
    problems = paused_containers_problems("vllm_launch_paused_containers", value)
    assert problems and problems[0].startswith("vllm_launch_paused_containers") and fragment in " ".join(problems), problems
    assert paused_containers_problems("vllm_launch_paused_containers", ["nvidia_gpu_exporter", "dcgm-exporter.1"]) == []


class Docker:
    """Containers by name -> running, as docker answers; a name in ``stuck`` cannot be stopped or started."""

    def __init__(self, running, stuck=(), names=None):
        self.running, self.stuck, self.calls, self.names = dict(running), set(stuck), [], dict(names or {})

    def __call__(self, argv):
        self.calls.append(argv)
        name = argv[-1]
        if argv[1:3] == ["container", "inspect"]:
            if name not in self.running:
                return 1, "", f"Error: No such container: {name}"
            # Docker takes a name it does not know for an ID's prefix: "c0ffee" finds the instance container vllm-tiny.
            return 0, f"{str(self.running[name]).lower()} /{self.names.get(name, name)}\n", ""
        if name in self.stuck:
            return 1, "", f"Error response from daemon: cannot {argv[1]} container {name}"
        self.running[name] = argv[1] == "start"
        return 0, name + "\n", ""


def test_running_exporters_are_stopped_and_only_they_are_started_again():
    docker = Docker({"nvidia_gpu_exporter": True, "idle_exporter": False})
    stopped, problems = pause_containers(["nvidia_gpu_exporter", "idle_exporter", "absent"], docker)
    assert (stopped, problems) == (["nvidia_gpu_exporter"], []) and docker.running == {"nvidia_gpu_exporter": False, "idle_exporter": False}
    assert resume_containers(stopped, docker) == [] and docker.running["nvidia_gpu_exporter"]
    by_prefix = Docker({"c0ffee": True}, names={"c0ffee": "vllm-tiny"})
    assert pause_containers(["c0ffee"], by_prefix) == ([], []) and by_prefix.running["c0ffee"], "an ID prefix never stops another container"
    stuck = Docker({"nvidia_gpu_exporter": True}, stuck={"nvidia_gpu_exporter"})
    assert pause_containers(["nvidia_gpu_exporter"], stuck)[1] == [
        "nvidia_gpu_exporter could not be stopped for the launch: Error response from daemon: cannot stop container nvidia_gpu_exporter"]
    assert resume_containers(["nvidia_gpu_exporter"], stuck)[0].endswith("could not be started again: Error response from daemon: cannot "
                                                                         "start container nvidia_gpu_exporter; start it by hand")
