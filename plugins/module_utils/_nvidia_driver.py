# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the NVIDIA driver branch from dpkg, nvidia-smi and an apt upgrade simulation.

Private to the collection. Seed 000: stay on the 580 branch (590 had a CUDA-graph
deadlock on GB10), and check the branch an upgrade would bring before rebooting into it. An
install dpkg did not finish (unpacked, half-configured, awaiting triggers, or needing a
reinstall) or a removed branch's leftover configuration counts against the rule too: the next
``dpkg --configure -a`` or apt run would finish it. On a board whose class names a kernel-module
flavour (GB10: open) and a validated kernel line (GB10: 6.17), the proprietary modules and another
kernel line, installed, running or incoming, break the rule too. Standard library only: it runs on
the host.
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
# The packages that carry the kernel modules, in the open (``-open``) or the proprietary flavour:
# nvidia-driver-580, nvidia-dkms-580-server-open, linux-modules-nvidia-580-open-6.17.0-1021-nvidia...
_FLAVOURED_PACKAGE = re.compile(
    r"^(?:nvidia-(?:driver|dkms|kernel-source)|linux-(?:modules|objects|signatures)-nvidia)-(?P<branch>\d{3})(?P<rest>(?:-[a-z0-9.]+)*)$"
)
OPEN, PROPRIETARY = "open", "proprietary"
# linux-image-6.17.0-1021-nvidia (and its unsigned twin): one kernel release.
_KERNEL_IMAGE = re.compile(r"^linux-image-(?:unsigned-)?(?P<release>\d+\.\d+\.\d+-[A-Za-z0-9.+-]+)$")
# linux-nvidia-hwe-24.04, linux-image-generic...: the metapackages that move a host to newer kernels.
_KERNEL_METAPACKAGE = re.compile(r"^linux-(?:image-|headers-|tools-)?(?:generic|nvidia)(?:-[a-z0-9.]+)*$")
# Shared files of a kernel line (linux-nvidia-tools-common...): no metapackage, and a hold would block their updates.
_NOT_METAPACKAGE = re.compile(r"-common$")
_KERNEL_RELEASE_IN_NAME = re.compile(r"\d+\.\d+\.\d+-\d+")
_KERNEL_LINE = re.compile(r"^(?P<line>\d+\.\d+)(?:[.-]|$)")
# How a validated line is written: major.minor.
KERNEL_LINE_FORMAT = re.compile(r"\d{1,2}\.\d{1,3}")
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


def package_flavour(name: str) -> str | None:
    """open or proprietary for a package that carries the kernel modules; None for any other package."""
    match = _FLAVOURED_PACKAGE.match(name)
    if not match:
        return None
    return OPEN if OPEN in match.group("rest").split("-") else PROPRIETARY


def kernel_line(release: str) -> str | None:
    """The major.minor line of a kernel release (6.17 of 6.17.0-1021-nvidia)."""
    match = _KERNEL_LINE.match(release)
    return match.group("line") if match else None


def parse_kernel_packages(output: str) -> dict[str, list[str]]:
    """The kernel releases and the kernel metapackages dpkg finished installing, from the same
    ``dpkg-query -W -f DPKG_QUERY_FORMAT`` output the driver packages come from."""
    releases, metapackages = [], []
    for line in output.splitlines():
        fields = line.split("\t")
        if len(fields) != 4 or fields[2] != INSTALLED:
            continue
        image = _KERNEL_IMAGE.match(fields[0])
        if image:
            releases.append(image.group("release"))
        elif _KERNEL_METAPACKAGE.match(fields[0]) and not _KERNEL_RELEASE_IN_NAME.search(fields[0]) \
                and not _NOT_METAPACKAGE.search(fields[0]):
            metapackages.append(fields[0])
    return {"releases": sorted(set(releases)), "metapackages": metapackages}


def parse_incoming_kernels(output: str) -> list[dict[str, str]]:
    """The kernel releases an ``apt-get -s`` run would install: package name, version and release."""
    kernels = []
    for line in output.splitlines():
        match = _APT_INSTALL.match(line)
        image = _KERNEL_IMAGE.match(match.group("name")) if match else None
        if image:
            kernels.append({"name": match.group("name"), "version": match.group("version"), "release": image.group("release")})
    return kernels


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


def unfinished_reasons(allowed_branch: str, packages: t.Sequence[t.Mapping[str, str]], flavour: str | None = None) -> list[str]:
    """Why the unfinished packages break the rule, each with its fix: the allowed branch's are
    finished, another branch's are purged (finishing them would install that branch). Where the board
    needs the open flavour, the proprietary flavour's are the flavour rule's to name (purge, not finish)."""
    left = [p for p in unfinished(allowed_branch, packages) if not (flavour == OPEN and package_flavour(p["name"]) == PROPRIETARY)]
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


def flavour_reasons(flavour: str | None, packages: t.Sequence[t.Mapping[str, t.Any]],
                    upgrade_changes: t.Sequence[t.Mapping[str, t.Any]] | None) -> list[str]:
    """The proprietary kernel modules, installed or incoming, where the board needs the open ones."""
    if flavour != OPEN:
        return []
    reasons = []
    fix = ("a GB10's Blackwell GPU initialises only with the open kernel modules (the proprietary ones fail with Xid 169, "
           "RmInitAdapter failed), so install nvidia-driver-{branch}-open, which replaces them, or set "
           "sparkfleet_hardware_overrides.driver_flavour to null deliberately")
    # Half-installed ones too: finishing them (dpkg --configure -a) would install modules a GB10 cannot run.
    proprietary = [p for p in packages if p.get("status") != CONFIG_FILES and package_flavour(p["name"]) == PROPRIETARY]
    if proprietary:
        listed = ", ".join(f"{p['name']} {p['version']}" for p in proprietary)
        reasons.append(f"driver packages of the proprietary kernel-module flavour are installed: {listed}; "
                       + fix.format(branch=proprietary[0]["branch"]) + f" (sudo apt-get purge {' '.join(p['name'] for p in proprietary)})")
    incoming = [c for c in upgrade_changes or () if package_flavour(c["name"]) == PROPRIETARY]
    if incoming:
        listed = ", ".join(f"{c['name']} {c['version']}" for c in incoming)
        reasons.append(f"the upgrade would bring driver packages of the proprietary kernel-module flavour: {listed}; hold or pin "
                       "the meta package that pulls them in (the open flavour is the one a GB10 runs)")
    return reasons


def release_order(release: str) -> tuple[int, ...]:
    """A kernel release's numbers in order (6.17.0-1021-nvidia: 6, 17, 0, 1021), to tell which GRUB boots first."""
    return tuple(int(number) for number in re.findall(r"\d+", release.split("-nvidia")[0])[:4])


def kernel_reasons(line: str | None, running_release: str, incoming_kernels: t.Sequence[t.Mapping[str, str]] | None,
                   metapackages: t.Sequence[str], installed_releases: t.Sequence[str] = ()) -> list[str]:
    """The running kernel, an installed kernel newer than it (GRUB boots the newest at the next reboot) and a kernel an
    upgrade would install, off the board's validated line."""
    if not line:
        return []
    reasons = []
    why = "the line validated on this board (the 7.x kernels behind linux-nvidia-hwe have a RoCE regression on the fast link)"
    if kernel_line(running_release) != line:
        reasons.append(f"the running kernel {running_release} is not on the {line} line, {why}; boot a {line} kernel (it stays "
                       "installed beside the new one: pick it in GRUB, then remove or hold the other), or set "
                       "sparkfleet_hardware_overrides.kernel_line deliberately")
    waiting = [release for release in installed_releases
               if kernel_line(release) != line and release_order(release) > release_order(running_release)]
    if waiting:
        packages = " ".join(f"linux-image-{release}" for release in waiting)
        reasons.append(f"a kernel off the {line} line is installed and newer than the running one, so GRUB boots it at the next "
                       f"reboot: {', '.join(waiting)}, {why}; remove it before rebooting (sudo apt-get purge {packages}) and hold "
                       f"the metapackage that pulled it in (sudo apt-mark hold {' '.join(metapackages) or 'the kernel metapackage'})")
    foreign = [k for k in incoming_kernels or () if kernel_line(k["release"]) != line]
    if foreign:
        listed = ", ".join(f"{k['name']} {k['version']}" for k in foreign)
        hold = " ".join(metapackages) or "the kernel metapackage"
        reasons.append(f"the upgrade would bring a kernel off the {line} line, {why}: {listed}; hold the metapackage that pulls "
                       f"it in (sudo apt-mark hold {hold}) and run the guard again")
    return reasons


def judge(
    allowed_branch: str,
    packages: t.Sequence[t.Mapping[str, t.Any]],
    smi_versions: t.Sequence[str],
    upgrade_changes: t.Sequence[t.Mapping[str, t.Any]] | None,
    flavour: str | None = None,
) -> list[str]:
    """Reasons the host breaks the driver-branch rule (and the flavour rule where ``flavour`` is
    open), each with its fix; empty when it keeps it. ``packages`` is every driver package dpkg
    knows of (``parse_dpkg_query``)."""
    reasons = []
    foreign = [p for p in installed(packages) if p["branch"] != allowed_branch]
    if foreign:
        listed = ", ".join(f"{p['name']} {p['version']}" for p in foreign)
        reasons.append(f"installed driver packages of another branch than {allowed_branch}: {listed}; remove them, or change "
                       "driver_guard_allowed_branch deliberately")
    reasons += unfinished_reasons(allowed_branch, packages, flavour)
    running = sorted({v for v in smi_versions if _DRIVER_VERSION.match(v).group("branch") != allowed_branch})
    if running:
        reasons.append(f"nvidia-smi reports driver {', '.join(running)}, not branch {allowed_branch}")
    incoming = [c for c in upgrade_changes or () if c["branch"] != allowed_branch]
    if incoming:
        listed = ", ".join(f"{c['name']} {c['version']}" for c in incoming)
        reasons.append(f"the upgrade would bring driver packages of another branch than {allowed_branch}: {listed}; hold or "
                       "pin the meta package that pulls them in")
    return reasons + flavour_reasons(flavour, packages, upgrade_changes)
