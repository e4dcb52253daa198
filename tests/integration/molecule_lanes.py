"""The molecule scenarios in lanes: the lanes run side by side, the scenarios of one lane one after
the other, each in its own session, logged, and stopped by its recorded process group."""

import os
import signal
import subprocess
import time

from tool_runner import LOG_DIR, ROOT

# The serving lab (vllm, the long one) overlaps the host-preparation and model-staging scenarios,
# the sweep and the two-node cluster instead of following them; each scenario has its own hosts,
# names and log.
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


def start_lanes():
    origin = time.monotonic()
    return [Lane(scenarios, origin) for scenarios in LANES]


def wait_for(lanes, scenario):
    """The scenario's return code, wall time, and when its lane finished it (seconds after the lanes started)."""
    while True:
        for lane in lanes:
            lane.advance()
            if scenario in lane.results:
                return lane.results[scenario]
        time.sleep(5)
