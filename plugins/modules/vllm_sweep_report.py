#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_sweep_report
short_description: Decide a speculative-decoding sweep and write its decision file, report and plots
version_added: 0.3.0
description:
  - Takes the per-variant records of C(playbooks/mtp_sweep.yml) (status, correctness gate, figures per
    concurrency over the repeats, acceptance per position and per category) and applies the objective,
    highest output throughput at the target concurrency, then lowest TPOT at one stream, among the variants that
    started, passed the correctness gate and the optional TTFT budget; a more complex variant (more draft tokens)
    only wins by more than the measured spread.
  - Writes C(decision.json) (C(ok), C(winner), C(winner_settings), C(reasons), C(schedule), the figures of every
    variant), C(report.md) (a table per variant) and C(sweep.png) (throughput, TPOT and acceptance against the draft
    count) into O(dest), on the controller.
  - Recommends vLLM's per-batch-size draft counts (C(num_speculative_tokens_per_batch_size), present in vLLM 0.32.0)
    when at least two speculative variants passed; for an older or unknown release it says so instead.
author: sparkfleet.vllm contributors (@sparkfleet)
options:
  dest:
    description: Controller folder for the files.
    type: path
    required: true
  title:
    description: Heading of the report.
    type: str
    required: true
  results:
    description: The variant records.
    type: list
    elements: dict
    required: true
  objective:
    description:
      - C(target_concurrency), C(single_stream) (default 1), C(ttft_budget_ms) (null for none) and C(noise_floor_pct)
        (least margin a more complex variant must win by, on top of the measured spread).
      - Checked as the sweep's settings are; the concurrencies among O(concurrencies), C(ttft_budget_ms) above 0 and
        at most 600000, C(noise_floor_pct) a number from 0 to 50 (C(5%) is refused, not read as 0).
    type: dict
    required: true
  concurrencies:
    description: The concurrencies measured, for the schedule.
    type: list
    elements: int
    required: true
  max_num_seqs:
    description: The instance's max_num_seqs, the last batch size of the schedule (1 to 4096).
    type: int
    default: 256
  vllm_version:
    description:
      - The vLLM release served, to say whether the schedule is supported.
      - A PEP 440 pre-release, development or local version (C(0.32.0rc1), C(0.33.0.dev5), C(0.32.0+cpu)) counts as
        its release numbers.
    type: str
    default: ""
  plot:
    description: Write C(sweep.png) (needs matplotlib).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Reports what would change and writes nothing.
  diff_mode:
    support: none
    description: The files are reports; no diff is shown.
requirements:
  - matplotlib, when O(plot) is true
"""

EXAMPLES = r"""
- name: Decide the sweep
  sparkfleet.vllm.vllm_sweep_report:
    dest: ./sweep-reports/spark-1/chat
    title: spark-1 chat draft-length sweep
    results: "{{ variant_records }}"
    objective: {target_concurrency: 8, ttft_budget_ms: null, noise_floor_pct: 0}
    concurrencies: [1, 8]
  delegate_to: localhost
"""

RETURN = r"""
ok:
  description: Whether a variant won.
  returned: always
  type: bool
winner:
  description: Name of the winning variant, null when none passed.
  returned: always
  type: str
winner_settings:
  description: The winner's setting overrides.
  returned: always
  type: dict
reasons:
  description: How the decision was reached, variant by variant.
  returned: always
  type: list
  elements: str
schedule:
  description: Recommended num_speculative_tokens_per_batch_size ranges (start, end, draft tokens), or null.
  returned: always
  type: list
  elements: list
schedule_note:
  description: Why there is, or is not, a schedule.
  returned: always
  type: str
files:
  description: The files written.
  returned: always
  type: list
  elements: str
markdown:
  description: The report.
  returned: always
  type: str
"""

import io
import json

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_changed
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import VERSION, version_tuple
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_sweep import (
    decide,
    figure,
    objective_problems,
    report_markdown,
    schedule,
)

try:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
except ImportError:
    pyplot = None

# The first release whose SpeculativeConfig has num_speculative_tokens_per_batch_size, as checked in the lab's image.
SCHEDULE_SINCE = "0.32.0"


def plot_png(title, results, target, single):
    measured = sorted((r for r in results if r["status"] == "ok"), key=lambda r: r["draft_count"])
    counts = [r["draft_count"] for r in measured]
    figure_, axes = pyplot.subplots(1, 3, figsize=(12, 3.6), dpi=100)
    series = (
        (f"output tok/s at c={target}", [(figure(r["summary"], target, "output_throughput") or {}).get("mean") for r in measured]),
        (f"mean TPOT ms at c={single}", [(figure(r["summary"], single, "mean_tpot_ms") or {}).get("mean") for r in measured]),
        (f"acceptance % at c={target}", [((figure(r["summary"], target, "acceptance") or {}).get("mean") or 0) * 100 for r in measured]),
    )
    for axis, (label, values) in zip(axes, series, strict=True):
        axis.plot(counts, [v or 0 for v in values], marker="o")
        axis.set_xlabel("draft tokens")
        axis.set_title(label, fontsize=9)
        axis.set_xticks(sorted(set(counts)))
    figure_.suptitle(title, fontsize=10)
    figure_.tight_layout()
    buffer = io.BytesIO()
    figure_.savefig(buffer, format="png", metadata={"Software": None})
    pyplot.close(figure_)
    return buffer.getvalue()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            title=dict(type="str", required=True),
            results=dict(type="list", elements="dict", required=True),
            objective=dict(type="dict", required=True),
            concurrencies=dict(type="list", elements="int", required=True),
            max_num_seqs=dict(type="int", default=256),
            vllm_version=dict(type="str", default=""),
            plot=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["plot"] and pyplot is None:
        module.fail_json(msg=missing_required_lib("matplotlib"), ok=False, reasons=[missing_required_lib("matplotlib")])
    objective, problems = objective_problems(params["objective"], params["concurrencies"], params["max_num_seqs"])
    version = params["vllm_version"]
    if version and not VERSION.fullmatch(version):
        problems.append(f"vllm_version: {version!r} is not a vLLM release; give the image's release such as 0.32.0 "
                        "(0.32.0rc1, 0.33.0.dev5 and 0.32.0+cpu are read as their release), or leave it empty")
    if problems:
        module.fail_json(msg="; ".join(problems), ok=False, reasons=problems)
    results = params["results"]
    decision = decide(results, objective)
    recommended, note = None, ""
    if version and version_tuple(version) >= version_tuple(SCHEDULE_SINCE):
        recommended = schedule(results, params["concurrencies"], params["max_num_seqs"], objective["noise_floor_pct"])
        note = ("Per-batch-size schedule (speculative options num_speculative_tokens_per_batch_size, ranges inclusive): "
                f"{json.dumps(recommended)}." if recommended else
                "No per-batch-size schedule: fewer than two speculative variants passed.")
    else:
        note = (f"No per-batch-size schedule: vLLM {version or '(release unknown; set vllm_version)'} is not known to have "
                f"num_speculative_tokens_per_batch_size (vLLM {SCHEDULE_SINCE} has it).")
    winner = next((r for r in results if r["name"] == decision["winner"]), None)
    decision.update(schedule=recommended, schedule_note=note, winner_settings=(winner or {}).get("settings") or {})
    markdown = report_markdown(params["title"], results, decision, objective)
    document = {**decision, "objective": objective, "variants": sorted(results, key=lambda r: r["rank"])}
    contents = {"decision.json": (json.dumps(document, indent=1, sort_keys=True) + "\n").encode(), "report.md": markdown.encode()}
    if params["plot"] and any(r["status"] == "ok" for r in results):
        contents["sweep.png"] = plot_png(params["title"], results, objective["target_concurrency"], objective["single_stream"])
    changed, files = write_changed(params["dest"], contents, module.check_mode)
    module.exit_json(changed=changed, files=files, markdown=markdown, **decision)


if __name__ == "__main__":
    main()
