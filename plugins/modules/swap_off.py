#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: swap_off
short_description: Turn swap off and keep it off across reboots, in one call
version_added: 0.9.0
description:
  - Runs C(swapoff -a) when C(swapon --show) lists active swap (O(disable_active)).
  - Comments out (never deletes) the swap entries of O(fstab_path) - each line whose third field, the type, is
    C(swap) becomes C(# <line>) - keeping a backup beside it named as C(backup=true) of M(ansible.builtin.replace)
    names it (C(<path>.<pid>.<YYYY-MM-DD@HH:MM:SS>~)); the file is written atomically with its mode and owner.
  - Writes vm.swappiness to O(sysctl_file) and, with O(apply_sysctl), sets it in the running kernel, as
    M(sparkfleet.vllm.sysctl_file) does.
  - With O(mask_units), masks C(swap.target), every swap unit and the units of O(zram_units) that the host has and
    that are not masked yet, so that systemd does not bring swap back at the next boot; the unit files and their
    states are read with one C(systemctl list-unit-files) and the missing masks set with one C(systemctl mask).
  - Every option is checked, and the active swap, fstab and unit files read, before anything changes; a re-apply with
    nothing to change costs one round trip, where the swap role's tasks made about six.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  disable_active:
    description: Run C(swapoff -a) when any swap is active.
    type: bool
    default: true
  fstab_path:
    description: The fstab whose swap entries are commented out.
    type: path
    default: /etc/fstab
  swappiness:
    description: Value of vm.swappiness, 0 to 10 (a higher value pages the model's memory out should swap come back).
    type: int
    required: true
  sysctl_file:
    description: The sysctl.d file that holds vm.swappiness (in /etc/sysctl.d, ending in .conf); it holds only that, since it is rewritten whole.
    type: path
    required: true
  apply_sysctl:
    description: Also set vm.swappiness in the running kernel; false where C(/proc/sys) is read-only (containers).
    type: bool
    default: true
  mask_units:
    description: Mask C(swap.target), the host's swap units and the units of O(zram_units) that exist.
    type: bool
    default: true
  zram_units:
    description: zram units masked when present on the host.
    type: list
    elements: str
    default: [zramswap.service, systemd-zram-setup@zram0.service, dev-zram0.swap]
attributes:
  check_mode:
    support: full
    details: Reports whether swap would be turned off, the fstab lines that would be commented out, whether the sysctl
      would change and the units that would be masked; runs and writes nothing that changes the host.
  diff_mode:
    support: full
    details: Shows fstab and the sysctl file before and after.
  idempotent:
    support: full
    details: A host without swap, its fstab commented and its sysctl set is left alone.
  platform:
    description: Debian hosts with systemd.
    support: full
    platforms: debian
notes:
  - Needs C(swapon), C(swapoff) and C(systemctl) on the host, and root.
seealso:
  - module: sparkfleet.vllm.sysctl_file
"""

EXAMPLES = r"""
- name: Turn swap off and keep it off
  sparkfleet.vllm.swap_off:
    swappiness: 1
    sysctl_file: /etc/sysctl.d/99-sparkfleet-swap.conf

- name: In a container, where /proc/sys is read-only and active swap belongs to the host
  sparkfleet.vllm.swap_off:
    swappiness: 1
    sysctl_file: /etc/sysctl.d/99-sparkfleet-swap.conf
    disable_active: false
    apply_sysctl: false
"""

RETURN = r"""
swapped_off:
  description: Whether C(swapoff -a) ran (in check mode, would run).
  returned: always
  type: bool
fstab_commented:
  description: The fstab lines commented out (or that would be), as they were.
  returned: always
  type: list
  elements: str
  sample: ["/swap.img none swap sw 0 0"]
fstab_backup:
  description: The backup of fstab made before it was rewritten; empty when it was not rewritten (and in check mode).
  returned: always
  type: str
  sample: /etc/fstab.4711.2025-01-31@12:00:00~
sysctl_changed:
  description: Whether the sysctl file's content, mode or owner, or the running value, changed (or would).
  returned: always
  type: bool
sysctl_file_written:
  description: Whether the sysctl file was (or would be) written.
  returned: always
  type: bool
sysctl_set_running:
  description: The settings whose running value was (or would be) set; C(vm.swappiness) or none.
  returned: always
  type: list
  elements: str
masked:
  description: The units masked (or that would be); those already masked are left alone and not listed.
  returned: always
  type: list
  elements: str
  sample: [dev-zram0.swap, swap.target]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._swap import turn_swap_off
from ansible_collections.sparkfleet.vllm.plugins.module_utils._tools import tool_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            disable_active=dict(type="bool", default=True),
            fstab_path=dict(type="path", default="/etc/fstab"),
            swappiness=dict(type="int", required=True),
            sysctl_file=dict(type="path", required=True),
            apply_sysctl=dict(type="bool", default=True),
            mask_units=dict(type="bool", default=True),
            zram_units=dict(type="list", elements="str", default=["zramswap.service", "systemd-zram-setup@zram0.service", "dev-zram0.swap"]),
        ),
        supports_check_mode=True,
    )

    run = tool_runner(module)
    params = module.params
    try:
        result = turn_swap_off(run, disable_active=params["disable_active"], fstab_path=params["fstab_path"],
                               swappiness=params["swappiness"], sysctl_file=params["sysctl_file"], apply_sysctl=params["apply_sysctl"],
                               mask_units=params["mask_units"], zram_units=params["zram_units"], check_mode=module.check_mode)
    except FileProblem as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
