"""The lab lanes start once the unit layer has passed, so the static layer runs beside the lab hosts'
boot and image pulls; a static failure stops them (the lab layer is then skipped, tests/conftest.py).
After the lab layer: when each lane finished each scenario, and the verifier's per-test times."""

import molecule_lanes
from tool_runner import MOLECULE_TIMES


def lab_selected(session):
    return any(item.path.name == "test_molecule.py" for item in session.items)


def pytest_runtest_setup(item):
    session = item.session
    if item.path.name != "test_molecule.py" and session.testsfailed == 0 and lab_selected(session):
        molecule_lanes.start(session.config)


def pytest_runtest_teardown(item):
    """Between static tests: a failure stops the lanes; otherwise a lane whose scenario ended starts its next."""
    config = item.session.config
    if item.path.name == "test_molecule.py":
        return
    if item.session.testsfailed:
        molecule_lanes.stop(config)
        return
    for lane in config.stash.get(molecule_lanes.STARTED, []):
        lane.advance()


def pytest_sessionfinish(session):
    molecule_lanes.stop(session.config)


def pytest_terminal_summary(terminalreporter, config):
    for scenario, (seconds, ended, durations) in config.stash.get(MOLECULE_TIMES, {}).items():
        terminalreporter.write_sep("-", f"molecule {scenario}: {seconds:.0f} s, ended {ended / 60:.1f} min after the lanes started")
        for line in durations or ["(the log holds no per-test times)"]:
            terminalreporter.write_line(line)
