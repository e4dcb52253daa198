"""The watchdog on the lab cluster, after the cluster's and the gateway's tests (the files' order): the
nodes' watchdogs exchange keys that may only stop, start or (on the head) restart a rank, and drain
or undrain the second node's own units at the gateway on the first; the second node's instance,
stopped, is drained at the gateway before its watchdog starts it and undrained once it serves; the
worker's key, over the gateway's SSH forced command, never undoes the operator's drain of its unit; a
killed worker rank, seen by both nodes at once, makes the head restart every rank once in the
cluster's order (the worker, then the head), after which the cluster serves again, its only replica
in its model group left in rotation. Detection and recovery times are printed for the closing note."""

import json

import pytest
from site_runner import docker_host, playbook, site
from watchdog_journal import journal_decisions, now, wait_for

HEAD, WORKER = "sparkfleet-molecule-node-1", "sparkfleet-molecule-node-2"
UNIT, CONTAINER = "sparkfleet-cluster-lab-tp2.service", "vllm-cluster-lab-tp2"
INSTANCE_UNIT = "sparkfleet-vllm-tiny.service"
WATCHDOG = {"watchdog_interval": 5, "watchdog_failures": 3, "watchdog_probe_timeout": 10, "watchdog_budget": 3,
            "watchdog_budget_window": 3600, "watchdog_warm_grace": 300, "watchdog_maintenance_max_age": 60, "watchdog_bundle_time_limit": 20}
PEER_KEY = "/etc/sparkfleet/watchdog/peer_ed25519"
# A CPU cluster starting beside the other lanes takes minutes to pass its gate.
SERVE_TIMEOUT = 600


@pytest.fixture(scope="module")
def nodes():
    result = site("--tags", "watchdog", "-e", json.dumps(WATCHDOG))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    head, worker = docker_host(HEAD), docker_host(WORKER)
    for host in (head, worker):
        assert host.service("sparkfleet-watchdog.service").is_running
    wait_for(lambda: decisions(head, verdict="answers") or decisions(head, verdict="progress"), 120, "the head's watchdog judging the head")
    return head, worker


def decisions(host, since=0.0, **match):
    return journal_decisions(host, UNIT, since, **match)


def address(host):
    return host.interface("eth0").addresses[0]


def chat_answers(head):
    body = json.dumps({"model": "tiny-tp2", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "temperature": 0})
    key = head.check_output("sed -n 's/^VLLM_API_KEY=//p' /etc/sparkfleet/cluster/lab-tp2.env")
    result = head.run(f"curl -s -m 30 -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' -d '{body}' "
                      "http://127.0.0.1:8010/v1/chat/completions")
    return '"choices"' in result.stdout


def test_each_nodes_key_may_only_stop_or_start_a_rank_and_only_from_its_peer(nodes):
    head, worker = nodes
    lines = worker.file("/root/.ssh/authorized_keys").content_string.splitlines()
    entry = [line for line in lines if f"sparkfleet-watchdog@{HEAD}" in line]
    assert len(entry) == 1 and entry[0].endswith(f"sparkfleet-watchdog@{HEAD}:cluster"), entry
    assert entry[0].startswith(f'restrict,from="{address(head)}",command="/usr/bin/python3 ') and entry[0].count(" --cluster\"") == 1
    assert worker.file("/root/.ssh/authorized_keys").mode == 0o600 and head.file(PEER_KEY).mode == 0o600
    ssh = (f"ssh -i {PEER_KEY} -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile=/etc/sparkfleet/watchdog/known_hosts "
           f"-o StrictHostKeyChecking=yes -l root {address(worker)}")
    refused = head.run(f"{ssh} cat /etc/shadow")
    assert refused.rc == 2 and refused.stderr.startswith("refused 'cat /etc/shadow'"), (refused.rc, refused.stdout, refused.stderr)
    assert "root:" not in refused.stdout


def drained_at_gateway(head):
    return json.loads(head.file("/etc/sparkfleet/gateway/drained.json").content_string)["drained"]


def test_a_stopped_instance_behind_the_gateway_is_drained_before_the_start_and_undrained_once_it_serves(nodes):
    head, worker = nodes
    lines = head.file("/root/.ssh/authorized_keys").content_string.splitlines()
    # The worker is the head's cluster peer and a backend of its gateway: its cluster steps only from the cluster's link.
    entries = {line.rsplit("@", 1)[1]: line for line in lines if f"sparkfleet-watchdog@{WORKER}:" in line}
    assert entries[f"{WORKER}:backend+cluster"].startswith(
        f'restrict,from="{address(worker)}",command="/usr/bin/python3 -I /usr/local/libexec/sparkfleet/sparkfleet_watchdog.py peer --from {WORKER} '
        '--backend --cluster" '), entries
    assert set(entries) <= {f"{WORKER}:backend+cluster", f"{WORKER}:backend"}, entries
    assert all("--cluster" not in line for key, line in entries.items() if key == f"{WORKER}:backend"), entries
    routes = json.loads(worker.file("/etc/sparkfleet/watchdog/gateways.json").content_string)["gateways"]
    assert routes == [{"name": HEAD, "address": address(head)}]
    assert json.loads(head.file("/etc/sparkfleet/watchdog/gateways.json").content_string)["gateways"] == [{"name": HEAD, "address": "local"}]
    assert drained_at_gateway(head) == []
    stopped = now(worker)
    # Through systemd: a container stopped under its unit may exit non-zero and be restarted by systemd, not the watchdog.
    worker.check_output(f"systemctl stop {INSTANCE_UNIT}")
    started = wait_for(lambda: journal_decisions(worker, INSTANCE_UNIT, stopped, action="start"), 120, "the watchdog to start the instance",
                       explain=lambda: journal_decisions(worker, INSTANCE_UNIT, stopped))[0]
    print(f"\nwatchdog: the stopped instance was drained and started {started['time'] - stopped:.1f} s after the stop: {started['gateway']}")
    assert [(reply["gateway"], reply["name"], reply["result"], reply.get("gateway_restart")) for reply in started["gateway"]] == [
        (HEAD, f"{WORKER}/tiny", "drained", 0)]
    undrained = wait_for(lambda: journal_decisions(worker, INSTANCE_UNIT, stopped, action="undrain"), SERVE_TIMEOUT, "the undrain")[0]
    print(f"watchdog: undrained {undrained['time'] - stopped:.1f} s after the stop: {undrained['gateway']}")
    assert [(reply["name"], reply["result"]) for reply in undrained["gateway"]] == [(f"{WORKER}/tiny", "undrained")]
    assert drained_at_gateway(head) == []


def test_a_backends_key_never_undoes_an_operators_drain_through_the_gateways_peer_command(nodes):
    """Over the real SSH forced command: the worker's watchdog key asks the head's gateway to undrain the worker's unit
    that the operator drained (its whole host, then only the unit by name), and to change the head's own unit; the
    operator's drain stays, the head's unit is refused, and nothing is rewritten. Two LiteLLM restarts: the operator's
    drain of the unit under its drained host, and the host's undrain over the drained unit, change no route."""
    head, worker = nodes
    unit = f"{WORKER}/tiny"
    ssh = (f"ssh -i {PEER_KEY} -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile=/etc/sparkfleet/watchdog/known_hosts "
           f"-o StrictHostKeyChecking=yes -l root {address(head)}")

    def kept_by_operator(expected_owners):
        before = json.loads(head.file("/etc/sparkfleet/gateway/drained.json").content_string)
        assert before["owners"] == expected_owners, before
        kept = worker.run(f"{ssh} undrain {unit}")
        reply = json.loads(kept.stdout)
        assert kept.rc == 0 and reply["result"] == "kept", (kept.rc, kept.stdout, kept.stderr)
        assert "drained by operator, not by its watchdog" in reply["why"] and "gateway_restart" not in reply, reply
        for request in (f"undrain {HEAD}/tiny", f"drain {HEAD}/tiny", f"undrain {WORKER}", f"stop {UNIT}x"):
            refused = worker.run(f"{ssh} {request}")
            assert refused.rc == 2 and refused.stderr.startswith("refused"), (request, refused.rc, refused.stdout, refused.stderr)
        assert json.loads(head.file("/etc/sparkfleet/gateway/drained.json").content_string) == before

    def operator(verb, name):
        done = playbook("gateway.yml", "-e", json.dumps({f"gateway_{verb}": [name]}))
        assert done.returncode == 0, done.stdout[-3000:]

    operator("drain", WORKER)
    try:
        kept_by_operator({WORKER: ["operator"]})
        operator("drain", unit)
        operator("undrain", WORKER)
        kept_by_operator({unit: ["operator"]})
    finally:
        undrained = playbook("gateway.yml", "-e", json.dumps({"gateway_undrain": [unit, WORKER]}))
    assert undrained.returncode == 0, undrained.stdout[-3000:]
    assert drained_at_gateway(head) == []


def restarts(head, worker, since):
    return [(name, line) for name, host in (("head", head), ("worker", worker)) for line in decisions(host, since, action="restart_cluster")]


def test_a_killed_worker_rank_restarts_every_rank_once_and_the_cluster_serves_again(nodes):
    head, worker = nodes
    assert chat_answers(head)
    killed = now(worker)
    worker.check_output(f"docker kill {CONTAINER}")
    # The decision's line comes once every rank was stopped and started, each start once its door passed.
    name, first = wait_for(lambda: restarts(head, worker, killed), SERVE_TIMEOUT, "a watchdog to restart the cluster")[0]
    print(f"\nwatchdog: the {name}'s watchdog acted {first['time'] - killed:.1f} s after the worker's rank was killed: {first['why']}")
    wait_for(lambda: chat_answers(head), SERVE_TIMEOUT, "the cluster to serve again")
    print(f"watchdog: the cluster served again {now(head) - killed:.1f} s after the kill")
    # The head restarts every rank, whether its own decision or the worker's request came first; the other is skipped.
    steps = [step for _name, line in restarts(head, worker, killed) for step in line["ranks"]]
    print("watchdog: the restarts' steps: " + json.dumps(steps))
    assert [(step["rank"], step["step"], step["result"]) for step in steps if "skipped" not in step] == [
        (0, "stop", 0), (1, "stop", 0), (1, "start", 0), (0, "start", 0)], steps
    # The cluster is its group's only replica: draining it would stop nothing (LiteLLM routes to every deployment when
    # all are unhealthy), so it is refused and recorded, and the restart goes ahead.
    drains = [reply for _name, line in restarts(head, worker, killed) for reply in line.get("gateway") or []]
    print("watchdog: the cluster's drain: " + json.dumps(drains))
    assert [(reply["name"], reply["result"]) for reply in drains] == [(f"{HEAD}/lab-tp2", "refused")], drains
    assert "leaves model group(s) tiny-tp2 with nothing to route to" in drains[0]["why"]
    assert drained_at_gateway(head) == []


def test_removing_the_watchdog_removes_the_peers_keys(nodes):
    head, worker = nodes
    result = site("--tags", "watchdog", "-e", json.dumps({**WATCHDOG, "watchdog_state": "absent"}))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    for host in (head, worker):
        assert "sparkfleet-watchdog@" not in host.file("/root/.ssh/authorized_keys").content_string
        assert not host.file("/etc/sparkfleet/watchdog").exists
