"""One order for a cluster's ranks, whoever restarts them: the waves the cluster role starts (each rank's plan carries its
wave) are the waves the head's watchdog restarts, and a wave with a rank that did not start ends the sequence in both."""

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster_sequence import restart, start_wave

NODES = [{"name": "spark-1", "rank": 0, "address": "10.0.0.1"}, {"name": "spark-3", "rank": 2, "address": "10.0.0.3"},
         {"name": "spark-2", "rank": 1, "address": "10.0.0.2"}]


class Ranks:
    """Each step recorded in order; the ranks named in ``refusing`` do not pass their door."""

    def __init__(self, refusing=()):
        self.refusing, self.calls = set(refusing), []

    def __call__(self, verb, node):
        self.calls.append((verb, node["rank"]))
        if verb == "start" and node["rank"] in self.refusing:
            return 1, f"rank {node['rank']}: the start was refused: memory"
        return 0, ""


@pytest.mark.parametrize(("backend", "starts"), [("native", [1, 2, 0]), ("ray", [0, 1, 2])])
def test_every_rank_stops_in_rank_order_then_each_wave_starts(backend, starts):
    ranks = Ranks()
    steps = restart(NODES, backend, ranks)
    assert ranks.calls == [("stop", 0), ("stop", 1), ("stop", 2), *[("start", rank) for rank in starts]]
    assert [(step["rank"], step["address"], step["result"]) for step in steps[3:]] == [(r, f"10.0.0.{r + 1}", 0) for r in starts]


@pytest.mark.parametrize(("backend", "refusing", "started", "skipped"), [
    ("native", {1}, [1, 2], "rank 1 did not start, so rank 0 was not started"),
    ("native", {1, 2}, [1, 2], "rank 1, 2 did not start, so rank 0 was not started"),
    ("ray", {0}, [0], "rank 0 did not start, so rank 1, 2 was not started"),
])
def test_a_wave_with_a_rank_that_did_not_start_ends_the_sequence_and_says_why(backend, refusing, started, skipped):
    ranks = Ranks(refusing)
    steps = restart(NODES, backend, ranks)
    assert [rank for verb, rank in ranks.calls if verb == "start"] == started, "the whole wave is started, the later one is not"
    assert steps[-1] == {"step": "start", "skipped": skipped}
    assert [step["why"] for step in steps if "why" in step] == [f"rank {rank}: the start was refused: memory" for rank in sorted(refusing)]


@pytest.mark.parametrize("backend", ["native", "ray"])
def test_the_last_wave_failing_leaves_nothing_to_skip(backend):
    last = 0 if backend == "native" else 2
    steps = restart(NODES, backend, Ranks({last}))
    assert steps[-1]["rank"] == last and steps[-1]["result"] == 1 and not any("skipped" in step for step in steps)


def test_a_stop_that_failed_does_not_keep_the_ranks_down():
    calls = []

    def step(verb, node):
        calls.append((verb, node["rank"]))
        return (1, "systemctl stop timed out") if verb == "stop" and node["rank"] == 2 else (0, "")

    steps = restart(NODES, "native", step)
    assert [rank for verb, rank in calls if verb == "start"] == [1, 2, 0] and steps[2]["why"] == "systemctl stop timed out"


@pytest.mark.parametrize(("backend", "waves"), [("native", [1, 0, 0]), ("ray", [0, 1, 1])])
def test_native_starts_the_workers_first_and_ray_the_head(backend, waves):
    assert [start_wave(backend, rank) for rank in (0, 1, 2)] == waves
