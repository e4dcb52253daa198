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
    description: Verifies a staged copy and reports whether it would be staged, without downloading.
  diff_mode:
    support: none
    description: Weights are not diffed.
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

import hashlib
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import (
    INDEX_FILES,
    MANIFEST,
    PARTIAL_PREFIX,
    default_name,
    hf_download_args,
    listing_problems,
    manifest,
    model_facts,
    parse_listing,
    read_json,
    read_text,
    validate_models,
    verify,
)

EXPECTED = ".sparkfleet-expected.json"
TARGET = ".sparkfleet-target.json"
BOOKKEEPING = (MANIFEST, EXPECTED, TARGET, ".cache")


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def scan(directory, hash_all):
    found = {}
    for current, dirs, names in os.walk(directory):
        if current == directory:
            dirs[:] = [d for d in dirs if d not in BOOKKEEPING]
        for name in names:
            path = os.path.join(current, name)
            relative = os.path.relpath(path, directory)
            if relative in BOOKKEEPING:
                continue
            entry = {"size": os.path.getsize(path)}
            if hash_all or relative in INDEX_FILES:
                entry["sha256"] = sha256(path)
            found[relative] = entry
    return found


class StageFailure(Exception):
    pass


def hf(module, params, args, name):
    docker = module.get_bin_path("docker", required=True)
    command = [docker, "run", "--rm", "--name", f"sparkfleet-stage-{name}", "--network", "host",
               "--env", "HF_HUB_OFFLINE=0", "--env", "HF_HUB_DISABLE_TELEMETRY=1",
               "--volume", f"{params['models_dir']}:/stage", "--entrypoint", "hf"]
    environment = {}
    if params["endpoint"]:
        command += ["--env", f"HF_ENDPOINT={params['endpoint']}"]
    if params["token"]:
        command += ["--env", "HF_TOKEN"]
        environment["HF_TOKEN"] = params["token"]
    rc, out, err = module.run_command(command + [params["image"], *args], environ_update=environment)
    return rc, out, err


def last_error(out, err):
    lines = [line.strip() for line in (err + "\n" + out).splitlines() if "rror" in line or "refused" in line or "not found" in line.lower()]
    return lines[-1] if lines else (err or out).strip()[-300:]


def start_partial(partial, target):
    marker = os.path.join(partial, TARGET)
    if os.path.isdir(partial) and read_json(marker) != target:
        shutil.rmtree(partial)
    os.makedirs(partial, exist_ok=True)
    with open(marker, "w", encoding="utf-8") as handle:
        json.dump(target, handle)


def move_into_place(params, name, dest, partial):
    for leftover in (EXPECTED, ".cache", TARGET):
        path = os.path.join(partial, leftover)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)
    old = os.path.join(params["models_dir"], f".old-{name}")
    if os.path.exists(dest):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dest, old)
    os.rename(partial, dest)
    shutil.rmtree(old, ignore_errors=True)


def copy_from_source(module, params, name, dest, partial):
    """rsync the source node's staged copy, resumable, then check it against the source's manifest."""
    rsync = module.get_bin_path("rsync", required=True)
    start_partial(partial, {"repo": params["repo"], "revision": params["revision"]})
    rc, out, err = module.run_command([
        rsync, "--archive", "--partial", "--delete", "--timeout=60", "--contimeout=10", f"--exclude=/{TARGET}",
        params["source"].rstrip("/") + "/", partial + "/",
    ])
    recorded = read_json(os.path.join(partial, MANIFEST))
    if not isinstance(recorded, dict) or not isinstance(recorded.get("files"), dict):
        recorded = None
    if rc != 0:
        missing = sorted(set((recorded or {}).get("files", {})) - set(scan(partial, False))) or ["the source's file list is unknown"]
        raise StageFailure(
            f"copying {params['repo']} from {params['source']} failed ({last_error(out, err)}); nothing new is staged at {dest}. "
            f"Missing: {', '.join(missing)}. A re-run resumes the copy"
        )
    if not recorded or (recorded.get("repo"), recorded.get("revision")) != (params["repo"], params["revision"]):
        found = f"{recorded.get('repo')} at {recorded.get('revision')}" if recorded else "no staged copy"
        raise StageFailure(
            f"{params['source']} holds {found}, not {params['repo']} at {params['revision']}; stage it on the source node first "
            "(vllm_models_source), nothing new is staged at " + dest
        )
    damage = verify(recorded, scan(partial, params["verify"] == "full"), params["verify"] == "full")
    if damage:
        raise StageFailure(f"the copy of {params['repo']} from {params['source']} does not match its manifest: {'; '.join(damage)}")
    move_into_place(params, name, dest, partial)
    return recorded


def stage(module, params, name, dest, partial):
    target = {"repo": params["repo"], "revision": params["revision"]}
    marker = os.path.join(partial, TARGET)
    expected_path = os.path.join(partial, EXPECTED)
    rc, out, err = hf(module, params, hf_download_args(params["repo"], params["revision"], "", params["include"], dry_run=True), name)
    if rc != 0:
        listing = read_json(expected_path) if read_json(marker) == target else None
        known = isinstance(listing, list) and listing and all(isinstance(entry, str) for entry in listing)
        missing = listing_problems(listing, scan(partial, False)) if known else ["config.json", "the weights (file list unknown)"]
        raise StageFailure(
            f"cannot reach {params['endpoint'] or 'the Hugging Face Hub'} for {params['repo']} at {params['revision']} "
            f"({last_error(out, err)}); nothing is staged at {dest}. Missing: {', '.join(missing)}. "
            "Give a reachable mirror in vllm_models_endpoint, or stage the files by hand"
        )
    try:
        listing = parse_listing(out)
    except ValueError as error:
        raise StageFailure(
            f"listing {params['repo']} at {params['revision']} on {params['endpoint'] or 'the Hugging Face Hub'} failed: {error}; "
            f"nothing is staged at {dest}"
        ) from error
    start_partial(partial, target)
    with open(expected_path, "w", encoding="utf-8") as handle:
        json.dump(listing, handle)
    rc, out, err = hf(module, params, hf_download_args(params["repo"], params["revision"], f"/stage/{PARTIAL_PREFIX}{name}", params["include"]), name)
    present = scan(partial, True)
    missing = listing_problems(listing, present)
    if rc != 0 or missing:
        raise StageFailure(
            f"downloading {params['repo']} at {params['revision']} failed ({last_error(out, err)}); nothing new is staged at "
            f"{dest}. Missing: {', '.join(missing) or 'none, but hf reported an error'}. A re-run resumes the download"
        )
    facts = model_facts(read_json(os.path.join(partial, "config.json")) or {}, read_text(os.path.join(partial, "README.md")), params["repo"])
    recorded = manifest(params["repo"], params["revision"], present, facts)
    recorded["instruction_tuned_declared"] = params["instruction_tuned"]
    with open(os.path.join(partial, MANIFEST), "w", encoding="utf-8") as handle:
        json.dump(recorded, handle, indent=1, sort_keys=True)
    move_into_place(params, name, dest, partial)
    return recorded


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
    params = module.params
    name = params["name"] or default_name(params["repo"])
    entry = {"repo": params["repo"], "revision": params["revision"], "name": name, "include": params["include"]}
    errors = validate_models("model", [entry], params["allow_branch"])
    if errors:
        errors = [e.replace("model[0]", "model") for e in errors]
        module.fail_json(msg="vllm_model_stage refused: " + "; ".join(errors), ok=False, reasons=errors)
    dest = os.path.join(params["models_dir"], name)
    partial = os.path.join(params["models_dir"], PARTIAL_PREFIX + name)
    damaged = []
    try:
        recorded = read_json(os.path.join(dest, MANIFEST))
        if recorded is not None and not isinstance(recorded, dict):
            damaged = [f"{MANIFEST} does not hold a manifest object"]
        elif recorded and (recorded.get("repo"), recorded.get("revision")) == (params["repo"], params["revision"]):
            damaged = verify(recorded, scan(dest, params["verify"] == "full"), params["verify"] == "full")
            if not damaged:
                module.exit_json(changed=False, ok=True, reasons=[], path=dest, manifest=recorded, damaged=[])
        if damaged:
            module.warn(f"{params['repo']} in {dest} is damaged ({'; '.join(damaged)}); staging it again")
        if module.check_mode:
            module.exit_json(changed=True, ok=True, reasons=[], path=dest, damaged=damaged)
        if params["source"]:
            recorded = copy_from_source(module, params, name, dest, partial)
        else:
            recorded = stage(module, params, name, dest, partial)
    except StageFailure as error:
        module.fail_json(msg=str(error), ok=False, reasons=[str(error)], path=dest, damaged=damaged)
    except OSError as error:
        reason = (f"{error.filename or params['models_dir']}: {error.strerror or error}; models_dir ({params['models_dir']}) must be "
                  "writable by the task's user (become: true) and have room for the checkpoint")
        module.fail_json(msg=reason, ok=False, reasons=[reason], path=dest, damaged=damaged)
    module.exit_json(changed=True, ok=True, reasons=[], path=dest, manifest=recorded, damaged=damaged)


if __name__ == "__main__":
    main()
