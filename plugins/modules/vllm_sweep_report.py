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
  - No verdict on missing data; a variant is out when a repeat recorded no run at the target concurrency or the single
    stream, or when a run's throughput there or TPOT at one stream is under half or over twice the median of its
    siblings (two runs more than twice apart), the repeat, its figure and the median of the others named. A figure of
    one run has no spread; the margin is then the floor alone, and the reasons say so.
  - Writes C(decision.json) (C(ok), C(winner), C(winner_settings), C(reasons), C(schedule), the figures of every
    variant), C(report.md) (a table per variant) and C(sweep.png) (throughput, TPOT and acceptance against the draft
    count) into O(dest), on the controller.
  - Recommends vLLM's per-batch-size draft counts (C(num_speculative_tokens_per_batch_size), present in vLLM 0.32.0)
    when at least two speculative variants passed; for an older or unknown release it says so instead.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
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
    description:
      - The variant records (the C(vllm_sweep_record) filter's); one lacking what the decision reads is refused, naming it.
    type: list
    elements: dict
    required: true
  objective:
    description:
      - What decides the winner. Its values are checked as the sweep's settings are, each named with its fix (C(5%) is
        refused, not read as 0), so they take any type here.
    type: dict
    required: true
    suboptions:
      target_concurrency:
        description: The concurrency whose output throughput decides, among O(concurrencies).
        type: raw
        required: true
      single_stream:
        description: The concurrency of the TPOT tie-break and of the TTFT budget, among O(concurrencies).
        type: raw
        default: 1
      ttft_budget_ms:
        description: The highest median TTFT at C(single_stream), above 0 and at most 600000; null for none.
        type: raw
      noise_floor_pct:
        description: The least margin a more complex variant must win by on top of the measured spread, a number from 0 to 50.
        type: raw
        default: 0
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
    details: Reports what would change and writes nothing.
  diff_mode:
    support: none
    details: The files are reports; no diff is shown.
  idempotent:
    support: partial
    details: A file whose content is the same is not rewritten; the plot is matplotlib's rendering, the same bytes only on the same matplotlib.
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
  description:
    - How the decision was reached, variant by variant, naming a variant out for a repeat that recorded nothing or a run
      far outside its siblings, and saying where a margin was the floor alone because a figure had one run.
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

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_changed
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_sweep import sweep_report

try:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
except ImportError:
    pyplot = None


def plot_png(title, plot):
    figure_, axes = pyplot.subplots(1, len(plot["series"]), figsize=(12, 3.6), dpi=100)
    for axis, (label, values) in zip(axes, plot["series"], strict=True):
        axis.plot(plot["draft_counts"], values, marker="o")
        axis.set_xlabel("draft tokens")
        axis.set_title(label, fontsize=9)
        axis.set_xticks(sorted(set(plot["draft_counts"])))
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
            objective=dict(type="dict", required=True, options=dict(
                target_concurrency=dict(type="raw", required=True), single_stream=dict(type="raw", default=1), ttft_budget_ms=dict(type="raw"),
                noise_floor_pct=dict(type="raw", default=0))),
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
    report = sweep_report(params["title"], params["results"], params["objective"], params["concurrencies"], params["max_num_seqs"],
                          params["vllm_version"])
    if report["errors"]:
        module.fail_json(msg="; ".join(report["errors"]), ok=False, reasons=report["errors"])
    contents = dict(report["files"])
    if params["plot"] and report["plot"]:
        contents["sweep.png"] = plot_png(params["title"], report["plot"])
    try:
        changed, files = write_changed(params["dest"], contents, module.check_mode)
    except OSError as error:
        reason = f"dest: cannot write {error.filename or params['dest']} ({error.strerror or error}); give a folder the task's user can write"
        module.fail_json(msg=reason, ok=False, reasons=[reason])
    module.exit_json(changed=changed, files=files, markdown=report["markdown"], **report["decision"])


if __name__ == "__main__":
    main()
