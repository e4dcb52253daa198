"""Reading the watchdog's decisions on a lab host, for the scenarios that inject faults."""

import json
import time


def journal_decisions(host, unit, since=0.0, **match):
    """The watchdog's journal lines since a time about ``unit`` (or no unit), those matching every key given."""
    lines = host.run(f"journalctl -u sparkfleet-watchdog.service -o cat --no-pager --since @{int(since)}").stdout.splitlines()
    parsed = [json.loads(line) for line in lines if line.startswith("{")]
    return [line for line in parsed if line["time"] >= since and line.get("unit", unit) == unit
            and all(line.get(key) == value for key, value in match.items())]


def wait_for(condition, timeout, what, explain=None):
    """``condition``'s first truthy answer within ``timeout`` s; else fails naming ``what`` and, when given, what
    ``explain`` shows then (the decisions the watchdog logged instead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(2)
    shown = f"; meanwhile: {explain()}" if explain else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{shown}"[:4000])


def now(host):
    """The lab host's clock, which the journal's times are on."""
    return float(host.check_output("date +%s.%N"))


def admissions(host, unit, since):
    """The memory admission lines the unit's own start (the host runtime its ExecStart runs) logged since a time: one per
    start that passed the door."""
    lines = host.run(f"journalctl -u {unit} -o cat --no-pager --since @{int(since)}").stdout.splitlines()
    return [line for line in lines if line.startswith("memory: ") and line.endswith(": admitted")]
