#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: boot_check
short_description: Check that everything the collection set up on a host came back after a boot
version_added: 0.9.0
description:
  - The checks of C(playbooks/reboot_test.yml), run on the host after it booted (seed 000 Step 6). The boot is PID 1's
    start, so a lab host (a container restarted in place of a reboot) is judged like a real one.
  - C(serving) each instance and cluster head in the plan files answers C(/v1/models) with every served name within
    O(serve_within) seconds of the boot (the module waits until then). C(order) each unit began starting only once the
    units it follows (its plan's C(start_after)) were active. C(units) every planned unit, worker ranks too, is installed
    and active. C(restarts) no unit restarted since the boot (C(NRestarts)) and the watchdog did not act.
    C(lan_port) every non-loopback address an instance is bound to answers with its key. C(warm_up) a chat completion
    is answered. C(speculative) where speculative decoding is configured, a request moves
    C(vllm:spec_decode_num_draft_tokens_total). C(services) every unit of O(expect_active) is active. C(exporters)
    every installed unit of O(exporter_units) is active and every O(exporter_urls) answers. C(failed_units) none.
    C(swap) none active. C(oom_kills) no C(Killed process) in the kernel journal since the boot.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  plan_dirs:
    description: Folders of the plan files (C(vllm_config_dir), C(cluster_config_dir)); a folder that does not exist holds no plan.
    type: list
    elements: path
    required: true
  serve_within:
    description: Seconds after the boot by which every instance must serve, from 60 to 14400.
    type: int
    default: 1800
  expect_active:
    description: Units that must be active (earlyoom, the watchdog).
    type: list
    elements: str
    default: []
  exporter_units:
    description: Exporter units that must be active where installed; one not installed is noted, not failed.
    type: list
    elements: str
    default: []
  exporter_urls:
    description: Exporter URLs, on their bind address, that must answer 200.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds each request other than the wait for serving may take.
    type: int
    default: 10
  title:
    description: Heading of the Markdown report returned in RV(markdown).
    type: str
    default: reboot test
  reboot_seconds:
    description: Seconds the reboot took, as C(ansible.builtin.reboot) returned them, for the report.
    type: float
  validate_only:
    description: Judge the options and read the plan files and keys, then stop; the reboot test runs this before it reboots.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: Reads and sends read-only requests only; the same answer in check mode.
  diff_mode:
    support: none
    details: Changes nothing, so there is nothing to show.
  idempotent:
    support: full
    details: Reads the host and changes nothing.
notes:
  - Reads the instances' env files for their keys, so run it with C(become) true. No key is returned.
seealso:
  - module: sparkfleet.vllm.vllm_health
"""

EXAMPLES = r"""
- name: Check the host after its reboot
  sparkfleet.vllm.boot_check:
    plan_dirs: [/etc/sparkfleet/vllm, /etc/sparkfleet/cluster]
    expect_active: [earlyoom.service, sparkfleet-watchdog.service]
    exporter_urls: ["http://192.168.1.20:9100/metrics"]
  register: boot
"""

RETURN = r"""
ok:
  description: Whether the checks could run (their verdict is RV(passed)).
  returned: always
  type: bool
passed:
  description: Every check passed.
  returned: always
  type: bool
reasons:
  description: Each failed check with what was seen, or why the checks could not run.
  returned: always
  type: list
  elements: str
checks:
  description: One row per check, C(check), C(passed) and C(detail) (what was seen).
  returned: always
  type: list
  elements: dict
booted_at:
  description: PID 1's start, in seconds since the epoch.
  returned: success
  type: float
serving_seconds:
  description: Per unit, the seconds after the boot at which it served.
  returned: success
  type: dict
damaged_plan_files:
  description: JSON files in the plan folders that are no usable plan, each with why; they fail C(serving).
  returned: success
  type: list
  elements: str
markdown:
  description: The report, the verdict and a table of the checks.
  returned: success, unless O(validate_only)
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._boot_check import check, local_host, markdown_report


def main():
    module = AnsibleModule(
        argument_spec=dict(
            plan_dirs=dict(type="list", elements="path", required=True),
            serve_within=dict(type="int", default=1800),
            expect_active=dict(type="list", elements="str", default=[]),
            exporter_units=dict(type="list", elements="str", default=[]),
            exporter_urls=dict(type="list", elements="str", default=[]),
            timeout=dict(type="int", default=10),
            title=dict(type="str", default="reboot test"),
            reboot_seconds=dict(type="float"),
            validate_only=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    result = check(module.params, local_host(module.run_command), validate_only=module.params["validate_only"])
    if not result["ok"]:
        module.fail_json(msg="boot_check could not run: " + "; ".join(result["reasons"]), **result)
    if module.params["validate_only"]:
        module.exit_json(changed=False, **result)
    module.exit_json(changed=False, markdown=markdown_report(module.params["title"], result, module.params["reboot_seconds"]), **result)


if __name__ == "__main__":
    main()
