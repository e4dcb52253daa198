# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health gate of one endpoint: wait until it serves every expected name while its
container is watched (a failed start ends the wait at once), then one warm-up request. The
vllm_health module and serving_unit's relaunch share it, so a gated task and a relaunch judge
alike.

Private to the collection.
"""

from __future__ import annotations

import json
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import refusal
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import inspect_container
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import answered, http
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import (
    POLL_INTERVAL,
    capacity_check,
    container_snapshot,
    error_lines,
    start_timeout,
    wait_until_ready,
)

Runner = t.Callable[[list[str]], tuple[int, str, str]]

# Long enough to avoid the CPU build's crash on a tiny first request.
WARMUP_PROMPT = "Say hello to the operator of this endpoint."


class Endpoint(t.NamedTuple):
    url: str
    api_key: str | None
    served_names: list[str]
    container: str | None
    timeout: float
    # A start that compiles (seed 001): its container may exit once and be started again by its unit within the window.
    cold: bool = False
    restarts_allowed: int = 0
    restart_window: float = 0
    # The warm stamp keeps the KV cache of the best good start of these settings; a start below the share of it is warned of.
    stamp: str | None = None
    kv_cache_warn_share: float | None = None

    @classmethod
    def of_instance(cls, found: t.Mapping[str, t.Any], timeout: float | None = None, cold: bool | None = None) -> Endpoint:
        """The endpoint of a deployed instance as _vllm_client reads it, with its planned timeout unless one is given: the
        warm one, or while its settings never served on the image's caches the cold one and the cold start's restart.
        ``cold`` overrides the stamp here (a cluster's head is cold when any node's caches are)."""
        planned, cold = start_timeout(found["health_timeout"], found.get("cold_start"), cold)
        cold_start = found.get("cold_start") or {}
        return cls(found["url"], found["api_key"], found["served_names"], found["container"], timeout or planned, cold,
                   int(cold_start.get("restarts", 0)) if cold else 0, float(cold_start.get("restart_window", 0)) if cold else 0,
                   cold_start.get("stamp"), cold_start.get("kv_cache_warn_share"))


def gate(endpoint: Endpoint, run: Runner | None, interval: float = POLL_INTERVAL, log_lines: int = 40, warmup: bool = False,
         warmup_reply_length: int = 8, what: str = "vLLM health gate") -> dict[str, t.Any]:
    """The gate's result: ok, reason(s), elapsed, served names, the container's state, and on
    failure ``msg`` with the log's tail and error lines (``run`` runs docker; None polls the
    endpoint only)."""
    base = endpoint.url.rstrip("/")
    watched = endpoint.container if run is not None else None

    def inspect() -> dict[str, t.Any] | None:
        return container_snapshot(inspect_container(run, watched))

    result = wait_until_ready(lambda: http("GET", base + "/v1/models", endpoint.api_key, timeout=5),
                              inspect if watched else None, endpoint.served_names, endpoint.timeout, interval,
                              restarts_allowed=endpoint.restarts_allowed, restart_window=endpoint.restart_window,
                              refusal=(lambda: refusal(watched)) if watched else None)
    result.update(changed=False, url=base, start="cold" if endpoint.cold else "warm", timeout=endpoint.timeout)
    if not result["ok"]:
        if watched:
            _rc, out, err = run(["docker", "logs", "--tail", "1000", watched])
            whole_log = (out + err).strip()
            result["log_tail"] = "\n".join(whole_log.splitlines()[-log_lines:])
            result["log_errors"] = error_lines(whole_log)
        result["msg"] = f"{what} failed: {result['reason']}"
        return result
    if warmup:
        payload = {"model": endpoint.served_names[0], "messages": [{"role": "user", "content": WARMUP_PROMPT}],
                   "max_tokens": warmup_reply_length, "temperature": 0}
        reply = http("POST", base + "/v1/chat/completions", endpoint.api_key, payload, timeout=120)
        try:
            result["warmup_reply"] = json.loads(reply.body)["choices"][0]["message"]["content"] if reply.status == 200 else None
        except (ValueError, KeyError, IndexError, TypeError):
            result["warmup_reply"] = None
        if result["warmup_reply"] is None:
            reason = f"the warm-up request answered {answered(reply)}: {reply.body[:500]}"
            result.update(ok=False, reason=reason, reasons=[reason], msg=f"vLLM health gate failed: {reason}")
    if result["ok"] and endpoint.stamp:
        tokens, warning = capacity_check(http("GET", base + "/metrics", endpoint.api_key, timeout=10), endpoint.stamp,
                                         endpoint.kv_cache_warn_share)
        result.update(kv_cache_tokens=tokens, kv_cache_warning=warning)
    return result
