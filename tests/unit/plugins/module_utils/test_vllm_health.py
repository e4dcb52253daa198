import json

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import (
    container_failure,
    container_snapshot,
    models_verdict,
)

MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "vllm"}]})


def inspect_json(status="running", restart_count=0, container_id="abc", started_at="2026-11-29T09:00:00Z", exit_code=0, oom=False):
    return json.dumps(
        [
            {
                "Id": container_id,
                "RestartCount": restart_count,
                "State": {"Status": status, "ExitCode": exit_code, "OOMKilled": oom, "StartedAt": started_at},
            }
        ]
    )


def test_models_ready_when_every_name_is_served():
    assert models_verdict(200, MODELS, ["tiny"]) == (True, "ready", ["tiny"])


def test_models_not_ready():
    assert models_verdict(None, "", ["tiny"])[0] is False
    assert "401" in models_verdict(401, '{"error":"Unauthorized"}', ["tiny"])[1]
    assert models_verdict(200, MODELS, ["tiny", "other"])[1] == "serving tiny but not other"
    assert models_verdict(200, "<html>", ["tiny"])[0] is False
    assert models_verdict(503, "", ["tiny"])[1] == "HTTP 503"


def test_snapshot_reads_docker_inspect():
    snapshot = container_snapshot(inspect_json(restart_count=2))
    assert snapshot["status"] == "running" and snapshot["restart_count"] == 2 and snapshot["id"] == "abc"
    assert container_snapshot("[]") is None
    assert container_snapshot("Error: No such object: x") is None


def test_failure_when_the_container_exits_restarts_or_is_replaced():
    baseline = container_snapshot(inspect_json())
    assert container_failure(baseline, baseline) is None
    assert "exited (exit code 2)" in container_failure(baseline, container_snapshot(inspect_json(status="exited", exit_code=2)))
    assert "OOM" in container_failure(baseline, container_snapshot(inspect_json(status="exited", exit_code=137, oom=True)))
    assert "0 -> 1" in container_failure(baseline, container_snapshot(inspect_json(restart_count=1)))
    assert "replaced" in container_failure(baseline, container_snapshot(inspect_json(container_id="def")))
    assert "start time" in container_failure(baseline, container_snapshot(inspect_json(started_at="2026-11-29T09:01:00Z")))
    assert container_failure(baseline, None) == "the container is gone"


def test_no_baseline_only_dead_states_fail():
    assert container_failure(None, None) is None
    assert container_failure(None, container_snapshot(inspect_json(status="created"))) is None
    assert container_failure(None, container_snapshot(inspect_json(status="dead"))) is not None


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
