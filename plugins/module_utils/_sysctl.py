# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel settings kept in one sysctl.d file of ours and, when asked, in the running kernel: the
file written whole when it differs (atomically, with a diff), each running value that differs
set through /proc/sys. Private to the collection; the sysctl_file module is its caller."""

from __future__ import annotations

import os
import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem, sync_files
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import path_problem

KEY = re.compile(r"[a-z][a-z0-9_]*(\.[A-Za-z0-9_-]+)+")
# Numbers and the plain words some settings take; nothing that could end the line or start another.
VALUE = re.compile(r"[A-Za-z0-9_.:-]+( [A-Za-z0-9_.:-]+)*")
PROC_SYS = "/proc/sys"


def settings_problems(settings: t.Mapping[str, t.Any]) -> list[str]:
    problems = []
    for key, value in settings.items():
        if not isinstance(key, str) or not KEY.fullmatch(key):
            problems.append(f"{key!r} is not a sysctl name (dotted words such as vm.min_free_kbytes)")
        elif value is None or isinstance(value, bool) or not VALUE.fullmatch(str(value)):
            problems.append(f"{key}: {value!r} is not a value a sysctl.d line carries unchanged (numbers or plain words)")
    return problems


def file_text(settings: t.Mapping[str, t.Any]) -> str:
    return "".join(["# Managed by Ansible (sparkfleet.vllm); local edits are overwritten.\n",
                    *[f"{key}={value}\n" for key, value in settings.items()]])


def proc_path(key: str, proc_sys: str) -> str:
    return os.path.join(proc_sys, *key.split("."))


def running_value(key: str, proc_sys: str) -> str:
    path = proc_path(key, proc_sys)
    try:
        with open(path, encoding="ascii") as handle:
            return " ".join(handle.read().split())
    except FileNotFoundError as error:
        raise FileProblem(f"{key}: the running kernel has no such setting ({path} does not exist); remove it or fix its name") from error
    except OSError as error:
        raise FileProblem(f"{key}: cannot be read from {path} ({error.strerror})") from error


def set_running(key: str, value: str, proc_sys: str) -> None:
    path = proc_path(key, proc_sys)
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(value)
    except OSError as error:
        raise FileProblem(f"{key}: cannot be set in the running kernel through {path} ({error.strerror}); run as root, "
                          "or leave the running kernel alone where /proc/sys is read-only (apply: false)") from error


def sync_sysctls(path: str, settings: t.Mapping[str, t.Any], apply: bool, check_mode: bool,
                 proc_sys: str = PROC_SYS) -> dict[str, t.Any]:
    """Bring the file, and with ``apply`` the running kernel, to ``settings``; every name and value
    is checked, and every running value read, before anything is written."""
    problem = path_problem(path)
    problems = [f"path: {path!r} {problem}"] * bool(problem) + settings_problems(settings)
    if problems:
        raise FileProblem("; ".join(problems))
    wanted = {key: " ".join(str(value).split()) for key, value in settings.items()}
    stale = {key: value for key, value in wanted.items() if apply and running_value(key, proc_sys) != value}
    synced = sync_files([{"label": path, "path": path, "mode": 0o644, "content": file_text(settings).encode("ascii"), "hidden": None}],
                        check_mode)
    if not check_mode:
        for key, value in stale.items():
            set_running(key, value, proc_sys)
    return {"changed": bool(stale or synced["content"] or synced["metadata"]), "file_written": bool(synced["content"]),
            "set_running": sorted(stale), "diff": synced["diff"]}
