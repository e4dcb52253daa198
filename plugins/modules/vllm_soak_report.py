#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_soak_report
short_description: Write a soak report, JSON, Markdown with the verdict and every reason, and a PNG plot of the samples
version_added: 0.9.0
description:
  - Turns the result of M(sparkfleet.vllm.vllm_soak) into three files in O(dest), C(report.json) (the whole result, with
    verdict, reasons, figures, counts, restarts, rounds and samples), C(report.md) (SOAK PASS or FAIL with every
    reason, then each measure beside its gate) and C(report.png) (KV cache usage, requests waiting and running,
    MemAvailable and probe latency over the soak's minutes, the gates drawn in).
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
  soak:
    description:
      - The registered result of M(sparkfleet.vllm.vllm_soak), run with
        O(sparkfleet.vllm.vllm_soak#module:fail_on_verdict=false) so a FAIL is reported too.
    type: dict
    required: true
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
seealso:
  - module: sparkfleet.vllm.vllm_soak
"""

EXAMPLES = r"""
- name: Write the soak's report next to the playbook
  sparkfleet.vllm.vllm_soak_report:
    dest: "{{ playbook_dir }}/soak-reports/{{ inventory_hostname }}/nvfp4-mtp4-c8"
    title: "{{ inventory_hostname }} llm: soak nvfp4-mtp4-c8"
    soak: "{{ soak }}"
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
  returned: success
  type: list
  elements: str
markdown:
  description: The Markdown report.
  returned: success
  type: str
passed:
  description: The soak's verdict, as the report states it.
  returned: success
  type: bool
"""

import io
import json

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_changed
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plots import load_pyplot
from ansible_collections.sparkfleet.vllm.plugins.module_utils._soak import markdown_report, report_data, report_problems


def series(samples, key):
    """(minutes, values) of the samples that hold a number under ``key``."""
    found = [(s["t"] / 60, s[key]) for s in samples if isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool)]
    return [m for m, _v in found], [v for _m, v in found]


def plot_png(pyplot, title, soak):
    samples, limits = soak["samples"], soak["thresholds"]
    figure, (kv_axis, queue_axis, memory_axis, probe_axis) = pyplot.subplots(4, 1, sharex=True, figsize=(8, 9), dpi=100)
    minutes, kv = series(samples, "kv_cache_usage")
    kv_axis.plot(minutes, [v * 100 for v in kv], marker=".", color="tab:blue")
    if isinstance(limits.get("max_kv_cache_usage"), (int, float)):
        kv_axis.axhline(limits["max_kv_cache_usage"] * 100, color="tab:red", linestyle="--", label="gate")
        kv_axis.legend(loc="upper right")
    kv_axis.set_ylabel("KV cache %")
    for key, color in (("waiting", "tab:orange"), ("running", "tab:green")):
        queue_axis.plot(*series(samples, key), marker=".", color=color, label=key)
    queue_axis.set_ylabel("requests")
    queue_axis.legend(loc="upper right")
    minutes, memory = series(samples, "mem_available_mib")
    memory_axis.plot(minutes, [v / 1024 for v in memory], marker=".", color="tab:purple")
    memory_axis.set_ylabel("MemAvailable GiB")
    probe_axis.plot(*series(samples, "probe_s"), marker=".", color="tab:gray", label="probe latency")
    # An unanswered probe has no latency; a red x on the axis marks when it went out.
    unanswered = [s["t"] / 60 for s in samples if s.get("probe_error")]
    if unanswered:
        probe_axis.plot(unanswered, [0] * len(unanswered), "x", color="tab:red", label="unanswered")
    probe_axis.set_ylabel("probe s")
    probe_axis.set_xlabel("minutes into the soak")
    probe_axis.legend(loc="upper right")
    kv_axis.set_title(f"{title}: SOAK {'PASS' if soak['passed'] else 'FAIL'}")
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
            soak=dict(type="dict", required=True),
            plot=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    problems = report_problems(params["soak"])
    if problems:
        module.fail_json(msg="vllm_soak_report refused: " + "; ".join(problems), ok=False, reasons=problems)
    pyplot = load_pyplot() if params["plot"] else None
    markdown = markdown_report(params["title"], params["soak"])
    contents = {
        "report.json": (json.dumps(report_data(params["title"], params["soak"]), indent=1, sort_keys=True) + "\n").encode(),
        "report.md": markdown.encode(),
    }
    if pyplot is not None:
        contents["report.png"] = plot_png(pyplot, params["title"], params["soak"])
    try:
        changed, files = write_changed(params["dest"], contents, module.check_mode)
    except OSError as error:
        reason = f"dest: cannot write {error.filename or params['dest']} ({error.strerror or error}); give a folder the task's user can write"
        module.fail_json(msg=reason, ok=False, reasons=[reason])
    if params["plot"] and pyplot is None:
        # After the JSON and the Markdown: an hour's soak keeps its verdict when only the plot cannot be drawn.
        reason = missing_required_lib("matplotlib") + "; report.json and report.md were written"
        module.fail_json(msg=reason, ok=False, reasons=[reason], files=files, changed=changed)
    module.exit_json(changed=changed, ok=True, reasons=[], files=files, markdown=markdown, passed=params["soak"]["passed"])


if __name__ == "__main__":
    main()
