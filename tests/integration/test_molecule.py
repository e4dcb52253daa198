"""Molecule scenarios on the lab hosts: converge, idempotence and testinfra verify.

The scenarios run in four lanes at once, so the serving lab (vllm, the long one) overlaps the
host-preparation and model-staging scenarios, the sweep and the two-node cluster instead of
following them; each scenario has its own hosts, names and log. Each test waits for its scenario
and reports its result.
"""

import os
import signal
import subprocess
import time

import pytest
from tool_runner import LOG_DIR, ROOT, tail

# Lanes run side by side; the scenarios of one lane run one after the other.
LANES = [["vllm"], ["default", "models"], ["sweep"], ["cluster"]]
SCENARIOS = [scenario for lane in LANES for scenario in lane]


class Lane:
    """Scenarios started one after another in the background, each logged, recorded by PID."""

    def __init__(self, scenarios):
        self.pending = list(scenarios)
        self.results = {}
        self.process = None
        self.current = None
        self.started = None
        self.advance()

    def advance(self):
        if self.process is not None and self.process.poll() is not None:
            self.results[self.current] = (self.process.returncode, time.monotonic() - self.started)
            self.process = None
        if self.process is None and self.pending:
            self.current = self.pending.pop(0)
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            log = (LOG_DIR / f"molecule-{self.current}.log").open("w")
            self.started = time.monotonic()
            self.process = subprocess.Popen(
                ["molecule", "test", "--scenario-name", self.current], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "NO_COLOR": "1", "PY_COLORS": "0"}, start_new_session=True,
            )

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def lanes():
    started = [Lane(scenarios) for scenarios in LANES]
    yield started
    for lane in started:
        lane.stop()


def wait_for(lanes, scenario):
    while True:
        for lane in lanes:
            lane.advance()
            if scenario in lane.results:
                return lane.results[scenario]
        time.sleep(5)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(lanes, scenario):
    returncode, seconds = wait_for(lanes, scenario)
    log = LOG_DIR / f"molecule-{scenario}.log"
    print(f"\nmolecule {scenario}: exit {returncode} after {seconds:.0f} s")
    if returncode != 0:
        pytest.fail(f"molecule test -s {scenario} exited {returncode}; last lines of {log}:\n{tail(log)}", pytrace=False)
    assert "idempotence" in log.read_text()
