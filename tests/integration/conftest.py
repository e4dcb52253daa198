"""The molecule lanes start as soon as the tests are collected, when a scenario is among them (not for
`scripts/test fast`, --collect-only or a collection that failed): the unit and static layers run while
the lanes do, off the lanes' critical path, and the first failing unit test stops the lanes
(tests/conftest.py, whose hooks see the unit tests, calls the stop kept in the stash; it then skips the
lab layer). The scenarios' times in the suite's own output: when each lane finished each scenario, its
steps' times, and the verifier's per-test times."""

import pytest
from molecule_lanes import start_lanes
from suite_layers import STOP_LANES
from tool_runner import MOLECULE_TIMES

MOLECULE_TESTS = "test_molecule.py"
LANES = pytest.StashKey[list]()


def pytest_collection_finish(session):
    if session.config.option.collectonly or session.testsfailed:
        return
    if any(item.path.name == MOLECULE_TESTS for item in session.items):
        session.config.stash[LANES] = start_lanes()
        session.config.stash[STOP_LANES] = stop_lanes


def stop_lanes(config):
    for lane in config.stash.get(LANES, []):
        lane.stop()
    config.stash[LANES] = []


def pytest_sessionfinish(session):
    stop_lanes(session.config)


@pytest.fixture(scope="session")
def molecule_lanes(request):
    return request.config.stash.get(LANES, [])


def pytest_terminal_summary(terminalreporter, config):
    for scenario, (seconds, ended, steps, durations) in config.stash.get(MOLECULE_TIMES, {}).items():
        terminalreporter.write_sep("-", f"molecule {scenario}: {seconds:.0f} s, ended {ended / 60:.1f} min after the lanes started")
        terminalreporter.write_line("steps: " + (", ".join(f"{step} {seconds:.0f} s" for step, seconds in steps) or "(no step lines found in the log)"))
        for line in durations or ["(the log holds no per-test times)"]:
            terminalreporter.write_line(line)
