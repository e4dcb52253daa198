# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a serving host is, read from the files and tools it has. Private to the collection.

Every function here parses text a host produced (DMI, os-release, nvidia-smi's CSV, /proc, fstab, docker info; the
units' states come from _host_state, the one reader of systemctl show); the spark_facts module only gathers the text.
On a GB10 nvidia-smi reports its memory as [N/A] (NVIDIA's known issue): the unified pool is read from /proc/meminfo,
which is also what vLLM's total is there (121.69 GiB).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._memory import parse_meminfo
from ansible_collections.sparkfleet.vllm.plugins.module_utils._nvidia_driver import DPKG_QUERY_FORMAT

# What nvidia-smi is asked, in this order; its CSV header names the columns with units.
GPU_QUERY = ("index", "name", "driver_version", "compute_cap", "memory.total", "memory.free", "clocks.sm", "power.draw",
             "utilization.gpu")
NVIDIA_SMI_ARGS = ["--query-gpu=" + ",".join(GPU_QUERY), "--format=csv"]
HEADER_ALIASES = {"clocks.current.sm": "clocks.sm"}
# A Debian package name (policy 5.6.1), the only thing of a package that reaches dpkg-query's command line.
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
SLEEP_TARGETS = ("sleep.target", "suspend.target", "hibernate.target", "hybrid-sleep.target")
UNIT_STATE_PROPERTIES = ("LoadState", "UnitFileState")
LOADED_UTILIZATION = 50.0
# Seed 002: a wedged GX10 runs at 611-708 MHz and under 15 W at 90 %+ utilisation (healthy: 2400-2600 MHz, 35-45 W).
WEDGE_CLOCK_MHZ = 1000.0
WEDGE_POWER_W = 15.0
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# A size as docker system df prints it (go-units' HumanSize: decimal units), before the share in parentheses.
DOCKER_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kMGTPE]?B)\b")
DOCKER_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "EB": 10**18}
# The most files a folder's usage walks before it reports what it has counted so far ("at least").
USAGE_FILES = 200_000


def board(dmi: t.Mapping[str, str | None]) -> dict[str, t.Any]:
    """The board from /sys/class/dmi/id (sys_vendor, product_name, board_vendor, board_name, bios_version)."""
    vendor = (dmi.get("sys_vendor") or dmi.get("board_vendor") or "").strip()
    product = (dmi.get("product_name") or dmi.get("board_name") or "").strip()
    text = f"{vendor} {product} {dmi.get('board_name') or ''}".lower()
    if "gx10" in text and "asus" in text:
        kind = "asus_gx10"
    elif "nvidia" in vendor.lower() and ("spark" in text or "dgx" in text):
        kind = "dgx_spark"
    elif vendor or product:
        kind = "other"
    else:
        kind = "unknown"
    return {"kind": kind, "vendor": vendor or None, "product": product or None, "bios_version": (dmi.get("bios_version") or "").strip() or None}


def parse_os_release(text: str) -> dict[str, str | None]:
    values = {}
    for line in text.splitlines():
        name, separator, value = line.partition("=")
        if separator:
            values[name.strip()] = value.strip().strip('"')
    return {"id": values.get("ID"), "version_id": values.get("VERSION_ID"), "pretty_name": values.get("PRETTY_NAME")}


def number(text: str | None) -> float | None:
    """A figure from an nvidia-smi cell ('2411 MHz', '11.17 W', '0 %'), or None for [N/A] and the like."""
    match = _NUMBER.search(text or "") if text and "N/A" not in text and "Not Supported" not in text else None
    return float(match.group()) if match else None


def parse_gpu_query(text: str) -> list[dict[str, t.Any]]:
    """The GPUs from ``nvidia-smi NVIDIA_SMI_ARGS`` (CSV with a header)."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return []
    # nvidia-smi heads the query's columns with their long names (clocks.sm prints as clocks.current.sm).
    header = [HEADER_ALIASES.get(name, name) for name in (column.split(" [")[0].strip() for column in rows[0])]
    gpus = []
    for row in rows[1:]:
        cells = dict(zip(header, (cell.strip() for cell in row), strict=False))
        if not cells.get("name"):
            continue
        driver = cells.get("driver_version") or None
        memory_total = number(cells.get("memory.total"))
        gpus.append({
            "index": int(number(cells.get("index")) or 0),
            "name": cells["name"],
            "driver_version": driver,
            "driver_branch": driver.split(".")[0] if driver and driver[0].isdigit() else None,
            "compute_capability": cells.get("compute_cap") if number(cells.get("compute_cap")) is not None else None,
            "memory_total_mib": memory_total,
            "memory_free_mib": number(cells.get("memory.free")),
            "memory_reported": memory_total is not None,
            "sm_clock_mhz": number(cells.get("clocks.sm")),
            "power_draw_w": number(cells.get("power.draw")),
            "utilization_percent": number(cells.get("utilization.gpu")),
        })
    return gpus


def memory(gpus: t.Sequence[t.Mapping[str, t.Any]], meminfo: t.Mapping[str, int]) -> dict[str, t.Any]:
    """The memory vLLM's utilisation is a fraction of: the GPU's own on a discrete card; the system's
    on a unified pool (GB10 reports [N/A]) and on a host without a GPU."""
    discrete = [gpu for gpu in gpus if gpu["memory_reported"]]
    if discrete:
        gpu = discrete[0]
        return {"source": "nvidia-smi", "unified": False, "pool_bytes": int(gpu["memory_total_mib"] * 2**20),
                "available_bytes": int((gpu["memory_free_mib"] or 0) * 2**20),
                "system_total_bytes": meminfo.get("MemTotal"), "system_available_bytes": meminfo.get("MemAvailable")}
    return {"source": "/proc/meminfo", "unified": bool(gpus), "pool_bytes": meminfo.get("MemTotal"),
            "available_bytes": meminfo.get("MemAvailable"),
            "system_total_bytes": meminfo.get("MemTotal"), "system_available_bytes": meminfo.get("MemAvailable")}


def parse_swaps(text: str) -> list[dict[str, t.Any]]:
    """Active swap from /proc/swaps (sizes in KiB)."""
    active = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 4 and fields[2].isdigit() and fields[3].isdigit():
            active.append({"device": fields[0], "size_kib": int(fields[2]), "used_kib": int(fields[3])})
    return active


def fstab_swaps(text: str) -> list[str]:
    """Swap entries an /etc/fstab activates at boot (commented lines do not count)."""
    entries = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 3 and fields[2] == "swap" and "noauto" not in (fields[3].split(",") if len(fields) > 3 else []):
            entries.append(fields[0])
    return entries


def parse_docker_df(text: str | None) -> int | None:
    """The bytes ``docker system df --format '{{json .}}'`` says a prune would reclaim (images, containers, volumes and
    build cache together); None when it did not answer with its rows."""
    total, rows = 0, 0
    for line in (text or "").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        found = DOCKER_SIZE.match(str(row.get("Reclaimable", ""))) if isinstance(row, dict) else None
        if found:
            total += round(float(found[1]) * DOCKER_UNITS[found[2]])
            rows += 1
    return total if rows else None


def folder_usage(path: str, limit: int = USAGE_FILES) -> dict[str, t.Any]:
    """What a folder holds, never following a link: {path, exists, used_bytes, complete}, complete false when the walk
    stopped at `limit` files (used_bytes is then a lower bound), and the free and total bytes of its filesystem."""
    used, files, complete = 0, 0, True
    exists = os.path.isdir(path)
    for folder, _folders, names in os.walk(path) if exists else ():
        for name in names:
            try:
                used += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
            files += 1
        if files >= limit:
            complete = False
            break
    usage: dict[str, t.Any] = {"path": path, "exists": exists, "used_bytes": used, "complete": complete, "free_bytes": None, "total_bytes": None}
    if exists:
        stats = os.statvfs(path)
        usage.update(free_bytes=stats.f_bavail * stats.f_frsize, total_bytes=stats.f_blocks * stats.f_frsize)
    return usage


def parse_docker_info(text: str | None) -> dict[str, t.Any]:
    """``docker info --format '{{json .}}'``: the engine, its runtimes and whether NVIDIA's is one."""
    if not text:
        return {"present": False, "version": None, "runtimes": [], "default_runtime": None, "nvidia_runtime": False}
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("Runtimes") or {}, dict):
        return {"present": False, "version": None, "runtimes": [], "default_runtime": None, "nvidia_runtime": False,
                "error": "docker info did not answer with its JSON object"}
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    return {"present": bool(info.get("ServerVersion")), "version": info.get("ServerVersion"), "runtimes": runtimes,
            "default_runtime": info.get("DefaultRuntime"), "architecture": info.get("Architecture"),
            "nvidia_runtime": "nvidia" in runtimes}


def unit_states(shown: t.Mapping[str, t.Mapping[str, str]]) -> dict[str, str]:
    """Each unit's state from its UNIT_STATE_PROPERTIES as _host_state.show_units read them: masked, static, enabled,
    not-found..."""
    return {unit: "masked" if values["LoadState"] == "masked" else "not-found" if values["LoadState"] == "not-found"
            else values["UnitFileState"] or values["LoadState"] for unit, values in shown.items()}


def power_state(gpus: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """Seed 002's power-delivery wedge: under load, an SM clock under 1 GHz with under 15 W."""
    if not gpus:
        return {"loaded": False, "wedge_suspected": False, "reason": "no GPU"}
    gpu = gpus[0]
    utilization, clock, power = gpu["utilization_percent"], gpu["sm_clock_mhz"], gpu["power_draw_w"]
    loaded = utilization is not None and utilization >= LOADED_UTILIZATION
    figures = f"{clock} MHz, {power} W at {utilization} % utilisation"
    if not loaded:
        return {"loaded": False, "wedge_suspected": False, "reason": f"not under load ({figures}); the wedge shows only under load"}
    wedged = clock is not None and power is not None and clock < WEDGE_CLOCK_MHZ and power < WEDGE_POWER_W
    reason = (f"{figures}: the power-delivery wedge (seed 002); a 90-120 s AC cold drain clears it"
              if wedged else f"{figures}: clock and power follow the load")
    return {"loaded": True, "wedge_suspected": wedged, "reason": reason}


def package_lists(file_mtimes: t.Mapping[str, float], now: float) -> dict[str, t.Any]:
    """The package indexes apt holds (files of its lists folder named ..._Packages, compressed or not) and
    the newest one's age. None means apt knows no package yet, whatever its cache_valid_time makes of the
    folder's own time (a freshly built image empties the folder, which then looks just refreshed)."""
    indexes = [mtime for name, mtime in file_mtimes.items() if "_Packages" in name]
    return {"indexes": len(indexes), "age_seconds": max(0, round(now - max(indexes))) if indexes else None}


def package_name_problems(names: t.Sequence[t.Any]) -> list[str]:
    return [f"packages[{index}]: {name!r} is not a Debian package name (lower-case letters, digits and +.-)"
            for index, name in enumerate(names) if not isinstance(name, str) or not PACKAGE_NAME.fullmatch(name)]


def dpkg_query_args(names: t.Sequence[str]) -> list[str]:
    """dpkg-query's arguments that list ``names`` with their versions and states (DPKG_QUERY_FORMAT)."""
    return ["-W", "-f", DPKG_QUERY_FORMAT, "--", *names]


def installed_packages(output: str, names: t.Sequence[str]) -> dict[str, str | None]:
    """Each package of ``names`` with the version dpkg holds installed, None when it holds none (not
    known, removed, or half-installed). dpkg-query exits 1 when one is unknown and lists the others."""
    installed = {}
    for line in output.splitlines():
        fields = line.split("\t")
        # Name, version, status and error flag: a package dpkg must reinstall is not installed either.
        if len(fields) == 4 and fields[2] == "installed" and fields[3] == "ok":
            installed[fields[0]] = fields[1]
    return {name: installed.get(name) for name in names}


def packages_to_install(pins: t.Mapping[str, str | None], facts: t.Mapping[str, t.Any] | None) -> list[str]:
    """The packages of ``pins`` (name -> the pinned version, empty for any) an apt install would still
    change, as far as the host's facts tell: every one whose installed version they do not give."""
    known = (facts or {}).get("packages") or {}
    return sorted(name for name, version in pins.items()
                  if known.get(name) is None or (version and known[name] != version))


def summarise(dmi: t.Mapping[str, str | None], os_release: str, architecture: str, gpu_text: str | None, gpu_error: str | None,
              meminfo_text: str, swaps_text: str, fstab_text: str, holders: list[dict[str, t.Any]], docker_text: str | None,
              disk: t.Mapping[str, t.Any], units: t.Mapping[str, t.Mapping[str, str]], lists: t.Mapping[str, t.Any],
              packages: t.Mapping[str, str | None]) -> dict[str, t.Any]:
    """The host's facts from what spark_facts gathered."""
    gpus = parse_gpu_query(gpu_text) if gpu_text else []
    first = gpus[0] if gpus else {}
    return {
        "board": board(dmi),
        "os": parse_os_release(os_release),
        "architecture": architecture,
        "gpu": {
            "present": bool(gpus), "count": len(gpus), "name": first.get("name"), "driver_version": first.get("driver_version"),
            "driver_branch": first.get("driver_branch"), "compute_capability": first.get("compute_capability"),
            "memory_reported": first.get("memory_reported"), "sm_clock_mhz": first.get("sm_clock_mhz"),
            "power_draw_w": first.get("power_draw_w"), "utilization_percent": first.get("utilization_percent"),
            "detail": "no GPU: nvidia-smi " + (gpu_error or "reported none") if not gpus else None,
        },
        "memory": memory(gpus, parse_meminfo(meminfo_text)),
        "swap": {"active": parse_swaps(swaps_text), "fstab": fstab_swaps(fstab_text)},
        "device_holders": holders,
        "docker": parse_docker_info(docker_text),
        "disk": dict(disk),
        "sleep_targets": unit_states(units),
        "power": power_state(gpus),
        "package_lists": dict(lists),
        "packages": dict(packages),
    }
