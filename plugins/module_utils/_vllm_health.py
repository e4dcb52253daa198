# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Judging a vLLM endpoint's health: the /v1/models answer and the container's state.

Private to the collection. Seed 000's launcher polled /v1/models with the bearer key and
broke off as soon as the container exited or its restart count went up, instead of
waiting out the whole timeout.
"""

from __future__ import annotations

import json
import typing as t

DEAD_STATES = frozenset({"exited", "dead", "removing"})


def models_verdict(status: int | None, body: str, expected_names: t.Sequence[str]) -> tuple[bool, str, list[str]]:
    """(ready, reason, served names) from one GET /v1/models."""
    if status is None:
        return False, "not answering yet (connection refused or reset)", []
    if status == 401:
        return False, "401 Unauthorized: the API key does not match the server's", []
    if status != 200:
        return False, f"HTTP {status}", []
    try:
        served = [entry["id"] for entry in json.loads(body).get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, "200 with a body that is not a model list", []
    missing = [name for name in expected_names if name not in served]
    if missing:
        return False, f"serving {', '.join(served) or 'nothing'} but not {', '.join(missing)}", served
    return True, "ready", served


def container_snapshot(inspect_output: str) -> dict[str, t.Any] | None:
    """The fields the gate watches, from ``docker inspect`` JSON (a list or one object)."""
    try:
        data = json.loads(inspect_output)
    except ValueError:
        return None
    if isinstance(data, list):
        if not data:
            return None
        data = data[0]
    state = data.get("State") or {}
    return {
        "id": data.get("Id"),
        "status": state.get("Status"),
        "exit_code": state.get("ExitCode"),
        "oom_killed": bool(state.get("OOMKilled")),
        "restart_count": data.get("RestartCount", 0),
        "started_at": state.get("StartedAt"),
    }


def container_failure(baseline: t.Mapping[str, t.Any] | None, current: t.Mapping[str, t.Any] | None) -> str | None:
    """Why the container has failed since ``baseline``, or None while it still may come up.

    A container that was replaced (another Id) or restarted counts as failed: its first
    start did not survive, and waiting longer only hides that. Before the container was
    ever seen (``baseline`` None), its absence means it is not created yet.
    """
    if current is None:
        return None if baseline is None else "the container is gone"
    if current["status"] in DEAD_STATES:
        detail = f"exit code {current['exit_code']}" + (", killed by the OOM killer" if current["oom_killed"] else "")
        return f"the container is {current['status']} ({detail})"
    if baseline is None:
        return None
    if current["id"] != baseline["id"]:
        return "the container was replaced (its start failed and it was started again)"
    if current["restart_count"] > baseline["restart_count"]:
        return f"the container restarted ({baseline['restart_count']} -> {current['restart_count']} restarts)"
    if current["started_at"] != baseline["started_at"]:
        return "the container restarted (its start time changed)"
    return None


ERROR_MARKERS = ("Error", "error:", "Traceback", "unrecognized arguments")


def error_lines(log: str, limit: int = 6) -> list[str]:
    """The last lines of an engine log that name what went wrong (the root cause sits above the traceback's end)."""
    found = [line.strip() for line in log.splitlines() if any(marker in line for marker in ERROR_MARKERS) and "Traceback" not in line]
    return found[-limit:]
