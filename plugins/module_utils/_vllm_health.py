# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Judging a vLLM endpoint's health: one verdict for the health gate module and the units' readiness wait.

Private to the collection, standard library only: serving_host installs this very file on the
host as part of the host runtime (_host_runtime), whose readiness wait each unit runs (ExecStartPost),
so the gate and the boot path share one verdict. Seed 000's launcher polled /v1/models with the bearer key and broke
off as soon as the container exited or its restart count went up; errors that retrying
cannot fix (a refused key, a bad header, TLS or URL errors, another server on the port) end
the wait at once, only "not up yet" is waited on.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import time
import typing as t
import urllib.error

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered

# Seconds between the polls of the gate and of the units' readiness wait, alike: a served endpoint is passed within one
# interval and one poll of its first good answer (benchmarks/gate_latency.py: 0.97 s median at 2 s, 0.31 s at 0.5 s, against
# the goal of 1 s; docs/performance.md); a poll is one /v1/models request and one docker inspect.
POLL_INTERVAL = 0.5
DEAD_STATES = frozenset({"exited", "dead", "removing"})
READY, WAIT, FAIL = "ready", "wait", "fail"


class Reply(t.NamedTuple):
    """One HTTP exchange: ``status`` None when no HTTP answer came; ``error`` says why, ``retryable`` whether waiting can help."""

    status: int | None
    body: str
    error: str | None = None
    retryable: bool = True


def exception_reply(error: BaseException) -> Reply:
    """A Reply for an exception raised by urllib or Ansible's open_url, classified as retryable or not."""
    if isinstance(error, urllib.error.HTTPError):
        body = error.read().decode("utf-8", "replace") if error.fp else ""
        return Reply(error.code, body)
    reason = getattr(error, "reason", error)
    if isinstance(reason, (ssl.SSLError, ssl.CertificateError)):
        return Reply(None, "", f"TLS error: {reason}", False)
    if isinstance(reason, (ConnectionError, socket.timeout, TimeoutError, http.client.RemoteDisconnected, http.client.IncompleteRead)):
        return Reply(None, "", f"not answering yet ({type(reason).__name__}: {reason})", True)
    if isinstance(reason, http.client.HTTPException):
        return Reply(None, "", f"the answer is not HTTP ({type(reason).__name__}: {reason}); another program answers on this port", False)
    if isinstance(reason, socket.gaierror):
        return Reply(None, "", f"the host name does not resolve ({reason})", False)
    if isinstance(error, ValueError) or isinstance(reason, ValueError):
        return Reply(None, "", f"the request cannot be sent ({reason}); check the URL and the API key (printable, no whitespace)", False)
    if isinstance(reason, str) and "unknown url type" in reason:
        return Reply(None, "", f"bad URL ({reason})", False)
    if isinstance(reason, OSError):
        return Reply(None, "", f"not answering yet ({reason})", True)
    return Reply(None, "", f"request failed: {error}", False)


def models_verdict(reply: Reply, expected_names: t.Sequence[str]) -> tuple[str, str, list[str]]:
    """(READY/WAIT/FAIL, reason, served names) from one GET /v1/models."""
    if reply.status is None:
        return (WAIT if reply.retryable else FAIL), reply.error or "not answering yet", []
    if reply.status == 401:
        return FAIL, "401 Unauthorized: the server refuses the API key the gate was given", []
    if reply.status in (400, 403, 404, 405):
        return FAIL, f"HTTP {reply.status} on /v1/models: this is not the vLLM endpoint expected there (check url and port)", []
    if reply.status != 200:
        return WAIT, f"HTTP {reply.status}", []
    try:
        data = json.loads(reply.body)
        served = [entry["id"] for entry in data.get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        served = None
    if served is None or not all(isinstance(name, str) for name in served):
        return FAIL, "200 with a body that is not a model list: another server answers on this port", []
    missing = [name for name in expected_names if name not in served]
    if missing:
        return FAIL, f"serving {', '.join(served) or 'nothing'} but not {', '.join(missing)}: another server answers on this port", served
    return READY, "ready", served


def container_snapshot(data: t.Mapping[str, t.Any] | None) -> dict[str, t.Any] | None:
    """The fields the gate watches, from a container's record (_host_state.inspect_container); None for no container."""
    if not isinstance(data, dict) or not isinstance(data.get("State") or {}, dict):
        return None
    state = data.get("State") or {}
    restarts = data.get("RestartCount", 0)
    error = state.get("Error")
    return {
        "id": data.get("Id"),
        "status": state.get("Status"),
        "exit_code": state.get("ExitCode"),
        "oom_killed": bool(state.get("OOMKilled")),
        "restart_count": restarts if isinstance(restarts, int) else 0,
        "started_at": state.get("StartedAt"),
        # Docker's own reason when it could not start the container (a bind address the host lacks, a port taken).
        "start_error": error[:300] if isinstance(error, str) else "",
    }


def container_failure(baseline: t.Mapping[str, t.Any] | None, current: t.Mapping[str, t.Any] | None) -> str | None:
    """Why the container has failed since ``baseline``, or None while it still may come up.

    A container that was replaced (another Id) or restarted counts as failed: its first
    start did not survive, and waiting longer only hides that. Before the container was
    ever seen (``baseline`` None), its absence means it is not created yet; a baseline taken
    while it was only created has no start yet, so its first start is no restart.
    """
    if current is None:
        return None if baseline is None else "the container is gone"
    if current["status"] == "created" and current.get("start_error"):
        # Docker leaves a container it failed to start in "created" for good: nothing will start it.
        return f"docker could not start the container: {current['start_error']}"
    if current["status"] in DEAD_STATES:
        detail = f"exit code {current['exit_code']}" + (", killed by the OOM killer" if current["oom_killed"] else "")
        return f"the container is {current['status']} ({detail})"
    if baseline is None:
        return None
    if current["id"] != baseline["id"]:
        return "the container was replaced (its start failed and it was started again)"
    if baseline["status"] == "created":
        return None
    if current["restart_count"] > baseline["restart_count"]:
        return f"the container restarted ({baseline['restart_count']} -> {current['restart_count']} restarts)"
    if current["started_at"] != baseline["started_at"]:
        return "the container restarted (its start time changed)"
    return None


def is_warm(stamp: str | None) -> bool:
    """Whether a start of these settings already served on the image's caches (the plan's cold_start stamp exists)."""
    return bool(stamp) and os.path.exists(stamp)


# vLLM's cache configuration as a Prometheus info series (value 1, the settings in its labels): kv_cache_size_tokens is the
# KV cache the engine sized at start (vLLM 0.32 sets it before the engine's metrics are registered); num_gpu_blocks x
# block_size where a release lacks that label.
CACHE_INFO = "vllm:cache_config_info"
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def kv_cache_tokens(metrics_text: str) -> int | None:
    """The KV cache in tokens the engine sized at its start, from its /metrics page; None when the page does not say."""
    for line in metrics_text.splitlines():
        if not line.startswith(CACHE_INFO + "{"):
            continue
        labels = dict(LABEL.findall(line.partition("{")[2].rpartition("}")[0]))
        sized = labels.get("kv_cache_size_tokens", "")
        if sized.isdigit() and int(sized) > 0:
            return int(sized)
        blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        if blocks.isdigit() and size.isdigit() and int(blocks) * int(size) > 0:
            return int(blocks) * int(size)
    return None


def stamp_record(stamp: str | None) -> dict[str, t.Any]:
    """What the warm stamp keeps of the best good start of these settings: ``kv_cache_tokens`` when known. A stamp an
    older release wrote (the start's time alone) or one that cannot be read keeps nothing."""
    try:
        with open(stamp or "", encoding="ascii") as handle:
            found = json.loads(handle.read())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    tokens = found.get("kv_cache_tokens") if isinstance(found, dict) else None
    return {"kv_cache_tokens": tokens} if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else {}


def capacity_warning(tokens: int | None, reference: int | None, share: float | None) -> str | None:
    """Why this start's KV cache is a warning: below ``share`` of the best good start of the same settings (seed 000: two
    instances started at once and the KV cache fell from 41.22 to 34.99 GiB unnoticed). None when it is not, or unknown."""
    if not tokens or not reference or not share or tokens >= share * reference:
        return None
    return (f"the KV cache holds {tokens:,} tokens, {100 * tokens / reference:.0f} % of the {reference:,} of the best good start of "
            f"these settings (below {100 * share:g} %): something else held memory while it started (another engine starting "
            "at once, a GPU exporter, residue of failed starts); fewer requests fit at once until it starts again with the memory free")


def capacity_check(metrics: Reply, stamp: str, share: float | None) -> tuple[int | None, str | None]:
    """(the KV cache this start sized, why it is a warning or None), from the engine's /metrics reply and the warm stamp:
    the one comparison the units' readiness wait and the health gate both make."""
    tokens = kv_cache_tokens(metrics.body) if metrics.status == 200 else None
    return tokens, capacity_warning(tokens, stamp_record(stamp).get("kv_cache_tokens"), share)


def mark_warm(stamp: str, kv_tokens: int | None = None, degraded: bool = False) -> None:
    """Stamp the settings' start as good: the caches it filled hold their compiled kernels, and the largest KV cache a good
    start of them sized (``kv_tokens``) is the reference of the next starts: never lowered, so a loss that grows a little
    with each start still warns. A ``degraded`` start stamps warm and changes no reference. The unit's readiness wait and
    the serving transaction may both write at once: each through a temporary file of its own. OSError when it cannot."""
    known = stamp_record(stamp).get("kv_cache_tokens")
    if os.path.exists(stamp) and (degraded or not kv_tokens or (known and known >= kv_tokens)):
        return
    folder = os.path.dirname(stamp)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    best = None if degraded else max(kv_tokens or 0, known or 0)
    record = {"time": int(time.time()), **({"kv_cache_tokens": best} if best else {})}
    write_atomically(stamp, json.dumps(record) + "\n", 0o644)


def start_timeout(warm_timeout: float, cold_start: t.Mapping[str, t.Any] | None, cold: bool | None = None) -> tuple[float, bool]:
    """(seconds to wait, cold): a start without its stamp compiles and gets the cold timeout; ``cold`` overrides the
    stamp (a cluster's head is cold when any node's caches are). A plan without cold_start is always warm."""
    compiles = bool(cold_start) and (not is_warm(cold_start.get("stamp")) if cold is None else cold)
    if not compiles or not cold_start:
        return warm_timeout, False
    return max(float(cold_start["timeout"]), warm_timeout), True


def restartable(current: t.Mapping[str, t.Any] | None) -> bool:
    """A failure a cold start may get past once: the engine exited by itself (seed 001: compiled, found too little KV
    cache and exited) and its unit replaced it. Docker's refusal to start it and an OOM kill are not that shape."""
    return current is None or not (current.get("oom_killed") or current.get("start_error"))


def wait_until_ready(
    fetch_models: t.Callable[[], Reply],
    inspect: t.Callable[[], dict[str, t.Any] | None] | None,
    expected_names: t.Sequence[str],
    timeout: float,
    interval: float = POLL_INTERVAL,
    clock: t.Callable[[], float] = time.monotonic,
    sleep: t.Callable[[float], None] = time.sleep,
    restarts_allowed: int = 0,
    restart_window: float = 0,
    refusal: t.Callable[[], str | None] | None = None,
) -> dict[str, t.Any]:
    """Poll until the endpoint serves every expected name, the container fails, a fatal error
    comes, or ``timeout`` passes. The result: ok, reasons, elapsed, served names, container state,
    ``restarts`` (the failures passed over) and ``restartable`` (the container failed in a way a
    cold start may get past once). A cold start passes ``restarts_allowed`` 1: the first
    exit of the container is waited past for ``restart_window`` seconds, in which its unit starts
    a new one (the old one, still there, is no failure meanwhile), and the new start gets its own
    ``timeout``, as each start of the unit does at boot. ``inspect`` raises StateUnanswered for a
    poll that cannot see the container. ``refusal`` says why the unit's admission refused the start (it ends the wait
    at once: no container comes)."""
    started = clock()
    deadline = started + timeout

    def look() -> tuple[bool, dict[str, t.Any] | None]:
        try:
            return True, inspect() if inspect else None
        except StateUnanswered:
            return False, None

    seen, baseline = look()
    result: dict[str, t.Any] = {"ok": False, "served_model_names": [], "state": None, "restart_count": None, "restarts": [],
                                "restartable": False}
    exited: dict[str, t.Any] = {}
    while True:
        verdict, reason, served = models_verdict(fetch_models(), expected_names)
        result["served_model_names"] = served
        seen, current = look()
        failure = container_failure(baseline, current) if inspect and seen else None
        # The container that failed: the one watched, or the one first seen already dead.
        failed = current if current and (baseline is None or current["id"] == baseline["id"]) else None
        if exited and seen and (current is None or current["id"] == exited["id"]):
            # The exited container until its unit replaces it: waited on, up to the window.
            failure = None if clock() < exited["until"] else f"{exited['failure']}, and no new container started within {restart_window:g} s"
        elif failure and len(result["restarts"]) < restarts_allowed and restartable(failed):
            result["restarts"].append(failure)
            exited = {"id": (baseline or current or {}).get("id"), "until": clock() + restart_window, "failure": failure}
            baseline, failure, reason = None, None, f"{failure}; waiting for its unit to start it again"
            deadline = max(deadline, clock() + timeout)
        elif exited and seen:
            exited = {}
        if current and not failure and not exited and (baseline is None or baseline["status"] == "created"):
            # The unit may create and start the container after the wait began: watch it from its first run.
            baseline = current
        if current:
            result.update(state=current["status"], restart_count=current["restart_count"])
        if failure:
            again = f", after its cold start had exited once already ({result['restarts'][0]})" if result["restarts"] else ""
            verdict, reason = FAIL, failure + again
            result["restartable"] = restartable(failed) and not exited
        refused = refusal() if refusal and verdict != READY else None
        if refused:
            verdict, reason = FAIL, refused
        if verdict == READY:
            result.update(ok=True, reason="ready")
            break
        if verdict == FAIL:
            result["reason"] = reason
            break
        if clock() > deadline:
            when = f"{timeout:g} s after its cold start's restart" if result["restarts"] else f"after {timeout:g} s"
            result["reason"] = f"not ready {when}: {reason}"
            break
        sleep(interval)
    result["elapsed"] = round(clock() - started, 1)
    result["reasons"] = [result["reason"]]
    return result


ERROR_MARKERS = ("Error", "error:", "unrecognized arguments")
# vLLM prefixes each line with its process, "(APIServer pid=1) ", then the level.
LOG_PREFIX = re.compile(r"^\([\w-]+ pid=\d+\) ")
QUIET_LEVELS = ("DEBUG", "INFO", "WARNING")


def is_engine_log_noise(line: str) -> bool:
    """A line that names no cause: a quieter level than an error, or the source shown inside a traceback.

    vLLM's startup warning about the open-file limit says "Too many open files" on every start
    where the limit cannot be raised; a traceback's quoted source lines hold words like
    ValidationError that name nothing that happened.
    """
    body = LOG_PREFIX.sub("", line, count=1)
    return body[:1].isspace() or body.split(" ", 1)[0] in QUIET_LEVELS


def error_lines(
    log: str | None,
    markers: t.Sequence[str] = ERROR_MARKERS,
    limit: int = 6,
    skip: t.Sequence[str] = ("Traceback",),
    engine_log: bool = True,
) -> list[str]:
    """The last ``limit`` lines of a log that hold one of ``markers`` and none of ``skip``, stripped.

    The defaults read an engine log: its root cause sits above the traceback's end, and the
    "Traceback (most recent call last)" line itself names nothing, so it is skipped, as is
    every line ``is_engine_log_noise`` finds. Other outputs pass ``engine_log=False``.
    """
    found = [line.strip() for line in (log or "").splitlines()
             if any(marker in line for marker in markers) and not any(word in line for word in skip)
             and not (engine_log and is_engine_log_noise(line))]
    return found[-limit:]


def parse_env_file(text: str) -> dict[str, str]:
    """NAME=value lines of a Docker env file (the value taken literally to the end of the line)."""
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, _separator, value = line.partition("=")
            values[key.strip()] = value
    return values
