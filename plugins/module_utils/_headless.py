# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The headless role's units in one step: the default target set as ``systemctl set-default`` sets
it (a link, so check and diff mode can show it), the listed services that are enabled disabled with
one ``systemctl disable``, those the host has masked with one ``systemctl mask``, the sleep targets
masked, each stopped with ``--now`` when asked, and the running units read again after a stop.
The unit files and the running units are read once, before anything changes.

Private to the collection; the headless_units module is its caller. Check mode is answered here:
the same reads and decisions, nothing linked, disabled, masked or stopped.
"""

from __future__ import annotations

import os
import stat
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem, temporary_path
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import UNIT_NAME, listed_unit_states, unit_name_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._tools import Runner

DEFAULT_TARGET_LINK = "/etc/systemd/system/default.target"
SYSTEM_UNITS = "/lib/systemd/system"
LISTED_TYPES = ("service", "socket", "target")
LIST_UNIT_FILES = ["systemctl", "list-unit-files", "--no-legend", "--plain", f"--type={','.join(LISTED_TYPES)}"]
# Sockets too: a masked socket still listening was masked without a stop.
LIST_RUNNING = ["systemctl", "list-units", "--no-legend", "--plain", "--type=service,socket", "--state=running,listening"]
# A name that ends in none of systemd's unit types is a service, as systemctl reads it.
UNIT_TYPES = frozenset(("service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path", "slice", "scope"))
# What the wait_online role enables; disabled or masked, Docker starts before the LAN address exists.
WAIT_ONLINE_UNITS = frozenset(("NetworkManager-wait-online.service", "systemd-networkd-wait-online.service", "ifupdown-wait-online.service"))
# The options whose names reach systemctl.
UNIT_OPTIONS = ("disable_services", "mask_services", "mask_targets")
# The headless role's variable behind each option, for the fleet check's refusals.
ROLE_VARIABLES = {"default_target": "headless_default_target", "disable_services": "headless_disable_services",
                  "mask_services": "headless_mask_services", "mask_targets": "headless_mask_sleep_targets"}


class HeadlessProblem(FileProblem):
    """What stopped the default target or the units from being set, with the fix; a FileProblem, so
    ``except FileProblem`` catches it. ``changed``: what the step had already changed when it stopped."""

    def __init__(self, message: str, changed: bool = False) -> None:
        super().__init__(message)
        self.changed = changed


class UnitChanges(t.NamedTuple):
    """What the listings say is left to do, each list in the order the options give it."""

    disable: list[str]
    mask: list[str]
    # Masked without a stop and still running: masked again with --now, which stops them.
    masked_running: list[str]
    mask_targets: list[str]
    # The units running or listening that a --now call stops.
    stop: list[str]


def unit_file_name(name: str) -> str:
    """``name`` as systemctl reads it: ``cups`` and ``snap.firmware-updater.firmware-notifier`` are services, ``snapd.socket`` a socket."""
    return name if "." in name and name.rpartition(".")[2] in UNIT_TYPES else f"{name}.service"


def unit_file_names(names: t.Sequence[str]) -> list[str]:
    """Each name as systemctl reads it, once, in the order given."""
    return list(dict.fromkeys(unit_file_name(name) for name in names))


def options_problems(default_target: t.Any, units: t.Mapping[str, t.Sequence[t.Any]],
                     labels: t.Mapping[str, str] | None = None) -> list[str]:
    """What is wrong with the default target and with the unit names of each of UNIT_OPTIONS in
    ``units``, each named by ``labels`` (the role's variables; the module's options by default)."""
    named = {**{option: option for option in ("default_target", *UNIT_OPTIONS)}, **(labels or {})}
    problems = []
    if not isinstance(default_target, str) or not UNIT_NAME.fullmatch(default_target) or not default_target.endswith(".target"):
        problems.append(f"{named['default_target']}: {default_target!r} is not a target's unit name; give one such as multi-user.target")
    for option in UNIT_OPTIONS:
        names = units.get(option) or []
        # unit_name_problems names each as units[index]; here each option names its own.
        bad = [f"{named[option]}{problem.removeprefix('units')}" for problem in unit_name_problems(names)]
        # The listing covers these types only: a unit of another type would never be found, so never changed.
        listed = ("target",) if option == "mask_targets" else LISTED_TYPES
        bad += [f"{named[option]}[{index}]: {name!r} is a {unit_file_name(name).rpartition('.')[2]}, and this list takes "
                f"{' or '.join(listed)} units only; remove it (its unit type is not one the role reads)"
                for index, name in enumerate(names) if isinstance(name, str) and UNIT_NAME.fullmatch(name)
                and unit_file_name(name).rpartition(".")[2] not in listed]
        bad += [f"{named[option]}[{index}]: {name!r} must stay enabled so Docker starts after the LAN address exists (seed 000's "
                "LAN-bind race; the wait_online role enables it); remove it from the list"
                for index, name in enumerate(names) if option != "mask_targets" and isinstance(name, str)
                and unit_file_name(name) in WAIT_ONLINE_UNITS]
        problems += bad
    return problems


def listed_units(output: str) -> list[str]:
    """The units ``systemctl list-units --no-legend --plain`` lists, in its order."""
    return [fields[0] for fields in map(str.split, output.splitlines()) if fields]


def plan_changes(unit_files: str, running: t.Sequence[str], *, disable_services: t.Sequence[str], mask_services: t.Sequence[str],
                 mask_targets: t.Sequence[str], stop_services: bool) -> UnitChanges:
    """What is left to do on a host whose ``systemctl list-unit-files`` printed ``unit_files`` and
    whose running units are ``running``; a unit already as wanted is left alone."""
    states = listed_unit_states(unit_files)
    # Only a lasting mask counts: a runtime one is gone at the next boot, so it is masked again.
    masked = {unit for unit, state in states.items() if state == "masked"}
    disable = [unit for unit in unit_file_names(disable_services) if states.get(unit) == "enabled"]
    # An alias (smartd.service for smartmontools.service) cannot be masked; its unit, listed under its own name, can.
    present = [unit for unit in unit_file_names(mask_services) if unit in states and states[unit] != "alias"]
    mask = [unit for unit in present if unit not in masked]
    masked_running = [unit for unit in present if unit in masked and unit in running] if stop_services else []
    # A mask holds for a target the host lacks, should a package bring it later.
    targets = [target for target in dict.fromkeys(mask_targets) if target not in masked]
    stop = [unit for unit in dict.fromkeys(disable + mask + masked_running) if unit in running] if stop_services else []
    return UnitChanges(disable, mask, masked_running, targets, stop)


def change_calls(changes: UnitChanges, stop_services: bool) -> list[list[str]]:
    """The systemctl calls that make ``changes``: one disable, and one mask (two with a stop, since
    the targets are only masked, never stopped)."""
    now = ["--now"] if stop_services else []
    services = changes.mask + changes.masked_running
    masks = [(now, services), ([], changes.mask_targets)] if stop_services else [([], services + changes.mask_targets)]
    calls = [["systemctl", "disable", *now, "--", *changes.disable]] if changes.disable else []
    return calls + [["systemctl", "mask", *flags, "--", *units] for flags, units in masks if units]


def read_units(run: Runner, argv: list[str]) -> str:
    rc, out, err = run(argv)
    if rc != 0:
        raise HeadlessProblem(f"{' '.join(argv)} exited {rc}: {err.strip() or out.strip()}; is systemd running on the host (as PID 1)?")
    return out


# Each change's participle and fix, for its error.
CHANGE_FAILURES = {
    "disable": ("disabled", "the task must run as root (become: true)"),
    "mask": ("masked", "the task must run as root (become: true), and a unit file of that name in /etc/systemd/system (not a link) "
                       "blocks the mask: move it away"),
}


def change_units(run: Runner, argv: list[str]) -> None:
    rc, out, err = run(argv)
    if rc != 0:
        participle, fix = CHANGE_FAILURES[argv[1]]
        if "--now" in argv:
            participle += " and stopped"
        units = argv[argv.index("--") + 1:]
        raise HeadlessProblem(f"{', '.join(units)} could not be {participle}: {' '.join(argv[:2])} exited {rc}: {err.strip() or out.strip()}; {fix}")


def read_link(path: str) -> tuple[str, str]:
    """What is at ``path``: ("link", where it points), ("file", "") or ("absent", "")."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "absent", ""
    except OSError as error:
        raise HeadlessProblem(f"{path}: cannot be read ({error.strerror}); run the task as root (become: true)") from error
    if stat.S_ISLNK(mode):
        return "link", os.readlink(path)
    if stat.S_ISDIR(mode):
        raise HeadlessProblem(f"{path}: is a folder, where systemd reads the default target from a link; move it away")
    return "file", ""


def link_text(kind: str, destination: str) -> str:
    """What the diff shows of what read_link found (an absent link shows as nothing, as a missing file does)."""
    return {"link": f"link to {destination}\n", "file": "a file, not a link\n", "absent": ""}[kind]


def set_link(path: str, destination: str) -> None:
    """Point ``path`` at ``destination`` with one rename over what is there, so systemd never finds it missing."""
    folder = os.path.dirname(path)
    temporary = temporary_path(path)
    try:
        os.symlink(destination, temporary)
    except FileNotFoundError as error:
        raise HeadlessProblem(f"{path}: its folder {folder} does not exist; is systemd installed on the host?") from error
    except OSError as error:
        raise HeadlessProblem(f"{path}: cannot be written ({error.strerror}); run the task as root (become: true)") from error
    try:
        os.replace(temporary, path)
    except OSError as error:
        os.unlink(temporary)
        raise HeadlessProblem(f"{path}: cannot be replaced ({error.strerror}); run the task as root (become: true)") from error


def set_headless_units(run: Runner, *, default_target: t.Any, disable_services: t.Sequence[str], mask_services: t.Sequence[str],
                       mask_targets: t.Sequence[str], stop_services: bool, expected_services: t.Sequence[str], check_mode: bool,
                       link: str = DEFAULT_TARGET_LINK, unit_folder: str = SYSTEM_UNITS) -> dict[str, t.Any]:
    """The whole step. Every name is checked, and the default target's link, the unit files and the
    running units read, before anything changes; then the link, the disables and the masks, in the
    headless role's order. HeadlessProblem says what stopped it and the fix."""
    problems = options_problems(default_target, {"disable_services": disable_services, "mask_services": mask_services,
                                                 "mask_targets": mask_targets})
    if problems:
        raise HeadlessProblem("; ".join(problems))
    source = os.path.join(unit_folder, default_target)
    if not os.path.exists(source):
        raise HeadlessProblem(f"default_target: {default_target} has no unit file in {unit_folder}, so the host could not boot into it "
                              "(systemctl set-default refuses it too); give a target the host has (systemctl list-unit-files --type=target)")
    kind, destination = read_link(link)
    unit_files = read_units(run, LIST_UNIT_FILES)
    running = listed_units(read_units(run, LIST_RUNNING))
    changes = plan_changes(unit_files, running, disable_services=disable_services, mask_services=mask_services,
                           mask_targets=mask_targets, stop_services=stop_services)
    relink = (kind, destination) != ("link", source)
    if check_mode:
        # The stops are not run, so the units that would stop with them cannot be known; those stopped by name can.
        running = [unit for unit in running if unit not in changes.stop]
    else:
        if relink:
            set_link(link, source)
        for done, argv in enumerate(change_calls(changes, stop_services)):
            try:
                change_units(run, argv)
            except HeadlessProblem as error:
                already = [f"{link} points at {source}"] * relink + ([f"{done} systemctl call(s) before it ran"] if done else [])
                raise HeadlessProblem(f"{error}. Already changed: {'; '.join(already)}" if already else str(error),
                                      changed=bool(already)) from error
        if changes.stop:
            # Stopping a unit also stops the units that require it, so the host is read again.
            running = listed_units(read_units(run, LIST_RUNNING))
    expected = set(unit_file_names(expected_services))
    return {"changed": relink or bool(changes.disable or changes.mask or changes.mask_targets or changes.stop),
            "default_target": {"before": os.path.basename(destination) if kind == "link" else "", "after": default_target},
            "disabled": changes.disable, "masked": changes.mask + changes.mask_targets, "stopped": changes.stop, "running": running,
            "unexpected": [unit for unit in running if unit.endswith(".service") and unit not in expected],
            "diff": [{"before_header": link, "after_header": link, "before": link_text(kind, destination),
                      "after": link_text("link", source)}] if relink else []}
