"""Runs a tool over the whole collection for a test layer, keeping its output."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOG_DIR = ROOT / ".cache" / "logs"
# Each molecule scenario's wall time, when its lane finished it, its steps' and its verifier's per-test times,
# printed in the suite's summary (conftest.py).
MOLECULE_TIMES = pytest.StashKey[dict]()


def tail(log, lines=80):
    return "\n".join(log.read_text().splitlines()[-lines:])


def run_logged(name, command, cwd=ROOT, env=None):
    """Run a tool, keep its whole output in .cache/logs/NAME.log, fail with its tail."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{name}.log"
    with log.open("w") as handle:
        result = subprocess.run(
            command, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, text=True, check=False,
            env={**os.environ, "NO_COLOR": "1", "PY_COLORS": "0", **(env or {})},
        )
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {result.returncode}; last lines of {log}:\n{tail(log)}", pytrace=False)
    return log.read_text()
