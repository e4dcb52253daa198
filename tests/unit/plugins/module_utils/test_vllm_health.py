import http.client
import json
import socket
import ssl
import urllib.error

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, inspect_container
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import (
    FAIL,
    READY,
    WAIT,
    Reply,
    capacity_warning,
    container_failure,
    container_snapshot,
    exception_reply,
    is_warm,
    kv_cache_tokens,
    mark_warm,
    models_verdict,
    parse_env_file,
    stamp_record,
    start_timeout,
    wait_until_ready,
)

MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "vllm"}]})


def record(status="running", restart_count=0, container_id="abc", started_at="2026-11-29T09:00:00Z", exit_code=0, oom=False, error=""):
    """A container's record as docker container inspect gives it (one element of its list)."""
    return {
        "Id": container_id,
        "Name": "/vllm-tiny",
        "RestartCount": restart_count,
        "State": {"Status": status, "ExitCode": exit_code, "OOMKilled": oom, "StartedAt": started_at, "Error": error},
    }


def test_models_ready_when_every_name_is_served():
    assert models_verdict(Reply(200, MODELS), ["tiny"]) == (READY, "ready", ["tiny"])


@pytest.mark.parametrize(
    ("reply", "verdict", "fragment"),
    [
        (Reply(None, "", "not answering yet (ConnectionRefusedError)", True), WAIT, "not answering yet"),
        (Reply(503, ""), WAIT, "HTTP 503"),
        (Reply(401, '{"error":"Unauthorized"}'), FAIL, "refuses the API key"),
        (Reply(404, "not found"), FAIL, "not the vLLM endpoint"),
        (Reply(200, MODELS), FAIL, "not other"),
        (Reply(200, "<html>"), FAIL, "not a model list"),
        (Reply(200, "[1, 2]"), FAIL, "not a model list"),
        (Reply(None, "", "the request cannot be sent (Invalid header value)", False), FAIL, "cannot be sent"),
    ],
)
def test_models_verdict_waits_only_on_not_up_yet(reply, verdict, fragment):
    found, reason, _served = models_verdict(reply, ["tiny", "other"] if reply.body == MODELS else ["tiny"])
    assert found == verdict and fragment in reason


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")), True),
        (urllib.error.URLError(ConnectionResetError(104, "reset")), True),
        (urllib.error.URLError(TimeoutError("timed out")), True),
        (http.client.RemoteDisconnected("closed"), True),
        (ValueError("Invalid header value b'Bearer a\\nb'"), False),
        (urllib.error.URLError(ssl.SSLError(1, "CERTIFICATE_VERIFY_FAILED")), False),
        (urllib.error.URLError("unknown url type: htp"), False),
        (urllib.error.URLError(socket.gaierror(-2, "Name or service not known")), False),
        (http.client.InvalidURL("nonnumeric port"), False),
    ],
)
def test_client_side_errors_are_not_waited_on(error, retryable):
    reply = exception_reply(error)
    assert reply.status is None and reply.retryable is retryable and reply.error


def test_http_errors_keep_their_status():
    assert exception_reply(urllib.error.HTTPError("http://x", 401, "Unauthorized", {}, None)).status == 401


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_wait_polls_until_ready():
    replies = iter([Reply(None, "", "refused", True), Reply(None, "", "refused", True), Reply(200, MODELS)])
    clock = Clock()
    result = wait_until_ready(lambda: next(replies), None, ["tiny"], timeout=60, clock=clock, sleep=clock.sleep)
    assert result["ok"] and result["elapsed"] == 1 and result["reasons"] == ["ready"]


def test_wait_stops_at_once_on_a_fatal_reply():
    clock = Clock()
    result = wait_until_ready(lambda: Reply(None, "", "the request cannot be sent (Invalid header value)", False), None, ["tiny"],
                              timeout=300, clock=clock, sleep=clock.sleep)
    assert not result["ok"] and result["elapsed"] == 0 and "cannot be sent" in result["reason"]


def test_wait_stops_when_the_container_dies_and_at_the_timeout():
    states = iter([None, container_snapshot(record(status="created")), container_snapshot(record(status="exited", exit_code=2))])
    clock = Clock()
    result = wait_until_ready(lambda: Reply(None, "", "refused", True), lambda: next(states), ["tiny"], timeout=300,
                              clock=clock, sleep=clock.sleep)
    assert not result["ok"] and "exited (exit code 2)" in result["reason"] and result["state"] == "exited"
    clock = Clock()
    result = wait_until_ready(lambda: Reply(None, "", "refused", True), None, ["tiny"], timeout=10, clock=clock, sleep=clock.sleep)
    assert not result["ok"] and result["reason"].startswith("not ready after 10 s")


def test_env_file_parsing_keeps_equals_signs_in_values():
    assert parse_env_file("# comment\nVLLM_API_KEY=k=ey\nX=1\n") == {"VLLM_API_KEY": "k=ey", "X": "1"}


def test_snapshot_reads_docker_inspect():
    snapshot = container_snapshot(inspect_container(lambda argv: (0, json.dumps([record(restart_count=2)]), ""), "vllm-tiny"))
    assert snapshot["status"] == "running" and snapshot["restart_count"] == 2 and snapshot["id"] == "abc"
    assert container_snapshot(inspect_container(lambda argv: (1, "[]", "Error: No such object: vllm-tiny"), "vllm-tiny")) is None
    assert container_snapshot(None) is None


def test_failure_when_the_container_exits_restarts_or_is_replaced():
    baseline = container_snapshot(record())
    assert container_failure(baseline, baseline) is None
    assert "exited (exit code 2)" in container_failure(baseline, container_snapshot(record(status="exited", exit_code=2)))
    assert "OOM" in container_failure(baseline, container_snapshot(record(status="exited", exit_code=137, oom=True)))
    assert "0 -> 1" in container_failure(baseline, container_snapshot(record(restart_count=1)))
    assert "replaced" in container_failure(baseline, container_snapshot(record(container_id="def")))
    assert "start time" in container_failure(baseline, container_snapshot(record(started_at="2026-11-29T09:01:00Z")))
    assert container_failure(baseline, None) == "the container is gone"


# Recorded on a lab host whose bridge address had changed under its plan (seed 000's LAN-bind race has the same cause).
BIND_FAILED = ("driver failed programming external connectivity on endpoint vllm-tiny (e63bd020653f): Error starting userland proxy: "
               "listen tcp4 172.17.0.2:8001: bind: cannot assign requested address")


def test_a_container_docker_could_not_start_fails_the_wait_at_once():
    """docker run exits 125 and leaves the container created with State.Error: without this the unit sat activating for
    its whole timeout (seen on the lab: 13 minutes of a boot waiting on it)."""
    failed = container_snapshot(record(status="created", exit_code=128, started_at="0001-01-01T00:00:00Z", error=BIND_FAILED))
    assert container_failure(None, failed) == f"docker could not start the container: {BIND_FAILED}"
    clock = Clock()
    result = wait_until_ready(lambda: Reply(None, "", "refused", True), lambda: failed, ["tiny"], timeout=900, clock=clock, sleep=clock.sleep)
    assert not result["ok"] and result["elapsed"] == 0 and "cannot assign requested address" in result["reason"]


def test_no_baseline_only_dead_states_fail():
    assert container_failure(None, None) is None
    assert container_failure(None, container_snapshot(record(status="created"))) is None
    assert container_failure(None, container_snapshot(record(status="dead"))) is not None


def test_error_lines_find_the_root_cause_above_the_traceback_end():
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import error_lines

    log = "\n".join(
        [
            "(APIServer pid=1) INFO starting",
            "usage: vllm serve [model_tag] [options]",
            "vllm serve: error: unrecognized arguments: --no-such-flag",
        ]
    )
    assert error_lines(log) == ["vllm serve: error: unrecognized arguments: --no-such-flag"]
    shm = "Traceback (most recent call last):\n  File x\nRuntimeError: Insufficient space in /dev/shm\nRuntimeError: Engine core initialization failed."
    assert error_lines(shm)[0] == "RuntimeError: Insufficient space in /dev/shm"


def test_error_lines_pass_over_warnings_and_quoted_traceback_source():
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import error_lines

    # A failed start as CI saw it: the ulimit warning and a traceback's source line were all it reported.
    log = "\n".join(
        [
            "(APIServer pid=1) WARNING 12-01 23:10:02 [system_utils.py:299] Found ulimit of 20000 and failed to automatically"
            " increase with error current limit exceeds maximum limit. This can cause fd limit errors like"
            " `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
            "(EngineCore pid=60) Traceback (most recent call last):",
            '(EngineCore pid=60)   File "/opt/venv/lib/python3.11/site-packages/vllm/x.py", line 3, in <module>',
            "(EngineCore pid=60)     from pydantic.v1.error_wrappers import ValidationError",
            "(EngineCore pid=60) ValueError: No available memory for the cache blocks.",
        ]
    )
    assert error_lines(log) == ["(EngineCore pid=60) ValueError: No available memory for the cache blocks."]
    assert error_lines("WARNING 03-23 05:00:57 [utils.py:2079] OSError: Too many open files") == []


def test_error_lines_take_the_markers_the_caller_looks_for():
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import error_lines

    output = "Traceback (most recent call last):\nINFO Connection refused\nError 0: Unauthorized\nError 1: Unauthorized\nok\n"
    assert error_lines(output, ("Error", "refused", "Traceback"), limit=2, skip=()) == ["Error 0: Unauthorized", "Error 1: Unauthorized"]
    expected = ["Traceback (most recent call last):", "INFO Connection refused"]
    assert error_lines(output, ("refused", "Traceback"), limit=5, skip=(), engine_log=False) == expected
    assert error_lines(output, ("refused",), limit=5, skip=("INFO",), engine_log=False) == []
    assert error_lines(None) == [] and error_lines("") == []


def test_a_container_seen_created_then_started_is_no_restart():
    """The units' readiness wait starts right after docker run forks: it often sees the container only created."""
    created = container_snapshot(record(status="created", started_at="0001-01-01T00:00:00Z"))
    started = container_snapshot(record(status="running", started_at="2026-11-29T09:00:05Z"))
    assert container_failure(created, started) is None
    states = iter([created, created, started, started, container_snapshot(record(status="running", started_at="2026-11-29T09:03:00Z"))])
    replies = iter([Reply(None, "", "refused", True)] * 4 + [Reply(200, MODELS)])
    clock = Clock()
    result = wait_until_ready(lambda: next(replies), lambda: next(states), ["tiny"], timeout=60, clock=clock, sleep=clock.sleep)
    assert not result["ok"] and "start time changed" in result["reason"], "a restart after the first start is still caught"
    states = iter([created, created, started, started, started])
    replies = iter([Reply(None, "", "refused", True)] * 3 + [Reply(200, MODELS)])
    result = wait_until_ready(lambda: next(replies), lambda: next(states), ["tiny"], timeout=60, clock=clock, sleep=clock.sleep)
    assert result["ok"]


def test_a_port_that_answers_something_other_than_http_is_not_waited_on():
    reply = exception_reply(http.client.BadStatusLine("SSH-2.0-OpenSSH_9.6"))
    assert reply.status is None and reply.retryable is False and "the answer is not HTTP" in reply.error


def test_a_model_list_whose_ids_are_not_names_is_another_server():
    verdict, reason, served = models_verdict(Reply(200, json.dumps({"data": [{"id": 1}]})), ["tiny"])
    assert (verdict, served) == (FAIL, []) and "not a model list" in reason


def test_snapshot_of_inspect_output_of_another_shape_is_none():
    assert container_snapshot({"Id": "abc", "State": "running"}) is None
    assert container_snapshot({"Id": "abc", "RestartCount": "2", "State": {}})["restart_count"] == 0


def snapshots(*specs):
    """The inspect answers of a scripted container history, one per poll; the last repeats."""
    states = [None if spec is None else container_snapshot(record(**spec)) for spec in specs]
    return lambda: states.pop(0) if len(states) > 1 else states[0]


COMPILED_THEN_EXITED = {"status": "exited", "exit_code": 1}


def test_a_cold_start_gets_past_one_exit_when_its_unit_starts_the_container_again():
    """Seed 001: the 31B's first start compiles, finds too little KV cache and exits; the unit starts it again on the
    caches it filled, and that start serves."""
    inspect = snapshots({}, COMPILED_THEN_EXITED, COMPILED_THEN_EXITED, None, {"container_id": "new", "status": "created"},
                        {"container_id": "new"})
    replies = iter([Reply(None, "", "refused", True)] * 6 + [Reply(200, MODELS)])
    clock = Clock()
    result = wait_until_ready(lambda: next(replies), inspect, ["tiny"], timeout=2700, clock=clock, sleep=clock.sleep,
                              restarts_allowed=1, restart_window=130)
    assert result["ok"] and result["restarts"] == ["the container is exited (exit code 1)"]


@pytest.mark.parametrize(("history", "reason"), [
    # The second exit fails: one compile-then-exit is the seed's shape, a second is a crash loop.
    (({}, COMPILED_THEN_EXITED, {"container_id": "new"}, {"container_id": "new", **COMPILED_THEN_EXITED}),
     "exited (exit code 1), after its cold start had exited once already (the container is exited (exit code 1))"),
    # A unit that does not start it again (its start limit hit, or a cluster's rank) fails after the window.
    (({}, COMPILED_THEN_EXITED), "and no new container started within 130 s"),
    # An OOM kill is not a compile-then-exit: on GB10 each one leaks unified memory.
    (({}, {"status": "exited", "exit_code": 137, "oom": True}), "killed by the OOM killer"),
])
def test_a_cold_start_fails_past_its_one_restart(history, reason):
    clock = Clock()
    result = wait_until_ready(lambda: Reply(None, "", "refused", True), snapshots(*history), ["tiny"], timeout=2700, clock=clock,
                              sleep=clock.sleep, restarts_allowed=1, restart_window=130)
    assert not result["ok"] and reason in result["reason"] and clock.now < 2700


def test_a_warm_start_fails_at_its_first_exit_and_says_a_restart_could_help():
    clock = Clock()
    result = wait_until_ready(lambda: Reply(None, "", "refused", True), snapshots({}, COMPILED_THEN_EXITED), ["tiny"], timeout=1200,
                              clock=clock, sleep=clock.sleep)
    assert not result["ok"] and result["elapsed"] == 0 and result["restarts"] == [] and result["restartable"]
    oom = wait_until_ready(lambda: Reply(None, "", "refused", True), snapshots({}, {"status": "exited", "oom": True}), ["tiny"],
                           timeout=1200, clock=Clock(), sleep=lambda _s: None)
    assert not oom["restartable"]


def test_the_stamp_decides_the_timeout_and_is_written_once(tmp_path):
    stamp = tmp_path / "jit" / "a" / "warm" / "b"
    cold_start = {"timeout": 2700, "stamp": str(stamp)}
    assert start_timeout(1200, cold_start) == (2700, True)
    assert start_timeout(1200, None) == (1200, False), "a plan file without cold_start is judged as before"
    mark_warm(str(stamp))
    written = stamp.read_text()
    assert is_warm(str(stamp)) and start_timeout(1200, cold_start) == (1200, False)
    mark_warm(str(stamp))
    assert stamp.read_text() == written and list(stamp.parent.iterdir()) == [stamp]


# vLLM 0.32's info series as the CPU build serves it (labels trimmed; the values are its settings as text).
CACHE_INFO = ('vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.1",'
              'kv_cache_size_tokens="{tokens}",num_gpu_blocks="{blocks}",prefix_caching_hash_algo="sha256"}} 1.0\n')


@pytest.mark.parametrize("page, tokens", [
    (CACHE_INFO.format(tokens="512", blocks="32"), 512),
    (CACHE_INFO.format(tokens="None", blocks="32"), 512),
    (CACHE_INFO.format(tokens="", blocks="None"), None),
    ('# HELP x\nvllm:cache_config_info{block_size="16",num_gpu_blocks="2048",note="a \\"quoted\\" value"} 1.0\n', 32768),
    ("vllm:num_requests_running{engine=\"0\"} 0.0\n", None),
    ("", None),
    (CACHE_INFO.format(tokens="0", blocks="0"), None),
])
def test_the_kv_cache_size_is_read_from_the_cache_config_series(page, tokens):
    assert kv_cache_tokens(page) == tokens


def test_a_start_below_the_share_of_the_best_good_one_is_warned_of_and_never_lowers_the_reference(tmp_path):
    stamp = str(tmp_path / "warm" / "key")
    assert stamp_record(stamp) == {} and capacity_warning(1000, None, 0.9) is None, "a first start has nothing to compare with"
    mark_warm(stamp, 1000)
    assert stamp_record(stamp) == {"kv_cache_tokens": 1000}
    warning = capacity_warning(849, 1000, 0.9)
    assert warning.startswith("the KV cache holds 849 tokens, 85 % of the 1,000 of the best good start of these settings (below 90 %)")
    assert capacity_warning(900, 1000, 0.9) is None and capacity_warning(1200, 1000, 0.9) is None
    assert capacity_warning(999, 1000, 1) and capacity_warning(None, 1000, 0.9) is None and capacity_warning(500, 1000, None) is None
    mark_warm(stamp, 849, degraded=True)
    assert stamp_record(stamp) == {"kv_cache_tokens": 1000}, "a degraded start is no reference"
    mark_warm(stamp, 1100)
    assert stamp_record(stamp) == {"kv_cache_tokens": 1100}, "a larger good start raises the reference"
    mark_warm(stamp, 1000)
    assert stamp_record(stamp) == {"kv_cache_tokens": 1100}, "never lowered: a loss growing a little each start still warns"
    assert capacity_warning(990, 1100, 0.9) is None and capacity_warning(989, 1100, 0.9), "judged against the best, 1,100"
    mark_warm(stamp)
    assert stamp_record(stamp) == {"kv_cache_tokens": 1100}, "a start whose size is unknown keeps the reference"
    assert sorted(path.name for path in (tmp_path / "warm").iterdir()) == ["key"], "no temporary file is left"


@pytest.mark.parametrize("content", ["1733450000\n", "", "{not json", '{"kv_cache_tokens": "1000"}', '{"kv_cache_tokens": true}',
                                     '{"kv_cache_tokens": -5}', "[1000]"])
def test_a_stamp_of_an_older_release_or_damaged_keeps_no_reference_and_still_stamps_warm(tmp_path, content):
    stamp = tmp_path / "key"
    stamp.write_text(content)
    assert stamp_record(str(stamp)) == {} and is_warm(str(stamp))
    mark_warm(str(stamp), 700, degraded=True)
    assert stamp.read_text() == content, "a degraded start rewrites nothing"
    mark_warm(str(stamp), 700)
    assert stamp_record(str(stamp)) == {"kv_cache_tokens": 700}


def test_a_replacement_seen_before_the_exit_waits_on_the_new_container_not_the_window():
    """A poll that misses the exit sees the new container straight away: the new one is watched, not taken for the old."""
    inspect = snapshots({}, {"container_id": "new"}, {"container_id": "new"})
    replies = iter([Reply(None, "", "refused", True)] * 200 + [Reply(200, MODELS)])
    clock = Clock()
    result = wait_until_ready(lambda: next(replies), inspect, ["tiny"], timeout=2700, clock=clock, sleep=clock.sleep,
                              restarts_allowed=1, restart_window=130)
    assert result["ok"] and clock.now == 100 and result["restarts"] == ["the container was replaced (its start failed and it was started again)"]


def test_docker_not_answering_is_no_exit_and_spends_no_restart():
    answers = iter([{}, "unanswered", "unanswered", {}, {}])

    def inspect():
        answer = next(answers, {})
        if answer == "unanswered":
            raise StateUnanswered("Cannot connect to the Docker daemon")
        return container_snapshot(record(**answer))

    replies = iter([Reply(None, "", "refused", True)] * 4 + [Reply(200, MODELS)])
    clock = Clock()
    result = wait_until_ready(lambda: next(replies), inspect, ["tiny"], timeout=2700, clock=clock, sleep=clock.sleep,
                              restarts_allowed=1, restart_window=130)
    assert result["ok"] and result["restarts"] == []


def test_the_start_after_a_passed_over_exit_gets_its_own_timeout():
    """As at boot, where each start of the unit waits its own timeout: a long compile, the exit and the warm start."""
    inspect = snapshots({}, *[{}] * 9, COMPILED_THEN_EXITED, None, {"container_id": "new"})
    replies = iter([Reply(None, "", "refused", True)] * 14 + [Reply(200, MODELS)])
    clock = Clock()
    result = wait_until_ready(lambda: next(replies), inspect, ["tiny"], timeout=20, interval=2, clock=clock, sleep=clock.sleep,
                              restarts_allowed=1, restart_window=130)
    assert result["ok"] and clock.now == 28 > 20
    clock = Clock()
    late = wait_until_ready(lambda: Reply(None, "", "refused", True), snapshots({}, COMPILED_THEN_EXITED, {"container_id": "new"}), ["tiny"],
                            timeout=20, interval=2, clock=clock, sleep=clock.sleep, restarts_allowed=1, restart_window=130)
    assert late["reason"].startswith("not ready 20 s after its cold start's restart: ") and clock.now == 22
