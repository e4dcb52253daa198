# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One model across nodes: the cluster declared once for a group of hosts, planned per node.

Private to the collection. ``cluster_nodes`` turns the declaration (the ``cluster_*`` variables
of the group) and what each node reported (its interface facts, RDMA devices and GID table, the
image it would run, the manifest of its checkpoint) into every node's rank, network environment
and the arguments the instance plan renders (``_vllm_plan.build_plan(..., cluster=node)``), with
every refusal at once: nodes x GPUs not the tensor-parallel size, differing images or
checkpoints, a vLLM without working multi-node (seed 001: before 0.27.0 a lost wakeup parks
the engine until "RPC call to sample_tokens timed out"), a master address off the fast link,
a node without the fast link or its RDMA devices.
"""

from __future__ import annotations

import ipaddress
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import interface_named, interface_on, rocev2_gid_index
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import VERSION, version_tuple

BACKENDS = ("native", "ray")
FIRST_MULTI_NODE_VERSION = "0.27.0"
RAY_PORT = 6379
# Set from each node's facts: an entry of cluster_node_env or the instance's env may not replace them.
NETWORK_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
               "NCCL_IB_HCA", "UCX_NET_DEVICES", "NCCL_IB_GID_INDEX", "MASTER_ADDR")


def is_count(value: t.Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def declaration_problems(cluster: t.Mapping[str, t.Any], inventory: t.Collection[str]) -> list[str]:
    """Problems of the declaration itself, before any node is looked at."""
    errors = []
    nodes = cluster.get("nodes")
    if not isinstance(nodes, list) or len(nodes) < 2 or not all(isinstance(n, str) for n in nodes):
        errors.append("cluster_nodes: list the cluster's hosts in rank order (the first is the head), at least two")
    else:
        repeated = sorted({n for n in nodes if nodes.count(n) > 1})
        unknown = [n for n in nodes if n not in inventory]
        if repeated:
            errors.append(f"cluster_nodes: {', '.join(repeated)} listed more than once; each host is one node")
        if unknown:
            errors.append(f"cluster_nodes: {', '.join(unknown)} not in the inventory")
    if cluster.get("backend") not in BACKENDS:
        errors.append(f"cluster_backend: {cluster.get('backend')!r} is not one of {', '.join(BACKENDS)}")
    for name in ("master_port", "gpus_per_node", "mtu"):
        value = cluster.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (name.endswith("port") and value > 65535):
            errors.append(f"cluster_{name}: {value!r} must be a whole number above 0" + (" and a port" if name.endswith("port") else ""))
    try:
        ipaddress.ip_network(str(cluster.get("fast_network")), strict=False)
    except ValueError:
        errors.append(f"cluster_fast_network: {cluster.get('fast_network')!r} must be the fast link's subnet, such as "
                      "192.168.100.0/24; each node's interface and address are found in it")
    version = cluster.get("vllm_version")
    if not isinstance(version, str) or not VERSION.fullmatch(version):
        errors.append(f"vllm_version: {version!r}; a cluster needs the image's vLLM release stated (such as 0.32.0): "
                      f"multi-node needs {FIRST_MULTI_NODE_VERSION} or later")
    elif version_tuple(version) < version_tuple(FIRST_MULTI_NODE_VERSION):
        errors.append(f"vllm_version: {version} cannot run a cluster: multi-node needs vLLM {FIRST_MULTI_NODE_VERSION} or "
                      "later (seed 001: on 0.26 the engine's shared-memory queue loses a wakeup, parks every rank and dies "
                      "with 'RPC call to sample_tokens timed out'). Pin a newer image")
    instance = cluster.get("instance")
    if not isinstance(instance, dict):
        errors.append("cluster_instance: the instance the cluster serves (the keys of a vllm_instances entry)")
    elif isinstance(nodes, list) and nodes and is_count(cluster.get("gpus_per_node")):
        expected = len(nodes) * cluster["gpus_per_node"]
        if instance.get("tensor_parallel_size") != expected:
            errors.append(f"cluster_instance.tensor_parallel_size: {instance.get('tensor_parallel_size')!r}; {len(nodes)} nodes x "
                          f"{cluster['gpus_per_node']} GPU per node is {expected}, and the model is split over every GPU "
                          f"(pipeline parallelism is not planned). Set it to {expected}, or change cluster_nodes")
        binds = instance.get("bind_addresses")
        if isinstance(binds, list) and len(binds) != 1:
            errors.append("cluster_instance.bind_addresses: give exactly one address; the head serves on the host's network "
                          "(the ranks talk on many ports), where vLLM binds one address")
    return errors


def node_network(host: str, report: t.Mapping[str, t.Any], cluster: t.Mapping[str, t.Any]) -> tuple[dict[str, t.Any] | None, list[str]]:
    """One node's fast link from its facts (or its overrides): interface, address, MTU, the RDMA
    devices that are up, the RoCE v2 GID index, and the environment NCCL, Gloo and vLLM read."""
    overrides = report.get("overrides") or {}
    facts = report.get("facts") or {}
    network = str(cluster["fast_network"])
    if overrides.get("fast_interface"):
        found = interface_named(facts, overrides["fast_interface"])
        if not found:
            return None, [f"{host}: cluster_fast_interface {overrides['fast_interface']} has no IPv4 address on this host"]
        if ipaddress.ip_address(found["address"]) not in ipaddress.ip_network(network, strict=False):
            return None, [f"{host}: cluster_fast_interface {found['interface']} has {found['address']}, outside "
                          f"cluster_fast_network {network}; the ranks would talk off the fast link"]
    else:
        found = interface_on(facts, network)
        if not found:
            addresses = ", ".join(facts.get("all_ipv4_addresses") or []) or "none"
            return None, [f"{host}: no interface with an address in cluster_fast_network {network} (it has {addresses}); "
                          "bring the fast link up, or correct the network"]
    links = report.get("rdma_links") or []
    devices = overrides.get("rdma_devices") or [link["device"] for link in links if link["up"]]
    errors = []
    if cluster.get("require_rdma") and not devices:
        errors.append(f"{host}: no RDMA device is up ({', '.join(link['device'] for link in links) or 'none found'}); NCCL "
                      "would fall back to TCP sockets (about 3 GB/s). Check the QSFP cable and ibdev2netdev, or set "
                      "cluster_require_rdma: false for a cluster without RDMA")
    gid_index = overrides.get("gid_index")
    if gid_index is None and devices:
        gid_index = rocev2_gid_index(report.get("gids") or [], devices, found["address"])
    env = {
        "VLLM_HOST_IP": found["address"],
        "NCCL_SOCKET_IFNAME": found["interface"],
        "GLOO_SOCKET_IFNAME": found["interface"],
        "TP_SOCKET_IFNAME": found["interface"],
    }
    if devices:
        env["NCCL_IB_HCA"] = ",".join(devices)
        env["UCX_NET_DEVICES"] = ",".join(f"{device}:1" for device in devices)
    if gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(gid_index)
    return {**found, "rdma_devices": list(devices), "gid_index": gid_index, "env": env}, errors


def agreement_problems(nodes: t.Sequence[str], reports: t.Mapping[str, t.Mapping[str, t.Any]]) -> tuple[list[str], list[str]]:
    """(errors, warnings) once every node is planned: every node must run the same image and load
    the same checkpoint (``reports``: host -> image it would run, sha256 of its checkpoint's manifest)."""
    errors, warnings = [], []
    images = {host: reports[host].get("image") for host in nodes}
    if len(set(images.values())) > 1:
        errors.append("cluster image: the nodes would run different images (" + "; ".join(f"{h}: {i or 'none'}" for h, i in images.items())
                      + "); every rank must run the same vLLM. Pin one image for the cluster (cluster_instance.image)")
    manifests = {host: reports[host].get("manifest") for host in nodes}
    if len(set(manifests.values())) > 1:
        shown = "; ".join(f"{h}: {m[:12] if m else 'no manifest'}" for h, m in manifests.items())
        errors.append(f"cluster checkpoint: the staged checkpoint differs between nodes (manifest sha256 {shown}); stage it "
                      "from one source (vllm_models_source) so every rank loads the same weights")
    elif not any(manifests.values()):
        warnings.append("cluster checkpoint: no node has a manifest of the checkpoint (stage it with vllm_models), so the "
                        "nodes' weights cannot be compared")
    return errors, warnings


def stand_in_network(host: str) -> dict[str, t.Any]:
    """What stands for a node's fast link when only the inventory is checked (no host is contacted)."""
    address = f"{host}-fast-address"
    env = {"VLLM_HOST_IP": address, "NCCL_SOCKET_IFNAME": "fast-interface", "GLOO_SOCKET_IFNAME": "fast-interface",
           "TP_SOCKET_IFNAME": "fast-interface"}
    return {"interface": "fast-interface", "address": address, "mtu": None, "rdma_devices": [], "gid_index": None, "env": env}


def cluster_nodes(cluster: t.Mapping[str, t.Any], reports: t.Mapping[str, t.Mapping[str, t.Any]] | None,
                  inventory: t.Collection[str]) -> dict[str, t.Any]:
    """Every node's part of the cluster: ``nodes`` (host -> rank, headless, network, the cluster
    option of the instance plan), ``errors`` and ``warnings``. ``reports`` holds, per host, what
    it reported: facts, overrides, rdma_links, gids; None when only the inventory is checked (the
    network is then a stand-in, and the instance plan still checks the model across nodes)."""
    errors = declaration_problems(cluster, inventory)
    plan: dict[str, t.Any] = {"nodes": {}, "errors": errors, "head": None, "master_addr": None}
    if errors:
        return plan
    if reports is None:
        reports = {host: {"stand_in": True} for host in cluster["nodes"]}
    missing = [host for host in cluster["nodes"] if host not in reports]
    if missing:
        plan["errors"] = [f"cluster_nodes: {', '.join(missing)} did not report (unreachable, or not in this play); "
                          "a cluster is only changed with every node in the play"]
        return plan
    networks = {}
    for host in cluster["nodes"]:
        network, problems = (stand_in_network(host), []) if reports[host].get("stand_in") else node_network(host, reports[host], cluster)
        errors += problems
        networks[host] = network
    head = cluster["nodes"][0]
    master = cluster.get("master_addr") or (networks[head] or {}).get("address")
    if cluster.get("master_addr") and networks[head] and cluster["master_addr"] != networks[head]["address"]:
        errors.append(f"cluster_master_addr: {cluster['master_addr']} is not the head's ({head}) address on the fast link "
                      f"({networks[head]['address']} on {networks[head]['interface']}); the ranks would rendezvous off the fast "
                      "link. Leave it unset: the head's fast address is the master")
    if errors:
        return plan
    plan["head"], plan["master_addr"] = head, master
    for rank, host in enumerate(cluster["nodes"]):
        network = networks[host]
        env = dict(network["env"])
        if cluster["backend"] == "native":
            env["MASTER_ADDR"] = master
        plan["nodes"][host] = {
            "host": host,
            "rank": rank,
            "head": rank == 0,
            "network": {key: value for key, value in network.items() if key != "env"},
            "peer": {"name": host, "address": network["address"]},
            "option": {
                "name": cluster["instance"].get("name") or cluster["name"],
                "host": host,
                "backend": cluster["backend"],
                "nnodes": len(cluster["nodes"]),
                "rank": rank,
                "master_addr": master,
                "master_port": cluster["master_port"],
                "gpus_per_node": cluster["gpus_per_node"],
                "host_ip": network["address"],
                "rdma": bool(network["rdma_devices"]),
                "network_env": env,
                "fabric": {"interface": network["interface"], "mtu": cluster["mtu"],
                           "peers": [{"name": peer, "address": networks[peer]["address"]} for peer in cluster["nodes"] if peer != host]},
            },
        }
    return plan


def serve_cluster_args(option: t.Mapping[str, t.Any]) -> list[str]:
    """What the instance's ``vllm serve`` arguments gain on a node of the native runtime, or on the Ray head."""
    if option["backend"] == "ray":
        return ["--distributed-executor-backend", "ray"]
    args = ["--distributed-executor-backend", "mp", "--nnodes", str(option["nnodes"]), "--node-rank", str(option["rank"]),
            "--master-addr", option["master_addr"], "--master-port", str(option["master_port"])]
    return args + (["--headless"] if option["rank"] > 0 else [])


def ray_start_args(option: t.Mapping[str, t.Any]) -> list[str]:
    """``ray start`` of a node: the head opens the cluster, the others join it. Each node offers
    exactly its GPUs, so the placement group of a one-GPU-per-box cluster takes one bundle per box,
    the head's included (vLLM refuses a driver node without a GPU bundle)."""
    common = ["start", "--block", "--node-ip-address", option["host_ip"], "--num-gpus", str(option["gpus_per_node"])]
    if option["rank"] == 0:
        return [*common, "--head", "--port", str(RAY_PORT)]
    return [*common, "--address", f"{option['master_addr']}:{RAY_PORT}"]
