"""Molecule scenarios on the lab hosts: converge, idempotence and testinfra verify.

The scenarios run in four lanes at once, so the serving lab (vllm, the long one) overlaps the
host-preparation and model-staging scenarios, the sweep and the two-node cluster instead of
following them; each scenario has its own hosts, names and log. Each test waits for its scenario
and reports its result.
"""

import os
import re
import signal
import subprocess
import time

import pytest
import yaml
from tool_runner import LOG_DIR, MOLECULE_TIMES, ROOT, tail

# Lanes run side by side; the scenarios of one lane run one after the other.
LANES = [["vllm"], ["default", "models"], ["sweep"], ["cluster"]]
SCENARIOS = [scenario for lane in LANES for scenario in lane]


class Lane:
    """Scenarios started one after another in the background, each logged, recorded by PID."""

    def __init__(self, scenarios, origin):
        self.origin = origin
        self.pending = list(scenarios)
        self.results = {}
        self.process = None
        self.current = None
        self.started = None
        self.advance()

    def advance(self):
        if self.process is not None and self.process.poll() is not None:
            finished = time.monotonic()
            self.results[self.current] = (self.process.returncode, finished - self.started, finished - self.origin)
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
    origin = time.monotonic()
    started = [Lane(scenarios, origin) for scenarios in LANES]
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


def verifier_durations(log_text):
    """The verifier's per-test times, as pytest printed them in the scenario's log."""
    block = log_text.split("slowest durations", 1)[1] if "slowest durations" in log_text else ""
    return [line for line in block.splitlines() if re.match(r"^\d+[.]\d+s (call|setup|teardown) ", line)]


def checked_steps(scenario):
    """The steps of the scenario's own test sequence this test asserts in molecule's summary."""
    sequence = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())["scenario"]["test_sequence"]
    return [step for step in sequence if step in ("converge", "idempotence", "verify")]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(lanes, scenario, request):
    returncode, seconds, ended = wait_for(lanes, scenario)
    log = LOG_DIR / f"molecule-{scenario}.log"
    text = log.read_text()
    request.config.stash.setdefault(MOLECULE_TIMES, {})[scenario] = (seconds, ended, verifier_durations(text))
    if returncode != 0:
        pytest.fail(f"molecule test -s {scenario} exited {returncode}; last lines of {log}:\n{tail(log)}", pytrace=False)
    for step in checked_steps(scenario):
        assert f"{scenario} > {step}: Executed: Successful" in text, f"molecule's summary lacks a successful {step} step"
