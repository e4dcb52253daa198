"""The checks right before a vLLM start: the memory probe's own text run by a real python3 (this machine has no GPU,
so it takes the CPU build's branch, as the lab image does) and, with a stand-in torch, through each GPU branch; its
figures judged, and the device nodes' holders."""

import builtins
import io
import json
import os
import subprocess
import sys
import types

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import (
    MEMORY_PROBE,
    PROBE_SECONDS,
    holders_problem,
    memory_probe_argv,
    memory_problem,
    paused_containers_problems,
    probe_figures,
)

GIB = 1024**3


def test_the_probe_reports_the_kernels_available_memory_without_a_gpu():
    done = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, check=False)
    figures = probe_figures(done.returncode, done.stdout, done.stderr)
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo", encoding="ascii"))
    assert figures["device"] == "cpu" and figures["total"] == int(meminfo["MemTotal"].split()[0]) * 1024
    assert figures["figure"] == "MemAvailable (CPU build)" and 0 < figures["free"] <= figures["total"]


GB10_TOTAL = int(121.69 * GIB)
CUDA_FREE = 99 * GIB
MEMINFO = "MemTotal:       127600748 kB\nMemFree:        120000000 kB\nMemAvailable:   122683392 kB\n"
MEM_AVAILABLE = 122683392 * 1024


def probe_on(monkeypatch, capsys, props, dev=("nvidia0", "nvidiactl", "null")):
    """The probe's own text run with a stand-in torch (CUDA's free 99 GiB of 121.69) and /dev and /proc/meminfo as given."""
    cuda = types.SimpleNamespace(mem_get_info=lambda: (CUDA_FREE, GB10_TOTAL), current_device=lambda: 0,
                                 get_device_properties=lambda index: props)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    real_listdir, real_open = os.listdir, builtins.open
    monkeypatch.setattr(os, "listdir", lambda path: list(dev) if path == "/dev" else real_listdir(path))
    opened = {**vars(builtins), "open": lambda path, *args, **kwargs: io.StringIO(MEMINFO) if path == "/proc/meminfo"
              else real_open(path, *args, **kwargs)}
    exec(MEMORY_PROBE, {"__builtins__": opened})  # the probe's own text, as the image's python3 runs it
    return probe_figures(0, capsys.readouterr().out, "")


INTEGRATED, DISCRETE = "MemAvailable (integrated GPU, {})", "cudaMemGetInfo (discrete GPU, {})"


@pytest.mark.parametrize(("props", "figure", "free"), [
    pytest.param(types.SimpleNamespace(major=12, minor=1, is_integrated=1), INTEGRATED.format("torch's is_integrated"), MEM_AVAILABLE,
                 id="gb10-by-torchs-attribute"),
    pytest.param(types.SimpleNamespace(major=9, minor=0, is_integrated=True), INTEGRATED.format("torch's is_integrated"), MEM_AVAILABLE,
                 id="any-capability-torch-calls-integrated"),
    pytest.param(types.SimpleNamespace(major=12, minor=1), INTEGRATED.format("compute capability 12.1"), MEM_AVAILABLE, id="gb10-by-vllms-list"),
    pytest.param(types.SimpleNamespace(major=8, minor=7), INTEGRATED.format("compute capability 8.7"), MEM_AVAILABLE, id="orin-by-list"),
    pytest.param(types.SimpleNamespace(major=11, minor=0), INTEGRATED.format("compute capability 11.0"), MEM_AVAILABLE, id="thor-by-list"),
    pytest.param(types.SimpleNamespace(major=12, minor=0, is_integrated=0), DISCRETE.format("torch's is_integrated"), CUDA_FREE,
                 id="rtx-by-torchs-attribute"),
    pytest.param(types.SimpleNamespace(major=12, minor=1, is_integrated=False), DISCRETE.format("torch's is_integrated"), CUDA_FREE,
                 id="torchs-attribute-wins-over-the-list"),
    pytest.param(types.SimpleNamespace(major=12, minor=0), DISCRETE.format("compute capability 12.0"), CUDA_FREE, id="rtx-by-list"),
    pytest.param(types.SimpleNamespace(major=9, minor=0), DISCRETE.format("compute capability 9.0"), CUDA_FREE, id="hopper-by-list"),
])
def test_the_free_memory_is_what_vllm_compares_with_on_the_device_kind_and_the_total_cudas(monkeypatch, capsys, props, figure, free):
    """Integrated (torch's is_integrated, else vLLM's compute-capability list): MemAvailable; discrete: cudaMemGetInfo's free."""
    figures = probe_on(monkeypatch, capsys, props)
    assert figures == {"device": "cuda", "figure": figure, "free": free, "total": GB10_TOTAL}


def test_a_container_without_the_gpus_nodes_reads_the_kernel_and_never_torch(monkeypatch, capsys):
    figures = probe_on(monkeypatch, capsys, None, dev=("null", "shm", "nvme0"))
    assert figures == {"device": "cpu", "figure": "MemAvailable (CPU build)", "free": MEM_AVAILABLE, "total": 127600748 * 1024}


def test_the_probe_is_the_plans_image_without_network_stopped_in_time_and_the_gpu_only_when_the_instance_gets_one():
    image = "registry.local/vllm@sha256:" + "a" * 64
    cpu, gpu = memory_probe_argv(image, False), memory_probe_argv("img", True)
    assert cpu[:5] == ["/usr/bin/timeout", "--signal=TERM", "--kill-after=10", str(PROBE_SECONDS), "/usr/bin/docker"]
    assert cpu[5:14] == ["run", "--rm", "--init", "--pull", "never", "--network", "none", "--security-opt", "no-new-privileges"]
    assert "--gpus" not in cpu and gpu[14:16] == ["--gpus", "all"] and cpu[-3:] == [image, "-c", MEMORY_PROBE]


DISCRETE = "cudaMemGetInfo (discrete GPU, torch's is_integrated)"


@pytest.mark.parametrize(("rc", "out", "err", "fragment"), [
    (124, "", "", f"did not answer within its time limit of {PROBE_SECONDS} s and was stopped"),
    (124, "", "Terminated\n", f"did not answer within its time limit of {PROBE_SECONDS} s"),
    (137, "", "", f"was killed (exit 137): it outlived its time limit of {PROBE_SECONDS} s and 10 s of grace, or the kernel's OOM"),
    (125, "", "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].\n",
     "exited 125: docker: Error response from daemon: could not select device driver"),
    (1, "", "Traceback (most recent call last):\nRuntimeError: No CUDA GPUs are available\n", "exited 1: RuntimeError: No CUDA GPUs"),
    (0, "hello\n", "", "printed no memory figures: hello"),
    (0, "", "", "printed no memory figures: nothing"),
    (0, "[1, 2]\n", "", "printed no memory figures: [1, 2]"),
    (0, "{\"device\": \"cuda\", \"free\": 1,", "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "figure": DISCRETE, "free": -1, "total": 10}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "figure": DISCRETE, "free": 1, "total": 0}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "figure": DISCRETE, "free": 1.5, "total": 2}), "", "printed no memory figures"),
    (0, json.dumps({"device": "tpu", "figure": DISCRETE, "free": 1, "total": 2}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "figure": DISCRETE, "free": True, "total": 2}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "free": 1, "total": 2}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "figure": "psutil", "free": 1, "total": 2}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "figure": DISCRETE + "; rm -rf /", "free": 1, "total": 2}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cuda", "figure": "MemAvailable (CPU build)", "free": 1, "total": 2}), "", "printed no memory figures"),
    (0, json.dumps({"device": "cpu", "figure": DISCRETE, "free": 1, "total": 2}), "", "printed no memory figures"),
])
def test_a_probe_that_says_nothing_usable_is_named_and_refuses_the_start(rc, out, err, fragment):
    figures = probe_figures(rc, out, err)
    assert isinstance(figures, str) and figures.startswith(fragment), figures
    problem = memory_problem("llm", 0.5, figures)
    assert problem.startswith(f"llm: the memory check in a throwaway container of the image {fragment}")
    assert "the start was not attempted (vllm_memory_admission: false skips the check)" in problem


def test_the_share_is_judged_against_the_figure_the_images_vllm_reads_and_named_by_it():
    gb10 = {"device": "cuda", "figure": "MemAvailable (integrated GPU, torch's is_integrated)", "free": int(103.5 * GIB), "total": GB10_TOTAL}
    assert memory_problem("llm", 0.85, gb10) is None, "103.44 GiB wanted, 103.5 free"
    refused = memory_problem("llm", 0.90, gb10)
    assert refused == ("llm: gpu_memory_utilization 0.9 asks for 109.52 GiB of CUDA's total of 121.69 GiB in the image, but the free "
                       "memory its vLLM compares that with, MemAvailable (integrated GPU, torch's is_integrated), is 103.50 GiB now; "
                       "lower it, or free the memory first (stop what holds it; residue of failed starts on a GB10: reboot, and if "
                       "the figure is still short after the reboot, cut the AC power, seed 002)")
    discrete = {"device": "cuda", "figure": DISCRETE, "free": 20 * GIB, "total": 32 * GIB}
    refused = memory_problem("rtx", 0.92, discrete)
    assert f", {DISCRETE}, is 20.00 GiB now" in refused and refused.endswith("(stop what holds it)"), "no GB10 advice on a discrete card"
    lab = {"device": "cpu", "figure": "MemAvailable (CPU build)", "free": 19 * GIB, "total": 24 * GIB}
    assert "of the kernel's MemTotal of 24.00 GiB in the image, but the free memory its vLLM compares that with, MemAvailable (CPU build)" \
        in memory_problem("tiny", 0.95, lab)


def test_the_share_is_rounded_up_to_whole_bytes_as_vllm_does():
    total = 1000
    assert memory_problem("llm", 0.5, {"device": "cpu", "figure": "MemAvailable (CPU build)", "free": 500, "total": total}) is None
    assert memory_problem("llm", 0.5005, {"device": "cpu", "figure": "MemAvailable (CPU build)", "free": 500, "total": total}), \
        "ceil(500.5) = 501 bytes wanted, 500 free"


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
