#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_health
short_description: Health gate for a vLLM endpoint
version_added: 0.1.0
description:
  - Polls C(/v1/models) with the bearer key until it answers 200 listing every expected served model name.
  - Watches the serving container's state and restart count with C(docker inspect) and fails within seconds
    when the container exits, dies, restarts or is replaced, instead of waiting out the timeout; the failure
    carries the last lines of the container's log.
  - Optionally sends a short warm-up chat request once the endpoint is ready.
  - Seed 000's variant launcher ("poll every 15 s ... if container exited or its restart count went up, break").
author: sparkfleet.vllm contributors (@sparkfleet)
options:
  url:
    description: Base URL of the endpoint, without C(/v1).
    type: str
    required: true
  api_key:
    description: The endpoint's API key, sent as a bearer token.
    type: str
    required: true
  served_model_names:
    description: Names C(/v1/models) must list.
    type: list
    elements: str
    required: true
  container:
    description: Name of the serving container to watch; omit to poll the endpoint only.
    type: str
  timeout:
    description: Seconds to wait for the endpoint to become ready.
    type: int
    default: 600
  interval:
    description: Seconds between polls.
    type: float
    default: 2
  log_lines:
    description: Lines of the container log returned on failure.
    type: int
    default: 40
  warmup:
    description:
      - Send one chat request once ready and return its reply. Its prompt is long enough to avoid the
        CPU build's crash on a tiny first request.
    type: bool
    default: false
  warmup_reply_length:
    description: C(max_tokens) of the warm-up request.
    type: int
    default: 8
attributes:
  check_mode:
    support: full
    description: Reads the endpoint and the container only, so it runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing.
notes:
  - The C(docker) command must be on the host when O(container) is given.
"""

EXAMPLES = r"""
- name: Gate the relaunched instance
  sparkfleet.vllm.vllm_health:
    url: http://127.0.0.1:8001
    api_key: "{{ vault_vllm_api_key }}"
    served_model_names: [gemma-4-26b-a4b-it]
    container: vllm-llm
    timeout: 1200
    warmup: true
  no_log: false
  register: gate
"""

RETURN = r"""
ok:
  description: Whether the endpoint became ready.
  returned: always
  type: bool
reason:
  description: Why the gate passed or failed.
  returned: always
  type: str
  sample: "the container is exited (exit code 2)"
elapsed:
  description: Seconds from the first poll to the verdict.
  returned: always
  type: float
served_model_names:
  description: Names the endpoint served at the last poll.
  returned: always
  type: list
  elements: str
state:
  description: Container status at the verdict, for example C(running) or C(exited); null without O(container).
  returned: always
  type: str
restart_count:
  description: Container restart count at the verdict; null without O(container).
  returned: always
  type: int
log_tail:
  description: Last lines of the container log.
  returned: when the gate fails and O(container) is given
  type: str
log_errors:
  description: The lines of the container log that name errors, last ones first in importance.
  returned: when the gate fails and O(container) is given
  type: list
  elements: str
warmup_reply:
  description: The warm-up request's reply text.
  returned: when O(warmup) is true and the gate passed
  type: str
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import http
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import (
    container_failure,
    container_snapshot,
    error_lines,
    models_verdict,
)

WARMUP_PROMPT = "Say hello to the operator of this endpoint."


def inspect(module, docker, container):
    rc, out, _err = module.run_command([docker, "inspect", container])
    return container_snapshot(out) if rc == 0 else None


def log_tail(module, docker, container, lines):
    _rc, out, err = module.run_command([docker, "logs", "--tail", str(lines), container])
    return (out + err).strip()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", required=True, no_log=True),
            served_model_names=dict(type="list", elements="str", required=True),
            container=dict(type="str"),
            timeout=dict(type="int", default=600),
            interval=dict(type="float", default=2),
            log_lines=dict(type="int", default=40),
            warmup=dict(type="bool", default=False),
            warmup_reply_length=dict(type="int", default=8),
        ),
        supports_check_mode=True,
    )
    params = module.params
    base = params["url"].rstrip("/")
    docker = module.get_bin_path("docker", required=True) if params["container"] else None
    baseline = inspect(module, docker, params["container"]) if docker else None

    started = time.monotonic()
    result = dict(changed=False, ok=False, served_model_names=[], state=None, restart_count=None)
    while True:
        status, body = http("GET", base + "/v1/models", params["api_key"])
        ready, reason, served = models_verdict(status, body, params["served_model_names"])
        result["served_model_names"] = served
        current = inspect(module, docker, params["container"]) if docker else None
        if baseline is None:
            # The unit may create the container after the gate started; watch it from then on.
            baseline = current
        if current:
            result.update(state=current["status"], restart_count=current["restart_count"])
        failure = container_failure(baseline, current) if docker else None
        if ready and not failure:
            result.update(ok=True, reason=reason)
            break
        if failure or status == 401:
            result["reason"] = failure or reason
            break
        if time.monotonic() - started > params["timeout"]:
            result["reason"] = f"not ready after {params['timeout']} s: {reason}"
            break
        time.sleep(params["interval"])
    result["elapsed"] = round(time.monotonic() - started, 1)

    if not result["ok"]:
        if docker:
            whole_log = log_tail(module, docker, params["container"], 1000)
            result["log_tail"] = "\n".join(whole_log.splitlines()[-params["log_lines"]:])
            result["log_errors"] = error_lines(whole_log)
        module.fail_json(msg=f"vLLM health gate failed: {result['reason']}", **result)

    if params["warmup"]:
        payload = {
            "model": params["served_model_names"][0],
            "messages": [{"role": "user", "content": WARMUP_PROMPT}],
            "max_tokens": params["warmup_reply_length"],
            "temperature": 0,
        }
        status, body = http("POST", base + "/v1/chat/completions", params["api_key"], payload, timeout=120)
        if status != 200:
            module.fail_json(msg=f"vLLM warm-up request failed with HTTP {status}: {body[:500]}", **result)
        result["warmup_reply"] = json.loads(body)["choices"][0]["message"]["content"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
