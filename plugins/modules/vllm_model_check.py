#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_model_check
short_description: Check the weights an instance is about to launch on
version_added: 0.2.0
description:
  - Reads a model directory on the host and refuses a launch when it has no C(config.json) or no weights, when
    O(max_model_len) is beyond the model's own maximum (C(max_position_embeddings)), or when an MTP drafter
    would run on a model that is not instruction-tuned (seed 000, the drafter made a base model 38% slower),
    unless O(allow_drafter_on_base_model).
  - Returns what the checkpoint declares, its base model (the model card's C(base_model), as recorded in the
    staging manifest), quantization and maximum length.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  path:
    description: The model directory on the host.
    type: path
    required: true
  instance:
    description: Instance name, used in messages.
    type: str
    required: true
  variable:
    description: The inventory variable the instance is declared in, named in messages (a cluster's rank is declared in
      C(cluster_instance)).
    type: str
    choices: [vllm_instances, cluster_instance]
    default: vllm_instances
  max_model_len:
    description: The instance's C(max_model_len), if set.
    type: int
  speculative_method:
    description: The instance's speculative-decoding method when speculative decoding is on.
    type: str
  allow_drafter_on_base_model:
    description: Launch an MTP drafter on a model that is not instruction-tuned anyway.
    type: bool
    default: false
  instruction_tuned:
    description: Whether the model is instruction-tuned, when its names mislead; guessed from the base model or repo name otherwise.
    type: bool
attributes:
  check_mode:
    support: full
    details: Reads files only.
  diff_mode:
    support: none
    details: Changes nothing.
  idempotent:
    support: full
    details: Reads only.
"""

EXAMPLES = r"""
- name: Check the weights of the LLM instance before its launch
  sparkfleet.vllm.vllm_model_check:
    path: /srv/models/Gemma-4-26B-A4B-it-NVFP4
    instance: llm
    max_model_len: 131072
    speculative_method: mtp
"""

RETURN = r"""
ok:
  description: Whether the instance may launch on these weights.
  returned: always
  type: bool
facts:
  description: architectures, quantization, base_model, max_position_embeddings, instruction_tuned and judged_by (the name it was judged by).
  returned: when the directory has a config.json
  type: dict
reasons:
  description: Why the launch is refused.
  returned: always
  type: list
  elements: str
manifest_sha256:
  description:
    - The SHA-256 of the staging manifest (C(.sparkfleet-manifest.json)) in O(path), None when there is none; a cluster's
      nodes compare it to refuse ranks that would load different checkpoints.
  returned: always, None when there is no manifest
  type: str
"""

import hashlib
import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import (
    MANIFEST,
    launch_problems,
    model_facts,
    read_json,
    read_text,
)


def file_sha256(path):
    """The file's SHA-256 (as ansible.builtin.stat's checksum gives it), None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            instance=dict(type="str", required=True),
            variable=dict(type="str", choices=["vllm_instances", "cluster_instance"], default="vllm_instances"),
            max_model_len=dict(type="int"),
            speculative_method=dict(type="str"),
            allow_drafter_on_base_model=dict(type="bool", default=False),
            instruction_tuned=dict(type="bool"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    where = f"{params['variable']} ({params['instance']})"
    try:
        files = os.listdir(params["path"]) if os.path.isdir(params["path"]) else []
    except OSError as error:
        reason = f"{where}.model: cannot list {params['path']} ({error.strerror}); run the check with become: true"
        module.fail_json(msg=reason, ok=False, reasons=[reason])
    config_text = read_text(os.path.join(params["path"], "config.json"))
    facts = None
    recorded = {}
    if config_text is not None:
        try:
            config = json.loads(config_text)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            reason = (f"{where}.model: {params['path']}/config.json is not a JSON object; the staged copy is damaged, "
                      "stage it again (vllm_models)")
            module.fail_json(msg=reason, ok=False, reasons=[reason])
        recorded = read_json(os.path.join(params["path"], MANIFEST))
        recorded = recorded if isinstance(recorded, dict) else {}
        facts = model_facts(config, read_text(os.path.join(params["path"], "README.md")), recorded.get("repo"))
    instance = {
        "max_model_len": params["max_model_len"],
        "speculative": {"method": params["speculative_method"], "num_speculative_tokens": 1} if params["speculative_method"] else None,
        "allow_drafter_on_base_model": params["allow_drafter_on_base_model"],
    }
    declared = params["instruction_tuned"]
    if declared is None and facts is not None:
        declared = recorded.get("instruction_tuned_declared")
    reasons = launch_problems(where, files, facts, instance, declared)
    if not files:
        reasons.insert(0, f"{where}.model: {params['path']} does not exist or is empty on this host")
    result = dict(changed=False, ok=not reasons, facts=facts, reasons=reasons, manifest_sha256=file_sha256(os.path.join(params["path"], MANIFEST)))
    if reasons:
        module.fail_json(msg="; ".join(reasons), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
