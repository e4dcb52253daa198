"""headless_units run as Ansible runs it (its arguments on stdin, a fresh interpreter), with a stand-in
for systemctl on PATH that logs its calls: check mode reports every change and runs only the reads,
a bad option is refused before systemctl runs, and a systemctl that cannot answer is a failure that
names it, never a traceback. The step's logic on a real link is tested in
tests/unit/plugins/module_utils/test_headless.py; a real run would relink this machine's
/etc/systemd/system/default.target, which check mode only reads."""

import json
import os

import pytest
from test_modules_as_ansible_runs_them import refused, run

LINK = "/etc/systemd/system/default.target"
MULTI_USER = "/lib/systemd/system/multi-user.target"
LIST_UNIT_FILES = "list-unit-files --no-legend --plain --type=service,socket,target"
LIST_RUNNING = "list-units --no-legend --plain --type=service,socket --state=running,listening"
# As systemd 252 prints them on a desktop install.
UNIT_FILES = """avahi-daemon.service                    enabled         enabled
cups.service                            enabled         enabled
rsyslog.service                         enabled         enabled
sleep.target                            static          -
smartd.service                          alias           -
smartmontools.service                   enabled         enabled
suspend.target                          masked          -
wpa_supplicant.service                  masked          enabled
"""
RUNNING = """cron.service             loaded active running Regular background program processing daemon
cups.service             loaded active running CUPS Scheduler
rsyslog.service          loaded active running System Logging Service
user@1000.service        loaded active running User Manager for UID 1000
wpa_supplicant.service   loaded active running WPA supplicant
"""
STAND_IN = """#!/usr/bin/env python3
import json, pathlib, sys
here = pathlib.Path(__file__).parent
with open(here / "calls.log", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
rc, out, err = json.loads((here / "answers.json").read_text()).get(" ".join(sys.argv[1:]), [0, "", ""])
sys.stdout.write(out)
sys.stderr.write(err)
sys.exit(rc)
"""
OPTIONS = {"default_target": "multi-user.target", "disable_services": ["cups", "avahi-daemon", "rsyslog"],
           "mask_services": ["smartd", "smartmontools", "rsyslog", "wpa_supplicant"], "mask_targets": ["sleep.target", "suspend.target"],
           "expected_services": ["cron"]}
needs_multi_user = pytest.mark.skipif(not os.path.exists(MULTI_USER), reason=f"this machine has no {MULTI_USER} to check the target against")


def systemctl(tmp_path, **answers):
    """A PATH whose systemctl answers the listings (each answer rc, stdout, stderr) and logs every call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(STAND_IN)
    (bin_dir / "systemctl").chmod(0o755)
    (bin_dir / "answers.json").write_text(json.dumps({LIST_UNIT_FILES: [0, UNIT_FILES, ""], LIST_RUNNING: [0, RUNNING, ""], **answers}))
    return bin_dir


def calls(bin_dir):
    log = bin_dir / "calls.log"
    return [" ".join(json.loads(line)) for line in log.read_text().splitlines()] if log.exists() else []


@needs_multi_user
def test_check_mode_reports_every_change_and_runs_only_the_reads(tmp_path):
    bin_dir = systemctl(tmp_path)
    result = run("headless_units", {**OPTIONS, "_ansible_check_mode": True, "_ansible_diff": True}, path=bin_dir)
    assert result["changed"] and result["disabled"] == ["cups.service", "avahi-daemon.service", "rsyslog.service"]
    assert result["masked"] == ["smartmontools.service", "rsyslog.service", "sleep.target"], "the alias and what is masked left alone"
    assert result["stopped"] == ["cups.service", "rsyslog.service", "wpa_supplicant.service"]
    assert result["running"] == ["cron.service", "user@1000.service"] and result["unexpected"] == ["user@1000.service"]
    linked = os.readlink(LINK) if os.path.islink(LINK) else None
    assert result["default_target"] == {"before": os.path.basename(linked) if linked else "", "after": "multi-user.target"}
    assert [entry["after"] for entry in result["diff"]] == ([] if linked == MULTI_USER else [f"link to {MULTI_USER}\n"])
    assert calls(bin_dir) == [LIST_UNIT_FILES, LIST_RUNNING]


def test_a_bad_option_is_refused_before_systemctl_runs(tmp_path):
    bin_dir = systemctl(tmp_path)
    refused("headless_units", {**OPTIONS, "default_target": "multi-user", "mask_services": ["rsyslog", "x; reboot"]},
            "default_target: 'multi-user' is not a target's unit name; give one such as multi-user.target",
            "mask_services[1]: 'x; reboot' is not a systemd unit name", path=bin_dir)
    assert calls(bin_dir) == []


@needs_multi_user
def test_a_systemctl_that_cannot_answer_is_named_with_its_words(tmp_path):
    not_booted = "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
    bin_dir = systemctl(tmp_path, **{LIST_UNIT_FILES: [1, "", not_booted]})
    refused("headless_units", {**OPTIONS, "_ansible_check_mode": True}, f"systemctl {LIST_UNIT_FILES} exited 1: {not_booted.strip()}",
            "is systemd running on the host (as PID 1)?", path=bin_dir)
    assert calls(bin_dir) == [LIST_UNIT_FILES]
