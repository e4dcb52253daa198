"""A real CPU vLLM served by the vllm role on a lab host: gate, auth, pinning, rollback, guards, boot order.

Durations printed here (gate times, reboot recovery) are measurements, not pass/fail thresholds.
"""

import json
import os
import re
import subprocess
import time

import pytest
from site_runner import assert_refused, docker_host, site, state_digest

SERVE = "sparkfleet-molecule-serve"
KEY = os.environ["SPARKFLEET_LAB_API_KEY"]
INSTANCES = [("first", 8001, "tiny-first"), ("second", 8002, "tiny-second")]
CONFIG_FILES = [
    f"{directory}{name}.{suffix}"
    for name, _port, _model in INSTANCES
    for directory, suffix in (("/etc/sparkfleet/vllm/", "env"), ("/etc/sparkfleet/vllm/", "json"))
] + [f"/etc/systemd/system/sparkfleet-vllm-{name}.service" for name, _port, _model in INSTANCES]


@pytest.fixture(scope="module")
def serve():
    return docker_host(SERVE)


def status(host, port, path="/v1/models", key=None):
    auth = f"-H 'Authorization: Bearer {key}'" if key else ""
    return host.run(f"curl -s -o /dev/null -w '%{{http_code}}' {auth} http://127.0.0.1:{port}{path}").stdout.strip()


def container(host, name):
    return json.loads(host.check_output(f"docker inspect vllm-{name}"))[0]


def serving_state(host):
    """Settings on disk plus the identity of each running container."""
    return state_digest(host, CONFIG_FILES, [f"docker inspect --format '{{{{.Id}}}} {{{{.State.StartedAt}}}}' vllm-{n}" for n, _p, _m in INSTANCES])


def instances_json(**second_overrides):
    second = {"name": "second", "model": "/models/tiny-llama-variant", "served_model_names": ["tiny-second"], "port": 8002, "api_key": KEY,
              "speculative": {"method": "ngram", "num_speculative_tokens": 3, "options": {"prompt_lookup_max": 3}},
              "env": {"VLLM_SERVER_DEV_MODE": "1"}}
    second.update(second_overrides)
    first = {"name": "first", "model": "/models/tiny-llama", "served_model_names": ["tiny-first"], "port": 8001, "api_key": KEY}
    return json.dumps({"vllm_instances": [first, second]})


@pytest.mark.parametrize(("name", "port", "model"), INSTANCES)
def test_endpoint_requires_the_key(serve, name, port, model):
    assert status(serve, port) == "401"
    assert status(serve, port, key="wrong-key-wrong-key-wrong") == "401"
    assert status(serve, port, key=KEY) == "200"
    listed = json.loads(serve.check_output(f"curl -s -H 'Authorization: Bearer {KEY}' http://127.0.0.1:{port}/v1/models"))
    assert [entry["id"] for entry in listed["data"]] == [model]


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


def test_second_run_changes_nothing_and_keeps_the_containers(serve):
    before = serving_state(serve)
    result = site("--tags", "vllm", "-e", instances_json())
    assert result.returncode == 0, result.stdout[-3000:]
    assert "changed=0" in result.stdout.split("PLAY RECAP")[1]
    assert serving_state(serve) == before


def test_check_mode_on_the_serving_host_reports_no_change(serve):
    before = serving_state(serve)
    result = site("--check", "--diff", "--tags", "vllm", "-e", instances_json())
    assert result.returncode == 0, result.stdout[-3000:]
    assert "changed=0" in result.stdout.split("PLAY RECAP")[1]
    assert serving_state(serve) == before


@pytest.mark.parametrize(
    ("extra_vars", "fragments"),
    [
        pytest.param({"vllm_image": "172.17.0.1:5000/sparkfleet/vllm-cpu:latest"}, ["not pinned by digest", "vllm_allow_floating_tag"], id="floating-tag"),
        pytest.param({"vllm_instances": [{"name": "first", "model": "/m", "served_model_names": ["a"], "port": 8001, "api_key": ""}]},
                     ["vllm_instances[0] (first).api_key", "authentication"], id="empty-key"),
        pytest.param({"vllm_gmu_cap": 0.15}, ["adds up to 0.2", "first 0.1 + second 0.1", "vllm_gmu_cap"], id="gmu-over-cap"),
        pytest.param({"vllm_instance_defaults": {"bind_addresses": ["127.0.0.1", "192.0.2.10"], "gpu_memory_utilization": 0.1}},
                     ["192.0.2.10 is not an address of this host"], id="lan-address-not-on-host"),
        pytest.param({"vllm_instance_defaults": {"bind_addresses": ["127.0.0.1"], "gpu_memory_utilization": 0.1, "enable_auto_tool_choice": True}},
                     ["enable_auto_tool_choice is true without tool_call_parser"], id="auto-tool-choice-without-parser"),
        pytest.param({"vllm_instance_defaults": {"bind_addresses": ["127.0.0.1"], "gpu_memory_utilization": 0.1,
                                                 "speculative": {"method": "ngram", "num_speculative_tokens": -1}}},
                     ["speculative.num_speculative_tokens: -1"], id="negative-draft-tokens"),
    ],
)
def test_bad_settings_refused_before_any_change(serve, extra_vars, fragments):
    before = serving_state(serve)
    merged = json.loads(instances_json())
    merged.update(extra_vars)
    result = site("--tags", "vllm", "-e", json.dumps(merged))
    assert_refused(result, "nothing was changed", *fragments)
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


def test_bad_flag_fails_fast_and_rolls_back(serve):
    before_settings = serve.file("/etc/sparkfleet/vllm/second.json").content_string
    started = time.monotonic()
    result = site("--tags", "vllm", "-e", instances_json(extra_args=["--no-such-flag"]))
    elapsed = time.monotonic() - started
    assert_refused(result, "vLLM instance second failed its relaunch: vLLM health gate failed", "unrecognized arguments", "last good settings were relaunched")
    detected = re.search(r"detected after ([0-9.]+) s", result.stdout + result.stderr).group(1)
    print(f"\nbad flag: the gate detected the crashed start after {detected} s; the play failed, rolled back, in {elapsed:.0f} s")
    assert serve.file("/etc/sparkfleet/vllm/second.json").content_string == before_settings
    assert status(serve, 8002, key=KEY) == "200"
    assert not serve.file("/run/sparkfleet/vllm-maintenance").exists


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
