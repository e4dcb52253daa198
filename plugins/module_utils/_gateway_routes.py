# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's routing on its host: which deployments are in rotation, LiteLLM's config, the drained list.

Private to the collection, and the standard library only: the gateway role's gateway_route module
imports it, and the watchdog role installs it beside the watchdog's daemon, which drains a unit at
the gateway before acting on it and undrains it once it serves again (the daemon has nothing else of
the collection). Nothing here does I/O. A drain that would leave a model group with nothing to route
to is refused unless forced: LiteLLM routes to every deployment of a group when all are unhealthy,
so draining its last replica stops nothing, it only turns the group's requests into errors.
"""

from __future__ import annotations

import json
import typing as t

UNIT = "sparkfleet-gateway.service"
MASTER_KEY_ENV = "LITELLM_MASTER_KEY"
# The gateway's routing files, relative to its config folder (gateway_config_dir).
ROUTING_FILES = {"plan": "plan.json", "drained": "drained.json", "litellm_dir": "litellm", "config": "litellm/config.yaml"}

# What the gateway writes on its host; a file of another schema is refused, never guessed at.
SCHEMA_VERSION = 1
PLAN_KEYS = ("schema_version", "deployments", "groups", "settings", "url")
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
    """The config file's text: JSON, which YAML reads as is, so no value needs YAML quoting."""
    header = "# Managed by Ansible (sparkfleet.vllm.gateway): LiteLLM's config; drained: " + (", ".join(sorted(drained)) or "none")
    return header + "\n" + json.dumps(config_document(plan, drained), indent=2, sort_keys=True) + "\n"


def targets(plan: t.Mapping[str, t.Any]) -> set[str]:
    return {d["node"] for d in plan["deployments"]} | {f"{d['node']}/{d['instance']}" for d in plan["deployments"]}


def host_of(name: str) -> str:
    return name.split("/", 1)[0]


def after_request(drained: t.Collection[str], drain: t.Collection[str], undrain: t.Collection[str]) -> set[str]:
    return (set(drained) | set(drain)) - set(undrain)


def drain_problems(plan: t.Mapping[str, t.Any], drained: t.Collection[str], drain: t.Sequence[str],
                   undrain: t.Sequence[str], force: bool) -> list[str]:
    """Refusals of a drain or undrain: an unknown node, a request that contradicts itself or would
    do nothing, or groups left with nothing to route to."""
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
    after = after_request(drained, drain, undrain)
    void = sorted(u for u in undrain if "/" in u and host_of(u) in after and host_of(u) not in drain)
    if void:
        errors.append(f"gateway undrain: {', '.join(void)} would stay out of rotation, because the host stays drained; "
                      "undrain the host (and drain by name those of its instances that must stay out)")
    if errors or force or not drain:
        return errors
    before = {d["group"] for d in in_rotation(plan, drained)}
    after_groups = {d["group"] for d in in_rotation(plan, after)}
    emptied = [group for group in plan["groups"] if group in before and group not in after_groups]
    if emptied:
        errors.append(f"gateway drain: draining {', '.join(drain)} leaves model group(s) {', '.join(emptied)} with nothing "
                      "to route to, so every client request for them would fail. Undrain another node first, or force "
                      "the drain (gateway_drain_force: true) for a planned outage")
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


def drained_file(drained: t.Collection[str]) -> str:
    return json.dumps({"schema_version": SCHEMA_VERSION, "drained": sorted(drained)}, indent=2, sort_keys=True) + "\n"


def read_drained(text: str | None, path: str) -> tuple[list[str], str | None]:
    """The drained list, or why it cannot be read. Never guessed: a list read wrong would put a
    node under maintenance back into rotation, or keep a healthy one out."""
    if text is None:
        return [], None
    fix = ("move it aside (every node then goes back into rotation) and re-run site.yml --tags gateway, then drain again what "
           "must stay out (playbooks/gateway.yml -e '{\"gateway_drain\": [...]}')")
    try:
        value = json.loads(text)
    except ValueError as error:
        return [], f"{path}: not a drained list ({error}): the file is truncated or was edited; {fix}"
    # The release before schema versions wrote the list itself; its meaning is unambiguous, and the next write adds the version.
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        return list(value), None
    if not isinstance(value, dict) or value.get("schema_version") != SCHEMA_VERSION:
        version = value.get("schema_version") if isinstance(value, dict) else None
        return [], (f"{path}: schema_version {'missing' if version is None else repr(version)}, while this collection reads "
                    f"{SCHEMA_VERSION}; {fix}")
    drained = value.get("drained")
    if not isinstance(drained, list) or not all(isinstance(name, str) for name in drained):
        return [], f"{path}: its drained entry must list hosts or host/instance names; {fix}"
    return drained, None


def watchdog_route(plan: t.Mapping[str, t.Any], drained: t.Collection[str], verb: str, name: str) -> tuple[list[str] | None, dict[str, t.Any]]:
    """A backend watchdog's drain or undrain of one of its units (``host/instance``): the drained list after it
    (None: unchanged) and the reply {result, why}. A drain that would empty a group is refused, never forced:
    the watchdog acts anyway, and the group keeps its only replica. An operator's drain of the unit or its
    host stays: the unit is already out, and the watchdog, not having drained it, will not put it back."""
    deployments = [d for d in plan["deployments"] if f"{d['node']}/{d['instance']}" == name]
    if not deployments:
        return None, {"result": "not_routed", "why": f"{name} is no backend of this gateway"}
    if verb == "drain":
        if all(is_drained(d, drained) for d in deployments):
            return None, {"result": "already_drained", "why": f"{name} was out of rotation already (an operator's drain stays)"}
        problems = drain_problems(plan, drained, [name], [], force=False)
        if problems:
            return None, {"result": "refused", "why": problems[0]}
        return sorted({*drained, name}), {"result": "drained", "why": f"{name} out of rotation"}
    if name not in drained:
        return None, {"result": "not_drained", "why": f"{name} was not drained by name"}
    host_stays = f", though its host {host_of(name)} stays drained" if host_of(name) in drained else ""
    return sorted(set(drained) - {name}), {"result": "undrained", "why": f"{name} back in rotation{host_stays}"}
