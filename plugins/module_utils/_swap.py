# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Swap turned off and kept off across reboots, in one step: active swap turned off (swapoff -a),
the swap entries of fstab commented out (never deleted) with a backup, vm.swappiness kept in a
sysctl.d file of ours (and the running kernel), and the swap units systemd would bring back masked
with one systemctl call. Every setting is checked and the host read before anything changes.

Private to the collection; the swap_off module is its caller. Check mode is answered here: the
same reads and comparisons, nothing run that changes the host.
"""

from __future__ import annotations

import os
import time
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem, read_file, write_owned
from ansible_collections.sparkfleet.vllm.plugins.module_utils._memory import host_settings_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._sysctl import PROC_SYS, sync_sysctls
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import listed_unit_states, unit_name_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._tools import Runner

# The swap role's variables are these options with this prefix; the shared bounds name the role's.
ROLE_PREFIX = "swap_"
# Masked whenever the host has it: the target every swap unit is pulled in by.
SWAP_TARGET = "swap.target"
LIST_UNIT_FILES = ["systemctl", "list-unit-files", "--no-legend", "--plain", "--type=swap,service,target"]
# As ansible.builtin.replace's backup: true (AnsibleModule.backup_local) names it, which operators' cleanup globs expect.
BACKUP_SUFFIX = "%Y-%m-%d@%H:%M:%S~"


class SwapProblem(FileProblem):
    """What stopped swap from being turned off, with the fix; the files' problems are FileProblem,
    the base class, so ``except FileProblem`` catches both."""


def options_problems(swappiness: t.Any, sysctl_file: t.Any, zram_units: t.Sequence[t.Any] | None) -> list[str]:
    """The swap role's own bounds (host_settings_problems, as its fleet check applies them) worded
    with the module's option names, and the zram unit names when they reach systemctl (None: they do not)."""
    problems = [problem.removeprefix(ROLE_PREFIX) for problem in
                host_settings_problems({f"{ROLE_PREFIX}swappiness": swappiness, f"{ROLE_PREFIX}sysctl_file": sysctl_file})]
    # unit_name_problems names each as units[index]; here the option is zram_units.
    return problems + [f"zram_{problem}" for problem in unit_name_problems(zram_units or [])]


def is_swap_entry(line: str) -> bool:
    """An fstab line that mounts swap: not a comment, and ``swap`` as its third field (the type)."""
    fields = line.split()
    return len(fields) >= 3 and not fields[0].startswith("#") and fields[2] == "swap"


def comment_swap_entries(text: str) -> tuple[str, list[str]]:
    """``text`` with each swap entry commented out as ``# <line>`` (its indentation kept), and those
    lines as they were. Line by line: the role's multiline regex could reach across a line break."""
    # Split at "\n" alone, as the regex's ^ and $ did; splitlines would also split at form feeds and the like.
    lines = text.split("\n")
    commented = [line.rstrip("\r") for line in lines if is_swap_entry(line)]
    return "\n".join(f"# {line}" if is_swap_entry(line) else line for line in lines), commented


def backup_path(path: str, pid: int, moment: time.struct_time) -> str:
    return f"{path}.{pid}.{time.strftime(BACKUP_SUFFIX, moment)}"


def units_to_mask(output: str, zram_units: t.Sequence[str]) -> list[str]:
    """swap.target, every swap unit and the zram units that the listing shows, less those already
    masked (a runtime mask is lost at boot, so it is masked again), sorted. The names are systemd's
    own (a swap file's unit may start with an escape, such as \\x2eswapfile.swap) and reach systemctl
    as arguments after ``--``, never through a shell."""
    wanted = {SWAP_TARGET, *zram_units}
    return sorted(unit for unit, state in listed_unit_states(output).items()
                  if (unit.endswith(".swap") or unit in wanted) and state != "masked")


def checked(run: Runner, argv: list[str], fix: str) -> str:
    rc, out, err = run(argv)
    if rc != 0:
        raise SwapProblem(f"{' '.join(argv)} exited {rc}: {err.strip() or out.strip()}; {fix}")
    return out


def mask(run: Runner, units: list[str]) -> None:
    rc, out, err = run(["systemctl", "mask", "--", *units])
    if rc != 0:
        raise SwapProblem(f"{', '.join(units)} could not be masked: systemctl mask exited {rc}: {err.strip() or out.strip()}; the task "
                          "must run as root (become: true), and a unit file of that name in /etc/systemd/system (not a link) "
                          "blocks the mask: move it away")


def read_fstab(path: str) -> tuple[bytes, int, tuple[int, int]]:
    found = read_file(path)
    if found is None:
        raise SwapProblem(f"fstab_path: {path} does not exist; give the host's fstab (/etc/fstab)")
    return found


def comment_fstab(path: str, found: tuple[bytes, int, tuple[int, int]], check_mode: bool) -> dict[str, t.Any]:
    """Comment out the swap entries of ``found`` (fstab as read), first keeping a backup beside it."""
    content, mode, ids = found
    # surrogateescape: bytes that are not UTF-8 come back unchanged.
    text = content.decode("utf-8", "surrogateescape")
    new_text, commented = comment_swap_entries(text)
    result: dict[str, t.Any] = {"commented": commented, "backup": "", "diff": []}
    if not commented:
        return result
    result["diff"] = [{"before_header": path, "after_header": path, "before": content.decode("utf-8", "replace"),
                       "after": new_text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")}]
    if not check_mode:
        result["backup"] = backup_path(path, os.getpid(), time.localtime())
        write_owned(result["backup"], content, mode, ids)
        # A link (to a shared fstab) stays a link; its target is rewritten.
        write_owned(os.path.realpath(path), new_text.encode("utf-8", "surrogateescape"), mode, ids)
    return result


def turn_swap_off(run: Runner, *, disable_active: bool, fstab_path: str, swappiness: t.Any, sysctl_file: str, apply_sysctl: bool,
                  mask_units: bool, zram_units: t.Sequence[str], check_mode: bool, proc_sys: str = PROC_SYS) -> dict[str, t.Any]:
    """The whole step. Every option is checked, and the active swap, fstab and unit files read, before
    anything changes; then swapoff, fstab, the sysctl file and the masks, in the swap role's order.
    SwapProblem (a FileProblem) says what stopped it and the fix."""
    problems = options_problems(swappiness, sysctl_file, zram_units if mask_units else None)
    if problems:
        raise SwapProblem("; ".join(problems))
    active = disable_active and bool(checked(run, ["swapon", "--show=NAME", "--noheadings"],
                                             "swapon (Debian package mount) reads the active swap").strip())
    fstab = read_fstab(fstab_path)
    to_mask: list[str] = []
    if mask_units:
        to_mask = units_to_mask(checked(run, LIST_UNIT_FILES, "is systemd running on the host?"), zram_units)
    if active and not check_mode:
        checked(run, ["swapoff", "-a"], "the memory in use must fit without swap (stop what holds it), and the task must run as root "
                                        "(become: true)")
    commented = comment_fstab(fstab_path, fstab, check_mode)
    sysctl = sync_sysctls(sysctl_file, {"vm.swappiness": swappiness}, apply_sysctl, check_mode, proc_sys=proc_sys)
    if to_mask and not check_mode:
        mask(run, to_mask)
    return {"changed": bool(active or commented["commented"] or sysctl["changed"] or to_mask), "swapped_off": active,
            "fstab_commented": commented["commented"], "fstab_backup": commented["backup"], "sysctl_changed": sysctl["changed"],
            "sysctl_file_written": sysctl["file_written"], "sysctl_set_running": sysctl["set_running"], "masked": to_mask,
            "diff": commented["diff"] + sysctl["diff"]}
