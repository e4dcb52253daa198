#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_model_stage
short_description: Stage a Hugging Face checkpoint at a pinned revision, verified and never half-downloaded
version_added: 0.2.0
description:
  - Downloads O(repo) at O(revision) with the C(hf) CLI from inside the pinned vLLM image, so the host needs
    nothing but Docker, into C(<models_dir>/.partial-<name>), and moves it to C(<models_dir>/<name>) only when every
    file the hub listed has arrived. An interrupted download never looks staged, and the next run resumes it.
  - Records a manifest (C(.sparkfleet-manifest.json)) with the revision, each file's size and sha256, the
    sha256 of the safetensors index and what the checkpoint declares (base model, quantization, maximum length).
  - A copy already staged at the same revision is verified against its manifest (file list, sizes and index
    hash; every file's hash with O(verify=full)) and left alone when intact. A damaged copy is reported and
    staged again.
  - With O(source), the copy comes from another node that staged it (C(rsync) with resume over the fast link,
    as seed 002 copies its 71 GB checkpoint), and is verified against the source's manifest before it is moved
    into place.
  - With O(endpoint) the hub is a mirror (C(HF_ENDPOINT)); when neither can be reached and nothing is staged the
    module fails naming the repo and the missing files.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  repo:
    description: Hugging Face repo id, owner/name.
    type: str
    required: true
  revision:
    description: Commit hash (40 hex digits). A branch or tag is refused unless O(allow_branch).
    type: str
    required: true
  allow_branch:
    description: Accept a revision that is not a commit hash (it can move, like a floating image tag).
    type: bool
    default: false
  name:
    description: Directory under O(models_dir); defaults to the repo's name.
    type: str
  models_dir:
    description: The host's model root, mounted at C(/models) in serving containers.
    type: path
    default: /srv/models
  include:
    description: Glob patterns of the files to download; all files when empty.
    type: list
    elements: str
    default: []
  image:
    description: The pinned vLLM image whose C(hf) CLI downloads.
    type: str
    required: true
  endpoint:
    description: Hub or mirror base URL (C(HF_ENDPOINT)); empty uses the Hugging Face Hub.
    type: str
    default: ""
  source:
    description:
      - rsync URL of the same checkpoint staged on another node, for example
        C(rsync://10.0.0.1:8873/sparkfleet-models/gemma-4/). Empty downloads from the hub.
    type: str
    default: ""
  token:
    description: Hugging Face token for gated or private repos, passed as C(HF_TOKEN) in the environment. Never logged.
    type: str
    default: ""
  instruction_tuned:
    description: Whether the model is instruction-tuned, recorded in the manifest for the MTP drafter guard when the names mislead.
    type: bool
  verify:
    description: C(quick) checks the file list, sizes and the safetensors index hash; C(full) also every file's sha256.
    type: str
    choices: [quick, full]
    default: quick
attributes:
  check_mode:
    support: full
    details: Verifies a staged copy and reports whether it would be staged, without downloading.
  diff_mode:
    support: none
    details: Weights are not diffed.
  idempotent:
    support: full
    details: A checkpoint staged whole at its revision is not fetched again.
notes:
  - Needs the C(docker) command on the host and the image present or pullable.
"""

EXAMPLES = r"""
- name: Stage Gemma 4 26B-A4B NVFP4 and its MTP drafter
  sparkfleet.vllm.vllm_model_stage:
    repo: "{{ item.repo }}"
    revision: "{{ item.revision }}"
    image: "{{ vllm_image }}"
    token: "{{ vault_hf_token }}"
  loop:
    - {repo: nvidia/Gemma-4-26B-A4B-it-NVFP4, revision: 0123456789abcdef0123456789abcdef01234567}
    - {repo: google/gemma-4-26B-A4B-it-assistant, revision: 89abcdef0123456789abcdef0123456789abcdef}
"""

RETURN = r"""
ok:
  description: Whether it succeeded.
  returned: always
  type: bool
reasons:
  description: Why it failed; empty when it succeeded (the result shape every module of the collection shares).
  returned: always
  type: list
  elements: str
path:
  description: The staged directory.
  returned: always
  type: str
manifest:
  description:
    - The manifest of the staged copy, repo, revision, files with size and sha256, safetensors_index_sha256,
      base_model, quantization and max_position_embeddings.
  returned: when staged
  type: dict
damaged:
  description: What the verification found wrong with the copy that was there before.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_stage import StageFailure, stage_checkpoint


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            allow_branch=dict(type="bool", default=False),
            name=dict(type="str"),
            models_dir=dict(type="path", default="/srv/models"),
            include=dict(type="list", elements="str", default=[]),
            image=dict(type="str", required=True),
            endpoint=dict(type="str", default=""),
            token=dict(type="str", default="", no_log=True),
            verify=dict(type="str", choices=["quick", "full"], default="quick"),
            source=dict(type="str", default=""),
            instruction_tuned=dict(type="bool"),
        ),
        supports_check_mode=True,
    )
    try:
        result = stage_checkpoint(module, module.params)
    except StageFailure as failure:
        module.fail_json(msg=str(failure), **failure.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
