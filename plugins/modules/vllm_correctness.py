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
    description:
      - More cases, each a mapping with C(id), C(prompt) and C(check). C(check) holds exactly one of
        C(has_number) (a number the answer must contain), C(exact) (the whole answer, compared trimmed and
        case-folded), C(regex) (a Python regular expression searched in the answer) or C(json_fields)
        (field values the first JSON object in the answer must have).
    type: list
    elements: dict
    default: []
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

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import (
    ENDPOINT_ARGUMENT_SPEC,
    discover_model,
    http,
    json_object,
    label_problems,
    reply_problem,
    resolve,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_correctness import (
    BUILTIN_CASES,
    TOOL_CALL_MIN_TOKENS,
    TOOL_CALL_PROMPT,
    WEATHER_TOOL,
    diff,
    judge,
    reference_problems,
    stream_mismatches,
    stream_reason,
    streamed_text,
    tool_call_verdict,
    validate_cases,
)


def payload(endpoint, case, params, stream=False):
    return {
        "model": endpoint["model"],
        "messages": [{"role": "user", "content": case["prompt"]}],
        "temperature": 0,
        "max_tokens": params["max_tokens"],
        "chat_template_kwargs": params["chat_template_kwargs"],
        **({"stream": True} if stream else {}),
    }


def ask_streamed(endpoint, case, params):
    url = endpoint["url"] + "/v1/chat/completions"
    reply = http("POST", url, endpoint["api_key"], payload(endpoint, case, params, stream=True), timeout=params["timeout"])
    if reply.status != 200:
        raise ValueError(f"case {case['id']} streamed: {reply_problem(reply, url)}")
    try:
        return streamed_text(reply.body)
    except ValueError as error:
        raise ValueError(f"case {case['id']} streamed: {url}: {error}") from error


def ask_tool_call(endpoint, params):
    url = endpoint["url"] + "/v1/chat/completions"
    body = {**payload(endpoint, {"prompt": TOOL_CALL_PROMPT}, params), "tools": [WEATHER_TOOL], "tool_choice": "auto",
            "max_tokens": max(params["max_tokens"], TOOL_CALL_MIN_TOKENS)}
    return tool_call_verdict(json_object(http("POST", url, endpoint["api_key"], body, timeout=params["timeout"]), f"the tool-call case: {url}"))


def ask(endpoint, case, params):
    url = endpoint["url"] + "/v1/chat/completions"
    reply = json_object(http("POST", url, endpoint["api_key"], payload(endpoint, case, params), timeout=params["timeout"]), f"case {case['id']}: {url}")
    try:
        content = reply["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError) as error:
        raise ValueError(f"case {case['id']}: {url} answered a reply without choices[0].message.content") from error
    if not isinstance(content, str):
        raise ValueError(f"case {case['id']}: {url} answered a choices[0].message.content that is not text")
    return content


def reference_path(results_dir, reference):
    if os.sep in reference or reference.endswith(".json"):
        return reference
    return os.path.join(results_dir, f"results-{reference}.json")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ENDPOINT_ARGUMENT_SPEC,
            label=dict(type="str", required=True),
            builtin_cases=dict(type="bool", default=True),
            cases=dict(type="list", elements="dict", default=[]),
            reference=dict(type="str"),
            results_dir=dict(type="path", default="/var/lib/sparkfleet/correctness"),
            max_tokens=dict(type="int", default=96, no_log=False),
            chat_template_kwargs=dict(type="dict", default={"enable_thinking": False}),
            stream_cases=dict(type="int", default=4),
            tool_call=dict(type="str", choices=["auto", "always", "never"], default="auto"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    errors = validate_cases("cases", params["cases"])
    cases = (list(BUILTIN_CASES) if params["builtin_cases"] else []) + params["cases"]
    if not errors:
        errors += validate_cases("cases (with the built-in ones)", cases)
    if not cases:
        errors.append("cases: nothing to run; give cases or set builtin_cases: true")
    errors += label_problems("label", params["label"])
    if params["stream_cases"] < 0:
        errors.append(f"stream_cases is {params['stream_cases']}: give how many cases to also ask streamed (0 for none)")
    reference = None
    if params["reference"] and not errors:
        path = reference_path(params["results_dir"], params["reference"])
        if path != params["reference"]:
            errors += label_problems("reference", params["reference"])
        try:
            with open(path, encoding="utf-8") as handle:
                reference = json.load(handle)
        except (OSError, ValueError) as error:
            errors.append(f"reference: cannot read {path} ({error}); run the reference label first or give a results file")
        if reference is not None:
            errors += reference_problems(path, reference)
    if errors:
        module.fail_json(msg="vllm_correctness refused: " + "; ".join(errors), ok=False, reasons=errors)
    try:
        endpoint = resolve(params)
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)])
    if module.check_mode:
        module.exit_json(changed=False, ok=True, reasons=["check mode: no prompts sent, nothing saved"])

    try:
        discover_model(endpoint, params["timeout"])
        answers = {case["id"]: ask(endpoint, case, params) for case in cases}
        streamed = {case["id"]: ask_streamed(endpoint, case, params) for case in cases[:params["stream_cases"]]}
        wanted = params["tool_call"] == "always" or (params["tool_call"] == "auto" and endpoint["tool_parser"])
        tool_call = ask_tool_call(endpoint, params) if wanted else None
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)])
    results = judge(cases, answers)
    mismatches = stream_mismatches(results, streamed)
    document = {
        "label": params["label"],
        "model": endpoint["model"],
        "url": endpoint["url"],
        "max_tokens": params["max_tokens"],
        "results": results,
        "streamed": len(streamed),
        "stream_mismatches": mismatches,
        "tool_call": tool_call,
    }
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    results_file = os.path.join(params["results_dir"], f"results-{params['label']}.json")
    changed = True
    try:
        if os.path.exists(results_file):
            with open(results_file, encoding="utf-8", errors="replace") as handle:
                changed = handle.read() != text
        if changed:
            os.makedirs(params["results_dir"], mode=0o755, exist_ok=True)
            write_atomically(results_file, text, 0o644)
    except OSError as error:
        reason = (f"results_dir: cannot write {results_file} ({error.strerror or error}); give a results_dir the task's user "
                  "can write, or become: true")
        module.fail_json(msg=reason, ok=False, reasons=[reason], results=results)

    output = {
        "changed": changed,
        "ok": True,
        "passed": sum(1 for r in results if r["pass"]),
        "total": len(results),
        "results": results,
        "results_file": results_file,
        "streamed": len(streamed),
        "stream_mismatches": mismatches,
        "tool_call": tool_call,
        "reasons": [],
    }
    if reference is not None:
        comparison = diff(reference, results)
        output["changed_cases"] = comparison.pop("changed")
        output["ok"] = comparison.pop("ok")
        output["reasons"] = comparison.pop("reasons")
        output["comparison"] = comparison
    if mismatches:
        output["ok"] = False
        output["reasons"].append(stream_reason(mismatches, len(streamed)))
    if tool_call and not tool_call["pass"]:
        output["ok"] = False
        output["reasons"].append(f"the tool-call case failed ({endpoint['tool_parser'] or 'the endpoint'}'s parser): {tool_call['reason']}")
    if not output["ok"]:
        module.fail_json(msg="correctness failed: " + "; ".join(output["reasons"]), **output)
    module.exit_json(**output)


if __name__ == "__main__":
    main()
