"""The headless step with the default target's link in a temporary folder and a recording runner
standing in for systemctl, answering in the formats systemd 252 and later print on a DGX OS desktop
install: aliases, units already disabled, a masked unit still running, a target already masked and
a runtime mask; check mode answered the same and changing nothing, a second run only reading, and
every refusal made before anything changes."""

import pathlib

import pytest
import yaml

from ansible_collections.sparkfleet.vllm.plugins.module_utils._headless import (
    LIST_RUNNING,
    LIST_UNIT_FILES,
    ROLE_VARIABLES,
    UNIT_OPTIONS,
    HeadlessProblem,
    options_problems,
    set_headless_units,
    unit_file_name,
)

ROLE = pathlib.Path(__file__).resolve().parents[4] / "roles" / "headless"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
# The module's options as the role passes them.
ROLE_OPTIONS = {"default_target": DEFAULTS["headless_default_target"], "disable_services": DEFAULTS["headless_disable_services"],
                "mask_services": DEFAULTS["headless_mask_services"], "mask_targets": DEFAULTS["headless_mask_sleep_targets"],
                "stop_services": DEFAULTS["headless_stop_services"], "expected_services": DEFAULTS["headless_expected_services"]}
# systemctl list-unit-files --no-legend --plain --type=service,socket,target: unit -> (state, preset).
UNIT_FILES = {
    "avahi-daemon.service": ("enabled", "enabled"),
    "avahi-daemon.socket": ("enabled", "enabled"),
    "cron.service": ("enabled", "enabled"),
    "cups-browsed.service": ("enabled", "enabled"),
    "cups.service": ("enabled", "enabled"),
    "dbus.service": ("static", "-"),
    "fwupd.service": ("static", "-"),
    "graphical.target": ("static", "-"),
    "hibernate.target": ("static", "-"),
    "hybrid-sleep.target": ("static", "-"),
    "multi-user.target": ("static", "-"),
    "NetworkManager-wait-online.service": ("enabled", "enabled"),
    "rpc-statd.service": ("static", "-"),
    "rpcbind.service": ("enabled", "enabled"),
    "rpcbind.socket": ("enabled", "enabled"),
    "rsyslog.service": ("enabled", "enabled"),
    "sleep.target": ("static", "-"),
    "smartd.service": ("alias", "-"),
    "smartmontools.service": ("enabled", "enabled"),
    "snap.firmware-updater.firmware-notifier.service": ("enabled", "enabled"),
    "snapd.service": ("enabled", "enabled"),
    "snapd.socket": ("enabled", "enabled"),
    "ssh.service": ("enabled", "enabled"),
    "sshd.service": ("alias", "-"),
    "suspend.target": ("masked", "-"),
    "syslog.service": ("alias", "-"),
    "udisks2.service": ("disabled", "enabled"),
    "upower.service": ("masked-runtime", "enabled"),
    "wpa_supplicant.service": ("masked", "enabled"),
}
# systemctl list-units --no-legend --plain --type=service,socket --state=running,listening: unit -> (sub state, description).
RUNNING = {
    "avahi-daemon.service": ("running", "Avahi mDNS/DNS-SD Stack"),
    "avahi-daemon.socket": ("running", "Avahi mDNS/DNS-SD Stack Activation Socket"),
    "cron.service": ("running", "Regular background program processing daemon"),
    "cups-browsed.service": ("running", "Make remote CUPS printers available locally"),
    "cups.service": ("running", "CUPS Scheduler"),
    "dbus.service": ("running", "D-Bus System Message Bus"),
    "dbus.socket": ("running", "D-Bus System Message Bus Socket"),
    "rpc-statd.service": ("running", "NFS status monitor for NFSv2/3 locking."),
    "rpcbind.service": ("running", "RPC bind portmap service"),
    "rpcbind.socket": ("listening", "RPCbind Server Activation Socket"),
    "rsyslog.service": ("running", "System Logging Service"),
    "smartmontools.service": ("running", "Self Monitoring and Reporting Technology (SMART) Daemon"),
    "snapd.socket": ("running", "Socket activation for snappy daemon"),
    "ssh.service": ("running", "OpenBSD Secure Shell server"),
    "systemd-journald.service": ("running", "Journal Service"),
    "systemd-journald.socket": ("running", "Journal Socket"),
    "systemd-logind.service": ("running", "User Login Management"),
    "udisks2.service": ("running", "Disk Manager"),
    "user@1000.service": ("running", "User Manager for UID 1000"),
    "wpa_supplicant.service": ("running", "WPA supplicant"),
}
# Units stopped with the unit they require (Requires=rpcbind.socket).
REQUIRED_BY = {"rpcbind.socket": ["rpcbind.service", "rpc-statd.service"]}
DISABLED = ["snapd.service", "snapd.socket", "snap.firmware-updater.firmware-notifier.service", "cups.service", "cups-browsed.service",
            "avahi-daemon.service", "smartmontools.service", "rpcbind.service", "rsyslog.service"]
MASKED_SERVICES = ["snapd.service", "snapd.socket", "rpcbind.service", "rpcbind.socket", "rpc-statd.service", "smartmontools.service",
                   "rsyslog.service", "fwupd.service", "udisks2.service", "upower.service"]
MASKED_TARGETS = ["sleep.target", "hibernate.target", "hybrid-sleep.target"]
STOPPED = ["snapd.socket", "cups.service", "cups-browsed.service", "avahi-daemon.service", "smartmontools.service", "rpcbind.service",
           "rsyslog.service", "rpcbind.socket", "rpc-statd.service", "udisks2.service", "wpa_supplicant.service"]
RUNNING_AFTER = ["avahi-daemon.socket", "cron.service", "dbus.service", "dbus.socket", "ssh.service", "systemd-journald.service",
                 "systemd-journald.socket", "systemd-logind.service", "user@1000.service"]
# What systemctl prints when a unit file, not a link, holds the name (systemd 252).
MASK_BLOCKED = "Failed to mask unit: File /etc/systemd/system/rsyslog.service already exists.\n"
NOT_BOOTED = "System has not been booted with systemd as init system (PID 1). Can't operate.\nFailed to connect to bus: Host is down\n"


class Host:
    """A recording runner: systemctl answering from, and changing, the host's unit files and running units."""

    def __init__(self, unit_files=None, running=None, failures=None):
        self.unit_files = dict(UNIT_FILES if unit_files is None else unit_files)
        self.running = dict(RUNNING if running is None else running)
        self.failures = failures or {}
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[1] in self.failures:
            return self.failures[argv[1]]
        if argv == LIST_UNIT_FILES:
            return 0, "".join(f"{unit:<48} {state:<15} {preset}\n" for unit, (state, preset) in sorted(self.unit_files.items())), ""
        if argv == LIST_RUNNING:
            return 0, "".join(f"{unit:<26} loaded active {sub:<9} {text}\n" for unit, (sub, text) in sorted(self.running.items())), ""
        if argv[0] != "systemctl" or argv[1] not in ("disable", "mask"):
            return 2, "", f"unexpected {argv}"
        units = argv[argv.index("--") + 1:]
        for unit in units:
            preset = self.unit_files.get(unit, ("", "-"))[1]
            self.unit_files[unit] = ("disabled" if argv[1] == "disable" else "masked", preset)
            if "--now" in argv:
                self.stop(unit)
        if argv[1] == "disable":
            return 0, "", "".join(f'Removed "/etc/systemd/system/multi-user.target.wants/{unit}".\n' for unit in units)
        return 0, "", "".join(f"Created symlink /etc/systemd/system/{unit} → /dev/null.\n" for unit in units)

    def stop(self, unit):
        self.running.pop(unit, None)
        for dependent in REQUIRED_BY.get(unit, []):
            self.stop(dependent)

    def changes(self):
        return [argv for argv in self.calls if argv not in (LIST_UNIT_FILES, LIST_RUNNING)]


@pytest.fixture
def systemd(tmp_path):
    """The unit files' folder with two targets, and default.target linked to graphical.target as a desktop install has it."""
    units = tmp_path / "lib" / "systemd" / "system"
    units.mkdir(parents=True)
    for target in ("graphical.target", "multi-user.target"):
        (units / target).write_text("[Unit]\nDescription=a target\n")
    folder = tmp_path / "etc" / "systemd" / "system"
    folder.mkdir(parents=True)
    (folder / "default.target").symlink_to(units / "graphical.target")
    return {"units": units, "link": folder / "default.target"}


def headless(systemd, host, check_mode=False, **options):
    return set_headless_units(host, check_mode=check_mode, link=str(systemd["link"]), unit_folder=str(systemd["units"]),
                              **{**ROLE_OPTIONS, **options})


@pytest.mark.parametrize(("name", "unit"), [
    ("cups", "cups.service"),
    ("cups.service", "cups.service"),
    ("snapd.socket", "snapd.socket"),
    ("getty@tty1", "getty@tty1.service"),
    ("sleep.target", "sleep.target"),
    ("dev-zram0.swap", "dev-zram0.swap"),
    ("snap.firmware-updater.firmware-notifier", "snap.firmware-updater.firmware-notifier.service"),
])
def test_a_name_without_a_unit_type_is_a_service(name, unit):
    assert unit_file_name(name) == unit


@pytest.mark.parametrize("name", ["NetworkManager-wait-online", "systemd-networkd-wait-online.service", "ifupdown-wait-online"])
def test_the_wait_online_units_are_refused_however_they_are_spelled(name):
    """One reading of the names for the module and the role's check (seed 000's LAN-bind race)."""
    problems = options_problems("multi-user.target", {"disable_services": ["cups"], "mask_services": [name], "mask_targets": []},
                                ROLE_VARIABLES)
    assert problems == [f"headless_mask_services[0]: {name!r} must stay enabled so Docker starts after the LAN address exists "
                        "(seed 000's LAN-bind race; the wait_online role enables it); remove it from the list"]
    assert options_problems(DEFAULTS["headless_default_target"], {option: ROLE_OPTIONS[option] for option in UNIT_OPTIONS}) == [], \
        "the defaults leave them alone"


def test_check_mode_reports_everything_and_changes_nothing_then_the_run_does_it_once(systemd):
    graphical = str(systemd["units"] / "graphical.target")
    multi_user = str(systemd["units"] / "multi-user.target")
    host = Host()
    check = headless(systemd, host, check_mode=True)
    assert check["changed"] and check["default_target"] == {"before": "graphical.target", "after": "multi-user.target"}
    assert check["disabled"] == DISABLED and check["masked"] == MASKED_SERVICES + MASKED_TARGETS and check["stopped"] == STOPPED
    assert check["running"] == RUNNING_AFTER and check["unexpected"] == ["user@1000.service"]
    assert check["diff"] == [{"before_header": str(systemd["link"]), "after_header": str(systemd["link"]),
                              "before": f"link to {graphical}\n", "after": f"link to {multi_user}\n"}]
    assert host.changes() == [] and host.running == RUNNING and host.unit_files == UNIT_FILES
    assert str(systemd["link"].readlink()) == graphical

    done = headless(systemd, host)
    assert done == check, "check mode answered the same"
    assert host.changes() == [["systemctl", "disable", "--now", "--", *DISABLED],
                              ["systemctl", "mask", "--now", "--", *MASKED_SERVICES, "wpa_supplicant.service"],
                              ["systemctl", "mask", "--", *MASKED_TARGETS]], "one call per kind of change, the targets never stopped"
    assert host.calls[-1] == LIST_RUNNING, "the running units read again after the stops"
    assert str(systemd["link"].readlink()) == multi_user
    assert sorted(host.running) == RUNNING_AFTER

    host.calls = []
    again = headless(systemd, host)
    assert again == {"changed": False, "default_target": {"before": "multi-user.target", "after": "multi-user.target"}, "disabled": [],
                     "masked": [], "stopped": [], "running": RUNNING_AFTER, "unexpected": ["user@1000.service"], "diff": []}
    assert host.calls == [LIST_UNIT_FILES, LIST_RUNNING], "a no-op only reads, once each"


def test_an_alias_is_never_masked_its_unit_is(systemd):
    host = Host()
    done = headless(systemd, host, disable_services=["smartd", "sshd"], mask_services=["smartd", "syslog", "smartmontools"], mask_targets=[])
    assert done["disabled"] == [] and done["masked"] == ["smartmontools.service"]
    assert host.changes() == [["systemctl", "mask", "--now", "--", "smartmontools.service"]]


def test_a_masked_unit_still_running_is_stopped_and_not_reported_as_masked(systemd):
    host = Host()
    done = headless(systemd, host, disable_services=[], mask_services=["wpa_supplicant"], mask_targets=[])
    assert done["changed"] and done["masked"] == [] and done["stopped"] == ["wpa_supplicant.service"]
    assert host.changes() == [["systemctl", "mask", "--now", "--", "wpa_supplicant.service"]]
    assert "wpa_supplicant.service" not in host.running and "wpa_supplicant.service" not in done["running"]


def test_without_stopping_nothing_is_stopped_and_the_host_is_not_read_again(systemd):
    host = Host()
    done = headless(systemd, host, stop_services=False)
    assert done["stopped"] == [] and done["masked"] == MASKED_SERVICES + MASKED_TARGETS
    assert host.changes() == [["systemctl", "disable", "--", *DISABLED], ["systemctl", "mask", "--", *MASKED_SERVICES, *MASKED_TARGETS]], \
        "the masked unit still running is left alone, the targets masked in the same call"
    assert host.running == RUNNING and host.calls.count(LIST_RUNNING) == 1
    assert "cups.service" in done["unexpected"] and "wpa_supplicant.service" in done["running"]


def test_units_not_enabled_are_not_disabled_and_a_runtime_mask_is_made_lasting(systemd):
    host = Host()
    done = headless(systemd, host, disable_services=["udisks2", "fwupd", "rpc-statd", "wpa_supplicant", "bluetooth", "cron"],
                    mask_services=["upower", "bluetooth"], mask_targets=[])
    assert done["disabled"] == ["cron.service"], "disabled, static, masked and missing units are left alone"
    assert done["masked"] == ["upower.service"] and host.unit_files["upower.service"] == ("masked", "enabled")
    assert host.changes() == [["systemctl", "disable", "--now", "--", "cron.service"], ["systemctl", "mask", "--now", "--", "upower.service"]]


def test_a_target_already_masked_is_left_alone_and_a_missing_one_is_masked(systemd):
    host = Host()
    done = headless(systemd, host, disable_services=[], mask_services=[], mask_targets=["suspend.target", "sleep.target", "no-such.target"])
    assert done["masked"] == ["sleep.target", "no-such.target"] and done["stopped"] == []
    assert host.changes() == [["systemctl", "mask", "--", "sleep.target", "no-such.target"]]


def test_the_running_units_are_read_again_after_a_stop(systemd):
    """Stopping rpcbind.socket stops the services that require it; only the host can tell."""
    host = Host()
    done = headless(systemd, host, disable_services=[], mask_services=["rpcbind.socket"], mask_targets=[], expected_services=["ssh"])
    assert done["stopped"] == ["rpcbind.socket"]
    assert "rpc-statd.service" not in done["running"] and "rpcbind.service" not in done["unexpected"]
    check = headless(systemd, Host(), check_mode=True, disable_services=[], mask_services=["rpcbind.socket"], mask_targets=[])
    assert "rpc-statd.service" in check["running"], "check mode leaves out only the units it would stop itself"


@pytest.mark.parametrize(("make", "before", "shown"), [
    (lambda link, units: link.unlink(), "", ""),
    (lambda link, units: (link.unlink(), link.write_text("[Unit]\nDescription=a copy\n")), "", "a file, not a link\n"),
    (lambda link, units: (link.unlink(), link.symlink_to("/usr/lib/systemd/system/graphical.target")), "graphical.target",
     "link to /usr/lib/systemd/system/graphical.target\n"),
], ids=["absent", "file", "other-path"])
def test_whatever_is_at_the_link_becomes_the_link_and_the_diff_shows_it(systemd, make, before, shown):
    make(systemd["link"], systemd["units"])
    done = headless(systemd, Host(), disable_services=[], mask_services=[], mask_targets=[])
    assert done["changed"] and done["default_target"]["before"] == before and done["diff"][0]["before"] == shown
    assert systemd["link"].is_symlink() and str(systemd["link"].readlink()) == str(systemd["units"] / "multi-user.target")
    assert [path.name for path in systemd["link"].parent.iterdir()] == ["default.target"], "no temporary link left behind"


@pytest.mark.parametrize(("options", "fragment"), [
    ({"default_target": "multi-user"}, "default_target: 'multi-user' is not a target's unit name; give one such as multi-user.target"),
    ({"default_target": "../../../tmp/x.target"}, "default_target: '../../../tmp/x.target' is not a target's unit name"),
    ({"default_target": "rescue.target"}, "default_target: rescue.target has no unit file in "),
    ({"disable_services": ["cups", "x;reboot"]}, "disable_services[1]: 'x;reboot' is not a systemd unit name"),
    ({"mask_services": ["--root=/tmp"]}, "mask_services[0]: '--root=/tmp' is not a systemd unit name"),
    ({"mask_targets": ["sleep.target", "a b.target"]}, "mask_targets[1]: 'a b.target' is not a systemd unit name"),
    ({"mask_services": ["cups", "apt-daily-upgrade.timer"]},
     "mask_services[1]: 'apt-daily-upgrade.timer' is a timer, and this list takes service or socket or target units only"),
    ({"mask_targets": ["sleep.target", "cups"]}, "mask_targets[1]: 'cups' is a service, and this list takes target units only"),
])
def test_a_bad_option_is_refused_before_anything_runs(systemd, options, fragment):
    host = Host()
    with pytest.raises(HeadlessProblem) as raised:
        headless(systemd, host, **options)
    assert fragment in str(raised.value)
    assert host.calls == [] and str(systemd["link"].readlink()) == str(systemd["units"] / "graphical.target")


def test_a_folder_at_the_link_is_refused_before_anything_runs(systemd):
    systemd["link"].unlink()
    systemd["link"].mkdir()
    host = Host()
    with pytest.raises(HeadlessProblem, match="default.target: is a folder, where systemd reads the default target from a link; move it away"):
        headless(systemd, host)
    assert host.calls == [] and systemd["link"].is_dir()


@pytest.mark.parametrize(("failures", "fragments", "link_changed"), [
    ({"list-unit-files": (1, "", NOT_BOOTED)},
     ["systemctl list-unit-files --no-legend --plain --type=service,socket,target exited 1: System has not been booted",
      "is systemd running on the host (as PID 1)?"], False),
    ({"list-units": (127, "", "systemctl is not installed on the host (not on its PATH)")},
     ["exited 127: systemctl is not installed on the host"], False),
    ({"disable": (1, "", "Failed to disable unit: Access denied\n")},
     [f"{', '.join(DISABLED)} could not be disabled and stopped: systemctl disable exited 1: Failed to disable unit: Access denied",
      "the task must run as root (become: true)"], True),
    ({"mask": (1, "", MASK_BLOCKED)},
     ["could not be masked and stopped: systemctl mask exited 1: Failed to mask unit: File /etc/systemd/system/rsyslog.service already",
      "a unit file of that name in /etc/systemd/system (not a link) blocks the mask: move it away"], True),
], ids=["not-booted", "no-systemctl", "disable", "mask"])
def test_a_failing_systemctl_is_named_with_its_words_and_the_fix(systemd, failures, fragments, link_changed):
    host = Host(failures=failures)
    with pytest.raises(HeadlessProblem) as raised:
        headless(systemd, host)
    for fragment in fragments:
        assert fragment in str(raised.value)
    assert (str(systemd["link"].readlink()) == str(systemd["units"] / "multi-user.target")) is link_changed, \
        "a host whose systemd cannot answer is left as it was"
    # A failure after the link was set says so, and reports the change it made.
    assert raised.value.changed is link_changed
    assert ("Already changed: " + str(systemd["link"]) in str(raised.value)) is link_changed
