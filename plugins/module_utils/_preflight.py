# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is this host fit to serve its plan? The preflight verdict, from the host's facts, its hardware
class and its instance plan. Private to the collection.

Each check passes, fails, warns, or is ``remedied``: it fails now, but a role that runs later in
the same play fixes it (site.yml turns swap off; a standalone preflight changes nothing, so
there it fails). The verdict names every failing check at once.
"""

from __future__ import annotations

import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import RANGES
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import as_number, version_tuple

GIB = 1024**3
# What fills a serving host's disks unseen is reported with its size; past this it is a warning with the way to free it.
STORAGE_WARN_GIB = 50.0
ARCHITECTURES = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "amd64", "amd64": "amd64"}
# The first driver branch of each CUDA release (NVIDIA's CUDA toolkit release notes).
CUDA_DRIVER_BRANCH = {"12.8": 570, "12.9": 575, "13.0": 580, "13.1": 590}
NEWEST_KNOWN_CUDA = max(CUDA_DRIVER_BRANCH, key=version_tuple)
_CUDA_REQUIREMENT = re.compile(r"cuda>=(\d+\.\d+)")
_CUDA_VERSION = re.compile(r"^(\d+\.\d+)")


# The modules use Python 3.10 (zip(strict=...), X | Y types at run time); DGX OS ships 3.12, Debian 12 3.11.
HOST_PYTHON_FLOOR = (3, 10)


def host_python_problem(version_text: t.Any) -> str:
    """Why the host's Python cannot run the collection's modules ('' when it can), from ``python3 -c`` printing major.minor."""
    found = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", version_text) if isinstance(version_text, str) else None
    floor = ".".join(map(str, HOST_PYTHON_FLOOR))
    if not found:
        shown = repr(version_text[:80]) if isinstance(version_text, str) else repr(version_text)
        return (f"the host's Python version could not be read ({shown}): the collection's modules need "
                f"Python {floor} or later as python3, or set ansible_python_interpreter to one")
    if (int(found[1]), int(found[2])) < HOST_PYTHON_FLOOR:
        return (f"the host's Python is {found[1]}.{found[2]}; the collection's modules need {floor} or later (DGX OS ships 3.12): "
                "install a newer python3, or set ansible_python_interpreter to one")
    return ""


def check(name: str, ok: bool, detail: str, remedy: str | None = None, remedies: t.Collection[str] = (),
          warn_only: bool = False) -> dict[str, t.Any]:
    if ok:
        status = "pass"
    elif warn_only:
        status = "warn"
    elif remedy and remedy in remedies:
        status = "remedied"
        detail = f"{detail}; the {remedy} role fixes it in this run"
    else:
        status = "fail"
    return {"name": name, "status": status, "detail": detail}


def image_cuda(inspect: t.Mapping[str, t.Any]) -> str | None:
    """The CUDA release an image needs, from its labels or environment (NVIDIA_REQUIRE_CUDA, CUDA_VERSION)."""
    config = inspect.get("Config") or {}
    values = {**dict(line.split("=", 1) for line in config.get("Env") or [] if "=" in line), **(config.get("Labels") or {})}
    requirement = _CUDA_REQUIREMENT.search(values.get("NVIDIA_REQUIRE_CUDA", "") or values.get("com.nvidia.cuda.require", ""))
    if requirement:
        return requirement.group(1)
    version = _CUDA_VERSION.match(values.get("CUDA_VERSION", "") or values.get("com.nvidia.cuda.version", ""))
    return version.group(1) if version else None


def image_checks(images: t.Sequence[t.Mapping[str, t.Any]], facts: t.Mapping[str, t.Any],
                 min_cuda: str | None = None) -> list[dict[str, t.Any]]:
    """Each image (``{"ref", "inspect"}``, inspect None when not pulled yet) against the host, and against the class's
    CUDA floor (``min_cuda``): an image built for an older CUDA fails, one that declares no CUDA release is reported."""
    checks = []
    host_arch = ARCHITECTURES.get(facts["architecture"], facts["architecture"])
    branch = facts["gpu"]["driver_branch"]
    for image in images:
        inspect = image.get("inspect")
        name = f"image {image['ref']}"
        if not inspect:
            checks.append(check(name, True, "not on the host yet; checked again after the pull, before any launch"))
            continue
        arch = inspect.get("Architecture")
        if arch and ARCHITECTURES.get(arch, arch) != host_arch:
            checks.append(check(name, False, f"built for {arch}, the host is {facts['architecture']}; pull the {host_arch} image"))
            continue
        cuda = image_cuda(inspect)
        if min_cuda and not cuda:
            checks.append(check(f"{name} CUDA", False, f"declares no CUDA release (no NVIDIA_REQUIRE_CUDA, CUDA_VERSION or "
                                f"com.nvidia.cuda label), so it is not known to be built for CUDA {min_cuda} or newer, which "
                                "this class needs; check the image's build before trusting it", warn_only=True))
        elif min_cuda and version_tuple(cuda) < version_tuple(min_cuda):
            checks.append(check(f"{name} CUDA", False, f"built for CUDA {cuda}; this class needs CUDA {min_cuda} or newer "
                                "(seed 004: FlashInfer's JIT for GB10's sm_121 fails at load time on 12.8). Pin an image built "
                                "for CUDA 13 (cu130)"))
            continue
        if not cuda or not branch:
            checks.append(check(name, True, f"{arch or 'unknown'} image; " + ("needs CUDA " + cuda if cuda else "declares no CUDA release")
                                + ("" if branch else ", the host has no NVIDIA driver")))
            continue
        newer = version_tuple(cuda) > version_tuple(NEWEST_KNOWN_CUDA)
        needed = CUDA_DRIVER_BRANCH.get(cuda) or (CUDA_DRIVER_BRANCH[NEWEST_KNOWN_CUDA] + 1 if newer else 0)
        checks.append(check(name, int(branch) >= needed,
                            f"needs CUDA {cuda} (driver branch {needed} or later); the host runs {facts['gpu']['driver_version']}"
                            + ("" if int(branch) >= needed else ": the engine would fail at startup. Pin an image built for "
                               f"CUDA {max((v for v in CUDA_DRIVER_BRANCH if CUDA_DRIVER_BRANCH[v] <= int(branch)), key=version_tuple, default='?')}")))
    return checks


def settings_problems(min_free_disk_gib: t.Any, device_nodes: t.Any = None) -> list[str]:
    """The preflight role's own settings; ``device_nodes`` None when the caller does not pass them."""
    errors = []
    if min_free_disk_gib not in (None, ""):
        bound = RANGES["min_free_disk_gib"]
        problem = bound.problem("preflight_min_free_disk_gib", min_free_disk_gib)
        errors += [problem + "; or null for the hardware class's figure"] if problem else []
    if device_nodes is not None and (not isinstance(device_nodes, list) or not device_nodes
                                     or not all(isinstance(n, str) and n.startswith("/") for n in device_nodes)):
        errors.append(f"preflight_device_nodes: {device_nodes!r} must list the GPU's device nodes, absolute globs such as "
                      "/dev/nvidia*; without them no stray holder of the GPU is found (seed 002's zombie CUDA context)")
    return errors


def preflight(facts: t.Mapping[str, t.Any], hardware_class: str, hardware: t.Mapping[str, t.Any],
              instances: t.Sequence[t.Mapping[str, t.Any]], images: t.Sequence[t.Mapping[str, t.Any]] = (),
              missing_weights_gib: float = 0.0, min_free_disk_gib: t.Any = None,
              remedies: t.Collection[str] = (), device_nodes: t.Any = None) -> dict[str, t.Any]:
    """The verdict: ``ok``, ``checks`` (name, status pass/fail/warn/remedied, detail) and ``reasons`` (the failures).
    Settings out of range are the only reasons when there are any: no check runs on them."""
    refused = settings_problems(min_free_disk_gib, device_nodes)
    if refused:
        return {"ok": False, "checks": [], "reasons": refused, "warnings": [], "lines": refused}
    min_free_disk_gib = None if min_free_disk_gib in (None, "") else as_number(min_free_disk_gib)
    checks = []
    board = facts["board"]
    wanted_board = hardware["board"]
    checks.append(check("board", wanted_board == "any" or board["kind"] == wanted_board,
                        f"{board['kind']} ({board['vendor'] or '?'} {board['product'] or '?'}); sparkfleet_hardware_class is "
                        f"{hardware_class}" + ("" if wanted_board == "any" or board["kind"] == wanted_board
                                               else f", which is a {wanted_board} board. Fix the host's group")))
    gpu = facts["gpu"]
    if hardware["gpu"]:
        checks.append(check("gpu", gpu["present"], f"{gpu['name']}, compute capability {gpu['compute_capability']}"
                            if gpu["present"] else f"{gpu['detail']}; the {hardware_class} class serves on a GPU"))
        if gpu["present"] and hardware["compute_capability"]:
            checks.append(check("compute capability", gpu["compute_capability"] == hardware["compute_capability"],
                                f"{gpu['compute_capability']}, the class expects {hardware['compute_capability']}"))
    else:
        checks.append(check("gpu", True, "no GPU expected (the CPU build)" + (f"; {gpu['detail']}" if gpu["detail"] else "")))
    if hardware["driver_branch"]:
        checks.append(check("driver branch", gpu["driver_branch"] == hardware["driver_branch"],
                            f"{gpu['driver_version'] or 'none'}; the class needs branch {hardware['driver_branch']} "
                            f"({hardware['sources'].get('driver_branch', '')})"))
    swap = facts["swap"]
    swap_parts = [f"active: {', '.join(s['device'] for s in swap['active'])}" if swap["active"] else "",
                  f"in /etc/fstab: {', '.join(swap['fstab'])} (returns at boot)" if swap["fstab"] else ""]
    checks.append(check("swap off", not swap["active"] and not swap["fstab"],
                        "; ".join(p for p in swap_parts if p) or "no swap active or configured",
                        remedy="swap", remedies=remedies))
    checks += memory_checks(facts, hardware, instances)
    holders = [h for h in facts["device_holders"] if not h.get("container")]
    checks.append(check("device holders", not holders,
                        "; ".join(f"pid {h['pid']} ({h['command']}) holds {', '.join(h['paths'])}" for h in holders)
                        + ": stop them (a stale container: docker rm; what persists: reboot, seed 002)" if holders
                        else "only nvidia-persistenced and the instances' own engines hold the device nodes"))
    need = (hardware["min_free_disk_gib"] if min_free_disk_gib is None else min_free_disk_gib) + missing_weights_gib
    free = facts["disk"]["free_bytes"] / GIB
    checks.append(check("free disk", free >= need,
                        f"{free:.2f} GiB free at {facts['disk']['path']}, need {need:.2f} GiB"
                        + (f" ({missing_weights_gib:.2f} GiB of checkpoints still to stage)" if missing_weights_gib else "")
                        + ("" if free >= need else reclaimable_hint(facts.get("storage") or {}))))
    checks += storage_checks(facts.get("storage") or {})
    if instances:
        docker = facts["docker"]
        checks.append(check("docker", docker["present"], f"Docker {docker['version']}" if docker["present"]
                            else "no Docker engine answers; the instances run as containers"))
        if hardware["gpu"]:
            checks.append(check("nvidia container runtime", docker["nvidia_runtime"],
                                f"runtimes: {', '.join(docker['runtimes']) or 'none'}"
                                + ("" if docker["nvidia_runtime"] else "; install the NVIDIA Container Toolkit and run "
                                   "nvidia-ctk runtime configure --runtime=docker")))
    if hardware["gpu"]:
        states = facts["sleep_targets"]
        awake = sorted(unit for unit, state in states.items() if state not in ("masked", "not-found"))
        detail = (f"{', '.join(f'{u} is {states[u]}' for u in awake)}: sleep/wake triggers the power-delivery wedge (seed 002)"
                  if awake else "sleep, suspend and hibernate are masked" if states
                  else f"systemd did not answer for the sleep targets ({facts.get('sleep_targets_error') or 'systemctl show named none'}), "
                  "so none is known to be masked; check that systemd runs on the host (systemctl is-system-running)")
        checks.append(check("sleep targets masked", bool(states) and not awake, detail, remedy="headless", remedies=remedies))
    if hardware["power_wedge_check"]:
        power = facts["power"]
        checks.append(check("power delivery", not power["wedge_suspected"], power["reason"]))
    checks += image_checks(images, facts, hardware.get("min_image_cuda"))
    failures = [f"{c['name']}: {c['detail']}" for c in checks if c["status"] == "fail"]
    return {"ok": not failures, "checks": checks, "reasons": failures,
            "warnings": [f"{c['name']}: {c['detail']}" for c in checks if c["status"] == "warn"],
            "lines": [f"{c['status'].upper()} {c['name']}: {c['detail']}" for c in checks]}


def gib_text(usage: t.Mapping[str, t.Any]) -> str:
    """A folder's usage as a report says it: a walk cut short gives a lower bound."""
    return f"{'at least ' if not usage['complete'] else ''}{usage['used_bytes'] / GIB:.2f} GiB"


def reclaimable_hint(storage: t.Mapping[str, t.Any]) -> str:
    """What a full weights disk could get back, for the free disk check's failure."""
    hints = []
    if storage.get("docker_reclaimable_bytes"):
        hints.append(f"docker system df says {storage['docker_reclaimable_bytes'] / GIB:.2f} GiB is reclaimable")
    var_tmp = storage.get("var_tmp") or {}
    if var_tmp.get("used_bytes"):
        hints.append(f"/var/tmp holds {gib_text(var_tmp)}")
    return f"; {', '.join(hints)} (on that disk only if it is the same filesystem)" if hints else ""


def storage_checks(storage: t.Mapping[str, t.Any]) -> list[dict[str, t.Any]]:
    """What fills a serving host's disks unseen, each reported with its size and a warning past STORAGE_WARN_GIB: /var/tmp
    (a GX10's grew to 303 GB, epappas/gx10-cluster), Docker's reclaimable space and the Hugging Face cache the engines
    share. None fails a host: none of it is the collection's to delete."""
    checks = []
    var_tmp = storage.get("var_tmp")
    if var_tmp and var_tmp["exists"]:
        large = var_tmp["used_bytes"] / GIB >= STORAGE_WARN_GIB
        checks.append(check("/var/tmp", not large, f"{gib_text(var_tmp)} in /var/tmp, {var_tmp['free_bytes'] / GIB:.2f} GiB free on its "
                            "filesystem" + ("; nothing of the collection's is there: find what writes it and clear it (a GX10's grew "
                                            "to 303 GB)" if large else ""), warn_only=True))
    reclaimable = storage.get("docker_reclaimable_bytes")
    if reclaimable is not None:
        large = reclaimable / GIB >= STORAGE_WARN_GIB
        checks.append(check("docker reclaimable", not large, f"{reclaimable / GIB:.2f} GiB of images, containers, volumes and build "
                            "cache no container uses" + ("; docker image prune and docker builder prune free it (keep the image a "
                                                         "rollback returns to)" if large else ""), warn_only=True))
    hf_cache = storage.get("hf_cache")
    if hf_cache and hf_cache["exists"]:
        checks.append(check("hf cache", True, f"{gib_text(hf_cache)} in {hf_cache['path']}, which every engine of this host mounts"))
    return checks


def memory_checks(facts: t.Mapping[str, t.Any], hardware: t.Mapping[str, t.Any],
                  instances: t.Sequence[t.Mapping[str, t.Any]]) -> list[dict[str, t.Any]]:
    memory = facts["memory"]
    pool, available = memory["pool_bytes"], memory["available_bytes"]
    if not pool or available is None:
        return [check("memory", False, f"{memory['source']} reports no total or available memory")]
    if not instances:
        return [check("memory for the plan", True, f"no instances planned; {available / GIB:.2f} GiB available of {pool / GIB:.2f} GiB")]
    running = facts["docker"].get("instance_containers") or []
    planned = sum(i["gpu_memory_utilization"] for i in instances)
    if running:
        return [check("memory for the plan", True, f"{len(running)} instance(s) already run and hold their share; each "
                      "launch is checked against the memory available at that moment")]
    checks = [check("memory for the plan", available >= planned * pool,
                    f"{available / GIB:.2f} GiB available of {pool / GIB:.2f} GiB ({memory['source']}); the plan takes "
                    f"{planned:.2f} of it, {planned * pool / GIB:.2f} GiB"
                    + ("" if available >= planned * pool else ": stop what holds memory, drop caches, or lower the fractions"))]
    baseline = hardware["free_memory_baseline_gib"]
    if baseline and hardware["gpu"]:
        checks.append(baseline_check(available, baseline, memory["source"]))
    return checks


def baseline_check(available: int, baseline: float, source: str) -> dict[str, t.Any]:
    """The available memory against what a clean boot of the class leaves: on a GB10 /proc/meminfo's MemAvailable, the
    free figure vLLM compares its share with on an integrated GPU, so a shortfall is memory the next launch lacks. A
    warning: the launch's own check is the refusal."""
    figure = "MemAvailable" if source == "/proc/meminfo" else f"free by {source}"
    found = f"{available / GIB:.2f} GiB {figure}, the free figure vLLM reads on this kind of GPU; a clean boot of this class leaves about {baseline} GiB"
    if available / GIB >= baseline:
        return check("clean-boot baseline", True, found)
    return check("clean-boot baseline", False, f"{found}, {baseline - available / GIB:.2f} GiB more. Stop what holds memory (the "
                 "desktop, which the headless role masks; an exporter; a stale container), then reboot; if the figure is still "
                 f"below {baseline} GiB after the reboot, cut the AC power: a reboot keeps the GB10's allocator state on standby "
                 "power (seed 002, residue of failed launches)", warn_only=True)
