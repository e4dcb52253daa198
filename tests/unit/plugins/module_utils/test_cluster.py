"""A cluster planned per node: every node's argv and environment, and every refusal."""

import copy
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from plan_options import plan_options

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import (
    CLUSTER_SETTINGS,
    agreement_problems,
    cluster_nodes,
    fleet_cluster_problems,
    nccl_probe_argv,
    nccl_verdict,
    stale_ranks,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster_sequence import restart
from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import parse_ibdev2netdev
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import bounds_table
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import build_plan

DIGEST = "sha256:" + "cd" * 32
IMAGE = f"registry.local:5000/vllm:0.32.0@{DIGEST}"
KEY = "k" * 32
LINKS = parse_ibdev2netdev((Path(__file__).parents[2] / "fixtures" / "fabric" / "ibdev2netdev_two_sparks.txt").read_text())
GIDS = [{"device": d, "port": 1, "index": 3, "gid": "", "ipv4": None, "version": "v2", "netdev": ""} for d in ("rocep1s0f0", "roceP2p1s0f0")]


def facts(address, interface="enp1s0f0np0", mtu=9000):
    return {"interfaces": ["lo", "enP7s7", interface], "all_ipv4_addresses": ["10.0.0.5", address],
            "lo": {"ipv4": {"address": "127.0.0.1"}, "mtu": 65536}, "enP7s7": {"ipv4": {"address": "10.0.0.5"}, "mtu": 1500},
            interface: {"ipv4": {"address": address}, "mtu": mtu}}


def report(address, **changes):
    gids = [{**g, "ipv4": address} for g in GIDS]
    value = {"facts": facts(address), "overrides": {}, "rdma_links": LINKS, "gids": gids, "image": IMAGE, "manifest": "ab" * 32}
    value.update(changes)
    return value


def declaration(nodes=("spark-1", "spark-2"), **changes):
    value = {
        "name": "qwen", "nodes": list(nodes), "backend": "native", "master_port": 29501, "gpus_per_node": 1,
        "fast_network": "192.168.100.0/24", "mtu": 9000, "require_rdma": True, "vllm_version": "0.32.0", "master_addr": "",
        "instance": {"model": "/models/qwen", "served_model_names": ["qwen"], "port": 8000, "api_key": KEY,
                     "bind_addresses": ["10.0.0.5"], "gpu_memory_utilization": 0.8, "tensor_parallel_size": len(nodes)},
    }
    value.update(changes)
    return value


REPORTS = {f"spark-{n}": report(f"192.168.100.1{n}") for n in range(1, 5)}
INVENTORY = list(REPORTS) + ["gateway"]


def planned(cluster=None, reports=None):
    return cluster_nodes(cluster or declaration(), reports or REPORTS, INVENTORY)


def node_plan(cluster, node, **options):
    option = {**node["option"], "node_env": options.pop("node_env", {})}
    instance = {**cluster["instance"], "name": cluster["name"]}
    return build_plan([instance], {}, **plan_options(**{
        "image": IMAGE, "host_addresses": ["10.0.0.5", "192.168.100.11", "127.0.0.1"], "wait_online_enabled": True,
        "vllm_version": cluster["vllm_version"], "config_dir": "/etc/sparkfleet/cluster", **options, "cluster": option}))


def test_two_sparks_each_get_their_rank_and_fast_link():
    result = planned()
    assert result["errors"] == [] and result["head"] == "spark-1" and result["master_addr"] == "192.168.100.11"
    head, worker = result["nodes"]["spark-1"], result["nodes"]["spark-2"]
    assert (head["rank"], worker["rank"]) == (0, 1)
    assert worker["option"]["network_env"] == {
        "VLLM_HOST_IP": "192.168.100.12", "NCCL_SOCKET_IFNAME": "enp1s0f0np0", "GLOO_SOCKET_IFNAME": "enp1s0f0np0",
        "TP_SOCKET_IFNAME": "enp1s0f0np0", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
        "UCX_NET_DEVICES": "rocep1s0f0:1,roceP2p1s0f0:1", "NCCL_IB_GID_INDEX": "3", "MASTER_ADDR": "192.168.100.11",
    }
    assert worker["network"]["mtu"] == 9000


def test_the_worker_runs_headless_on_the_host_network_and_the_head_serves():
    cluster = declaration()
    nodes = planned(cluster)["nodes"]
    head = node_plan(cluster, nodes["spark-1"])
    worker = node_plan(cluster, nodes["spark-2"], host_addresses=["10.0.0.6", "192.168.100.12", "127.0.0.1"],
                       node_env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    assert head["errors"] == [] and worker["errors"] == []
    h, w = head["instances"][0], worker["instances"][0]
    assert (h["unit"], h["container"]) == ("sparkfleet-cluster-qwen.service", "vllm-cluster-qwen")
    assert h["serve_args"][:5] == ["/models/qwen", "--host", "10.0.0.5", "--port", "8000"]
    tail = ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "1", "--master-addr", "192.168.100.11",
            "--master-port", "29501", "--headless"]
    assert w["serve_args"][-len(tail):] == tail
    assert "--headless" not in h["serve_args"] and "--tensor-parallel-size" in h["serve_args"]
    for node in (h, w):
        run = node["docker_run"]
        assert "--publish" not in run and run[run.index("--network") + 1] == "host"
        assert run[run.index("--device") + 1] == "/dev/infiniband" and "memlock=-1" in run
        assert node["published_ports"] == [] and node["url"] == "http://10.0.0.5:8000"
    assert "ExecStartPost=" in h["unit_file"] and "ExecStartPost=" not in w["unit_file"]
    assert "vLLM cluster qwen rank 1" in w["unit_file"]
    assert "Restart=no" in w["unit_file"] and "Restart=no" in h["unit_file"], "one rank alone never rejoins its group"
    wait = next(line for line in w["unit_file"].splitlines() if "cluster_fabric_wait.py" in line)
    assert shlex.split(wait[len("ExecStartPre="):]) == [
        "/usr/bin/python3", "-I", "/usr/local/libexec/sparkfleet/cluster_fabric_wait.py", "--source", "spark-2",
        "--interface", "enp1s0f0np0", "--mtu", "9000", "--peer=spark-1=192.168.100.11"]
    installed = [helper["path"] for helper in worker["helpers"]]
    assert "/usr/local/libexec/sparkfleet/cluster_fabric_wait.py" in installed, "the node installs the wait its unit runs"
    assert w["cluster"] == {"rank": 1, "head": False, "nnodes": 2, "backend": "native", "master_addr": "192.168.100.11",
                            "master_port": 29501, "host_ip": "192.168.100.12",
                            "nodes": [{"name": "spark-1", "rank": 0, "address": "192.168.100.11"},
                                      {"name": "spark-2", "rank": 1, "address": "192.168.100.12"}], "start_wave": 0}
    env = worker["env_files"]["qwen"]
    assert "VLLM_HOST_IP=192.168.100.12\n" in env and "VLLM_CPU_OMP_THREADS_BIND=1\n" in env and f"VLLM_API_KEY={KEY}\n" in env
    assert h["config_hash"] != w["config_hash"]


def test_ray_workers_join_the_head_which_hands_over_to_vllm():
    cluster = declaration(backend="ray")
    nodes = planned(cluster)["nodes"]
    h = node_plan(cluster, nodes["spark-1"])["instances"][0]
    w = node_plan(cluster, nodes["spark-2"], host_addresses=None)["instances"][0]
    worker_run = w["docker_run"]
    entry = worker_run.index("--entrypoint")
    assert worker_run[entry + 1:entry + 3] == ["ray", IMAGE.replace(":0.32.0", "")]
    assert worker_run[entry + 3:] == ["start", "--block", "--node-ip-address", "192.168.100.12", "--num-gpus", "1",
                                      "--address", "192.168.100.11:6379"]
    head_run = h["docker_run"]
    script = head_run[head_run.index("-c") + 1]
    assert script == "ray start --node-ip-address 192.168.100.11 --num-gpus 1 --head --port 6379 && exec vllm serve \"$@\""
    assert head_run[head_run.index("-c") + 2] == "vllm-serve"
    assert head_run[-2:] == ["--distributed-executor-backend", "ray"]
    # The unit runs the plan file's argv through the host runtime, each argument one JSON string; a worker has no readiness wait.
    assert f"ExecStart=/usr/bin/python3 -I /usr/local/libexec/sparkfleet/sparkfleet_runtime.py start --plan {h['plan_path']}" in h["unit_file"]
    assert "ExecStartPost=" in h["unit_file"] and "ExecStartPost=" not in w["unit_file"]


@pytest.mark.parametrize("nodes", [("spark-1", "spark-2"), ("spark-1", "spark-2", "spark-3", "spark-4")])
def test_tensor_parallel_size_must_be_nodes_times_gpus(nodes):
    cluster = declaration(nodes)
    cluster["instance"]["tensor_parallel_size"] = 1
    errors = planned(cluster)["errors"]
    assert errors == [f"cluster_instance.tensor_parallel_size: 1; {len(nodes)} nodes x 1 GPU per node is {len(nodes)}, and the "
                      "model is split over every GPU (pipeline parallelism is not planned). "
                      f"Set it to {len(nodes)}, or change cluster_nodes"]
    cluster = declaration(nodes, gpus_per_node=2)
    assert "is " + str(2 * len(nodes)) in planned(cluster)["errors"][0]


NODES = ["spark-1", "spark-2"]


def test_every_node_must_run_the_same_image():
    reports = copy.deepcopy(REPORTS)
    assert agreement_problems(NODES, reports) == ([], [])
    reports["spark-2"]["image"] = IMAGE.replace("cd" * 32, "ef" * 32)
    errors, _warnings = agreement_problems(NODES, reports)
    assert len(errors) == 1 and errors[0].startswith("cluster image: the nodes would run different images")
    assert "spark-2: registry.local:5000/vllm:0.32.0@sha256:efef" in errors[0]


def test_every_node_must_load_the_same_checkpoint():
    reports = copy.deepcopy(REPORTS)
    reports["spark-2"]["manifest"] = None
    errors, _warnings = agreement_problems(NODES, reports)
    assert len(errors) == 1 and "spark-1: abababababab; spark-2: no manifest" in errors[0]
    for host in reports:
        reports[host]["manifest"] = None
    errors, warnings = agreement_problems(NODES, reports)
    assert errors == [] and "cannot be compared" in warnings[0]


@pytest.mark.parametrize(("version", "expected"), [
    ("0.26.0", "vllm_version: 0.26.0 cannot run a cluster: multi-node needs vLLM 0.27.0 or later"),
    ("", "a cluster needs the image's vLLM release stated"),
])
def test_a_vllm_without_working_multi_node_is_refused(version, expected):
    cluster = declaration(vllm_version=version)
    cluster["instance"]["tensor_parallel_size"] = 1
    assert len(planned(cluster)["errors"]) == 2, "every problem at once"
    errors = planned(declaration(vllm_version=version))["errors"]
    assert len(errors) == 1 and expected in errors[0]


def test_the_master_address_must_be_the_heads_fast_address():
    errors = planned(declaration(master_addr="10.0.0.5"))["errors"]
    assert errors == ["cluster_master_addr: 10.0.0.5 is not the head's (spark-1) address on the fast link (192.168.100.11 on "
                      "enp1s0f0np0); the ranks would rendezvous off the fast link. Leave it unset: the head's fast address "
                      "is the master"]
    assert planned(declaration(master_addr="192.168.100.12"))["errors"][0].startswith("cluster_master_addr: 192.168.100.12 is not")
    assert planned(declaration(master_addr="192.168.100.11"))["errors"] == []


def test_without_the_nodes_facts_a_master_address_in_the_fast_network_is_accepted():
    """Only the inventory checked: the head's fast address is unknown, so the right one must pass."""
    layout = cluster_nodes(declaration(master_addr="192.168.100.11"), None, INVENTORY)
    assert layout["errors"] == [] and layout["master_addr"] == "192.168.100.11"
    assert layout["nodes"]["spark-2"]["option"]["network_env"]["MASTER_ADDR"] == "192.168.100.11"
    for wrong in ("10.0.0.5", "192.168.100.0", "192.168.100.255", "head"):
        errors = cluster_nodes(declaration(master_addr=wrong), None, INVENTORY)["errors"]
        assert errors == [f"cluster_master_addr: {wrong} is not a host address of cluster_fast_network 192.168.100.0/24; the "
                          "ranks would rendezvous off the fast link. Leave it unset (the head's fast address is the master), "
                          "or give that address"], errors


def test_a_node_without_the_fast_link_or_rdma_is_named():
    reports = copy.deepcopy(REPORTS)
    reports["spark-2"]["facts"] = facts("172.16.0.2")
    reports["spark-1"]["rdma_links"] = [{**link, "up": False} for link in LINKS]
    errors = planned(reports=reports)["errors"]
    assert any(e.startswith("spark-2: no interface with an address in cluster_fast_network 192.168.100.0/24 (it has 10.0.0.5, "
                            "172.16.0.2)") for e in errors)
    assert any(e.startswith("spark-1: no RDMA device is up (rocep1s0f0, rocep1s0f1, roceP2p1s0f0, roceP2p1s0f1)") for e in errors)
    assert planned(declaration(require_rdma=False, fast_network="192.168.100.0/24"),
                   {**REPORTS, "spark-1": {**REPORTS["spark-1"], "rdma_links": []}})["errors"] == []


def test_a_fast_interface_override_off_the_fast_network_is_refused():
    reports = copy.deepcopy(REPORTS)
    reports["spark-2"]["overrides"] = {"fast_interface": "enP7s7"}
    errors = planned(reports=reports)["errors"]
    assert errors == ["spark-2: cluster_fast_interface enP7s7 has 10.0.0.5, outside cluster_fast_network 192.168.100.0/24; "
                      "the ranks would talk off the fast link"]


def test_overrides_replace_what_facts_found():
    reports = copy.deepcopy(REPORTS)
    reports["spark-2"]["overrides"] = {"rdma_devices": ["roceP2p1s0f0"], "gid_index": 1}
    env = planned(reports=reports)["nodes"]["spark-2"]["option"]["network_env"]
    assert (env["NCCL_IB_HCA"], env["NCCL_IB_GID_INDEX"]) == ("roceP2p1s0f0", "1")


def test_a_node_missing_from_the_play_stops_the_cluster():
    reports = {host: value for host, value in REPORTS.items() if host != "spark-2"}
    assert "spark-2 did not report" in planned(reports=reports)["errors"][0]


@pytest.mark.parametrize(("changes", "expected"), [
    ({"nodes": ["spark-1"]}, "cluster_nodes: list the cluster's hosts in rank order"),
    ({"nodes": ["spark-1", "spark-1"]}, "cluster_nodes: spark-1 listed more than once"),
    ({"nodes": ["spark-1", "spark-9"]}, "cluster_nodes: spark-9 not in the inventory"),
    ({"backend": "slurm"}, "cluster_backend: 'slurm' is not one of native, ray"),
    ({"master_port": 70000}, "cluster_master_port: 70000 must be a port number between 1 and 65535"),
    ({"fast_network": "fast"}, "cluster_fast_network: 'fast' must be the fast link's subnet"),
])
def test_declaration_refusals(changes, expected):
    errors = planned(declaration(**changes))["errors"]
    assert any(e.startswith(expected) for e in errors), errors


def test_two_bind_addresses_are_refused_on_a_cluster():
    cluster = declaration()
    cluster["instance"]["bind_addresses"] = ["10.0.0.5", "127.0.0.1"]
    assert "give exactly one address" in planned(cluster)["errors"][0]


def test_node_env_cannot_replace_the_network_or_the_key():
    cluster = declaration()
    node = planned(cluster)["nodes"]["spark-2"]
    result = node_plan(cluster, node, node_env={"NCCL_SOCKET_IFNAME": "eth0", "VLLM_API_KEY": "x" * 20},
                       host_addresses=None)
    assert "cluster_node_env: NCCL_SOCKET_IFNAME is set by the role" in " ".join(result["errors"])
    assert "cluster_node_env: VLLM_API_KEY is set by the role" in " ".join(result["errors"])
    cluster["instance"]["env"] = {"MASTER_ADDR": "10.9.9.9"}
    result = node_plan(cluster, node, host_addresses=None)
    assert result["errors"] == ["cluster_instance.env: MASTER_ADDR is set by the role (from the plan); it may not be replaced through env"]


def test_dev_mode_through_a_nodes_env_needs_the_opt_in_and_a_loopback_bind():
    cluster = declaration()
    node = planned(cluster)["nodes"]["spark-2"]
    closed = node_plan(cluster, node, node_env={"VLLM_SERVER_DEV_MODE": "1"}, host_addresses=None)
    assert any(e.startswith("cluster_node_env.VLLM_SERVER_DEV_MODE: opens") and "vllm_allow_dev_mode" in e for e in closed["errors"])
    # The opt-in does not open it on a cluster's address other hosts reach.
    exposed = node_plan(cluster, node, node_env={"VLLM_SERVER_DEV_MODE": "1"}, host_addresses=None, allow_dev_mode=True)
    assert any(e.startswith("cluster_node_env.VLLM_SERVER_DEV_MODE:") and "binds 10.0.0.5" in e for e in exposed["errors"])


def test_extra_args_cannot_move_a_rank_or_the_rendezvous():
    cluster = declaration()
    node = planned(cluster)["nodes"]["spark-2"]
    cluster["instance"]["extra_args"] = ["--node-rank=0", "--master-addr", "10.9.9.9", "--data-parallel-address=0.0.0.0"]
    errors = node_plan(cluster, node, host_addresses=None)["errors"]
    assert [e.split(" would set ")[1].split(",")[0] for e in errors] == ["--node-rank", "--master-addr", "--data-parallel-address"]
    assert all(e.startswith("cluster_instance.extra_args:") for e in errors)


def test_known_broken_combinations_across_nodes_are_refused():
    cluster = declaration()
    cluster["instance"] = {**cluster["instance"], "catalog": "gemma-4-26b-a4b-it-nvfp4", "model": None, "max_model_len": 32768}
    del cluster["instance"]["model"]
    node = planned(cluster)["nodes"]["spark-1"]
    errors = node_plan(cluster, node)["errors"]
    assert any("enable_expert_parallel False with catalog entry gemma-4-26b-a4b-it-nvfp4 across nodes is known to break" in e
               for e in errors), errors
    mtp = {"method": "mtp", "num_speculative_tokens": 2, "model": "google/gemma-4-26B-A4B-it-assistant"}
    cluster["instance"].update(enable_expert_parallel=True, speculative=mtp)
    errors = node_plan(cluster, node)["errors"]
    assert len(errors) == 1 and "speculative_method mtp with catalog entry gemma-4-26b-a4b-it-nvfp4 across nodes" in errors[0]
    cluster["instance"]["speculative"] = {"method": "dflash", "num_speculative_tokens": 8, "model": "z-lab/gemma-4-26B-A4B-it-DFlash",
                                          "options": {"attention_backend": "triton_attn"}}
    assert "dflash" in node_plan(cluster, node)["errors"][0]
    assert node_plan(cluster, node, vllm_version="0.29.0")["errors"] == []
    # On one node the same drafter is fine: the rule holds across nodes only.
    single = {**cluster["instance"], "name": "one", "port": 8001}
    del single["tensor_parallel_size"]
    assert build_plan([single], {}, **plan_options(image=IMAGE, host_addresses=None, vllm_version="0.32.0"))["errors"] == []


def test_each_rank_holds_its_part_of_the_weights_and_the_kv_cache():
    cluster = declaration()
    cluster["instance"] = {**cluster["instance"], "catalog": "gemma-4-31b-it-nvfp4", "max_model_len": 131072,
                           "gpu_memory_utilization": 0.78}
    del cluster["instance"]["model"]
    node = planned(cluster)["nodes"]["spark-1"]
    memory = node_plan(cluster, node)["instances"][0]["memory"]
    assert (memory["ranks"], memory["weights_gib"]) == (2, 11.78)
    assert "minus weights 11.78 GiB (1/2 of 23.55 GiB per rank)" in memory["arithmetic"]
    single = build_plan([{**cluster["instance"], "name": "one", "tensor_parallel_size": None}], {},
                        **plan_options(image=IMAGE, host_addresses=None, vllm_version="0.32.0"))["instances"][0]["memory"]
    assert memory["full_length_request_gib"] == round(single["full_length_request_gib"] / 2, 2)


@pytest.mark.parametrize(("network", "expected"), [
    ("0.0.0.0/0", "cluster_fast_network: 0.0.0.0/0 spans 4294967296 addresses, wider than any one link (the widest private "
                  "block is a /8): an interface on the LAN or the management network would match it"),
    ("10.0.0.0/7", "cluster_fast_network: 10.0.0.0/7 spans 33554432 addresses, wider than any one link"),
    ("fd00::/64", "cluster_fast_network: fd00::/64 is an IPv6 subnet; each node's fast address is read from its IPv4 facts"),
    ("192.168.100.11/32", "cluster_fast_network: 192.168.100.11/32 holds 1 node address, fewer than the 2 nodes"),
    ("127.0.0.0/8", "cluster_fast_network: 127.0.0.0/8 is loopback, multicast, reserved or 'this network' (0.0.0.0/8) space"),
    ("0.0.0.0/8", "cluster_fast_network: 0.0.0.0/8 is loopback, multicast, reserved or 'this network'"),
    ("240.0.0.0/8", "cluster_fast_network: 240.0.0.0/8 is loopback, multicast, reserved or 'this network'"),
])
def test_a_fast_network_no_link_could_be_is_refused(network, expected):
    errors = planned(declaration(fast_network=network))["errors"]
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_the_widest_and_narrowest_fast_networks_pass():
    assert planned(declaration(fast_network="192.168.0.0/8"))["errors"] == []
    pair = {host: report(address) for host, address in (("spark-1", "192.168.100.10"), ("spark-2", "192.168.100.11"))}
    assert planned(declaration(fast_network="192.168.100.10/31"), pair)["errors"] == [], "a /31 is a point-to-point link"
    four = declaration(("spark-1", "spark-2", "spark-3", "spark-4"), fast_network="192.168.100.8/30")
    assert "holds 2 node addresses, fewer than the 4 nodes" in cluster_nodes(four, None, INVENTORY)["errors"][0]


def test_one_box_under_two_names_is_refused():
    same = {"spark-1": {"ansible_host": "192.0.2.10"}, "spark-2": {"ansible_host": "192.0.2.10"}}
    errors = planned(declaration(node_vars=same))["errors"]
    assert errors == ["cluster_nodes: spark-1 and spark-2 are one box (ansible_host 192.0.2.10); as 2 ranks they would share "
                      "its one GPU and memory pool. List each box once"]
    spelled = {"spark-1": {"ansible_host": "Spark-1.lan"}, "spark-2": {"ansible_host": "spark-1.LAN", "ansible_port": 22}}
    assert "are one box (ansible_host spark-1.lan)" in planned(declaration(node_vars=spelled))["errors"][0]
    by_name = {"spark-2": {"ansible_host": "spark-1"}}
    assert "spark-1 and spark-2 are one box" in planned(declaration(node_vars=by_name))["errors"][0]
    forwarded = {"spark-1": {"ansible_host": "192.0.2.1", "ansible_port": 2201}, "spark-2": {"ansible_host": "192.0.2.1", "ansible_port": 2202}}
    assert planned(declaration(node_vars=forwarded))["errors"] == [], "two SSH ports of one address are two boxes behind it"


def test_two_nodes_with_one_fast_address_are_refused():
    reports = copy.deepcopy(REPORTS)
    reports["spark-2"] = report("192.168.100.11")
    errors = planned(reports=reports)["errors"]
    assert errors == ["cluster_nodes: spark-1 and spark-2 have one fast address, 192.168.100.11: one box under two inventory "
                      "names, or two boxes with one address; either way two ranks would collide on it. List each box once, "
                      "or fix the addresses"]


@pytest.mark.parametrize(("where", "env", "expected"), [
    ("node_env", {"NCCL_IB_DISABLE": "1"}, "spark-2: cluster_node_env.NCCL_IB_DISABLE: '1' turns RDMA off (NCCL reads any "
                                           "value but 0 as: no InfiniBand or RoCE transport) while cluster_require_rdma is true"),
    ("vllm_env", {"NCCL_NET": "socket"}, "spark-2: vllm_env.NCCL_NET: 'socket' turns RDMA off (NCCL uses its TCP socket "
                                         "transport only)"),
    ("hardware_env", {"NCCL_IB_DISABLE": 1}, "spark-2: sparkfleet_hardware_overrides.env.NCCL_IB_DISABLE: 1 turns RDMA off"),
    ("instance", {"NCCL_NET": "Socket"}, "cluster_instance.env.NCCL_NET: 'Socket' turns RDMA off"),
])
def test_an_environment_turning_rdma_off_is_refused_while_rdma_is_required(where, env, expected):
    cluster = declaration()
    if where == "instance":
        cluster["instance"]["env"] = env
    else:
        cluster["node_vars"] = {"spark-2": {where: env}}
    errors = planned(cluster)["errors"]
    assert len(errors) == 1 and errors[0].startswith(expected), errors
    assert errors[0].endswith("NCCL would fall back to TCP sockets (about 3 GB/s). Remove it, or set cluster_require_rdma: false "
                              "for a cluster without RDMA")
    assert planned({**cluster, "require_rdma": False}, {**REPORTS, "spark-1": {**REPORTS["spark-1"], "rdma_links": []}})["errors"] == []


def test_the_environment_a_container_gets_is_judged_not_each_layer():
    cluster = declaration()
    cluster["instance"]["env"] = {"NCCL_IB_DISABLE": "1"}
    cluster["node_vars"] = {node: {"node_env": {"NCCL_IB_DISABLE": "0", "NCCL_NET_PLUGIN": "none", "NCCL_NET": "IB"}}
                            for node in ("spark-1", "spark-2")}
    assert planned(cluster)["errors"] == [], "the node's 0 replaces the instance's 1; NCCL_NET_PLUGIN=none keeps the IB transport"


@pytest.mark.parametrize(("changes", "expected"), [
    ({"mtu": 67}, "cluster_mtu: 67 must be a whole number from 68 to 9216; the fabric gate's don't-fragment ping fills a frame "
                  "with MTU - 28 bytes"),
    ({"mtu": 9217}, "cluster_mtu: 9217 must be a whole number from 68 to 9216"),
    ({"mtu": True}, "cluster_mtu: True must be a whole number"),
    ({"gpus_per_node": 9}, "cluster_gpus_per_node: 9 must be a whole number from 1 to 8"),
    ({"ping_count": 0}, "cluster_ping_count: 0 must be a whole number from 1 to 100"),
    ({"nccl_min_busbw_gbs": 0}, "cluster_nccl_min_busbw_gbs: 0 must be a number above 0 and at most 100"),
    ({"nccl_min_busbw_gbs": 400.0}, "cluster_nccl_min_busbw_gbs: 400.0 must be a number above 0 and at most 100"),
    ({"config_dir": "/etc"}, "cluster_config_dir: '/etc' is too close to / (give at least 2 levels, such as /etc/sparkfleet/NAME); "
                             "the role makes this folder root-owned and mode 0700"),
    ({"config_dir": "/etc/sparkfleet/../../root"}, "cluster_config_dir: '/etc/sparkfleet/../../root' must not step through '.' or '..'"),
    ({"config_dir": "/srv/a:b"}, "cluster_config_dir: '/srv/a:b' has 'a:b', which a unit file, an env file or a docker volume spec"),
    ({"config_dir": "srv/cluster"}, "cluster_config_dir: 'srv/cluster' must be an absolute path"),
    ({"iputils_ping_version": "3:20221126-1, netcat-openbsd"}, "cluster_iputils_ping_version: '3:20221126-1, netcat-openbsd' must "
                                                               "be empty or one Debian package version"),
    ({"fabric_gate": "maybe"}, "cluster_fabric_gate: 'maybe' must be true or false"),
    ({"logind_remove_ipc_dropin": "/etc/systemd/logind.conf"},
     "cluster_logind_remove_ipc_dropin: /etc/systemd/logind.conf is not a file its reader reads: drop-ins end in .conf in "
     "/etc/systemd/logind.conf.d or "),
    ({"logind_remove_ipc_dropin": "/srv/logind.conf.d/10-x.conf"},
     "cluster_logind_remove_ipc_dropin: /srv/logind.conf.d/10-x.conf is not a file its reader reads"),
    ({"logind_remove_ipc_dropin": "/etc/systemd/logind.conf.d/10 x.conf"},
     "cluster_logind_remove_ipc_dropin: '/etc/systemd/logind.conf.d/10 x.conf' has '10 x.conf'"),
    ({"node_vars": {"spark-2": {"fast_interface": "^eth"}}}, "spark-2: cluster_fast_interface: '^eth' must be one interface name"),
    ({"node_vars": {"spark-2": {"fast_interface": "enp1s0f0np0-long"}}}, "spark-2: cluster_fast_interface: 'enp1s0f0np0-long'"),
    ({"node_vars": {"spark-2": {"rdma_devices": ["rocep1s0f0,^x"]}}}, "spark-2: cluster_rdma_devices: ['rocep1s0f0,^x'] must list"),
    ({"node_vars": {"spark-2": {"gid_index": 256}}}, "spark-2: cluster_gid_index: 256 must be empty or an index of the RoCE GID "
                                                     "table, 0 to 255"),
])
def test_every_setting_is_bounded_saying_why(changes, expected):
    errors = planned(declaration(**changes))["errors"]
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_the_bounds_themselves_pass():
    for changes in ({"mtu": 68}, {"mtu": 9216}, {"gpus_per_node": 1}, {"ping_count": 100}, {"nccl_min_busbw_gbs": 100},
                    {"config_dir": "/srv/cluster"}, {"iputils_ping_version": "3:20221126-1+deb12u1"},
                    {"node_vars": {"spark-2": {"fast_interface": "enp1s0f0np0", "rdma_devices": ["roceP2p1s0f0"], "gid_index": 0}}}):
        assert planned(declaration(**changes))["errors"] == [], changes


def test_a_host_in_two_clusters_or_listed_by_a_cluster_it_is_not_in_is_refused():
    def member(name, nodes):
        return {"cluster_name": name, "cluster_nodes": nodes}

    fleet = {"spark-1": member("a", ["spark-1", "spark-2"]), "spark-2": member("a", ["spark-1", "spark-2"]),
             "spark-3": member("b", ["spark-3", "spark-2"]), "gx10-1": {"cluster_name": "", "cluster_nodes": []}}
    problems = fleet_cluster_problems(fleet)
    assert problems == [
        "spark-2: listed in the cluster_nodes of clusters a, b; a host is a node of one cluster at most (its GPU and memory pool "
        "serve one). Remove it from all but one",
        "spark-2: listed in cluster b's cluster_nodes, but its own cluster_name is a, so it would never run its rank and cluster b "
        "could not start. Set the cluster_* variables in the group_vars of one group holding exactly the cluster's nodes"]
    assert fleet_cluster_problems(fleet, "a") == problems == fleet_cluster_problems(fleet, "b")
    assert fleet_cluster_problems(fleet, "c") == []
    assert fleet_cluster_problems({host: v for host, v in fleet.items() if host != "spark-3"}) == []
    outside = {**fleet, "spark-3": member("b", ["spark-3", "gx10-1"])}
    assert fleet_cluster_problems(outside) == [
        "gx10-1: listed in cluster b's cluster_nodes, but its own cluster_name is empty, so it would never run its rank and "
        "cluster b could not start. Set the cluster_* variables in the group_vars of one group holding exactly the cluster's nodes"]
    split = {**fleet, "spark-2": member("a", ["spark-2", "spark-1"]), "spark-3": {}}
    assert fleet_cluster_problems(split) == [
        "cluster_nodes of cluster a: its hosts list different nodes (spark-1: spark-1, spark-2; spark-2: spark-2, spark-1); every "
        "node must see the same cluster. Set the cluster_* variables in the group_vars of one group holding exactly the "
        "cluster's nodes"]


def test_docs_show_the_bounds_of_every_setting_as_the_table_checks_them():
    doc = (Path(__file__).parents[4] / "docs" / "cluster.md").read_text()
    shown = doc.split("<!-- cluster settings: begin -->\n")[1].split("\n<!-- cluster settings: end -->")[0]
    assert shown == bounds_table("cluster_", CLUSTER_SETTINGS), "docs/cluster.md's bounds table is stale: paste bounds_table's"


def test_each_nodes_own_host_vars_reach_the_declaration():
    from ansible_collections.sparkfleet.vllm.plugins.filter.cluster import cluster_node_vars

    hostvars = {"spark-1": {"ansible_host": "192.0.2.10", "cluster_node_env": {"NCCL_IB_DISABLE": "1"}, "vllm_env": {"A": "1"},
                            "sparkfleet_hardware_overrides": {"env": {"B": "2"}}, "cluster_gid_index": 3, "unrelated": True},
                "spark-2": {}}
    assert cluster_node_vars(["spark-1", "spark-2", "ghost"], hostvars) == {
        "spark-1": {"ansible_host": "192.0.2.10", "node_env": {"NCCL_IB_DISABLE": "1"}, "vllm_env": {"A": "1"}, "gid_index": 3,
                    "hardware_env": {"B": "2"}},
        "spark-2": {"hardware_env": None}}
    cluster = declaration(node_vars=cluster_node_vars(["spark-1", "spark-2"], hostvars))
    assert planned(cluster)["errors"][0].startswith("spark-1: cluster_node_env.NCCL_IB_DISABLE: '1' turns RDMA off")


def rank_plan_text(name, **changes):
    return json.dumps({"name": name, "unit": f"sparkfleet-cluster-{name}.service", "container": f"vllm-cluster-{name}", **changes})


def test_ranks_of_other_clusters_are_stale_with_the_names_the_plan_gave_them():
    """Found when read: a rank stayed (unit, container, files, enabled) after its node left the
    cluster, the cluster was renamed or cluster_name was cleared."""
    config = "/etc/sparkfleet/cluster"
    deployed = {f"{config}/lab-tp2.json": rank_plan_text("lab-tp2"), f"{config}/old-tp2.json": rank_plan_text("old-tp2")}
    stale = stale_ranks(deployed, "lab-tp2", config)
    assert stale == {"problems": [], "ranks": [{
        "name": "old-tp2", "unit": "sparkfleet-cluster-old-tp2.service", "container": "vllm-cluster-old-tp2",
        "files": [f"{config}/old-tp2.env", f"{config}/old-tp2.json", "/etc/systemd/system/sparkfleet-cluster-old-tp2.service",
                  f"{config}/last-good/old-tp2.env", f"{config}/last-good/old-tp2.json", f"{config}/last-good/sparkfleet-cluster-old-tp2.service",
                  f"{config}/last-good/old-tp2.unjudged.json"]}]}
    cleared = stale_ranks(deployed, "", config)
    assert [rank["name"] for rank in cleared["ranks"]] == ["lab-tp2", "old-tp2"], "cluster_name cleared: every rank goes"
    old = {**declaration(), "name": "old-tp2"}
    launched = node_plan(old, planned(old)["nodes"]["spark-2"])["instances"][0]
    assert (launched["unit"], launched["container"]) == (stale["ranks"][0]["unit"], stale["ranks"][0]["container"])
    kept = launched["kept_files"]
    assert [f["path"] for f in kept] + [f["last_good"] for f in kept] == stale["ranks"][0]["files"][:-1], "the plan's files are the ones removed"


@pytest.mark.parametrize(("text", "fragment"), [
    pytest.param(rank_plan_text("old-tp2", unit="ssh.service"), "does not name the cluster rank 'old-tp2'", id="another-unit"),
    pytest.param(rank_plan_text("old-tp2", container="postgres"), "its container vllm-cluster-old-tp2", id="another-container"),
    pytest.param("{not json", "not a rank's plan", id="damaged"),
    pytest.param(json.dumps(["old-tp2"]), "does not name the cluster rank", id="not-a-mapping"),
])
def test_a_plan_file_naming_no_rank_of_ours_is_refused_never_removed(text, fragment):
    stale = stale_ranks({"/etc/sparkfleet/cluster/old-tp2.json": text}, "lab-tp2", "/etc/sparkfleet/cluster")
    assert stale["ranks"] == [] and len(stale["problems"]) == 1 and fragment in stale["problems"][0]
    assert "remove the rank by hand" in stale["problems"][0]


def test_a_file_name_that_is_no_rank_name_is_refused():
    stale = stale_ranks({"/etc/sparkfleet/cluster/Old Tp2.json": rank_plan_text("Old Tp2")}, "", "/etc/sparkfleet/cluster")
    assert stale["ranks"] == [] and "does not name the cluster rank 'Old Tp2'" in stale["problems"][0]


def probed(pip=None, system=None, rc=0):
    return {"rc": rc, "stdout": json.dumps({"pip": pip or {}, "system": system}) + "\n", "stderr": ""}


@pytest.mark.parametrize(("probe", "args", "errors", "warnings"), [
    (probed({"nvidia-nccl-cu13": "2.30.4"}), [], [], []),
    (probed({"nvidia-nccl-cu12": "2.27.3"}), [], ["is 2.27.3 (nvidia-nccl-cu12, pip), before 2.30.4, which fixed a cross-node deadlock"], []),
    (probed({"nvidia-nccl-cu12": "2.27.3"}), ["--enforce-eager"], [], ["the cluster runs without CUDA graphs (enforce_eager)"]),
    (probed(system="2.26.2-1"), [], ["is 2.26.2-1 (the image's NCCL_VERSION)"], []),
    (probed({"nvidia-nccl-cu13": "2.28.9"}, system="2.27.5"), ["--enforce-eager"], [],
     ["without CUDA graphs", "carries pip's NCCL 2.28.9 (nvidia-nccl-cu13) beside the system's 2.27.5: that pairing wedged"]),
    (probed(), [], [], ["declares no NCCL (no nvidia-nccl package, no NCCL_VERSION)"]),
    ({"rc": 125, "stdout": "", "stderr": "Unable to find image 'r/vllm@sha256:ab' locally"}, [], [],
     ["could not be read (Unable to find image 'r/vllm@sha256:ab' locally)"]),
])
def test_the_nccl_a_clusters_image_carries_is_refused_before_the_deadlock_fix(probe, args, errors, warnings):
    verdict = nccl_verdict(probe, args, "r/vllm@sha256:ab")
    assert len(verdict["errors"]) == len(errors) and all(e in found for e, found in zip(errors, verdict["errors"], strict=True)), verdict
    assert len(verdict["warnings"]) == len(warnings) and all(w in found for w, found in zip(warnings, verdict["warnings"], strict=True)), verdict
    if errors:
        assert verdict["errors"][0].endswith("use an image with NCCL 2.30.4 or later, or set enforce_eager: true (no CUDA graphs, slower decode)")


def test_the_nccl_probe_runs_the_pulled_image_without_network_and_reads_what_it_declares():
    argv = nccl_probe_argv("r/vllm@sha256:ab")
    assert argv[:8] == ["/usr/bin/docker", "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint"] and argv[9] == "r/vllm@sha256:ab"
    completed = subprocess.run([sys.executable, "-c", argv[-1]], capture_output=True, text=True, env={"NCCL_VERSION": "2.30.4-1"}, check=True)
    assert json.loads(completed.stdout)["system"] == "2.30.4-1"


@pytest.mark.parametrize("backend", ["native", "ray"])
def test_each_ranks_plan_carries_the_wave_the_heads_watchdog_restarts_it_in(backend):
    cluster = declaration(nodes=("spark-1", "spark-2", "spark-3"), backend=backend)
    nodes = planned(cluster)["nodes"]
    plans = {host: node_plan(cluster, node)["instances"][0] for host, node in nodes.items()}
    recorded = []
    restart(plans["spark-1"]["cluster"]["nodes"], backend, lambda verb, node: recorded.append((verb, node["name"])) or (0, ""))
    started = [host for verb, host in recorded if verb == "start"]
    assert sorted(started, key=lambda host: plans[host]["cluster"]["start_wave"]) == started, "the role's waves are the watchdog's order"
    assert {plans[host]["cluster"]["start_wave"] for host in ("spark-2", "spark-3")} == {int(backend == "ray")}


def test_ngc_ranks_keep_the_images_entrypoint_and_hand_it_their_commands():
    """NVIDIA's NGC images must run their entrypoint (it enables CUDA forward compatibility; replacing it broke
    FlashInfer's JIT on a Spark): each Ray rank gives its command to it instead of overriding it, and a native node
    passes vllm serve as the command."""
    ngc = f"nvcr.io/nvidia/vllm:26.05.post1-py3@{DIGEST}"
    cluster = declaration(backend="ray")
    nodes = planned(cluster)["nodes"]
    head = node_plan(cluster, nodes["spark-1"], image=ngc)["instances"][0]
    worker = node_plan(cluster, nodes["spark-2"], image=ngc, host_addresses=None)["instances"][0]
    assert head["image_kind"] == worker["image_kind"] == "ngc"
    assert "--entrypoint" not in head["docker_run"] and "--entrypoint" not in worker["docker_run"]
    run, image = worker["docker_run"], worker["run_image"]
    assert run[run.index(image) + 1:run.index(image) + 3] == ["ray", "start"]
    run = head["docker_run"]
    assert run[run.index(image) + 1:run.index(image) + 3] == ["/bin/sh", "-c"] and run[run.index(image) + 4] == "vllm-serve"
    native = declaration()
    rank = node_plan(native, planned(native)["nodes"]["spark-1"], image=ngc)["instances"][0]
    assert rank["docker_run"][rank["docker_run"].index(image) + 1:][:3] == ["vllm", "serve", "/models/qwen"]
    mirrored = node_plan(native, planned(native)["nodes"]["spark-1"], image=f"mirror.local:5000/nvidia/vllm@{DIGEST}",
                         image_kinds={"mirror.local:5000/nvidia/vllm": "ngc"})["instances"][0]
    assert mirrored["image_kind"] == "ngc", "a mirror's copy is mapped by the inventory"
