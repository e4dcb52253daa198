#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_correctness
short_description: Run the correctness set against a vLLM endpoint and diff it with a reference
version_added: 0.2.0
description:
  - Sends each case at temperature 0 with thinking off (O(chat_template_kwargs)) and judges the answer with
    the case's declarative check, C(has_number), C(exact), C(regex) or C(json_fields). User cases are data;
    nothing in them is evaluated as code.
  - Twenty built-in cases cover arithmetic, word problems, unit conversion, facts, string manipulation,
    reading code and JSON extraction (seed 000's harness).
  - The first O(stream_cases) cases are also asked streamed, and each streamed answer must be the non-streamed one,
    character for character (seed 003, some MoE models scramble streamed tokens while non-streamed answers are right).
  - For an instance that lets the model choose tools (C(--enable-auto-tool-choice) with a C(--tool-call-parser)), one
    end-to-end tool call too (O(tool_call)); the request carries a C(get_weather) tool and a prompt that needs it, and the
    reply must call it with arguments that parse (seed 003, tool calling through a model's parser has been unreliable).
  - Saves the labelled results on the host and, given O(reference), lists every case whose pass/fail or
    normalised answer changed. It fails when fewer cases pass than in the reference, and reports changed
    answers even at the same score (seed 000, "the diff matters more than the score").
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
  - sparkfleet.vllm.vllm_endpoint
options:
  label:
    description: Name of this run; results are saved as C(results-<label>.json) in O(results_dir).
    type: str
    required: true
  builtin_cases:
    description: Run the twenty built-in cases.
    type: bool
    default: true
  cases:
    description: More cases.
    type: list
    elements: dict
    default: []
    suboptions:
      id:
        description: The case's name in results and diffs - letters, digits, dots, dashes or underscores, unique among the cases.
        type: str
        required: true
      prompt:
        description: The question.
        type: str
        required: true
      check:
        description:
          - Exactly one of C(has_number) (a number the answer must contain), C(exact) (the whole answer, compared trimmed
            and case-folded), C(regex) (a Python regular expression searched in the answer) or C(json_fields) (field
            values the first JSON object in the answer must have).
          - Each kind takes a value of its own type, so the check is validated by the module, naming the case.
        type: dict
        required: true
  reference:
    description:
      - Results to diff against, either a label saved earlier in O(results_dir) or a path to a results file on
        the host. Omit to save results only.
    type: str
  results_dir:
    description: Host directory where results are saved.
    type: path
    default: /var/lib/sparkfleet/correctness
  max_tokens:
    description: Longest answer requested per case.
    type: int
    default: 96
  chat_template_kwargs:
    description: Sent with every request; the default turns thinking off, which would otherwise eat C(max_tokens).
    type: dict
    default:
      enable_thinking: false
  stream_cases:
    description:
      - How many cases (the first ones) are also asked with C(stream=true); a streamed answer that is not the
        non-streamed one fails the run, naming the cases. C(0) compares none.
      - Run it on an idle instance. Greedy answers are the same between two requests only when the batches they run
        in do not change the arithmetic, which concurrent load can.
    type: int
    default: 4
    version_added: 0.10.0
  tool_call:
    description:
      - C(auto) sends the tool-call case when the instance's plan shows a tool-call parser (with O(instance)); C(always)
        sends it (for O(url) alone); C(never) does not. A reply that calls no tool, another tool, or with arguments that
        do not parse fails the run.
    type: str
    choices: [auto, always, never]
    default: auto
    version_added: 0.10.0
  load_concurrency:
    description:
      - Also asks the cases again with this many requests in flight (twice as many requests as that, round-robin), the
        load the benchmark's highest concurrency puts on the engine. A case answered right alone that is wrong under
        load, answers with degenerate output (a repetition loop, token soup) or gets no answer fails the run, naming the
        cases (speculative decoding with async scheduling corrupts answers only above concurrency 1, vllm 46669). A
        greedy answer whose wording changes but stays right does not count (batch-size numerics). C(0) or C(1) asks
        nothing more; at most 1024, as a benchmark.
    type: int
    default: 0
    version_added: 0.11.0
attributes:
  check_mode:
    support: partial
    details: Validates the cases and resolves the endpoint, then returns without sending a prompt or saving results.
  diff_mode:
    support: none
    details: The diff against the reference is returned as RV(changed_cases), not as a file diff.
  idempotent:
    support: partial
    details: The results file is rewritten only when an answer changed; greedy answers are the same between runs on an idle instance, not under concurrent load.
"""

EXAMPLES = r"""
- name: Record the reference on the unquantized model
  sparkfleet.vllm.vllm_correctness:
    instance: llm
    label: bf16

- name: Compare the NVFP4 variant with it, adding the team's own cases
  sparkfleet.vllm.vllm_correctness:
    instance: llm
    label: nvfp4
    reference: bf16
    cases: "{{ lookup('ansible.builtin.file', 'cases/rag.yml') | from_yaml }}"
"""

RETURN = r"""
ok:
  description: >-
    Whether the run holds up, no fewer passes than the reference (true without one), every streamed answer the whole
    one and the tool-call case passed where sent.
  returned: always
  type: bool
passed:
  description: Cases that passed.
  returned: when prompts were sent
  type: int
total:
  description: Cases run.
  returned: when prompts were sent
  type: int
results:
  description: Per case, C(id), C(pass) and the raw C(answer).
  returned: when prompts were sent
  type: list
  elements: dict
results_file:
  description: Where the results were saved.
  returned: when prompts were sent
  type: str
streamed:
  description: Cases also asked streamed (O(stream_cases), or fewer when fewer cases ran).
  returned: when prompts were sent
  type: int
  version_added: 0.10.0
stream_mismatches:
  description: Per case whose streamed answer is not the non-streamed one, C(id), C(answer) and C(streamed_answer).
  returned: when prompts were sent
  type: list
  elements: dict
  version_added: 0.10.0
load:
  description:
    - The check under load, C(concurrency), C(requests) and C(corrupted) (per case, C(id), C(reason), C(answer) under load,
      C(alone), and how many of its requests went C(wrong) of those C(asked)); null when O(load_concurrency) is below 2.
  returned: when prompts were sent
  type: dict
  version_added: 0.11.0
tool_call:
  description: The tool-call case's C(pass), C(reason) and C(call) (the called C(name) and raw C(arguments)); null when not sent.
  returned: when prompts were sent
  type: dict
  version_added: 0.10.0
changed_cases:
  description: Per changed case, C(id), C(reference_pass), C(pass), C(reference_answer) and C(answer).
  returned: when O(reference) is given
  type: list
  elements: dict
comparison:
  description: reference_label, reference_passed, passed, changed_ids, not_in_reference, missing_from_run.
  returned: when O(reference) is given
  type: dict
reasons:
  description: Why RV(ok) is false, or why nothing was sent.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import ENDPOINT_ARGUMENT_SPEC, resolve
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_correctness import ResultsNotSaved, correctness, request

# A case's check holds exactly one of has_number, exact, regex or json_fields, each of its own type: validate_cases
# checks it, naming the case, as Ansible's suboptions would add the three others as nulls.
CASE_OPTIONS = {"id": {"type": "str", "required": True}, "prompt": {"type": "str", "required": True}, "check": {"type": "dict", "required": True}}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ENDPOINT_ARGUMENT_SPEC,
            label=dict(type="str", required=True),
            builtin_cases=dict(type="bool", default=True),
            cases=dict(type="list", elements="dict", default=[], options=CASE_OPTIONS),
            reference=dict(type="str"),
            results_dir=dict(type="path", default="/var/lib/sparkfleet/correctness"),
            max_tokens=dict(type="int", default=96, no_log=False),
            chat_template_kwargs=dict(type="dict", default={"enable_thinking": False}),
            stream_cases=dict(type="int", default=4),
            tool_call=dict(type="str", choices=["auto", "always", "never"], default="auto"),
            load_concurrency=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    cases, reference, errors = request(module.params)
    if errors:
        module.fail_json(msg="vllm_correctness refused: " + "; ".join(errors), ok=False, reasons=errors)
    try:
        endpoint = resolve(module.params)
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)])
    if module.check_mode:
        module.exit_json(changed=False, ok=True, reasons=["check mode: no prompts sent, nothing saved"])
    try:
        output = correctness(endpoint, cases, reference, module.params)
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)])
    except ResultsNotSaved as problem:
        module.fail_json(msg=str(problem), ok=False, reasons=[str(problem)], results=problem.results)
    if not output["ok"]:
        module.fail_json(msg="correctness failed: " + "; ".join(output["reasons"]), **output)
    module.exit_json(**output)


if __name__ == "__main__":
    main()
