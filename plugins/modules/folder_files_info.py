#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: folder_files_info
short_description: The files a role deployed in a few folders, listed and read in one call
version_added: 0.9.0
description:
  - Lists the regular files of each folder of O(folders) whose names match one of its patterns, and reads their
    text when the folder asks for it, where a C(stat), a C(find) and a loop of C(slurp) make one call each.
  - A folder that does not exist is reported in RV(missing), not refused; links and subfolders are left out.
  - Every path and pattern is checked before anything is read; a file larger than 1 MiB is refused.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  folders:
    description: The folders to list.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: The folder, an absolute path (no C(.) or C(..)); each file's path is joined to it as given.
        type: str
        required: true
      patterns:
        description: Shell patterns a file's name must match one of (such as C(*.json)); no C(/).
        type: list
        elements: str
        required: true
      read:
        description: Return each matching file's text (read as UTF-8, undecodable bytes replaced).
        type: bool
        default: false
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
  - Not for secrets; the text read is returned in the result.
"""

EXAMPLES = r"""
- name: Find the instances deployed on this host
  sparkfleet.vllm.folder_files_info:
    folders:
      - {path: /etc/systemd/system, patterns: ["sparkfleet-vllm-*.service"]}
      - {path: /etc/sparkfleet/vllm, patterns: ["*.json"], read: true}
  register: deployed
"""

RETURN = r"""
files:
  description: Each matching file's path, with its text when its folder's O(folders[].read) is set (null otherwise).
  returned: always
  type: dict
  sample: {"/etc/systemd/system/sparkfleet-vllm-tiny.service": null, "/etc/sparkfleet/vllm/tiny.json": "{\"name\": \"tiny\"}"}
missing:
  description: The folders of O(folders) that do not exist.
  returned: always
  type: list
  elements: str
  sample: ["/etc/sparkfleet/cluster"]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem, read_folders


def main():
    folder = dict(path=dict(type="str", required=True), patterns=dict(type="list", elements="str", required=True),
                  read=dict(type="bool", default=False))
    module = AnsibleModule(argument_spec=dict(folders=dict(type="list", elements="dict", required=True, options=folder)),
                           supports_check_mode=True)
    try:
        module.exit_json(changed=False, **read_folders(module.params["folders"]))
    except FileProblem as problem:
        module.fail_json(msg=str(problem))


if __name__ == "__main__":
    main()
