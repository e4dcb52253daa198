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
  - Errors that retrying cannot fix end the gate at once with the real reason (401 with the key it was given,
    a header the key cannot travel in, TLS or URL errors, another server answering on the port); only "not up
    yet" (connection refused or reset, a timeout, HTTP 5xx) is waited on.
  - The verdict is the same function the vllm role's units run as their readiness wait at boot, and the gate the
    same one M(sparkfleet.vllm.serving_unit) runs in a single instance's relaunch.
  - With O(instance), a start whose settings never served on the image's compile caches (no warm stamp) is cold
    (seeds 001 and 002) - it is waited on for the plan's cold timeout, and a single instance's container may exit
    once and be started again by its unit before that counts as a failure (a cluster's role relaunches every rank once
    instead).
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  instance:
    description:
      - Name of an instance the vllm role deployed on this host; URL, key, served names, container and timeout
        are read from its plan file and env file in O(config_dir). Excludes O(url), O(api_key),
        O(served_model_names) and O(container).
    type: str
  config_dir:
    description: Where the vllm role keeps the instances' plan and env files.
    type: path
    default: /etc/sparkfleet/vllm
  cold:
    description:
      - With O(instance), whether the start is cold (true) or warm (false) whatever the instance's own warm stamp says;
        unset reads the stamp. The cluster role sets it true when any node lacks its stamp (a reinstalled worker compiles
        while the head's caches are warm).
    type: bool
    version_added: 0.11.0
  url:
    description: Base URL of the endpoint, without C(/v1); required without O(instance).
    type: str
  api_key:
    description: The endpoint's API key, sent as a bearer token; required without O(instance).
    type: str
  served_model_names:
    description: Names C(/v1/models) must list; required without O(instance).
    type: list
    elements: str
  container:
    description: Name of the serving container to watch; omit to poll the endpoint only.
    type: str
  timeout:
    description:
      - Seconds to wait for the endpoint to become ready; default the instance's planned timeout (the warm one, or the
        cold one while its settings never served on the image's caches), or 600.
    type: int
  interval:
    description: Seconds between polls (one C(/v1/models) request and one C(docker inspect) each).
    type: float
    default: 0.5
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
    details: Reads the endpoint and the container only, so it runs the same in check mode.
  diff_mode:
    support: none
    details: Changes nothing.
  idempotent:
    support: full
    details: Asks the endpoint only; it never changes the host.
notes:
  - The C(docker) command must be on the host when O(container) is given.
"""

EXAMPLES = r"""
- name: Gate an instance the vllm role deployed, reading its plan file
  sparkfleet.vllm.vllm_health:
    instance: llm

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
reasons:
  description: The same reason as a list (the result shape every module of the collection shares).
  returned: always
  type: list
  elements: str
url:
  description: The URL the gate polled.
  returned: always
  type: str
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
start:
  description: C(cold) when the gate waited on a start that compiles (no warm stamp), else C(warm).
  returned: always
  type: str
timeout:
  description: The seconds the gate would wait.
  returned: always
  type: float
restarts:
  description: The container failures a cold start got past (its unit started it again).
  returned: always
  type: list
  elements: str
restartable:
  description: Whether the failure was one a cold start may get past once (the engine exited; not an OOM kill or docker's refusal).
  returned: always
  type: bool
warmup_reply:
  description: The warm-up request's reply text.
  returned: when O(warmup) is true and the gate passed
  type: str
kv_cache_tokens:
  description: The KV cache the engine sized at its start, in tokens, from its /metrics page (null when the page does not say).
  returned: when the gate passed on an instance's plan (O(instance)) whose warm stamp is planned
  type: int
kv_cache_warning:
  description:
    - Why this start's KV cache is a warning (also shown as one), or null. A start whose KV cache is below the plan's share
      (C(vllm_kv_cache_warn_share)) of the best good start of the same settings, which the warm stamp keeps, started while
      something else held memory (seed 000).
  returned: when the gate passed on an instance's plan (O(instance)) whose warm stamp is planned
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import read_instance
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_gate import POLL_INTERVAL, Endpoint, gate


def endpoint_of(module):
    """The endpoint to gate: from the instance's plan files, or given one by one."""
    params = module.params
    if params["instance"]:
        try:
            endpoint = read_instance(params["config_dir"], params["instance"])
        except ValueError as error:
            module.fail_json(msg=str(error), ok=False, reasons=[str(error)])
        return Endpoint.of_instance(endpoint, params["timeout"], params["cold"])
    missing = [name for name in ("url", "api_key", "served_model_names") if not params[name]]
    if missing:
        reason = f"give instance, or {', '.join(missing)}"
        module.fail_json(msg=reason, ok=False, reasons=[reason])
    return Endpoint(params["url"], params["api_key"], params["served_model_names"], params["container"], params["timeout"] or 600)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            instance=dict(type="str"),
            config_dir=dict(type="path", default="/etc/sparkfleet/vllm"),
            cold=dict(type="bool"),
            url=dict(type="str"),
            api_key=dict(type="str", no_log=True),
            served_model_names=dict(type="list", elements="str"),
            container=dict(type="str"),
            timeout=dict(type="int"),
            interval=dict(type="float", default=POLL_INTERVAL),
            log_lines=dict(type="int", default=40),
            warmup=dict(type="bool", default=False),
            warmup_reply_length=dict(type="int", default=8),
        ),
        mutually_exclusive=[("instance", "url"), ("instance", "api_key"), ("instance", "served_model_names"), ("instance", "container")],
        supports_check_mode=True,
    )
    params = module.params
    endpoint = endpoint_of(module)
    docker = module.get_bin_path("docker", required=True) if endpoint.container else None

    def run(argv):
        return module.run_command([docker, *argv[1:]])

    result = gate(endpoint, run if docker else None, params["interval"], params["log_lines"], params["warmup"], params["warmup_reply_length"])
    if not result["ok"]:
        module.fail_json(**result)
    if result.get("kv_cache_warning"):
        module.warn(f"{endpoint.url}: {result['kv_cache_warning']}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
