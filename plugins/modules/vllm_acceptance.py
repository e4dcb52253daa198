#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_acceptance
short_description: Draft acceptance of a vLLM endpoint per category of prompt
version_added: 0.3.0
description:
  - Sends each category's prompts one at a time (greedy, so every run of the same settings drafts the same text) and
    reads vLLM's speculative-decoding counters from C(/metrics) before and after each category, so the acceptance
    overall, per draft position and the mean acceptance length are those of that category's text alone.
  - A draft length tuned on one kind of text can lose on another (seed 001 saw technical prompts draft 50 % faster
    than prose), which is why the sweep reports acceptance per category.
  - Refuses to start while requests that are not its own run or wait (seed 002).
  - A server without speculative decoding answers with C(speculative) false and no acceptance.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
  - sparkfleet.vllm.vllm_endpoint
options:
  categories:
    description: Category name to its prompts (for example code, prose, chat, structured).
    type: dict
    required: true
  max_tokens:
    description: Tokens each reply may take; 64 or more so the counters move.
    type: int
    default: 128
  require_idle:
    description: Refuse while the server has requests running or waiting that are not these.
    type: bool
    default: true
requirements:
  - prometheus_client (Debian and Ubuntu package python3-prometheus-client; the vllm role installs it)
attributes:
  check_mode:
    support: partial
    details: The arguments are checked and the instance resolved; no prompt is sent.
  diff_mode:
    support: none
    details: Changes nothing on the host.
  idempotent:
    support: full
    details: Sends prompts and reads metrics; it never changes the host.
"""

EXAMPLES = r"""
- name: Acceptance per category of text
  sparkfleet.vllm.vllm_acceptance:
    instance: chat
    categories:
      code: ["Write a Python function that parses an ISO 8601 date and explain each line."]
      prose: ["Summarise the plot of a novel you know in three paragraphs."]
  register: acceptance
"""

RETURN = r"""
ok:
  description: Whether every category was measured.
  returned: always
  type: bool
speculative:
  description: Whether the server drafts (its speculative-decoding counters exist).
  returned: success
  type: bool
categories:
  description:
    - Per category, requests, output_tokens, acceptance (accepted / draft tokens), mean_acceptance_length,
      acceptance_per_position (position, accepted, rate), drafts, draft_tokens and accepted_tokens.
  returned: success
  type: dict
reasons:
  description: Why a category was not measured.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import (
    ENDPOINT_ARGUMENT_SPEC,
    discover_model,
    http,
    json_object,
    resolve,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import (
    PROMETHEUS_CLIENT_PURPOSE,
    acceptance,
    busy_problem,
    counter_regression,
    counters_delta,
    read_metrics,
    speculative_counters,
    text_string_to_metric_families,
)


def ask(endpoint, prompt, max_tokens, timeout):
    payload = {"model": endpoint["model"], "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
               "temperature": 0}
    url = endpoint["url"] + "/v1/chat/completions"
    usage = json_object(http("POST", url, endpoint["api_key"], payload, timeout=timeout), url).get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise ValueError(f"{url} answered without a usage.completion_tokens count; is url a vLLM server?")
    return tokens


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ENDPOINT_ARGUMENT_SPEC,
            categories=dict(type="dict", required=True),
            max_tokens=dict(type="int", default=128, no_log=False),
            require_idle=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    if text_string_to_metric_families is None:
        missing = missing_required_lib("prometheus_client", reason=PROMETHEUS_CLIENT_PURPOSE)
        module.fail_json(msg=missing, ok=False, reasons=[missing])
    params = module.params
    categories = params["categories"]
    errors = [f"categories.{name}: give a non-empty list of prompts" for name, prompts in categories.items()
              if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts)]
    if not categories:
        errors.append("categories: give at least one category of prompts")
    if params["max_tokens"] < 1:
        errors.append("max_tokens: at least 1 (64 or more so the counters move)")
    if errors:
        module.fail_json(msg="vllm_acceptance refused: " + "; ".join(errors), ok=False, reasons=errors)
    try:
        endpoint = resolve(params)
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)])
    if module.check_mode:
        module.exit_json(changed=False, ok=True, reasons=["check mode: no prompts sent"])
    timeout = params["timeout"]
    try:
        discover_model(endpoint, timeout)
        samples = read_metrics(endpoint["url"], endpoint["api_key"], timeout)
        busy = busy_problem(samples) if params["require_idle"] else None
        if busy:
            raise ValueError(busy + ", or set require_idle: false")
        found = {}
        speculative = speculative_counters(samples) is not None
        for name, prompts in categories.items():
            before = speculative_counters(read_metrics(endpoint["url"], endpoint["api_key"], timeout))
            tokens = sum(ask(endpoint, prompt, params["max_tokens"], timeout) for prompt in prompts)
            after = speculative_counters(read_metrics(endpoint["url"], endpoint["api_key"], timeout))
            regression = counter_regression(before, after)
            if regression:
                raise ValueError(f"category {name}: {regression}")
            measured = acceptance(counters_delta(before, after)) or {}
            found[name] = {"requests": len(prompts), "output_tokens": tokens, **{k: measured.get(k) for k in (
                "acceptance", "mean_acceptance_length", "acceptance_per_position", "drafts", "draft_tokens", "accepted_tokens")}}
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)])
    module.exit_json(changed=False, ok=True, speculative=speculative, categories=found, reasons=[])


if __name__ == "__main__":
    main()
