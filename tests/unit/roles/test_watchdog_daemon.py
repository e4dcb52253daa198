"""The watchdog's daemon laid out as the watchdog role installs it and run as its unit runs it (one
sample per `run --once`, the state kept between runs), with systemctl and docker stand-ins on PATH
replaying the states a lab host reports, and a real local HTTP server standing in for the vLLM
instance: its /metrics page and a completion that answers or hangs past the probe timeout."""

import ast
import http.server
import json
import os
import pathlib
import re
import select
import stat
import subprocess
import threading
import time

import pytest
from plan_files import unit_plan, write_plan
from runtime_layout import install_runtime

from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import backend_reports, gateway_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import RUNTIME_MODULES
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import start_record
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import DAEMON, DAEMON_SOURCE

ROOT = pathlib.Path(__file__).resolve().parents[3]
KEY = "w" * 32
UNIT = "sparkfleet-vllm-llm.service"
CONTAINER = "sparkfleet-vllm-llm"
STAND_IN = """#!/usr/bin/env python3
import json, pathlib, sys
here = pathlib.Path(__file__).parent
state = json.loads((here / "host.json").read_text())
tool, args = pathlib.Path(sys.argv[0]).name, sys.argv[1:]
with open(here / "calls.log", "a") as log:
    log.write(" ".join([tool, *args]) + "\\n")
if tool == "docker" and args[:2] == ["container", "inspect"]:
    if state["container"] == "missing":
        sys.stderr.write("Error response from daemon: No such container: " + args[-1] + "\\n")
        sys.exit(1)
    started = "0001-01-01T00:00:00Z" if state["container"] == "created" else state.get("started", "2026-12-06T09:00:00Z")
    print(json.dumps([{"Name": "/" + args[-1], "State": {"Status": state["container"], "StartedAt": started}}]))
elif tool == "docker" and args[0] == "kill":
    state.update(container="exited")
    (here / "host.json").write_text(json.dumps(state))
elif tool == "systemctl" and args[0] == "show":
    print("ActiveState=" + state["active"] + "\\nSubState=" + state["sub"] + "\\nJob=")
elif tool == "systemctl" and args[-1] == "sparkfleet-gateway.service":
    pass
elif tool == "systemctl" and args[0] == "start" and state.get("start_fails"):
    sys.stderr.write("Job for " + args[-1] + " failed because the control process exited with error code.\\n")
    sys.exit(1)
elif tool == "systemctl" and args[0] in ("start", "restart"):
    import time
    # Docker stamps the new container's start in nanoseconds: after the start was asked.
    state.update(container="running", active="activating", sub="start-post",
                 started=time.strftime("%Y-%m-%dT%H:%M:%S.999999999Z", time.gmtime()))
    (here / "host.json").write_text(json.dumps(state))
elif tool == "systemctl" and args[0] == "stop":
    state.update(container="exited", active="inactive", sub="dead")
    (here / "host.json").write_text(json.dumps(state))
elif tool == "systemctl" and args[0] == "reset-failed":
    pass
elif tool == "ssh" and state.get("ssh_replay"):
    # The other host's forced command, run for real on its own files: what sshd would run there.
    import os, subprocess
    sys.exit(subprocess.run(state["ssh_replay"], env={**os.environ, "SSH_ORIGINAL_COMMAND": args[-1]}, check=False).returncode)
elif tool == "ssh" and state.get("peer_refuses_start") and args[-1].startswith("start "):
    # The peer's watchdog answers as its rank_step does when the door refused the start.
    print(json.dumps({"unit": args[-1].split()[1], "step": "start", "result": 1, "why": state["peer_refuses_start"]}))
    sys.exit(1)
elif tool == "ssh":
    pass
else:
    sys.stderr.write(tool + ": not replayed: " + " ".join(args) + "\\n")
    sys.exit(1)
"""


class Instance(http.server.BaseHTTPRequestHandler):
    generated = 10.0
    hang = False
    # vLLM started with --disable-log-stats serves /metrics with the process's series only.
    engine_series = True
    # The task the model serves: vLLM registers /v1/completions only for a generating model, /v1/embeddings for a pooling one.
    task = "generate"
    wrong_task_status = 404
    posted: list = []

    def do_GET(self):
        body = (f'vllm:num_requests_running{{engine="0",model_name="llm"}} 1.0\n'
                f'vllm:generation_tokens_total{{engine="0",model_name="llm"}} {self.generated}\n').encode()
        if not self.engine_series:
            body = b'# HELP process_cpu_seconds_total Total user and system CPU time.\nprocess_cpu_seconds_total 12.5\n'
        self.send_response(200 if self.path == "/metrics" else 404)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        request = json.loads(self.rfile.read(length))
        Instance.posted.append(self.path)
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.send_response(401)
            self.end_headers()
            return
        if self.path != {"generate": "/v1/completions", "pooling": "/v1/embeddings"}[Instance.task]:
            # A release answers that the model does not support the task (400); an older one has no such route (404).
            self.send_response(Instance.wrong_task_status)
            self.end_headers()
            return
        if Instance.hang:
            time.sleep(2.5)
        assert request["model"] == "llm" and (Instance.task == "pooling" or request["max_tokens"] <= 5)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"choices": [{"text": " 4"}]}')

    def log_message(self, *args):
        pass


@pytest.fixture
def instance():
    Instance.generated, Instance.hang, Instance.engine_series, Instance.task, Instance.posted = 10.0, False, True, "generate", []
    Instance.wrong_task_status = 404
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Instance)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join()


@pytest.fixture
def host(tmp_path, instance):
    install_runtime(tmp_path, [{"path": DAEMON, "source": DAEMON_SOURCE}])
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("docker", "systemctl", "ssh"):
        (tools / tool).write_text(STAND_IN)
        (tools / tool).chmod(0o755)
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "llm.env").write_text(f"VLLM_API_KEY={KEY}\n")
    plan = unit_plan(container=CONTAINER, url=f"http://127.0.0.1:{instance.server_port}", env_path=str(plans / "llm.env"), model="llm",
                     served_names=["llm"], serve_args=["/models/llm"], config_hash="h1", health_timeout=5,
                     maintenance_flag=str(tmp_path / "run" / "vllm-maintenance"))
    # No warm stamp: each start the watchdog makes gets the cold grace, as short as the health timeout here.
    plan["cold_start"].update(timeout=5, stamp=str(tmp_path / "jit" / "warm" / "h1"))
    write_plan(plans, plan)
    settings = {"interval": 5, "failures": 3, "probe_timeout": 1, "probe_tokens": 4, "budget": 1, "budget_window": 3600, "warm_grace": 30,
                "maintenance_max_age": 60, "bundle_time_limit": 5, "route_budget": 8, "route_budget_window": 3600, "plan_dirs": [str(plans)],
                "state_dir": str(tmp_path / "state"),
                "peer_dir": str(tmp_path / "peer"), "node": "spark-1", "gateway_config_dir": ""}
    (tmp_path / "watchdog.json").write_text(json.dumps(settings))
    set_host(tmp_path, container="running", active="active", sub="running")
    return tmp_path


def daemon(host):
    return host / DAEMON.lstrip("/")


def set_host(host, **state):
    path = host / "bin" / "host.json"
    path.write_text(json.dumps({**(json.loads(path.read_text()) if path.exists() else {}), **state}))


def sample(host, *extra):
    """One sample as the unit runs the daemon; its journal lines, parsed."""
    environment = {**os.environ, "PATH": f"{host / 'bin'}:{os.environ['PATH']}"}
    completed = subprocess.run(["/usr/bin/python3", "-I", str(daemon(host)), *(extra or ("run", "--once")),
                                "--config", str(host / "watchdog.json")], capture_output=True, text=True, env=environment, timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    return [json.loads(line) for line in completed.stdout.splitlines()] if not extra else completed.stdout


def samples(host, count):
    """The journal lines of ``count`` samples in a row."""
    lines = []
    for _sample in range(count):
        lines += sample(host)
    return lines


def actions(host):
    log = host / "bin" / "calls.log"
    return [line for line in (log.read_text().splitlines() if log.exists() else [])
            if line.startswith(("systemctl", "ssh", "docker kill")) and "show" not in line]


# A wedged engine is killed before its unit restarts: docker stop would wait its grace on a frozen process.
KILL = f"docker kill --signal KILL {CONTAINER}"
RANK_UNIT = "sparkfleet-cluster-tp2.service"


def as_cluster_head(host, peers=True, rank=0):
    """The host runs rank 0 of a two-node cluster (native backend); its peer at 10.0.0.2 runs rank 1 (or the other way round)."""
    plan = json.loads((host / "plans" / "llm.json").read_text())
    (host / "plans" / "llm.json").unlink()
    plan.update(name="tp2", unit=RANK_UNIT, container="vllm-cluster-tp2", start_bound={**plan["start_bound"], "path": start_record(RANK_UNIT)}, cluster={
        "rank": rank, "head": rank == 0, "nnodes": 2, "backend": "native", "master_addr": "10.0.0.1", "master_port": 29501,
        "host_ip": "10.0.0.2" if rank else "10.0.0.1",
        "nodes": [{"name": "spark-2", "rank": 1, "address": "10.0.0.2"}, {"name": "spark-1", "rank": 0, "address": "10.0.0.1"}]})
    (host / "plans" / "tp2.json").write_text(json.dumps(plan))
    if peers:
        (host / "peer").mkdir()
        for name in ("peer_ed25519", "known_hosts"):
            (host / "peer" / name).write_text("recorded\n")


def ssh_to(host, step, address="10.0.0.2"):
    return (f"ssh -i {host / 'peer' / 'peer_ed25519'} -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile={host / 'peer' / 'known_hosts'} "
            f"-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o ConnectTimeout=10 -l root -- {address} {step} {RANK_UNIT}")


def test_a_worker_ranks_failure_asks_the_head_to_restart_every_rank(host):
    as_cluster_head(host, rank=1)
    set_host(host, container="exited", active="failed", sub="failed")
    decisions = [line for line in samples(host, 3) if line.get("unit") == RANK_UNIT]
    assert decisions[-1]["action"] == "restart_cluster" and actions(host) == [ssh_to(host, "restart", "10.0.0.1")]
    # The stand-in's ssh answers nothing: the step is recorded as asked.
    assert decisions[-1]["ranks"] == [{"rank": 0, "address": "10.0.0.1", "step": "restart", "result": 0}]


def test_the_head_restarts_every_rank_once_when_asked_twice(host):
    as_cluster_head(host)
    environment = {**os.environ, "PATH": f"{host / 'bin'}:{os.environ['PATH']}", "SSH_ORIGINAL_COMMAND": f"restart {RANK_UNIT}"}
    command = ["/usr/bin/python3", "-I", str(daemon(host)), "peer", "--from", "spark-2", "--cluster",
               "--config", str(host / "watchdog.json")]
    first = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=60, check=False)
    assert first.returncode == 0 and [step["step"] for step in json.loads(first.stdout)["ranks"]] == ["stop", "stop", "start", "start"]
    again = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=60, check=False)
    assert re.match(r"every rank was restarted \d+ s ago", json.loads(again.stdout)["ranks"][0]["skipped"]), "however long the first took"
    assert len(actions(host)) == 5


def test_a_cluster_rank_down_restarts_every_rank_stopped_first_then_the_workers_before_the_head(host):
    as_cluster_head(host)
    set_host(host, container="exited", active="failed", sub="failed")
    decisions = [line for line in samples(host, 3) if line.get("unit") == RANK_UNIT]
    assert [d["verdict"] for d in decisions] == ["down"] * 3 and decisions[-1]["action"] == "restart_cluster"
    assert "every rank restarted (1 of 1 in 3600 s)" in decisions[-1]["why"]
    assert actions(host) == [f"systemctl stop -- {RANK_UNIT}", ssh_to(host, "stop"), ssh_to(host, "start"),
                             f"systemctl reset-failed -- {RANK_UNIT}", f"systemctl start --no-block -- {RANK_UNIT}"]
    assert [(step["rank"], step["step"], step["result"]) for step in decisions[-1]["ranks"]] == [
        (0, "stop", 0), (1, "stop", 0), (1, "start", 0), (0, "start", 0)]
    assert not (host / "run" / "vllm-maintenance").exists(), "the restart's own flag is lowered once every rank is started"


def test_a_worker_whose_door_refused_its_start_leaves_the_head_stopped_and_the_reason_in_the_journal(host):
    """The head's restart runs the cluster role's waves: the worker (native: the first wave) refused, so the head is not
    started to wait for a rank that never comes."""
    as_cluster_head(host)
    refused = "rank 1 of cluster tp2 (sparkfleet-cluster-tp2.service): the start was refused: pid 27079 (sleep) holds /dev/nvidia9"
    set_host(host, container="exited", active="failed", sub="failed", peer_refuses_start=refused)
    decision = [line for line in samples(host, 3) if line.get("unit") == RANK_UNIT][-1]
    assert decision["action"] == "restart_cluster"
    assert actions(host) == [f"systemctl stop -- {RANK_UNIT}", ssh_to(host, "stop"), ssh_to(host, "start")], "the head is not started"
    assert decision["ranks"][2:] == [{"rank": 1, "address": "10.0.0.2", "step": "start", "result": 1, "why": refused},
                                     {"step": "start", "skipped": "rank 1 did not start, so rank 0 was not started"}]


def test_a_ray_head_that_did_not_start_leaves_its_workers_stopped_with_their_flags_lowered(host):
    """Ray starts the head first: a head whose start failed is not followed by its workers, whose nodes are told to lower
    the flags the stop raised, or their watchdogs would stay quiet for the flag's age."""
    as_cluster_head(host)
    plan_path = host / "plans" / "tp2.json"
    plan = json.loads(plan_path.read_text())
    plan["cluster"]["backend"] = "ray"
    plan_path.write_text(json.dumps(plan))
    set_host(host, container="exited", active="failed", sub="failed", start_fails=True)
    decision = [line for line in samples(host, 3) if line.get("unit") == RANK_UNIT][-1]
    assert actions(host) == [f"systemctl stop -- {RANK_UNIT}", ssh_to(host, "stop"), f"systemctl reset-failed -- {RANK_UNIT}",
                             f"systemctl start --no-block -- {RANK_UNIT}", ssh_to(host, "release")]
    assert [(step.get("rank"), step["step"], step.get("result")) for step in decision["ranks"]] == [
        (0, "stop", 0), (1, "stop", 0), (0, "start", 1), (None, "start", None), (1, "release", 0)]
    assert decision["ranks"][2]["why"].startswith(f"systemctl start {RANK_UNIT} exited 1: Job for")


def test_a_cluster_rank_is_not_watched_without_ssh_access_to_its_peers(host):
    as_cluster_head(host, peers=False)
    set_host(host, container="exited", active="failed", sub="failed")
    lines = samples(host, 3)
    assert "not watched: the cluster ranks sparkfleet-cluster-tp2.service" in lines[0]["why"]
    assert not [line for line in lines if line.get("unit") == RANK_UNIT] and actions(host) == []


def test_a_rank_not_watched_at_the_start_is_announced_once_its_peers_keys_arrive(host):
    """The running daemon (not one sample): its start line says the rank is not watched; once the watchdog role set up the
    peers' keys, the next sample says it is watched now. Stopped by its recorded process id."""
    as_cluster_head(host, peers=False)
    set_host(host, container="running", active="active", sub="running")
    environment = {**os.environ, "PATH": f"{host / 'bin'}:{os.environ['PATH']}"}
    daemon_process = subprocess.Popen(["/usr/bin/python3", "-I", "-u", str(daemon(host)), "run", "--config", str(host / "watchdog.json")],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment)
    lines = []

    def next_line():
        # Bounded, so a daemon that never says it would fail the test rather than hang it.
        ready, _writable, _errors = select.select([daemon_process.stdout], [], [], 120)
        assert ready, f"the daemon wrote no line within 120 s; so far: {lines}"
        return json.loads(daemon_process.stdout.readline())

    try:
        lines.append(next_line())
        (host / "peer").mkdir()
        for name in ("peer_ed25519", "known_hosts"):
            (host / "peer" / name).write_text("recorded\n")
        while not any(line.get("verdict") == "watching" for line in lines):
            lines.append(next_line())
    finally:
        daemon_process.kill()
        daemon_process.wait(timeout=30)
    assert lines[0]["verdict"] == "started" and f"not watched: the cluster ranks {RANK_UNIT}" in lines[0]["why"]
    assert [line["why"] for line in lines if line.get("verdict") == "watching"] == [
        f"now watching the cluster ranks {RANK_UNIT} (SSH access to their peers is set up)"]


def test_a_peer_may_only_stop_or_start_a_cluster_rank_planned_here(host):
    as_cluster_head(host)
    flag = host / "run" / "vllm-maintenance"

    def peer(command):
        environment = {**os.environ, "PATH": f"{host / 'bin'}:{os.environ['PATH']}", "SSH_ORIGINAL_COMMAND": command}
        return subprocess.run(["/usr/bin/python3", "-I", str(daemon(host)), "peer", "--from", "spark-2", "--cluster",
                               "--config", str(host / "watchdog.json")], capture_output=True, text=True, env=environment, timeout=60, check=False)

    stopped = peer(f"stop {RANK_UNIT}")
    assert stopped.returncode == 0 and flag.read_text() == RANK_UNIT + "\n", stopped.stderr
    # A cluster restart stops a rank through its peer: the rank's stacks are read first, into the watchdog's own folder.
    stacks = pathlib.Path(json.loads(stopped.stdout)["stacks"])
    assert stacks.parent == host / "state" / "stacks" and stacks.name.startswith(RANK_UNIT) and stat.S_IMODE(stacks.stat().st_mode) == 0o600
    assert stacks.read_text().startswith("$ /usr/bin/docker top "), stacks.read_text()[:300]
    started = peer(f"start {RANK_UNIT}")
    assert started.returncode == 0 and not flag.exists()
    raised = peer(f"stop {RANK_UNIT}")
    released = peer(f"release {RANK_UNIT}")
    assert raised.returncode == released.returncode == 0 and not flag.exists(), "release lowers the flag and starts nothing"
    for refused in ("rm -rf /", f"kill {RANK_UNIT}", "stop sparkfleet-vllm-llm.service", f"stop {RANK_UNIT} now", "drain spark-2/llm",
                    "release sparkfleet-vllm-llm.service"):
        answer = peer(refused)
        assert answer.returncode == 2 and answer.stderr.startswith("refused"), refused
    assert actions(host) == [f"systemctl stop -- {RANK_UNIT}", f"systemctl reset-failed -- {RANK_UNIT}", f"systemctl start --no-block -- {RANK_UNIT}",
                             f"systemctl stop -- {RANK_UNIT}"]


def test_an_exited_container_is_started_through_its_unit_at_the_third_sample(host):
    set_host(host, container="exited", active="inactive", sub="dead")
    lines = samples(host, 3)
    assert lines[0]["verdict"] == "started" and f"watching {UNIT} every 5 s" in lines[0]["why"]
    decisions = [line for line in lines if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["down"] * 3 and decisions[-1]["action"] == "start"
    assert actions(host) == [f"systemctl reset-failed -- {UNIT}", f"systemctl start --no-block -- {UNIT}"]
    state = json.loads((host / "state" / "state.json").read_text())
    assert len(state["units"][UNIT]["restarts"]) == 1
    assert stat.S_IMODE((host / "state" / "state.json").stat().st_mode) == 0o600


def test_a_fresh_maintenance_flag_keeps_it_quiet(host):
    set_host(host, container="exited", active="inactive", sub="dead")
    (host / "run").mkdir()
    (host / "run" / "vllm-maintenance").write_text("llm\n")
    decisions = [line for line in samples(host, 4) if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["maintenance"] and actions(host) == []


def test_a_hanging_completion_while_the_counters_stand_still_restarts_the_unit(host):
    Instance.hang = True
    decisions = [line for line in samples(host, 3) if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["wedged"] * 3
    assert decisions[0]["why"].startswith("the counters did not move (1 requests running by the last gauge) and a 4-token probe got no answer in 1 s")
    assert actions(host) == [KILL, f"systemctl restart --no-block -- {UNIT}"]


def test_an_engine_without_vllms_series_is_judged_by_its_probe_and_restarted_when_it_hangs(host):
    """Found in a reading: an instance started with --disable-log-stats failed every sample with a traceback."""
    Instance.engine_series = False
    decisions = [line for line in samples(host, 2) if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["answers"] and actions(host) == []
    Instance.hang = True
    decisions = [line for line in samples(host, 3) if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["wedged"] * 3
    assert decisions[0]["why"].startswith("/metrics carries no vLLM series (--disable-log-stats) and a probe got no answer in 1 s")
    assert actions(host) == [KILL, f"systemctl restart --no-block -- {UNIT}"]


@pytest.mark.parametrize("wrong_task_status", [400, 404])
def test_an_embedding_model_on_the_default_runner_is_probed_with_an_embedding_and_remembered(host, wrong_task_status):
    """Found in a reading: an embedding model served without --runner pooling got completions refused and stayed inconclusive."""
    Instance.task, Instance.engine_series, Instance.wrong_task_status = "pooling", False, wrong_task_status
    decisions = [line for line in samples(host, 2) if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["answers"] and actions(host) == []
    assert Instance.posted == ["/v1/completions", "/v1/embeddings", "/v1/embeddings"], "the task that answered is asked first next time"
    Instance.hang = True
    decisions = [line for line in samples(host, 3) if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["wedged"] * 3 and actions(host) == [KILL, f"systemctl restart --no-block -- {UNIT}"]


def test_a_key_the_engine_refuses_is_not_taken_for_the_other_task(host):
    (host / "plans" / "llm.env").write_text("VLLM_API_KEY=" + "x" * 32 + "\n")
    decisions = [line for line in samples(host, 2) if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["inconclusive"] and "HTTP 401 on /v1/completions" in decisions[0]["why"]
    assert Instance.posted == ["/v1/completions", "/v1/completions"] and actions(host) == []


def test_a_healthy_unit_writes_one_line_and_then_nothing(host):
    decisions = [line for line in samples(host, 3) if line.get("unit") == UNIT]
    assert [d["verdict"] for d in decisions] == ["answers"], "a steady verdict is written once"
    # Moving counters read as progress: still serving, so no new line.
    Instance.generated = 20.0
    decisions = [line for line in sample(host) if line.get("unit") == UNIT]
    assert decisions == [] and actions(host) == []
    assert json.loads((host / "state" / "state.json").read_text())["units"][UNIT]["verdict"] == "progress"


@pytest.mark.parametrize(("damage", "named"), [
    ('{"schema_version": 1}', "schema_version 1, this release reads 2"),
    ("{damaged", "not valid JSON"),
    ("[]", "holds no plan object"),
    (None, "no usable start_bound"),
])
def test_a_damaged_plan_file_is_named_and_the_good_ones_are_still_watched(host, damage, named):
    damaged = host / "plans" / "other.json"
    if damage is None:
        write_plan(host / "plans", unit_plan("other", start_bound={"starts": 3, "window": 1800, "path": "/etc/cron.d/job.json"}))
    else:
        damaged.write_text(damage)
    lines = sample(host)
    assert lines[0]["verdict"] == "started" and lines[0]["why"].startswith(f"watching {UNIT} every 5 s")
    refused = lines[0]["why"].split("; not plans it can act on: ")[1]
    assert refused.startswith(f"{damaged}: ") and named in refused and refused.endswith(
        "; re-apply site.yml to this host (the serving roles write the plan files)")
    assert [line["verdict"] for line in lines[1:] if line.get("unit") == UNIT] == ["answers"]


def test_past_the_budget_it_gives_up_writes_the_evidence_and_is_handed_back_by_clear(host):
    set_host(host, container="exited", active="failed", sub="failed")
    samples(host, 3)
    set_host(host, container="exited", active="failed", sub="failed")
    state = json.loads((host / "state" / "state.json").read_text())
    state["units"][UNIT]["grace_until"] = 0
    (host / "state" / "state.json").write_text(json.dumps(state))
    decisions = [line for line in samples(host, 3) if line.get("unit") == UNIT]
    assert decisions[-1]["action"] == "give_up" and "used the budget of 1: a person is needed" in decisions[-1]["why"]
    given_up = host / "state" / f"{UNIT}.person-needed.json"
    record = json.loads(given_up.read_text())
    assert [sample["verdict"] for sample in record["evidence"]] == ["down"] * 3 and record["clear"].endswith(f" clear {UNIT}")
    assert [line for line in sample(host) if line.get("unit") == UNIT][0]["verdict"] == "person_needed"
    assert sample(host, "clear", UNIT).strip() == f"{UNIT}: handed back to the watchdog (its restart budget starts afresh)"
    assert not given_up.exists()
    assert [line for line in sample(host) if line.get("unit") == UNIT][0]["verdict"] == "handed_back"


def test_the_daemon_imports_the_standard_library_and_the_host_runtime_alone():
    tree = ast.parse((ROOT / DAEMON_SOURCE).read_text(encoding="utf-8"))
    collection = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module.startswith("ansible")]
    assert collection and {module.rsplit(".", 1)[1] for module in collection} <= set(RUNTIME_MODULES)
    assert all(module.startswith("ansible_collections.sparkfleet.vllm.plugins.module_utils.") for module in collection)
    assert not [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names if alias.name.startswith("ansible")]


def as_gateway(host, backends=("spark-1", "spark-2")):
    """The host (spark-1) also runs the gateway, in front of the llm instance of each backend, one group."""
    hostvars = {name: {"ansible_host": f"10.0.0.{index + 1}", "vllm_endpoints": [
        {"name": "llm", "bind_addresses": ["0.0.0.0"], "port": 8000, "served_names": ["llm"], "api_key": KEY}]}
        for index, name in enumerate(backends)}
    plan = gateway_plan({"image": "litellm@sha256:" + "a" * 64, "master_key": "sk-" + "m" * 40, "backends": list(backends),
                         "config_dir": str(host / "gateway")}, backend_reports(list(backends), hostvars), "spark-1")
    assert plan["errors"] == []
    (host / "gateway" / "litellm").mkdir(parents=True)
    (host / "gateway" / "plan.json").write_text(json.dumps({key: plan[key] for key in ("schema_version", "deployments", "groups", "settings", "url")}))
    settings = json.loads((host / "watchdog.json").read_text())
    (host / "watchdog.json").write_text(json.dumps({**settings, "gateway_config_dir": str(host / "gateway")}))
    routes_to(host, [{"name": "spark-1", "address": "local"}])


def routes_to(host, gateways):
    (host / "peer").mkdir(exist_ok=True)
    (host / "peer" / "gateways.json").write_text(json.dumps({"gateways": gateways}))


def drained(host):
    path = host / "gateway" / "drained.json"
    return json.loads(path.read_text())["drained"] if path.exists() else []


def test_a_unit_is_drained_at_its_gateway_before_the_start_and_undrained_once_it_serves(host):
    as_gateway(host)
    set_host(host, container="exited", active="inactive", sub="dead")
    decisions = [line for line in samples(host, 3) if line.get("unit") == UNIT]
    assert decisions[-1]["action"] == "start"
    assert [(r["gateway"], r["name"], r["result"], r["gateway_restart"]) for r in decisions[-1]["gateway"]] == [("spark-1", "spark-1/llm", "drained", 0)]
    assert drained(host) == ["spark-1/llm"]
    config = (host / "gateway" / "litellm" / "config.yaml").read_text()
    assert "10.0.0.1" not in config and "10.0.0.2" in config
    assert stat.S_IMODE((host / "gateway" / "drained.json").stat().st_mode) == 0o600
    assert actions(host)[0] == "systemctl try-restart --no-block -- sparkfleet-gateway.service", "drained before the unit is started"
    set_host(host, container="running", active="active", sub="running")
    state = json.loads((host / "state" / "state.json").read_text())
    state["units"][UNIT]["grace_until"] = 0
    (host / "state" / "state.json").write_text(json.dumps(state))
    undrained = [line for line in sample(host) if line.get("action") == "undrain"]
    assert [(r["name"], r["result"]) for r in undrained[0]["gateway"]] == [("spark-1/llm", "undrained")] and drained(host) == []
    assert json.loads((host / "state" / "gateway-drains.json").read_text()) == {"units": {}}
    assert not [line for line in sample(host) if line.get("action") == "undrain"], "undrained once"


def test_releasing_a_hold_on_a_unit_that_stays_out_neither_restarts_the_gateway_nor_spends_the_budget(host):
    """Found in a review: a watchdog's undrain of its unit while the operator held the whole host changed the record,
    not the routing, and still restarted LiteLLM (every group away meanwhile) and spent a change of the budget."""
    as_gateway(host)
    set_host(host, container="exited", active="inactive", sub="dead")
    samples(host, 3)
    assert drained(host) == ["spark-1/llm"]
    spent = json.loads((host / "state" / "route-budget.json").read_text())
    record = json.loads((host / "gateway" / "drained.json").read_text())
    (host / "gateway" / "drained.json").write_text(json.dumps({**record, "drained": ["spark-1", "spark-1/llm"],
                                                               "owners": {**record["owners"], "spark-1": ["operator"]}}))
    config = (host / "gateway" / "litellm" / "config.yaml").read_text()
    (host / "bin" / "calls.log").unlink(missing_ok=True)
    set_host(host, container="running", active="active", sub="running")
    state = json.loads((host / "state" / "state.json").read_text())
    state["units"][UNIT]["grace_until"] = 0
    (host / "state" / "state.json").write_text(json.dumps(state))
    undrained = [line for line in sample(host) if line.get("action") == "undrain"]
    assert [(r["name"], r["result"]) for r in undrained[0]["gateway"]] == [("spark-1/llm", "kept")]
    assert "gateway_restart" not in undrained[0]["gateway"][0] and drained(host) == ["spark-1"]
    assert not [line for line in actions(host) if "sparkfleet-gateway" in line], "the routing did not change"
    assert json.loads((host / "state" / "route-budget.json").read_text()) == spent
    assert (host / "gateway" / "litellm" / "config.yaml").read_text() == config


def test_the_last_replica_of_a_group_is_not_drained_and_the_watchdog_acts_anyway(host):
    as_gateway(host, backends=("spark-1",))
    set_host(host, container="exited", active="inactive", sub="dead")
    decision = [line for line in samples(host, 3) if line.get("unit") == UNIT][-1]
    assert decision["action"] == "start" and decision["gateway"][0]["result"] == "refused"
    assert "leaves model group(s) llm with nothing to route to" in decision["gateway"][0]["why"]
    assert drained(host) == [] and not (host / "state" / "gateway-drains.json").exists()
    assert actions(host) == [f"systemctl reset-failed -- {UNIT}", f"systemctl start --no-block -- {UNIT}"]


def test_an_operators_drain_stays_when_the_unit_serves_again(host):
    as_gateway(host)
    (host / "gateway" / "drained.json").write_text(json.dumps({"schema_version": 1, "drained": ["spark-1"]}))
    set_host(host, container="exited", active="inactive", sub="dead")
    decision = [line for line in samples(host, 3) if line.get("unit") == UNIT][-1]
    assert decision["gateway"][0]["result"] == "already_drained"
    set_host(host, container="running", active="active", sub="running")
    state = json.loads((host / "state" / "state.json").read_text())
    state["units"][UNIT]["grace_until"] = 0
    (host / "state" / "state.json").write_text(json.dumps(state))
    assert not [line for line in sample(host) if line.get("action") == "undrain"] and drained(host) == ["spark-1"]


def test_a_backend_drains_at_a_remote_gateway_through_its_peer_command_and_only_its_own_units(host, tmp_path_factory):
    gateway_host = tmp_path_factory.mktemp("gateway-host")
    install_runtime(gateway_host, [{"path": DAEMON, "source": DAEMON_SOURCE}])
    (gateway_host / "plans").mkdir()
    settings = json.loads((host / "watchdog.json").read_text())
    (gateway_host / "watchdog.json").write_text(json.dumps({**settings, "plan_dirs": [str(gateway_host / "plans")], "state_dir": str(gateway_host / "state"),
                                                            "peer_dir": str(gateway_host / "peer")}))
    as_gateway(gateway_host)
    settings = json.loads((host / "watchdog.json").read_text())
    (host / "watchdog.json").write_text(json.dumps({**settings, "node": "spark-2"}))
    routes_to(host, [{"name": "spark-1", "address": "10.0.0.1"}])
    peer = ["/usr/bin/python3", "-I", str(daemon(gateway_host)), "peer", "--from", "spark-2", "--backend",
            "--config", str(gateway_host / "watchdog.json")]
    set_host(host, container="exited", active="inactive", sub="dead", ssh_replay=peer)
    decision = [line for line in samples(host, 3) if line.get("unit") == UNIT][-1]
    assert [(r["gateway"], r["name"], r["result"]) for r in decision["gateway"]] == [("spark-1", "spark-2/llm", "drained")]
    assert drained(gateway_host) == ["spark-2/llm"]
    assert actions(host)[0].endswith("-l root -- 10.0.0.1 drain spark-2/llm")
    environment = {**os.environ, "PATH": f"{host / 'bin'}:{os.environ['PATH']}"}
    for request in ("drain spark-1/llm", "undrain spark-1", f"stop {RANK_UNIT}", "drain spark-2/llm;reboot"):
        refused = subprocess.run(peer, capture_output=True, text=True, env={**environment, "SSH_ORIGINAL_COMMAND": request}, timeout=60, check=False)
        assert refused.returncode == 2 and refused.stderr.startswith("refused"), (request, refused.stderr)
    assert drained(gateway_host) == ["spark-2/llm"]


def test_a_gateway_that_did_not_answer_keeps_the_drain_recorded_and_the_undrain_is_asked_again(host):
    routes_to(host, [{"name": "gw", "address": "10.0.0.9"}])
    set_host(host, container="exited", active="inactive", sub="dead")
    decision = [line for line in samples(host, 3) if line.get("unit") == UNIT][-1]
    assert decision["action"] == "start" and decision["gateway"][0]["result"] == "unreachable"
    assert json.loads((host / "state" / "gateway-drains.json").read_text()) == {"units": {UNIT: ["gw"]}}
    set_host(host, container="running", active="active", sub="running")
    state = json.loads((host / "state" / "state.json").read_text())
    state["units"][UNIT]["grace_until"] = 0
    (host / "state" / "state.json").write_text(json.dumps(state))
    (host / "peer" / "gateways.json").write_text("{damaged")
    assert not [line for line in sample(host) if line.get("action") == "undrain"], "no gateway list: nothing is undrained or forgotten"
    routes_to(host, [{"name": "gw", "address": "10.0.0.9"}])
    undrains = [line for line in sample(host) if line.get("action") == "undrain"]
    assert undrains[0]["gateway"][0]["result"] == "unreachable", "asked again while the unit serves"
    assert json.loads((host / "state" / "gateway-drains.json").read_text()) == {"units": {UNIT: ["gw"]}}
