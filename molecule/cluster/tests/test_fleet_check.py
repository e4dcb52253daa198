"""site.yml's fleet check on the lab cluster's two hosts: a run that one check refuses changes
nothing on any host, although other parts of it (a single instance's settings, the hosts'
preparation) would have been applied first before the check ran in its first play. The other
fleet refusals (a port claimed twice, a gateway whose backends' instances are dropped) need no
host and are proven on the controller (tests/integration/test_static.py, test_fleet.py)."""

import json
import os
import re

import pytest
from site_runner import assert_refused, docker_host, site, state_digest

HOSTS = ("sparkfleet-molecule-node-1", "sparkfleet-molecule-node-2")
KEY = os.environ["SPARKFLEET_LAB_API_KEY"]
WATCHED_FILES = [
    "/etc/sparkfleet/vllm/tiny.env", "/etc/sparkfleet/vllm/tiny.json", "/etc/systemd/system/sparkfleet-vllm-tiny.service",
    "/etc/sparkfleet/cluster/lab-tp2.env", "/etc/sparkfleet/cluster/lab-tp2.json", "/etc/systemd/system/sparkfleet-cluster-lab-tp2.service",
]
GATEWAY_FILES = ["/etc/sparkfleet/gateway/plan.json", "/etc/sparkfleet/gateway/drained.json", "/etc/sparkfleet/gateway/litellm/config.yaml"]
# The lab's settings (inventories/lab/group_vars), given whole because extra vars replace a mapping.
CLUSTER_INSTANCE = {"model": "/models/tiny-llama", "served_model_names": ["tiny-tp2"], "port": 8010, "api_key": KEY,
                    "tensor_parallel_size": 2, "env": {"TORCHDYNAMO_DISABLE": "1"}}
INSTANCE_DEFAULTS = {"bind_addresses": ["127.0.0.1"], "gpu_memory_utilization": 0.1, "enforce_eager": True,
                     "num_gpu_blocks_override": 32, "dtype": "float32", "max_model_len": 2048}


def fleet_state():
    states = []
    for name in HOSTS:
        files = WATCHED_FILES + (GATEWAY_FILES if name == HOSTS[0] else [])
        states.append(state_digest(docker_host(name), files,
                                   ["docker ps --all --no-trunc --format '{{.ID}} {{.Names}} {{.CreatedAt}} {{.State}}'"]))
    return states


@pytest.fixture(scope="module")
def before():
    return fleet_state()


def refused_site(extra):
    return site("--tags", "vllm,cluster,gateway", "-e", json.dumps(extra))


def test_a_cluster_that_cannot_work_stops_a_single_instance_change_too(before):
    """Found when tried: the single instance was relaunched (21 changes), then the cluster play said
    "nothing was changed"."""
    result = refused_site({"cluster_instance": {**CLUSTER_INSTANCE, "tensor_parallel_size": 3},
                           "vllm_instance_defaults": {**INSTANCE_DEFAULTS, "max_model_len": 1024}})
    assert_refused(result, "cluster_instance.tensor_parallel_size: 3; 2 nodes x 1 GPU per node is 2", "nothing was changed on any host")
    assert "changed=0" in result.stdout and not re.search(r"changed=[1-9]", result.stdout)
    assert fleet_state() == before


def test_a_run_for_one_hosts_preparation_passes_the_fleet_check(before):
    """--limit to one host with tags that leave the cluster and the gateway out (wait_online, which
    this scenario's converge applied): neither needs the hosts outside the play (their fast links
    and plans are judged from the inventory)."""
    result = site("--tags", "wait_online", limit=HOSTS[0])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "changed=0" in result.stdout and "failed=0" in result.stdout
    assert fleet_state() == before
