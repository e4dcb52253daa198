# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the NVIDIA driver branch from dpkg, nvidia-smi and an apt upgrade simulation.

Private to the collection. Seed 000: stay on the 580 branch (590 had a CUDA-graph
deadlock on GB10), and check the branch an upgrade would bring before rebooting into it. An
install dpkg did not finish (unpacked, half-configured, awaiting triggers, or needing a
reinstall) or a removed branch's leftover configuration counts against the rule too: the next
``dpkg --configure -a`` or apt run would finish it. Standard library only: it runs on the host.
"""

from __future__ import annotations

import re
import typing as t

DPKG_QUERY_FORMAT = "${Package}\\t${Version}\\t${db:Status-Status}\\t${db:Status-Eflag}\\n"
NVIDIA_SMI_ARGS = ["--query-gpu=driver_version", "--format=csv,noheader"]

# nvidia-driver-580, nvidia-driver-580-open, libnvidia-compute-580, nvidia-utils-580-server...
_USERSPACE_PACKAGE = re.compile(r"^(?:lib)?nvidia-(?:[a-z0-9]+-)*?(?P<branch>\d{3})(?=-|$)")
# linux-modules-nvidia-580-open-6.17.0-1021-nvidia and its objects/signatures siblings.
_KERNEL_PACKAGE = re.compile(r"^linux-(?:modules|objects|signatures)-nvidia-(?P<branch>\d{3})(?=-|$)")
# Inst name [old-version] (new-version suite [arch])
_APT_INSTALL = re.compile(r"^Inst (?P<name>\S+)(?: \[(?P<old>[^\]]+)\])? \((?P<version>\S+)")
_DRIVER_VERSION = re.compile(r"^(?P<branch>\d{3})\.\d+(?:\.\d+)?$")
INSTALLED, CONFIG_FILES, NOT_INSTALLED = "installed", "config-files", "not-installed"
# dpkg's package states (dpkg-query(1), db:Status-Status) as dpkg -l abbreviates them, and what they mean.
STATES = {
    "half-installed": "iH, half-installed: unpacking stopped midway",
    "unpacked": "iU, unpacked, not configured",
    "half-configured": "iF, half-configured: its configuration failed",
    "triggers-awaited": "iW, awaiting another package's triggers",
    "triggers-pending": "it, triggers pending",
    "config-files": "rc, removed with its configuration files left",
}


def package_branch(name: str) -> str | None:
    """The driver branch a package belongs to, or None for packages that are not driver packages."""
    match = _USERSPACE_PACKAGE.match(name) or _KERNEL_PACKAGE.match(name)
    return match.group("branch") if match else None


def parse_dpkg_query(output: str) -> list[dict[str, str]]:
    """Every driver package dpkg knows of, in any state, from ``dpkg-query -W -f DPKG_QUERY_FORMAT``:
    name, version, branch, status (dpkg's word: installed, unpacked, config-files...) and error flag
    (ok, or reinstreq when dpkg needs the package reinstalled)."""
    packages = []
    for line in output.splitlines():
        fields = line.split("\t")
        if len(fields) != 4 or fields[2] == NOT_INSTALLED:
            continue
        branch = package_branch(fields[0])
        if branch:
            packages.append({"name": fields[0], "version": fields[1], "branch": branch, "status": fields[2], "error_flag": fields[3]})
    return packages


def installed(packages: t.Sequence[t.Mapping[str, str]]) -> list[dict[str, str]]:
    """The packages dpkg finished installing: name, version and branch."""
    return [{"name": p["name"], "version": p["version"], "branch": p["branch"]}
            for p in packages if p["status"] == INSTALLED and p["error_flag"] == "ok"]


def unfinished(allowed_branch: str, packages: t.Sequence[t.Mapping[str, str]]) -> list[dict[str, str]]:
    """Packages an interrupted install or removal left behind: any state but installed (or a
    reinstall dpkg requires), except configuration files of removed packages (rc), of any branch:
    what apt remove leaves after a branch change (570 to 580), nothing dpkg --configure -a touches."""
    return [dict(p) for p in packages if p["error_flag"] != "ok" or p["status"] not in (INSTALLED, CONFIG_FILES)]


def unfinished_reasons(allowed_branch: str, packages: t.Sequence[t.Mapping[str, str]]) -> list[str]:
    """Why the unfinished packages break the rule, each with its fix: the allowed branch's are
    finished, another branch's are purged (finishing them would install that branch)."""
    left = unfinished(allowed_branch, packages)
    own = [p for p in left if p["branch"] == allowed_branch]
    other = [p for p in left if p["branch"] != allowed_branch]
    reasons = []
    if own:
        reasons.append(f"dpkg did not finish installing driver packages of branch {allowed_branch}: {described(own)}; finish the "
                       "install (sudo dpkg --configure -a, then sudo apt-get -f install) and run the guard again")
    if other:
        branches = ", ".join(sorted({p["branch"] for p in other}))
        reasons.append(f"driver packages of branch {branches}, not {allowed_branch}, are half there (an interrupted install or "
                       f"removal): {described(other)}; finishing them would install that branch, so purge them (sudo apt-get "
                       f"purge {' '.join(p['name'] for p in other)}) and run the guard again")
    return reasons


def described(packages: t.Sequence[t.Mapping[str, str]]) -> str:
    return ", ".join(f"{p['name']} {p['version']} ({STATES.get(p['status'], p['status'])}"
                     f"{', reinstall required' if p['error_flag'] != 'ok' else ''})" for p in packages)


def parse_nvidia_smi(output: str) -> list[str]:
    """Driver versions, one per GPU, from ``nvidia-smi --query-gpu=driver_version --format=csv,noheader``."""
    return [line.strip() for line in output.splitlines() if _DRIVER_VERSION.match(line.strip())]


def parse_apt_simulation(output: str) -> list[dict[str, str | None]]:
    """Driver packages an ``apt-get -s`` run would install or upgrade."""
    changes = []
    for line in output.splitlines():
        match = _APT_INSTALL.match(line)
        if not match:
            continue
        branch = package_branch(match.group("name"))
        if branch:
            changes.append(
                {
                    "name": match.group("name"),
                    "version": match.group("version"),
                    "old_version": match.group("old"),
                    "branch": branch,
                }
            )
    return changes


def judge(
    allowed_branch: str,
    packages: t.Sequence[t.Mapping[str, t.Any]],
    smi_versions: t.Sequence[str],
    upgrade_changes: t.Sequence[t.Mapping[str, t.Any]] | None,
) -> list[str]:
    """Reasons the host breaks the driver-branch rule, each with its fix; empty when it keeps it.
    ``packages`` is every driver package dpkg knows of (``parse_dpkg_query``)."""
    reasons = []
    foreign = [p for p in installed(packages) if p["branch"] != allowed_branch]
    if foreign:
        listed = ", ".join(f"{p['name']} {p['version']}" for p in foreign)
        reasons.append(f"installed driver packages of another branch than {allowed_branch}: {listed}; remove them, or change "
                       "driver_guard_allowed_branch deliberately")
    reasons += unfinished_reasons(allowed_branch, packages)
    running = sorted({v for v in smi_versions if _DRIVER_VERSION.match(v).group("branch") != allowed_branch})
    if running:
        reasons.append(f"nvidia-smi reports driver {', '.join(running)}, not branch {allowed_branch}")
    incoming = [c for c in upgrade_changes or () if c["branch"] != allowed_branch]
    if incoming:
        listed = ", ".join(f"{c['name']} {c['version']}" for c in incoming)
        reasons.append(f"the upgrade would bring driver packages of another branch than {allowed_branch}: {listed}; hold or "
                       "pin the meta package that pulls them in")
    return reasons
