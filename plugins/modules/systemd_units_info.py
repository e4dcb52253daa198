#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: systemd_units_info
short_description: The load, active and unit-file states of several systemd units in one call
version_added: 0.9.0
description:
  - Reads C(LoadState), C(ActiveState) and C(UnitFileState) of each unit of O(units) with one C(systemctl show),
    where a loop of C(systemctl is-enabled) or C(systemctl show) makes one call per unit.
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
"""

RETURN = r"""
units:
  description: Each unit asked, with its C(LoadState), C(ActiveState) and C(UnitFileState).
  returned: always
  type: dict
  sample: {"systemd-networkd.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, show_units
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import UNIT_PROPERTIES, unit_name_problems


def main():
    module = AnsibleModule(argument_spec=dict(units=dict(type="list", elements="str", required=True)), supports_check_mode=True)
    units = module.params["units"]
    problems = unit_name_problems(units)
    if problems:
        module.fail_json(msg="; ".join(problems))
    if not units:
        module.exit_json(changed=False, units={})
    systemctl = module.get_bin_path("systemctl")
    if systemctl is None:
        module.fail_json(msg="systemctl is not installed on the host (not on its PATH); these units need systemd")
    try:
        states = show_units(module.run_command, units, UNIT_PROPERTIES, systemctl)
    except StateUnanswered as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, units=states)


if __name__ == "__main__":
    main()
