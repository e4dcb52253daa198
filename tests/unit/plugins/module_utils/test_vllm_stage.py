"""Staging a checkpoint on real files: downloads from the lab's Hub mirror (lab/hf_mirror.py) on a local port
through a docker stand-in that speaks to it as hf download does, copies from a local rsync daemon, damage
found and restaged, an interrupted download kept and resumed, an unreachable hub named."""

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_stage import StageFailure, scan, stage_checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[4]
STAND_IN = pathlib.Path(__file__).with_name("docker_hf_stand_in.py")
REPO = "acme/tiny-chat-it"
COMMIT = hashlib.sha1(REPO.encode()).hexdigest()
OTHER = hashlib.sha1(b"another revision").hexdigest()
WEIGHTS = bytes(range(256)) * 400
FILES = {
    "config.json": json.dumps({"architectures": ["TinyForCausalLM"], "max_position_embeddings": 4096}),
    "README.md": "---\nbase_model: acme/tiny-7b-it\n---\nA tiny chat model.\n",
    "tokenizer.json": json.dumps({"model": {"vocab": {str(i): i for i in range(300)}}}),
    "model.safetensors": WEIGHTS,
}

spec = importlib.util.spec_from_file_location("hf_mirror", ROOT / "lab" / "hf_mirror.py")
hf_mirror = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hf_mirror)


class Mirror(hf_mirror.Mirror):
    """The lab mirror, recording each request and dropping the connection mid-file where a test asks."""

    def log_message(self, *_args):
        pass

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.server.requests.append((self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization")))
        super().do_GET()

    def send_file(self, repo, commit, relative, full):
        cut = self.server.cuts.pop(relative, None) if self.command == "GET" else None
        if cut is None:
            return super().send_file(repo, commit, relative, full)
        with open(full, "rb") as handle:
            content = handle.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content[:cut])
        self.close_connection = True
        return None


@pytest.fixture
def hub(tmp_path):
    """The mirror serving REPO at COMMIT: ``url``, ``requests`` seen and ``cuts`` (file -> bytes sent before hanging up)."""
    root = tmp_path / "hub"
    for relative, content in FILES.items():
        path = root / REPO / COMMIT / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    handler = type("RootedMirror", (Mirror,), {"root": str(root)})
    with hf_mirror.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        server.requests, server.cuts = [], {}
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        server.root = root / REPO / COMMIT
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        yield server
        server.shutdown()
        thread.join()


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Host:
    """The module's side, as AnsibleModule gives it: commands found on PATH (the docker stand-in first), run, warnings kept."""

    def __init__(self, folder, check_mode=False):
        self.check_mode = check_mode
        self.warnings = []
        self.log = folder / "docker-calls.jsonl"
        binaries = folder / "bin"
        binaries.mkdir(exist_ok=True)
        (binaries / "docker").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STAND_IN}" "$@"\n')
        (binaries / "docker").chmod(0o755)
        self.path = f"{binaries}{os.pathsep}{os.environ.get('PATH', '')}"

    def get_bin_path(self, arg, required=False):
        found = shutil.which(arg, path=self.path)
        assert found or not required, f"{arg} is not on PATH"
        return found

    def run_command(self, args, environ_update=None):
        environment = {**os.environ, "PATH": self.path, "STAND_IN_LOG": str(self.log), **(environ_update or {})}
        done = subprocess.run(args, env=environment, capture_output=True, text=True, timeout=60, check=False)
        return done.returncode, done.stdout, done.stderr

    def warn(self, warning):
        self.warnings.append(warning)

    def calls(self):
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def params(models, endpoint, **options):
    return {"repo": REPO, "revision": COMMIT, "allow_branch": False, "name": None, "models_dir": str(models), "include": [],
            "image": "vllm/vllm-openai:v0.32.0", "endpoint": endpoint, "token": "", "verify": "quick", "source": "",
            "instruction_tuned": None, **options}


def tree(folder):
    """Every path under ``folder`` with its size, mode and modification time: what "left alone" compares."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mode, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def staged(tmp_path, host, hub, **options):
    return stage_checkpoint(host, params(tmp_path / "models", options.pop("endpoint", hub.url), **options))


def test_a_checkpoint_is_staged_with_its_manifest_and_nothing_half_done_is_left(tmp_path, host, hub):
    result = staged(tmp_path, host, hub)
    dest = tmp_path / "models" / "tiny-chat-it"
    assert result["changed"] and result["ok"] and result["path"] == str(dest) and result["damaged"] == []
    written = (dest / ".sparkfleet-manifest.json").read_text()
    assert json.loads(written) == result["manifest"] and written == json.dumps(result["manifest"], indent=1, sort_keys=True)
    assert stat.S_IMODE((dest / ".sparkfleet-manifest.json").stat().st_mode) == 0o644
    recorded = result["manifest"]
    assert (recorded["repo"], recorded["revision"], recorded["base_model"], recorded["max_position_embeddings"]) == (REPO, COMMIT, "acme/tiny-7b-it", 4096)
    for relative, content in FILES.items():
        data = content if isinstance(content, bytes) else content.encode()
        assert (dest / relative).read_bytes() == data
        assert recorded["files"][relative] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert sorted(os.listdir(dest)) == sorted([*FILES, ".sparkfleet-manifest.json"])
    assert os.listdir(tmp_path / "models") == ["tiny-chat-it"]


def test_a_copy_at_the_same_revision_is_left_alone(tmp_path, host, hub):
    first = staged(tmp_path, host, hub)
    before, calls = tree(tmp_path / "models"), len(host.calls())
    again = staged(tmp_path, host, hub, verify="full")
    assert again == {"changed": False, "ok": True, "reasons": [], "path": first["path"], "manifest": first["manifest"], "damaged": []}
    assert tree(tmp_path / "models") == before and len(host.calls()) == calls and host.warnings == []


def test_an_unreachable_endpoint_names_the_repo_and_the_missing_files(tmp_path, host):
    endpoint = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StageFailure) as failure:
        stage_checkpoint(host, params(tmp_path / "models", endpoint, name="never-staged"))
    message = str(failure.value)
    for fragment in (f"cannot reach {endpoint} for {REPO} at {COMMIT}", "Connection refused",
                     f"nothing is staged at {tmp_path}/models/never-staged", "Missing: config.json, the weights (file list unknown)",
                     "Give a reachable mirror in vllm_models_endpoint"):
        assert fragment in message, message
    assert failure.value.result == {"ok": False, "reasons": [message], "path": f"{tmp_path}/models/never-staged", "damaged": []}
    assert not (tmp_path / "models").exists()


def test_an_interrupted_download_is_never_staged_and_the_next_run_resumes_it(tmp_path, host, hub):
    hub.cuts["model.safetensors"] = 40000
    dest, partial = tmp_path / "models" / "tiny-chat-it", tmp_path / "models" / ".partial-tiny-chat-it"
    with pytest.raises(StageFailure) as failure:
        staged(tmp_path, host, hub)
    message = str(failure.value)
    assert f"nothing new is staged at {dest}. Missing: model.safetensors. A re-run resumes the download" in message
    assert "Consistency check failed: file should be of size 102400 but has size 40000" in message
    assert not dest.exists()
    assert (partial / ".cache" / "huggingface" / "download" / "model.safetensors.incomplete").stat().st_size == 40000
    with pytest.raises(StageFailure) as offline:
        staged(tmp_path, host, hub, endpoint=f"http://127.0.0.1:{free_port()}")
    assert "Missing: model.safetensors. Give a reachable mirror" in str(offline.value), "the listing the first run saved names what is missing"
    resumed = staged(tmp_path, host, hub)
    assert resumed["changed"] and (dest / "model.safetensors").read_bytes() == WEIGHTS and not partial.exists()
    weights = [r for r in hub.requests if r[0] == "GET" and r[1].endswith("/model.safetensors")]
    assert [r[2] for r in weights] == [None, "bytes=40000-"]
    assert len([r for r in hub.requests if r[0] == "GET" and r[1].endswith("/config.json")]) == 1, "a file that arrived is kept"


def test_a_partial_folder_of_another_revision_is_started_afresh(tmp_path, host, hub):
    partial = tmp_path / "models" / ".partial-tiny-chat-it"
    partial.mkdir(parents=True)
    (partial / ".sparkfleet-target.json").write_text(json.dumps({"repo": REPO, "revision": OTHER}))
    (partial / "config.json").write_text('{"from": "the other revision"}')
    result = staged(tmp_path, host, hub)
    assert json.loads((tmp_path / "models" / "tiny-chat-it" / "config.json").read_text()) == json.loads(FILES["config.json"])
    assert result["manifest"]["files"]["config.json"]["size"] == len(FILES["config.json"])


def test_a_damaged_file_is_found_and_staged_again(tmp_path, host, hub):
    staged(tmp_path, host, hub)
    tokenizer = tmp_path / "models" / "tiny-chat-it" / "tokenizer.json"
    os.truncate(tokenizer, 100)
    result = staged(tmp_path, host, hub)
    damage = f"tokenizer.json has 100 bytes, the manifest {len(FILES['tokenizer.json'])}"
    assert result["changed"] and result["damaged"] == [damage]
    assert host.warnings == [f"{REPO} in {tmp_path}/models/tiny-chat-it is damaged ({damage}); staging it again"]
    assert tokenizer.read_text() == FILES["tokenizer.json"]
    assert os.listdir(tmp_path / "models") == ["tiny-chat-it"]


def test_same_size_damage_is_found_by_the_full_check_only(tmp_path, host, hub):
    staged(tmp_path, host, hub)
    weights = tmp_path / "models" / "tiny-chat-it" / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.seek(5000)
        handle.write(b"X")
    assert staged(tmp_path, host, hub)["changed"] is False
    full = staged(tmp_path, host, hub, verify="full")
    assert full["changed"] and full["damaged"] == ["model.safetensors differs from the manifest (sha256)"]
    assert weights.read_bytes() == WEIGHTS


def test_check_mode_reports_the_damage_and_downloads_nothing(tmp_path, host, hub):
    staged(tmp_path, host, hub)
    os.unlink(tmp_path / "models" / "tiny-chat-it" / "README.md")
    before, requests = tree(tmp_path / "models"), len(hub.requests)
    host.check_mode = True
    result = staged(tmp_path, host, hub)
    assert result == {"changed": True, "ok": True, "reasons": [], "path": f"{tmp_path}/models/tiny-chat-it", "damaged": ["README.md is missing"]}
    assert tree(tmp_path / "models") == before and len(hub.requests) == requests


def test_a_manifest_that_is_no_object_is_damage_and_the_copy_is_staged_again(tmp_path, host, hub):
    staged(tmp_path, host, hub)
    (tmp_path / "models" / "tiny-chat-it" / ".sparkfleet-manifest.json").write_text("[1]")
    result = staged(tmp_path, host, hub)
    assert result["damaged"] == [".sparkfleet-manifest.json does not hold a manifest object"]
    assert result["manifest"]["repo"] == REPO


def test_the_token_reaches_the_hub_in_the_environment_never_in_argv(tmp_path, host, hub):
    token = "hf_" + "t" * 34
    staged(tmp_path, host, hub, token=token, include=["*.json", "*.safetensors"])
    assert all(token not in " ".join(call) for call in host.calls())
    assert {r[3] for r in hub.requests} == {f"Bearer {token}"}
    staged_files = sorted(os.listdir(tmp_path / "models" / "tiny-chat-it"))
    assert staged_files == [".sparkfleet-manifest.json", "config.json", "model.safetensors", "tokenizer.json"]


def test_a_models_dir_that_cannot_be_written_is_named(tmp_path, host, hub):
    (tmp_path / "models").write_text("a file where the folder should be")
    with pytest.raises(StageFailure) as failure:
        staged(tmp_path, host, hub)
    assert str(failure.value).startswith(f"{tmp_path}/models")
    assert f"; models_dir ({tmp_path}/models) must be writable by the task's user (become: true)" in str(failure.value)
    assert failure.value.result["path"] == f"{tmp_path}/models/tiny-chat-it"


def test_a_branch_is_refused_before_anything_runs(tmp_path, host, hub):
    with pytest.raises(StageFailure) as failure:
        staged(tmp_path, host, hub, revision="main")
    assert str(failure.value).startswith(f"vllm_model_stage refused: model ({REPO}).revision: 'main' is not a commit hash")
    assert failure.value.result == {"ok": False, "reasons": [str(failure.value)[len("vllm_model_stage refused: "):]]}
    assert host.calls() == [] and not (tmp_path / "models").exists()


def test_scan_skips_the_bookkeeping_and_hashes_the_index(tmp_path):
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "x.incomplete").write_bytes(b"half")
    (tmp_path / ".sparkfleet-target.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "weights.safetensors").write_bytes(b"abc")
    assert scan(str(tmp_path), False) == {"model.safetensors.index.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
                                          "sub/weights.safetensors": {"size": 3}}


@pytest.fixture
def rsync_daemon(tmp_path):
    """An rsync daemon on a local port sharing ``source/`` as module ``models``, as a source node's rsyncd does."""
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed")
    shared = tmp_path / "source"
    shared.mkdir()
    config = tmp_path / "rsyncd.conf"
    config.write_text(f"use chroot = false\nuid = {os.getuid()}\ngid = {os.getgid()}\npid file = {tmp_path}/rsyncd.pid\n"
                      f"[models]\npath = {shared}\nread only = true\n")
    port = free_port()
    daemon = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={config}", "--address=127.0.0.1", f"--port={port}",
                               f"--log-file={tmp_path}/rsyncd.log"])
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and daemon.poll() is None, "the rsync daemon did not start"
            time.sleep(0.05)
    yield shared, f"rsync://127.0.0.1:{port}/models"
    daemon.terminate()
    daemon.wait(timeout=10)


def test_a_copy_from_the_source_node_is_verified_and_moved_into_place(tmp_path, host, hub, rsync_daemon):
    shared, url = rsync_daemon
    source = stage_checkpoint(host, params(shared, hub.url))
    requests = len(hub.requests)
    result = stage_checkpoint(host, params(tmp_path / "peer", "", source=f"{url}/tiny-chat-it/"))
    assert result["changed"] and result["manifest"] == source["manifest"] and len(hub.requests) == requests
    copied = tmp_path / "peer" / "tiny-chat-it"
    assert (copied / ".sparkfleet-manifest.json").read_bytes() == (shared / "tiny-chat-it" / ".sparkfleet-manifest.json").read_bytes()
    assert sorted(os.listdir(copied)) == sorted([*FILES, ".sparkfleet-manifest.json"]) and os.listdir(tmp_path / "peer") == ["tiny-chat-it"]
    again = stage_checkpoint(host, params(tmp_path / "peer", "", source=f"{url}/tiny-chat-it"))
    assert again["changed"] is False


def test_a_source_holding_another_revision_or_a_damaged_copy_is_refused(tmp_path, host, hub, rsync_daemon):
    shared, url = rsync_daemon
    stage_checkpoint(host, params(shared, hub.url))
    with pytest.raises(StageFailure) as other:
        stage_checkpoint(host, params(tmp_path / "peer", "", revision=OTHER, source=f"{url}/tiny-chat-it"))
    assert str(other.value) == (f"{url}/tiny-chat-it holds {REPO} at {COMMIT}, not {REPO} at {OTHER}; stage it on the source node first "
                                f"(vllm_models_source), nothing new is staged at {tmp_path}/peer/tiny-chat-it")
    os.truncate(shared / "tiny-chat-it" / "config.json", 3)
    with pytest.raises(StageFailure) as damaged:
        stage_checkpoint(host, params(tmp_path / "peer", "", source=f"{url}/tiny-chat-it"))
    assert str(damaged.value) == (f"the copy of {REPO} from {url}/tiny-chat-it does not match its manifest: config.json has 3 bytes, "
                                  f"the manifest {len(FILES['config.json'])}")
    assert not (tmp_path / "peer" / "tiny-chat-it").exists()


def test_a_source_that_does_not_answer_names_the_copy_and_keeps_the_partial_folder(tmp_path, host, rsync_daemon):
    _shared, url = rsync_daemon
    with pytest.raises(StageFailure) as failure:
        stage_checkpoint(host, params(tmp_path / "peer", "", source=f"{url}/not-staged/"))
    message = str(failure.value)
    assert message.startswith(f"copying {REPO} from {url}/not-staged/ failed (")
    assert message.endswith(f"nothing new is staged at {tmp_path}/peer/tiny-chat-it. Missing: the source's file list is unknown. "
                            "A re-run resumes the copy")
    assert (tmp_path / "peer" / ".partial-tiny-chat-it").is_dir()


@pytest.fixture
def small_disk(tmp_path):
    """A real 64 MiB filesystem (tmpfs) for the models folder, unmounted afterwards."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount_point)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here ({mounted.stderr.strip()}); the suite's machine runs it as root")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_download_the_models_disk_cannot_hold_is_refused_before_a_byte_is_written(small_disk, host, hub):
    with pytest.raises(StageFailure) as failure:
        stage_checkpoint(host, params(small_disk, hub.url))
    message = str(failure.value)
    assert f"{REPO} at {COMMIT} needs 1.00 GiB at {small_disk}" in message and "and only 0.06 GiB is free" in message, message
    assert "set vllm_models_dir to a larger one" in message and "/var/tmp" in message
    assert os.listdir(small_disk) == [], "nothing was written"
    # Only the listing ran: no file was asked for.
    assert [call for call in host.calls() if "--dry-run" not in call] == []


def test_a_copy_the_models_disk_cannot_hold_is_refused_before_a_byte_is_written(tmp_path, small_disk, host, hub, rsync_daemon):
    shared, url = rsync_daemon
    stage_checkpoint(host, params(shared, hub.url))
    with pytest.raises(StageFailure) as failure:
        stage_checkpoint(host, params(small_disk, "", source=f"{url}/tiny-chat-it/"))
    message = str(failure.value)
    # rsync's own count of what it would send: the files and the manifest, no more.
    sent = sum(path.stat().st_size for path in (shared / "tiny-chat-it").iterdir())
    assert f"({sent / 2**30:.2f} GiB listed, 0.00 GiB already there" in message and "and only 0.06 GiB is free" in message, message
    assert os.listdir(small_disk) == [], "nothing was written"
