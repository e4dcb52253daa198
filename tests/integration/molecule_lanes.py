"""The molecule scenarios' lanes: each lane runs its scenarios one after another in the background,
each logged and recorded by PID; the lanes run side by side.

The serving lab (vllm, the long one) overlaps the host-preparation and model-staging scenarios, the
sweep and the two-node cluster instead of following them; each scenario has its own hosts, names
and log. The lanes start as soon as the unit layer has passed (tests/integration/conftest.py), so
the static layer runs while the lab hosts boot and pull their images.
"""

import os
import signal
import subprocess
import time

import pytest
from tool_runner import LOG_DIR, ROOT

LANES = [["vllm"], ["default", "models"], ["sweep"], ["cluster"]]
SCENARIOS = [scenario for lane in LANES for scenario in lane]
STARTED = pytest.StashKey[list]()


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


def start(config):
    """The lanes of this session, started once."""
    if STARTED not in config.stash:
        origin = time.monotonic()
        config.stash[STARTED] = [Lane(scenarios, origin) for scenarios in LANES]
    return config.stash[STARTED]


def stop(config):
    for lane in config.stash.get(STARTED, []):
        lane.stop()
