#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_files
short_description: Bring a role's folders and files on a host to their content, mode and root ownership in one call
version_added: 0.9.0
description:
  - Creates each folder of O(folders) that is missing (in order, each missing parent 0755 and owned by root) and sets
    the mode and root ownership of each that differs (a folder that is a symlink to a folder is followed); then writes
    each file of O(files) whose content differs, atomically and with its mode from the first byte, and sets the mode
    and ownership of each whose content is right.
  - One call does what a loop of C(ansible.builtin.file) and C(ansible.builtin.copy) tasks does item by item, so a
    re-apply with nothing to change costs one round trip per role instead of one or two per item.
  - Every path must be absolute and written as it is meant (no C(.) or C(..), no doubled or trailing C(/)), and holds
    only letters, digits and C(_.@+-); a bad path or mode fails the task before anything is written.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  folders:
    description: The folders, created or fixed in this order.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The folder's absolute path.
        type: str
        required: true
      mode:
        description: Its mode, as a quoted octal string such as C("0755"); an unquoted number is refused.
        type: raw
        required: true
  files:
    description: The files, written after the folders; their folders must exist or be in O(folders).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file's absolute path.
        type: str
        required: true
      mode:
        description: Its mode, as a quoted octal string such as C("0644"); an unquoted number is refused.
        type: raw
        required: true
      content:
        description: Its whole content (text, written as UTF-8).
        type: str
        required: true
  secret_files:
    description:
      - Files holding secrets (keys), written like O(files) after them; their content is never shown (not in a diff, not
        in the output), and their mode must give group and others nothing (such as C("0600")).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file's absolute path.
        type: str
        required: true
      mode:
        description: Its mode, as a quoted octal string such as C("0600"), with no access for group or others.
        type: raw
        required: true
      content:
        description: Its whole content (text, written as UTF-8).
        type: str
        required: true
attributes:
  check_mode:
    support: full
    details: Reports the folders it would create or fix and the files it would write or fix, and changes nothing.
  diff_mode:
    support: full
    details: Shows each written file's content before and after; for a secret file, a line saying it was rewritten.
  idempotent:
    support: full
    details: Files already with their content and mode are left alone.
notes:
  - Owner and group are set to root when the module runs as root; as another user they are left as they are.
  - Secrets go in O(secret_files); the content of O(files) reaches the diff.
"""

EXAMPLES = r"""
- name: Install the key middleware and its folder
  sparkfleet.vllm.host_files:
    folders:
      - {path: /usr/local/libexec/sparkfleet, mode: "0755"}
    files:
      - path: /usr/local/libexec/sparkfleet/sparkfleet_vllm_guard.py
        mode: "0644"
        content: "{{ lookup('ansible.builtin.file', 'sparkfleet_vllm_guard.py', rstrip=false) }}"
"""

RETURN = r"""
folders_created:
  description: The folders created (or, in check mode, that would be).
  returned: always
  type: list
  elements: str
folders_fixed:
  description: The folders whose mode or owner was (or would be) set.
  returned: always
  type: list
  elements: str
files_written:
  description: The files whose content was (or would be) written.
  returned: always
  type: list
  elements: str
files_fixed:
  description: The files whose content was right but whose mode or owner was (or would be) set.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem, sync_listed


def main():
    # raw: an unquoted YAML mode such as 0644 arrives as the number 420 and is refused, never applied as 0420.
    entry = dict(path=dict(type="str", required=True), mode=dict(type="raw", required=True))
    module = AnsibleModule(
        argument_spec=dict(
            folders=dict(type="list", elements="dict", default=[], options=entry),
            files=dict(type="list", elements="dict", default=[], options=dict(entry, content=dict(type="str", required=True))),
            # The list names paths and modes; only each file's content is the secret.
            secret_files=dict(type="list", elements="dict", default=[], no_log=False,
                              options=dict(entry, content=dict(type="str", required=True, no_log=True))),
        ),
        supports_check_mode=True,
    )
    try:
        result = sync_listed(module.params["folders"], module.params["files"], module.check_mode, module.params["secret_files"])
    except FileProblem as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
