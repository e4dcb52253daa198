# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the NVIDIA driver branch from dpkg, nvidia-smi and an apt upgrade simulation.

Private to the collection. Seed 000: stay on the 580 branch (590 had a CUDA-graph
deadlock on GB10), and check the branch an upgrade would bring before rebooting into it.
"""

from __future__ import annotations

import re
import typing as t

DPKG_QUERY_FORMAT = "${Package}\\t${Version}\\t${db:Status-Status}\\n"
NVIDIA_SMI_ARGS = ["--query-gpu=driver_version", "--format=csv,noheader"]

# nvidia-driver-580, nvidia-driver-580-open, libnvidia-compute-580, nvidia-utils-580-server...
_USERSPACE_PACKAGE = re.compile(r"^(?:lib)?nvidia-(?:[a-z0-9]+-)*?(?P<branch>\d{3})(?=-|$)")
# linux-modules-nvidia-580-open-6.17.0-1021-nvidia and its objects/signatures siblings.
_KERNEL_PACKAGE = re.compile(r"^linux-(?:modules|objects|signatures)-nvidia-(?P<branch>\d{3})(?=-|$)")
# Inst name [old-version] (new-version suite [arch])
_APT_INSTALL = re.compile(r"^Inst (?P<name>\S+)(?: \[(?P<old>[^\]]+)\])? \((?P<version>\S+)")
_DRIVER_VERSION = re.compile(r"^(?P<branch>\d{3})\.\d+(?:\.\d+)?$")


def package_branch(name: str) -> str | None:
    """The driver branch a package belongs to, or None for packages that are not driver packages."""
    match = _USERSPACE_PACKAGE.match(name) or _KERNEL_PACKAGE.match(name)
    return match.group("branch") if match else None


def parse_dpkg_query(output: str) -> list[dict[str, str]]:
    """Installed driver packages from ``dpkg-query -W -f DPKG_QUERY_FORMAT``."""
    packages = []
    for line in output.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or fields[2] != "installed":
            continue
        branch = package_branch(fields[0])
        if branch:
            packages.append({"name": fields[0], "version": fields[1], "branch": branch})
    return packages


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
    """Reasons the host breaks the driver-branch rule; empty when it keeps it."""
    reasons = []
    foreign = [p for p in packages if p["branch"] != allowed_branch]
    if foreign:
        listed = ", ".join(f"{p['name']} {p['version']}" for p in foreign)
        reasons.append(f"installed driver packages of another branch than {allowed_branch}: {listed}")
    running = sorted({v for v in smi_versions if _DRIVER_VERSION.match(v).group("branch") != allowed_branch})
    if running:
        reasons.append(f"nvidia-smi reports driver {', '.join(running)}, not branch {allowed_branch}")
    incoming = [c for c in upgrade_changes or () if c["branch"] != allowed_branch]
    if incoming:
        listed = ", ".join(f"{c['name']} {c['version']}" for c in incoming)
        reasons.append(f"the upgrade would bring driver packages of another branch than {allowed_branch}: {listed}")
    return reasons
