#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_metrics_info
short_description: Read a vLLM server's /metrics and profile its workload
version_added: 0.2.0
description:
  - Fetches C(/metrics) and parses it with prometheus_client's text parser.
  - Returns what an operator reads first (seed 000, "pull vLLM's lifetime metrics first"), requests running
    and waiting, KV-cache usage, prompt and generation token totals and their ratio, prompt-length
    distribution, mean TTFT, ITL and end-to-end latency, prefix-cache hit rate, preemptions, and the
    speculative-decoding counters with the acceptance rate overall and per draft position.
  - Profiles the workload (seed 000 Step 4) from the lifetime histograms, whether it is prefill-heavy, and the
    smallest C(max_model_len) that covers O(coverage) of the requests, with the numbers behind it.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
  - sparkfleet.vllm.vllm_endpoint
options:
  coverage:
    description: Share of requests the recommended C(max_model_len) must fit (prompt plus generation).
    type: float
    default: 0.99
  prefill_heavy_ratio:
    description: Prompt-to-generation token ratio from which the workload counts as prefill-heavy.
    type: float
    default: 4.0
requirements:
  - prometheus_client (Debian and Ubuntu package python3-prometheus-client; the vllm role installs it)
attributes:
  check_mode:
    support: full
    details: Only reads the endpoint, so it runs the same in check mode.
  diff_mode:
    support: none
    details: Changes nothing.
  idempotent:
    support: full
    details: Reads only.
"""

EXAMPLES = r"""
- name: Read the lifetime metrics of the LLM instance
  sparkfleet.vllm.vllm_metrics_info:
    instance: llm
  register: metrics

- name: Show the sizing advice
  ansible.builtin.debug:
    msg: >-
      prompt:output {{ metrics.metrics.prompt_to_generation_ratio | round(1) }},
      max_model_len {{ metrics.workload.recommended_max_model_len }}
"""

RETURN = r"""
ok:
  description: Whether the metrics were read.
  returned: always
  type: bool
reasons:
  description: Why they could not be read (an unreachable server, a reply that is not vLLM's Prometheus text); empty on success.
  returned: always
  type: list
  elements: str
url:
  description: The endpoint read.
  returned: always
  type: str
metrics:
  description:
    - The summary. Keys include requests_running, requests_waiting, kv_cache_usage (0..1), prompt_tokens,
      generation_tokens, prompt_to_generation_ratio, requests_finished (by reason), preemptions,
      prefix_cache_hit_rate, ttft_mean_ms, itl_mean_ms, e2e_mean_ms, prompt_length and generation_length
      (count, mean and cumulative buckets), and speculative_decoding (null without a drafter; drafts,
      draft_tokens, accepted_tokens, acceptance, mean_acceptance_length, acceptance_per_position).
  returned: success
  type: dict
workload:
  description:
    - requests, prompt_to_generation_ratio, prefill_heavy, prompt_tokens_bound, generation_tokens_bound,
      recommended_max_model_len, requests_over_prompt_bound, prompt_length_shares and reasons (why no
      recommendation could be made).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import ENDPOINT_ARGUMENT_SPEC, resolve
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import (
    PROMETHEUS_CLIENT_PURPOSE,
    read_metrics,
    summarize,
    text_string_to_metric_families,
    workload_profile,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ENDPOINT_ARGUMENT_SPEC,
            coverage=dict(type="float", default=0.99),
            prefill_heavy_ratio=dict(type="float", default=4.0),
        ),
        supports_check_mode=True,
    )
    if text_string_to_metric_families is None:
        missing = missing_required_lib("prometheus_client", reason=PROMETHEUS_CLIENT_PURPOSE)
        module.fail_json(msg=missing, ok=False, reasons=[missing])
    params = module.params
    if not 0 < params["coverage"] <= 1:
        reason = f"coverage: {params['coverage']} must be a share between 0 and 1, for example 0.99"
        module.fail_json(msg=reason, ok=False, reasons=[reason])
    try:
        endpoint = resolve(params)
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)])
    try:
        samples = read_metrics(endpoint["url"], endpoint["api_key"], params["timeout"])
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)], url=endpoint["url"])
    try:
        summary = summarize(samples)
    except ValueError as error:
        # Samples that parse but do not add up (draft positions that are not numbers) are no vLLM text either.
        reason = f"{endpoint['url']}/metrics did not answer Prometheus text: {error}"
        module.fail_json(msg=reason, ok=False, reasons=[reason], url=endpoint["url"])
    module.exit_json(
        changed=False,
        ok=True,
        reasons=[],
        url=endpoint["url"],
        metrics=summary,
        workload=workload_profile(summary, params["coverage"], params["prefill_heavy_ratio"]),
    )


if __name__ == "__main__":
    main()
