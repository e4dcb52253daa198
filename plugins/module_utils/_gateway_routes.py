# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's routing on its host: which deployments are in rotation, LiteLLM's config, the drained list.

Private to the collection, and the standard library only: the gateway role's gateway_route module
imports it, and it is part of the host runtime (_host_runtime.RUNTIME_MODULES) the watchdog's daemon
imports, which drains a unit at the gateway before acting on it and undrains it once it serves again.
Nothing here does I/O. A drain that would leave a model group with nothing to route to is refused
unless forced: LiteLLM routes to every deployment of a group when all are unhealthy, so draining its
last replica stops nothing, it only turns the group's requests into errors.

Every drained name records who drained it (its owners): the operator, a playbook hook's run
(``bench@RUN``, ``sweep@RUN``, ``rollout@RUN``) or the watchdog of a backend (``watchdog@HOST``). An
undrain by a hook or a watchdog releases only its own drain, so a name stays out while anyone else
still holds it; only the operator's undrain puts a name back whoever drained it.
"""

from __future__ import annotations

import json
import re
import typing as t

UNIT = "sparkfleet-gateway.service"
MASTER_KEY_ENV = "LITELLM_MASTER_KEY"
# The gateway's routing files, relative to its config folder (gateway_config_dir).
ROUTING_FILES = {"plan": "plan.json", "drained": "drained.json", "litellm_dir": "litellm", "config": "litellm/config.yaml"}

# Taken by every writer of the routing (the gateway_route module, the watchdog's drains) from its read to its write.
ROUTE_LOCK = ".route.lock"

# What the gateway writes on its host; a file of another schema is refused, never guessed at.
SCHEMA_VERSION = 1
# The drained list's: 2 records each name's owners; a list of version 1 (or of the release before versions) was the operator's.
DRAINED_SCHEMA_VERSION = 2
OPERATOR = "operator"
WATCHDOG_OWNER = "watchdog@"
# A hook's run: its name, then what tells its runs apart. The watchdog's owners are its own (watchdog_owner).
HOOK_OWNER = re.compile(r"(?!watchdog@)[a-z][a-z0-9_-]{0,30}@[A-Za-z0-9_.:-]{1,100}")
PLAN_KEYS = ("schema_version", "deployments", "groups", "settings", "url")
# The gateway's settings its plan carries, which LiteLLM's config reads (config_document).
SETTINGS_KEYS = ("routing_strategy", "health_check_interval", "allowed_fails", "cooldown_seconds", "retries", "request_timeout", "admin_ui")
REWRITE = "re-run site.yml --tags gateway, which rewrites it from the inventory"


def is_drained(deployment: t.Mapping[str, t.Any], drained: t.Collection[str]) -> bool:
    return deployment["node"] in drained or f"{deployment['node']}/{deployment['instance']}" in drained


def in_rotation(plan: t.Mapping[str, t.Any], drained: t.Collection[str]) -> list[dict[str, t.Any]]:
    return [d for d in plan["deployments"] if not is_drained(d, drained)]


def config_document(plan: t.Mapping[str, t.Any], drained: t.Collection[str]) -> dict[str, t.Any]:
    """LiteLLM's config: every deployment not drained; health checks take a node that stops
    answering out of rotation, failures cool a deployment down and retry elsewhere."""
    settings = plan["settings"]
    return {
        "model_list": [{
            "model_name": d["group"],
            "litellm_params": {"model": d["model"], "api_base": d["api_base"], "api_key": f"os.environ/{d['key_env']}",
                               "timeout": settings["request_timeout"]},
            "model_info": {"id": d["id"]},
        } for d in in_rotation(plan, drained)],
        "router_settings": {
            "routing_strategy": settings["routing_strategy"], "num_retries": settings["retries"],
            "allowed_fails": settings["allowed_fails"], "cooldown_time": settings["cooldown_seconds"],
        },
        # The login form's hint names the UI's default credentials: user admin, the master key as password
        # (litellm/proxy/common_utils/html_forms/default_credentials_hint.py). Without the admin UI, that
        # sign-in is off too (auth/login_utils.py is_env_credential_login_enabled): /login would otherwise
        # still tell a right master key from a wrong one.
        "general_settings": {
            "master_key": f"os.environ/{MASTER_KEY_ENV}",
            "background_health_checks": True,
            "health_check_interval": settings["health_check_interval"],
            "enable_health_check_routing": True,
            "hide_default_credentials_hint": True,
            "disable_env_credential_login": not settings["admin_ui"],
        },
        "litellm_settings": {"drop_params": True, "telemetry": False},
    }


def render_config(plan: t.Mapping[str, t.Any], drained: t.Collection[str]) -> str:
    """The config file's text: JSON, which YAML reads as is, so no value needs YAML quoting. It holds what LiteLLM routes
    and nothing else: a drain that changes no route (a unit whose host is out already, another owner's hold) leaves it as
    it was, so the gateway is not restarted for it (each restart takes every model group away meanwhile)."""
    header = "# Managed by Ansible (sparkfleet.vllm.gateway): LiteLLM's config; who drained what is in drained.json"
    return header + "\n" + json.dumps(config_document(plan, drained), indent=2, sort_keys=True) + "\n"


def targets(plan: t.Mapping[str, t.Any]) -> set[str]:
    return {d["node"] for d in plan["deployments"]} | {f"{d['node']}/{d['instance']}" for d in plan["deployments"]}


def routed_here(plan: t.Mapping[str, t.Any], names: t.Sequence[str], owner: str) -> tuple[list[str], list[str]]:
    """(the names this gateway routes, those it does not). A hook's run names the units it measures at every gateway
    routing to their hosts, so a unit this gateway does not route is none of its business here; the operator's names
    are all kept, so a mistyped one is refused (drain_problems)."""
    if owner == OPERATOR:
        return list(names), []
    known = targets(plan)
    return [name for name in names if name in known], sorted({name for name in names if name not in known})


def host_of(name: str) -> str:
    return name.split("/", 1)[0]


def watchdog_owner(host: str) -> str:
    return f"{WATCHDOG_OWNER}{host}"


def owner_problem(owner: t.Any) -> str | None:
    """Why ``owner`` may not drain through the gateway_route module (None: it may): the operator, or a hook's run."""
    if owner == OPERATOR or (isinstance(owner, str) and HOOK_OWNER.fullmatch(owner)):
        return None
    return (f"gateway drain: owner {str(owner)[:120]!r} is neither {OPERATOR!r} nor a hook's run (NAME@RUN, e.g. bench@20250101T120000Z; "
            f"{WATCHDOG_OWNER}HOST is the watchdog's own): set gateway_drain_owner to one of them")


def apply_request(record: t.Mapping[str, t.Collection[str]], drain: t.Collection[str], undrain: t.Collection[str],
                  owner: str) -> dict[str, list[str]]:
    """The drained record after ``owner`` drains and undrains: a drain adds the owner to the name's owners; an undrain
    removes the owner's own drain only, and the operator's every drain of the name. A name stays drained while it has
    an owner."""
    after = {name: set(owners) for name, owners in record.items()}
    for name in drain:
        after.setdefault(name, set()).add(owner)
    for name in undrain:
        if name in after:
            after[name] = set() if owner == OPERATOR else after[name] - {owner}
    return {name: sorted(owners) for name, owners in sorted(after.items()) if owners}


def held_by_others(after: t.Mapping[str, t.Collection[str]], undrain: t.Collection[str]) -> dict[str, list[str]]:
    """Of the names undrained, those still out of rotation after the request, and who keeps each out (its own owners and
    its host's): a hook's or a watchdog's undrain never puts back what another drained."""
    held = {}
    for name in undrain:
        owners = {*after.get(name, ()), *(after.get(host_of(name), ()) if "/" in name else ())}
        if owners:
            held[name] = sorted(owners)
    return held


def left_by_runs(record: t.Mapping[str, t.Collection[str]], owner: str) -> dict[str, list[str]]:
    """Names only other playbook runs hold out of rotation (bench@..., sweep@..., rollout@...): a run stopped before its
    undrain hook leaves them so, and nothing but the operator's undrain puts them back."""
    return {name: sorted(owners) for name, owners in record.items()
            if owners and owner not in owners and all(HOOK_OWNER.fullmatch(holder) for holder in owners)}


def drain_problems(plan: t.Mapping[str, t.Any], drained: t.Mapping[str, t.Collection[str]], drain: t.Sequence[str],
                   undrain: t.Sequence[str], force: bool, owner: str = OPERATOR) -> list[str]:
    """Refusals of a drain or undrain: an unknown node, a request that contradicts itself or would
    do nothing, or groups left with nothing to route to. A hook's or a watchdog's undrain of an
    instance whose host another keeps drained is no refusal: it releases its own drain, and says who
    keeps the unit out (held_by_others)."""
    known = targets(plan)
    errors = [f"gateway drain: {name!r} is not a backend of this gateway (known: {', '.join(sorted(known))}); name an "
              "inventory host, or host/instance" for name in [*drain, *undrain] if name not in known]
    both = sorted(set(drain) & set(undrain))
    if both:
        errors.append(f"gateway drain: {', '.join(both)} asked to be drained and undrained at once")
    crossed = sorted({f"{d} (drain) and {u} (undrain)" for d in drain for u in undrain
                      if host_of(d) == host_of(u) and ("/" in d) != ("/" in u)})
    if crossed:
        errors.append(f"gateway drain: {'; '.join(crossed)} asked at once: a host and one of its instances leave each other in "
                      "place (a drained host keeps all its instances out, a drained instance stays out when its host goes "
                      "back), so one request would do nothing. Name either the host or its instances")
    after = apply_request(drained, drain, undrain, owner)
    void = sorted(u for u in undrain if "/" in u and host_of(u) in after and host_of(u) not in drain) if owner == OPERATOR else []
    if void:
        errors.append(f"gateway undrain: {', '.join(void)} would stay out of rotation, because the host stays drained; "
                      "undrain the host (and drain by name those of its instances that must stay out)")
    if errors or force or not drain:
        return errors
    before = {d["group"] for d in in_rotation(plan, drained)}
    after_groups = {d["group"] for d in in_rotation(plan, after)}
    emptied = [group for group in plan["groups"] if group in before and group not in after_groups]
    if emptied:
        # A hook's run (bench, sweep, rollout) names the fix in its own variables (gateway_drain_refusal_fix).
        fix = (" Undrain another node first, or force the drain (gateway_drain_force: true) for a planned outage"
               if owner == OPERATOR else "")
        errors.append(f"gateway drain: draining {', '.join(drain)} leaves model group(s) {', '.join(emptied)} with nothing "
                      f"to route to, so every client request for them would fail.{fix}")
    return errors


def kept_out(after: t.Collection[str], undrain: t.Collection[str]) -> list[str]:
    """Instances drained by name that stay out although their host was undrained."""
    hosts = {name for name in undrain if "/" not in name}
    return sorted(name for name in after if "/" in name and host_of(name) in hosts)


def plan_problem(plan: t.Any, where: str) -> str | None:
    """Why ``plan`` is not a gateway plan this collection wrote (None: it is)."""
    if not isinstance(plan, dict):
        return f"{where}: not a gateway plan (a JSON object was expected); {REWRITE}"
    version = plan.get("schema_version")
    if version != SCHEMA_VERSION:
        return (f"{where}: schema_version {'missing' if version is None else repr(version)}, while this collection reads "
                f"{SCHEMA_VERSION}: another (older) sparkfleet.vllm wrote it; {REWRITE}")
    missing = [key for key in PLAN_KEYS if key not in plan]
    deployment_keys = ("group", "id", "node", "instance", "model", "api_base", "key_env")
    broken = [d for d in plan.get("deployments") or [] if not isinstance(d, dict) or any(k not in d for k in deployment_keys)]
    if missing or broken or not isinstance(plan.get("groups"), dict):
        shown = ", ".join(missing) if missing else "whole deployments and groups"
        return f"{where}: lacks {shown}: the file is incomplete or was edited; {REWRITE}"
    settings = plan["settings"]
    lacking = [key for key in SETTINGS_KEYS if not isinstance(settings, dict) or key not in settings]
    if lacking:
        return f"{where}: its settings lack {', '.join(lacking)}: the file is incomplete or was edited; {REWRITE}"
    return None


def read_plan(text: str, path: str) -> tuple[dict[str, t.Any] | None, str | None]:
    """The plan file's plan, or why it cannot be read."""
    try:
        plan = json.loads(text)
    except ValueError as error:
        return None, f"{path}: not a gateway plan ({error}): the file is truncated or was edited; {REWRITE}"
    problem = plan_problem(plan, path)
    return (None, problem) if problem else (plan, None)


def plan_file(plan: t.Mapping[str, t.Any]) -> str:
    return json.dumps(plan, indent=2, sort_keys=True) + "\n"


def drained_file(record: t.Mapping[str, t.Collection[str]]) -> str:
    owners = {name: sorted(set(record[name])) for name in sorted(record)}
    return json.dumps({"schema_version": DRAINED_SCHEMA_VERSION, "drained": sorted(record), "owners": owners}, indent=2, sort_keys=True) + "\n"


def read_drained(text: str | None, path: str) -> tuple[dict[str, list[str]], str | None]:
    """The drained record (per name, its owners), or why it cannot be read. Never guessed: a list read wrong would put a
    node under maintenance back into rotation, or keep a healthy one out. A list of an older release names no owners:
    each name is the operator's, which only the operator's undrain puts back."""
    if text is None:
        return {}, None
    fix = ("move it aside (every node then goes back into rotation) and re-run site.yml --tags gateway, then drain again what "
           "must stay out (playbooks/gateway.yml -e '{\"gateway_drain\": [...]}')")
    try:
        value = json.loads(text)
    except ValueError as error:
        return {}, f"{path}: not a drained list ({error}): the file is truncated or was edited; {fix}"
    # The release before schema versions wrote the list itself, version 1 the list in an object: both unambiguous.
    version = 1 if isinstance(value, list) else value.get("schema_version") if isinstance(value, dict) else None
    if version not in (1, DRAINED_SCHEMA_VERSION):
        return {}, (f"{path}: schema_version {'missing' if version is None else repr(version)}, while this collection reads "
                    f"{DRAINED_SCHEMA_VERSION} (and 1); {fix}")
    names = value if isinstance(value, list) else value.get("drained")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        return {}, f"{path}: its drained entry must list hosts or host/instance names; {fix}"
    if version != DRAINED_SCHEMA_VERSION:
        return {name: [OPERATOR] for name in names}, None
    owners = value.get("owners")
    if not isinstance(owners, dict) or sorted(owners) != sorted(names) or not all(
            isinstance(held, list) and held and all(isinstance(owner, str) and owner for owner in held) for held in owners.values()):
        return {}, f"{path}: its owners entry must give every drained name the list of who drained it; {fix}"
    return {name: sorted(set(owners[name])) for name in names}, None


def watchdog_route(plan: t.Mapping[str, t.Any], record: t.Mapping[str, t.Collection[str]], verb: str, name: str
                   ) -> tuple[dict[str, list[str]] | None, dict[str, t.Any]]:
    """A backend watchdog's drain or undrain of one of its units (``host/instance``, owner ``watchdog@host``): the
    drained record after it (None: unchanged) and the reply {result, why}. A drain that would empty a group is
    refused, never forced: the watchdog acts anyway, and the group keeps its only replica. A unit already out (an
    operator's or a hook's drain of it or of its host) is left to them: the watchdog, not having drained it, will not
    put it back. An undrain releases the watchdog's own drain only; another's drain of the unit or its host keeps it out."""
    owner = watchdog_owner(host_of(name))
    deployments = [d for d in plan["deployments"] if f"{d['node']}/{d['instance']}" == name]
    if not deployments:
        return None, {"result": "not_routed", "why": f"{name} is no backend of this gateway"}
    if verb == "drain":
        if all(is_drained(d, record) for d in deployments):
            holders = held_by_others(record, [name]).get(name, [])
            return None, {"result": "already_drained", "why": f"{name} was out of rotation already, drained by {', '.join(holders)}, whose drain stays"}
        problems = drain_problems(plan, record, [name], [], force=False, owner=owner)
        if problems:
            return None, {"result": "refused", "why": problems[0]}
        return apply_request(record, [name], [], owner), {"result": "drained", "why": f"{name} out of rotation"}
    if owner not in record.get(name, ()):
        holders = held_by_others(record, [name]).get(name)
        if holders:
            why = f"{name} stays out of rotation: drained by {', '.join(holders)}, not by its watchdog, which undoes only its own drains"
            return None, {"result": "kept", "why": why}
        return None, {"result": "not_drained", "why": f"{name} was not drained by name"}
    after = apply_request(record, [], [name], owner)
    holders = held_by_others(after, [name]).get(name)
    if holders:
        return after, {"result": "kept", "why": f"the watchdog's drain of {name} released; it stays out of rotation, drained by {', '.join(holders)}"}
    return after, {"result": "undrained", "why": f"{name} back in rotation"}
