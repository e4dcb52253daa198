# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sparkfleet.vllm's watchdog: forward progress of the units in the host's plan files.

Run by sparkfleet-watchdog.service (the watchdog role) with the OS's Python. The judgement is
sparkfleet.vllm's plugins/module_utils/_watchdog.py (unit-tested there), from the host runtime
installed beside this file; this file only reads the units (docker inspect, systemctl show, /metrics, a probe
completion), acts (systemctl), keeps the state and writes one JSON line per decision to stdout,
which the journal keeps.

  sparkfleet_watchdog.py run [--config FILE] [--once]
  sparkfleet_watchdog.py clear UNIT      hand a unit the watchdog gave up on back to it
  sparkfleet_watchdog.py status          the state of every unit, as JSON
  sparkfleet_watchdog.py peer --from HOST [--cluster] [--backend]
                                         another host's request over SSH (SSH_ORIGINAL_COMMAND): a cluster peer's
                                         stop|start|release|restart UNIT, a gateway backend's drain|undrain HOST/INSTANCE
  sparkfleet_watchdog.py ranks           the cluster ranks and the gateway's backends deployed here, as JSON (the
                                         role's key exchange)
"""

import argparse
import contextlib
import fcntl
import glob
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster_sequence import restart as cluster_restart  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._diagnose import CONFIG_DIRS, collect_host_bundle, run_command, save_engine_stacks  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import prune_oldest, write_atomically  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway_routes import (  # noqa: E402
    ROUTE_LOCK,
    ROUTING_FILES,
    drained_file,
    host_of,
    in_rotation,
    read_drained,
    read_plan,
    render_config,
    watchdog_route,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway_routes import UNIT as GATEWAY_UNIT  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import DOOR_TIMEOUT, DoorNotPassed, await_door, clear_refusal  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, inspect_container, show_units, state_of  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import PlanFileError  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import read_plan as read_unit_plan  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import parse_env_file  # noqa: E402
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import (  # noqa: E402
    CONFIG_PATH,
    DOWN_STATES,
    DRAINS_FILE,
    GATEWAYS_FILE,
    HOLD_ROUTES,
    KNOWN_HOSTS,
    PEER_DIR,
    PEER_KEY,
    PLAN_NAME,
    ROUTE_BUDGET_FILE,
    SERVING,
    SETTINGS,
    STATE_DIR,
    WatchdogError,
    assess,
    deployed_ranks,
    drained_names,
    engine_hold,
    head_address,
    is_worker,
    journal_line,
    needs_probe,
    new_memory,
    next_sample_in,
    other_probe_kind,
    parse_metrics,
    peer_request,
    person_needed_path,
    probe_kind,
    probe_request,
    recently_restarted,
    route_budget,
    routed_backends,
    usable_gateways,
    worth_a_line,
)

COMMAND_TIMEOUT = 30
# Stopping a rank waits for its container to stop (the unit's own stop timeout is 90 s by default).
STOP_TIMEOUT = 150
# Starting a rank waits until its door passed (the host runtime's await_door): its systemctl calls, then the door's bound.
# reset-failed and start, the door's bound, and its last poll (docker inspect and systemctl show) after the bound.
START_TIMEOUT = 4 * COMMAND_TIMEOUT + DOOR_TIMEOUT
# A gateway's restart after a drain: the old LiteLLM stops (30 s), the new one starts.
GATEWAY_RESTART_TIMEOUT = 120
# Under the state folder: the engines' stacks read before a kill (its default is _host_paths.STACKS_DIR, which bundles read).
STACKS_FOLDER = "stacks"
# The give-up bundles kept on the host, the newest: each can hold an NVIDIA bug report of tens of megabytes.
BUNDLES_KEPT = 10
# No proxy from the service's environment: a probe carries the instance's key, and every URL is the host's own.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def write_json(path, value, mode=0o600):
    write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n", mode)


def write_text(path, text, mode):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomically(path, text, mode)


def read_json(path, default):
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except (OSError, ValueError):
        return default


def read_text(path):
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read()
    except FileNotFoundError:
        return None


def watched_plans(plan_dirs, peer_dir):
    """The plans of the instances and cluster ranks deployed on the host, in their start order by name; the
    cluster ranks it cannot restart together (no SSH access to their peers yet), not watched; and the files
    that are no plan the watchdog can act on, with why."""
    peers_reachable = all(os.path.exists(os.path.join(peer_dir, name)) for name in (PEER_KEY, KNOWN_HOSTS))
    plans, skipped, refused = [], [], []
    for folder in plan_dirs:
        for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
            try:
                plan = read_unit_plan(path)
            except PlanFileError as error:
                refused.append(str(error))
                continue
            (skipped if plan.get("cluster") and not peers_reachable else plans).append(plan)
    return plans, skipped, refused


def api_key(plan):
    try:
        text = read_text(plan["env_path"])
    except OSError:
        text = None
    return parse_env_file(text or "").get("VLLM_API_KEY", "")


def container_status(container):
    """Docker's status of the container; missing only when docker says there is none, unknown when it did not answer."""
    try:
        record = inspect_container(read_host, container)
    except StateUnanswered:
        return "unknown"
    return "missing" if record is None else state_of(record).get("Status") or "unknown"


def unit_state(unit):
    """(ActiveState, SubState, whether a job is queued); unknown when systemd did not answer."""
    try:
        values = show_units(read_host, [unit], ("ActiveState", "SubState", "Job"))[unit]
    except StateUnanswered:
        return "unknown", "unknown", False
    return values["ActiveState"] or "unknown", values["SubState"] or "unknown", values["Job"] not in ("", "0")


def call(url, timeout, key=None, body=None):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = "Bearer " + key
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
    with OPENER.open(request, timeout=timeout) as response:
        return response.status, response.read().decode("utf-8", "replace")


def read_metrics(plan, timeout):
    try:
        status, text = call(plan["url"].rstrip("/") + "/metrics", timeout)
    except (OSError, ValueError, http.client.HTTPException):
        return None
    return parse_metrics(text) if status == 200 else None


def send_probe(plan, settings, kind):
    key, model = api_key(plan), (plan.get("served_names") or [plan.get("model")])[0]
    path, body = probe_request(kind, model, settings["probe_tokens"])
    started, status = time.monotonic(), None
    try:
        call(plan["url"].rstrip("/") + path, settings["probe_timeout"], key, body)
        outcome, detail = "ok", ""
    except urllib.error.HTTPError as error:
        status = error.code
        outcome, detail = ("error" if error.code >= 500 else "refused"), f"HTTP {error.code} on {path}"
    except (TimeoutError, OSError, ValueError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", error)
        timed_out = isinstance(reason, TimeoutError) or "timed out" in str(reason)
        outcome, detail = ("timeout" if timed_out else "error"), str(reason)[:200]
    return {"outcome": outcome, "seconds": round(time.monotonic() - started, 2), "detail": detail}, status


def read_hold(plan, timeout):
    """Whether the engine says it is held on purpose (a checkpoint cycle, a pause), asked only after a probe went
    unanswered; a route the engine does not serve says nothing."""
    for route in HOLD_ROUTES:
        try:
            status, text = call(plan["url"].rstrip("/") + route, timeout, api_key(plan))
        except urllib.error.HTTPError as error:
            status = error.code
            try:
                text = error.read().decode("utf-8", "replace")
            except (OSError, http.client.HTTPException):
                continue
        except (OSError, ValueError, http.client.HTTPException):
            continue
        hold = engine_hold(route, status, text)
        if hold:
            return hold
    return None


def probe(plan, settings, memory):
    """A tiny real request of the task the engine serves: it returns only when the engine steps. A route refused as
    the wrong task is asked of the other task at once, and the kind that answered is remembered."""
    kind = probe_kind(plan, memory)
    result, status = send_probe(plan, settings, kind)
    other = other_probe_kind(kind, status)
    if other:
        retried, _status = send_probe(plan, settings, other)
        if retried["outcome"] != "refused":
            kind, result = other, retried
    if result["outcome"] == "ok":
        memory["probe_kind"] = kind
    return result


def flag_age(plan, now):
    flag = plan.get("maintenance_flag")
    try:
        return max(0.0, now - os.stat(flag).st_mtime) if flag else None
    except OSError:
        return None


def act(decision, plan, settings, state_dir, memory, now):
    unit = plan["unit"]
    # A cluster is drained by its head, whichever node decided (coordinate).
    if decision["action"] in ("start", "restart", "give_up"):
        decision["gateway"] = drain(plan, settings)
    if decision["action"] == "start":
        run_command(["systemctl", "reset-failed", "--", unit], COMMAND_TIMEOUT)
        decision["result"] = run_command(["systemctl", "start", "--no-block", "--", unit], COMMAND_TIMEOUT)[0]
    elif decision["action"] == "restart":
        if decision.get("kill_first"):
            decision["stacks"] = keep_stacks(settings, plan, now)
            decision["killed"] = run_command(["docker", "kill", "--signal", "KILL", plan["container"]], COMMAND_TIMEOUT)[0]
        decision["result"] = run_command(["systemctl", "restart", "--no-block", "--", unit], COMMAND_TIMEOUT)[0]
    elif decision["action"] == "restart_cluster":
        if decision["verdict"] in ("wedged", "unanswered"):
            decision["stacks"] = keep_stacks(settings, plan, now)
        decision.update(coordinate(plan, settings) if not is_worker(plan) else ask_head(plan, settings))
    elif decision["action"] == "give_up":
        # The give-up file first: a bundle can take minutes, and the unit must stay given up whatever happens to it.
        record = {"unit": unit, "since": round(now, 1), "why": decision["why"], "evidence": memory["evidence"],
                  "restarts": memory["restarts"], "bundle": "being collected",
                  "clear": f"/usr/bin/python3 {os.path.abspath(__file__)} clear {unit}"}
        path = person_needed_path(state_dir, unit)
        write_json(path, record, 0o644)
        record["bundle"] = decision["bundle"] = collect_bundle(settings, state_dir, unit, now)
        if os.path.exists(path):
            write_json(path, record, 0o644)


def coordinate(plan, settings):
    """Every rank restarted once, the cluster drained at its gateways first: the head's own decision and a worker's request
    share one lock, and a restart finished moments ago is not repeated. {ranks: the steps, gateway: the drains}."""
    os.makedirs(settings["state_dir"], mode=0o700, exist_ok=True)
    stamp = os.path.join(settings["state_dir"], f"{plan['unit']}.restarted.json")
    with open(os.path.join(settings["state_dir"], f"{plan['unit']}.restart.lock"), "a", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return {"ranks": [{"step": "restart", "skipped": "a restart of every rank is under way"}], "gateway": []}
        last = read_json(stamp, {}).get("time")
        if recently_restarted(last, time.time(), settings):
            return {"ranks": [{"step": "restart", "skipped": f"every rank was restarted {time.time() - last:.0f} s ago"}], "gateway": []}
        drains = drain(plan, settings)
        steps = restart_cluster(plan, settings["peer_dir"])
        write_json(stamp, {"time": round(time.time(), 1)})
        return {"ranks": steps, "gateway": drains}


def ask_head(plan, settings):
    """A worker's failure: the head drains the cluster and restarts every rank (its reply lists what it did)."""
    every_rank = len(plan["cluster"]["nodes"]) * (STOP_TIMEOUT + START_TIMEOUT + 60)
    rc, out = peer_call(head_address(plan), f"restart {plan['unit']}", settings["peer_dir"], every_rank + GATEWAY_RESTART_TIMEOUT + 60)
    try:
        reply = json.loads(out)
        return {"ranks": reply["ranks"], "gateway": reply.get("gateway") or []}
    except (ValueError, KeyError, TypeError):
        return {"ranks": [{"rank": 0, "address": head_address(plan), "step": "restart", "result": rc}], "gateway": []}


def restart_cluster(plan, peer_dir):
    """Every rank stopped, then started in the cluster's waves (the cluster role's order), this node's through systemctl
    and the others' through their watchdog's peer command, each start done once its door passed. This node's flag keeps
    its own watchdog quiet meanwhile; each peer raises its own."""
    own, flag = plan["cluster"]["host_ip"], plan.get("maintenance_flag")

    def step(verb, node):
        if node["address"] == own:
            return rank_step(verb, plan)
        timeout = STOP_TIMEOUT + 30 if verb == "stop" else START_TIMEOUT + 30
        rc, out = peer_call(node["address"], f"{verb} {plan['unit']}", peer_dir, timeout)
        if rc is None:
            return rc, f"{node['address']} did not answer within {timeout} s"
        try:
            reply = json.loads(out) if rc else {}
        except ValueError:
            reply = {}
        return rc, str(reply.get("why", ""))[:300] if isinstance(reply, dict) else ""

    raise_flag(flag, plan["unit"])
    try:
        steps = cluster_restart(plan["cluster"]["nodes"], plan["cluster"]["backend"], step)
    finally:
        lower_flag(flag, plan["unit"])
    # A rank left stopped after a wave that did not start: its node's watchdog is quiet only while its flag stands.
    started = {entry["rank"] for entry in steps if entry.get("step") == "start" and "rank" in entry}
    for node in plan["cluster"]["nodes"]:
        if node["rank"] not in started and node["address"] != own:
            steps.append({"rank": node["rank"], "address": node["address"], "step": "release",
                          "result": peer_call(node["address"], f"release {plan['unit']}", peer_dir, COMMAND_TIMEOUT)[0]})
    return steps


def rank_step(verb, plan):
    """(0 when done, why not): the rank's unit stopped, or started and its door passed (the host runtime's await_door)."""
    unit = plan["unit"]
    if verb == "stop":
        return run_command(["systemctl", "stop", "--", unit], STOP_TIMEOUT)[0], ""
    with contextlib.suppress(OSError):
        clear_refusal(plan["container"])
    run_command(["systemctl", "reset-failed", "--", unit], COMMAND_TIMEOUT)
    asked = time.time()
    rc, out, err = run_command(["systemctl", "start", "--no-block", "--", unit], COMMAND_TIMEOUT)
    if rc != 0:
        return rc, f"systemctl start {unit} exited {rc}: {(err.strip() or out.strip())[:300]}"
    try:
        await_door(plan, read_host, asked)
    except DoorNotPassed as error:
        return 1, str(error)
    return 0, ""


def read_host(argv):
    """systemctl and docker as the host runtime's readers ask them, within the daemon's bound on a command."""
    return run_command(argv, COMMAND_TIMEOUT)


def peer_call(address, command, peer_dir, timeout=STOP_TIMEOUT + 30):
    """The other host's watchdog runs the command (this host's key allows nothing else there); only its host key is trusted."""
    argv = ["ssh", "-i", os.path.join(peer_dir, PEER_KEY), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={os.path.join(peer_dir, KNOWN_HOSTS)}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10", "-l", "root",
            "--", address, command]
    rc, out, _err = run_command(argv, timeout)
    return rc, out


def route_here(settings, verb, name):
    """A drain or undrain of one backend unit at this host's gateway (its own watchdog's, or a backend's over SSH), as
    that backend's watchdog (owner watchdog@HOST): the routing rewritten and LiteLLM restarted, which reads it at start
    only, within the backend's route budget. Under the routing's lock, which the gateway_route module takes too:
    backends and playbooks may ask at once, and none loses another's update."""
    folder = settings.get("gateway_config_dir")
    if not folder:
        return {"result": "no_gateway", "why": "this host runs no gateway"}
    if any(isinstance(settings.get(key), bool) or not isinstance(settings.get(key), int) for key in ("route_budget", "route_budget_window")):
        return {"result": "error", "why": "the watchdog's configuration has no route budget (an older release wrote it): re-apply the watchdog role"}
    paths = {key: os.path.join(folder, path) for key, path in ROUTING_FILES.items()}
    try:
        with open(os.path.join(folder, ROUTE_LOCK), "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            text = read_text(paths["plan"])
            plan, problem = read_plan(text, paths["plan"]) if text is not None else (None, f"no gateway plan at {paths['plan']}")
            record, problem = read_drained(read_text(paths["drained"]), paths["drained"]) if plan else ({}, problem)
            if problem:
                return {"result": "error", "why": problem}
            after, reply = watchdog_route(plan, record, verb, name)
            if after is None:
                return reply
            # Only a change of what LiteLLM routes costs a restart and the budget: a hold added or released on a unit
            # that stays out (its host drained, another's drain of it) changes the record, not the routing.
            rerouted = in_rotation(plan, after) != in_rotation(plan, record)
            if rerouted:
                budget_path = os.path.join(settings["state_dir"], ROUTE_BUDGET_FILE)
                spent = read_json(budget_path, {})
                spent = spent if isinstance(spent, dict) else {}
                backend = host_of(name)
                changes, refusal = route_budget(spent.get(backend), verb, name, settings, time.time())
                if refusal:
                    return refusal
                write_json(budget_path, {**spent, backend: changes})
            write_text(paths["drained"], drained_file(after), 0o600)
            if rerouted:
                write_text(paths["config"], render_config(plan, after), 0o600)
                # Queued, not waited for: the backend's call returns at once; a gateway an operator stopped stays stopped.
                reply["gateway_restart"] = run_command(["systemctl", "try-restart", "--no-block", "--", GATEWAY_UNIT], COMMAND_TIMEOUT)[0]
            return reply
    except (OSError, UnicodeDecodeError) as error:
        return {"result": "error", "why": f"{folder}: {error}"}


def at_gateways(plan, settings, verb, only=None):
    """The unit drained or undrained at each gateway routing to the host (the role's GATEWAYS_FILE), or at ``only``."""
    name, replies = f"{settings.get('node')}/{plan.get('name')}", []
    for gateway in usable_gateways(read_json(os.path.join(settings["peer_dir"], GATEWAYS_FILE), {})):
        if only is not None and gateway["name"] not in only:
            continue
        if gateway["address"] == "local":
            reply = route_here(settings, verb, name)
        else:
            rc, out = peer_call(gateway["address"], f"{verb} {name}", settings["peer_dir"], GATEWAY_RESTART_TIMEOUT + 30)
            reply = read_reply(out) or {"result": "unreachable", "why": f"the gateway's watchdog did not answer (ssh exit {rc})"}
        replies.append({**reply, "gateway": gateway["name"], "name": name})
    return replies


def read_reply(text):
    try:
        reply = json.loads(text)
    except (TypeError, ValueError):
        return None
    return reply if isinstance(reply, dict) and isinstance(reply.get("result"), str) else None


def drain(plan, settings):
    """Before the watchdog acts on a unit: drained at every gateway routing to it, and where it was, recorded. A gateway
    that did not answer may have drained it all the same: it stays recorded, and the undrain asks it again."""
    replies = at_gateways(plan, settings, "drain")
    record_drains(settings, plan["unit"], add=[reply["gateway"] for reply in replies if reply["result"] in ("drained", "unreachable", "error")])
    return replies


def undrain(plan, settings, memory, now):
    """A unit the watchdog drained, serving again: undrained where it was drained (its own drain only: one another
    made stays); kept for the next sample where the gateway could not be reached or deferred it (its route budget
    spent), and a deferral written to the journal once, not at every sample."""
    gateways = drained_names(read_json(os.path.join(settings["state_dir"], DRAINS_FILE), {})).get(plan["unit"])
    routes = read_json(os.path.join(settings["peer_dir"], GATEWAYS_FILE), None)
    # Without a readable list of the gateways, none is known to be gone: the record waits for the role to write it again.
    if not gateways or not isinstance(routes, dict) or not isinstance(routes.get("gateways"), list):
        return
    replies = at_gateways(plan, settings, "undrain", only=gateways)
    answered = {reply["gateway"] for reply in replies if reply["result"] not in ("unreachable", "error", "deferred")}
    gone = set(gateways) - {entry["name"] for entry in usable_gateways(routes)}
    record_drains(settings, plan["unit"], remove=answered | gone)
    outcome = sorted((reply["gateway"], reply["result"]) for reply in replies)
    if answered or gone or outcome != memory.get("undrain_outcome"):
        print(journal_line({"unit": plan["unit"], "verdict": "serving", "action": "undrain", "gateway": replies,
                            "why": "the unit the watchdog drained serves again" + (f"; no longer routed by {', '.join(sorted(gone))}" if gone else "")},
                           now), flush=True)
    memory["undrain_outcome"] = outcome


def record_drains(settings, unit, add=(), remove=()):
    """The record of the watchdog's drains, shared by its loop and its peer command (a head restarting its cluster)."""
    if not add and not remove:
        return
    path = os.path.join(settings["state_dir"], DRAINS_FILE)
    os.makedirs(settings["state_dir"], mode=0o700, exist_ok=True)
    with open(path + ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        units = drained_names(read_json(path, {}))
        units[unit] = sorted((set(units.get(unit, [])) | set(add)) - set(remove))
        write_json(path, {"units": {name: gateways for name, gateways in units.items() if gateways}})


def raise_flag(flag, owner):
    """The maintenance flag of the serving transaction, raised for a restart of the cluster (its content names the unit)."""
    if flag and not os.path.exists(flag):
        os.makedirs(os.path.dirname(flag), mode=0o755, exist_ok=True)
        with open(flag, "w", encoding="utf-8") as stream:
            stream.write(owner + "\n")


def lower_flag(flag, owner):
    """Only a flag this restart raised: a relaunch of the serving transaction keeps its own."""
    try:
        with open(flag, encoding="utf-8") as stream:
            mine = stream.read().strip() == owner
        if mine:
            os.unlink(flag)
    except (OSError, TypeError):
        pass


def peer(arguments):
    """Another host's request over SSH, as the key's forced command lets it ask: a cluster peer's step on this node's rank,
    a backend's drain or undrain of its own unit at this host's gateway."""
    settings = read_json(arguments.config, None)
    if not isinstance(settings, dict) or not isinstance(settings.get("plan_dirs"), list):
        print(f"{arguments.config}: no watchdog configuration", file=sys.stderr)
        return 2
    settings.setdefault("peer_dir", PEER_DIR)
    settings.setdefault("state_dir", STATE_DIR)
    plans, _skipped, _refused = watched_plans(settings["plan_dirs"], settings["peer_dir"])
    may = [what for what in ("cluster", "backend") if getattr(arguments, what)]
    try:
        verb, target = peer_request(os.environ.get("SSH_ORIGINAL_COMMAND"), plans, arguments.requester, may)
    except WatchdogError as error:
        print(str(error), file=sys.stderr)
        return 2
    if verb in ("drain", "undrain"):
        reply = route_here(settings, verb, target)
        print(json.dumps(reply, sort_keys=True), flush=True)
        return 0 if reply["result"] != "error" else 1
    plan = target
    if verb == "restart":
        done = coordinate(plan, settings)
        print(json.dumps(done, sort_keys=True), flush=True)
        return 0 if all(step.get("result", 0) == 0 for step in done["ranks"]) else 1
    flag = plan.get("maintenance_flag")
    if verb == "release":
        lower_flag(flag, plan["unit"])
        print(json.dumps({"unit": plan["unit"], "step": verb, "result": 0}, sort_keys=True), flush=True)
        return 0
    stacks = None
    if verb == "stop":
        raise_flag(flag, plan["unit"])
        # Only a cluster restart stops a rank through its peer: this rank's stacks, before it goes.
        stacks = keep_stacks(settings, plan, time.time())
    rc, why = rank_step(verb, plan)
    if verb == "start":
        lower_flag(flag, plan["unit"])
    print(json.dumps({"unit": plan["unit"], "step": verb, "result": rc, **({"why": why} if why else {}), **({"stacks": stacks} if stacks else {})},
                     sort_keys=True), flush=True)
    return 0 if rc == 0 else 1


def ranks(arguments):
    settings = read_json(arguments.config, None)
    if not isinstance(settings, dict) or not isinstance(settings.get("plan_dirs"), list):
        print(f"{arguments.config}: no watchdog configuration", file=sys.stderr)
        return 2
    # Every deployed rank, whether or not its peers are reachable yet: this is what makes them reachable.
    plans, skipped, _refused = watched_plans(settings["plan_dirs"], settings.get("peer_dir", PEER_DIR))
    folder = settings.get("gateway_config_dir")
    gateway = routed_backends(read_json(os.path.join(folder, ROUTING_FILES["plan"]), None)) if folder else None
    print(json.dumps({"ranks": deployed_ranks(plans + skipped), "gateway": gateway}, sort_keys=True))
    return 0


def config_folders(settings):
    """Every folder of the collection, the configured gateway's too (wherever the inventory put them): the keys of their env
    files are scrubbed from what the watchdog keeps."""
    configured = [*settings["plan_dirs"], *([settings["gateway_config_dir"]] if settings.get("gateway_config_dir") else [])]
    return list(dict.fromkeys([*CONFIG_DIRS, *configured]))


def collect_bundle(settings, state_dir, unit, now):
    """The diagnostics bundle of the host at the give-up (the same as playbooks/diagnose.yml's); the oldest beyond
    BUNDLES_KEPT go."""
    folder = os.path.join(state_dir, "bundles")
    try:
        path = collect_host_bundle(os.path.join(folder, f"{unit}-{int(now)}.tar.gz"), config_folders(settings), settings["bundle_time_limit"],
                                   stacks_dir=os.path.join(state_dir, STACKS_FOLDER))["path"]
        prune_oldest(folder, "", ".tar.gz", BUNDLES_KEPT)
    except Exception as error:  # noqa: BLE001 - a failed bundle must not stop the watchdog
        return f"no bundle: {error}"
    return path


def keep_stacks(settings, plan, now):
    """The wedged engine's Python stacks, read before anything kills or restarts it, into a file every later bundle takes."""
    try:
        return save_engine_stacks(plan["container"], plan["unit"], config_folders(settings), now, os.path.join(settings["state_dir"], STACKS_FOLDER))
    except Exception as error:  # noqa: BLE001 - a stack not read must not keep a wedged engine from its restart
        return f"no stacks: {error}"


def sample(settings, state, now):
    plans, skipped, _refused = watched_plans(settings["plan_dirs"], settings["peer_dir"])
    # The start line named the ranks not watched for want of SSH access: say when that changes (the watchdog role set up the
    # peers' keys since), so the journal never leaves a stale "not watched".
    unwatched = sorted(plan["unit"] for plan in skipped)
    before = state.get("unwatched_ranks", unwatched)
    if unwatched != before:
        # A rank gone from the plans since is neither: only those now watched, and those newly not watched, are news.
        now_watched = sorted((set(before) - set(unwatched)) & {plan["unit"] for plan in plans})
        now_unwatched = sorted(set(unwatched) - set(before))
        why = "; ".join(([f"now watching the cluster ranks {', '.join(now_watched)} (SSH access to their peers is set up)"] if now_watched else [])
                        + ([f"not watched: the cluster ranks {', '.join(now_unwatched)} (no SSH access to their peers)"] if now_unwatched else []))
        if why:
            print(json.dumps({"sparkfleet_watchdog": 1, "time": round(now, 1), "verdict": "watching", "action": "none", "why": why},
                             sort_keys=True), flush=True)
    state["unwatched_ranks"] = unwatched
    memories = state.setdefault("units", {})
    for plan in plans:
        try:
            watch(plan, settings, memories, now)
        except Exception as error:  # noqa: BLE001 - one unit's surprise must not blind the watchdog to the others
            print(json.dumps({"sparkfleet_watchdog": 1, "time": round(now, 1), "unit": plan["unit"], "verdict": "error", "action": "none",
                              "why": f"{type(error).__name__}: {error}"}, sort_keys=True), flush=True)
    for unit in set(memories) - {plan["unit"] for plan in plans}:
        del memories[unit]
    write_json(os.path.join(settings["state_dir"], "state.json"), state)


def watch(plan, settings, memories, now):
    """One sample of one unit: read it, judge it, act, write the decision when it says something new."""
    memory = {**new_memory(), **memories.get(plan["unit"], {})}
    container = container_status(plan["container"])
    active, sub, pending = unit_state(plan["unit"])
    # A worker rank serves no API: its container and unit are all there is to read.
    metrics = read_metrics(plan, min(10, settings["probe_timeout"])) if container not in DOWN_STATES and not is_worker(plan) else None
    seen = {
        "person_needed": os.path.exists(person_needed_path(settings["state_dir"], plan["unit"])),
        "flag_age": flag_age(plan, now), "container": container, "active_state": active, "sub_state": sub, "job_pending": pending,
        "metrics": metrics, "probe": None,
    }
    if container == "running" and not seen["person_needed"] and not is_worker(plan) and needs_probe(memory, metrics):
        seen["probe"] = probe(plan, settings, memory)
        if seen["probe"]["outcome"] == "ok" and metrics:
            seen["after_probe"] = read_metrics(plan, min(10, settings["probe_timeout"]))
        elif seen["probe"]["outcome"] in ("timeout", "error"):
            seen["hold"] = read_hold(plan, min(10, settings["probe_timeout"]))
    decision = assess(plan, memory, seen, settings, now)
    # Kept before acting: an action that raises must not leave the unit's budget and give-up unrecorded.
    memories[plan["unit"]] = memory
    if decision["action"] != "none":
        act(decision, plan, settings, settings["state_dir"], memory, now)
    if worth_a_line(decision, memory["verdict"]):
        print(journal_line(decision, now), flush=True)
    memory["verdict"] = decision["verdict"]
    memories[plan["unit"]] = memory
    if decision["verdict"] in SERVING:
        undrain(plan, settings, memory, now)


def run(arguments):
    settings = read_json(arguments.config, None)
    if not isinstance(settings, dict):
        print(f"{arguments.config}: no watchdog configuration (the watchdog role writes it)", file=sys.stderr)
        return 2
    # The role bounds each setting; here only that each is there, so a damaged file stops with a message, not a traceback loop.
    problems = [f"{name} is not a whole number" for name in SETTINGS if isinstance(settings.get(name), bool) or not isinstance(settings.get(name), int)]
    problems += [] if isinstance(settings.get("plan_dirs"), list) else ["plan_dirs is not a list"]
    if problems:
        print(f"{arguments.config}: {'; '.join(problems)}; re-apply the watchdog role", file=sys.stderr)
        return 2
    settings.setdefault("state_dir", STATE_DIR)
    settings.setdefault("peer_dir", PEER_DIR)
    state = read_json(os.path.join(settings["state_dir"], "state.json"), {})
    state = state if isinstance(state, dict) and isinstance(state.get("units", {}), dict) else {}
    plans, skipped, refused = watched_plans(settings["plan_dirs"], settings["peer_dir"])
    state["unwatched_ranks"] = sorted(plan["unit"] for plan in skipped)
    print(json.dumps({"sparkfleet_watchdog": 1, "time": round(time.time(), 1), "verdict": "started", "action": "none",
                      "why": f"watching {', '.join(p['unit'] for p in plans) or 'no unit yet'} every {settings['interval']} s "
                             f"(every {min(settings['interval'], settings['probe_timeout'])} s while one has failing samples)"
                             + (f"; not watched: the cluster ranks {', '.join(p['unit'] for p in skipped)} (no SSH access to their peers: "
                                f"the watchdog role sets it up with every node of the cluster in the play)" if skipped else "")
                             + (f"; not plans it can act on: {' | '.join(refused)}" if refused else "")},
                     sort_keys=True), flush=True)
    while True:
        started = time.monotonic()
        sample(settings, state, time.time())
        if arguments.once:
            return 0
        time.sleep(max(0.0, next_sample_in(state["units"], settings) - (time.monotonic() - started)))


def clear(arguments):
    if not PLAN_NAME.fullmatch(arguments.unit):
        print(f"{arguments.unit!r} is not a unit name the collection writes", file=sys.stderr)
        return 2
    settings = read_json(arguments.config, {}) or {}
    path = person_needed_path(settings.get("state_dir", STATE_DIR), arguments.unit)
    if not os.path.exists(path):
        print(f"{arguments.unit}: the watchdog has not given up on it")
        return 0
    os.unlink(path)
    print(f"{arguments.unit}: handed back to the watchdog (its restart budget starts afresh)")
    return 0


def status(arguments):
    settings = read_json(arguments.config, {}) or {}
    print(json.dumps(read_json(os.path.join(settings.get("state_dir", STATE_DIR), "state.json"), {}), indent=2, sort_keys=True))
    return 0


def main(argv=None):
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=CONFIG_PATH)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", parents=[common])
    run_parser.add_argument("--once", action="store_true", help="one sample of every unit, then exit")
    clear_parser = commands.add_parser("clear", parents=[common])
    clear_parser.add_argument("unit")
    commands.add_parser("status", parents=[common])
    peer_parser = commands.add_parser("peer", parents=[common])
    # Set by the key's forced command (the watchdog role), never by the requester: who asks, and what it may ask.
    peer_parser.add_argument("--from", dest="requester", required=True)
    peer_parser.add_argument("--cluster", action="store_true", help="a node of a cluster this host serves: its ranks' steps")
    peer_parser.add_argument("--backend", action="store_true", help="a backend of this host's gateway: drains of its own units")
    commands.add_parser("ranks", parents=[common])
    arguments = parser.parse_args(argv)
    return {"run": run, "clear": clear, "status": status, "peer": peer, "ranks": ranks}[arguments.command](arguments)


if __name__ == "__main__":
    sys.exit(main())
