# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one order in which a cluster's ranks restart, whoever restarts them: the cluster role's relaunch (each rank's plan
carries its start wave, from start_wave) and the head's watchdog (restart). Part of the host runtime: standard library
only. Private to the collection."""

from __future__ import annotations

import typing as t

# How the ranks find each other: torch's multi-node executor (native) or a Ray cluster the head starts.
BACKENDS = ("native", "ray")
# A rank's step: ("stop" or "start", the node {rank, address, ...}) -> (0 when it was done (a start: its door passed), why not).
Step = t.Callable[[str, t.Mapping[str, t.Any]], tuple[int, str]]


def start_wave(backend: str, rank: int) -> int:
    """0 for the ranks that start first, 1 for those started once the first passed their doors. Native (torch's multi-node
    executor): the workers, then the head, whose start the cluster's gate then times; Ray: the head, which the workers join."""
    return int((rank == 0) == (backend == "native"))


def restart(nodes: t.Sequence[t.Mapping[str, t.Any]], backend: str, step: Step) -> list[dict[str, t.Any]]:
    """Every rank stopped (in rank order), then each wave's ranks started, a start counting once its door passed, as the
    cluster role starts them. A wave with a rank that did not start ends the sequence: the later ranks would wait for a
    rank that never comes, so they stay stopped and the last entry says so. One entry per step: rank, address, step and
    result (0: done) with why it was not, or skipped."""
    def done(verb: str, node: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
        result, why = step(verb, node)
        return {"rank": node["rank"], "address": node["address"], "step": verb, "result": result, **({"why": why} if why else {})}

    ordered = sorted(nodes, key=lambda node: node["rank"])
    steps = [done("stop", node) for node in ordered]
    waves = [[node for node in ordered if start_wave(backend, node["rank"]) == wave] for wave in (0, 1)]
    for index, wave in enumerate(waves):
        started = [done("start", node) for node in wave]
        steps += started
        failed = [str(entry["rank"]) for entry in started if entry["result"] != 0]
        later = [str(node["rank"]) for after in waves[index + 1:] for node in after]
        if failed and later:
            steps.append({"step": "start", "skipped": f"rank {', '.join(failed)} did not start, so rank {', '.join(later)} was not started"})
            break
    return steps
