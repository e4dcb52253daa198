#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_release
short_description: Read the engine release a pulled image carries and refuse one below the security floor
version_added: 0.11.0
description:
  - Reads which vLLM or LiteLLM release an image on the host carries from its package metadata (the name of its
    C(<engine>-<version>.dist-info) folder), listed by C(find) in a throwaway container with no network, no capabilities
    and a read-only root. No Python starts in it, so nothing a package runs at interpreter start runs.
  - Records the release beside the image's ID in O(record_dir), so a later run reads the record instead of starting a
    container; a record of another shape or image is read again, never trusted.
  - Fails naming each advisory of the collection's floor table the release is below the fix of (vLLM below 0.24.0,
    LiteLLM below 1.84.0), unless O(accepted_advisories) names it; LiteLLM 1.82.7 and 1.82.8 (a compromised PyPI
    release) fail whatever is accepted. An image whose release cannot be read counts as below every floor of its engine.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  image:
    description: The image as the host runs it (by digest); it must be on the host already.
    type: str
    required: true
  engine:
    description: Which engine the image serves.
    type: str
    required: true
    choices: [vllm, litellm]
  accepted_advisories:
    description:
      - Advisory ids of the floor table the operator runs the image despite (C(vllm_accepted_advisories),
        C(gateway_accepted_advisories)); an id the table does not hold fails.
    type: list
    elements: str
    default: []
  record_dir:
    description: Where the releases read are recorded, one file per image ID.
    type: path
    default: /var/lib/sparkfleet/image-releases
  timeout:
    description: Seconds the throwaway container may take.
    type: int
    default: 120
attributes:
  check_mode:
    support: full
    details: Reads the release (a throwaway container changes nothing) and judges it; does not write the record.
  diff_mode:
    support: none
    details: The record holds only what the result returns.
  idempotent:
    support: full
    details: The record is written once per image.
notes:
  - The floor table, with each advisory's source, is C(plugins/module_utils/_image_release.py) and docs/serving.md.
"""

EXAMPLES = r"""
- name: Refuse a vLLM image below the security floor
  sparkfleet.vllm.image_release:
    image: vllm/vllm-openai@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    engine: vllm
    accepted_advisories: "{{ vllm_accepted_advisories }}"
"""

RETURN = r"""
versions:
  description: The releases of the engine the image carries (usually one; empty when none could be read).
  returned: always
  type: list
  elements: str
  sample: ["0.34.0"]
version:
  description: The release judged, the lowest of RV(versions); null when none could be read.
  returned: always
  type: str
  sample: "0.34.0"
image_id:
  description: The image's ID, which names the record.
  returned: always
  type: str
from_record:
  description: Whether the release came from the record of an earlier read.
  returned: always
  type: bool
acknowledged:
  description: The advisories the release is below the fix of that O(accepted_advisories) accepts.
  returned: always
  type: list
  elements: str
"""

import os
import subprocess

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem, read_file, write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT
from ansible_collections.sparkfleet.vllm.plugins.module_utils._image_release import (
    judge,
    parse_versions,
    probe_argv,
    record_path,
    record_text,
    recorded_versions,
)


def run(argv, timeout):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{argv[1]} {argv[2]} took longer than {timeout} s"
    except OSError as error:
        return None, f"{argv[0]}: {error.strerror}"
    if done.returncode != 0:
        return None, (done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"
    return done.stdout, None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            engine=dict(type="str", required=True, choices=["vllm", "litellm"]),
            accepted_advisories=dict(type="list", elements="str", default=[]),
            record_dir=dict(type="path", default="/var/lib/sparkfleet/image-releases"),
            timeout=dict(type="int", default=120),
        ),
        supports_check_mode=True,
    )
    image, engine, timeout = module.params["image"], module.params["engine"], module.params["timeout"]
    if not 1 <= timeout <= 3600:
        module.fail_json(msg=f"timeout: {timeout} must be 1 to 3600 seconds")
    inspected, error = run([DOCKER_CLIENT, "image", "inspect", "--format", "{{.Id}}", image], timeout)
    if error:
        module.fail_json(msg=f"image {image} could not be inspected, so its release is unread: {error}; pull it first")
    image_id = inspected.strip()
    path = record_path(image_id, module.params["record_dir"])
    try:
        recorded = read_file(path)
    except FileProblem as problem:
        module.fail_json(msg=f"the release record of {image}: {problem}")
    versions = recorded_versions(recorded[0], engine, image_id) if recorded else None
    from_record = versions is not None
    if not from_record:
        listing, error = run(probe_argv(image, engine), timeout)
        if error:
            module.fail_json(msg=f"the {engine} release in {image} could not be read: {error}")
        versions = parse_versions(listing, engine)
    verdict = judge(engine, versions, image, module.params["accepted_advisories"])
    result = dict(changed=False, versions=versions, version=versions[0] if versions else None, image_id=image_id,
                  from_record=from_record, acknowledged=verdict["acknowledged"])
    if verdict["problems"]:
        module.fail_json(msg=" | ".join(verdict["problems"]), **result)
    if not from_record:
        result["changed"] = True
        if not module.check_mode:
            try:
                os.makedirs(module.params["record_dir"], mode=0o755, exist_ok=True)
                write_atomically(path, record_text(engine, image_id, image, versions), 0o644)
            except OSError as problem:
                module.fail_json(msg=f"the release record {path} could not be written: {problem}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
