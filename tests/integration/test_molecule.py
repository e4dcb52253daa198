"""Molecule scenarios on the lab hosts: converge, idempotence and testinfra verify.

The scenarios run in lanes side by side (molecule_lanes.py); each test waits for its scenario and
reports its result.
"""

import re
import time

import molecule_lanes
import pytest
from tool_runner import LOG_DIR, MOLECULE_TIMES, tail


@pytest.fixture(scope="module")
def lanes(request):
    return molecule_lanes.start(request.config)


def wait_for(lanes, scenario):
    while True:
        for lane in lanes:
            lane.advance()
            if scenario in lane.results:
                return lane.results[scenario]
        time.sleep(5)


def verifier_durations(log_text):
    """The verifier's per-test times, as pytest printed them in the scenario's log."""
    block = log_text.split("slowest durations", 1)[1] if "slowest durations" in log_text else ""
    return [line for line in block.splitlines() if re.match(r"^\d+[.]\d+s (call|setup|teardown) ", line)]


@pytest.mark.parametrize("scenario", molecule_lanes.SCENARIOS)
def test_molecule_scenario(lanes, scenario, request):
    returncode, seconds, ended = wait_for(lanes, scenario)
    log = LOG_DIR / f"molecule-{scenario}.log"
    text = log.read_text()
    request.config.stash.setdefault(MOLECULE_TIMES, {})[scenario] = (seconds, ended, verifier_durations(text))
    if returncode != 0:
        pytest.fail(f"molecule test -s {scenario} exited {returncode}; last lines of {log}:\n{tail(log)}", pytrace=False)
    for step in ("converge", "idempotence", "verify"):
        assert f"{scenario} > {step}: Executed: Successful" in text, f"molecule's summary lacks a successful {step} step"
