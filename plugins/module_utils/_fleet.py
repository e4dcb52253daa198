# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checks across roles and across hosts, run once for the whole fleet before any host changes.

Private to the collection. Each role checks its own settings; what none of them can see alone is
here: two things on one host claiming one port (a single instance, a cluster's API, rendezvous and
Ray ports, the gateway, the model source's rsync daemon, and what the operator says the host
already runs), one box under two inventory names, a host in two clusters (the cluster
module's own fleet rule, here for every cluster at once), and a model source that does not serve
the nodes copying from it. ``host_claims``
turns one host's variables (as the inventory and the plans published in the same play give them)
into what it binds; ``fleet_problems`` judges all hosts together.
"""

from __future__ import annotations

import pathlib
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import RAY_PORT, fleet_cluster_problems, identity
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import DEFAULT_SETTINGS as GATEWAY_DEFAULTS
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import normal_path, path_problem

# What a Spark or GX10 commonly runs beside vLLM, on ports an instance must not take; an inventory
# names its own in sparkfleet_reserved_ports.
DEFAULT_RESERVED_PORTS = {22: "sshd", 9100: "node exporter", 9400: "dcgm-exporter"}
# The roles' default ports, for a host whose variables come from the inventory alone (the roles'
# defaults are not loaded there); tests/unit/plugins/module_utils/test_fleet.py holds them equal.
ROLE_DEFAULT_PORTS = {"cluster_master_port": 29501, "gateway_port": 4000, "vllm_models_rsync_port": 8873}
# The roles' configuration folders as their defaults set them, likewise.
ROLE_DEFAULT_FOLDERS = {"vllm_config_dir": "/etc/sparkfleet/vllm", "cluster_config_dir": "/etc/sparkfleet/cluster",
                        "gateway_config_dir": GATEWAY_DEFAULTS["config_dir"]}
# Connections that reach the controller itself, not a box of the fleet.
NOT_A_BOX = frozenset({"localhost", "127.0.0.1", "::1"})


def as_port(value: t.Any) -> int | None:
    """A port number, also as the text an extra variable (-e name=4001) gives."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535 else None


def reserved_problems(host: str, reserved: t.Any) -> list[str]:
    if not isinstance(reserved, dict) or not all(as_port(port) is not None and isinstance(name, str) and name for port, name in reserved.items()):
        return [f"{host}: sparkfleet_reserved_ports: {reserved!r} must map port numbers (1-65535) to what listens there, "
                "such as {9100: node exporter}"]
    return []


def host_claims(host: str, variables: t.Mapping[str, t.Any]) -> tuple[list[tuple[int, str]], list[str]]:
    """The ports one host's plan binds, each with who claims it in the inventory's words, and the
    problems of the inputs of this check. Malformed values of a role's own settings are that role's
    refusals: they are skipped here."""
    reserved = variables.get("sparkfleet_reserved_ports", DEFAULT_RESERVED_PORTS)
    errors = reserved_problems(host, reserved)
    claims: list[tuple[int, str]] = [] if errors else [(port, f"sparkfleet_reserved_ports ({name})") for port, name in reserved.items()]
    for endpoint in variables.get("vllm_endpoints") or []:
        claims.append((endpoint.get("port"), f"vllm_instances ({endpoint.get('name')}).port"))
    cluster = variables.get("cluster_name") or ""
    nodes = variables.get("cluster_nodes") or []
    if cluster and isinstance(nodes, list) and nodes and nodes[0] == host:
        instance = variables.get("cluster_instance") or {}
        if isinstance(instance, dict):
            claims.append((instance.get("port"), f"cluster_instance.port (cluster {cluster}'s API on its head)"))
        claims.append((variables.get("cluster_master_port", ROLE_DEFAULT_PORTS["cluster_master_port"]),
                       f"cluster_master_port (cluster {cluster}'s rendezvous on its head)"))
        if variables.get("cluster_backend") == "ray":
            claims.append((RAY_PORT, f"the Ray head of cluster {cluster} (cluster_backend: ray)"))
    if variables.get("gateway_backends"):
        claims.append((variables.get("gateway_port", ROLE_DEFAULT_PORTS["gateway_port"]), "gateway_port"))
    if variables.get("vllm_models_source") == host:
        claims.append((variables.get("vllm_models_rsync_port", ROLE_DEFAULT_PORTS["vllm_models_rsync_port"]),
                       "vllm_models_rsync_port (the model source's rsync daemon)"))
    ports = [(as_port(port), who) for port, who in claims]
    return [(port, who) for port, who in ports if port is not None], errors


def folder_problems(host: str, variables: t.Mapping[str, t.Any]) -> list[str]:
    """Configuration folders of two roles on one host that are one folder, or one inside the other:
    each role removes what it no longer plans from its own folder (the vllm role every plan file of
    an instance it no longer serves), so it would remove the other role's files. The vllm role's
    folder counts on every host (its removal runs there); the cluster's and the gateway's where they
    serve. Folders are compared in one spelling (``//etc/x/`` is ``/etc/x``). A malformed folder is its
    role's refusal."""
    used = {"vllm_config_dir": True, "cluster_config_dir": bool(variables.get("cluster_name")),
            "gateway_config_dir": bool(variables.get("gateway_backends"))}
    folders = {name: variables.get(name, default) for name, default in ROLE_DEFAULT_FOLDERS.items() if used[name]}
    paths = {name: pathlib.PurePosixPath(normal_path(folder)) for name, folder in folders.items() if path_problem(folder) is None}
    errors = []
    names = sorted(paths)
    for index, first in enumerate(names):
        for second in names[index + 1:]:
            a, b = paths[first], paths[second]
            if a == b or a in b.parents or b in a.parents:
                errors.append(f"{host}: {first} ({a}) and {second} ({b}) share a folder; each role removes the files it no longer "
                              "plans from its own folder, and would remove the other's. Give each role a folder of its own, "
                              "such as /etc/sparkfleet/ROLE")
    return errors


def port_problems(host: str, claims: t.Sequence[tuple[int, str]]) -> list[str]:
    by_port: dict[int, list[str]] = {}
    for port, who in claims:
        by_port.setdefault(port, []).append(who)
    return [f"{host}: port {port} is claimed by {' and by '.join(owners)}; each listener needs a port of its own on the host "
            "(the second would fail its start, and a rollback would not serve either). Change one of them"
            for port, owners in sorted(by_port.items()) if len(owners) > 1]


def same_box_problems(variables: t.Mapping[str, t.Mapping[str, t.Any]]) -> list[str]:
    """Two inventory names Ansible reaches at one address and port (``ansible_host`` set on both)."""
    boxes: dict[tuple[str, t.Any], list[str]] = {}
    for host, values in variables.items():
        if values.get("ansible_host"):
            address, port = identity(host, values)
            if address not in NOT_A_BOX:
                boxes.setdefault((address, port), []).append(host)
    return [f"{', '.join(hosts)}: one box ({address}{f' port {port}' if port else ''}) under {len(hosts)} inventory names would "
            f"be planned {len(hosts)} times (its memory pool, ports and GPU counted once each; as cluster nodes, two ranks on one "
            "GPU). Keep one name"
            for (address, port), hosts in sorted(boxes.items(), key=lambda item: str(item[0])) if len(hosts) > 1]


def models_source_problems(variables: t.Mapping[str, t.Mapping[str, t.Any]]) -> list[str]:
    """A node that copies its checkpoints from a source which does not name itself: the source's
    rsync daemon and staging run only where ``vllm_models_source`` is the host's own name, so the
    copies would find nothing to copy from."""
    errors = []
    for host, values in sorted(variables.items()):
        source = values.get("vllm_models_source") or ""
        if not isinstance(source, str) or source in ("", host) or source not in variables:
            continue
        named = variables[source].get("vllm_models_source") or ""
        if named != source:
            errors.append(f"{host}: vllm_models_source names {source}, whose own vllm_models_source is {named!r}: {source} then "
                          f"stages nothing for the others and runs no rsync daemon, so {host}'s copy fails. Set "
                          f"vllm_models_source: {source} on {source} too (every node sharing the checkpoints names the source)")
    return errors


def fleet_problems(variables: t.Mapping[str, t.Mapping[str, t.Any]],
                   inventory: t.Mapping[str, t.Mapping[str, t.Any]] | None = None) -> list[str]:
    """Every cross-role and cross-host problem of the hosts given (host -> its variables). Cluster
    membership and one box twice are judged over ``inventory`` (every host, when a run is limited)."""
    everyone = {**(inventory or {}), **variables}
    errors: list[str] = []
    for host, values in variables.items():
        claims, claim_errors = host_claims(host, values)
        errors += claim_errors + port_problems(host, claims) + folder_problems(host, values)
    return errors + same_box_problems(everyone) + fleet_cluster_problems(everyone) + models_source_problems(everyone)
