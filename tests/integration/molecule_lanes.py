"""The molecule scenarios in lanes: the lanes run side by side, the scenarios of one lane one after
the other, each in its own session, logged, and stopped by its recorded process group."""

import os
import re
import signal
import subprocess
import threading
import time

from tool_runner import LOG_DIR, ROOT

# The serving lab (vllm, the long one) overlaps the host-preparation and model-staging scenarios,
# the sweep and the two-node cluster instead of following them; each scenario has its own hosts,
# names and log.
LANES = [["vllm"], ["default", "models"], ["sweep"], ["cluster"]]
SCENARIOS = [scenario for lane in LANES for scenario in lane]
# Molecule announces each step of a scenario as it starts and ends ("[vllm > converge] Executing",
# "[vllm > converge] Executed: Successful"); its closing report has no brackets.
STEP_LINE = re.compile(r"\[(?P<scenario>[\w-]+) > (?P<step>\w+)\] (?P<event>Executing|Executed)")


class Scenario:
    """One `molecule test` in the background: its log, and when each of its steps began and ended."""

    def __init__(self, name):
        self.name = name
        self.started = time.monotonic()
        # [step, started, ended or None], in the order they ran (destroy runs first and last).
        self.steps = []
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["molecule", "test", "--scenario-name", name], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1", "PY_COLORS": "0"}, start_new_session=True,
        )
        self.copier = threading.Thread(target=self.copy_output, args=(LOG_DIR / f"molecule-{name}.log",), daemon=True)
        self.copier.start()

    def copy_output(self, log_path):
        """Copies the output into the log unchanged, noting the time of each step's start and end. The
        output is read to its end whatever happens to the log, so molecule never blocks on a full pipe."""
        try:
            with log_path.open("wb") as log:
                for line in self.process.stdout:
                    log.write(line)
                    log.flush()
                    self.note_step(line.decode(errors="replace"))
        finally:
            for _line in self.process.stdout:
                pass

    def note_step(self, line):
        found = STEP_LINE.search(line)
        if not found or found["scenario"] != self.name:
            return
        if found["event"] == "Executing":
            self.steps.append([found["step"], time.monotonic(), None])
        elif self.steps and self.steps[-1][0] == found["step"]:
            self.steps[-1][2] = time.monotonic()

    def step_seconds(self):
        """Each finished step and its wall time, in the order the steps ran."""
        return [(step, ended - started) for step, started, ended in self.steps if ended is not None]

    def finish(self):
        # The log is complete once molecule's output has been read to its end (bounded: a process
        # the scenario left behind could hold the pipe open).
        self.copier.join(timeout=30)
        return self.process.returncode, time.monotonic() - self.started, self.step_seconds()


class Lane:
    """Scenarios started one after another in the background, each logged, recorded by PID. A thread of its own starts
    the next scenario as soon as one ends: the test waiting for it may still be behind the unit and static layers."""

    POLL_SECONDS = 5

    def __init__(self, scenarios, origin):
        self.origin = origin
        self.pending = list(scenarios)
        self.results = {}
        self.current = None
        self.lock = threading.Lock()
        self.advance()
        threading.Thread(target=self.keep_advancing, daemon=True).start()

    def keep_advancing(self):
        while self.pending or self.current is not None:
            time.sleep(self.POLL_SECONDS)
            self.advance()

    def advance(self):
        with self.lock:
            if self.current is not None and self.current.process.poll() is not None:
                returncode, seconds, steps = self.current.finish()
                self.results[self.current.name] = (returncode, seconds, time.monotonic() - self.origin, steps)
                self.current = None
            if self.current is None and self.pending:
                self.current = Scenario(self.pending.pop(0))

    def stop(self):
        with self.lock:
            self.pending = []
            if self.current is not None and self.current.process.poll() is None:
                os.killpg(self.current.process.pid, signal.SIGTERM)
                self.current.process.wait(timeout=60)


def start_lanes():
    origin = time.monotonic()
    return [Lane(scenarios, origin) for scenarios in LANES]


def wait_for(lanes, scenario):
    """The scenario's return code, wall time, when its lane finished it (seconds after the lanes
    started) and its steps' wall times."""
    while True:
        for lane in lanes:
            lane.advance()
            if scenario in lane.results:
                return lane.results[scenario]
        time.sleep(Lane.POLL_SECONDS)
