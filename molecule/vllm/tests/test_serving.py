"""A real CPU vLLM served by the vllm role on a lab host: gate, auth, pinning, rollback, guards, boot order.

Durations printed here (gate times, reboot recovery) are measurements, not pass/fail thresholds.
"""

import json
import os
import shlex
import subprocess
import time

import pytest
from serving_lab import INSTANCES, KEY, SERVE, container, instances_json, serving_state, status
from site_runner import assert_refused, docker_host, module, site


@pytest.fixture(scope="module")
def serve():
    return docker_host(SERVE)


@pytest.mark.parametrize(("name", "port", "model"), INSTANCES)
def test_endpoint_requires_the_key(serve, name, port, model):
    assert status(serve, port) == "401"
    assert status(serve, port, key="wrong-key-wrong-key-wrong") == "401"
    assert status(serve, port, key=KEY) == "200"
    listed = json.loads(serve.check_output(f"curl -s -H 'Authorization: Bearer {KEY}' http://127.0.0.1:{port}/v1/models"))
    assert [entry["id"] for entry in listed["data"]] == [model]


def post_status(host, port, path, body, key=None):
    auth = f"-H 'Authorization: Bearer {key}'" if key else ""
    return host.run(f"curl -s -o /dev/null -w '%{{http_code}}' -X POST {auth} -H 'Content-Type: application/json' "
                    f"-d '{json.dumps(body)}' http://127.0.0.1:{port}{path}").stdout.strip()


def test_routes_vllm_leaves_open_ask_for_the_key(serve):
    """vLLM's own key check guards only /v1, /v2, /inference and /cohere: /invocations runs a chat
    for anyone and /tokenize reads the template. The guard middleware asks for the key there; the
    development routes of the first instance (no dev mode) are absent even with the key, and the
    FastAPI docs are off."""
    chat = {"model": "tiny-first", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 5}
    assert post_status(serve, 8001, "/invocations", chat) == "401"
    assert post_status(serve, 8001, "/invocations", chat, key=KEY) == "200"
    assert post_status(serve, 8001, "/tokenize", {"model": "tiny-first", "prompt": "hello"}) == "401"
    for path in ("/server_info", "/docs", "/openapi.json"):
        assert status(serve, 8001, path) == "401" and status(serve, 8001, path, key=KEY) == "404", path
    assert post_status(serve, 8001, "/reset_prefix_cache", {}, key=KEY) == "404"
    # The second instance runs dev mode on loopback (vllm_allow_dev_mode): its routes need the key too.
    assert post_status(serve, 8002, "/reset_prefix_cache", {}) == "401"
    assert post_status(serve, 8002, "/reset_prefix_cache", {}, key=KEY) == "200"
    for path in ("/health", "/metrics", "/version"):
        assert status(serve, 8001, path) == "200", path
    # vLLM 0.34's sleep mode adds /checkpoint/* outside its own key check; the middleware guards them whatever the release
    # (the lab's 0.32 has no such route: with the key, 404).
    for path in ("/checkpoint/prepare", "/checkpoint/restore"):
        assert post_status(serve, 8001, path, {}) == "401" and post_status(serve, 8001, path, {}, key=KEY) == "404", path
    assert status(serve, 8001, "/checkpoint/status") == "401" and status(serve, 8001, "/checkpoint/status", key=KEY) == "404"


@pytest.mark.parametrize(("name", "port", "model"), INSTANCES)
def test_secret_only_in_the_root_only_env_file(serve, name, port, model):
    env = serve.file(f"/etc/sparkfleet/vllm/{name}.env")
    assert (env.user, env.group, env.mode) == ("root", "root", 0o600)
    assert f"VLLM_API_KEY={KEY}" in env.content_string
    assert KEY not in serve.file(f"/etc/sparkfleet/vllm/{name}.json").content_string
    assert KEY not in serve.file(f"/etc/systemd/system/sparkfleet-vllm-{name}.service").content_string
    assert KEY not in " ".join(container(serve, name)["Args"])


def test_container_runs_the_pinned_digest(serve):
    pinned = os.environ["SPARKFLEET_VLLM_IMAGE"]
    repository, digest = pinned.split("@")
    expected = repository.rsplit(":", 1)[0] + "@" + digest
    for name, _port, _model in INSTANCES:
        assert container(serve, name)["Config"]["Image"] == expected


def test_check_mode_on_the_serving_host_reports_no_change(serve):
    before = serving_state(serve)
    result = site("--check", "--diff", "--tags", "vllm", "-e", instances_json())
    assert result.returncode == 0, result.stdout[-3000:]
    assert "changed=0" in result.stdout.split("PLAY RECAP")[1]
    assert serving_state(serve) == before


def test_digest_mismatch_refused(serve):
    # The registry's tag "moved" first holds one image, then another: the pin names the first.
    registry_push = os.environ["SPARKFLEET_VLLM_IMAGE_LOCAL"].rsplit(":", 1)[0]
    lab_image = os.environ["SPARKFLEET_LAB_IMAGE"]
    base = os.environ["SPARKFLEET_VLLM_IMAGE_LOCAL"] + "-base"
    subprocess.run(["docker", "tag", base, f"{registry_push}:moved"], check=True)
    pushed = subprocess.run(["docker", "push", f"{registry_push}:moved"], check=True, capture_output=True, text=True).stdout
    first_digest = [line.split("digest: ")[1].split()[0] for line in pushed.splitlines() if "digest: " in line][0]
    subprocess.run(["docker", "tag", lab_image, f"{registry_push}:moved"], check=True)
    subprocess.run(["docker", "push", f"{registry_push}:moved"], check=True, capture_output=True)
    gateway = os.environ["SPARKFLEET_REGISTRY"]
    before = serving_state(serve)
    result = site("--tags", "vllm", "-e", json.dumps({**json.loads(instances_json()), "vllm_image": f"{gateway}/sparkfleet/vllm-cpu:moved@{first_digest}"}))
    assert_refused(result, "the tag moved to another image", first_digest)
    assert serving_state(serve) == before


def test_restarted_host_brings_both_back_in_order(serve):
    restarted = time.monotonic()
    subprocess.run(["docker", "restart", SERVE], check=True, capture_output=True)
    host = docker_host(SERVE)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if all(status(host, port, key=KEY) == "200" for _name, port, _model in INSTANCES):
            break
        time.sleep(3)
    print(f"\nhost restart: both instances serving {time.monotonic() - restarted:.0f} s after docker restart")
    for _name, port, _model in INSTANCES:
        assert status(host, port, key=KEY) == "200"

    def monotonic(unit, prop):
        return int(host.check_output(f"systemctl show --property={prop} --value sparkfleet-vllm-{unit}.service"))

    assert monotonic("second", "ExecMainStartTimestampMonotonic") >= monotonic("first", "ActiveEnterTimestampMonotonic")


def test_an_instance_dropped_from_the_inventory_is_removed(serve):
    only_first = json.dumps({"vllm_instances": [json.loads(instances_json())["vllm_instances"][0]]})
    before = serving_state(serve)
    check = site("--check", "--diff", "--tags", "vllm", "-e", only_first)
    assert check.returncode == 0, check.stdout[-3000:]
    removal = check.stdout.split("Remove each instance no longer planned", 1)[-1]
    assert "(item=second)" in removal and "/etc/sparkfleet/vllm/second.env" in removal, check.stdout[-3000:]
    assert serving_state(serve) == before, "check mode removed nothing"

    # What an image Docker no longer holds left behind (its compile caches, its release record) goes in the same run;
    # the running image's stay.
    leftovers = ["/var/cache/sparkfleet/vllm/jit/0123456789abcdef", f"/var/lib/sparkfleet/image-releases/sha256-{'ab' * 32}.json"]
    gone = json.dumps({"schema_version": 1, "engine": "vllm", "image": "registry.lan/vllm@sha256:0123456789abcdef" + "cd" * 24, "versions": ["0.31.0"]})
    serve.check_output(f"mkdir -p {leftovers[0]}/warm && printf '%s' {shlex.quote(gone)} > {leftovers[1]}")
    kept = serve.check_output("ls -d /var/cache/sparkfleet/vllm/jit/* /var/lib/sparkfleet/image-releases/*").split()
    result = site("--tags", "vllm", "-e", only_first)
    assert result.returncode == 0, result.stdout[-3000:]
    assert set(serve.check_output("ls -d /var/cache/sparkfleet/vllm/jit/* /var/lib/sparkfleet/image-releases/*").split()) == set(kept) - set(leftovers)
    assert not serve.file("/etc/systemd/system/sparkfleet-vllm-second.service").exists
    for path in ("second.env", "second.json", "last-good/second.env", "last-good/second.json", "last-good/sparkfleet-vllm-second.service"):
        assert not serve.file(f"/etc/sparkfleet/vllm/{path}").exists, path
    assert serve.run("docker inspect vllm-second").rc != 0
    assert status(serve, 8002, key=KEY) == "000"
    assert status(serve, 8001, key=KEY) == "200"


def test_the_pull_recorded_the_vllm_release_and_a_floor_refuses_what_it_cannot_read(serve):
    """The converge read the lab image's vLLM (0.32.0+cpu, above the 0.24.0 floor) in a throwaway container and recorded
    it beside the image's ID, so the next read starts none. Judged as a LiteLLM image it holds no LiteLLM release:
    refused naming the advisories and the variable, and nothing is recorded for it."""
    run_image = json.loads(serve.file("/etc/sparkfleet/vllm/first.json").content_string)["run_image"]
    records = serve.run("ls /var/lib/sparkfleet/image-releases").stdout.split()
    read = module(SERVE, "image_release", {"image": run_image, "engine": "vllm"})
    assert read.get("failed") is not True, read.get("msg")
    assert (read["version"], read["from_record"], read["changed"]) == ("0.32.0+cpu", True, False)
    assert f"{read['image_id'].replace(':', '-')}.json" in records
    refused = module(SERVE, "image_release", {"image": run_image, "engine": "litellm"})
    assert refused.get("failed") is True
    for fragment in ("has no litellm-<version>.dist-info", "CVE-2026-59822", "gateway_accepted_advisories: [CVE-2026-59822, CVE-2026-49468]"):
        assert fragment in refused["msg"], refused["msg"]
    assert serve.run("ls /var/lib/sparkfleet/image-releases").stdout.split() == records


def test_a_crashing_engine_dumps_no_core(serve):
    """dockerd, not the unit, gives the container its limits: the running engine's own limit says no core."""
    ulimits = json.loads(serve.check_output("docker inspect --format '{{json .HostConfig.Ulimits}}' vllm-first"))
    assert {"Name": "core", "Hard": 0, "Soft": 0} in ulimits
    assert serve.check_output("docker exec vllm-first sh -c 'ulimit -c'").strip() == "0"
