#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: headless_units
short_description: Boot into a target with listed services disabled, masked and stopped, in one call
version_added: 0.9.0
description:
  - Points C(/etc/systemd/system/default.target) at the unit file of O(default_target) in C(/lib/systemd/system),
    replacing what is there in one rename, as C(systemctl set-default) does; a target without a unit file there is refused.
  - Reads the unit files with one C(systemctl list-unit-files) and the running services and listening sockets with one
    C(systemctl list-units), then disables the units of O(disable_services) that are enabled with one C(systemctl disable),
    masks those of O(mask_services) that the host has and are not masked yet, and the targets of O(mask_targets) not
    masked yet, with one C(systemctl mask) (two with O(stop_services), since the targets are not stopped).
  - With O(stop_services) the disable and the services' mask carry C(--now), which stops them; a service masked already
    but still running is masked again with C(--now), so it stops. After a stop the running units are read again, since
    stopping a unit also stops the units that require it.
  - A name of O(disable_services), O(mask_services) or O(expected_services) that ends in no unit type (C(.service),
    C(.socket), C(.target)...) means C(.service), as systemctl reads it.
    An alias (such as C(smartd.service) for C(smartmontools.service)) cannot be masked and is left alone; its unit,
    listed under its own name, can. A runtime mask is lost at the next boot, so such a unit is masked again.
  - Every name is checked - a unit name systemctl would not take, a unit type the listings do not cover, and the
    wait-online units the wait_online role enables (disabled or masked, Docker starts before the LAN address exists)
    are refused - and the link, the unit files and the running units read, before anything changes; a
    re-apply with nothing to change costs one round trip, where the headless role's tasks made three (and one more per
    unit to change).
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  default_target:
    description: The target the host boots into (a unit name ending in C(.target)).
    type: str
    default: multi-user.target
  disable_services:
    description: Units disabled when their unit file is enabled.
    type: list
    elements: str
    default: []
  mask_services:
    description: Units masked when the host has their unit file.
    type: list
    elements: str
    default: []
  mask_targets:
    description: Targets masked, whether the host has them or not (the mask holds should a package bring one later).
    type: list
    elements: str
    default: []
  stop_services:
    description: Also stop the units disabled or masked, and those masked already that still run.
    type: bool
    default: true
  expected_services:
    description: Services expected to run; every other running service is returned in RV(unexpected).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    details: Reads the link, the unit files and the running units, and reports the link, disables, masks and stops that
      would be made; runs and writes nothing that changes the host. RV(running) and RV(unexpected) leave out the units that
      would be stopped.
  diff_mode:
    support: full
    details: Shows where C(default.target) points before and after.
  idempotent:
    support: full
    details: A host already headless is left alone.
  platform:
    description: Debian hosts with systemd.
    support: full
    platforms: debian
notes:
  - Needs C(systemctl) on the host, and root.
seealso:
  - module: sparkfleet.vllm.systemd_units_info
"""

EXAMPLES = r"""
- name: Boot into multi-user, with the desktop and the sleep targets off
  sparkfleet.vllm.headless_units:
    default_target: multi-user.target
    disable_services: [gdm3, cups, avahi-daemon]
    mask_services: [gdm3, snapd, snapd.socket]
    mask_targets: [sleep.target, suspend.target, hibernate.target, hybrid-sleep.target]
    expected_services: [ssh, cron, dbus, systemd-journald]
  register: headless

- name: Report running services outside the expected list
  ansible.builtin.debug:
    msg: "{{ headless.unexpected | join(', ') or 'none' }}"
"""

RETURN = r"""
default_target:
  description: The target C(default.target) pointed at before (empty when it was not a link) and the one it points at after.
  returned: always
  type: dict
  sample: {"before": "graphical.target", "after": "multi-user.target"}
disabled:
  description: The units disabled (or that would be); those not enabled are left alone and not listed.
  returned: always
  type: list
  elements: str
  sample: [cups.service, avahi-daemon.service]
masked:
  description: The units and targets masked (or that would be); those already masked are left alone and not listed.
  returned: always
  type: list
  elements: str
  sample: [snapd.service, snapd.socket, sleep.target]
stopped:
  description: The running units and listening sockets that the disable or mask stopped (or would stop); empty without O(stop_services).
  returned: always
  type: list
  elements: str
  sample: [cups.service, snapd.socket]
running:
  description: The services running and the sockets listening after the changes, as C(systemctl list-units) lists them.
  returned: always
  type: list
  elements: str
  sample: [cron.service, dbus.service, ssh.service, dbus.socket]
unexpected:
  description: The running services (C(.service) only) that O(expected_services) does not list.
  returned: always
  type: list
  elements: str
  sample: [user@1000.service]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._headless import set_headless_units
from ansible_collections.sparkfleet.vllm.plugins.module_utils._tools import tool_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            default_target=dict(type="str", default="multi-user.target"),
            disable_services=dict(type="list", elements="str", default=[]),
            mask_services=dict(type="list", elements="str", default=[]),
            mask_targets=dict(type="list", elements="str", default=[]),
            stop_services=dict(type="bool", default=True),
            expected_services=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )

    params = module.params
    try:
        result = set_headless_units(tool_runner(module), default_target=params["default_target"], disable_services=params["disable_services"],
                                    mask_services=params["mask_services"], mask_targets=params["mask_targets"],
                                    stop_services=params["stop_services"], expected_services=params["expected_services"],
                                    check_mode=module.check_mode)
    except FileProblem as error:
        module.fail_json(msg=str(error), changed=getattr(error, "changed", False))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
