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

This file is part of the host runtime (_host_runtime.RUNTIME_MODULES) the watchdog's daemon imports
on each host without Ansible: the standard library only. Nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import typing as t
import urllib.parse

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import RUNTIME_DIR
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import PLAN_NAME, address

SERVICE = "sparkfleet-watchdog.service"
DAEMON_FILE = "sparkfleet_watchdog.py"
# Beside the host runtime it imports (the judgement here, the drains, the bundle): one copy of that code per host.
DAEMON = f"{RUNTIME_DIR}/{DAEMON_FILE}"
DAEMON_SOURCE = f"roles/watchdog/files/{DAEMON_FILE}"
# Where releases before the host runtime kept the daemon with copies of its modules; removed on upgrade.
RETIRED_DIR = "/opt/sparkfleet/watchdog"
CONFIG_PATH = "/etc/sparkfleet/watchdog.json"
STATE_DIR = "/var/lib/sparkfleet/watchdog"
DOWN_STATES = frozenset({"exited", "created", "dead", "missing"})
# Counters that move with every engine step: prefill and decode tokens and the steps themselves.
PROGRESS_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:iteration_tokens_total_count")
SLEEP_GAUGE = "vllm:engine_sleep_state"
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", SLEEP_GAUGE)
FAILING = ("down", "wedged", "unanswered")
# One state for the journal: a busy engine moves its counters, an idle one answers its probe.
SERVING = ("progress", "answers")
ACTIONS = ("start", "restart", "restart_cluster", "give_up")
# A cluster's ranks are restarted together from whichever node detects the failure, and a unit behind a gateway is
# drained there before the watchdog acts on it, over SSH between the hosts: each host's key may only run the daemon's
# peer command on another, from the host's own addresses, as what it is there (--cluster: stop or start a rank of a
# cluster on that node, restart one on its head; --backend: drain or undrain its own units at the gateway).
PEER_DIR = "/etc/sparkfleet/watchdog"
PEER_KEY = "peer_ed25519"
KNOWN_HOSTS = "known_hosts"
# The gateways routing to the host's units and where its watchdog reaches each ("local": the host's own).
GATEWAYS_FILE = "gateways.json"
# The gateways where the watchdog drained a unit, to undrain it there once it serves again.
DRAINS_FILE = "gateway-drains.json"
# On a gateway's host: per backend, when its watchdog last changed the routing (route_budget).
ROUTE_BUDGET_FILE = "route-budget.json"
PEER_COMMAND = f"/usr/bin/python3 -I {DAEMON} peer"
CLUSTER_VERBS = ("stop", "start", "release", "restart")
ROUTE_VERBS = ("drain", "undrain")
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
    "route_budget": (2, 100, "changes of a gateway's routing (drains and undrains) per backend's watchdog in the route budget window; each "
                             "restarts LiteLLM, which takes every model group away meanwhile"),
    "route_budget_window": (60, 86_400, "seconds the route budget counts back"),
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


def is_worker(plan: t.Mapping[str, t.Any]) -> bool:
    """A cluster's rank other than the head: it serves no API, so only its container and unit are read."""
    return isinstance(plan.get("cluster"), dict) and not plan["cluster"].get("head")


def peer_request(text: t.Any, plans: t.Sequence[t.Mapping[str, t.Any]], requester: str = "", may: t.Collection[str] = ("cluster",)
                 ) -> tuple[str, t.Any]:
    """The verb and its object of a peer's request (SSH's original command), as the key's forced command lets the
    requester ask (``may``): ``cluster``: ``stop UNIT``, ``start UNIT`` or ``release UNIT`` (lower the flag of a rank the
    head left stopped) from the head restarting the cluster,
    ``restart UNIT`` from a worker asking the head to, for a cluster rank planned on this host (the object: its plan);
    ``backend``: ``drain NAME`` or ``undrain NAME`` at this host's gateway, of the requester's own units only
    (``requester/instance``, the object: that name). WatchdogError otherwise."""
    words = text.split() if isinstance(text, str) else []
    verbs = [*(CLUSTER_VERBS if "cluster" in may else ()), *(ROUTE_VERBS if "backend" in may else ())]
    if len(words) != 2 or words[0] not in verbs:
        allowed = ", ".join(repr(f"{verb} {'NAME' if verb in ROUTE_VERBS else 'UNIT'}") for verb in verbs)
        raise WatchdogError(f"refused {str(text)[:100]!r}: this peer may ask only {allowed}")
    if words[0] in ROUTE_VERBS:
        host, _slash, instance = words[1].partition("/")
        if host != requester or not HOST_NAME.fullmatch(host) or not PLAN_NAME.fullmatch(instance):
            raise WatchdogError(f"refused {words[0]} {words[1][:100]!r}: a backend may drain or undrain only its own units ({requester}/INSTANCE)")
        return words[0], words[1]
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


def route_budget(changes: t.Any, verb: str, name: str, settings: t.Mapping[str, t.Any], now: float) -> tuple[list[float], dict[str, t.Any] | None]:
    """A backend watchdog's change of the gateway's routing (``verb`` of ``name``), judged against its budget: the
    moments of its changes kept (this one added when allowed) and None, or the reply refusing it. Each change restarts
    LiteLLM, so a unit flapping between failing and serving would otherwise take every model group away again and
    again. An undrain over the budget is deferred: the watchdog keeps it and asks again on its next samples, so the
    unit comes back once the window frees a change; a drain over the budget is refused and the watchdog acts anyway."""
    recent = sorted(moment for moment in (changes if isinstance(changes, list) else [])
                    if isinstance(moment, (int, float)) and not isinstance(moment, bool) and moment > now - settings["route_budget_window"])
    if len(recent) < settings["route_budget"]:
        return [*recent, round(now, 1)], None
    free_in = int(recent[0] + settings["route_budget_window"] - now) + 1
    spent = (f"{host_of_unit(name)}'s watchdog changed this gateway's routing {len(recent)} times in the last {settings['route_budget_window']} s, "
             f"its budget (watchdog_route_budget {settings['route_budget']}); each change restarts LiteLLM")
    if verb == "undrain":
        return recent, {"result": "deferred", "why": f"{spent}: {name} stays out, undrained on a later sample, in about {free_in} s"}
    return recent, {"result": "refused", "why": f"{spent}: {name} is not drained, the watchdog acts on it in rotation"}


def host_of_unit(name: str) -> str:
    return name.split("/", 1)[0]


def host_addresses(facts: t.Any) -> list[dict[str, t.Any]]:
    """The host's IPv4 addresses with their prefix lengths, from Ansible's network facts, the default route's first;
    loopback left out."""
    facts = facts if isinstance(facts, dict) else {}
    entries = [facts.get("default_ipv4") or {}]
    for name in facts.get("interfaces") or []:
        interface = facts.get(str(name).replace("-", "_")) or {}
        entries += [interface.get("ipv4") or {}, *(interface.get("ipv4_secondaries") or [])]
    found: list[dict[str, t.Any]] = []
    for entry in entries:
        text, prefix = address(entry.get("address")), str(entry.get("prefix", "32"))
        if text and not ipaddress.ip_address(text).is_loopback and text not in [known["address"] for known in found]:
            found.append({"address": text, "prefix": int(prefix) if prefix.isdigit() and int(prefix) <= 32 else 32})
    return found


def routed_backends(plan: t.Any) -> dict[str, list[str]]:
    """Per backend host of a deployed gateway plan, the hosts its deployments' URLs name (where the gateway reaches it)."""
    backends: dict[str, list[str]] = {}
    deployments = plan.get("deployments") if isinstance(plan, dict) else None
    for deployment in deployments if isinstance(deployments, list) else []:
        if isinstance(deployment, dict) and isinstance(deployment.get("node"), str):
            where = urllib.parse.urlsplit(str(deployment.get("api_base") or "")).hostname or ""
            known = backends.setdefault(deployment["node"], [])
            if where not in known:
                known.append(where)
    return backends


def gateway_address(gateway: t.Sequence[t.Mapping[str, t.Any]], backend_hosts: t.Sequence[str]) -> str | None:
    """Where a backend reaches its gateway: the gateway's address on the network where the gateway reaches the backend,
    else the gateway's first address (its default route's)."""
    for host in backend_hosts:
        if address(host):
            for entry in gateway:
                if ipaddress.ip_address(host) in ipaddress.ip_network(f"{entry['address']}/{entry['prefix']}", strict=False):
                    return entry["address"]
    return gateway[0]["address"] if gateway else None


def kept_gateways(host: str, previous: t.Any, play_hosts: t.Collection[str], inventory: t.Collection[str]) -> list[dict[str, str]]:
    """The gateways of the host's last record that this play cannot judge: another host, still in the inventory but not
    in the play (site.yml --limit). They stay as they were, so a partial play never empties the record and strands a
    drain the watchdog made there; a gateway gone from the inventory is dropped. ``previous``: {record: the text of
    GATEWAYS_FILE, known_hosts: the text of KNOWN_HOSTS}, either "" when missing; a record that is no JSON keeps nothing."""
    text = previous.get("record") if isinstance(previous, dict) else None
    try:
        record = json.loads(text) if isinstance(text, str) and text.strip() else {}
    except ValueError:
        record = {}
    return [entry for entry in usable_gateways(record) if entry["name"] != host and entry["name"] not in play_hosts and entry["name"] in inventory]


def peer_access(host: str, reports: t.Any, previous: t.Any = None, inventory: t.Collection[str] = ()) -> dict[str, t.Any]:
    """What a host trusts of the others: {errors} or {errors: [], authorized_keys: [{peer, key_id, line}], key_ids,
    known_hosts, peers, gateways}. ``reports``: per host of the play, the cluster ranks deployed there (the daemon's ``ranks``: unit,
    host_ip, nodes), the backends of the gateway deployed there (``gateway``: routed_backends, or None), its
    addresses (host_addresses), its watchdog's public key and its sshd's ed25519 host key. A cluster peer is the host
    whose own rank of the same unit sits at the node's address; a backend is a host the deployed gateway plan routes
    to: the deployed plans, as the daemon reads them, decide. ``gateways``: where this host's watchdog drains its units.
    A peer that is both gets one key line per set of roles its addresses carry, each with its own from= and forced
    command: its cluster steps are accepted only from the cluster's link, its drains from each of its addresses.
    ``previous`` (kept_gateways') and ``inventory``, every inventory host: the gateways outside the play keep their entries
    and host keys as they were."""
    if not isinstance(reports, dict) or not isinstance(reports.get(host), dict):
        return {"errors": [f"{host}: no report of its cluster ranks (the watchdog role reads every node's)"]}
    own = reports[host]
    errors: list[str] = []
    # Per other host: what it may ask here (may), from which of its addresses (sources), where this host dials it (dials).
    links: dict[str, dict[str, set[str]]] = {}

    def link(name: str) -> dict[str, set[str]]:
        return links.setdefault(name, {"may": set(), "cluster": set(), "backend": set(), "dials": set()})

    for rank in own.get("ranks") or []:
        for node in rank["nodes"]:
            if node["address"] == rank["host_ip"]:
                continue
            peers = [name for name, report in reports.items() if isinstance(report, dict) and any(
                other["unit"] == rank["unit"] and other["host_ip"] == node["address"] for other in report.get("ranks") or [])]
            if len(peers) != 1:
                errors.append(f"cluster rank {rank['unit']} on {host}: no host of the play runs its rank {node['rank']} at "
                              f"{node['address']}; keep every node of the cluster in the play (and re-apply the cluster role first)")
                continue
            entry = link(peers[0])
            entry["may"].add("cluster")
            entry["cluster"].add(node["address"])
            entry["dials"].add(node["address"])
    for backend in (own.get("gateway") or {}):
        if backend == host:
            continue
        if not isinstance(reports.get(backend), dict):
            errors.append(f"the gateway on {host} routes to {backend}, which is not in the play: keep the gateway and its backends in "
                          "the play (as site.yml runs them), so each backend's watchdog may drain its own units there")
            continue
        entry = link(backend)
        entry["may"].add("backend")
        entry["backend"].update(found["address"] for found in reports[backend].get("addresses") or [])
    gateways = []
    for name, report in sorted(reports.items()):
        routed = (report.get("gateway") or {}).get(host) if isinstance(report, dict) else None
        if routed is None:
            continue
        if name == host:
            gateways.append({"name": name, "address": "local"})
            continue
        where = gateway_address(report.get("addresses") or [], routed)
        if where is None:
            errors.append(f"the gateway on {name} routes to {host} and has no IPv4 address in its facts for {host}'s watchdog to reach")
            continue
        link(name)["dials"].add(where)
        gateways.append({"name": name, "address": where})
    lines, known_hosts = [], []
    for name, entry in sorted(links.items()):
        report = reports[name]
        user_key, host_key = ED25519_KEY.match(report.get("user_key") or ""), ED25519_KEY.match(report.get("host_key") or "")
        if not HOST_NAME.fullmatch(name) or not user_key or not host_key or any(not entry[role] for role in entry["may"]):
            errors.append(f"peer {name!r} of {host}: no usable name, watchdog key, ed25519 host key or address")
            continue
        lines += key_lines(name, entry, user_key.group(0))
        known_hosts += [f"{where} {host_key.group(0)}\n" for where in sorted(entry["dials"])]
    kept = kept_gateways(host, previous, reports, inventory)
    kept_addresses = {entry["address"] for entry in kept}
    previous_hosts = previous.get("known_hosts") if isinstance(previous, dict) and isinstance(previous.get("known_hosts"), str) else ""
    known_hosts += [f"{line}\n" for line in previous_hosts.splitlines()
                    if line.split(" ", 1)[0] in kept_addresses and ED25519_KEY.fullmatch(line.split(" ", 1)[-1])]
    if errors:
        return {"errors": errors}
    return {"errors": [], "peers": sorted({line["peer"] for line in lines}), "key_ids": [line["key_id"] for line in lines], "authorized_keys": lines,
            "known_hosts": "".join(sorted(set(known_hosts))), "gateways": sorted(gateways + kept, key=lambda entry: entry["name"])}


def key_lines(name: str, entry: t.Mapping[str, t.Collection[str]], user_key: str) -> list[dict[str, str]]:
    """The authorized_keys lines of one peer's key: one per set of roles its addresses carry (cluster: the addresses of
    its ranks on the cluster's link; backend: every address of a backend of the host's gateway), so no address gets
    more than its roles. Each line's comment names the peer and its roles, which the role's lineinfile matches."""
    roles_at: dict[str, list[str]] = {}
    for address_text in sorted({*entry["cluster"], *entry["backend"]}):
        roles_at[address_text] = [role for role in ("backend", "cluster") if address_text in entry[role]]
    lines = []
    for roles in sorted({tuple(roles) for roles in roles_at.values()}):
        sources = ",".join(where for where, found in roles_at.items() if tuple(found) == roles)
        key_id = f"{name}:{'+'.join(roles)}"
        flags = "".join(f" --{role}" for role in roles)
        lines.append({"peer": name, "key_id": key_id,
                      "line": f'restrict,from="{sources}",command="{PEER_COMMAND} --from {name}{flags}" {user_key} {KEY_COMMENT}{key_id}'})
    return lines


def has_peers(host: str, deployed: t.Any) -> bool:
    """Whether the host calls another's watchdog or is called by one, from what each host of the play has deployed (the
    daemon's ``ranks``): a cluster rank, a gateway routing to another host, or another host's gateway routing to it."""
    deployed = deployed if isinstance(deployed, dict) else {}
    own = deployed.get(host) if isinstance(deployed.get(host), dict) else {}
    return bool(own.get("ranks")) or any(name != host for name in own.get("gateway") or {}) or any(
        isinstance(report, dict) and host in (report.get("gateway") or {}) for name, report in deployed.items() if name != host)


def drained_names(value: t.Any) -> dict[str, list[str]]:
    """The watchdog's record of its drains (DRAINS_FILE): per unit, the gateways it drained it at."""
    units = value.get("units") if isinstance(value, dict) else None
    return {unit: [name for name in names if isinstance(name, str)] for unit, names in units.items()
            if isinstance(unit, str) and isinstance(names, list)} if isinstance(units, dict) else {}


def usable_gateways(value: t.Any) -> list[dict[str, str]]:
    """The entries of GATEWAYS_FILE the daemon may dial: a host name and an IP address, or local."""
    entries = value.get("gateways") if isinstance(value, dict) else None
    return [{"name": entry["name"], "address": entry["address"]} for entry in entries or []
            if isinstance(entry, dict) and isinstance(entry.get("name"), str) and HOST_NAME.fullmatch(entry["name"])
            and (entry.get("address") == "local" or address(entry.get("address")))] if isinstance(entries, list) else []


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


# What a probe asks of an engine by the task it serves: a generating model completes, a pooling one embeds. A refusal
# of the route itself (not of the key) says the engine serves the other task: vLLM registers a task's routes only when
# its model supports the task (an embedding model on the default runner serves no completions).
PROBE_KINDS = ("generate", "pooling")
WRONG_TASK_STATUSES = frozenset({400, 404, 405})


# vLLM 0.34's checkpoint cycle (GET /checkpoint/status with --enable-sleep-mode; vllm/v1/engine CheckpointState): an
# engine preparing for, held at or restoring from a checkpoint serves nothing on purpose.
CHECKPOINT_HOLDS = frozenset({"preparing", "prepared", "restoring"})
# Where an engine says it is held on purpose: the checkpoint cycle (sleep mode), and a pause (dev mode's /is_paused).
HOLD_ROUTES = ("/checkpoint/status", "/is_paused")


def engine_hold(route: str, status: int | None, text: str) -> str | None:
    """Why an engine answering ``route`` with ``status`` and ``text`` serves nothing on purpose (a checkpoint state or
    paused), or None: a route the release or the settings do not serve (404), a running engine, a failed checkpoint
    (that engine is broken) or an answer of another shape. /checkpoint/status answers 200 once prepared and 503 or 500
    otherwise, always with {state, error}."""
    if status is None or status in (401, 403, 404):
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if route == "/checkpoint/status":
        state = body.get("state")
        return f"checkpoint {state}" if state in CHECKPOINT_HOLDS else None
    if route == "/is_paused" and status == 200:
        return "paused" if body.get("is_paused") is True else None
    return None


def planned_probe_kind(serve_args: t.Any) -> str:
    """The task the plan's serve arguments name, in either spelling argparse takes: ``--runner pooling``, or any
    ``--convert`` but ``auto`` and ``none`` (vLLM 0.32's model config: a conversion forces the pooling runner);
    ``generate`` when they name neither, the task of vLLM's default runner for a generating model. A pooling engine is
    probed with an embedding: one that only classifies or scores refuses it, and is inconclusive (docs/watchdog.md)."""
    args = [str(arg) for arg in serve_args] if isinstance(serve_args, (list, tuple)) else []
    named: dict[str, str] = {}
    for index, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if flag in ("--runner", "--convert"):
            named[flag] = value if equals else (args[index + 1] if index + 1 < len(args) else "")
    if named.get("--runner") == "pooling" or named.get("--convert", "auto") not in ("auto", "none", ""):
        return "pooling"
    return "generate"


def probe_kind(plan: t.Mapping[str, t.Any], memory: t.Mapping[str, t.Any]) -> str:
    """The kind of probe to send: the one the engine last answered, else what the plan names."""
    learnt = memory.get("probe_kind")
    return learnt if learnt in PROBE_KINDS else planned_probe_kind(plan.get("serve_args"))


def probe_request(kind: str, model: str, tokens: int) -> tuple[str, dict[str, t.Any]]:
    """The route and body of a probe of that kind: the smallest request that returns only when the engine steps."""
    if kind == "pooling":
        return "/v1/embeddings", {"model": model, "input": "ping"}
    return "/v1/completions", {"model": model, "prompt": "1 2 3", "max_tokens": tokens, "temperature": 0}


def other_probe_kind(kind: str, status: int | None) -> str | None:
    """The kind to try next when a probe's route was refused as the wrong task (not a key refused: 401 or 403)."""
    if status not in WRONG_TASK_STATUSES:
        return None
    return PROBE_KINDS[1 - PROBE_KINDS.index(kind)] if kind in PROBE_KINDS else None


def counters_moved(before: t.Mapping[str, float] | None, now: t.Mapping[str, float]) -> bool:
    """True when any progress counter grew since the last sample (a counter that went down was reset
    by a restart: that is no progress by itself)."""
    if before is None:
        return False
    return any(now.get(name, 0.0) > before.get(name, 0.0) for name in PROGRESS_COUNTERS if name in now)


def new_memory() -> dict[str, t.Any]:
    """What the watchdog remembers of one unit between samples (kept in its state file)."""
    return {"failures": 0, "counters": None, "grace_until": 0.0, "warm_hashes": [], "restarts": [], "evidence": [],
            "verdict": None, "person_needed": False, "probe_kind": None}


def needs_probe(memory: t.Mapping[str, t.Any], metrics: t.Mapping[str, float] | None) -> bool:
    """A probe is sent when the counters cannot show progress: unreadable, without vLLM's series (an engine started with
    --disable-log-stats serves /metrics without them), or not moved."""
    if metrics and metrics.get("sleeping", 0.0) > 0:
        return False
    return not metrics or not counters_moved(memory["counters"], metrics)


def grace_seconds(plan: t.Mapping[str, t.Any], memory: t.Mapping[str, t.Any], settings: t.Mapping[str, t.Any]) -> tuple[int, str]:
    """A start is warm when its caches hold the compiled kernels: the plan's warm stamp is there (a plan of an older
    release: the unit already served with this config hash); any other is cold and gets the plan's cold timeout,
    as the gate gives a start that compiles."""
    cold_start = plan.get("cold_start") if isinstance(plan.get("cold_start"), dict) else {}
    stamp = cold_start.get("stamp")
    warm = os.path.exists(stamp) if isinstance(stamp, str) and stamp else plan.get("config_hash") in memory["warm_hashes"]
    if warm:
        return settings["warm_grace"], "warm"
    return int(cold_start.get("timeout") or plan.get("health_timeout") or settings["warm_grace"]), "cold"


def assess(plan: t.Mapping[str, t.Any], memory: dict[str, t.Any], seen: t.Mapping[str, t.Any],
           settings: t.Mapping[str, t.Any], now: float) -> dict[str, t.Any]:
    """One sample of one unit -> the decision {verdict, action, why, ...}; ``memory`` is updated.

    ``seen``: ``person_needed`` (the give-up file exists), ``flag_age`` (seconds, or None without a
    flag), ``container`` (docker's state, ``missing``, or ``unknown`` when docker did not answer), ``active_state``/``sub_state`` (systemd's),
    ``job_pending`` (systemd has a start or stop queued), ``metrics`` (parse_metrics, or None),
    ``probe`` (None when not sent, else {outcome: ok|timeout|error|refused, seconds, detail}), ``after_probe`` (the
    metrics read again after an answered probe, or None) and ``hold`` (engine_hold's answer after an unanswered probe).
    The action is one of none, start, restart, give_up."""
    decision: dict[str, t.Any] = {"unit": plan["unit"], "container": seen.get("container"), "action": "none"}
    if not seen.get("hold"):
        # A hold is timed from its first sample: any sample that does not see it ends it.
        memory.pop("held_since", None)
    if seen.get("person_needed"):
        memory["person_needed"] = True
        return {**decision, "verdict": "person_needed",
                "why": f"the watchdog gave up on this unit; `python3 {DAEMON} clear {plan['unit']}` hands it back"}
    if memory["person_needed"]:
        # Cleared by an operator or a planned relaunch: a fresh start of the budget, and time to start.
        memory.update({**new_memory(), "warm_hashes": memory["warm_hashes"]})
        seconds, kind = grace_seconds(plan, memory, settings)
        memory["grace_until"] = now + seconds
        return {**decision, "verdict": "handed_back",
                "why": f"the give-up was cleared; judged again once it serves, at the latest after a {kind} grace of {seconds} s"}
    flag_age = seen.get("flag_age")
    if flag_age is not None and flag_age < settings["maintenance_max_age"]:
        memory.update(failures=0, counters=None, evidence=[])
        return {**decision, "verdict": "maintenance", "why": f"the maintenance flag is {int(flag_age)} s old: a planned relaunch"}
    stale_flag = f" (a maintenance flag {int(flag_age)} s old was ignored: older than {settings['maintenance_max_age']} s)" if flag_age is not None else ""
    if seen.get("container") == "unknown":
        return {**decision, "verdict": "inconclusive", "why": "docker did not answer about the container: nothing is judged on this sample"}
    probe = seen.get("probe")
    # A page without vLLM's series (--disable-log-stats) shows no progress either way: the probe alone judges.
    metrics = seen.get("metrics") or None
    no_series = "/metrics did not answer" if seen.get("metrics") is None else "/metrics carries no vLLM series (--disable-log-stats)"
    answered = (probe or {}).get("outcome") == "ok" or (metrics is not None and counters_moved(memory["counters"], metrics))
    if metrics is not None:
        # The probe's own tokens are no progress of the next sample: an idle engine that froze meanwhile would pass it.
        baseline = seen.get("after_probe") or metrics
        memory["counters"] = {name: baseline[name] for name in PROGRESS_COUNTERS if name in baseline}
    if answered and plan.get("config_hash") and plan["config_hash"] not in memory["warm_hashes"]:
        memory["warm_hashes"] = [*memory["warm_hashes"], plan["config_hash"]][-8:]
    starting = seen.get("active_state") == "activating" or seen.get("job_pending")
    # A worker rank serves no API: its new start is through once its container runs under an active unit, which is all its
    # judgement reads (without this, a worker killed again soon after a restart waited out the whole grace).
    worker_runs = is_worker(plan) and seen.get("container") == "running" and seen.get("active_state") == "active"
    if now < memory["grace_until"]:
        # An answer while systemd still stops the old container or starts the new one is not the new start serving.
        if not (answered or worker_runs) or starting:
            return {**decision, "verdict": "grace",
                    "why": f"started by the watchdog; judged once it serves, at the latest in {int(memory['grace_until'] - now)} s"}
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
    hold = seen.get("hold")
    held_for = now - memory.setdefault("held_since", now) if hold else 0.0
    if hold and held_for <= settings["maintenance_max_age"]:
        memory.update(failures=0, evidence=[])
        return {**decision, "verdict": "held",
                "why": f"the engine says it is held on purpose ({hold}, {int(held_for)} s so far): a held engine is not wedged, and it "
                       f"serves again when released; judged as any other after {settings['maintenance_max_age']} s"}
    stale_hold = f" (held as {hold} for {int(held_for)} s, longer than {settings['maintenance_max_age']} s)" if hold else ""
    outcome = (probe or {}).get("outcome")
    if outcome == "refused":
        return {**decision, "verdict": "inconclusive", "why": f"the probe was refused ({probe.get('detail')}): progress cannot be judged"}
    running = metrics.get("vllm:num_requests_running", 0.0) if metrics else 0.0
    if outcome == "timeout":
        return failing(plan, memory, seen, settings, now, "wedged",
                       (f"the counters did not move ({running:g} requests running by the last gauge) and a {settings['probe_tokens']}-token "
                        f"probe got no answer in {settings['probe_timeout']} s while the container runs" if metrics is not None else
                        f"{no_series} and a probe got no answer in {settings['probe_timeout']} s while the container runs") + stale_hold)
    return failing(plan, memory, seen, settings, now, "unanswered",
                   f"the container {seen.get('container')} but the server does not answer: {(probe or {}).get('detail') or no_series}")


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
    # A wedged engine is killed, not stopped: docker stop's grace went to a frozen process (30 of the 47 s from the
    # watchdog's restart to serving, seen on the lab), and it answers no SIGTERM anyway.
    if action == "restart" and verdict in ("wedged", "unanswered"):
        decision["kill_first"] = True
    return {**decision, "action": action,
            "why": f"{why}; {'every rank restarted' if plan.get('cluster') else action + 'ed'} ({len(recent) + 1} of {settings['budget']} "
                   f"in {settings['budget_window']} s), judged again once it serves, at the latest after a {kind} grace of {seconds} s"}


def next_sample_in(memories: t.Mapping[str, t.Any], settings: t.Mapping[str, t.Any]) -> int:
    """Seconds from the start of one sample to the next: the interval, or the probe timeout while a unit has failing
    samples short of an action, so a wedge is confirmed in ``failures`` x ``probe_timeout`` rather than ``failures`` x
    ``interval`` (a frozen engine serves again sooner) while a serving fleet is sampled at the interval."""
    suspect = any(isinstance(memory, dict) and 0 < memory.get("failures", 0) < settings["failures"] for memory in memories.values())
    return min(settings["interval"], settings["probe_timeout"]) if suspect else settings["interval"]


def worth_a_line(decision: t.Mapping[str, t.Any], previous: str | None) -> bool:
    """Every action and failing sample, and each change of verdict but between the two serving ones."""
    verdict = decision["verdict"]
    return (decision["action"] != "none" or verdict in FAILING
            or (verdict != previous and not (verdict in SERVING and previous in SERVING)))


def journal_line(decision: t.Mapping[str, t.Any], now: float) -> str:
    """One parseable line per decision: JSON, its keys sorted."""
    return json.dumps({"sparkfleet_watchdog": 1, "time": round(now, 1), **decision}, sort_keys=True, default=str)


def config_text(settings: t.Mapping[str, t.Any], plan_dirs: t.Sequence[str], node: str, gateway_config_dir: str) -> str:
    """The daemon's configuration file: the bounded settings, the folders of the plans it watches, the host's name as
    gateways know it, and the host's own gateway's folder ("" without one)."""
    return json.dumps({**{name: settings[name] for name in SETTINGS}, "plan_dirs": list(plan_dirs), "state_dir": STATE_DIR, "peer_dir": PEER_DIR,
                       "node": node, "gateway_config_dir": gateway_config_dir}, indent=2, sort_keys=True) + "\n"


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
        # Isolated: nothing in the environment shadows the installed runtime.
        f"ExecStart=/usr/bin/python3 -I {DAEMON} run --config {CONFIG_PATH}",
        "Restart=always",
        "RestartSec=10",
        "OOMScoreAdjust=-900",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def one_spelling(path: str) -> str:
    """A folder as the kernel reads it (``/etc//x/`` is ``/etc/x``), to compare by; _settings.normal_path's rule, here
    because this file stands alone on the host."""
    return "/" + "/".join(part for part in path.split("/") if part)


def absolute_folder(path: t.Any) -> bool:
    return isinstance(path, str) and path.startswith("/") and ".." not in path.split("/") and "\n" not in path


def watchdog_plan(settings: t.Mapping[str, t.Any], plan_dirs: t.Any, serving_dirs: t.Sequence[t.Any], node: t.Any,
                  gateway_config_dir: t.Any) -> dict[str, t.Any]:
    """What the role writes and removes: {errors} or {errors: [], folders, daemon, config, unit, service, removed, retired}.
    ``serving_dirs`` are the serving roles' configuration folders where the inventory sets them: a
    watchdog looking elsewhere would watch nothing, silently. ``node``: the host's inventory name (the name
    gateways route to it by); ``gateway_config_dir``: the host's own gateway's folder, "" when it runs none."""
    errors = settings_problems(settings)
    if not isinstance(node, str) or not HOST_NAME.fullmatch(node):
        errors.append(f"the host's inventory name {node!r} is not a name the watchdog's peer command can carry: letters, digits, "
                      "dots, dashes and underscores")
    if gateway_config_dir and not absolute_folder(gateway_config_dir):
        errors.append(f"gateway_config_dir is {gateway_config_dir!r}: give the gateway's absolute folder")
    if not isinstance(plan_dirs, list) or not plan_dirs or not all(absolute_folder(path) for path in plan_dirs):
        errors.append(f"watchdog_plan_dirs is {plan_dirs!r}: give a list of absolute folders holding the plans of the units to watch "
                      "(the vllm role's vllm_config_dir, the cluster role's cluster_config_dir)")
    else:
        errors += [f"watchdog_plan_dirs {plan_dirs!r} leaves out {folder}, where the serving roles keep their plans here: add it"
                   for folder in serving_dirs if isinstance(folder, str) and one_spelling(folder) not in [one_spelling(d) for d in plan_dirs]]
    if errors:
        return {"errors": errors}
    unit_path = f"/etc/systemd/system/{SERVICE}"
    return {
        "errors": [],
        "folders": [{"path": STATE_DIR, "mode": "0700"}, {"path": PEER_DIR, "mode": "0700"}],
        "daemon": {"path": DAEMON, "mode": "0644", "source": DAEMON_SOURCE},
        "config": {"path": CONFIG_PATH, "mode": "0644", "content": config_text(settings, plan_dirs, node, gateway_config_dir or "")},
        "unit": {"path": unit_path, "mode": "0644", "content": unit_text()},
        "service": SERVICE,
        "peer_key": f"{PEER_DIR}/{PEER_KEY}",
        "known_hosts": f"{PEER_DIR}/{KNOWN_HOSTS}",
        "gateways": f"{PEER_DIR}/{GATEWAYS_FILE}",
        "key_comment": KEY_COMMENT,
        "removed": [unit_path, CONFIG_PATH, DAEMON, STATE_DIR, PEER_DIR, RETIRED_DIR],
        "retired": RETIRED_DIR,
    }
