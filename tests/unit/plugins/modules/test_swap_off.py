"""swap_off run as Ansible runs it (its arguments on stdin, a fresh interpreter), with stand-ins for
swapon, swapoff and systemctl on PATH that log their calls: check mode reports every change and runs
nothing that changes the host, and a bad option is refused before any tool runs. The step's logic on
real files is tested in tests/unit/plugins/module_utils/test_swap.py; a real run would write the
sysctl file, which the module only accepts in /etc/sysctl.d."""

import json
import os

import pytest
from test_modules_as_ansible_runs_them import refused, run

# The sysctl file is only read in check mode; a name no host has.
SYSCTL_FILE = "/etc/sysctl.d/99-sparkfleet-swap-off-unit-test.conf"
FSTAB = "# UNCONFIGURED FSTAB FOR BASE SYSTEM\n/swap.img none swap sw 0 0\nUUID=4b1c5c6e-0000-4000-8000-000000000001 none swap sw 0 0\n"
# systemctl list-unit-files --no-legend --plain as systemd 252 prints it on the lab host after molecule's prepare.
LISTING = """apparmor.service                       enabled  enabled
dev-zram0.swap                         static   -
hwclock.service                        masked   enabled
swap.target                            static   -
zramswap.service                       masked   enabled
"""
STAND_IN = """#!/usr/bin/env python3
import json, pathlib, sys
here = pathlib.Path(__file__).parent
with open(here / "calls.log", "a") as log:
    log.write(json.dumps([pathlib.Path(sys.argv[0]).name, *sys.argv[1:]]) + "\\n")
answers = json.loads((here / "answers.json").read_text())
sys.stdout.write(answers.get(" ".join([pathlib.Path(sys.argv[0]).name, *sys.argv[1:]]), ""))
"""


@pytest.fixture
def host(tmp_path):
    """A PATH of stand-ins answering the reads, and an fstab."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("swapon", "swapoff", "systemctl"):
        (bin_dir / tool).write_text(STAND_IN)
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "answers.json").write_text(json.dumps({
        "swapon --show=NAME --noheadings": "/swap.img\n",
        "systemctl list-unit-files --no-legend --plain --type=swap,service,target": LISTING,
    }))
    (tmp_path / "fstab").write_text(FSTAB)
    return tmp_path


def calls(host):
    log = host / "bin" / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def options(host, **more):
    return {"fstab_path": str(host / "fstab"), "swappiness": 1, "sysctl_file": SYSCTL_FILE, "apply_sysctl": False, **more}


def test_check_mode_reports_every_change_and_runs_only_the_reads(host):
    result = run("swap_off", {**options(host), "_ansible_check_mode": True, "_ansible_diff": True}, path=host / "bin")
    assert result["changed"] and result["swapped_off"] and result["masked"] == ["dev-zram0.swap", "swap.target"]
    assert result["fstab_commented"] == ["/swap.img none swap sw 0 0", "UUID=4b1c5c6e-0000-4000-8000-000000000001 none swap sw 0 0"]
    assert result["sysctl_file_written"] and result["sysctl_set_running"] == [] and result["fstab_backup"] == ""
    assert [entry["after_header"] for entry in result["diff"]] == [str(host / "fstab"), SYSCTL_FILE]
    assert "# /swap.img none swap sw 0 0\n" in result["diff"][0]["after"]
    assert calls(host) == [["swapon", "--show=NAME", "--noheadings"],
                           ["systemctl", "list-unit-files", "--no-legend", "--plain", "--type=swap,service,target"]]
    assert (host / "fstab").read_text() == FSTAB and sorted(path.name for path in host.iterdir()) == ["bin", "fstab"], "no backup"
    assert not os.path.exists(SYSCTL_FILE)


@pytest.mark.parametrize(("given", "fragments"), [
    ({"swappiness": 60, "zram_units": ["zram0.swap; reboot"]},
     ["swappiness: 60 is out of range; give a whole number from 0 to 10", "zram_units[0]: 'zram0.swap; reboot' is not a systemd unit name"]),
    ({"sysctl_file": "/etc/sysctl.conf"}, ["sysctl_file: /etc/sysctl.conf is not a file its reader reads"]),
])
def test_a_bad_option_is_refused_before_any_tool_runs(host, given, fragments):
    refused("swap_off", options(host, **given), *fragments, path=host / "bin")
    assert calls(host) == [] and (host / "fstab").read_text() == FSTAB
