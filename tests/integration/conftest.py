"""The molecule lanes start with the first test of this folder, so the static layer (ordered before
the lab layer by tests/conftest.py) runs while the lanes do; the scenarios' times in the suite's
own output: when each lane finished each scenario, its steps' times, and the verifier's per-test times."""

import pytest
from molecule_lanes import start_lanes
from tool_runner import MOLECULE_TIMES

MOLECULE_TESTS = "test_molecule.py"


@pytest.fixture(scope="session", autouse=True)
def molecule_lanes(request):
    """Started only when a molecule scenario is among the tests run (not by `scripts/test fast`) and
    the unit layer passed (tests/conftest.py then skips the lab layer)."""
    if request.session.testsfailed or not any(item.path.name == MOLECULE_TESTS for item in request.session.items):
        yield []
        return
    lanes = start_lanes()
    yield lanes
    for lane in lanes:
        lane.stop()


def pytest_terminal_summary(terminalreporter, config):
    for scenario, (seconds, ended, steps, durations) in config.stash.get(MOLECULE_TIMES, {}).items():
        terminalreporter.write_sep("-", f"molecule {scenario}: {seconds:.0f} s, ended {ended / 60:.1f} min after the lanes started")
        terminalreporter.write_line("steps: " + (", ".join(f"{step} {seconds:.0f} s" for step, seconds in steps) or "(no step lines found in the log)"))
        for line in durations or ["(the log holds no per-test times)"]:
            terminalreporter.write_line(line)
