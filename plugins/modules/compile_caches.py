#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: compile_caches
short_description: Back up an image's compile caches where a reinstall does not wipe them, and bring them back
version_added: 0.11.0
description:
  - Works on the folders the vllm role plans per image, C(<vllm_cache_dir>/jit/<image key>) - vLLM's torch.compile
    artifacts, FlashInfer's and Triton's JIT kernels and the warm stamps of the settings that started well on them
    (seed 002 - restoring them skips 30-45 minutes of compilation on a fresh deploy).
  - C(back_up) replaces the copy in a folder on the host (another disk, a mounted share) with a whole new one when the
    host holds stamps the copy lacks; the new copy is swapped in by renames, so the copy is never half written.
  - C(restore) copies a folder backup in when it holds planned stamps the host lacks - the files the host lacks, the
    stamps last.
  - For a backup on the controller, C(archive) writes a tar of the folder when the host holds stamps its last backup
    lacked; the role fetches it and C(archived) records its stamps and removes it. The tar is 0644, as readable as the
    kernels in it, because the role fetches it without privilege escalation (with it, Ansible reads the whole file into
    memory). C(lacking) names the folders missing planned stamps, the role copies their archives in beside them, and
    C(unpack) extracts the files the host lacks (stamps last), records them as the controller's and removes the archive.
  - A folder backup needs its root, the role's C(vllm_cache_backup_dir), to exist (a share not mounted fails, named).
  - Only folders and regular files are copied or extracted, under plain relative names; each file is opened through
    folders opened without following links, and one that is no regular file by then (a link, FIFO or device node) is
    skipped.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  action:
    description: What to do with each folder of O(caches).
    type: str
    required: true
    choices: [back_up, restore, archive, archived, lacking, unpack]
  caches:
    description: The plan's C(compile_caches), one per image folder.
    type: list
    elements: dict
    required: true
    suboptions:
      jit_dir:
        description: The image's compile-cache folder on the host, C(<vllm_cache_dir>/jit/<image key>).
        type: str
        required: true
      stamps:
        description: The planned warm stamps (16 hex digits each).
        type: list
        elements: str
        required: true
      backup:
        description: Its backup, C(<vllm_cache_backup_dir>/<host>/<image key>) (a tar on the controller ends in C(.tar)).
        type: str
        required: true
  archived_stamps:
    description:
      - For C(archived), the stamps each fetched archive holds, by C(jit_dir) (the C(archive) action's result).
      - A mapping keyed by folder, so its keys are not options; an entry that is no list of stamps records nothing.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    details: Reads the stamps on both sides and says what would be copied, archived or extracted; writes nothing.
  diff_mode:
    support: none
    details: Reports the folders it works on in RV(done), not a diff of their many files.
  idempotent:
    support: partial
    details:
      - C(back_up), C(restore), C(lacking), C(unpack) and C(archived) change nothing once done.
      - C(archive) writes the tar again on every run until C(archived) records its stamps.
notes:
  - Run as root; the caches are root's (the containers write them).
"""

EXAMPLES = r"""
- name: Bring back the compile caches a reinstall wiped, from another disk
  sparkfleet.vllm.compile_caches:
    action: restore
    caches: "{{ __vllm_plan.compile_caches }}"

- name: Back them up after the instances passed their gates
  sparkfleet.vllm.compile_caches:
    action: back_up
    caches: "{{ __vllm_plan.compile_caches }}"
"""

RETURN = r"""
done:
  description:
    - One entry per image folder the action worked on (or would, in check mode) - C(jit_dir), the C(stamps) involved,
      and C(from), C(to), C(archive), C(restore) and C(files) as the action has them.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._compile_caches import apply
from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True, choices=["back_up", "restore", "archive", "archived", "lacking", "unpack"]),
            caches=dict(type="list", elements="dict", required=True, options=dict(
                jit_dir=dict(type="str", required=True), stamps=dict(type="list", elements="str", required=True), backup=dict(type="str", required=True))),
            archived_stamps=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    try:
        result = apply(module.params["action"], module.params["caches"], module.check_mode, module.params["archived_stamps"])
    # The caches' own refusals and those of the collection's file reader they read through.
    except FileProblem as error:
        module.fail_json(msg=str(error), done=[])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
