#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench_report
short_description: Write a benchmark report, JSON, a Markdown table and a PNG plot
version_added: 0.2.0
description:
  - Turns the results of M(sparkfleet.vllm.vllm_bench) (and optionally M(sparkfleet.vllm.vllm_correctness))
    into three files in O(dest), C(report.json), C(report.md) (TTFT, TPOT, ITL, throughput and draft
    acceptance by concurrency, after the correctness line) and C(report.png) (output throughput and TPOT
    against concurrency).
  - Only the runs the benchmark recorded are tabled; when it recorded fewer (a run failed, or did not account for
    every prompt it sent), C(report.md) says so above the table with every reason, and C(report.json) keeps them
    under C(not_recorded).
  - "Meant to run on the controller (C(delegate_to: localhost)), where the report is read."
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  dest:
    description: Folder for the three files; created when missing.
    type: path
    required: true
  title:
    description: Heading of the Markdown report and the plot.
    type: str
    required: true
  bench:
    description: The registered result of M(sparkfleet.vllm.vllm_bench).
    type: dict
    required: true
  correctness:
    description: The registered result of M(sparkfleet.vllm.vllm_correctness), if one ran.
    type: dict
  metrics:
    description: The registered result of M(sparkfleet.vllm.vllm_metrics_info) taken before the run; its workload profile goes into the report.
    type: dict
  plot:
    description: Write C(report.png) (needs matplotlib).
    type: bool
    default: true
requirements:
  - matplotlib, when O(plot) is true
attributes:
  check_mode:
    support: full
    details: Reports which files would change and writes nothing.
  diff_mode:
    support: none
    details: The report files are not diffed.
  idempotent:
    support: partial
    details: A file whose content is the same is not rewritten; the plot is matplotlib's rendering, the same bytes only on the same matplotlib.
"""

EXAMPLES = r"""
- name: Write the report next to the playbook
  sparkfleet.vllm.vllm_bench_report:
    dest: "{{ playbook_dir }}/reports/{{ inventory_hostname }}-mtp4"
    title: "{{ inventory_hostname }} llm, MTP 4, natural text"
    bench: "{{ bench }}"
    correctness: "{{ correctness }}"
  delegate_to: localhost
"""

RETURN = r"""
ok:
  description: Whether it succeeded.
  returned: always
  type: bool
reasons:
  description: Why it failed; empty when it succeeded (the result shape every module of the collection shares).
  returned: always
  type: list
  elements: str
files:
  description: Paths of the report files.
  returned: always
  type: list
  elements: str
markdown:
  description: The Markdown report.
  returned: always
  type: str
"""

import io
import json
import math

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_changed
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plots import load_pyplot
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import markdown_table, not_recorded, report_problems


def correctness_line(correctness):
    if not correctness or "passed" not in correctness:
        return ""
    line = f"Correctness: {correctness['passed']}/{correctness['total']} cases pass"
    comparison = correctness.get("comparison")
    if comparison:
        changed = comparison.get("changed_ids") or []
        line += (
            f"; against {comparison.get('reference_label')} ({comparison.get('reference_passed')} pass): "
            f"{len(changed)} changed answer(s){': ' + ', '.join(changed) if changed else ''}"
        )
    elif correctness["passed"] == 0 and correctness.get("total"):
        line += (
            ". None passing says little alone: a model too small for these cases answers none (the lab's tiny model), and so"
            " does a broken one (a wrong chat template, a quantization that garbles its answers); a reference run of the"
            " unquantized model (bench_correctness_reference) tells the two apart"
        )
    return line + ".\n\n"


def workload_line(metrics):
    workload = (metrics or {}).get("workload")
    if not workload or not workload.get("requests"):
        return ""
    ratio = workload.get("prompt_to_generation_ratio")
    line = f"Workload before the run: {workload['requests']} requests"
    if ratio is not None:
        line += f", prompt:output {ratio:.1f}:1 ({'prefill-heavy' if workload.get('prefill_heavy') else 'decode-heavy'})"
    if workload.get("recommended_max_model_len"):
        line += (
            f", max_model_len {workload['recommended_max_model_len']} covers {workload['coverage'] * 100:g}% of requests "
            f"({workload['requests_over_prompt_bound']} longer)"
        )
    return line + ".\n\n"


def plot_png(pyplot, title, runs):
    """Output throughput and mean TPOT against the concurrency, each axis from zero, in one legend; each throughput
    point names the requests it stands on (two requests make no trend). A figure a run lacks is a gap, not a zero."""
    concurrency = [r["concurrency"] for r in runs]

    def figures(key):
        return [r[key] if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) else math.nan for r in runs]

    figure, throughput_axis = pyplot.subplots(figsize=(7, 4), dpi=100)
    throughput = figures("output_throughput")
    lines = throughput_axis.plot(concurrency, throughput, marker="o", color="tab:blue", label="output tokens/s")
    for index, run in enumerate(runs):
        if not math.isnan(throughput[index]):
            throughput_axis.annotate(f"{run.get('completed', '?')} req", (concurrency[index], throughput[index]),
                                     textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
    throughput_axis.set_xlabel("concurrent streams (each point: the requests it completed)")
    throughput_axis.set_ylabel("output tokens/s", color="tab:blue")
    throughput_axis.set_xticks(concurrency)
    throughput_axis.set_ylim(bottom=0)
    tpot_axis = throughput_axis.twinx()
    lines += tpot_axis.plot(concurrency, figures("mean_tpot_ms"), marker="s", color="tab:red", label="mean TPOT ms")
    tpot_axis.set_ylabel("mean TPOT ms", color="tab:red")
    tpot_axis.set_ylim(bottom=0)
    throughput_axis.legend(lines, [line.get_label() for line in lines], loc="lower right")
    throughput_axis.set_title(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    pyplot.close(figure)
    return buffer.getvalue()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            title=dict(type="str", required=True),
            bench=dict(type="dict", required=True),
            correctness=dict(type="dict"),
            metrics=dict(type="dict"),
            plot=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    problems = report_problems(params["bench"], params["correctness"], params["metrics"])
    if problems:
        module.fail_json(msg="vllm_bench_report refused: " + "; ".join(problems), ok=False, reasons=problems)
    pyplot = load_pyplot() if params["plot"] else None
    if params["plot"] and pyplot is None:
        module.fail_json(msg=missing_required_lib("matplotlib"), ok=False, reasons=[missing_required_lib("matplotlib")])
    runs = [r for r in params["bench"].get("runs", []) if not r.get("reasons")]
    if not runs:
        reason = "bench: no recorded run to report; pass the registered result of a vllm_bench that succeeded"
        module.fail_json(msg=reason, ok=False, reasons=[reason])
    report = {
        "title": params["title"],
        "runner": params["bench"].get("runner"),
        "dataset": params["bench"].get("dataset"),
        "runs": runs,
        "not_recorded": params["bench"].get("reasons") or [],
        "correctness": params["correctness"],
        "workload": (params["metrics"] or {}).get("workload"),
    }
    markdown = (
        f"# {params['title']}\n\n" + workload_line(params["metrics"]) + correctness_line(params["correctness"])
        + not_recorded(params["bench"]) + markdown_table(runs)
    )
    contents = {
        "report.json": (json.dumps(report, indent=1, sort_keys=True) + "\n").encode(),
        "report.md": markdown.encode(),
    }
    if params["plot"]:
        contents["report.png"] = plot_png(pyplot, params["title"], runs)
    try:
        changed, files = write_changed(params["dest"], contents, module.check_mode)
    except OSError as error:
        reason = f"dest: cannot write {error.filename or params['dest']} ({error.strerror or error}); give a folder the task's user can write"
        module.fail_json(msg=reason, ok=False, reasons=[reason])
    module.exit_json(changed=changed, ok=True, reasons=[], files=files, markdown=markdown)


if __name__ == "__main__":
    main()
