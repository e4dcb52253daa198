# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a vLLM start is checked against right before it (seed 002), private to the collection.

The memory as the pinned image's vLLM sees it: vLLM refuses to start when the free memory it reads
is below gpu_memory_utilization x CUDA's total ("Free memory on device ... less than desired GPU
memory utilization"). Which free figure it reads depends on the device kind: on an integrated GPU
(a GB10) it replaces cudaMemGetInfo's free by psutil's available memory, /proc/meminfo's
MemAvailable (vllm/utils/mem_utils.py MemorySnapshot.measure), on a discrete one it keeps CUDA's.
The image's own torch decides the kind in a throwaway container, as vLLM would, under a time limit.
A container handed no GPU (the CPU build) reports the kernel's available memory, which is what that
build draws on. And the processes holding the GPU's device nodes, read at the launch rather than only
at preflight: a zombie CUDA context or an exporter started since holds memory vLLM then lacks.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import math
import os
import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT

GIB = 1024**3
DEVICE_NODES = ("/dev/nvidia*",)
# Processes expected to hold the GPU's device nodes (seed 002: nvidia-persistenced is).
EXPECTED_HOLDERS = frozenset({"nvidia-persistenced"})
# Docker's container names; the collection's own (vllm-*, the gateway's sparkfleet-*) are never paused for a launch.
CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
OWN_PREFIXES = ("vllm-", "sparkfleet-")
MAX_PAUSED = 16
# seed 002's check, run by the image's python3: torch only when the container was handed a GPU (its device nodes exist).
# The free figure is the one vLLM takes on that device kind: MemAvailable (what psutil's available reads) on an integrated
# GPU, told by torch's is_integrated or, for a torch without it, vLLM's list of integrated compute capabilities before
# its PR #35356 (Jetson Orin 8.7, Thor 11.0, GB10 12.1); cudaMemGetInfo's on a discrete one. The total stays CUDA's.
MEMORY_PROBE = (
    "import json, os\n"
    "def meminfo():\n"
    "    info = dict(line.split(':', 1) for line in open('/proc/meminfo'))\n"
    "    return {name: int(info[name].split()[0]) * 1024 for name in ('MemTotal', 'MemAvailable')}\n"
    "if any(name.startswith('nvidia') for name in os.listdir('/dev')):\n"
    "    import torch\n"
    "    free, total = torch.cuda.mem_get_info()\n"
    "    props = torch.cuda.get_device_properties(torch.cuda.current_device())\n"
    "    if hasattr(props, 'is_integrated'):\n"
    "        integrated, why = bool(props.is_integrated), \"torch's is_integrated\"\n"
    "    else:\n"
    "        capability = '%d.%d' % (props.major, props.minor)\n"
    "        integrated, why = capability in ('8.7', '11.0', '12.1'), 'compute capability ' + capability\n"
    "    if integrated:\n"
    "        free, figure = meminfo()['MemAvailable'], 'MemAvailable (integrated GPU, ' + why + ')'\n"
    "    else:\n"
    "        figure = 'cudaMemGetInfo (discrete GPU, ' + why + ')'\n"
    "    print(json.dumps({'device': 'cuda', 'figure': figure, 'free': free, 'total': total}))\n"
    "else:\n"
    "    kib = meminfo()\n"
    "    print(json.dumps({'device': 'cpu', 'figure': 'MemAvailable (CPU build)', 'free': kib['MemAvailable'], 'total': kib['MemTotal']}))\n"
)
FIGURE = re.compile(r"(MemAvailable \((integrated GPU, [\w .']{1,40}|CPU build)\)|cudaMemGetInfo \(discrete GPU, [\w .']{1,40}\))")
# A hung probe (a CUDA initialisation or a Docker daemon that never answers) is stopped: GNU timeout sends TERM to the docker
# client, which forwards it to the container (sig-proxy), where --init's tini passes it to python3 (as PID 1 it would ignore
# it); KILL follows after the grace, and --rm removes the container.
TIMEOUT_CLIENT = "/usr/bin/timeout"
PROBE_SECONDS = 120
PROBE_KILL_AFTER = 10
TIMED_OUT = 124
KILLED = 137


def memory_probe_argv(image: str, gpus: bool, keeps_entrypoint: bool = False) -> list[str]:
    """The throwaway container that reads the memory: the plan's image, never pulled here (serving_host pulled and
    verified it), no network, the GPU handed over as the instance's own container gets it, stopped after
    PROBE_SECONDS. An image whose entrypoint must run (NGC's: CUDA forward compatibility) gets python3 as its command."""
    python = [image, "python3"] if keeps_entrypoint else ["--entrypoint", "python3", image]
    return [TIMEOUT_CLIENT, "--signal=TERM", f"--kill-after={PROBE_KILL_AFTER}", str(PROBE_SECONDS),
            DOCKER_CLIENT, "run", "--rm", "--init", "--pull", "never", "--network", "none", "--security-opt", "no-new-privileges",
            *(["--gpus", "all"] if gpus else []), *python, "-c", MEMORY_PROBE]


def probe_figures(rc: int, out: str, err: str) -> dict[str, t.Any] | str:
    """The probe's {device, figure, free, total} (bytes), or why it said nothing usable."""
    if rc == TIMED_OUT:
        return (f"did not answer within its time limit of {PROBE_SECONDS} s and was stopped (a CUDA initialisation or a Docker "
                "daemon that hangs; docker ps -a and the daemon's journal say which)")
    if rc == KILLED:
        return (f"was killed (exit {KILLED}): it outlived its time limit of {PROBE_SECONDS} s and {PROBE_KILL_AFTER} s of grace, "
                "or the kernel's OOM killer stopped it")
    if rc != 0:
        lines = (err or out).strip().splitlines()
        return f"exited {rc}: {lines[-1][-300:] if lines else 'no output'}"
    try:
        found = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        found = None
    if not isinstance(found, dict) or not figures_readable(found):
        return f"printed no memory figures: {out.strip()[-300:] or 'nothing'}"
    return found


def figures_readable(found: dict[str, t.Any]) -> bool:
    """Whether the probe's answer names its device and figure and gives whole, non-negative byte counts with a total."""
    if found.get("device") not in ("cuda", "cpu") or not isinstance(found.get("figure"), str) or not FIGURE.fullmatch(found["figure"]):
        return False
    if (found["device"] == "cpu") != (found["figure"] == "MemAvailable (CPU build)"):
        return False
    counts = [found.get(key) for key in ("free", "total")]
    return all(isinstance(count, int) and not isinstance(count, bool) and count >= 0 for count in counts) and found["total"] > 0


def memory_problem(name: str, share: float, figures: dict[str, t.Any] | str) -> str | None:
    """Why the memory the image's vLLM reads cannot grant ``share`` now, or None, by vLLM's own rule (it refuses when
    ceil(total x share) bytes exceed the free figure); a probe that failed is a refusal too: the start would meet the
    same device."""
    if isinstance(figures, str):
        return (f"{name}: the memory check in a throwaway container of the image {figures}; the start was not attempted "
                "(vllm_memory_admission: false skips the check)")
    wanted = math.ceil(share * figures["total"])
    if wanted <= figures["free"]:
        return None
    total = "CUDA's total" if figures["device"] == "cuda" else "the kernel's MemTotal"
    residue = ("; residue of failed starts on a GB10: reboot, and if the figure is still short after the reboot, cut the AC "
               "power, seed 002" if figures["figure"].startswith("MemAvailable (integrated") else "")
    return (f"{name}: gpu_memory_utilization {share} asks for {wanted / GIB:.2f} GiB of {total} of {figures['total'] / GIB:.2f} GiB "
            f"in the image, but the free memory its vLLM compares that with, {figures['figure']}, is {figures['free'] / GIB:.2f} GiB "
            f"now; lower it, or free the memory first (stop what holds it{residue})")


def open_files() -> t.Iterator[tuple[int, str, list[str]]]:
    """(pid, command, paths of its open files) of every process readable."""
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        pid = int(fd_dir.split("/")[2])
        paths = []
        try:
            entries = os.listdir(fd_dir)
        except OSError:
            continue
        for entry in entries:
            try:
                paths.append(os.readlink(os.path.join(fd_dir, entry)))
            except OSError:
                continue
        yield pid, read_text(f"/proc/{pid}/comm").strip(), paths


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def process_cgroup(pid: int) -> str:
    return read_text(f"/proc/{pid}/cgroup")


def device_holders(processes: t.Iterable[tuple[int, str, t.Sequence[str]]], patterns: t.Sequence[str]) -> list[dict[str, t.Any]]:
    """Processes other than the expected ones holding a device node matching ``patterns``;
    ``processes`` is (pid, command name, paths of its open files), as /proc/PID/fd reads."""
    holders = []
    for pid, command, paths in processes:
        held = sorted({path for path in paths if any(fnmatch.fnmatch(path, pattern) for pattern in patterns)})
        if held and command not in EXPECTED_HOLDERS:
            holders.append({"pid": pid, "command": command, "paths": held})
    return sorted(holders, key=lambda holder: holder["pid"])


def holders_problem(name: str, holders: t.Sequence[t.Mapping[str, t.Any]], own_containers: t.Collection[str],
                    cgroup_of: t.Callable[[int], str]) -> str | None:
    """Why another process holding the GPU's device nodes blocks the start, or None: the host's other instances and
    ranks (the collection's labelled containers) hold them by right, nvidia-persistenced too (device_holders)."""
    strays = [holder for holder in holders if not any(container in cgroup_of(holder["pid"]) for container in own_containers)]
    if not strays:
        return None
    held = "; ".join(f"pid {holder['pid']} ({holder['command']}) holds {', '.join(holder['paths'])}" for holder in strays)
    return (f"{name}: {held}: the start was not attempted; stop them first (a stale container: docker rm; a GPU exporter: stop it "
            "for the launch; what persists after that: reboot, seed 002)")


def paused_containers_problems(variable: str, value: t.Any) -> list[str]:
    """Why ``value`` is not a list of other programs' containers to stop around each launch (seed 002: the
    nvidia_gpu_exporter container holds about 9 GiB of the GPU's memory while it runs)."""
    if not isinstance(value, list) or len(value) > MAX_PAUSED:
        return [f"{variable}: {value!r} must be a list of at most {MAX_PAUSED} container names, such as [nvidia_gpu_exporter]"]
    problems = []
    for index, name in enumerate(value):
        if not isinstance(name, str) or not CONTAINER_NAME.fullmatch(name):
            problems.append(f"{variable}[{index}]: {name!r} is not a container name (letters, digits, '_.-', up to 128)")
        elif name.startswith(OWN_PREFIXES):
            problems.append(f"{variable}[{index}]: {name!r} names one of the collection's own containers ({', '.join(OWN_PREFIXES)}...), "
                            "which a launch must never stop; list only other programs' containers, such as nvidia_gpu_exporter")
    if len(set(map(str, value))) != len(value):
        problems.append(f"{variable}: names a container twice")
    return problems
