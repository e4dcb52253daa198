# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's judgement: whether a served unit makes forward progress, and what to do when not.

Seed 000's watchdog, made to judge progress rather than liveness (vLLM's /health and /v1/models
answer 200 while a wedged engine generates nothing): a unit makes progress when its token or
iteration counters moved since the last sample, or, when they did not, when a tiny completion
comes back within the probe timeout. A unit that is down (its container exited, created, dead or
gone while systemd is not starting it) or makes no progress for ``failures`` samples in a row is
started or restarted, within a restart budget kept here (systemd's own counters are per unit
and flushed by ``reset-failed``); past the budget the watchdog gives up on the unit, writes a
"person needed" file and stays quiet until the file is removed (an operator's ``clear`` or the
serving transaction's next planned relaunch). A fresh maintenance flag (the transaction's)
silences it; a sleeping engine is left alone; after its own start it waits the unit's cold or
warm grace (warm once the unit served with the same config hash).

This file is installed on each host beside the watchdog's daemon (roles/watchdog) and imported
there without the collection: the standard library only. Nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import typing as t

SERVICE = "sparkfleet-watchdog.service"
INSTALL_DIR = "/opt/sparkfleet/watchdog"
DAEMON_FILE = "sparkfleet_watchdog.py"
CONFIG_PATH = "/etc/sparkfleet/watchdog.json"
STATE_DIR = "/var/lib/sparkfleet/watchdog"
# The files the daemon runs and imports, and their sources in the collection.
HELPERS = ((DAEMON_FILE, f"roles/watchdog/files/{DAEMON_FILE}"), ("_watchdog.py", "plugins/module_utils/_watchdog.py"),
           ("_diagnose.py", "plugins/module_utils/_diagnose.py"))
DOWN_STATES = frozenset({"exited", "created", "dead", "missing"})
# Counters that move with every engine step: prefill and decode tokens and the steps themselves.
PROGRESS_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:iteration_tokens_total_count")
SLEEP_GAUGE = "vllm:engine_sleep_state"
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", SLEEP_GAUGE)
FAILING = ("down", "wedged", "unanswered")
# An idle engine alternates between them (a probe moves the counters the next sample reads): one state for the journal.
SERVING = ("progress", "answers")
# A unit and a container name as the collection writes them: they reach systemctl, docker and file names.
PLAN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,250}")
ACTIONS = ("start", "restart", "restart_cluster", "give_up")
# A cluster's ranks are restarted together from whichever node detects the failure, over SSH between its nodes: each
# node's key may only run the daemon's peer command (stop or start a rank of a cluster on that node) from its peers.
PEER_DIR = "/etc/sparkfleet/watchdog"
PEER_KEY = "peer_ed25519"
KNOWN_HOSTS = "known_hosts"
PEER_COMMAND = f"/usr/bin/python3 {INSTALL_DIR}/{DAEMON_FILE} peer"
KEY_COMMENT = "sparkfleet-watchdog@"
ED25519_KEY = re.compile(r"ssh-ed25519 [A-Za-z0-9+/]{40,}={0,2}")
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,250}")

# Each setting: (least, most, unit and why). The role passes them as watchdog_<name>.
SETTINGS: dict[str, tuple[int, int, str]] = {
    "interval": (5, 3600, "seconds between samples"),
    "failures": (2, 20, "failing samples in a row before acting; one sample never decides (a gauge refreshes only when the engine steps)"),
    "probe_timeout": (10, 300, "seconds a probe completion may take; probes of 1 s mark a saturated engine dead"),
    "probe_tokens": (1, 5, "tokens the probe asks for; it proves the engine steps, it is no benchmark"),
    "budget": (1, 20, "restarts in the budget window; on GB10 about 35 restart loops leaked unified memory until a power cycle"),
    "budget_window": (600, 604_800, "seconds the budget counts back"),
    "warm_grace": (30, 14_400, "seconds after a start whose caches are warm before the unit is judged"),
    "maintenance_max_age": (60, 86_400, "seconds a maintenance flag silences the watchdog; an older flag was left behind"),
    "bundle_time_limit": (5, 600, "seconds each command of the give-up bundle may take"),
}


class WatchdogError(Exception):
    """A setting or a file the watchdog cannot work with; the message names it and the fix."""


def settings_problems(settings: t.Mapping[str, t.Any], variable_prefix: str = "watchdog_") -> list[str]:
    """Every bounded setting that is missing, no whole number, or out of its range."""
    problems = []
    for name, (least, most, why) in SETTINGS.items():
        value = settings.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            problems.append(f"{variable_prefix}{name} is {value!r}: give a whole number from {least} to {most} ({why})")
    if not problems and settings["interval"] * settings["failures"] > settings["budget_window"]:
        problems.append(f"{variable_prefix}interval x {variable_prefix}failures ({settings['interval'] * settings['failures']} s) "
                        f"exceeds {variable_prefix}budget_window ({settings['budget_window']} s): the budget would forget "
                        "every restart before the next one could be decided")
    return problems


def plan_problems(plan: t.Any) -> list[str]:
    """Why a plan file cannot be watched: its unit, container, URL and env file are what the daemon acts on."""
    if not isinstance(plan, dict):
        return ["not a plan object"]
    problems = [f"{key}: {plan.get(key)!r} is not a name the collection writes" for key in ("unit", "container")
                if not isinstance(plan.get(key), str) or not PLAN_NAME.fullmatch(plan[key])]
    if not isinstance(plan.get("url"), str) or not plan["url"].startswith("http://"):
        problems.append(f"url: {plan.get('url')!r} is not an http:// URL")
    if not isinstance(plan.get("env_path"), str) or not plan["env_path"].startswith("/"):
        problems.append(f"env_path: {plan.get('env_path')!r} is not an absolute path")
    cluster = plan.get("cluster")
    if cluster is not None:
        nodes = cluster.get("nodes") if isinstance(cluster, dict) else None
        if not isinstance(nodes, list) or not nodes or not all(node_usable(node) for node in nodes) or not address(cluster.get("host_ip")):
            problems.append("cluster: no nodes with their rank and address (a plan of an older release: re-apply the cluster role)")
    return problems


def address(text: t.Any) -> str | None:
    try:
        return str(ipaddress.ip_address(text)) if isinstance(text, str) else None
    except ValueError:
        return None


def node_usable(node: t.Any) -> bool:
    return (isinstance(node, dict) and isinstance(node.get("rank"), int) and not isinstance(node["rank"], bool)
            and address(node.get("address")) is not None)


def is_worker(plan: t.Mapping[str, t.Any]) -> bool:
    """A cluster's rank other than the head: it serves no API, so only its container and unit are read."""
    return isinstance(plan.get("cluster"), dict) and not plan["cluster"].get("head")


def cluster_order(plan: t.Mapping[str, t.Any]) -> tuple[list[dict[str, t.Any]], list[dict[str, t.Any]]]:
    """(stop order, start order) of every rank of the plan's cluster: all stopped, then started as the cluster role
    starts them (native: the workers, then the head they wait for; Ray: the head, which the workers join)."""
    nodes = sorted(plan["cluster"]["nodes"], key=lambda node: node["rank"])
    head, workers = [node for node in nodes if node["rank"] == 0], [node for node in nodes if node["rank"] > 0]
    return nodes, (workers + head if plan["cluster"].get("backend") == "native" else head + workers)


def peer_request(text: t.Any, plans: t.Sequence[t.Mapping[str, t.Any]]) -> tuple[str, t.Mapping[str, t.Any]]:
    """The verb and the plan of a peer's request (SSH's original command: ``stop UNIT`` or ``start UNIT`` from the head
    restarting the cluster, ``restart UNIT`` from a worker asking the head to), for a cluster rank planned on this host
    only, and ``restart`` on the head only; WatchdogError otherwise."""
    words = text.split() if isinstance(text, str) else []
    if len(words) != 2 or words[0] not in ("stop", "start", "restart"):
        raise WatchdogError(f"refused {str(text)[:100]!r}: a peer may ask only 'stop UNIT', 'start UNIT' or 'restart UNIT'")
    found = [plan for plan in plans if plan["unit"] == words[1] and isinstance(plan.get("cluster"), dict)]
    if not found:
        raise WatchdogError(f"refused {words[0]} {words[1][:100]!r}: no cluster rank of that unit is planned on this host")
    if words[0] == "restart" and is_worker(found[0]):
        raise WatchdogError(f"refused restart {words[1]!r}: only the cluster's head restarts every rank")
    return words[0], found[0]


def head_address(plan: t.Mapping[str, t.Any]) -> str:
    return next(node["address"] for node in plan["cluster"]["nodes"] if node["rank"] == 0)


def recently_restarted(last: t.Any, now: float, settings: t.Mapping[str, t.Any]) -> bool:
    """A restart of every rank within the time a failure takes to be decided again is the same failure's: a worker's
    request arriving just after the head's own restart (or the other way round) does not restart the cluster twice."""
    return isinstance(last, (int, float)) and now - last < settings["interval"] * (settings["failures"] + 2) + 30


def peer_access(host: str, reports: t.Any) -> dict[str, t.Any]:
    """What a node trusts of the other nodes of its clusters: {errors} or {errors: [], authorized_keys: [{peer, line}],
    known_hosts, peers}. ``reports``: per host of the play, the cluster ranks deployed there (the daemon's ``ranks``:
    unit, host_ip, nodes), its watchdog's public key and its sshd's ed25519 host key. A peer is the host whose own
    rank of the same unit sits at the node's address: the deployed ranks, as the daemon reads them, decide."""
    if not isinstance(reports, dict) or not isinstance(reports.get(host), dict):
        return {"errors": [f"{host}: no report of its cluster ranks (the watchdog role reads every node's)"]}
    errors, found = [], {}
    for rank in reports[host].get("ranks") or []:
        for node in rank["nodes"]:
            if node["address"] == rank["host_ip"]:
                continue
            peers = [name for name, report in reports.items() if isinstance(report, dict) and any(
                other["unit"] == rank["unit"] and other["host_ip"] == node["address"] for other in report.get("ranks") or [])]
            if len(peers) != 1:
                errors.append(f"cluster rank {rank['unit']} on {host}: no host of the play runs its rank {node['rank']} at "
                              f"{node['address']}; keep every node of the cluster in the play (and re-apply the cluster role first)")
                continue
            report = reports[peers[0]]
            user_key, host_key = ED25519_KEY.match(report.get("user_key") or ""), ED25519_KEY.match(report.get("host_key") or "")
            if not HOST_NAME.fullmatch(peers[0]) or not user_key or not host_key:
                errors.append(f"peer {peers[0]!r} of {host}: no usable name, watchdog key or ed25519 host key")
                continue
            found[peers[0]] = (node["address"], user_key.group(0), host_key.group(0))
    if errors:
        return {"errors": errors}
    return {
        "errors": [],
        "peers": sorted(found),
        "authorized_keys": [{"peer": name, "line": f'restrict,from="{where}",command="{PEER_COMMAND}" {user_key} {KEY_COMMENT}{name}'}
                            for name, (where, user_key, _host_key) in sorted(found.items())],
        "known_hosts": "".join(f"{where} {host_key}\n" for where, _user_key, host_key in sorted(found.values())),
    }


def deployed_ranks(plans: t.Sequence[t.Mapping[str, t.Any]]) -> list[dict[str, t.Any]]:
    """The cluster ranks among a host's plans, as the role's peer exchange reads them (the daemon's ``ranks``)."""
    return [{"unit": plan["unit"], "host_ip": plan["cluster"]["host_ip"],
             "nodes": [{"rank": node["rank"], "address": node["address"]} for node in plan["cluster"]["nodes"]]}
            for plan in plans if isinstance(plan.get("cluster"), dict)]


def acted(lines: t.Iterable[str]) -> list[dict[str, t.Any]]:
    """The decisions in the watchdog's journal lines that acted on a unit (start, restart, give_up)."""
    actions = []
    for line in lines:
        try:
            decision = json.loads(line)
        except ValueError:
            continue
        if isinstance(decision, dict) and decision.get("action") in ACTIONS:
            actions.append(decision)
    return actions


def person_needed_path(state_dir: str, unit: str) -> str:
    """Where the watchdog records that it gave up on a unit; removing it hands the unit back."""
    return f"{state_dir}/{unit}.person-needed.json"


def parse_metrics(text: str) -> dict[str, float]:
    """The progress counters and gauges of a Prometheus text page, each summed over its label sets
    (one engine per server here; the sum is what moves), and ``sleeping`` (1.0 or 0.0) from
    vllm:engine_sleep_state, whose series are labelled sleep_state: awake 1 means awake,
    weights_offloaded or discard_all 1 a sleep level. Lines that do not parse are skipped."""
    wanted = set(PROGRESS_COUNTERS) | set(GAUGES)
    values: dict[str, float] = {}
    sleep_states: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _brace, rest = line.partition("{")
        name = name.split(" ", 1)[0]
        if name not in wanted:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1]) if "}" not in line else float(line.rsplit("}", 1)[1].split()[0])
        except (IndexError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        if name == SLEEP_GAUGE:
            state = re.search(r'sleep_state="([a-z_]+)"', rest)
            if state:
                sleep_states[state[1]] = max(sleep_states.get(state[1], 0.0), value)
            continue
        values[name] = values.get(name, 0.0) + value
    if sleep_states:
        asleep = sleep_states.get("awake", 1.0) == 0 or any(sleep_states.get(level, 0.0) > 0 for level in ("weights_offloaded", "discard_all"))
        values["sleeping"] = 1.0 if asleep else 0.0
    return values


def counters_moved(before: t.Mapping[str, float] | None, now: t.Mapping[str, float]) -> bool:
    """True when any progress counter grew since the last sample (a counter that went down was reset
    by a restart: that is no progress by itself)."""
    if before is None:
        return False
    return any(now.get(name, 0.0) > before.get(name, 0.0) for name in PROGRESS_COUNTERS if name in now)


def new_memory() -> dict[str, t.Any]:
    """What the watchdog remembers of one unit between samples (kept in its state file)."""
    return {"failures": 0, "counters": None, "grace_until": 0.0, "warm_hashes": [], "restarts": [], "evidence": [],
            "verdict": None, "person_needed": False}


def needs_probe(memory: t.Mapping[str, t.Any], metrics: t.Mapping[str, float] | None) -> bool:
    """A probe completion is sent when the counters cannot show progress: unreadable, or not moved."""
    if metrics is not None and metrics.get("sleeping", 0.0) > 0:
        return False
    return metrics is None or not counters_moved(memory["counters"], metrics)


def grace_seconds(plan: t.Mapping[str, t.Any], memory: t.Mapping[str, t.Any], settings: t.Mapping[str, t.Any]) -> tuple[int, str]:
    """A start after which the unit already served with this config hash is warm (its caches hold the
    compiled kernels); any other is cold and gets the plan's own health timeout."""
    if plan.get("config_hash") and plan["config_hash"] in memory["warm_hashes"]:
        return settings["warm_grace"], "warm"
    return int(plan.get("health_timeout") or settings["warm_grace"]), "cold"


def assess(plan: t.Mapping[str, t.Any], memory: dict[str, t.Any], seen: t.Mapping[str, t.Any],
           settings: t.Mapping[str, t.Any], now: float) -> dict[str, t.Any]:
    """One sample of one unit -> the decision {verdict, action, why, ...}; ``memory`` is updated.

    ``seen``: ``person_needed`` (the give-up file exists), ``flag_age`` (seconds, or None without a
    flag), ``container`` (docker's state, ``missing``, or ``unknown`` when docker did not answer), ``active_state``/``sub_state`` (systemd's),
    ``job_pending`` (systemd has a start or stop queued), ``metrics`` (parse_metrics, or None) and
    ``probe`` (None when not sent, else {outcome: ok|timeout|error|refused, seconds, detail}).
    The action is one of none, start, restart, give_up."""
    decision: dict[str, t.Any] = {"unit": plan["unit"], "container": seen.get("container"), "action": "none"}
    if seen.get("person_needed"):
        memory["person_needed"] = True
        return {**decision, "verdict": "person_needed",
                "why": f"the watchdog gave up on this unit; `python3 {INSTALL_DIR}/{DAEMON_FILE} clear {plan['unit']}` hands it back"}
    if memory["person_needed"]:
        # Cleared by an operator or a planned relaunch: a fresh start of the budget, and time to start.
        memory.update({**new_memory(), "warm_hashes": memory["warm_hashes"]})
        seconds, kind = grace_seconds(plan, memory, settings)
        memory["grace_until"] = now + seconds
        return {**decision, "verdict": "handed_back", "why": f"the give-up was cleared; judged again after a {kind} grace of {seconds} s"}
    flag_age = seen.get("flag_age")
    if flag_age is not None and flag_age < settings["maintenance_max_age"]:
        memory.update(failures=0, counters=None, evidence=[])
        return {**decision, "verdict": "maintenance", "why": f"the maintenance flag is {int(flag_age)} s old: a planned relaunch"}
    stale_flag = f" (a maintenance flag {int(flag_age)} s old was ignored: older than {settings['maintenance_max_age']} s)" if flag_age is not None else ""
    if seen.get("container") == "unknown":
        return {**decision, "verdict": "inconclusive", "why": "docker did not answer about the container: nothing is judged on this sample"}
    metrics, probe = seen.get("metrics"), seen.get("probe")
    answered = (probe or {}).get("outcome") == "ok" or (metrics is not None and counters_moved(memory["counters"], metrics))
    if metrics is not None:
        memory["counters"] = {name: metrics[name] for name in PROGRESS_COUNTERS if name in metrics}
    if answered and plan.get("config_hash") and plan["config_hash"] not in memory["warm_hashes"]:
        memory["warm_hashes"] = [*memory["warm_hashes"], plan["config_hash"]][-8:]
    starting = seen.get("active_state") == "activating" or seen.get("job_pending")
    if now < memory["grace_until"]:
        # An answer while systemd still stops the old container or starts the new one is not the new start serving.
        if not answered or starting:
            return {**decision, "verdict": "grace", "why": f"started by the watchdog; judged after {int(memory['grace_until'] - now)} s more"}
        memory["grace_until"] = 0.0
    if seen.get("container") in DOWN_STATES and not starting:
        return failing(plan, memory, seen, settings, now, "down",
                       f"container {seen.get('container')}, unit {seen.get('active_state')}/{seen.get('sub_state')}" + stale_flag)
    if starting and not answered:
        memory.update(failures=0, evidence=[])
        return {**decision, "verdict": "starting", "why": f"systemd is starting the unit ({seen.get('sub_state')})"}
    if is_worker(plan):
        memory.update(failures=0, evidence=[])
        return {**decision, "verdict": "rank_runs", "why": "the worker rank's container runs; the cluster's progress is judged on its head"}
    if metrics is not None and metrics.get("sleeping", 0.0) > 0:
        memory.update(failures=0, evidence=[])
        return {**decision, "verdict": "sleeping", "why": "the engine sleeps (vllm:engine_sleep_state); a sleeping engine is not wedged"}
    if answered:
        memory.update(failures=0, evidence=[])
        verdict = "progress" if probe is None else "answers"
        return {**decision, "verdict": verdict,
                "why": "the token counters moved" if probe is None else f"a probe completion answered in {probe['seconds']} s"}
    outcome = (probe or {}).get("outcome")
    if outcome == "refused":
        return {**decision, "verdict": "inconclusive", "why": f"the probe was refused ({probe.get('detail')}): progress cannot be judged"}
    running = metrics.get("vllm:num_requests_running", 0.0) if metrics else None
    if outcome == "timeout":
        return failing(plan, memory, seen, settings, now, "wedged",
                       f"the counters did not move ({running:g} requests running by the last gauge) and a {settings['probe_tokens']}-token "
                       f"probe got no answer in {settings['probe_timeout']} s while the container runs" if metrics is not None else
                       f"/metrics did not answer and a probe got no answer in {settings['probe_timeout']} s while the container runs")
    return failing(plan, memory, seen, settings, now, "unanswered",
                   f"the container {seen.get('container')} but the server does not answer: {(probe or {}).get('detail') or 'no /metrics'}")


def failing(plan: t.Mapping[str, t.Any], memory: dict[str, t.Any], seen: t.Mapping[str, t.Any], settings: t.Mapping[str, t.Any],
            now: float, verdict: str, why: str) -> dict[str, t.Any]:
    """A failing sample: counted, and acted on at the ``failures``-th in a row within the budget."""
    memory["failures"] += 1
    sample = {"time": round(now, 1), "verdict": verdict, "why": why, "probe": seen.get("probe"), "container": seen.get("container"),
              "unit": f"{seen.get('active_state')}/{seen.get('sub_state')}"}
    memory["evidence"] = [*memory["evidence"], sample][-settings["failures"]:]
    why = f"{why}; failing sample {memory['failures']} of {settings['failures']}"
    decision = {"unit": plan["unit"], "container": seen.get("container"), "verdict": verdict, "action": "none", "why": why}
    if memory["failures"] < settings["failures"]:
        return decision
    recent = [moment for moment in memory["restarts"] if moment > now - settings["budget_window"]]
    memory["restarts"] = recent
    if len(recent) >= settings["budget"]:
        memory["person_needed"] = True
        return {**decision, "action": "give_up",
                "why": f"{why}; {len(recent)} restarts in the last {settings['budget_window']} s used the budget of {settings['budget']}: "
                       "a person is needed"}
    memory["restarts"] = [*recent, round(now, 1)]
    seconds, kind = grace_seconds(plan, memory, settings)
    memory.update(failures=0, counters=None, evidence=[], grace_until=now + seconds)
    # A unit systemd still holds active (its container gone under it) is restarted: a start would do nothing. A cluster's
    # rank never recovers alone: every rank is restarted, in the cluster's order, by the head (a worker asks it to).
    if plan.get("cluster"):
        action = "restart_cluster"
    else:
        action = "start" if verdict == "down" and seen.get("active_state") != "active" else "restart"
    return {**decision, "action": action,
            "why": f"{why}; {'every rank restarted' if plan.get('cluster') else action + 'ed'} ({len(recent) + 1} of {settings['budget']} "
                   f"in {settings['budget_window']} s), judged again after a {kind} grace of {seconds} s"}


def worth_a_line(decision: t.Mapping[str, t.Any], previous: str | None) -> bool:
    """Every action and failing sample, and each change of verdict but between the two serving ones."""
    verdict = decision["verdict"]
    return (decision["action"] != "none" or verdict in FAILING
            or (verdict != previous and not (verdict in SERVING and previous in SERVING)))


def journal_line(decision: t.Mapping[str, t.Any], now: float) -> str:
    """One parseable line per decision: JSON, its keys sorted."""
    return json.dumps({"sparkfleet_watchdog": 1, "time": round(now, 1), **decision}, sort_keys=True, default=str)


def config_text(settings: t.Mapping[str, t.Any], plan_dirs: t.Sequence[str]) -> str:
    """The daemon's configuration file: the bounded settings and the folders of the plans it watches."""
    return json.dumps({**{name: settings[name] for name in SETTINGS}, "plan_dirs": list(plan_dirs), "state_dir": STATE_DIR, "peer_dir": PEER_DIR},
                      indent=2, sort_keys=True) + "\n"


def unit_text() -> str:
    """The daemon's own unit: restarted by systemd whatever ends it, after Docker, never killed first by
    earlyoom or the kernel (it is what recovers from their kills)."""
    return "\n".join([
        "# Managed by Ansible (sparkfleet.vllm.watchdog).",
        "[Unit]",
        "Description=sparkfleet.vllm watchdog: forward progress of the served units",
        "Wants=docker.service",
        "After=docker.service network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart=/usr/bin/python3 {INSTALL_DIR}/{DAEMON_FILE} run --config {CONFIG_PATH}",
        "Restart=always",
        "RestartSec=10",
        "OOMScoreAdjust=-900",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def watchdog_plan(settings: t.Mapping[str, t.Any], plan_dirs: t.Any, serving_dirs: t.Sequence[t.Any] = ()) -> dict[str, t.Any]:
    """What the role writes and removes: {errors} or {errors: [], folders, helpers, config, unit, service, removed}.
    ``serving_dirs`` are the serving roles' configuration folders where the inventory sets them: a
    watchdog looking elsewhere would watch nothing, silently."""
    errors = settings_problems(settings)
    if not isinstance(plan_dirs, list) or not plan_dirs or not all(
            isinstance(path, str) and path.startswith("/") and ".." not in path.split("/") and "\n" not in path for path in plan_dirs):
        errors.append(f"watchdog_plan_dirs is {plan_dirs!r}: give a list of absolute folders holding the plans of the units to watch "
                      "(the vllm role's vllm_config_dir, the cluster role's cluster_config_dir)")
    else:
        errors += [f"watchdog_plan_dirs {plan_dirs!r} leaves out {folder}, where the serving roles keep their plans here: add it"
                   for folder in serving_dirs if isinstance(folder, str) and folder.rstrip("/") not in [d.rstrip("/") for d in plan_dirs]]
    if errors:
        return {"errors": errors}
    unit_path = f"/etc/systemd/system/{SERVICE}"
    return {
        "errors": [],
        "folders": [{"path": INSTALL_DIR, "mode": "0755"}, {"path": STATE_DIR, "mode": "0700"}],
        "helpers": [{"path": f"{INSTALL_DIR}/{name}", "mode": "0644", "source": source} for name, source in HELPERS],
        "config": {"path": CONFIG_PATH, "mode": "0644", "content": config_text(settings, plan_dirs)},
        "unit": {"path": unit_path, "mode": "0644", "content": unit_text()},
        "service": SERVICE,
        "peer_dir": PEER_DIR,
        "peer_key": f"{PEER_DIR}/{PEER_KEY}",
        "known_hosts": f"{PEER_DIR}/{KNOWN_HOSTS}",
        "key_comment": KEY_COMMENT,
        "removed": [unit_path, CONFIG_PATH, INSTALL_DIR, STATE_DIR, PEER_DIR],
    }
