# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One model across nodes: the cluster declared once for a group of hosts, planned per node.

Private to the collection. ``cluster_nodes`` turns the declaration (the ``cluster_*`` variables
of the group, and what each node's own host vars add: how Ansible reaches it, its environment and
overrides) and what each node reported (its interface facts, RDMA devices and GID table, the image
it would run, the manifest of its checkpoint) into every node's rank, network environment and the
arguments the instance plan renders (``_vllm_plan.build_plan(..., cluster=node)``), with every
refusal at once: nodes x GPUs not the tensor-parallel size, differing images or checkpoints, a
vLLM without working multi-node (seed 001: before 0.27.0 a lost wakeup parks the engine until
"RPC call to sample_tokens timed out"), a master address off the fast link, a fast network no
link could be, one box under two names, an environment turning RDMA off that the cluster
requires, a node without the fast link or its RDMA devices. ``fleet_cluster_problems`` judges
what only all hosts together show: a host in two clusters, a node not in the cluster listing it,
nodes of different hardware classes.
"""

from __future__ import annotations

import ipaddress
import json
import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster_sequence import BACKENDS
from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import MTU_MAX, MTU_MIN, MTU_WHY, interface_named, interface_on, rocev2_gid_index
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import VERSION, version_tuple
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import is_count
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import Setting, coerced, dropin_problem, setting_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import UNIT_NAME, removal

FIRST_MULTI_NODE_VERSION = "0.27.0"
RAY_PORT = 6379
# Set from each node's facts: an entry of cluster_node_env or the instance's env may not replace them.
NETWORK_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
               "NCCL_IB_HCA", "UCX_NET_DEVICES", "NCCL_IB_GID_INDEX", "MASTER_ADDR")
# The widest subnet one link can be: 10.0.0.0/8, the widest private block.
WIDEST_LINK_PREFIX = 8
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
# Linux's interface names (IFNAMSIZ 16, with the terminating NUL) and RDMA device names, as
# NCCL_SOCKET_IFNAME and NCCL_IB_HCA read them: their ^, =, : and commas would change the meaning.
INTERFACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
RDMA_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
GID_INDEX_MAX = 255
# Where logind reads its drop-ins (logind.conf(5)).
LOGIND_DROPIN_FOLDERS = ("/etc/systemd/logind.conf.d", "/run/systemd/logind.conf.d", "/usr/local/lib/systemd/logind.conf.d",
                         "/usr/lib/systemd/logind.conf.d")
GPUS_PER_NODE_MAX = 8

CLUSTER_SETTINGS: tuple[Setting, ...] = (
    Setting("backend", "choice", "", choices=BACKENDS),
    Setting("master_port", "port", "the head's rendezvous listens on it (native runtime)"),
    Setting("gpus_per_node", "count", "the GPUs each node gives the model: one on a GB10, and no board holds more than "
            f"{GPUS_PER_NODE_MAX}", 1, GPUS_PER_NODE_MAX),
    Setting("mtu", "count", MTU_WHY, MTU_MIN, MTU_MAX),
    Setting("require_rdma", "bool", ""),
    Setting("fabric_gate", "bool", ""),
    Setting("ping_count", "count", "don't-fragment pings per pair, 0.2 s apart; the gate must end before the start it guards",
            1, 100),
    Setting("nccl_min_busbw_gbs", "number", "GB/s of bus bandwidth: 800 Gb/s, the fastest Ethernet port, carries 100 GB/s, so a "
            "higher floor always fails (two Sparks reach about 22)", 0, 100),
    Setting("config_dir", "path", "the role makes this folder root-owned and mode 0700 (it holds the key's env file), which on "
            "/ or /etc would lock every other user out", 2),
    Setting("iputils_ping_version", "version", "apt-get installs iputils-ping=VERSION, where a comma or a space would add packages"),
    Setting("logind_remove_ipc_dropin", "path", "logind reads the drop-in that keeps the ranks' shared memory at a logout"),
)
# What the role's defaults give the settings a declaration may leave out (roles/cluster/defaults).
DEFAULTS: dict[str, t.Any] = {
    "backend": "native", "master_port": 29501, "master_addr": "", "gpus_per_node": 1, "mtu": 9000, "require_rdma": True,
    "fabric_gate": True, "ping_count": 3, "nccl_min_busbw_gbs": 18.0, "config_dir": "/etc/sparkfleet/cluster",
    "iputils_ping_version": "", "logind_remove_ipc_dropin": "/etc/systemd/logind.conf.d/10-sparkfleet-remove-ipc.conf",
    "node_vars": {},
}
# Where a node's container environment comes from, in the order the instance plan lays them over each other.
ENV_SOURCES = ("sparkfleet_hardware_overrides.env", "vllm_env", "cluster_instance.env", "cluster_node_env")


def fast_network_problems(cluster: t.Mapping[str, t.Any]) -> list[str]:
    """The fast network must be one IPv4 link holding every node, and a master address set by hand one of its hosts."""
    value = cluster.get("fast_network")
    try:
        network = ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return [f"cluster_fast_network: {value!r} must be the fast link's subnet, such as 192.168.100.0/24; each node's "
                "interface and address are found in it"]
    if network.version != 4:
        return [f"cluster_fast_network: {value} is an IPv6 subnet; each node's fast address is read from its IPv4 facts and "
                "the fabric gate pings over IPv4. Give the fast link's IPv4 subnet"]
    if network.prefixlen < WIDEST_LINK_PREFIX:
        return [f"cluster_fast_network: {value} spans {network.num_addresses} addresses, wider than any one link (the widest "
                f"private block is a /{WIDEST_LINK_PREFIX}): an interface on the LAN or the management network would match it, "
                "and the ranks could talk off the fast link. Give the fast link's own subnet, such as 192.168.100.0/24"]
    if network.is_loopback or network.is_multicast or network.is_reserved or network.subnet_of(THIS_NETWORK):
        return [f"cluster_fast_network: {value} is loopback, multicast, reserved or 'this network' ({THIS_NETWORK}) space, which "
                "no link between boxes uses; give the fast link's own subnet, such as 192.168.100.0/24"]
    errors = []
    nodes = cluster.get("nodes") if isinstance(cluster.get("nodes"), list) else []
    # A /31 is a point-to-point link of two addresses (RFC 3021); a wider subnet loses its network and broadcast address.
    room = network.num_addresses if network.prefixlen >= 31 else network.num_addresses - 2
    if room < len(nodes):
        errors.append(f"cluster_fast_network: {value} holds {room} node address{'es' if room != 1 else ''}, fewer than the "
                      f"{len(nodes)} nodes of cluster_nodes; give the fast link's whole subnet")
    return errors


def master_addr_problem(master: str, fast_network: str) -> str | None:
    """Without the head's facts its fast address is unknown: a master address set by hand must at least be a host of the fast network."""
    network = ipaddress.ip_network(fast_network, strict=False)
    try:
        address = ipaddress.ip_address(master)
    except ValueError:
        address = None
    ends = (network.network_address, network.broadcast_address) if network.prefixlen < 31 else ()
    if address is not None and address in network and address not in ends:
        return None
    return (f"cluster_master_addr: {master} is not a host address of cluster_fast_network {network}; the ranks would rendezvous "
            "off the fast link. Leave it unset (the head's fast address is the master), or give that address")


def identity(host: str, variables: t.Mapping[str, t.Any]) -> tuple[str, t.Any]:
    """How Ansible reaches a node: its address (or name) and SSH port; two names reaching one are one box."""
    address = str(variables.get("ansible_host") or host).strip().lower()
    try:
        address = str(ipaddress.ip_address(address))
    except ValueError:
        pass
    port = variables.get("ansible_port")
    return address, None if port in (None, "", 22, "22") else str(port)


def same_box_problems(nodes: t.Sequence[str], node_vars: t.Mapping[str, t.Mapping[str, t.Any]]) -> list[str]:
    boxes: dict[tuple[str, t.Any], list[str]] = {}
    for host in nodes:
        boxes.setdefault(identity(host, node_vars.get(host) or {}), []).append(host)
    return [f"cluster_nodes: {' and '.join(hosts)} are one box (ansible_host {address}{f', port {port}' if port else ''}); "
            f"as {len(hosts)} ranks they would share its one GPU and memory pool. List each box once"
            for (address, port), hosts in boxes.items() if len(hosts) > 1]


def rdma_off(name: str, value: t.Any) -> str | None:
    """How an NCCL setting turns NCCL's RDMA transport (InfiniBand verbs, which RoCE uses) off, or None.
    NCCL_NET_PLUGIN=none is not among them: it drops external net plugins, and the IB transport is NCCL's own."""
    text = str(value).strip()
    if name == "NCCL_IB_DISABLE" and text != "0":
        return "NCCL reads any value but 0 as: no InfiniBand or RoCE transport"
    if name == "NCCL_NET" and text.lower() == "socket":
        return "NCCL uses its TCP socket transport only"
    return None


def environment_problems(cluster: t.Mapping[str, t.Any], nodes: t.Sequence[str],
                         node_vars: t.Mapping[str, t.Mapping[str, t.Any]]) -> list[str]:
    """Each node's environment as its container gets it (the sources in ENV_SOURCES' order): an
    entry that turns RDMA off is refused while the cluster requires RDMA."""
    if not cluster.get("require_rdma"):
        return []
    instance = cluster.get("instance") if isinstance(cluster.get("instance"), dict) else {}
    errors: list[str] = []
    for host in nodes:
        own = node_vars.get(host) or {}
        layers = {"sparkfleet_hardware_overrides.env": own.get("hardware_env"), "vllm_env": own.get("vllm_env"),
                  "cluster_instance.env": instance.get("env"), "cluster_node_env": own.get("node_env")}
        effective: dict[str, tuple[str, t.Any]] = {}
        for source in ENV_SOURCES:
            layer = layers[source]
            effective.update({name: (source, value) for name, value in (layer.items() if isinstance(layer, dict) else [])})
        for name, (source, value) in sorted(effective.items()):
            reason = rdma_off(name, value)
            where = "" if source == "cluster_instance.env" else f"{host}: "
            message = (f"{where}{source}.{name}: {value!r} turns RDMA off ({reason}) while cluster_require_rdma is true; NCCL "
                       "would fall back to TCP sockets (about 3 GB/s). Remove it, or set cluster_require_rdma: false for a "
                       "cluster without RDMA")
            if reason and message not in errors:
                errors.append(message)
    return errors


def override_problems(nodes: t.Sequence[str], node_vars: t.Mapping[str, t.Mapping[str, t.Any]]) -> list[str]:
    """A node's own overrides of what its facts say, as NCCL and the fabric gate read them."""
    errors = []
    for host in nodes:
        own = node_vars.get(host) or {}
        interface, devices, gid = own.get("fast_interface") or "", own.get("rdma_devices") or [], own.get("gid_index")
        if interface and not (isinstance(interface, str) and INTERFACE_NAME.fullmatch(interface)):
            errors.append(f"{host}: cluster_fast_interface: {interface!r} must be one interface name (letters, digits and _.-, "
                          "at most 15 characters, Linux's limit); it becomes NCCL_SOCKET_IFNAME, where ^, = and commas "
                          "mean something else")
        if not isinstance(devices, list) or not all(isinstance(d, str) and RDMA_DEVICE.fullmatch(d) for d in devices):
            errors.append(f"{host}: cluster_rdma_devices: {devices!r} must list RDMA device names as ibdev2netdev shows them "
                          "(letters, digits and _.-); they are joined into NCCL_IB_HCA, where ^, =, : and commas mean "
                          "something else")
        if gid is not None and gid != "" and not (isinstance(gid, int) and not isinstance(gid, bool) and 0 <= gid <= GID_INDEX_MAX):
            errors.append(f"{host}: cluster_gid_index: {gid!r} must be empty or an index of the RoCE GID table, 0 to "
                          f"{GID_INDEX_MAX} (show_gids lists them)")
    return errors


def declaration_problems(cluster: t.Mapping[str, t.Any], inventory: t.Collection[str]) -> list[str]:
    """Problems of the declaration itself, before any node is looked at."""
    cluster = coerced(CLUSTER_SETTINGS, {**DEFAULTS, **cluster})
    errors = []
    nodes = cluster.get("nodes")
    node_vars = cluster["node_vars"] if isinstance(cluster["node_vars"], dict) else {}
    if not isinstance(nodes, list) or len(nodes) < 2 or not all(isinstance(n, str) for n in nodes):
        errors.append("cluster_nodes: list the cluster's hosts in rank order (the first is the head), at least two")
        nodes = []
    else:
        repeated = sorted({n for n in nodes if nodes.count(n) > 1})
        unknown = [n for n in nodes if n not in inventory]
        if repeated:
            errors.append(f"cluster_nodes: {', '.join(repeated)} listed more than once; each host is one node")
        if unknown:
            errors.append(f"cluster_nodes: {', '.join(unknown)} not in the inventory")
        errors += same_box_problems(list(dict.fromkeys(nodes)), node_vars)
    errors += setting_problems("cluster_", CLUSTER_SETTINGS, cluster)
    errors += fast_network_problems(cluster)
    problem = dropin_problem("cluster_logind_remove_ipc_dropin", cluster["logind_remove_ipc_dropin"], LOGIND_DROPIN_FOLDERS,
                             "RemoveIPC=no would not apply and a logout would remove the ranks' shared memory")
    errors += [problem] if problem else []
    errors += override_problems(nodes, node_vars) + environment_problems(cluster, nodes, node_vars)
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
    elif nodes and is_count(cluster.get("gpus_per_node")) and cluster["gpus_per_node"] <= GPUS_PER_NODE_MAX:
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
    network is then a stand-in, and the instance plan still checks the model across nodes). Numbers and
    switches given as text (extra variables) are read as the role's argument spec reads them."""
    cluster = coerced(CLUSTER_SETTINGS, {**DEFAULTS, **cluster})
    errors = declaration_problems(cluster, inventory)
    plan: dict[str, t.Any] = {"nodes": {}, "errors": errors, "head": None, "master_addr": None}
    if errors:
        return plan
    if reports is None:
        reports = {host: {"stand_in": True} for host in cluster["nodes"]}
    missing = [host for host in cluster["nodes"] if host not in reports]
    if missing:
        plan["errors"] = [f"cluster_nodes: {', '.join(missing)} did not report (unreachable, or not in this play); "
                          "a cluster is only changed with every node in the play (or leave the clusters out of this run: --skip-tags cluster)"]
        return plan
    networks = {}
    for host in cluster["nodes"]:
        network, problems = (stand_in_network(host), []) if reports[host].get("stand_in") else node_network(host, reports[host], cluster)
        errors += problems
        networks[host] = network
    by_address: dict[str, list[str]] = {}
    for host, network in networks.items():
        if network and not reports[host].get("stand_in"):
            by_address.setdefault(network["address"], []).append(host)
    errors += [f"cluster_nodes: {' and '.join(hosts)} have one fast address, {address}: one box under two inventory names, or "
               "two boxes with one address; either way two ranks would collide on it. List each box once, or fix the addresses"
               for address, hosts in by_address.items() if len(hosts) > 1]
    head = cluster["nodes"][0]
    master = cluster.get("master_addr") or (networks[head] or {}).get("address")
    if cluster.get("master_addr") and reports[head].get("stand_in"):
        problem = master_addr_problem(str(cluster["master_addr"]), str(cluster["fast_network"]))
        errors += [problem] if problem else []
    elif cluster.get("master_addr") and networks[head] and cluster["master_addr"] != networks[head]["address"]:
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
                # Every rank's node and fast address, in rank order: the watchdog restarts them all together.
                "nodes": [{"name": node, "rank": index, "address": networks[node]["address"]} for index, node in enumerate(cluster["nodes"])],
            },
        }
    return plan


def fleet_cluster_problems(declarations: t.Mapping[str, t.Mapping[str, t.Any]], cluster: str | None = None) -> list[str]:
    """What only all hosts together show (``declarations``: host -> its ``cluster_name``,
    ``cluster_nodes`` and ``sparkfleet_hardware_class``): a host listed by two clusters, a node whose
    own cluster_name is not the cluster listing it (it would never run its rank), one cluster whose
    hosts list different nodes, one whose nodes are of different hardware classes.
    With ``cluster``, only the problems that cluster is part of."""
    listings: dict[str, dict[tuple[t.Any, ...], list[str]]] = {}
    for host, values in declarations.items():
        name, nodes = values.get("cluster_name") or "", values.get("cluster_nodes")
        if name and isinstance(nodes, list):
            listings.setdefault(name, {}).setdefault(tuple(nodes), []).append(host)
    problems: list[tuple[set[str], str]] = []
    for name, lists in sorted(listings.items()):
        if len(lists) > 1:
            seen = "; ".join(f"{', '.join(hosts)}: {', '.join(map(str, nodes)) or 'none'}" for nodes, hosts in lists.items())
            problems.append(({name}, f"cluster_nodes of cluster {name}: its hosts list different nodes ({seen}); every node must "
                                     "see the same cluster. Set the cluster_* variables in the group_vars of one group holding "
                                     "exactly the cluster's nodes"))
    listed_by: dict[str, set[str]] = {}
    for name, lists in listings.items():
        for nodes in lists:
            for node in nodes:
                listed_by.setdefault(str(node), set()).add(name)
    for node, names in sorted(listed_by.items()):
        if len(names) > 1:
            problems.append((names, f"{node}: listed in the cluster_nodes of clusters {', '.join(sorted(names))}; a host is a node "
                                    "of one cluster at most (its GPU and memory pool serve one). Remove it from all but one"))
        if node not in declarations:
            continue
        own = declarations[node].get("cluster_name") or ""
        for name in sorted(names - {own}):
            problems.append(({name, own} - {""}, f"{node}: listed in cluster {name}'s cluster_nodes, but its own cluster_name is "
                                                 f"{own or 'empty'}, so it would never run its rank and cluster {name} could not "
                                                 "start. Set the cluster_* variables in the group_vars of one group holding "
                                                 "exactly the cluster's nodes"))
    for name, lists in sorted(listings.items()):
        nodes = [str(node) for node in next(iter(lists))]
        classes = {node: str(declarations[node].get("sparkfleet_hardware_class") or "") or None for node in nodes if node in declarations}
        if len(set(classes.values())) > 1:
            seen = ", ".join(f"{node}: {hardware_class or 'none set'}" for node, hardware_class in classes.items())
            problems.append(({name}, f"cluster {name}: its nodes are of different hardware classes ({seen}); the model is split "
                                     "evenly over them and every rank gets one plan, so the values of one class (its memory "
                                     "ceiling, batched tokens, environment) would be wrong for the others' boxes. Build a cluster "
                                     "of one hardware class, or set sparkfleet_hardware_class alike for every node if the boxes "
                                     "are alike"))
    return [message for names, message in problems if cluster is None or cluster in names]


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


def stale_ranks(deployed: t.Mapping[str, t.Any], keep: str, config_dir: str) -> dict[str, t.Any]:
    """The ranks a host runs but no longer serves, from their plan files (path -> the file's text):
    ``{"ranks": [{"name", "unit", "container", "files"}], "problems": [...]}``. Every rank but the
    cluster ``keep`` (the host's cluster_name, empty for none) is stale; a plan file that does not
    name one of the collection's ranks (damaged or edited) is a problem, so it never stops another
    unit or removes another container."""
    ranks, problems = [], []
    for path, text in sorted(deployed.items()):
        name = path.rsplit("/", 1)[-1].removesuffix(".json")
        if name == keep:
            continue
        try:
            plan = json.loads(text)
        except ValueError as error:
            problems.append(f"{path}: not a rank's plan ({error}); remove the rank by hand (systemctl disable --now, docker rm), then the file")
            continue
        rank = removal(config_dir, name, True)
        if not UNIT_NAME.fullmatch(name) or not isinstance(plan, dict) or (plan.get("name"), plan.get("unit"), plan.get("container")) != (
                name, rank["unit"], rank["container"]):
            problems.append(f"{path}: does not name the cluster rank {name!r} (its unit {rank['unit']}, its container {rank['container']}); "
                            "it was not removed: remove the rank by hand (systemctl disable --now, docker rm), then the file")
            continue
        ranks.append(rank)
    return {"ranks": ranks, "problems": problems}


# NCCL inside a cluster's image (field reports): cross-node CUDA-graph capture could deadlock before 2.30.4, which fixed
# it (seed 002 pins 2.30.4); pip's 2.28.9 beside another system NCCL in one image wedged collectives.
NCCL_DEADLOCK_FIXED = (2, 30, 4)
NCCL_WEDGED_PIP = (2, 28, 9)
# Run by the image's own Python in a throwaway container without network: the NCCL packages pip installed (what vLLM
# loads) and the one the image's system declares (NGC images set NCCL_VERSION). No GPU is needed to read either.
NCCL_PROBE = (
    "import json, os\n"
    "from importlib import metadata\n"
    "found = {}\n"
    "for name in ('nvidia-nccl-cu13', 'nvidia-nccl-cu12', 'nvidia-nccl-cu11'):\n"
    "    try:\n"
    "        found[name] = metadata.version(name)\n"
    "    except metadata.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps({'pip': found, 'system': os.environ.get('NCCL_VERSION')}))\n"
)
NCCL_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def nccl_probe_argv(image: str) -> list[str]:
    # Never pulled here: the image is the one serving_host pulled and verified (in check mode it may not be there yet).
    return [DOCKER_CLIENT, "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint", "python3", image, "-c", NCCL_PROBE]


def nccl_release(text: t.Any) -> tuple[int, int, int] | None:
    match = NCCL_RELEASE.match(text) if isinstance(text, str) else None
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def nccl_verdict(probe: t.Mapping[str, t.Any], serve_args: t.Sequence[str], image: str) -> dict[str, t.Any]:
    """What the NCCL in a cluster's image means for it: {errors, warnings, pip, system}. ``probe``: NCCL_PROBE's run
    (rc, stdout, stderr). An NCCL before 2.30.4 is refused (the cross-node CUDA-graph deadlock), or only warned about when
    the cluster runs without CUDA graphs (--enforce-eager); an NCCL that cannot be read is reported, not passed silently."""
    found: t.Any = None
    if probe.get("rc") == 0:
        try:
            found = json.loads(str(probe.get("stdout") or "").strip().splitlines()[-1])
        except (ValueError, IndexError):
            found = None
    if not isinstance(found, dict) or not isinstance(found.get("pip"), dict):
        why = str(probe.get("stderr") or probe.get("stdout") or probe.get("msg") or "no output").strip()[-200:]
        return {"errors": [], "pip": None, "system": None, "warnings": [
            f"cluster_instance: the NCCL in {image} could not be read ({why}); the cross-node CUDA-graph deadlock of NCCL before "
            f"{'.'.join(map(str, NCCL_DEADLOCK_FIXED))} cannot be ruled out"]}
    pip = {name: version for name, version in found["pip"].items() if nccl_release(version)}
    system = found.get("system") if nccl_release(found.get("system")) else None
    releases = sorted((nccl_release(version), f"{version} ({name}, pip)") for name, version in pip.items())
    loaded = releases[-1] if releases else ((nccl_release(system), f"{system} (the image's NCCL_VERSION)") if system else None)
    verdict: dict[str, t.Any] = {"errors": [], "warnings": [], "pip": pip, "system": system}
    fixed = ".".join(map(str, NCCL_DEADLOCK_FIXED))
    if loaded is None:
        verdict["warnings"].append(f"cluster_instance: {image} declares no NCCL (no nvidia-nccl package, no NCCL_VERSION); the "
                                   f"cross-node CUDA-graph deadlock of NCCL before {fixed} cannot be ruled out")
    elif loaded[0] < NCCL_DEADLOCK_FIXED:
        what = (f"cluster_instance: the NCCL vLLM loads from {image} is {loaded[1]}, before {fixed}, which fixed a cross-node "
                "deadlock in CUDA-graph capture")
        if "--enforce-eager" in serve_args:
            verdict["warnings"].append(what + "; the cluster runs without CUDA graphs (enforce_eager), so the capture cannot deadlock")
        else:
            verdict["errors"].append(what + f": use an image with NCCL {fixed} or later, or set enforce_eager: true (no CUDA graphs, "
                                     "slower decode)")
    wedged = [name for name, version in pip.items() if nccl_release(version) == NCCL_WEDGED_PIP]
    if wedged and system and nccl_release(system) != NCCL_WEDGED_PIP:
        verdict["warnings"].append(f"cluster_instance: {image} carries pip's NCCL 2.28.9 ({', '.join(wedged)}) beside the system's "
                                   f"{system}: that pairing wedged cross-node collectives in the field; pin one NCCL in the image")
    return verdict
