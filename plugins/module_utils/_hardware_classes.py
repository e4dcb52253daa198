# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hardware classes as data: what a kind of box can take, and where each value comes from.

Private to the collection. A host names its class with ``sparkfleet_hardware_class`` (a group
variable, as on a real fleet) and may override single values with
``sparkfleet_hardware_overrides``. ``resolve_class`` returns the values and every problem at
once; the instance plan and the preflight read the values, nothing else repeats them.
"""

from __future__ import annotations

import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import Range
from ansible_collections.sparkfleet.vllm.plugins.module_utils._nvidia_driver import KERNEL_LINE_FORMAT

GB10_ENV_SOURCE = (
    "seed 002: MAX_JOBS=2 and FLASHINFER_NVCC_THREADS=1 stop FlashInfer's JIT from spawning 20-32 compiler processes "
    "that OOM-kill the box; VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 makes vLLM estimate rather than capture CUDA "
    "graphs while profiling (the Founders Edition's num_gpu_blocks=0 OOM)"
)
GB10_CUDA_SOURCE = (
    "seed 004: FlashInfer's just-in-time compilation for sm_121 needs CUDA 12.9 or newer, so a container pinned to CUDA 12.8 "
    "fails at load time; use the CUDA 13 build"
)
GB10_POOL_SOURCE = (
    "seed 002 lines 187 and 597: CUDA's total on a GB10 is 121.69 GiB of the 128 GB (cudaMemGetInfo's total, which vLLM "
    "multiplies by gpu_memory_utilization; /proc/meminfo's MemTotal says the same)"
)
GB10_RESIDUE = (
    "; less means residue of failed launches: reboot, and if MemAvailable is still below it after the reboot, cut the AC "
    "power (seed 002 line 23: a reboot keeps the GB10's allocator state on standby power)"
)
GB10_FLAVOUR_SOURCE = (
    "DGX OS ships nvidia-driver-580-open: Blackwell initialises only with the open kernel modules (the proprietary 580.173.02 "
    "modules never bring up a GB10: Xid 169, RmInitAdapter failed; issue 41's field reading)"
)
GB10_KERNEL_SOURCE = (
    "DGX OS 7 and NVIDIA's playbooks run 6.17 kernels (6.17.0-10xx-nvidia); the 7.x kernels the linux-nvidia-hwe metapackage "
    "moves to have a RoCE regression on the ConnectX-7 link (issue 41's field reading, 12-01)"
)
GB10_LEFT_OUT = {
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True": "seed 002's A/B on a Founders Edition: OOM crash at 0.85 "
    "(exit 255). Seed 000 ran it at 0.55 on a shared box without harm; add it to vllm_env only at low utilisation",
    "VLLM_MARLIN_USE_ATOMIC_ADD=1": "seed 002's A/B: 46.2 against 47.5 tok/s and it needed 0.84 to boot; seed 000 pairs it "
    "with --moe-backend marlin, so add it with that backend",
    "VLLM_USE_FLASHINFER_SAMPLER=0": "seed 002's A/B: 47.3 against 47.5 tok/s, within noise",
}

# Every class has every field; ``sources`` says where each value comes from.
CLASSES: dict[str, dict[str, t.Any]] = {
    "dgx_spark": {
        "title": "NVIDIA DGX Spark (Founders Edition), GB10",
        "board": "dgx_spark",
        "gpu": True,
        "unified_memory": True,
        "compute_capability": "12.1",
        "pool_gib": 121.69,
        "gmu_ceiling": 0.85,
        "max_num_batched_tokens": 32768,
        "free_memory_baseline_gib": 117.0,
        "shm_size_ceiling_gib": 64,
        "driver_branch": "580",
        "driver_flavour": "open",
        "kernel_line": "6.17",
        "min_image_cuda": "12.9",
        "production": True,
        "drop_caches": True,
        "power_wedge_check": False,
        "min_free_disk_gib": 170,
        "env": {"MAX_JOBS": "2", "FLASHINFER_NVCC_THREADS": "1", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1"},
        "left_out_env": GB10_LEFT_OUT,
        "sources": {
            "min_image_cuda": GB10_CUDA_SOURCE,
            "pool_gib": GB10_POOL_SOURCE + "; seed 004 too",
            "gmu_ceiling": "seed 002 line 280: 0.85 validated on both boards (0.85 x 121.69 = 103.44 GiB, under the clean-boot "
            "117 GiB); 0.90 failed in its runs (107.82 GiB free < 109.52 needed) and is unvalidated after Phase 0 (line 564)",
            "max_num_batched_tokens": "seed 001: swept 4096/8192/32768; 32768 keeps p99 ITL low, 4096 buys 7-14 % on dense "
            "models at 5-15x worse p99 ITL",
            "free_memory_baseline_gib": "seed 002 lines 106 and 164: ~117-118 GiB free after Phase 0 and a reboot on the Founders "
            "Edition, the MemAvailable vLLM compares with on an integrated GPU (the older ~99 GiB was cudaMemGetInfo's view, "
            "docs/hardware.md)" + GB10_RESIDUE,
            "shm_size_ceiling_gib": "seed 002's TP=2 launch: --shm-size 64g",
            "driver_branch": "seed 000: 580; 590 had a CUDA-graph deadlock on GB10",
            "driver_flavour": GB10_FLAVOUR_SOURCE,
            "kernel_line": GB10_KERNEL_SOURCE,
            "drop_caches": "seed 002: flush the page cache before every launch on the unified pool",
            "min_free_disk_gib": "seed 002: ~170 GB for models and build",
            "env": GB10_ENV_SOURCE,
        },
    },
    "asus_gx10": {
        "title": "ASUS Ascent GX10, GB10",
        "board": "asus_gx10",
        "gpu": True,
        "unified_memory": True,
        "compute_capability": "12.1",
        "pool_gib": 121.69,
        "gmu_ceiling": 0.85,
        "max_num_batched_tokens": 32768,
        "free_memory_baseline_gib": 106.0,
        "shm_size_ceiling_gib": 64,
        "driver_branch": "580",
        "driver_flavour": "open",
        "kernel_line": "6.17",
        "min_image_cuda": "12.9",
        "production": True,
        "drop_caches": True,
        "power_wedge_check": True,
        "min_free_disk_gib": 170,
        "env": {"MAX_JOBS": "2", "FLASHINFER_NVCC_THREADS": "1", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1"},
        "left_out_env": GB10_LEFT_OUT,
        "sources": {
            "min_image_cuda": GB10_CUDA_SOURCE,
            "pool_gib": GB10_POOL_SOURCE + "; the same SoC as the Spark",
            "gmu_ceiling": "seed 002 lines 42, 100 and 280: 0.85 on the GX10 (103.44 GiB of its clean-boot 106, validated); "
            "its node table's 0.87 asks for 105.87 GiB, 0.13 GiB under the ~106 measured, less than the figure's own rounding",
            "max_num_batched_tokens": "seed 001 (same SoC as the Spark)",
            "free_memory_baseline_gib": "seed 002 lines 39, 42 and 165: ~106 GiB free after Phase 0 and a reboot on the GX10, "
            "its hardware ceiling (the older ~103 GiB was cudaMemGetInfo's view, docs/hardware.md)" + GB10_RESIDUE,
            "shm_size_ceiling_gib": "seed 002's TP=2 launch: --shm-size 64g",
            "driver_branch": "seed 000: 580 on GB10",
            "driver_flavour": GB10_FLAVOUR_SOURCE,
            "kernel_line": GB10_KERNEL_SOURCE,
            "drop_caches": "seed 002: flush the page cache before every launch",
            "power_wedge_check": "seed 002: the GX10's USB-C power-delivery firmware wedge pins the GPU under 1 GHz and "
            "15 W under load; OOM kills, sleep/wake and crash loops trigger it",
            "min_free_disk_gib": "seed 002: ~170 GB for models and build",
            "env": GB10_ENV_SOURCE + "; the GX10 tolerates their absence, they cost nothing there",
        },
    },
    "rtx_pro_6000": {
        "title": "NVIDIA RTX PRO 6000 Blackwell (96 GB), discrete",
        "board": "any",
        "gpu": True,
        "unified_memory": False,
        "compute_capability": "12.0",
        "pool_gib": 95.0,
        "gmu_ceiling": 0.92,
        "max_num_batched_tokens": 32768,
        "free_memory_baseline_gib": None,
        "shm_size_ceiling_gib": 32,
        "driver_branch": None,
        "driver_flavour": None,
        "kernel_line": None,
        "min_image_cuda": None,
        "production": True,
        "drop_caches": False,
        "power_wedge_check": False,
        "min_free_disk_gib": 100,
        "env": {},
        "left_out_env": {
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True": "no seed measured it on a discrete card; vLLM's own "
            "allocator settings apply",
        },
        "sources": {
            "min_image_cuda": "the notes name no floor for sm_120",
            "pool_gib": "seed 001: a 96 GB card; the total nvidia-smi reports on the host is used whenever it is known",
            "gmu_ceiling": "seed 001: 0.92 verified safe for Gemma 4 under 8k prompts at 64 concurrent; higher can OOM "
            "after the KV cache is allocated",
            "max_num_batched_tokens": "seed 001: lowering it bought at most 2.6 % here",
            "shm_size_ceiling_gib": "sized for a workstation; the containers share the host's /dev/shm (--ipc=host)",
            "driver_branch": "seed 001: a recent driver; the 580 pin is a GB10 lesson",
            "min_free_disk_gib": "seed 001: the five Gemma 4 checkpoints with their drafters",
        },
    },
    "rtx_5090": {
        "title": "NVIDIA RTX 5090 (32 GB), discrete",
        "board": "any",
        "gpu": True,
        "unified_memory": False,
        "compute_capability": "12.0",
        "pool_gib": 31.84,
        "gmu_ceiling": 0.92,
        "max_num_batched_tokens": 8192,
        "free_memory_baseline_gib": None,
        "shm_size_ceiling_gib": 16,
        "driver_branch": None,
        "driver_flavour": None,
        "kernel_line": None,
        "min_image_cuda": None,
        "production": True,
        "drop_caches": False,
        "power_wedge_check": False,
        "min_free_disk_gib": 60,
        "env": {},
        "left_out_env": {
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True": "no seed measured it on a discrete card",
        },
        "sources": {
            "min_image_cuda": "the notes name no floor for sm_120",
            "pool_gib": "seed 001: 32,607 MiB",
            "gmu_ceiling": "seed 001: 0.92; usage peaked at 31,092 of 32,607 MiB with MTP",
            "max_num_batched_tokens": "seed 001: the stock 32768 does not start the 26B-A4B at full context on 32 GB; "
            "8192 leaves 10.92 GiB of KV cache",
            "shm_size_ceiling_gib": "sized for a workstation",
            "min_free_disk_gib": "seed 001: one model with its drafter",
        },
    },
    "cpu_lab": {
        "title": "The local lab: systemd containers running vLLM's CPU build",
        "board": "any",
        "gpu": False,
        "unified_memory": True,
        "compute_capability": None,
        "pool_gib": None,
        "gmu_ceiling": 0.9,
        "max_num_batched_tokens": None,
        "free_memory_baseline_gib": None,
        "shm_size_ceiling_gib": 2,
        "driver_branch": None,
        "driver_flavour": None,
        "kernel_line": None,
        "min_image_cuda": None,
        "production": False,
        "drop_caches": False,
        "power_wedge_check": False,
        "min_free_disk_gib": 1,
        "env": {},
        "left_out_env": {},
        "sources": {
            "min_image_cuda": "the CPU build needs no CUDA",
            "gmu_ceiling": "the lab's instances take 0.1 each; the CPU build sizes its KV cache by block count",
            "production": "eager mode is how the CPU build starts fast; no CUDA graphs exist to lose",
            "drop_caches": "a container cannot write /proc/sys/vm/drop_caches",
            "shm_size_ceiling_gib": "vLLM's CPU build needs about 160 MiB of /dev/shm",
        },
    },
}

FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "gmu_ceiling": ((float, int), "highest sum of gpu_memory_utilization on the host"),
    "max_num_batched_tokens": ((int, type(None)), "max_num_batched_tokens of instances that set none"),
    "free_memory_baseline_gib": ((float, int, type(None)), "the free figure vLLM reads after a clean boot "
                                 "(MemAvailable on an integrated GPU); less means residue"),
    "shm_size_ceiling_gib": ((int, float), "largest /dev/shm a container may ask for"),
    "pool_gib": ((float, int, type(None)), "memory the GPU sees, when the host cannot report it"),
    "driver_branch": ((str, type(None)), "the NVIDIA driver branch the host must run"),
    "driver_flavour": ((str, type(None)), "the kernel-module flavour the driver must have: open, or null for either"),
    "kernel_line": ((str, type(None)), "the kernel line (major.minor) validated on the board, or null for any"),
    "min_image_cuda": ((str, type(None)), "the oldest CUDA release a vLLM image may be built for"),
    "production": ((bool,), "warn about debugging settings such as enforce_eager"),
    "drop_caches": ((bool,), "drop the page cache right before each launch"),
    "power_wedge_check": ((bool,), "judge the clock and power under load against the power-delivery wedge"),
    "min_free_disk_gib": ((int, float), "free disk the models directory needs besides the staged checkpoints"),
    "env": ((dict,), "environment every instance gets"),
}
OVERRIDABLE = tuple(FIELDS)
# Sizes without a pool to hold them to (a class without pool_gib, the CPU lab) stay under this.
LARGEST_POOL_GIB = 1024
# Each bound keeps the check the value drives meaningful: a zero or negative figure would pass every
# host, a figure beyond any GPU is a typo (MiB for GiB). The pool bounds the figures taken from it.
RANGES: dict[str, Range] = {
    "gmu_ceiling": Range(0, 1, "the whole pool leaves nothing for the OS and the engine's own CUDA context",
                         low_open=True, high_open=True),
    "max_num_batched_tokens": Range(1, 2**20, "tokens in one scheduler step; no pool holds the activations of more "
                                    "than 1M", whole=True),
    "pool_gib": Range(0, LARGEST_POOL_GIB, "memory one GPU sees; the memory arithmetic divides it up", low_open=True,
                      unit="GiB"),
    "min_free_disk_gib": Range(0, 65536, "0 or less would pass a full disk", low_open=True, unit="GiB"),
}
# Figures that are part of the pool, with why: bounded above 0 and by pool_gib.
WITHIN_POOL = {
    "free_memory_baseline_gib": "memory free after a clean boot; 0 or less would hide crash-loop residue",
    "shm_size_ceiling_gib": "the /dev/shm a container may ask for comes out of the pool",
}
DRIVER_BRANCH = re.compile(r"\d{3}")
DRIVER_FLAVOURS = ("open",)
CUDA_RELEASE = re.compile(r"\d{2}\.\d{1,2}")


def resolve_class(name: t.Any, overrides: t.Any = None) -> dict[str, t.Any]:
    """``{"name", "values", "errors"}``: the class's values with the inventory's overrides."""
    if not isinstance(name, str) or name not in CLASSES:
        return {"name": name, "values": {}, "errors": [
            f"sparkfleet_hardware_class: {name!r} is not a hardware class; set it (a group variable) to one of "
            f"{', '.join(CLASSES)}"]}
    overrides = {} if overrides is None else overrides
    if not isinstance(overrides, dict):
        return {"name": name, "values": {}, "errors": ["sparkfleet_hardware_overrides: must be a mapping of class values"]}
    errors = []
    for key, value in overrides.items():
        if key not in FIELDS:
            errors.append(f"sparkfleet_hardware_overrides.{key}: not a value a class has; overridable: {', '.join(OVERRIDABLE)}")
        elif (isinstance(value, bool) and bool not in FIELDS[key][0]) or not isinstance(value, FIELDS[key][0]):
            errors.append(f"sparkfleet_hardware_overrides.{key}: {value!r} has the wrong type ({FIELDS[key][1]})")
    values = {**CLASSES[name], **({} if errors else overrides)}
    if not errors:
        errors = range_problems(name, values, overrides)
    return {"name": name, "values": values if not errors else {}, "errors": errors}


def range_problems(name: str, values: t.Mapping[str, t.Any], overrides: t.Mapping[str, t.Any]) -> list[str]:
    """The class's values with the overrides, each in its range; a shipped value out of range only
    through an overridden pool_gib is named at pool_gib."""
    errors = []
    for key, bound in RANGES.items():
        if values[key] is not None:
            errors += bound.problems(f"sparkfleet_hardware_overrides.{key}", values[key])
    pool = values["pool_gib"] if values["pool_gib"] is not None and RANGES["pool_gib"].contains(values["pool_gib"]) else None
    ceiling = pool or LARGEST_POOL_GIB
    for key, why in WITHIN_POOL.items():
        value = values[key]
        if value is None:
            continue
        bound = Range(0, ceiling, why + (f"; the pool is {pool} GiB" if pool else ""), low_open=True, unit="GiB")
        problem = bound.problem(f"sparkfleet_hardware_overrides.{key}", value)
        if problem and key not in overrides and "pool_gib" in overrides:
            problem = (f"sparkfleet_hardware_overrides.pool_gib: {pool!r} is below the {name} class's {key} of {value}; "
                       f"raise pool_gib, or override {key} too ({why})")
        errors += [problem] if problem else []
    # The ceiling's fit is judged on values each in range, so a typo is named once, at itself.
    if not errors:
        errors = ceiling_problems(name, values, overrides)
    branch = values["driver_branch"]
    if branch is not None and not DRIVER_BRANCH.fullmatch(branch):
        errors.append(f"sparkfleet_hardware_overrides.driver_branch: {branch!r} is not a driver branch; give its three-digit "
                      "major version such as '580', or null for any")
    flavour = values["driver_flavour"]
    if flavour is not None and flavour not in DRIVER_FLAVOURS:
        errors.append(f"sparkfleet_hardware_overrides.driver_flavour: {flavour!r} is not a flavour the guard holds to; give "
                      "'open' (the open kernel modules), or null for either")
    line = values["kernel_line"]
    if line is not None and not KERNEL_LINE_FORMAT.fullmatch(line):
        errors.append(f"sparkfleet_hardware_overrides.kernel_line: {line!r} is not a kernel line; give its major.minor such as "
                      "'6.17', or null for any")
    cuda = values["min_image_cuda"]
    if cuda is not None and not CUDA_RELEASE.fullmatch(cuda):
        errors.append(f"sparkfleet_hardware_overrides.min_image_cuda: {cuda!r} is not a CUDA release; give one such as '12.9', "
                      "or null for no floor")
    return errors


def ceiling_problems(name: str, values: t.Mapping[str, t.Any], overrides: t.Mapping[str, t.Any]) -> list[str]:
    """Whether the ceiling fits what a clean boot leaves: vLLM refuses a start when gpu_memory_utilization x CUDA's total
    exceeds the free figure it reads, so a ceiling above the baseline would admit plans the launch check then refuses on a
    clean box. Named at the first of the three values the inventory overrode."""
    pool, ceiling, baseline = values["pool_gib"], values["gmu_ceiling"], values["free_memory_baseline_gib"]
    if pool is None or baseline is None or ceiling * pool <= baseline:
        return []
    named = next((key for key in ("gmu_ceiling", "free_memory_baseline_gib", "pool_gib") if key in overrides), "gmu_ceiling")
    return [f"sparkfleet_hardware_overrides.{named}: gmu_ceiling {ceiling} x pool_gib {pool} asks for {ceiling * pool:.2f} GiB, "
            f"more than the {baseline} GiB free_memory_baseline_gib a clean boot of a {name} host leaves, so vLLM would refuse a "
            "plan at the ceiling on a clean box; lower gmu_ceiling, or override free_memory_baseline_gib with the MemAvailable you "
            "measured after a clean boot (docs/hardware.md)"]


def class_page(name: str) -> str:
    """The documentation page of one class, generated from the data (docs/hardware/NAME.md)."""
    values = CLASSES[name]
    lines = [f"# Hardware class `{name}`", "", values["title"] + ".", "",
             "Generated from `plugins/module_utils/_hardware_classes.py`; select it with "
             f"`sparkfleet_hardware_class: {name}` and override single values with `sparkfleet_hardware_overrides`.", "",
             "| value | setting | where it comes from |", "|---|---|---|"]
    for key in ("board", "gpu", "unified_memory", "compute_capability", *FIELDS):
        if key == "env":
            continue
        shown = values[key]
        lines.append(f"| `{key}` | `{shown}` | {values['sources'].get(key, FIELDS[key][1] if key in FIELDS else '')} |")
    lines += ["", "## Environment", ""]
    if values["env"]:
        lines += [f"- `{k}={v}`" for k, v in values["env"].items()]
        lines += ["", values["sources"].get("env", "")]
    else:
        lines.append("None beyond `vllm_env`.")
    if values["left_out_env"]:
        lines += ["", "Left out on purpose:", ""]
        lines += [f"- `{k}`: {reason}" for k, reason in values["left_out_env"].items()]
    return "\n".join(lines) + "\n"
