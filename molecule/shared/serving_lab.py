"""The serving lab host of the vllm scenario: its instances and how tests read its state."""

import json
import os

from site_runner import state_digest

SERVE = "sparkfleet-molecule-serve"
KEY = os.environ["SPARKFLEET_LAB_API_KEY"]
INSTANCES = [("first", 8001, "tiny-first"), ("second", 8002, "tiny-second")]
CONFIG_FILES = [
    f"{directory}{name}.{suffix}"
    for name, _port, _model in INSTANCES
    for directory, suffix in (("/etc/sparkfleet/vllm/", "env"), ("/etc/sparkfleet/vllm/", "json"))
] + [f"/etc/systemd/system/sparkfleet-vllm-{name}.service" for name, _port, _model in INSTANCES]


def status(host, port, path="/v1/models", key=None):
    auth = f"-H 'Authorization: Bearer {key}'" if key else ""
    return host.run(f"curl -s -o /dev/null -w '%{{http_code}}' {auth} http://127.0.0.1:{port}{path}").stdout.strip()


def engine_processes(host, container):
    """(pid on the lab host, resident KiB, command) of the engine's own processes in the container: the server (`vllm serve`)
    and, with V1 multiprocessing, its engine core (titled VLLM::EngineCore); not a benchmark client run in the container."""
    rows = [line.split(None, 2) for line in host.check_output(f"docker top {container} -eo pid,rss,args").splitlines()[1:]]
    return [(int(pid), int(rss), args) for pid, rss, args in rows if "vllm serve" in args or "VLLM::EngineCore" in args]


def container(host, name):
    return json.loads(host.check_output(f"docker inspect vllm-{name}"))[0]


def serving_state(host):
    """Settings on disk plus the identity of each running container."""
    return state_digest(host, CONFIG_FILES, [f"docker inspect --format '{{{{.Id}}}} {{{{.State.StartedAt}}}}' vllm-{n}" for n, _p, _m in INSTANCES])


def instances_json(**second_overrides):
    second = {"name": "second", "model": "/models/tiny-llama-variant", "served_model_names": ["tiny-second"], "port": 8002, "api_key": KEY,
              "speculative": {"method": "ngram", "num_speculative_tokens": 3, "options": {"prompt_lookup_max": 3}},
              "env": {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}
    second.update(second_overrides)
    first = {"name": "first", "model": "/models/tiny-llama", "served_model_names": ["tiny-first"], "port": 8001, "api_key": KEY}
    return json.dumps({"vllm_allow_dev_mode": True, "vllm_instances": [first, second]})
