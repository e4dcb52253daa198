# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host settings that guard memory on a unified pool, and /proc/meminfo. Private to the collection.

On a GB10 the GPU, the CPU and the page cache share one pool, and vLLM compares
gpu_memory_utilization x total with the memory free at startup (seeds 002 and 004):
"Free memory on device ... less than desired GPU memory utilization". Each start is admitted
against the memory the pinned image sees (_launch_checks); these settings keep the pool usable.

``host_settings_problems`` bounds the numbers the host-preparation roles write (the swap role's
swappiness, the headless role's memory sysctls, the exporter drop-ins): each bound refuses a value
that would switch the protection off or that no host means; the drop-ins' names and paths stay
where systemd reads them; the preflight's disk floor and device nodes keep its checks on.
"""

from __future__ import annotations

import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._headless import ROLE_VARIABLES as HEADLESS_VARIABLES
from ansible_collections.sparkfleet.vllm.plugins.module_utils._headless import options_problems as headless_options_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import Range, as_number
from ansible_collections.sparkfleet.vllm.plugins.module_utils._preflight import settings_problems as preflight_settings_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import dropin_problem, path_problem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._sysctl import settings_problems as sysctl_problems

# The headless role's memory sysctls (seed 002 Phase 0) with the values that keep their purpose;
# a sysctl not listed here is the operator's own and passes as given.
MEMORY_SYSCTLS: dict[str, Range] = {
    "vm.min_free_kbytes": Range(1, 16 * 1024 * 1024, "the reserve the kernel keeps for allocations under pressure; seed "
                                "002 keeps 5 GiB on a 128 GB pool, past 16 GiB the kernel reclaims and kills to hold it",
                                whole=True, unit="KiB"),
    "vm.vfs_cache_pressure": Range(1, 1000, "0 never reclaims dentries and inodes, which the kernel documents as a way to "
                                   "run out of memory", whole=True),
    "vm.dirty_background_ratio": Range(1, 100, "percent of memory dirty before background writeback", whole=True),
    "vm.dirty_ratio": Range(1, 100, "percent of memory dirty before writers block; on a unified pool every dirty page is "
                            "memory the engine lacks", whole=True),
    "vm.panic_on_oom": Range(0, 0, "1 or 2 reboot the whole host on an out-of-memory instead of killing the one process",
                             whole=True),
    "vm.overcommit_memory": Range(0, 1, "2 (strict accounting) refuses the large virtual reservations CUDA makes, and the "
                                  "engine does not start", whole=True),
    "vm.max_map_count": Range(65530, 2**31 - 1, "below the kernel's 65530 an engine mapping many weight shards fails",
                              whole=True),
    "vm.zone_reclaim_mode": Range(0, 7, "a bit mask of three reclaim modes", whole=True),
}
HOST_SETTINGS: dict[str, Range] = {
    "swap_swappiness": Range(0, 10, "seed 000 uses 1: should swap come back, a higher value pages the model's memory out "
                             "before the page cache", whole=True),
    # systemd refuses a sixth start within 10 s (StartLimitBurst=5, StartLimitIntervalSec=10), so
    # faster restarts leave a crash-looping exporter dead for good.
    "exporter_dropins_restart_sec": Range(2, 300, "below 2 s five quick restarts hit systemd's start limit and the exporter "
                                          "stays dead; past 5 minutes monitoring is blind too long", whole=True, unit="s"),
    "exporter_dropins_oom_score_adjust": Range(-1000, -1, "0 or above gives the exporter no protection, a positive value "
                                               "makes the kernel kill it first", whole=True),
    "exporter_dropins_self_test_timeout": Range(1, 600, "seconds the self-test waits for systemd to restart an exporter",
                                                whole=True, unit="s"),
}

# Where systemd reads docker.service's drop-ins (systemd.unit(5)).
DOCKER_DROPIN_FOLDERS = ("/etc/systemd/system/docker.service.d", "/run/systemd/system/docker.service.d",
                         "/usr/local/lib/systemd/system/docker.service.d", "/usr/lib/systemd/system/docker.service.d")
# Where systemd-sysctl reads the files the host-preparation roles own (sysctl.d(5)); /etc/sysctl.conf
# is the operator's, and the roles rewrite their files whole.
SYSCTL_FOLDERS = ("/etc/sysctl.d",)
# A drop-in's own name inside a unit's drop-in folder: no '/' leaves the folder.
DROPIN_NAME = re.compile(r"[A-Za-z0-9_@+-][A-Za-z0-9_.@+-]*\.conf")


def dropin_setting_problems(settings: t.Mapping[str, t.Any]) -> list[str]:
    """Where the host-preparation roles write their systemd drop-ins."""
    errors = []
    if "exporter_dropins_file_name" in settings:
        name = settings["exporter_dropins_file_name"]
        if not (isinstance(name, str) and DROPIN_NAME.fullmatch(name)):
            errors.append(f"exporter_dropins_file_name: {name!r} must be a file name ending in .conf (letters, digits, _.@+-; no '/'): "
                          "it is written in each exporter's drop-in folder, systemd reads only its *.conf files, and a '/' or "
                          "'..' would write elsewhere")
    if "wait_online_docker_dropin_path" in settings:
        path = settings["wait_online_docker_dropin_path"]
        problem = path_problem(path, 3)
        dropin = dropin_problem("wait_online_docker_dropin_path", path, DOCKER_DROPIN_FOLDERS,
                                "Docker would not wait for the network and LAN-bound instances would fail at boot")
        errors += [f"wait_online_docker_dropin_path: {path!r} {problem}"] if problem else [dropin] if dropin else []
    for variable in ("headless_sysctl_file", "swap_sysctl_file"):
        if variable in settings:
            path = settings[variable]
            problem = path_problem(path)
            dropin = dropin_problem(variable, path, SYSCTL_FOLDERS, "the settings would not come back at boot; the role "
                                    "rewrites the file whole, so give it a file of its own")
            errors += [f"{variable}: {path!r} {problem}"] if problem else [dropin] if dropin else []
    return errors


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes."""
    values = {}
    for line in text.splitlines():
        name, _separator, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[name] = int(fields[0]) * (1024 if len(fields) > 1 and fields[1] == "kB" else 1)
    return values


def host_settings_problems(settings: t.Mapping[str, t.Any]) -> list[str]:
    """Problems of the host-preparation settings given (a role passes its own): each named
    ``"<variable>: <value> <what is wrong>; <the fix> (<why>)"``."""
    errors = [p for name, bound in HOST_SETTINGS.items() if name in settings
              for p in bound.problems(name, settings[name])] + dropin_setting_problems(settings)
    if "preflight_min_free_disk_gib" in settings or "preflight_device_nodes" in settings:
        errors += preflight_settings_problems(settings.get("preflight_min_free_disk_gib"), settings.get("preflight_device_nodes"))
    restart, timeout = (as_number(settings.get(name), whole=True) for name in
                        ("exporter_dropins_restart_sec", "exporter_dropins_self_test_timeout"))
    if not errors and restart is not None and timeout is not None and timeout <= restart:
        errors.append(f"exporter_dropins_self_test_timeout: {timeout} is not above exporter_dropins_restart_sec ({restart}); "
                      "systemd waits that long before the restart, so the self-test would always fail. Raise it")
    # The unit names reach systemctl on the host: refused here, in the fleet check, before any host changes.
    if "headless_default_target" in settings:
        errors += headless_options_problems(settings["headless_default_target"],
                                            {option: settings.get(variable) for option, variable in HEADLESS_VARIABLES.items()},
                                            HEADLESS_VARIABLES)
    sysctls = settings.get("headless_sysctl")
    if "headless_sysctl" in settings and not isinstance(sysctls, dict):
        errors.append(f"headless_sysctl: {sysctls!r} is not a mapping; give sysctl names and their values")
    elif isinstance(sysctls, dict):
        errors += [f"headless_sysctl: {problem}" for problem in sysctl_problems(sysctls)]
        errors += [p for name, bound in MEMORY_SYSCTLS.items() if name in sysctls
                   for p in bound.problems(f"headless_sysctl['{name}']", sysctls[name])]
        background, ratio = (as_number(sysctls.get(name), whole=True) for name in ("vm.dirty_background_ratio", "vm.dirty_ratio"))
        if background is not None and ratio is not None and background > ratio:
            errors.append(f"headless_sysctl['vm.dirty_background_ratio']: {background} is above vm.dirty_ratio ({ratio}); "
                          "writers would block before background writeback starts. Lower it")
    return errors
