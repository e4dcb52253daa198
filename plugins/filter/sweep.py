# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The speculative-decoding sweep for playbooks/mtp_sweep.yml; the logic is in module_utils."""

from __future__ import annotations

import pathlib

# Each filter imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md).


def vllm_sweep_variants(instance, draft_counts=None, variants=None):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_sweep import plan_variants

    return plan_variants(instance or {}, draft_counts, variants or None)


def controller_has(kind, path):
    """Filters run on the controller, where the sweep's documents, prompts and task files are."""
    found = pathlib.Path(path)
    return found.is_dir() if kind == "directory" else found.is_file()


def vllm_sweep_plan(instances, settings, defaults=None, catalog_extra=None):
    """The swept instance as the vllm plan merges it (vllm_instance_defaults, its catalog entry), so a
    drafter set in the defaults or brought by the catalog is the one the sweep varies."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import CATALOG, catalog_problems
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import merged_instances
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_sweep import plan_sweep

    # The plan's own problems (a bad catalog extra, a list it cannot merge) are refused by its plan task;
    # until then the instances are judged as given.
    extra = catalog_extra if isinstance(catalog_extra, dict) and not catalog_problems(catalog_extra) else {}
    merged, _problems = merged_instances(instances, defaults if isinstance(defaults, dict) else {}, "", {**CATALOG, **extra})
    present = [{key: value for key, value in instance.items() if not key.startswith("_")} for instance in merged] if merged else instances
    return plan_sweep(present, settings or {}, controller_has)


def vllm_sweep_record(variant, status, reason=None, correctness=None, baseline=None, bench=None, acceptance=None,
                      max_changed_answers=0):
    """One variant's record: its gate (no fewer passes than the baseline, at most max_changed_answers changed
    greedy answers) and its figures over the repeats, with the repeats that recorded nothing and the runs far
    outside their siblings."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_sweep import correctness_gate, summarise_variant

    record = {key: variant[key] for key in ("name", "id", "rank", "draft_count", "settings")}
    record.update(status=status, reason=reason or None)
    if status != "ok":
        return {**record, "gate": {"ok": False, "reason": reason}, "summary": {}, "categories": {}, "correctness": None}
    correctness = correctness or {}
    if variant["rank"] and not baseline:
        gate = {"ok": False, "passed": correctness.get("passed"), "baseline_passed": None, "changed": [],
                "reason": "the baseline was not measured (it did not start), so there is nothing to compare with"}
    else:
        gate = correctness_gate(None if not variant["rank"] else baseline, correctness)
    if gate["ok"] and len(gate["changed"]) > max_changed_answers:
        gate.update(ok=False, reason=gate["reason"] + f"; more than {max_changed_answers} changed (greedy answers should not "
                    "change with the draft length)")
    # Each repeat's registered result, a failed one too: it is a repeat that recorded nothing, named in the summary.
    summary = summarise_variant(list(bench or []))
    return {**record, "gate": gate, "summary": {str(c): entry for c, entry in summary.items()},
            "categories": (acceptance or {}).get("categories") or {},
            "correctness": {key: correctness.get(key) for key in ("passed", "total")}}


class FilterModule:
    def filters(self):
        return {"vllm_sweep_plan": vllm_sweep_plan, "vllm_sweep_variants": vllm_sweep_variants, "vllm_sweep_record": vllm_sweep_record}
