# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader of a serving unit's plan file (an instance's or a cluster rank's NAME.json in its role's configuration
folder, and the gateway's unit-plan.json), for every program that acts on one: the units' start door and readiness wait
(_host_runtime), the watchdog's daemon, the reboot test's checks (_boot_check), the measurement modules (_vllm_client)
and the serving transaction's gate and rollback (_serving_unit).

A plan file is read whole or not at all: every key any of them relies on is checked here, so a reader never acts on a
half of a file that another reader would refuse. A file of another schema (PLAN_SCHEMA_VERSION: another release of the
collection wrote it), a damaged or a missing one is refused with PlanFileError: the file's path, what is unusable, and
the fix (re-apply site.yml, whose serving roles write the plan files).

This file is part of the host runtime (_host_runtime.RUNTIME_MODULES): it runs on the hosts without Ansible, so the
standard library only, beside the runtime files it imports.
"""

from __future__ import annotations

import ipaddress
import json
import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster_sequence import BACKENDS
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT
from ansible_collections.sparkfleet.vllm.plugins.module_utils._image_kinds import keeps_entrypoint
from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import memory_probe_argv, paused_containers_problems

# The shape of a unit's plan file, written by the plan builder (_vllm_plan.instance_plan). 2: the start door's keys
# (start_bound, memory_admission, memory_probe, paused_containers, ...) that plans of release 1 lacked.
PLAN_SCHEMA_VERSION = 2
# The shape of the gateway's unit plan (_gateway.serving_unit): versioned apart from the instances' plans, whose start door
# keys it lacks, so a change to those never leaves a gateway without a last good copy to roll back to.
GATEWAY_SCHEMA_VERSION = 2
# Each unit's counted starts, kept on disk across reboots: a plan's start_bound.path is its unit's record here.
START_LEDGER_DIR = "/var/lib/sparkfleet/starts"
FIX = "re-apply site.yml to this host (the serving roles write the plan files)"
# A unit and a container name as the collection writes them: they reach systemctl, docker and file names.
PLAN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,250}")
# An image reference as the plan builder writes run_image: never an option to docker.
IMAGE_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}")
TEXT_KEYS = ("name", "model", "weights")
HTTP_KEYS = ("url", "container_url")
PATH_KEYS = ("env_path", "maintenance_flag")
SWITCH_KEYS = ("drop_caches", "memory_admission")
# The kinds of plan file: an instance's or a rank's, which the start door runs, and the gateway's unit plan, whose gate
# reads its URL, container, timeout and the name of its master key in its env file.
INSTANCE = "instance"
GATEWAY = "gateway"
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
TEXT_LIST_KEYS = ("paused_containers", "bind_addresses", "start_after")


class PlanFileError(ValueError):
    """A plan file no reader may act on: its path, what is unusable and the fix."""


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def read_plan(path: str, read: t.Callable[[str], str] = read_text, kind: str = INSTANCE) -> dict[str, t.Any]:
    """The plan file at ``path``, whole, of this release's schema and of ``kind``; PlanFileError naming the path, what and
    the fix. ``read``: how the file's text is read (the reboot test's checks read through their own host)."""
    try:
        text = read(path)
    except FileNotFoundError as error:
        raise PlanFileError(f"{path}: no such plan file; {FIX}") from error
    except UnicodeDecodeError as error:
        raise PlanFileError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); {FIX}") from error
    except OSError as error:
        raise PlanFileError(f"{path}: cannot be read ({error.strerror}); read it as root (become: true), or {FIX}") from error
    return parsed_plan(path, text, kind)


def parsed_plan(path: str, text: str, kind: str = INSTANCE) -> dict[str, t.Any]:
    """The plan the text of the file at ``path`` holds, checked as read_plan checks it."""
    try:
        found = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise PlanFileError(f"{path}: not valid JSON ({str(error)[:200]}); {FIX}") from error
    if not isinstance(found, dict):
        raise PlanFileError(f"{path}: holds no plan object; {FIX}")
    version, expected = found.get("schema_version"), schema_version(kind)
    if isinstance(version, bool) or not isinstance(version, int) or version != expected:
        raise PlanFileError(f"{path}: schema_version {version!r}, this release reads {expected} "
                            f"(another release of sparkfleet.vllm wrote it); {FIX}")
    wrong = unusable_keys_of(found, kind)
    if wrong:
        raise PlanFileError(f"{path}: no usable {', '.join(wrong)}; {FIX}")
    return found


def schema_version(kind: str) -> int:
    """The schema version this release writes and reads for a plan file of ``kind``."""
    return GATEWAY_SCHEMA_VERSION if kind == GATEWAY else PLAN_SCHEMA_VERSION


def unusable_keys_of(plan: t.Mapping[str, t.Any], kind: str) -> list[str]:
    """Each key of a plan of ``kind`` that is missing or not what its role writes."""
    return gateway_unusable_keys(plan) if kind == GATEWAY else unusable_keys(plan)


def unusable_keys(plan: t.Mapping[str, t.Any]) -> list[str]:
    """Each key of a plan that is missing or not what the plan builder writes, in the order the builder writes them."""
    wrong = [key for key in TEXT_KEYS if not isinstance(plan.get(key), str) or not plan[key]]
    wrong += [key for key in ("unit", "container") if not isinstance(plan.get(key), str) or not PLAN_NAME.fullmatch(plan[key])]
    wrong += [key for key in HTTP_KEYS if not isinstance(plan.get(key), str) or not plan[key].startswith("http://")]
    wrong += [key for key in PATH_KEYS if not is_absolute_path(plan.get(key))]
    wrong += [key for key in SWITCH_KEYS if not isinstance(plan.get(key), bool)]
    wrong += [key for key in TEXT_LIST_KEYS if not isinstance(plan.get(key), list) or not all(isinstance(item, str) for item in plan[key])]
    # The names the start door passes to docker stop and start: other programs' containers, never the collection's own.
    if "paused_containers" not in wrong and paused_containers_problems("paused_containers", plan["paused_containers"]):
        wrong.append("paused_containers")
    if not isinstance(plan.get("run_image"), str) or not IMAGE_REFERENCE.fullmatch(plan["run_image"]):
        wrong.append("run_image")
    # The only commands a plan file brings to run are the container the plan builder wrote and its memory check.
    if not is_argv(plan.get("docker_run")) or plan["docker_run"][:2] != [DOCKER_CLIENT, "run"]:
        wrong.append("docker_run")
    gpus = is_argv(plan.get("docker_run")) and "--gpus" in plan["docker_run"]
    if plan.get("memory_probe") != memory_probe_argv(str(plan.get("run_image")), gpus, keeps_entrypoint(plan)):
        wrong.append("memory_probe")
    if not is_share(plan.get("gpu_memory_utilization")):
        wrong.append("gpu_memory_utilization")
    names = plan.get("served_names")
    if not isinstance(names, list) or not names or not all(isinstance(name, str) and name for name in names):
        wrong.append("served_names")
    if not is_count(plan.get("port")) or plan["port"] > 65535:
        wrong.append("port")
    if not is_timeout(plan.get("health_timeout")):
        wrong.append("health_timeout")
    if not isinstance(plan.get("launch_check"), dict):
        wrong.append("launch_check")
    if not cold_start_usable(plan.get("cold_start")):
        wrong.append("cold_start")
    if not start_bound_usable(plan.get("start_bound"), plan.get("unit")):
        wrong.append(f"start_bound (its starts and window, and its record {start_record(str(plan.get('unit')))})")
    if plan.get("cluster") is not None and not cluster_usable(plan["cluster"]):
        wrong.append("cluster (its rank, head, backend, host_ip and nodes, each with its rank and address)")
    return wrong


def gateway_unusable_keys(plan: t.Mapping[str, t.Any]) -> list[str]:
    """Each key of the gateway's unit plan that its gate reads and that is missing or not what the gateway role writes."""
    wrong = [] if plan.get("kind") == GATEWAY else ["kind"]
    wrong += [key for key in ("unit", "container") if not isinstance(plan.get(key), str) or not PLAN_NAME.fullmatch(plan[key])]
    if not isinstance(plan.get("url"), str) or not plan["url"].startswith("http://"):
        wrong.append("url")
    if not is_timeout(plan.get("health_timeout")):
        wrong.append("health_timeout")
    if not isinstance(plan.get("key_env"), str) or not ENV_NAME.fullmatch(plan["key_env"]):
        wrong.append("key_env")
    return wrong


def start_record(unit: str, folder: str = START_LEDGER_DIR) -> str:
    """Where a unit's counted starts are kept."""
    return f"{folder}/{unit}.json"


def start_bound_usable(bound: t.Any, unit: t.Any) -> bool:
    # The record's path is the one file the start door writes from a plan file: only the unit's own under START_LEDGER_DIR.
    return (isinstance(bound, dict) and all(is_count(bound.get(key)) for key in ("starts", "window"))
            and isinstance(unit, str) and bound.get("path") == start_record(unit))


def cold_start_usable(cold_start: t.Any) -> bool:
    if not isinstance(cold_start, dict) or not is_absolute_path(cold_start.get("stamp")):
        return False
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (cold_start.get(key) for key in ("timeout", "restarts", "restart_window"))):
        return False
    return is_share(cold_start.get("kv_cache_warn_share"))


def cluster_usable(cluster: t.Any) -> bool:
    if not isinstance(cluster, dict) or not is_whole(cluster.get("rank")) or not isinstance(cluster.get("head"), bool):
        return False
    # The backend decides the order the head's watchdog restarts the ranks in (_cluster_sequence).
    if cluster.get("backend") not in BACKENDS:
        return False
    nodes = cluster.get("nodes")
    return (address(cluster.get("host_ip")) is not None and isinstance(nodes, list) and bool(nodes)
            and all(isinstance(node, dict) and is_whole(node.get("rank")) and address(node.get("address")) is not None for node in nodes))


def address(text: t.Any) -> str | None:
    """An IP address's one spelling, or None when ``text`` is none."""
    try:
        return str(ipaddress.ip_address(text)) if isinstance(text, str) else None
    except ValueError:
        return None


def is_whole(value: t.Any) -> bool:
    """A whole number, zero or more (a rank, a count of requests): never a bool, which Python counts as an int."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_count(value: t.Any) -> bool:
    """A whole number above zero."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def is_timeout(value: t.Any) -> bool:
    """Seconds to wait: a number above zero."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def is_share(value: t.Any) -> bool:
    """A memory share as the plan writes it: a number in (0, 1]."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


def is_absolute_path(value: t.Any) -> bool:
    return isinstance(value, str) and value.startswith("/") and ".." not in value.split("/")


def is_argv(value: t.Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(part, str) for part in value) and value[0].startswith("/")
