# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's plan: a LiteLLM proxy in front of independent nodes and clusters (seed 002).

Private to the collection. The backends come from the serving hosts' own instance plans (their
ports, binds and served names), never from what was rendered on them. Each deployment of a model
group is one endpoint serving one of the group's served names; the backends' keys reach LiteLLM
as environment variables named in the config (``os.environ/...``), so the config and the plan
file hold no secret and diff safely. Draining takes a node (or one instance of it) out of every
group by rendering the config without it; a drain that would leave a group with nothing to
route to is refused unless forced. LiteLLM's admin UI and API documentation, which answer
without a key, are off unless the inventory opts in. The plan and drained files on the gateway
host carry a schema version; one this collection cannot read is refused, naming the fix.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway_routes import (
    MASTER_KEY_ENV,
    ROUTING_FILES,
    SCHEMA_VERSION,
    SETTINGS_KEYS,
    UNIT,
    host_of,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import GATEWAY as GATEWAY_KIND
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import GATEWAY_SCHEMA_VERSION
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import Setting, coerced, setting_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import exec_line
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import UNIT_FOLDER, parse_image_reference
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import (
    API_KEY,
    CONFIG_HASH_LABEL,
    canonical_address,
    config_hash,
    endpoint_url,
)

ROUTING_STRATEGIES = ("simple-shuffle", "least-busy", "latency-based-routing")
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
HOST_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:.]+")
# Every client of the fleet holds it: longer than an instance key.
MASTER_KEY_MIN_LENGTH = 32
CONTAINER = "sparkfleet-gateway"
# LiteLLM mounts its config here in the container; the host's config folder is mounted read-only.
CONTAINER_CONFIG_DIR = "/etc/litellm"


def gateway_files(config_dir: str) -> dict[str, str]:
    """Where the gateway's files live on its host: its keys (env, 0600), its plan, the drained list,
    LiteLLM's folder and config, its unit, the plan of its unit (what serving_unit relaunches and
    gates it from) and the last good copies of the unit's files."""
    folder = config_dir.rstrip("/")
    return {"env": f"{folder}/gateway.env", **{name: f"{folder}/{path}" for name, path in ROUTING_FILES.items()}, "unit": f"{UNIT_FOLDER}/{UNIT}",
            "unit_plan": f"{folder}/unit-plan.json", "last_good_dir": f"{folder}/last-good"}


# LiteLLM 1.110.2 reads these at start (litellm/proxy/utils.py get_docs_url, get_redoc_url,
# get_openapi_url; common_utils/admin_ui_utils.py is_admin_ui_disabled): off, the Swagger page
# at /, /redoc and /openapi.json are not served, and the SSO key page answers "Admin UI is disabled".
ADMIN_UI_OFF_ENV = {"DISABLE_ADMIN_UI": "True"}
API_DOCS_OFF_ENV = {"NO_DOCS": "True", "NO_REDOC": "True", "NO_OPENAPI": "True"}
# LiteLLM 1.110.2 fetches its model cost map, blog posts, release notes and catalogs on its own unless this is exactly
# "true" (litellm/litellm_core_utils/offline_mode.py is_offline_mode; environment only, no config key).
OFFLINE_ENV = {"LITELLM_OFFLINE_MODE": "true"}

GATEWAY_SETTINGS: tuple[Setting, ...] = (
    Setting("allow_wildcard_bind", "bool", ""),
    Setting("port", "port", "the proxy listens on it, on the host's network"),
    Setting("routing_strategy", "choice", "", choices=ROUTING_STRATEGIES),
    Setting("health_check_interval", "count", "seconds between LiteLLM's checks of every deployment: more often than every 5 s "
            "loads the backends, and past an hour a node that stopped keeps its share of the requests", 5, 3600),
    Setting("allowed_fails", "count", "failed requests before a deployment cools down; past 100 a failing node keeps taking "
            "requests", 1, 100),
    Setting("cooldown_seconds", "count", "seconds a failing deployment stays out of rotation; past an hour a node back in "
            "service idles", 1, 3600),
    Setting("retries", "count", "each retry is another whole request on another deployment; past 10 a failing group "
            "multiplies its own load", 0, 10),
    Setting("request_timeout", "count", "seconds a request to a backend may take; a day bounds the longest generation while "
            "LiteLLM holds the client's connection", 1, 86400),
    Setting("ready_timeout", "count", "seconds the gateway may take to answer after a (re)start, polled every 2 s", 2, 3600),
    Setting("config_dir", "path", "the role makes this folder root-owned and mode 0700 (it holds the keys' env file) and "
            "mounts it into the container, which on / or /etc would lock every other user out", 2),
    Setting("admin_ui", "bool", ""),
    Setting("api_docs", "bool", ""),
    Setting("allow_outbound", "bool", ""),
)

# The role's defaults (roles/gateway/defaults/main.yml; a unit test holds the two equal), for what has to
# be known without the role: the gateway_plan and gateway_settings_problems filters called with only some
# settings, and another gateway host's config folder, which its hostvars hold only when the inventory sets
# it (gateway_routers). The role itself passes every setting (vars/main.yml).
DEFAULT_SETTINGS: dict[str, t.Any] = {
    "image": "",
    "bind_address": "127.0.0.1",
    "allow_wildcard_bind": False,
    "port": 4000,
    "master_key": "",
    "backends": [],
    "model_groups": {},
    "routing_strategy": "latency-based-routing",
    "health_check_interval": 30,
    "allowed_fails": 1,
    "cooldown_seconds": 30,
    "retries": 2,
    "request_timeout": 600,
    "ready_timeout": 120,
    "config_dir": "/etc/sparkfleet/gateway",
    "admin_ui": False,
    "api_docs": False,
    "allow_outbound": False,
}


def ip(address: t.Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address)
    except (TypeError, ValueError):
        return None


def is_loopback(address: str) -> bool:
    parsed = ip(address)
    return bool(parsed and parsed.is_loopback)


def is_wildcard(address: str) -> bool:
    """Every interface, in any spelling (0.0.0.0, ::, 0:0::0, ...)."""
    parsed = ip(address)
    return bool(parsed and parsed.is_unspecified)


def settings_problems(settings: t.Mapping[str, t.Any]) -> list[str]:
    """Every problem of the gateway's own settings, each naming the variable and the fix."""
    errors = setting_problems("gateway_", GATEWAY_SETTINGS, settings)
    image = settings["image"]
    if not isinstance(image, str) or not parse_image_reference(image):
        errors.append(f"gateway_image: {image!r} is not pinned by digest; a tag can move to another LiteLLM release "
                      "under a running fleet. Give repo[:tag]@sha256:<64 hex> (docker buildx imagetools inspect shows it)")
    address = settings["bind_address"]
    if ip(address) is None or not isinstance(address, str):
        errors.append(f"gateway_bind_address: {address!r} must be one IP address of the gateway host (127.0.0.1 to "
                      "serve only this host)")
    elif canonical_address(address) is None:
        errors.append(f"gateway_bind_address: {address!r} is an IPv4-mapped or zoned IPv6 address; ::ffff:0.0.0.0 listens on "
                      "every IPv4 interface past the wildcard opt-in. Write the IPv4 address itself")
    elif is_wildcard(address) and settings["allow_wildcard_bind"] is not True:
        errors.append(f"gateway_bind_address: {address} listens on every interface, the LAN included; bind the "
                      "address clients use, or set gateway_allow_wildcard_bind: true if a firewall guards the port")
    key = settings["master_key"]
    if not isinstance(key, str) or len(key) < MASTER_KEY_MIN_LENGTH or not key.startswith("sk-"):
        errors.append(f"gateway_master_key: missing, shorter than {MASTER_KEY_MIN_LENGTH} characters or not starting with "
                      "'sk-' (LiteLLM's form for its master key). Put one in vault, for example 'sk-' followed by "
                      "`openssl rand -hex 32`")
    elif not API_KEY.fullmatch(key):
        errors.append("gateway_master_key: contains whitespace or a non-printable character; it is one line of the env "
                      "file, where a newline would add settings. Use printable ASCII without spaces")
    backends = settings["backends"]
    if not isinstance(backends, list) or not backends or not all(isinstance(b, str) and b for b in backends):
        errors.append(f"gateway_backends: {backends!r} must list the inventory hosts whose instances the gateway routes to")
    else:
        repeated = sorted({b for b in backends if backends.count(b) > 1})
        if repeated:
            errors.append(f"gateway_backends: {', '.join(repeated)} listed more than once; each would be a second deployment of "
                          "the same endpoint in every group, taking twice its share. List each host once")
    groups = settings["model_groups"]
    if not isinstance(groups, dict):
        errors.append(f"gateway_model_groups: {groups!r} must map each group name to the served model names it routes to")
    else:
        for name, served in groups.items():
            if not isinstance(name, str) or not GROUP_NAME.fullmatch(name):
                errors.append(f"gateway_model_groups: group name {name!r} must be letters, digits and ._:/- (what clients "
                              "send as the model)")
            if not isinstance(served, list) or not served or not all(isinstance(s, str) and s for s in served):
                errors.append(f"gateway_model_groups.{name}: {served!r} must list served model names")
    return errors


def reach_address(host: str, gateway_host: str, host_address: str, binds: t.Sequence[str]) -> str | None:
    """The address the gateway reaches an instance on, or None when it only listens where the gateway is not."""
    if host == gateway_host:
        loopback = [a for a in binds if is_loopback(a) or is_wildcard(a)]
        if loopback:
            return "::1" if ":" in loopback[0] else "127.0.0.1"
    if any(is_wildcard(a) for a in binds) or host_address in binds:
        return host_address
    reachable = [a for a in binds if not is_loopback(a)]
    return reachable[0] if reachable else None


# The names /etc/hosts gives loopback on Debian, Ubuntu and Red Hat systems; RFC 6761 reserves *.localhost too.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "localhost4", "localhost4.localdomain4", "localhost6",
                            "localhost6.localdomain6", "ip6-localhost", "ip6-loopback"})


def names_the_gateway_itself(address: str) -> bool:
    """An address that on any host means that host: loopback or the wildcard in any spelling the resolver reads
    (127.0.0.0/8, ::1, IPv4-mapped, and inet_aton's 127.1, 2130706433, 0x7f000001, 0177.0.0.1, a trailing dot) and the
    names systems give loopback."""
    name = address.lower().rstrip(".")
    parsed = ip(name)
    if parsed is None:
        try:
            parsed = ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            parsed = None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped:
        parsed = parsed.ipv4_mapped
    if parsed is not None:
        return parsed.is_loopback or parsed.is_unspecified
    return name in LOOPBACK_NAMES or name.endswith(".localhost")


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def backend_reports(names: t.Any, hostvars: t.Mapping[str, t.Any]) -> list[dict[str, t.Any]]:
    """What each backend host's play published: its instances' endpoints (``vllm_endpoints``, and
    ``cluster_endpoints`` on a cluster's head) and the address the gateway reaches it on
    (``gateway_backend_address``, else ``ansible_host``, else its name). Hosts missing from the
    inventory are reported by name with no instances."""
    reports = []
    for name in names if isinstance(names, list) else []:
        facts = hostvars[name] if name in hostvars else None
        if facts is None:
            reports.append({"host": name, "missing": True, "instances": None})
            continue
        single, cluster = facts.get("vllm_endpoints"), facts.get("cluster_endpoints")
        heads = facts.get("cluster_name") and (facts.get("cluster_nodes") or [None])[0] == name
        reports.append({
            "host": name,
            "address": str(facts.get("gateway_backend_address") or facts.get("ansible_host") or name),
            "instances": None if single is None else [*single, *[e for e in cluster or [] if e.get("head")]],
            "unplanned_cluster": facts.get("cluster_name") if heads and cluster is None else None,
        })
    return reports


def backend_endpoints(backends: t.Sequence[t.Mapping[str, t.Any]], gateway_host: str) -> tuple[list[dict[str, t.Any]], list[str]]:
    """Each backend host's planned instances as endpoints the gateway reaches (see backend_reports)."""
    endpoints, errors = [], []
    for backend in backends:
        host = backend["host"]
        if backend.get("missing"):
            errors.append(f"gateway_backends: {host} is not a host of the inventory")
            continue
        if not HOST_ADDRESS.fullmatch(backend["address"]) or is_wildcard(backend["address"]):
            errors.append(f"gateway_backend_address of {host}: {backend['address']!r} must be the host's name or one of its IP "
                          "addresses (a wildcard reaches the gateway's own host)")
            continue
        if host != gateway_host and names_the_gateway_itself(backend["address"]):
            errors.append(f"gateway_backend_address of {host}: {backend['address']!r} (its gateway_backend_address, else its "
                          f"ansible_host) is this host only as the controller reaches it; on {gateway_host} it is the gateway "
                          f"itself. Set gateway_backend_address of {host} to the address {gateway_host} reaches it on")
            continue
        if backend.get("unplanned_cluster"):
            errors.append(f"gateway_backends: {host} heads cluster {backend['unplanned_cluster']}, which was not planned in "
                          "this run; run the cluster play too (all of site.yml, or --tags cluster,gateway)")
            continue
        if backend.get("instances") is None:
            errors.append(f"gateway_backends: {host} has no instance plan in this run; it must be in the play that "
                          "serves it (site.yml and playbooks/gateway.yml plan every backend first)")
            continue
        for instance in backend["instances"]:
            address = reach_address(host, gateway_host, backend.get("address") or "", instance["bind_addresses"])
            if address is None:
                errors.append(f"gateway_backends: instance {instance['name']} on {host} binds only "
                              f"{', '.join(instance['bind_addresses'])}, which the gateway on {gateway_host} cannot reach. "
                              "Add the host's LAN address to the instance's bind_addresses")
                continue
            endpoints.append({
                "node": host,
                "instance": instance["name"],
                "api_base": f"http://{url_host(address)}:{instance['port']}/v1",
                "served_names": list(instance["served_names"]),
                "key": instance["api_key"],
            })
    return endpoints, errors


def gateway_plan(settings: t.Mapping[str, t.Any], backends: t.Sequence[t.Mapping[str, t.Any]], gateway_host: str) -> dict[str, t.Any]:
    """The gateway's plan: ``deployments`` (group, id, node, instance, model, api_base, key_env),
    ``groups``, ``settings`` (what the config needs), ``docker_run``, ``unit_file``; ``env_file``
    is the only part holding secrets; ``errors`` lists every problem and empties the rest."""
    settings = coerced(GATEWAY_SETTINGS, {**DEFAULT_SETTINGS, **settings})
    plan: dict[str, t.Any] = {"errors": settings_problems(settings), "deployments": [], "groups": {}}
    endpoints, errors = backend_endpoints(backends, gateway_host) if not plan["errors"] else ([], [])
    plan["errors"] += errors
    if plan["errors"]:
        return plan
    served = sorted({name for endpoint in endpoints for name in endpoint["served_names"]})
    groups = settings["model_groups"] or {name: [name] for name in served}
    keys: dict[str, str] = {}
    for group, names in sorted(groups.items()):
        unknown = [n for n in names if n not in served]
        if unknown:
            plan["errors"].append(f"gateway_model_groups.{group}: no backend serves {', '.join(unknown)} (served: "
                                  f"{', '.join(served) or 'nothing'}); name served model names of gateway_backends' instances")
            continue
        for endpoint in endpoints:
            for name in endpoint["served_names"]:
                if name not in names:
                    continue
                key_env = keys.setdefault(endpoint["key"], f"SPARKFLEET_BACKEND_KEY_{len(keys) + 1}")
                plan["deployments"].append({
                    "group": group, "id": f"{endpoint['node']}/{endpoint['instance']}/{name}/{group}",
                    "node": endpoint["node"], "instance": endpoint["instance"], "model": f"openai/{name}",
                    "api_base": endpoint["api_base"], "key_env": key_env,
                })
        plan["groups"][group] = list(names)
    if plan["errors"]:
        plan["deployments"], plan["groups"] = [], {}
        return plan
    plan["schema_version"] = SCHEMA_VERSION
    plan["settings"] = {name: settings[name] for name in SETTINGS_KEYS}
    # One spelling of the address (:: for 0:0::0), the one the URL and LiteLLM's --host get.
    bind_address = str(ipaddress.ip_address(settings["bind_address"]))
    plan["url"] = endpoint_url(bind_address, settings["port"])
    env_lines = ["# Managed by Ansible (sparkfleet.vllm.gateway); holds the master key and the backends' keys, mode 0600.",
                 f"{MASTER_KEY_ENV}={settings['master_key']}", *[f"{env}={key}" for key, env in keys.items()]]
    plan["env_file"] = "\n".join(env_lines) + "\n"
    files = gateway_files(settings["config_dir"])
    switches = {**({} if settings["admin_ui"] else ADMIN_UI_OFF_ENV), **({} if settings["api_docs"] else API_DOCS_OFF_ENV),
                **({} if settings["allow_outbound"] else OFFLINE_ENV)}
    options = [DOCKER_CLIENT, "run", "--name", CONTAINER, "--network", "host", "--env-file", files["env"], "--ulimit", "core=0",
               *[argument for name, value in switches.items() for argument in ("--env", f"{name}={value}")],
               "--volume", f"{files['litellm_dir']}:{CONTAINER_CONFIG_DIR}:ro", "--label", "sparkfleet.gateway=1"]
    command = [settings["image"], "--config", f"{CONTAINER_CONFIG_DIR}/config.yaml",
               "--host", bind_address, "--port", str(settings["port"]), "--num_workers", "1"]
    # A container started by hand, or from another plan, carries another hash: drift, as for an instance.
    digest = config_hash([*options, *command], plan["env_file"])
    plan["docker_run"] = [*options, "--label", f"{CONFIG_HASH_LABEL}={digest}", *command]
    plan["unit"], plan["container"], plan["files"] = UNIT, CONTAINER, files
    plan["unit_file"] = unit_file(plan["docker_run"])
    plan["serving_unit"] = serving_unit(plan, settings, digest)
    return plan


def serving_unit(plan: t.Mapping[str, t.Any], settings: t.Mapping[str, t.Any], digest: str) -> dict[str, t.Any]:
    """The gateway as one unit of the serving transaction (the serving_unit module's plan): its files
    with their last good copies, its unit and container, the hash its container carries, what its
    gate reads (URL, timeout, the master key's name in the env file) and its routing, which it reads
    at start (newer than its container: drift)."""
    files = plan["files"]
    kept = ((files["env"], "0600"), (files["unit_plan"], "0644"), (files["unit"], "0644"))
    return {
        "schema_version": GATEWAY_SCHEMA_VERSION, "kind": GATEWAY_KIND, "name": "gateway", "unit": UNIT, "container": CONTAINER,
        "unit_file": plan["unit_file"], "run_image": settings["image"], "config_hash": digest, "url": plan["url"],
        "health_timeout": settings["ready_timeout"], "key_env": MASTER_KEY_ENV, "drop_caches": False, "routing_file": files["config"],
        "kept_files": [{"path": path, "last_good": f"{files['last_good_dir']}/{path.rsplit('/', 1)[1]}", "mode": mode}
                       for path, mode in kept],
    }


def unit_file(run: t.Sequence[str]) -> str:
    return "\n".join([
        "# Managed by Ansible (sparkfleet.vllm.gateway): the unit owns the LiteLLM proxy's container.",
        "[Unit]",
        "Description=LiteLLM gateway in front of the vLLM endpoints (sparkfleet.vllm)",
        "Requires=docker.service",
        "Wants=network-online.target",
        "After=docker.service network-online.target",
        "",
        "[Service]",
        "Type=simple",
        "ExecStartPre=-" + exec_line([DOCKER_CLIENT, "rm", "--force", CONTAINER]),
        "ExecStart=" + exec_line(run),
        "ExecStop=" + exec_line([DOCKER_CLIENT, "stop", "--time", "30", CONTAINER]),
        # Any exit but a planned stop: a SIGTERM from outside (earlyoom) ends LiteLLM cleanly too.
        "Restart=always",
        "RestartSec=5",
        # No core dumps from the unit's processes (systemd's DefaultLimitCORE is infinity); the container's are set by --ulimit.
        "LimitCORE=0",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def drain_requests(gateways: t.Sequence[str], backends: t.Mapping[str, t.Sequence[str]], drain: t.Sequence[str],
                   undrain: t.Sequence[str]) -> list[dict[str, t.Any]]:
    """Per gateway (in inventory order) that routes to a named host: the names of its own backends,
    as it is asked to drain and undrain them (a gateway refuses a name it does not route to)."""
    requests = []
    for gateway in gateways:
        routed = set(backends.get(gateway) or [])
        own_drain, own_undrain = [n for n in drain if host_of(n) in routed], [n for n in undrain if host_of(n) in routed]
        if own_drain or own_undrain:
            requests.append({"gateway": gateway, "drain": own_drain, "undrain": own_undrain})
    return requests
