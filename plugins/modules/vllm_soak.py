#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_soak
short_description: Soak a deployed vLLM instance under load for a duration and judge it PASS or FAIL
version_added: 0.9.0
description:
  - Runs rounds of C(vllm bench serve) (random tokens, C(--ignore-eos), C(--max-concurrency) O(concurrency),
    O(concurrency) times O(prompts_per_concurrency) prompts) until O(duration) seconds have passed (seed 000 Step 4).
  - Each round starts a new C(vllm bench serve) client, and the engine idles while it starts. Once a round has finished
    cleanly, the next grows, in whole prompts per stream, until its load would fill 90 % of a round at that round's
    pace, never past what fits before the deadline nor past 256 prompts per stream (seen on the lab, rounds of
    6 prompts were 1-2 s of load in 10 s).
    C(vllm bench serve) has no duration option and its client waits up to 6 hours on a stalled request, so every
    round runs under C(timeout) (O(round_timeout)), and a round still running at the deadline is given
    O(drain_timeout) more seconds, then killed and counted as a failure.
  - Every O(sample_interval) seconds, a sample of C(vllm:kv_cache_usage_perc), C(vllm:num_requests_waiting) and
    C(vllm:num_requests_running) from C(/metrics), MemAvailable from C(/proc/meminfo), and the latency of a tiny chat
    completion (at most O(probe_max_tokens) tokens, O(probe_timeout) seconds), sent on its own thread so a slow
    answer never delays the next sample. The largest gap between two samples is the freeze detector, since a host
    that locks up stops the sampler too.
  - Afterwards, since the soak's start, the failed requests of every round (from its result file, as
    M(sparkfleet.vllm.vllm_bench) judges a run), the kernel's OOM kills (C(Killed process) in C(journalctl --dmesg)),
    earlyoom's kill lines (C(sending SIGTERM to process), never its startup banner), the NVIDIA driver's
    C(NVRM) lines with C(NV_ERR_NO_MEMORY), the watchdog's actions (start, restart, give_up), and the restarts of
    the instance's unit (C(NRestarts), a new invocation) and container (a new Id, C(StartedAt), C(RestartCount)),
    before against after.
  - FAIL when a request failed, a round did not finish, a round's result did not account for every prompt it sent
    (its C(completed) or C(failed) missing or not a count, or the two adding up to other than the prompts sent), KV cache usage reached
    O(max_kv_cache_usage), a gap
    exceeded O(max_gap), more probes than O(max_probe_failures) went unanswered, MemAvailable fell under
    O(min_mem_available_mib), the kernel or earlyoom killed a process, the driver ran out of memory, anything
    restarted, the watchdog acted, or a journal could not be read. Every reason is returned.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
  - sparkfleet.vllm.vllm_endpoint
options:
  label:
    description: Name of this soak; each round's result file and C(soak.json) go to O(results_dir)/O(label).
    type: str
    required: true
  concurrency:
    description: Requests in flight at once (C(--max-concurrency)), from 1 to 1024; seed 000 soaked at 8.
    type: int
    default: 8
  prompts_per_concurrency:
    description: The first round sends this many prompts per stream (C(--num-prompts)), from 1 to 256, and no round fewer; seed 000 sent 6.
    type: int
    default: 6
  duration:
    description: Seconds of load, from 10 to 604800; no round starts after them.
    type: int
    default: 3600
  sample_interval:
    description: Seconds between samples, from 1 to 3600.
    type: int
    default: 30
  input_tokens:
    description: Random prompt length of each request, from 1 to 262144 tokens.
    type: int
    default: 4096
  output_tokens:
    description: Answer length of each request (C(--ignore-eos) makes every answer this long), from 1 to 32768 tokens.
    type: int
    default: 256
  round_timeout:
    description: Seconds one round may run before it is killed and counted as a failure, from 10 to 21600.
    type: int
    default: 1800
  drain_timeout:
    description: Seconds a round still running at the deadline is waited for before it is killed, from 10 to 3600.
    type: int
    default: 300
  probe_timeout:
    description: Seconds a probe may wait for its answer, from 10 to 600; shorter marks a saturated engine as dead.
    type: int
    default: 30
  probe_max_tokens:
    description: Tokens a probe asks for, from 1 to 5.
    type: int
    default: 5
  max_kv_cache_usage:
    description: FAIL when the KV cache usage of any sample reaches this fraction (above 0, at most 1).
    type: float
    default: 0.8
  max_gap:
    description: FAIL when two samples are further apart than this many seconds; defaults to three O(sample_interval)s.
    type: float
  max_probe_failures:
    description: FAIL when more probes than this get no answer within O(probe_timeout).
    type: int
    default: 0
  min_mem_available_mib:
    description: FAIL when MemAvailable of any sample falls under this many MiB; 0 gates nothing.
    type: int
    default: 0
  earlyoom_unit:
    description: The earlyoom unit whose journal is searched for kill lines; when it is not installed, the count is 0 and a note says so.
    type: str
    default: earlyoom.service
  watchdog_unit:
    description: The watchdog unit whose journal lines (one JSON decision each) are counted; when it is not installed, the count is 0 and a note says so.
    type: str
    default: sparkfleet-watchdog.service
  watch_units:
    description: Further units whose restarts FAIL the soak (seed 000 watched the embeddings instance and the databases too).
    type: list
    elements: str
    default: []
  watch_containers:
    description: Further containers whose restarts FAIL the soak.
    type: list
    elements: str
    default: []
  runner:
    description:
      - Where C(vllm bench serve) runs, as in M(sparkfleet.vllm.vllm_bench). C(exec) in the serving container,
        C(container) in a throwaway container of O(image) on the host network, C(local) with the host's own C(vllm).
      - C(auto) takes C(exec) when the instance's container is running, else C(local) when C(vllm) is on PATH, else C(container).
    type: str
    choices: [auto, exec, container, local]
    default: auto
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
    default: /var/lib/sparkfleet/soak
  fail_on_verdict:
    description: Fail the task when the soak FAILs, with every reason in its message; false returns the verdict in O(ignore:passed) and O(ignore:reasons) only.
    type: bool
    default: true
requirements:
  - prometheus_client (Debian and Ubuntu package python3-prometheus-client; the vllm role installs it)
attributes:
  check_mode:
    support: partial
    details: Reads the plan, picks the runner and checks that the unit is installed and its container running, then says what it would do.
  diff_mode:
    support: none
    details: Writes result files; no diff is shown.
  idempotent:
    support: none
    details: Every run sends new load for its whole duration.
notes:
  - The key reaches C(vllm bench serve) as C(OPENAI_API_KEY) in its environment, never on a command line.
  - For a soak of an hour over SSH, run the task with C(async) and C(poll), as C(playbooks/soak.yml) does.
seealso:
  - module: sparkfleet.vllm.vllm_soak_report
  - module: sparkfleet.vllm.vllm_bench
"""

EXAMPLES = r"""
- name: Seed 000's soak, one hour at 8 streams, with the report written by playbooks/soak.yml
  sparkfleet.vllm.vllm_soak:
    instance: llm
    label: nvfp4-mtp4-c8
    watch_units: [sparkfleet-vllm-embeddings.service]
  async: 4200
  poll: 30
  register: soak

- name: Five minutes at 2 streams, the verdict returned instead of failing the task
  sparkfleet.vllm.vllm_soak:
    instance: llm
    label: quick
    concurrency: 2
    duration: 300
    sample_interval: 10
    fail_on_verdict: false
  register: quick
"""

RETURN = r"""
ok:
  description: Whether the soak ran (its verdict is O(ignore:passed)).
  returned: always
  type: bool
passed:
  description: SOAK PASS (true) or FAIL (false); null in check mode.
  returned: always
  type: bool
reasons:
  description: Every reason the soak FAILed, or why it was refused; empty when it passed.
  returned: always
  type: list
  elements: str
notes:
  description: What the soak could not count and why (a unit not installed), or in check mode what it would do.
  returned: success
  type: list
  elements: str
summary:
  description:
    - From the samples, samples, max_kv_cache_usage (0..1), max_waiting, min_mem_available_mib, max_gap_s, max_gap_at_s
      (seconds into the soak), probe_median_s, probe_max_s, probe_failures and metrics_failures.
  returned: when the soak ran
  type: dict
counts:
  description:
    - rounds, unfinished_rounds (stalled, or no result file holding a JSON object), unaccounted_rounds (a result file whose
      completed and failed do not account for every prompt sent), completed_requests, failed_requests, oom_kills, earlyoom_kills, nvrm_no_memory,
      watchdog_actions, journal_errors (journal -> why it could not be read) and evidence (the first lines of each count).
  returned: when the soak ran
  type: dict
restarts:
  description: The units' and containers' states before and after, and changes, each restart worded.
  returned: when the soak ran
  type: dict
rounds:
  description:
    - Per round, round, t (seconds into the soak), seconds, timeout, exit_code, stalled, prompts (sent), completed and failed
      (null when the result file has no such count), unaccounted (the counts do not account for every prompt sent),
      result_file and problems.
  returned: always
  type: list
  elements: dict
samples:
  description: Per sample, t (seconds into the soak), time (epoch), kv_cache_usage, waiting, running, mem_available_mib, probe_s and the errors met.
  returned: always
  type: list
  elements: dict
thresholds:
  description: The gate applied, max_kv_cache_usage, max_gap, max_probe_failures and min_mem_available_mib.
  returned: success
  type: dict
runner:
  description: The runner used.
  returned: success
  type: str
result_dir:
  description: Host folder holding each round's result file and soak.json, the whole result.
  returned: when the soak ran
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._soak import soak
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import RUNNERS
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import ENDPOINT_ARGUMENT_SPEC
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import PROMETHEUS_CLIENT_PURPOSE, text_string_to_metric_families


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ENDPOINT_ARGUMENT_SPEC,
            label=dict(type="str", required=True),
            concurrency=dict(type="int", default=8),
            prompts_per_concurrency=dict(type="int", default=6),
            duration=dict(type="int", default=3600),
            sample_interval=dict(type="int", default=30),
            input_tokens=dict(type="int", default=4096, no_log=False),
            output_tokens=dict(type="int", default=256, no_log=False),
            round_timeout=dict(type="int", default=1800),
            drain_timeout=dict(type="int", default=300),
            probe_timeout=dict(type="int", default=30),
            probe_max_tokens=dict(type="int", default=5, no_log=False),
            max_kv_cache_usage=dict(type="float", default=0.8),
            max_gap=dict(type="float"),
            max_probe_failures=dict(type="int", default=0),
            min_mem_available_mib=dict(type="int", default=0),
            earlyoom_unit=dict(type="str", default="earlyoom.service"),
            watchdog_unit=dict(type="str", default="sparkfleet-watchdog.service"),
            watch_units=dict(type="list", elements="str", default=[]),
            watch_containers=dict(type="list", elements="str", default=[]),
            runner=dict(type="str", choices=list(RUNNERS), default="auto"),
            image=dict(type="str"),
            models_dir=dict(type="path", default="/srv/models"),
            tokenizer=dict(type="str", no_log=False),
            results_dir=dict(type="path", default="/var/lib/sparkfleet/soak"),
            fail_on_verdict=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    if text_string_to_metric_families is None:
        missing = missing_required_lib("prometheus_client", reason=PROMETHEUS_CLIENT_PURPOSE)
        module.fail_json(msg=missing, ok=False, passed=False, reasons=[missing], rounds=[], samples=[])
    msg, result = soak(module.params, module.run_command, module.get_bin_path, module.check_mode)
    if msg:
        module.fail_json(msg=msg, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
