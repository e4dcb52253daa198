"""The one way the unit tests get a serving unit's plan file: built by the plan builder itself (build_plan with the
role's options, plan_options; a cluster's rank from cluster_nodes as the cluster role plans it), so a test's plan is
what the roles write and cannot drift from it. A test lays only what it changes over it."""

import copy
import json
import pathlib

from plan_options import plan_options

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import cluster_nodes
from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import parse_ibdev2netdev
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import backend_reports, gateway_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import build_plan

IMAGE = "registry.example/vllm:0.32.0@sha256:" + "a" * 64
API_KEY = "k" * 32
CLUSTER_HOSTS = ("spark-1", "spark-2", "spark-3")
LINKS = parse_ibdev2netdev((pathlib.Path(__file__).parent / "fixtures" / "fabric" / "ibdev2netdev_two_sparks.txt").read_text())


def instance(name="llm", **changes):
    """An instance as the inventory declares it (vllm_instances), ``changes`` laid over it."""
    return {"name": name, "model": "/models/tiny", "served_model_names": ["tiny"], "port": 8000, "api_key": API_KEY,
            "bind_addresses": ["127.0.0.1"], "gpu_memory_utilization": 0.5, **changes}


def built(declared, **options):
    """(plan, env file text) of one instance as build_plan plans it with the role's options, ``options`` laid over them."""
    plan = build_plan([declared], {}, **plan_options(**{"image": IMAGE, **options}))
    assert plan["errors"] == [], plan["errors"]
    return plan["instances"][0], plan["env_files"][declared["name"]]


def unit_plan(name="llm", declared=None, options=None, **changes):
    """The plan file of a single instance, as the vllm role writes it; ``changes`` replace its keys."""
    plan, _env = built(declared or instance(name), **(options or {}))
    return {**plan, **copy.deepcopy(changes)}


def gateway_unit_plan(config_dir="/etc/sparkfleet/gateway", **changes):
    """The gateway's unit plan (unit-plan.json), as the gateway role plans it in front of one instance; ``changes``
    replace its keys."""
    hostvars = {"spark-1": {"ansible_host": "127.0.0.1", "vllm_endpoints": [
        {"name": "llm", "port": 8000, "bind_addresses": ["127.0.0.1"], "served_names": ["tiny"], "api_key": API_KEY}]}}
    plan = gateway_plan({"image": "registry.example/litellm:1.110.2@sha256:" + "b" * 64, "master_key": "sk-" + "m" * 40,
                         "backends": ["spark-1"], "config_dir": config_dir}, backend_reports(["spark-1"], hostvars), "spark-1")
    assert plan["errors"] == [], plan["errors"]
    return {**plan["serving_unit"], **copy.deepcopy(changes)}


def fast_address(host):
    return f"192.168.100.1{CLUSTER_HOSTS.index(host) + 1}"


def node_report(host):
    """What a cluster node reports to the cluster role: its facts, its RDMA links and their GIDs, its image."""
    interface = "enp1s0f0np0"
    address = fast_address(host)
    facts = {"interfaces": ["lo", interface], "all_ipv4_addresses": [address],
             "lo": {"ipv4": {"address": "127.0.0.1"}, "mtu": 65536}, interface: {"ipv4": {"address": address}, "mtu": 9000}}
    gids = [{"device": device, "port": 1, "index": 3, "gid": "", "ipv4": address, "version": "v2", "netdev": ""}
            for device in ("rocep1s0f0", "roceP2p1s0f0")]
    return {"facts": facts, "overrides": {}, "rdma_links": LINKS, "gids": gids, "image": IMAGE, "manifest": "ab" * 32}


def rank_plan(rank=0, hosts=CLUSTER_HOSTS[:2], backend="native", **changes):
    """The plan file of a cluster's rank on its node, as the cluster role plans and writes it; ``changes`` replace its keys."""
    declaration = {
        "name": "tp", "nodes": list(hosts), "backend": backend, "master_port": 29501, "gpus_per_node": 1,
        "fast_network": "192.168.100.0/24", "mtu": 9000, "require_rdma": True, "vllm_version": "0.32.0", "master_addr": "",
        "instance": {**instance("tp"), "bind_addresses": ["127.0.0.1"], "tensor_parallel_size": len(hosts)},
    }
    planned = cluster_nodes(declaration, {host: node_report(host) for host in hosts}, list(hosts))
    assert planned["errors"] == [], planned["errors"]
    node = planned["nodes"][hosts[rank]]
    plan, _env = built(declaration["instance"], vllm_version="0.32.0", config_dir="/etc/sparkfleet/cluster",
                       host_addresses=[fast_address(hosts[rank]), "127.0.0.1"], wait_online_enabled=True, cluster={**node["option"], "node_env": {}})
    return {**plan, **copy.deepcopy(changes)}


def write_plan(folder, plan, name=None):
    """The plan written as the serving roles write it, as ``folder``/NAME.json; its path."""
    path = pathlib.Path(folder) / f"{name or plan['name']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=4, sort_keys=True) + "\n")
    return str(path)
