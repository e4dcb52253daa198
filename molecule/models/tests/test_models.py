"""Staging checkpoints on a lab host from the lab's Hub-protocol mirror, through the same hf CLI path as a fleet."""

import hashlib
import json
import os
import subprocess
import time

import pytest
from site_runner import INVENTORY, ROOT, assert_refused, docker_host, module, site, state_digest

HOST = "sparkfleet-molecule-models"
PEER = "sparkfleet-molecule-models-peer"
CHAT = ("acme/tiny-chat-it", hashlib.sha1(b"acme/tiny-chat-it").hexdigest())
QUANTIZED = ("acme/tiny-NVFP4", hashlib.sha1(b"acme/tiny-NVFP4").hexdigest())
SLOW = ("acme/tiny-slow", hashlib.sha1(b"acme/tiny-slow").hexdigest())
KEY = os.environ["SPARKFLEET_LAB_API_KEY"]
MODELS = {"vllm_instances": [], "vllm_models_endpoint": "http://127.0.0.1:8765",
          "vllm_models": [{"repo": CHAT[0], "revision": CHAT[1]}, {"repo": QUANTIZED[0], "revision": QUANTIZED[1]}]}


@pytest.fixture(scope="module")
def host():
    return docker_host(HOST)


@pytest.fixture(scope="module")
def peer():
    return docker_host(PEER)


def manifest(host, name):
    return json.loads(host.file(f"/srv/models/{name}/.sparkfleet-manifest.json").content_string)


def models_state(host):
    return state_digest(host, [], [
        "find /srv/models -printf '%p %s %T@\\n' | sort",
        "ls -la /etc/sparkfleet/vllm /etc/systemd/system 2>&1",
    ])


def stage(name, repo, revision, **options):
    image = os.environ["SPARKFLEET_VLLM_IMAGE"]
    return module(HOST, "vllm_model_stage", dict({"repo": repo, "revision": revision, "image": image,
                                                  "endpoint": "http://127.0.0.1:8765", "name": name}, **options))


def test_checkpoints_staged_with_manifests(host):
    for (repo, revision), base in ((CHAT, "acme/tiny-7b-it"), (QUANTIZED, "acme/tiny-7b-pt")):
        name = repo.split("/")[1]
        recorded = manifest(host, name)
        assert (recorded["repo"], recorded["revision"], recorded["base_model"]) == (repo, revision, base)
        for path, entry in recorded["files"].items():
            staged = host.file(f"/srv/models/{name}/{path}")
            assert staged.size == entry["size"]
            assert staged.sha256sum == entry["sha256"]
        assert {"config.json", "model.safetensors", "README.md"} <= set(recorded["files"])
    assert host.run("ls -a /srv/models | grep -c -e '^.partial-' -e '^.old-'").stdout.strip() == "0"


def test_a_damaged_file_is_found_and_staged_again(host):
    host.run("truncate -s 100 /srv/models/tiny-chat-it/tokenizer.json")
    result = site("--tags", "vllm", "-e", json.dumps(MODELS), limit=HOST)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "tokenizer.json has 100 bytes, the manifest" in result.stdout + result.stderr
    assert host.file("/srv/models/tiny-chat-it/tokenizer.json").sha256sum == manifest(host, "tiny-chat-it")["files"]["tokenizer.json"]["sha256"]


def test_same_size_damage_needs_the_full_check(host):
    """The module the role's staging runs, called as the role calls it (vllm_models_verify is its verify option; the
    role's own run with damage is test_a_damaged_file_is_found_and_staged_again's)."""
    host.run("printf X | dd of=/srv/models/tiny-NVFP4/model.safetensors bs=1 seek=5000 conv=notrunc")
    quick = stage("tiny-NVFP4", *QUANTIZED)
    assert quick["changed"] is False and quick["damaged"] == [], quick
    full = stage("tiny-NVFP4", *QUANTIZED, verify="full")
    assert full.get("failed") is not True and full["changed"] is True, full.get("msg")
    assert any("model.safetensors differs from the manifest (sha256)" in problem for problem in full["damaged"]), full["damaged"]
    assert host.file("/srv/models/tiny-NVFP4/model.safetensors").sha256sum == manifest(host, "tiny-NVFP4")["files"]["model.safetensors"]["sha256"]


def test_an_interrupted_download_is_never_staged_and_resumes(host):
    image = os.environ["SPARKFLEET_VLLM_IMAGE"]
    args = {"repo": SLOW[0], "revision": SLOW[1], "image": image, "endpoint": "http://127.0.0.1:8766", "name": "tiny-slow"}
    environment = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    command = ["ansible", "-i", str(INVENTORY), HOST, "-m", "sparkfleet.vllm.vllm_model_stage", "-a", json.dumps(args)]
    running = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not host.file("/srv/models/.partial-tiny-slow/.cache/huggingface/download").exists:
            time.sleep(0.5)
        time.sleep(2)
        killed = host.run("docker kill sparkfleet-stage-tiny-slow")
        assert killed.rc == 0, killed.stderr
        stdout, _stderr = running.communicate(timeout=120)
    finally:
        if running.poll() is None:
            running.kill()
    interrupted = json.loads(stdout)["plays"][0]["tasks"][0]["hosts"][HOST]
    assert interrupted.get("failed") is True
    assert "nothing new is staged at /srv/models/tiny-slow" in interrupted["msg"]
    assert not host.file("/srv/models/tiny-slow").exists
    assert host.file("/srv/models/.partial-tiny-slow").is_directory
    resumed = module(HOST, "vllm_model_stage", args)
    assert resumed.get("failed") is not True, resumed.get("msg")
    assert host.file("/srv/models/tiny-slow/extra.safetensors").size == 4000000
    assert not host.file("/srv/models/.partial-tiny-slow").exists
    print(f"\ninterrupted transfer: killed after 2 s of body; the re-run staged {resumed['path']}")


def test_unreachable_hub_names_the_repo_and_the_missing_files(host):
    before = models_state(host)
    result = stage("never-staged", CHAT[0], CHAT[1], endpoint="http://127.0.0.1:8799")
    assert result.get("failed") is True
    for fragment in ("cannot reach http://127.0.0.1:8799 for acme/tiny-chat-it", "nothing is staged at /srv/models/never-staged",
                     "Missing: config.json"):
        assert fragment in result["msg"], result["msg"]
    assert models_state(host) == before


def test_a_staged_copy_at_the_same_revision_is_left_alone(host):
    before = models_state(host)
    result = stage("tiny-chat-it", *CHAT)
    assert result["changed"] is False and result["damaged"] == []
    assert models_state(host) == before


def test_launch_checks_refuse_before_any_change(host):
    """Both launch checks fail in one run, each naming its instance; the host is left as it was
    (the plan's own refusals need no host: tests/integration/test_static.py)."""
    before = models_state(host)
    drafter_on_base = {"name": "llm", "model": "/models/tiny-NVFP4", "served_model_names": ["llm"], "port": 8001, "api_key": KEY,
                       "speculative": {"method": "mtp", "num_speculative_tokens": 2, "model": "/models/tiny-chat-it"}}
    context_over_maximum = {"name": "long", "model": "/models/tiny-chat-it", "served_model_names": ["long"], "port": 8002, "api_key": KEY,
                            "max_model_len": 8192}
    result = site("--tags", "vllm", "-e", json.dumps(dict(MODELS, vllm_instances=[drafter_on_base, context_over_maximum])), limit=HOST)
    assert_refused(result, "mtp drafter on acme/tiny-7b-pt, which is not an instruction-tuned model", "38% slower",
                   "max_model_len: 8192 is more than the model's own maximum of 4096")
    assert models_state(host) == before


@pytest.mark.parametrize(
    ("args", "ok"),
    [
        ({"path": "/srv/models/tiny-chat-it", "speculative_method": "mtp"}, True),
        ({"path": "/srv/models/tiny-NVFP4", "speculative_method": "mtp"}, False),
        ({"path": "/srv/models/tiny-NVFP4", "speculative_method": "mtp", "allow_drafter_on_base_model": True}, True),
        ({"path": "/srv/models/tiny-NVFP4", "speculative_method": "mtp", "instruction_tuned": True}, True),
        ({"path": "/srv/models/tiny-NVFP4", "speculative_method": "ngram"}, True),
        ({"path": "/srv/models/tiny-NVFP4", "max_model_len": 4096}, True),
        ({"path": "/srv/models/not-there"}, False),
    ],
)
def test_launch_checks_on_real_checkpoints(host, args, ok):
    result = module(HOST, "vllm_model_check", dict(args, instance="llm"))
    assert (result.get("failed") is not True) is ok, result.get("msg")


def source_address():
    return subprocess.run(["docker", "inspect", "--format", "{{.NetworkSettings.IPAddress}}", HOST],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def peer_without_hub(peer):
    """The peer's own mirror stopped: a copy can only come from the source node."""
    peer.run("systemctl stop sparkfleet-lab-mirror-8765.service sparkfleet-lab-mirror-8766.service")
    yield peer
    peer.run("systemctl start sparkfleet-lab-mirror-8765.service sparkfleet-lab-mirror-8766.service")


def test_a_node_copies_the_source_nodes_checkpoints_over_rsync(host, peer_without_hub):
    peer = peer_without_hub
    peer.run("rm -rf /srv/models/tiny-chat-it /srv/models/tiny-NVFP4")
    distributed = dict(MODELS, vllm_models_source=HOST, vllm_models_source_address=source_address())
    result = site("--tags", "vllm", "-e", json.dumps(distributed))
    assert result.returncode == 0, result.stdout[-3000:]
    for name in ("tiny-chat-it", "tiny-NVFP4"):
        path = f"/srv/models/{name}/.sparkfleet-manifest.json"
        assert peer.file(path).content == host.file(path).content
        for relative, entry in manifest(peer, name)["files"].items():
            assert peer.file(f"/srv/models/{name}/{relative}").sha256sum == entry["sha256"]
    assert not peer.file("/srv/models/.partial-tiny-chat-it").exists
    assert host.service("sparkfleet-models-rsyncd.service").is_running
    # The daemon admits the nodes that copy from it, and no other host of the play (the source itself included).
    allowed = next(line for line in host.file("/etc/sparkfleet/models-rsyncd.conf").content_string.splitlines()
                   if line.startswith("hosts allow = ")).split(" = ", 1)[1].split()
    ipv4 = [address for address in peer.run("hostname -I").stdout.split() if "." in address]
    assert sorted(allowed) == sorted({*ipv4, "127.0.0.1"}), allowed
    again = site("--tags", "vllm", "-e", json.dumps(distributed))
    assert again.returncode == 0 and again.stdout.split("PLAY RECAP")[1].count("changed=0") == 2, again.stdout[-3000:]


def test_a_node_whose_copy_differs_from_the_source_is_refused(host, peer_without_hub):
    peer = peer_without_hub
    path = "/srv/models/tiny-NVFP4/.sparkfleet-manifest.json"
    edited = manifest(peer, "tiny-NVFP4")
    edited["note"] = "edited on this node"
    peer.run(f"cat > {path} <<'EOF'\n{json.dumps(edited)}\nEOF")
    distributed = dict(MODELS, vllm_models_source=HOST, vllm_models_source_address=source_address())
    result = site("--tags", "vllm", "-e", json.dumps(distributed))
    assert_refused(result, f"The staged checkpoints on {PEER} differ from those on {HOST}")


def test_a_source_without_its_address_is_refused_before_any_change(host, peer):
    """The fleet check refuses it in site.yml's first play: neither host changes."""
    before = models_state(host), models_state(peer)
    result = site("--tags", "vllm", "-e", json.dumps(dict(MODELS, vllm_models_source=HOST)))
    assert_refused(result, "vllm_models_source sparkfleet-molecule-models: give vllm_models_source_address", "nothing was changed on any host")
    assert (models_state(host), models_state(peer)) == before
