#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench
short_description: Benchmark a vLLM endpoint with vllm bench serve, reporting draft acceptance
version_added: 0.2.0
description:
  - Runs C(vllm bench serve) (not a home-made load generator) once per concurrency in O(concurrencies), with
    C(prompts_per_concurrency) times the concurrency prompts, at temperature 0.
  - Judges every run by the completed and failed counts in the JSON it saved, never by the exit code
    (C(vllm bench serve) exits 0 when every request failed); a run with no success, or with any failure unless
    O(allow_failures), is not recorded and fails the module (seed 000, "the benchmark that silently didn't run").
  - Every prompt sent is accounted for; a result file without C(completed) or C(failed) (a missing C(failed) is no
    zero), with one that is not a count, or whose two fall short of or exceed the prompts sent, is a run not recorded,
    its reason naming the numbers (C(32 prompts sent, 29 completed, 0 failed) leaves 3 unaccounted for).
  - Reads the speculative-decoding counters from C(/metrics) before and after each run and reports the
    acceptance the run itself produced, overall and per draft position.
  - The default dataset is natural text (seed 000, "random tokens lie about speculative decoding"), Markdown or
    text documents from O(documents_dir) split on paragraph boundaries, packed to about O(input_tokens) tokens
    counted by the served model's own tokenizer (the server's C(/tokenize)), wrapped in O(instruction), and
    in disjoint sets per concurrency so no round reuses another's prefix cache.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
  - sparkfleet.vllm.vllm_endpoint
options:
  label:
    description: Name of this benchmark; its datasets, per-run JSON and summary go to O(results_dir)/O(label).
    type: str
    required: true
  concurrencies:
    description: Concurrent streams, one run each; each from 1 to 1024.
    type: list
    elements: int
    default: [1, 4, 8]
  prompts_per_concurrency:
    description: Prompts per stream, from 1 to 256; a run sends this times its concurrency.
    type: int
    default: 6
  dataset:
    description: C(natural) (documents packed to a token budget) or C(random) (random tokens, C(--ignore-eos)).
    type: str
    choices: [natural, random]
    default: natural
  documents_dir:
    description: Host folder of C(.md), C(.markdown) and C(.txt) documents for the natural dataset, read recursively.
    type: path
  instruction:
    description: Task put before every natural-text chunk; the default is seed 000's knowledge-graph extraction prompt.
    type: str
  input_tokens:
    description: Prompt size, the natural chunks' target or the random input length; from 1 to 262144 tokens.
    type: int
    default: 1000
  output_tokens:
    description: Longest answer, from 1 to 32768 tokens; natural answers may end sooner, random ones run to it.
    type: int
    default: 384
  prefix_cache:
    description:
      - C(disjoint) keeps rounds from sharing prompts (natural sets are disjoint; random runs use distinct seeds).
      - "C(reset) also empties the prefix cache before each run through C(/reset_prefix_cache), one of vLLM's
        development routes, which the vllm role opens only with C(vllm_allow_dev_mode: true) on an instance bound to
        loopback only. Where the route is absent (HTTP 404) or refused (HTTP 401), the module fails before any load
        is sent; use C(disjoint) there."
    type: str
    choices: [disjoint, reset]
    default: disjoint
  allow_failures:
    description: Record runs in which some requests failed (never runs in which all failed).
    type: bool
    default: false
  runner:
    description:
      - Where C(vllm bench serve) runs. C(exec) in the serving container, C(container) in a throwaway
        container of O(image) on the host network, C(local) with the host's own C(vllm).
      - C(auto) takes C(exec) when the instance's container is running, else C(local) when C(vllm) is on PATH,
        else C(container).
      - The custom dataset loader imports pandas, which serving images may lack; the module checks before the
        first run and names the fix (a bench image built from the same digest plus pandas).
    type: str
    choices: [auto, exec, container, local]
    default: auto
  container:
    description: Serving container for the C(exec) runner; defaults to the instance's.
    type: str
  image:
    description: Image for the C(container) runner; defaults to the instance's pinned image.
    type: str
  models_dir:
    description: Host folder mounted at C(/models) in serving containers, mounted the same way for the C(container) runner.
    type: path
    default: /srv/models
  tokenizer:
    description: Tokenizer path as the runner sees it; defaults to the instance's weights.
    type: str
  results_dir:
    description: Host folder under which each label's files are kept.
    type: path
    default: /var/lib/sparkfleet/bench
  require_idle:
    description:
      - Refuse to start while the server has requests running or waiting that are not the benchmark's; in seed 002
        gateway traffic made an MTP-2 against MTP-3 comparison meaningless. Drain the node first.
    type: bool
    default: true
requirements:
  - prometheus_client (Debian and Ubuntu package python3-prometheus-client; the vllm role installs it)
attributes:
  check_mode:
    support: partial
    details: Validates the options, resolves the endpoint and picks the runner, then returns without sending load.
  diff_mode:
    support: none
    details: Writes result files; no diff is shown.
  idempotent:
    support: none
    details: Every run sends new load and saves a new measurement.
notes:
  - The key reaches C(vllm bench serve) as C(OPENAI_API_KEY) in its environment, never on a command line.
"""

EXAMPLES = r"""
- name: Natural-text benchmark of the LLM instance at 1, 4 and 8 streams
  sparkfleet.vllm.vllm_bench:
    instance: llm
    label: mtp4-natural
    documents_dir: /srv/bench/docs
  register: bench

- name: Random-token shape of seed 000's first sweep, in a bench image that has pandas
  sparkfleet.vllm.vllm_bench:
    instance: llm
    label: random-4k
    dataset: random
    input_tokens: 4096
    output_tokens: 128
    runner: container
    image: registry.example/vllm-bench@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
"""

RETURN = r"""
ok:
  description: Whether every run was recorded.
  returned: always
  type: bool
runner:
  description: The runner used.
  returned: success
  type: str
dataset:
  description: dataset kind, and for natural text the chunk count and mean prompt tokens per concurrency.
  returned: success
  type: dict
runs:
  description:
    - Per concurrency, completed, failed, mean_ttft_ms, median_ttft_ms, p99_ttft_ms, mean_tpot_ms, p99_tpot_ms, mean_itl_ms,
      p99_itl_ms, output_throughput (tok/s), total_input_tokens, total_output_tokens, duration, acceptance
      (from the counters, null without a drafter), mean_acceptance_length, acceptance_per_position,
      acceptance_note (why acceptance is null although the server drafts, because its counters went backwards during the
      run, so it restarted), bench_acceptance_rate (vllm bench's own figure, percent) and result_file.
    - Each run also carries prompts (sent), exit_code and reasons (why it was not recorded, empty when it was); the run
      that was not recorded is the last, its figures what its file held, never a measurement.
  returned: always
  type: list
  elements: dict
table:
  description: The runs as a Markdown table.
  returned: success
  type: str
reasons:
  description: Why a run was not recorded.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import DATASETS, PREFIX_CACHE_MODES, RUNNERS, benchmark
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import ENDPOINT_ARGUMENT_SPEC
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import PROMETHEUS_CLIENT_PURPOSE, text_string_to_metric_families


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ENDPOINT_ARGUMENT_SPEC,
            label=dict(type="str", required=True),
            concurrencies=dict(type="list", elements="int", default=[1, 4, 8]),
            prompts_per_concurrency=dict(type="int", default=6),
            dataset=dict(type="str", choices=list(DATASETS), default="natural"),
            documents_dir=dict(type="path"),
            instruction=dict(type="str"),
            input_tokens=dict(type="int", default=1000, no_log=False),
            output_tokens=dict(type="int", default=384, no_log=False),
            prefix_cache=dict(type="str", choices=list(PREFIX_CACHE_MODES), default="disjoint"),
            allow_failures=dict(type="bool", default=False),
            runner=dict(type="str", choices=list(RUNNERS), default="auto"),
            container=dict(type="str"),
            image=dict(type="str"),
            models_dir=dict(type="path", default="/srv/models"),
            tokenizer=dict(type="str", no_log=False),
            results_dir=dict(type="path", default="/var/lib/sparkfleet/bench"),
            require_idle=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    if text_string_to_metric_families is None:
        missing = missing_required_lib("prometheus_client", reason=PROMETHEUS_CLIENT_PURPOSE)
        module.fail_json(msg=missing, ok=False, runs=[], reasons=[missing])
    msg, result = benchmark(module.params, module.run_command, module.get_bin_path, module.check_mode)
    if msg:
        module.fail_json(msg=msg, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
