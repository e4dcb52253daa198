# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Staging a checkpoint on a host: what the vllm_model_stage module does, unit-tested on real files.

Private to the collection. A download goes through the ``hf`` CLI of the pinned vLLM image (the host
needs nothing but Docker) into ``<models_dir>/.partial-<name>``, a copy from another node through
rsync into the same folder; either moves to ``<models_dir>/<name>`` only when every file has
arrived, so an interrupted transfer never looks staged and the next run resumes it. The partial
folder remembers which repo and revision it holds, so a re-run for another revision starts afresh
instead of mixing two revisions' files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import (
    INDEX_FILES,
    MANIFEST,
    PARTIAL_PREFIX,
    hf_download_args,
    listing_bytes,
    listing_problems,
    manifest,
    model_facts,
    model_folder,
    parse_listing,
    read_json,
    read_text,
    validate_models,
    verify,
)

# Room a download must leave on the models disk beyond the checkpoint: the CLI's sizes are rounded to one decimal
# (at most 5 % off), and a disk filled to its last byte fails every other writer on it.
SIZE_MARGIN = 1.05
STAGE_HEADROOM_BYTES = 1024**3
GIB = 1024**3
EXPECTED = ".sparkfleet-expected.json"
TARGET = ".sparkfleet-target.json"
BOOKKEEPING = (MANIFEST, EXPECTED, TARGET, ".cache")
# Readable like the weights beside them: vllm_model_check and a peer node's rsync daemon read the manifest.
MODE = 0o644


class Host(t.Protocol):
    """What staging needs of the AnsibleModule running it: its commands and check mode."""

    check_mode: bool

    def get_bin_path(self, arg: str, required: bool = False) -> str: ...

    def run_command(self, args: list[str], environ_update: dict[str, str] | None = None) -> tuple[int, str, str]: ...

    def warn(self, warning: str) -> None: ...


class StageFailure(Exception):
    """Why nothing new is staged; ``result`` is the module's failure result beside the message."""

    def __init__(self, reason: str, reasons: list[str] | None = None, **result: t.Any) -> None:
        super().__init__(reason)
        self.result: dict[str, t.Any] = {"ok": False, "reasons": reasons or [reason], **result}


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def scan(directory: str, hash_all: bool) -> dict[str, dict[str, t.Any]]:
    """Each file under ``directory`` but the bookkeeping, with its size, and its sha256 for the index or with ``hash_all``."""
    found = {}
    for current, dirs, names in os.walk(directory):
        if current == directory:
            dirs[:] = [d for d in dirs if d not in BOOKKEEPING]
        for name in names:
            path = os.path.join(current, name)
            relative = os.path.relpath(path, directory)
            if relative in BOOKKEEPING:
                continue
            entry: dict[str, t.Any] = {"size": os.path.getsize(path)}
            if hash_all or relative in INDEX_FILES:
                entry["sha256"] = sha256(path)
            found[relative] = entry
    return found


def hf(host: Host, params: t.Mapping[str, t.Any], args: list[str], name: str) -> tuple[int, str, str]:
    """Run the image's hf CLI with the models folder mounted at /stage; the token only in the environment."""
    docker = host.get_bin_path("docker", required=True)
    command = [docker, "run", "--rm", "--name", f"sparkfleet-stage-{name}", "--network", "host",
               "--env", "HF_HUB_OFFLINE=0", "--env", "HF_HUB_DISABLE_TELEMETRY=1",
               "--volume", f"{params['models_dir']}:/stage", "--entrypoint", "hf"]
    environment = {}
    if params["endpoint"]:
        command += ["--env", f"HF_ENDPOINT={params['endpoint']}"]
    if params["token"]:
        command += ["--env", "HF_TOKEN"]
        environment["HF_TOKEN"] = params["token"]
    return host.run_command(command + [params["image"], *args], environ_update=environment)


def last_error(out: str, err: str) -> str:
    """The line of a command's output that says what went wrong, else the end of what it printed."""
    lines = [line.strip() for line in (err + "\n" + out).splitlines() if "rror" in line or "refused" in line or "not found" in line.lower()]
    return lines[-1] if lines else (err or out).strip()[-300:]


def start_partial(partial: str, target: dict[str, str]) -> None:
    """Keep a partial folder of the same repo and revision to resume it; another one is removed."""
    marker = os.path.join(partial, TARGET)
    if os.path.isdir(partial) and read_json(marker) != target:
        shutil.rmtree(partial)
    os.makedirs(partial, exist_ok=True)
    write_atomically(marker, json.dumps(target), MODE)


def move_into_place(models_dir: str, name: str, dest: str, partial: str) -> None:
    for leftover in (EXPECTED, ".cache", TARGET):
        path = os.path.join(partial, leftover)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)
    old = os.path.join(models_dir, f".old-{name}")
    if os.path.exists(dest):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dest, old)
    os.rename(partial, dest)
    shutil.rmtree(old, ignore_errors=True)


def rsync_transfer_bytes(stats: str) -> int | None:
    """The bytes `rsync --stats` says it transfers ("Total transferred file size: 1,234 bytes"); None when it says not."""
    found = re.search(r"^Total transferred file size: ([0-9,]+) bytes", stats, re.MULTILINE)
    return int(found[1].replace(",", "")) if found else None


def copy_from_source(host: Host, params: t.Mapping[str, t.Any], name: str, dest: str, partial: str) -> dict[str, t.Any]:
    """rsync the source node's staged copy, resumable, then check it against the source's manifest."""
    rsync = host.get_bin_path("rsync", required=True)
    argv = [rsync, "--archive", "--partial", "--delete", "--timeout=60", "--contimeout=10", f"--exclude=/{TARGET}",
            params["source"].rstrip("/") + "/", partial + "/"]
    # rsync's own count of what it would send (files already in the partial folder left out): refused before a byte is.
    rc, out, _err = host.run_command([*argv[:1], "--dry-run", "--stats", *argv[1:]])
    if rc == 0:
        room_for_download(params, rsync_transfer_bytes(out), partial, dest, held=0)
    start_partial(partial, {"repo": params["repo"], "revision": params["revision"]})
    rc, out, err = host.run_command(argv)
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
    move_into_place(params["models_dir"], name, dest, partial)
    return recorded


def room_for_download(params: t.Mapping[str, t.Any], listed: int | None, partial: str, dest: str, held: int | None = None) -> None:
    """Refuse a transfer the models disk cannot hold, before a byte is written: the listed size, less what the partial
    folder already holds (``held``, counted there when not given), with SIZE_MARGIN and STAGE_HEADROOM_BYTES to spare. A
    listing without sizes is let through."""
    if listed is None:
        return
    if held is None:
        held = sum(entry["size"] for entry in scan(partial, False).values()) if os.path.isdir(partial) else 0
    needed = max(listed - held, 0) * SIZE_MARGIN + STAGE_HEADROOM_BYTES
    # The folder itself, or the nearest one that exists: the download creates what is missing on that filesystem.
    folder = params["models_dir"]
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    if free < needed:
        raise StageFailure(
            f"{params['repo']} at {params['revision']} needs {needed / GIB:.2f} GiB at {params['models_dir']} ({listed / GIB:.2f} GiB "
            f"listed, {held / GIB:.2f} GiB already there, with room to spare) and only {free / GIB:.2f} GiB is free; nothing is "
            f"staged at {dest}. Free that disk (the preflight report names /var/tmp and Docker's reclaimable space) or set "
            "vllm_models_dir to a larger one"
        )


def download(host: Host, params: t.Mapping[str, t.Any], name: str, dest: str, partial: str) -> dict[str, t.Any]:
    """List the files at the revision, download them with hf (which resumes its own partial files), record the manifest."""
    target = {"repo": params["repo"], "revision": params["revision"]}
    marker = os.path.join(partial, TARGET)
    expected_path = os.path.join(partial, EXPECTED)
    rc, out, err = hf(host, params, hf_download_args(params["repo"], params["revision"], "", params["include"], dry_run=True), name)
    if rc != 0:
        # The listing an interrupted run saved says what is still missing when the hub cannot tell.
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
    room_for_download(params, listing_bytes(out), partial, dest)
    start_partial(partial, target)
    write_atomically(expected_path, json.dumps(listing), MODE)
    rc, out, err = hf(host, params, hf_download_args(params["repo"], params["revision"], f"/stage/{PARTIAL_PREFIX}{name}", params["include"]), name)
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
    write_atomically(os.path.join(partial, MANIFEST), json.dumps(recorded, indent=1, sort_keys=True), MODE)
    move_into_place(params["models_dir"], name, dest, partial)
    return recorded


def stage_checkpoint(host: Host, params: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The vllm_model_stage result for the module's ``params``; StageFailure, with its failure result, when nothing new is staged.

    A copy already staged at the revision is verified against its manifest and left alone when
    intact; a damaged one is named (also as a warning) and staged again.
    """
    name = model_folder(params)
    entry = {"repo": params["repo"], "revision": params["revision"], "name": name, "include": params["include"]}
    errors = [e.replace("model[0]", "model") for e in validate_models("model", [entry], params["allow_branch"])]
    if errors:
        raise StageFailure("vllm_model_stage refused: " + "; ".join(errors), reasons=errors)
    dest = os.path.join(params["models_dir"], name)
    partial = os.path.join(params["models_dir"], PARTIAL_PREFIX + name)
    damaged: list[str] = []
    try:
        recorded = read_json(os.path.join(dest, MANIFEST))
        if recorded is not None and not isinstance(recorded, dict):
            damaged = [f"{MANIFEST} does not hold a manifest object"]
        elif recorded and (recorded.get("repo"), recorded.get("revision")) == (params["repo"], params["revision"]):
            damaged = verify(recorded, scan(dest, params["verify"] == "full"), params["verify"] == "full")
            if not damaged:
                return {"changed": False, "ok": True, "reasons": [], "path": dest, "manifest": recorded, "damaged": []}
        if damaged:
            host.warn(f"{params['repo']} in {dest} is damaged ({'; '.join(damaged)}); staging it again")
        if host.check_mode:
            return {"changed": True, "ok": True, "reasons": [], "path": dest, "damaged": damaged}
        if params["source"]:
            recorded = copy_from_source(host, params, name, dest, partial)
        else:
            recorded = download(host, params, name, dest, partial)
    except StageFailure as failure:
        raise StageFailure(str(failure), path=dest, damaged=damaged) from failure
    except OSError as error:
        reason = (f"{error.filename or params['models_dir']}: {error.strerror or error}; models_dir ({params['models_dir']}) must be "
                  "writable by the task's user (become: true) and have room for the checkpoint")
        raise StageFailure(reason, path=dest, damaged=damaged) from error
    return {"changed": True, "ok": True, "reasons": [], "path": dest, "manifest": recorded, "damaged": damaged}
