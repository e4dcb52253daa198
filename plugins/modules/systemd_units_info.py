#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: systemd_units_info
short_description: The load, active and unit-file states (or other properties) of several systemd units in one call
version_added: 0.9.0
description:
  - Reads O(properties) (by default C(LoadState), C(ActiveState) and C(UnitFileState)) of each unit of O(units) with one
    C(systemctl show), where a loop of C(systemctl is-enabled) or C(systemctl show) makes one call per unit.
  - A unit systemd does not know reads C(LoadState=not-found) and an empty C(UnitFileState). An alias reads the
    states of its unit, so the alias of an enabled unit reads C(enabled).
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  units:
    description: The unit names (such as C(NetworkManager.service)).
    type: list
    elements: str
    required: true
  properties:
    description:
      - The properties read of each unit, as C(systemctl show) names them (such as C(NRestarts)); at least one. A
        property systemd does not print for the unit (one its type lacks) reads as an empty string.
    type: list
    elements: str
    default: [LoadState, ActiveState, UnitFileState]
    version_added: 0.11.0
attributes:
  check_mode:
    support: full
    details: Reads only; the same answer in check mode.
  diff_mode:
    support: none
    details: Changes nothing, so there is nothing to show.
  idempotent:
    support: full
    details: Reads only.
notes:
  - Needs C(systemctl) on the host.
"""

EXAMPLES = r"""
- name: Read which network stacks are enabled
  sparkfleet.vllm.systemd_units_info:
    units: [NetworkManager.service, systemd-networkd.service, networking.service]
  register: stacks

- name: Read how often systemd has restarted the node exporter, and whether it runs
  sparkfleet.vllm.systemd_units_info:
    units: [prometheus-node-exporter.service]
    properties: [NRestarts, ActiveState]
  register: exporter
"""

RETURN = r"""
units:
  description: Each unit asked, with each of O(properties).
  returned: always
  type: dict
  sample: {"systemd-networkd.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, show_units
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import UNIT_PROPERTIES, property_name_problems, unit_name_problems


def main():
    module = AnsibleModule(argument_spec=dict(units=dict(type="list", elements="str", required=True),
                                              properties=dict(type="list", elements="str", default=list(UNIT_PROPERTIES))),
                           supports_check_mode=True)
    units, properties = module.params["units"], module.params["properties"]
    problems = unit_name_problems(units) + property_name_problems(properties)
    if not properties:
        problems.append("properties: name at least one property to read (such as ActiveState)")
    if problems:
        module.fail_json(msg="; ".join(problems))
    if not units:
        module.exit_json(changed=False, units={})
    systemctl = module.get_bin_path("systemctl")
    if systemctl is None:
        module.fail_json(msg="systemctl is not installed on the host (not on its PATH); these units need systemd")
    try:
        # Every unit prints its Id, so each answers with a block of its own even when it has none of the properties asked.
        asked = properties if "Id" in properties else ["Id", *properties]
        states = {unit: {name: values[name] for name in properties} for unit, values in show_units(module.run_command, units, asked, systemctl).items()}
    except StateUnanswered as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, units=states)


if __name__ == "__main__":
    main()
