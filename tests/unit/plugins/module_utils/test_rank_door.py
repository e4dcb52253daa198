"""A cluster rank's start (the role's, the head's watchdog's) returns once its unit passed the host runtime's door, and
names why when it did not: the admission's refusal (the record the runtime writes), the unit failing before its
container ran (the fabric wait), or no verdict in time. A container that started before the start was asked is the
last run's, not a pass. systemctl and docker answer in their recorded formats through a runner that replays a sequence
of host states; the clock is the test's."""

import json

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import DoorNotPassed, await_door, record_refusal
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import started_at
from ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit import UnitError, start

WORKER = {"name": "qwen", "unit": "sparkfleet-cluster-qwen.service", "container": "vllm-cluster-qwen",
          "cluster": {"rank": 1, "head": False}}
MISSING = "Error response from daemon: No such container: vllm-cluster-qwen\n"


STARTED = "2026-12-06T09:00:01.123456789Z"
NEVER = "0001-01-01T00:00:00Z"
# The start was asked a second before the container started; the last run's container started the day before.
ASKED = started_at(STARTED) - 1
LAST_RUN = "2026-12-05T09:00:00.5Z"


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
            return 0, json.dumps([{"Name": "/vllm-cluster-qwen", "State": {"Running": container != NEVER, "StartedAt": container}}]), ""
        if argv[0] == "systemctl" and argv[1] == "show":
            self.polls += 1
            job = "" if active in ("active", "inactive", "failed") else "1234"
            return 0, f"LoadState=loaded\nActiveState={active}\nUnitFileState=disabled\nJob={job}\n", ""
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
    await_door(WORKER, host, ASKED, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert host.polls == 2 and len(clock.slept) == 2, "polled until the container started, and no longer"


def test_a_worker_whose_container_started_and_exited_passed_its_door_the_heads_gate_judges_the_rest(tmp_path):
    await_door(WORKER, Host([("failed", STARTED)]), ASKED, str(tmp_path), clock=Clock(), sleep=Clock().sleep)


def test_a_refused_worker_start_is_named_at_once_with_the_admissions_reason(tmp_path):
    record_refusal(WORKER["container"], "memory: MemAvailable 40.0 GiB free, the share 0.85 wants 103.4 GiB: refused", "abc",
                   folder=str(tmp_path))
    host, clock = Host([("failed", NEVER)]), Clock()
    with pytest.raises(DoorNotPassed) as refused:
        await_door(WORKER, host, ASKED, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert str(refused.value) == ("rank 1 of cluster qwen (sparkfleet-cluster-qwen.service): the start was refused: "
                                  "memory: MemAvailable 40.0 GiB free, the share 0.85 wants 103.4 GiB: refused")
    assert clock.slept == [] and host.calls == [], "the refusal is read before anything else, and decides at once"


def test_a_worker_unit_that_fails_before_its_container_starts_points_at_its_journal(tmp_path):
    host, clock = Host([("activating", None), ("failed", NEVER)]), Clock()
    with pytest.raises(DoorNotPassed, match=r"rank 1 of cluster qwen .* failed before its container started: `journalctl -u "
                                            r"sparkfleet-cluster-qwen.service` on the node says why"):
        await_door(WORKER, host, ASKED, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert len(clock.slept) == 1


def test_a_door_without_a_verdict_in_time_is_named_not_waited_on_forever(tmp_path):
    host, clock = Host([("activating", None)]), Clock()
    with pytest.raises(DoorNotPassed, match="its container did not start within 20 s of the start"):
        await_door(WORKER, host, ASKED, str(tmp_path), timeout=20, clock=clock, sleep=clock.sleep)
    assert 20 <= clock.now <= 21


def test_the_last_runs_container_is_no_pass_the_new_one_is(tmp_path):
    host, clock = Host([("activating", LAST_RUN), ("activating", LAST_RUN), ("active", STARTED)]), Clock()
    await_door(WORKER, host, ASKED, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert host.polls == 2 and len(clock.slept) == 2, "the last run's container twice, then the new one"


@pytest.mark.parametrize("answer", [(1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"), (0, "not json", "")])
def test_a_door_docker_cannot_show_is_named_not_passed(tmp_path, answer):
    with pytest.raises(DoorNotPassed, match=r"rank 1 of cluster qwen \(sparkfleet-cluster-qwen.service\): docker container inspect "):
        await_door(WORKER, lambda argv: answer, ASKED, str(tmp_path), clock=Clock(), sleep=Clock().sleep)


def test_every_ranks_start_waits_for_its_door_and_an_instances_does_not(tmp_path, monkeypatch):
    waited = []
    monkeypatch.setattr("ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit.await_door",
                        lambda plan, run, asked, folder: waited.append(plan["name"]))
    for plan in (WORKER, {**WORKER, "name": "head", "cluster": {"rank": 0, "head": True}}, {**WORKER, "name": "llm", "cluster": None}):
        assert start(plan, False, Host([("active", STARTED)]), refusals_dir=str(tmp_path))["changed"]
    assert waited == ["qwen", "head"]


def test_a_ranks_start_that_did_not_pass_its_door_fails_the_step_with_the_reason(tmp_path):
    record_refusal(WORKER["container"], "stray holders: pid 27079 (sleep) holds /dev/nvidia9", "abc", folder=str(tmp_path))
    host = Host([("failed", NEVER)])
    # serving_unit's start clears the last refusal first; the runtime writes this one during the start.
    host_calls = host.__call__

    def refusing(argv):
        if argv[:2] == ["systemctl", "start"]:
            record_refusal(WORKER["container"], "stray holders: pid 27079 (sleep) holds /dev/nvidia9", "abc", folder=str(tmp_path))
        return host_calls(argv)

    with pytest.raises(UnitError, match=r"rank 1 of cluster qwen .*: the start was refused: stray holders: pid 27079 \(sleep\)"):
        start(WORKER, False, refusing, refusals_dir=str(tmp_path))


def test_a_start_systemd_ended_without_running_the_unit_is_named_at_once(tmp_path):
    host, clock = Host([("activating", None), ("inactive", None)]), Clock()
    with pytest.raises(DoorNotPassed, match=r"systemd ended the start without running the unit \(a dependency failed\?\): "
                                            r"`systemctl status sparkfleet-cluster-qwen.service`"):
        await_door(WORKER, host, ASKED, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert len(clock.slept) == 1


def test_a_unit_still_running_the_last_starts_container_did_not_start_again(tmp_path):
    host, clock = Host([("active", LAST_RUN)]), Clock()
    with pytest.raises(DoorNotPassed, match="still runs the container of a start before this one"):
        await_door(WORKER, host, ASKED, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert clock.slept == []


def test_an_active_worker_whose_admission_runs_is_waited_on(tmp_path):
    host, clock = Host([("active", None), ("active", None), ("active", STARTED)]), Clock()
    await_door(WORKER, host, ASKED, str(tmp_path), clock=clock, sleep=clock.sleep)
    assert len(clock.slept) == 2, "no container yet while the runtime admits the start: not a failure"
