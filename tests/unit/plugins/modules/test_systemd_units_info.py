"""systemd_units_info on the output of a real systemd: tests/unit/fixtures/systemd holds what
``systemctl show`` answered on a lab host (Debian 12, systemd 252) for five units - absent, enabled,
absent, absent, and an alias of an enabled unit. A script on PATH replays it as systemctl, since the
machine running the unit tests has no systemd."""

import pathlib

import pytest
from test_modules_as_ansible_runs_them import refused, run

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, parse_show
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import UNIT_PROPERTIES

FIXTURE = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "systemd" / "show-states-debian12-systemd252.txt"
UNITS = ["NetworkManager.service", "systemd-networkd.service", "networking.service", "prometheus-node-exporter.service",
         "dbus-org.freedesktop.network1.service"]


def test_each_unit_reads_its_own_block_and_an_alias_reads_its_units_state():
    states = parse_show(UNITS, UNIT_PROPERTIES, FIXTURE.read_text())
    assert states["systemd-networkd.service"] == {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}
    assert states["dbus-org.freedesktop.network1.service"]["UnitFileState"] == "enabled"
    assert [unit for unit, state in states.items() if state["LoadState"] == "not-found"] == [
        "NetworkManager.service", "networking.service", "prometheus-node-exporter.service"]
    assert all(state["UnitFileState"] == "" for state in states.values() if state["LoadState"] == "not-found")


def test_an_answer_that_does_not_match_the_units_asked_is_an_error():
    with pytest.raises(StateUnanswered, match="answered 5 blocks for 4 units"):
        parse_show(UNITS[:4], UNIT_PROPERTIES, FIXTURE.read_text())


@pytest.fixture
def systemctl(tmp_path):
    """A systemctl on PATH that records its arguments and replays the recorded answer."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "systemctl"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'argv'}\ncat {FIXTURE}\n")
    script.chmod(0o755)
    return folder


def test_the_module_asks_once_and_answers_per_unit(systemctl, tmp_path):
    result = run("systemd_units_info", {"units": UNITS}, path=systemctl)
    assert result["changed"] is False and list(result["units"]) == UNITS
    assert result["units"]["NetworkManager.service"]["LoadState"] == "not-found"
    assert (tmp_path / "argv").read_text().split() == [
        "show", "--property=Id", "--property=LoadState", "--property=ActiveState", "--property=UnitFileState", "--", *UNITS]


@pytest.mark.parametrize("unit", ["ssh.service; reboot", "--now", "a b.service"])
def test_a_name_that_is_no_unit_is_refused_before_systemctl_runs(systemctl, tmp_path, unit):
    refused("systemd_units_info", {"units": ["ssh.service", unit]}, f"units[1]: {unit!r} is not a systemd unit name", path=systemctl)
    assert not (tmp_path / "argv").exists()


def test_the_properties_asked_are_the_ones_read(systemctl, tmp_path):
    result = run("systemd_units_info", {"units": UNITS, "properties": ["NRestarts", "ActiveState"]}, path=systemctl)
    assert (tmp_path / "argv").read_text().split() == ["show", "--property=Id", "--property=NRestarts", "--property=ActiveState", "--", *UNITS]
    # The recorded answer holds no NRestarts: a property systemd did not print reads empty.
    assert result["units"]["systemd-networkd.service"] == {"NRestarts": "", "ActiveState": "active"}


@pytest.mark.parametrize("name", ["NRestarts --now", "--now", "nRestarts", "N" * 65])
def test_a_name_that_is_no_property_is_refused_before_systemctl_runs(systemctl, tmp_path, name):
    refused("systemd_units_info", {"units": UNITS, "properties": ["ActiveState", name]},
            f"properties[1]: {name!r} is not a systemd property name", path=systemctl)
    assert not (tmp_path / "argv").exists()


def test_no_property_to_read_is_refused_before_systemctl_runs(systemctl, tmp_path):
    refused("systemd_units_info", {"units": UNITS, "properties": []}, "properties: name at least one property to read", path=systemctl)
    assert not (tmp_path / "argv").exists()
