#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sysctl_file
short_description: Keep kernel settings in a sysctl.d file of the collection's and in the running kernel, in one call
version_added: 0.9.0
description:
  - Writes O(path) whole with O(settings), one C(name=value) line each, when it differs (atomically, mode 0644, owned
    by root), and with O(apply) sets each running value that differs through C(/proc/sys).
  - Every name and value is checked and every running value read before anything is written; a name the running
    kernel does not have fails the task naming it.
  - One call where a loop of C(ansible.posix.sysctl) makes one per setting, so a re-apply with nothing to change
    costs one round trip.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  path:
    description: The sysctl.d file, which holds only these settings.
    type: path
    required: true
  settings:
    description: Each setting's dotted name and value (numbers or plain words).
    type: dict
    required: true
  apply:
    description: Also set the values in the running kernel; false where C(/proc/sys) is read-only (containers).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: Reports whether the file and which running values would change, and writes nothing.
  diff_mode:
    support: full
    details: Shows the file before and after.
  idempotent:
    support: full
    details: A file already with the settings is left alone.
notes:
  - Needs root to write the file and the running values.
"""

EXAMPLES = r"""
- name: Write the memory sysctls and set them in the running kernel
  sparkfleet.vllm.sysctl_file:
    path: /etc/sysctl.d/90-sparkfleet-memory.conf
    settings:
      vm.min_free_kbytes: 5242880
      vm.overcommit_memory: 1
"""

RETURN = r"""
file_written:
  description: Whether the file was (or would be) written.
  returned: always
  type: bool
set_running:
  description: The settings whose running value was (or would be) set.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._sysctl import sync_sysctls


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            settings=dict(type="dict", required=True),
            apply=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = sync_sysctls(params["path"], params["settings"], params["apply"], module.check_mode)
    except FileProblem as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
