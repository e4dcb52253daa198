"""A worker rank's start returns once its unit passed the host runtime's door, and names why when it did not: the
admission's refusal (the record the runtime writes), the unit failing before its container ran (the fabric wait), or no
verdict in time. systemctl and docker answer in their recorded formats through a runner that replays a sequence of
host states; the clock is the test's."""

import json

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import record_refusal
from ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit import UnitError, door_passed, start

WORKER = {"name": "qwen", "unit": "sparkfleet-cluster-qwen.service", "container": "vllm-cluster-qwen",
          "cluster": {"rank": 1, "head": False}}
MISSING = "Error response from daemon: No such container: vllm-cluster-qwen\n"


STARTED = "2026-12-06T09:00:01.123456789Z"
NEVER = "0001-01-01T00:00:00Z"


class Host:
    """Each poll reads the next state (ActiveState, the container's StartedAt or None for no container); the last one stays."""

    def __init__(self, states):
        self.states, self.calls, self.polls = list(states), [], 0

    def __call__(self, argv):
        self.calls.append(" ".join(argv))
        active, container = self.states[min(self.polls, len(self.states) - 1)]
        if argv[:3] == ["docker", "container", "inspect"]:
            if container is None:
                return 1, "[]\n", MISSING
            return 0, json.dumps([{"State": {"Running": container == STARTED, "StartedAt": container}}]), ""
        if argv[0] == "systemctl" and argv[1] == "show":
            self.polls += 1
            return 0, f"LoadState=loaded\nActiveState={active}\nUnitFileState=disabled\n", ""
        return 0, "", ""


class Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_a_worker_whose_container_started_has_passed_its_door(tmp_path):
    host, clock = Host([("activating", None), ("activating", NEVER), ("active", STARTED)]), Clock()
    door_passed(WORKER, host, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert host.polls == 2 and len(clock.slept) == 2, "polled until the container started, and no longer"


def test_a_worker_whose_container_started_and_exited_passed_its_door_the_heads_gate_judges_the_rest(tmp_path):
    door_passed(WORKER, Host([("failed", STARTED)]), str(tmp_path), clock=Clock(), sleep=Clock().sleep)


def test_a_refused_worker_start_is_named_at_once_with_the_admissions_reason(tmp_path):
    record_refusal(WORKER["container"], "memory: MemAvailable 40.0 GiB free, the share 0.85 wants 103.4 GiB: refused", "abc",
                   folder=str(tmp_path))
    host, clock = Host([("failed", NEVER)]), Clock()
    with pytest.raises(UnitError) as refused:
        door_passed(WORKER, host, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert str(refused.value) == ("rank 1 of cluster qwen (sparkfleet-cluster-qwen.service): the start was refused: "
                                  "memory: MemAvailable 40.0 GiB free, the share 0.85 wants 103.4 GiB: refused")
    assert clock.slept == [] and host.calls == [], "the refusal is read before anything else, and decides at once"


def test_a_worker_unit_that_fails_before_its_container_starts_points_at_its_journal(tmp_path):
    host, clock = Host([("activating", None), ("failed", NEVER)]), Clock()
    with pytest.raises(UnitError, match=r"rank 1 of cluster qwen .* failed before its container started: `journalctl -u "
                                        r"sparkfleet-cluster-qwen.service` on the node says why"):
        door_passed(WORKER, host, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert len(clock.slept) == 1


def test_a_door_without_a_verdict_in_time_is_named_not_waited_on_forever(tmp_path):
    host, clock = Host([("activating", None)]), Clock()
    with pytest.raises(UnitError, match="its container did not start within 20 s of the start"):
        door_passed(WORKER, host, str(tmp_path), timeout=20, clock=clock, sleep=clock.sleep)
    assert 20 <= clock.now <= 21


def test_only_a_worker_ranks_start_waits_for_its_door(tmp_path, monkeypatch):
    waited = []
    monkeypatch.setattr("ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit.door_passed",
                        lambda plan, run, folder: waited.append(plan["name"]))
    for plan in (WORKER, {**WORKER, "name": "head", "cluster": {"rank": 0, "head": True}}, {**WORKER, "name": "llm", "cluster": None}):
        assert start(plan, False, Host([("active", STARTED)]), refusals_dir=str(tmp_path))["changed"]
    assert waited == ["qwen"]
