"""The molecule scenarios' times in the suite's own output: when each lane finished each scenario,
and the verifier's per-test times."""

from tool_runner import MOLECULE_TIMES


def pytest_terminal_summary(terminalreporter, config):
    for scenario, (seconds, ended, durations) in config.stash.get(MOLECULE_TIMES, {}).items():
        terminalreporter.write_sep("-", f"molecule {scenario}: {seconds:.0f} s, ended {ended / 60:.1f} min after the lanes started")
        for line in durations or ["(the log holds no per-test times)"]:
            terminalreporter.write_line(line)
