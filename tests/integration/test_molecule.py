"""Molecule scenarios on the lab hosts: converge, idempotence and testinfra verify.

The scenarios run in four lanes at once (molecule_lanes.py), started by conftest.py once the tests
are collected, so the unit and static layers run while they do. Each test waits for its scenario and
reports its result.
"""

import re

import pytest
import yaml
from molecule_lanes import SCENARIOS, wait_for
from tool_runner import LOG_DIR, MOLECULE_TIMES, ROOT, tail


def verifier_durations(log_text):
    """The verifier's per-test times, as pytest printed them in the scenario's log."""
    block = log_text.split("slowest durations", 1)[1] if "slowest durations" in log_text else ""
    return [line for line in block.splitlines() if re.match(r"^\d+[.]\d+s (call|setup|teardown) ", line)]


def checked_steps(scenario):
    """The steps of the scenario's own test sequence this test asserts in molecule's summary."""
    sequence = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())["scenario"]["test_sequence"]
    return [step for step in sequence if step in ("converge", "idempotence", "verify")]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(molecule_lanes, scenario, request):
    if not molecule_lanes:
        pytest.fail("the molecule lanes were stopped: a unit test failed", pytrace=False)
    returncode, seconds, ended, steps = wait_for(molecule_lanes, scenario)
    log = LOG_DIR / f"molecule-{scenario}.log"
    text = log.read_text()
    request.config.stash.setdefault(MOLECULE_TIMES, {})[scenario] = (seconds, ended, steps, verifier_durations(text))
    if returncode != 0:
        pytest.fail(f"molecule test -s {scenario} exited {returncode}; last lines of {log}:\n{tail(log)}", pytrace=False)
    for step in checked_steps(scenario):
        assert f"{scenario} > {step}: Executed: Successful" in text, f"molecule's summary lacks a successful {step} step"
