# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout for playbooks/rollout.yml; the logic is in module_utils."""

from __future__ import annotations

# Each filter imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md).

# What the plan reads of each host (hostvars are templated lazily: only these are asked for).
PLANNED_FACTS = ("vllm_drift", "cluster_name", "cluster_nodes", "cluster_drift")


def rollout_plan(hosts, hostvars, settings):
    from ansible_collections.sparkfleet.vllm.plugins.filter.sweep import controller_has
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._rollout import plan_rollout

    facts = {host: {key: hostvars[host].get(key) for key in PLANNED_FACTS} for host in hosts if host in hostvars}
    return plan_rollout(list(hosts), facts, settings or {}, controller_has)


def rollout_verdict(unit, launch, before_correctness, before_bench, after_correctness, after_bench, settings):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._rollout import judge_unit, measured

    repeats = (settings or {}).get("rollout_repeats") or 0
    before = measured(before_correctness, before_bench, repeats) if before_correctness else None
    after = measured(after_correctness, after_bench, repeats) if after_correctness else None
    record = judge_unit(unit, launch or {}, before, after, settings)
    # Only the counts of the correctness results travel to the report (the answers stay on the host).
    for side in ("before", "after"):
        if record[side]:
            correctness = record[side]["correctness"] or {}
            record[side] = {"correctness": {key: correctness.get(key) for key in ("passed", "total")},
                            "summary": {str(c): entry for c, entry in record[side]["summary"].items()}}
    return record


def rollout_failed(unit, judged, reason):
    """The unit's record once a step after its relaunch failed (a drain, a measurement, a rollback):
    failed, with the reason beside any it had."""
    found = next((record for record in judged or [] if record.get("id") == unit["id"]), None)
    record = found or {"id": unit["id"], "kind": unit["kind"], "key": unit["key"], "drift": unit["drift"], "before": None,
                       "after": None, "reasons": []}
    return {**record, "verdict": "failed", "ok": False, "reasons": [*record.get("reasons", []), reason]}


def rollout_settled(record, results=None, host="", cluster=None):
    """The record once its unit was kept or rolled back: the rollback's outcome among its reasons,
    and failed when the last good settings did not come back. ``results`` are the vllm role's settle
    loop results on ``host``; ``cluster`` is the cluster's ({id, step, failed, msg})."""
    outcomes = {f"{host}/{result['__vllm_settled']['key']}": {"step": result["__vllm_settled"]["value"], "failed": bool(result.get("failed")),
                                                              "msg": result.get("msg")}
                for result in results or [] if isinstance(result.get("__vllm_settled"), dict)}
    if cluster:
        outcomes[cluster["id"]] = cluster
    found = outcomes.get(record["id"])
    if found is None or found.get("step") == "keep" and not found.get("failed"):
        return record
    if found.get("failed"):
        return {**record, "verdict": "failed", "ok": False, "reasons": [*record["reasons"], f"{found['step']}: {found.get('msg')}"]}
    return {**record, "reasons": [*record["reasons"], "rolled back: the last good settings serve again"]}


def rollout_outcome(records, plan, title):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._rollout import rollout_report

    return rollout_report(title, plan, list(records or []))


class FilterModule:
    def filters(self):
        return {"rollout_plan": rollout_plan, "rollout_verdict": rollout_verdict, "rollout_outcome": rollout_outcome,
                "rollout_failed": rollout_failed, "rollout_settled": rollout_settled}
