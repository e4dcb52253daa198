"""The lab cluster: the tiny model across two lab hosts (tensor parallel 2 on vLLM's own
multi-node runtime, CPU build), converged by the cluster role. A chat request through the head,
the start order, refusals that change nothing, the fabric gate on the lab network and with one
host's MTU lowered, and a killed worker: what the head does, how long until the cluster is seen
as failed, and a re-apply with a flag vLLM refuses: the ranks of a renamed cluster removed first,
the relaunch failed, both ranks rolled back together and serving again. Times printed are
measurements for the log, not thresholds."""

import json
import os
import time

import pytest
from site_runner import assert_refused, docker_host, module, playbook, site, state_digest

HEAD, WORKER = "sparkfleet-molecule-node-1", "sparkfleet-molecule-node-2"
UNIT, CONTAINER, PORT, MODEL = "sparkfleet-cluster-lab-tp2.service", "vllm-cluster-lab-tp2", 8010, "tiny-tp2"
CONFIG = "/etc/sparkfleet/cluster/lab-tp2"
KEY = os.environ["SPARKFLEET_LAB_API_KEY"]


@pytest.fixture(scope="module")
def head():
    return docker_host(HEAD)


@pytest.fixture(scope="module")
def worker():
    return docker_host(WORKER)


def chat(host, timeout=60):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "temperature": 0})
    result = host.run(f"curl -s -m {timeout} -H 'Authorization: Bearer {KEY}' -H 'Content-Type: application/json' "
                      f"-d '{body}' http://127.0.0.1:{PORT}/v1/chat/completions")
    try:
        return json.loads(result.stdout)
    except ValueError:
        return {"error": result.stdout or f"curl exited {result.rc}"}


def started_at(host):
    """When the rank's container started (the lab hosts share one kernel clock), or None."""
    result = host.run(f"docker inspect --format '{{{{.State.StartedAt}}}} {{{{.State.Status}}}}' {CONTAINER}")
    return tuple(result.stdout.split()) if result.rc == 0 else None


def unit_state(host):
    return host.run(f"systemctl show -p ActiveState --value {UNIT}").stdout.strip()


def plan(host):
    return json.loads(host.file(f"{CONFIG}.json").content_string)


def eth0(host):
    return host.interface("eth0").addresses[0]


def cluster_state(host):
    return state_digest(host, [f"{CONFIG}.env", f"{CONFIG}.json", f"/etc/systemd/system/{UNIT}"],
                        [f"docker inspect --format '{{{{.Id}}}} {{{{.State.StartedAt}}}}' {CONTAINER}"])


def test_both_ranks_serve_one_model_through_the_head(head, worker):
    for host in (head, worker):
        assert unit_state(host) == "active"
    head_plan, worker_plan = plan(head), plan(worker)
    assert head_plan["cluster"]["rank"] == 0 and worker_plan["cluster"]["rank"] == 1
    assert worker_plan["serve_args"][-1] == "--headless" and "--headless" not in head_plan["serve_args"]
    assert worker_plan["cluster"]["master_addr"] == eth0(head) and worker_plan["cluster"]["host_ip"] == eth0(worker)
    env = worker.file(f"{CONFIG}.env")
    assert env.mode == 0o600
    assert f"VLLM_HOST_IP={eth0(worker)}\n" in env.content_string and f"MASTER_ADDR={eth0(head)}\n" in env.content_string
    assert "VLLM_CPU_OMP_THREADS_BIND=1\n" in env.content_string and "NCCL_SOCKET_IFNAME=eth0\n" in env.content_string
    reply = chat(head)
    assert reply["choices"][0]["message"]["content"], reply
    assert reply["system_fingerprint"].endswith("-tp2-" + reply["system_fingerprint"].rsplit("-", 1)[1])
    assert worker.run(f"curl -s -m 5 http://127.0.0.1:{PORT}/health").rc != 0, "a headless worker serves no API"
    worker_start, head_start = started_at(worker)[0], started_at(head)[0]
    assert worker_start < head_start, "the workers start before the head"
    print(f"\nstart order: worker {worker_start}, head {head_start}; head unit active since "
          f"{head.run(f'systemctl show -p ActiveEnterTimestamp --value {UNIT}').stdout.strip()}")


def running_environment(host, name):
    """The environment the container's main process runs with, as the host's kernel holds it (no tool of the image needed)."""
    text = host.check_output(f"tr '\\0' '\\n' < /proc/$(docker inspect --format '{{{{.State.Pid}}}}' {name})/environ")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_nothing_deployed_phones_home(head, worker):
    """vLLM posts usage statistics unless VLLM_NO_USAGE_STATS, VLLM_DO_NOT_TRACK or DO_NOT_TRACK is set
    (vllm/usage/usage_lib.py), and LiteLLM fetches its catalogs unless LITELLM_OFFLINE_MODE=true: read from
    every running container of both nodes, the single instances, the cluster's ranks and the gateway."""
    offline = {"VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "0",
               "HF_HUB_OFFLINE": "1"}
    seen = []
    for host in (head, worker):
        for name in host.check_output("docker ps --format '{{.Names}}'").split():
            environment = running_environment(host, name)
            if name.startswith("vllm-"):
                assert {key: environment.get(key) for key in offline} == offline, name
            elif name == "sparkfleet-gateway":
                assert environment.get("LITELLM_OFFLINE_MODE") == "true"
            seen.append(name)
    assert {"vllm-tiny", CONTAINER, "sparkfleet-gateway"} <= set(seen), seen


def test_logind_keeps_the_ranks_shared_memory_on_every_node(head, worker):
    """The field's multi-node notes: logind's RemoveIPC would remove the ranks' shared memory at a logout."""
    for host in (head, worker):
        dropin = host.file("/etc/systemd/logind.conf.d/10-sparkfleet-remove-ipc.conf")
        assert dropin.mode == 0o644 and "[Login]\nRemoveIPC=no\n" in dropin.content_string
        # Where logind reads it (the merged configuration, drop-ins last), and what the running logind holds.
        merged = host.check_output("systemd-analyze cat-config systemd/logind.conf")
        assert merged.rstrip().endswith("RemoveIPC=no"), merged[-300:]
        held = host.check_output("busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager RemoveIPC")
        assert held.strip() == "b false", held


def test_a_refused_cluster_changes_nothing(head, worker):
    before = cluster_state(head), cluster_state(worker)
    bad = {"vllm_version": "0.26.0", "cluster_instance": {"model": "/models/tiny-llama", "served_model_names": [MODEL], "port": PORT,
                                                          "api_key": KEY, "tensor_parallel_size": 1}}
    result = playbook("cluster.yml", "-e", json.dumps(bad))
    assert_refused(result, "Cluster lab-tp2 refused, the cluster was not relaunched",
                   "vllm_version: 0.26.0 cannot run a cluster: multi-node needs vLLM 0.27.0 or later",
                   "cluster_instance.tensor_parallel_size: 1; 2 nodes x 1 GPU per node is 2")
    # A refusal only the nodes' fast links show comes from site.yml's fleet check, before any change.
    result = site("--tags", "cluster", "-e", json.dumps({"cluster_master_addr": "127.0.0.1"}))
    assert_refused(result, "Cluster lab-tp2 refused, nothing was changed on any host",
                   "cluster_master_addr: 127.0.0.1 is not the head's (sparkfleet-molecule-node-1) address on the fast link")
    # Every rank's weights are launch-checked, and every node refuses when one cannot launch.
    long_context = {"cluster_instance": {**bad["cluster_instance"], "tensor_parallel_size": 2, "max_model_len": 8192}}
    result = playbook("cluster.yml", "-e", json.dumps(long_context))
    assert_refused(result, "Cluster lab-tp2 refused, the cluster was not relaunched: sparkfleet-molecule-node-1: cluster_instance (lab-tp2)"
                   ".max_model_len: 8192 is more than the model's own maximum of 4096", "sparkfleet-molecule-node-2: cluster_instance")
    output = result.stdout + result.stderr
    assert "fatal: [sparkfleet-molecule-node-1]" in output and "fatal: [sparkfleet-molecule-node-2]" in output
    assert KEY not in result.stdout + result.stderr
    assert (cluster_state(head), cluster_state(worker)) == before


def test_the_reboot_test_refuses_one_node_of_a_cluster_alone(head, worker):
    """A cluster's nodes reboot together or not at all: the reboot test limited to the worker refuses before any reboot."""
    boot = "cat /proc/sys/kernel/random/boot_id; cut -d ' ' -f 22 /proc/1/stat"
    before = worker.check_output(boot), cluster_state(head), cluster_state(worker)
    refused = playbook("reboot_test.yml", limit=WORKER)
    assert_refused(refused, f"{WORKER} is a node of cluster lab-tp2", "whose nodes reboot together or not at all",
                   "and set reboot_test_serial to 2. No host of this batch was rebooted.")
    assert (worker.check_output(boot), cluster_state(head), cluster_state(worker)) == before


def fabric(source, peer, mtu=1500):
    return module(source, "cluster_fabric", {"source": source, "interface": "eth0", "mtu": mtu,
                                             "peers": [{"name": peer, "address": eth0(docker_host(peer))}]})


def test_the_fabric_gate_passes_on_the_lab_network_and_names_the_pair_below_its_mtu(worker):
    for source, peer in ((HEAD, WORKER), (WORKER, HEAD)):
        result = fabric(source, peer)
        assert result["ok"], result["reasons"]
        assert result["pings"][0]["received"] == result["pings"][0]["sent"] == 3
        assert result["tools"] == {"ibdev2netdev": False, "show_gids": False} and result["rdma_links"] == []
    worker.run_expect([0], "ip link set eth0 mtu 1400")
    try:
        towards_worker, from_worker = fabric(HEAD, WORKER), fabric(WORKER, HEAD)
    finally:
        worker.run_expect([0], "ip link set eth0 mtu 1500")
    assert not towards_worker["ok"] and not from_worker["ok"]
    assert towards_worker["reasons"][0].startswith(f"{HEAD} -> {WORKER} ({eth0(worker)}) at MTU 1500: no reply")
    assert f"{WORKER} -> {HEAD}" in from_worker["reasons"][0] and "carries only 1400 bytes" in from_worker["reasons"][0]
    print("\n" + "\n".join(towards_worker["reasons"] + from_worker["reasons"]))


# The lab's cluster_instance (inventories/lab/group_vars/lab_cluster.yml), given whole because extra vars replace a mapping.
LAB_INSTANCE = {"model": "/models/tiny-llama", "served_model_names": [MODEL], "port": PORT, "api_key": KEY, "tensor_parallel_size": 2,
                "env": {"TORCHDYNAMO_DISABLE": "1"}}


STALE = "old-tp2"


def plant_stale_rank(host):
    """A rank of a cluster since renamed, as the role deployed it: plan, key, unit (enabled, running),
    container, last good copies."""
    plan_text = json.dumps({"name": STALE, "unit": f"sparkfleet-cluster-{STALE}.service", "container": f"vllm-cluster-{STALE}"})
    host.check_output(f"printf '%s' '{plan_text}' > /etc/sparkfleet/cluster/{STALE}.json && cp /etc/sparkfleet/cluster/{STALE}.json "
                      f"/etc/sparkfleet/cluster/last-good/ && (umask 077 && echo VLLM_API_KEY=stale > /etc/sparkfleet/cluster/{STALE}.env)")
    host.check_output(f"printf '[Service]\\nExecStart=/bin/sleep infinity\\n[Install]\\nWantedBy=multi-user.target\\n' "
                      f"> /etc/systemd/system/sparkfleet-cluster-{STALE}.service && systemctl daemon-reload "
                      f"&& systemctl enable --now sparkfleet-cluster-{STALE}.service")
    host.check_output(f"docker create --name vllm-cluster-{STALE} {plan(host)['run_image']}")


def stale_rank_left(host):
    files = [f"/etc/sparkfleet/cluster/{name}" for name in (f"{STALE}.json", f"{STALE}.env", f"last-good/{STALE}.json")]
    return {"files": [path for path in files + [f"/etc/systemd/system/sparkfleet-cluster-{STALE}.service"] if host.file(path).exists],
            "unit": host.run(f"systemctl show -p LoadState --value sparkfleet-cluster-{STALE}.service").stdout.strip(),
            "container": host.run(f"docker inspect --format '{{{{.Name}}}}' vllm-cluster-{STALE}").rc == 0}


def test_a_killed_worker_fails_the_cluster_and_a_failed_reapply_rolls_every_rank_back_to_serve_again(head, worker):
    """Found when tried: a failed cluster relaunch rolled back and did not serve ("the cluster is down");
    and a rank of a cluster since renamed stayed on its nodes, enabled."""
    files = [f"{CONFIG}.env", f"{CONFIG}.json", f"/etc/systemd/system/{UNIT}"]
    good = [state_digest(host, files, []) for host in (head, worker)]
    assert "choices" in chat(head)
    worker.run_expect([0], f"docker kill {CONTAINER}")
    killed = time.monotonic()
    seen, timeline = {}, []
    while time.monotonic() - killed < 150 and len(seen) < 3:
        now = round(time.monotonic() - killed, 1)
        observed = {"worker unit": unit_state(worker), "head unit": unit_state(head),
                    "head container": (started_at(head) or ("", "gone"))[1]}
        if "head chat fails" not in seen and "choices" not in chat(head, timeout=10):
            seen["head chat fails"] = now
        if observed["worker unit"] != "active":
            seen.setdefault("worker unit " + observed["worker unit"], now)
        if observed["head unit"] != "active":
            seen.setdefault("head unit " + observed["head unit"], now)
        timeline.append((now, observed))
        time.sleep(2)
    gate = module(HEAD, "vllm_health", {"instance": "lab-tp2", "config_dir": "/etc/sparkfleet/cluster", "warmup": True, "timeout": 30})
    print(f"\nafter killing the worker's container: {seen}; last seen {timeline[-1]}")
    print(f"health gate on the head: ok={gate.get('ok')} {gate.get('reason') or gate.get('msg')}")
    assert unit_state(worker) == "failed", "a rank never restarts alone"
    assert "head chat fails" in seen and not gate.get("ok")

    head_before = started_at(head)
    worker.run_expect([0], "ip link set eth0 mtu 1400")
    try:
        refused = playbook("cluster.yml")
    finally:
        worker.run_expect([0], "ip link set eth0 mtu 1500")
    assert_refused(refused, "Fabric gate of cluster lab-tp2 failed; no rank was stopped or started",
                   f"{HEAD} -> {WORKER} ({eth0(worker)}) at MTU 1500: no reply")
    assert started_at(head) == head_before, "the fabric gate stopped nothing"

    # A process outside the collection's containers holding a device node named like the GPU's (the lab has none) on the
    # worker: every node's admission is asked before any rank stops, and the head's rank is left as it was.
    holder = "sparkfleet-test-device-holder"
    worker.run_expect([0], f"mknod -m 0666 /dev/nvidia9 c 1 3 && systemd-run --unit {holder} sh -c 'exec 3</dev/nvidia9; exec sleep infinity'")
    try:
        refused = playbook("cluster.yml")
    finally:
        worker.run(f"systemctl stop {holder}; rm -f /dev/nvidia9")
    assert_refused(refused, f"Cluster lab-tp2 was not relaunched, no rank was stopped: {WORKER} (rank 1): ", "(sleep) holds /dev/nvidia9")
    assert started_at(head) == head_before, "the admission stopped nothing"

    # The re-apply brings a flag vLLM refuses, and finds the ranks of a renamed cluster on both nodes.
    for host in (head, worker):
        plant_stale_rank(host)
    started = time.monotonic()
    result = playbook("cluster.yml", "-e", json.dumps({"cluster_instance": {**LAB_INSTANCE, "extra_args": ["--no-such-flag"]}}))
    elapsed = round(time.monotonic() - started)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "is relaunched, every rank together" in output, output[-3000:]
    assert "Cluster lab-tp2 failed its relaunch" in output and KEY not in output
    # New settings start cold: the head's first exit relaunches every rank once more together, the second fails.
    assert "Cluster lab-tp2 started cold and the container is exited (exit code 2) (the compile-then-exit of seed 001): " \
        "every rank is relaunched once more on the caches it filled" in output, output[-3000:]
    assert "The last good settings of every rank were relaunched and serve again." in output
    assert "TASK [sparkfleet.vllm.cluster : Raise the maintenance flag]" in output
    # The NCCL the ranks would load was read from the image in a throwaway container: the lab's CPU build carries none.
    assert "declares no NCCL (no nvidia-nccl package, no NCCL_VERSION)" in output
    assert not head.file("/run/sparkfleet/vllm-maintenance").exists and not worker.file("/run/sparkfleet/vllm-maintenance").exists
    for host in (head, worker):
        assert stale_rank_left(host) == {"files": [], "unit": "not-found", "container": False}, "the renamed cluster's rank is gone"
    assert [state_digest(host, files, []) for host in (head, worker)] == good, "every node is back on its last good files"
    assert unit_state(head) == unit_state(worker) == "active"
    worker_start, head_start = started_at(worker)[0], started_at(head)[0]
    assert head_before is None or head_start != head_before[0], "the head was restarted with the worker"
    assert worker_start < head_start
    reply = chat(head)
    assert reply["choices"][0]["message"]["content"], reply
    print(f"failed re-apply rolled both ranks back (worker {worker_start}, head {head_start}) and serves again; the play took {elapsed} s")
