# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host runtime: the door every start of a vLLM instance or rank passes, whoever causes it (Ansible's relaunch,
a boot, systemd's restart, the watchdog's restart), because the unit's own commands run it.

- ``start`` (the unit's ExecStart): reads the unit's plan file (_plan_file, the one reader every program uses), drops
  the page cache (seed 002: on a unified pool it counts against the memory vLLM finds free), stops the other programs'
  GPU-holding containers the plan names (seed 002: nvidia_gpu_exporter holds about 9 GiB), refuses a stray holder of
  the GPU's device nodes and a memory share the pinned image's vLLM would refuse (_launch_checks), logging each figure
  in the unit's journal; then it becomes the plan's ``docker run``. A refusal is one journal line with the figures and
  the fix, a record the readiness wait and the health gate read, and exit status REFUSED, which the unit lists in
  RestartPreventExitStatus: a refused start is not retried in a loop.
- ``ready`` (ExecStartPost): the readiness wait, judged by _vllm_health as the health gate judges, with the KV cache
  compared with the best good start; the paused containers start again afterwards, whatever its outcome.
- ``release`` (ExecStopPost): the paused containers start again when the start ended before its readiness wait did.

Standard library only, and only RUNTIME_MODULES among the collection's files: these same files (not copies) live in
one place per host, under RUNTIME_DIR beside the entry script, the watchdog's daemon and the ranks' fabric wait, which
import them (serving_host installs them, and the watchdog role on a host that serves nothing), so the modules and the
host run one code.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import http.client
import json
import os
import subprocess
import sys
import time
import typing as t
import urllib.parse

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT, PACKAGE, RUNTIME_DIR
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, inspect_container, show_units, started_at, state_of
from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import (
    DEVICE_NODES,
    GIB,
    device_holders,
    holders_problem,
    memory_problem,
    open_files,
    probe_figures,
    process_cgroup,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import START_LEDGER_DIR, PlanFileError, read_plan, start_record
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import (
    POLL_INTERVAL,
    Reply,
    capacity_check,
    container_snapshot,
    exception_reply,
    mark_warm,
    parse_env_file,
    start_timeout,
    wait_until_ready,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import INSTANCE_LABEL

ENTRY = f"{RUNTIME_DIR}/sparkfleet_runtime.py"
ENTRY_SOURCE = "roles/serving_host/files/sparkfleet_runtime.py"
# What the host's programs import of the collection (this file, the watchdog's daemon, the ranks' fabric wait): a unit
# test keeps the list closed under their imports.
RUNTIME_MODULES = ("_cluster_sequence", "_diagnose", "_fabric", "_files", "_gateway_routes", "_host_paths", "_host_runtime", "_image_kinds",
                   "_host_state", "_launch_checks", "_plan_file", "_settings", "_vllm_health", "_vllm_instance", "_watchdog")
# Which unit stopped which container for its start: kept on disk, because a container stopped before a reboot is started
# again only by the release of a unit that stopped it.
PAUSED_LEDGER = "/var/lib/sparkfleet/paused-containers.json"
# A refused start's reason, per container, for the readiness wait and the health gate; gone with a reboot.
REFUSALS_DIR = "/run/sparkfleet/admission"
# The longest a start's door may take before its container runs: a rank's fabric wait (120 s), the memory probe's own
# bound (130 s), the listed containers stopped (30 s each), then docker creating the container of an image it holds.
DOOR_TIMEOUT = 600
DROP_CACHES = "/proc/sys/vm/drop_caches"
# The runtime's own records (ledger, counted starts, refusals): root's alone, as mkstemp makes them.
RECORD_MODE = 0o600
# sysexits' EX_CONFIG: the unit's RestartPreventExitStatus, so systemd does not restart a refused start.
REFUSED = 78

Runner = t.Callable[[list[str]], tuple[int, str, str]]
Log = t.Callable[[str], None]


def runtime_files() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(folders, files) of the runtime as host_files installs them, each file with its source in the collection."""
    folders = [RUNTIME_DIR]
    for part in PACKAGE.split("/"):
        folders.append(f"{folders[-1]}/{part}")
    files = [{"path": ENTRY, "mode": "0644", "source": ENTRY_SOURCE}]
    files += [{"path": f"{folders[-1]}/{name}.py", "mode": "0644", "source": f"plugins/module_utils/{name}.py"} for name in RUNTIME_MODULES]
    return [{"path": folder, "mode": "0755"} for folder in folders], files


@contextlib.contextmanager
def ledger(path: str) -> t.Iterator[dict[str, list[str]]]:
    """The paused containers' ledger ({container: units whose start stopped it}), locked while it is read, changed and
    written back; OSError when it cannot be kept (a full or read-only disk), before anything acted on it."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(path + ".lock", "a", encoding="ascii") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as handle:
                found = json.load(handle)
        except (FileNotFoundError, ValueError):
            found = {}
        entries = {str(name): [str(unit) for unit in units] for name, units in found.items() if isinstance(units, list)} if isinstance(found, dict) else {}
        yield entries
        write_atomically(path, json.dumps(entries, sort_keys=True) + "\n", RECORD_MODE)


def running_record(name: str, run: Runner) -> dict[str, t.Any] | None:
    """Docker's record of the container of exactly that name while it runs; None when none runs (or Docker does not answer)."""
    try:
        record = inspect_container(run, name, DOCKER_CLIENT)
    except StateUnanswered:
        return None
    return record if state_of(record).get("Running") is True else None


def running(name: str, run: Runner) -> bool:
    """Whether a container runs under exactly that name."""
    return running_record(name, run) is not None


def running_ids(names: t.Iterable[str], run: Runner) -> list[str]:
    """The ids of those of the containers named that run."""
    records = [running_record(name, run) for name in names]
    return [record["Id"] for record in records if record is not None and isinstance(record.get("Id"), str)]


def pause(unit: str, names: t.Sequence[str], run: Runner, log: Log, ledger_path: str = PAUSED_LEDGER) -> tuple[list[str], list[str]]:
    """Stop those of ``names`` that run, for ``unit``'s start; one another unit's start stopped stays stopped for this one
    too. Each is recorded before it is stopped, so one the ledger cannot record is not stopped. Returns (the ones stopped
    now, the problems); nothing more is stopped after the first problem, which names what was stopped before it."""
    stopped: list[str] = []
    try:
        with ledger(ledger_path) as entries:
            for name in names:
                held = entries.get(name, [])
                # Recorded as stopped for another start, it may have been started again since (by hand, by its restart policy).
                if running(name, run):
                    entries[name] = sorted({*held, unit})
                    write_atomically(ledger_path, json.dumps(entries, sort_keys=True) + "\n", RECORD_MODE)
                    rc, out, err = run([DOCKER_CLIENT, "stop", "--time", "30", name])
                    if rc != 0:
                        if held:
                            entries[name] = held
                        else:
                            del entries[name]
                        return stopped, [f"{name} could not be stopped for the start: {(err or out).strip()[-200:]}"]
                    stopped.append(name)
                    log(f"{name} stopped for the start")
                elif held:
                    entries[name] = sorted({*held, unit})
                    log(f"{name} stays stopped for this start (stopped for {', '.join(entries[name])})")
    except OSError as error:
        done = f"{', '.join(stopped)} stopped for the start before it failed" if stopped else "nothing was stopped"
        return stopped, [f"{ledger_path}: the ledger of the containers stopped for starts cannot be written ({error.strerror}), so {done}; "
                         "free the disk"]
    return stopped, []


def release(unit: str, run: Runner, log: Log, ledger_path: str = PAUSED_LEDGER) -> list[str]:
    """Start again each container only ``unit``'s start still held stopped; the problems."""
    problems = []
    with ledger(ledger_path) as entries:
        for name in [name for name, units in entries.items() if unit in units or not units]:
            entries[name] = [other for other in entries[name] if other != unit]
            if entries[name]:
                continue
            rc, out, err = run([DOCKER_CLIENT, "start", name])
            if rc == 0:
                del entries[name]
                log(f"{name} started again")
            else:
                # Kept, with no unit left holding it, so the next release of any start tries again.
                problems.append(f"{name}, stopped for the start, could not be started again: {(err or out).strip()[-200:]}; start it by hand")
    return problems


def drop_page_cache(run: Runner, path: str = DROP_CACHES) -> str | None:
    run(["/usr/bin/sync"])
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write("3\n")
    except OSError as error:
        return f"{path}: the page cache cannot be dropped ({error.strerror})"
    return None


def memory_line(share: float, figures: dict[str, t.Any]) -> str:
    return (f"memory: {figures['figure']} {figures['free'] / GIB:.2f} GiB free, gpu_memory_utilization {share} of "
            f"{figures['total'] / GIB:.2f} GiB wants {share * figures['total'] / GIB:.2f} GiB: admitted")


def admit(plan: t.Mapping[str, t.Any], run: Runner, log: Log, ledger_path: str = PAUSED_LEDGER, drop_caches_path: str = DROP_CACHES,
          device_nodes: t.Sequence[str] = DEVICE_NODES,
          processes: t.Callable[[], t.Iterable[tuple[int, str, t.Sequence[str]]]] = open_files,
          cgroup_of: t.Callable[[int], str] = process_cgroup) -> list[str]:
    """Prepare and check the start of the plan's unit, logging each step; every reason it must not start (then the
    containers stopped for it run again). A cluster's rank pauses nothing: its role stops and starts them around the
    cluster's relaunch, since a worker has no readiness wait to start them again after."""
    problems = []
    if plan["drop_caches"]:
        problem = drop_page_cache(run, drop_caches_path)
        problems += [problem] if problem else []
        log(problem or "page cache dropped")
    else:
        log("page cache kept (vllm_drop_caches is off for this host)")
    if not problems and plan["paused_containers"] and not plan.get("cluster"):
        problems += pause(plan["unit"], plan["paused_containers"], run, log, ledger_path)[1]
    if not problems and plan["memory_admission"]:
        problems += device_and_memory(plan, run, log, 0.0, device_nodes, processes, cgroup_of)
    if problems and plan["paused_containers"] and not plan.get("cluster"):
        problems += released(plan["unit"], run, log, ledger_path)
    return problems


def device_and_memory(plan: t.Mapping[str, t.Any], run: Runner, log: Log, held_share: float | None,
                      device_nodes: t.Sequence[str] = DEVICE_NODES,
                      processes: t.Callable[[], t.Iterable[tuple[int, str, t.Sequence[str]]]] = open_files,
                      cgroup_of: t.Callable[[int], str] = process_cgroup, pausing: t.Sequence[str] = ()) -> list[str]:
    """The stray holders of the GPU's device nodes and the memory the image's vLLM will read, each logged. Checked
    before the unit's own running engine stops, its stop gives back ``held_share`` of the total (its last good
    settings' share), which the free figure is credited with; None: what it gives back is not known, so the memory is
    left to the start's own admission. ``pausing``: the ids of the containers the start will stop, which may hold the
    device nodes until then."""
    problems = []
    rc, out, err = run([DOCKER_CLIENT, "ps", "--quiet", "--no-trunc", "--filter", f"label={INSTANCE_LABEL}"])
    holders = holders_problem(plan["name"], device_holders(processes(), device_nodes), [*out.split(), *pausing], cgroup_of) if rc == 0 else (
        f"{plan['name']}: docker ps did not answer ({(err or out).strip()[-200:]}), so the collection's own holders of the "
        "GPU cannot be told from strays; check the Docker daemon")
    problems += [holders] if holders else []
    log(holders or f"no stray holder of {', '.join(device_nodes)}")
    if held_share is None:
        log("memory: judged at the start, once the running engine stopped (what it gives back is not known)")
        return problems
    share = float(plan["gpu_memory_utilization"])
    figures = probe_figures(*run(list(plan["memory_probe"])))
    if isinstance(figures, dict) and held_share:
        given_back = int(held_share * figures["total"])
        figures = {**figures, "free": figures["free"] + given_back,
                   "figure": f"{figures['figure']} with the {given_back / GIB:.2f} GiB its running engine gives back at its stop"}
    memory = memory_problem(plan["name"], share, figures)
    problems += [memory] if memory else []
    if not memory:
        log(memory_line(share, t.cast(dict, figures)))
    return problems


def before_stop(plan: t.Mapping[str, t.Any], run: Runner, held_share: float | None,
                processes: t.Callable[[], t.Iterable[tuple[int, str, t.Sequence[str]]]] = open_files,
                cgroup_of: t.Callable[[int], str] = process_cgroup, drop_caches_path: str = DROP_CACHES) -> list[str]:
    """What would refuse the start of the plan's unit and stays whether the running unit stops or not, asked before a
    relaunch stops it (the start's admission asks again): the stray holders of the device nodes, and the memory with
    what the running engine gives back. The containers a single instance's start will pause may hold the device until
    then, and what they give back is not known here, so while one runs the memory is left to the start. Nothing but the
    page cache (dropped before the memory is read, as the start drops it) is changed."""
    if not plan.get("memory_admission"):
        return []
    pausing = [] if plan.get("cluster") else running_ids(plan["paused_containers"], run)
    held = None if pausing else held_share
    # The start drops the page cache before its memory check (seed 002): so does this one, or it would read less free
    # memory than the start will, and refuse what the start admits.
    problem = drop_page_cache(run, drop_caches_path) if held is not None and plan["drop_caches"] else None
    checked = device_and_memory(plan, run, lambda _line: None, held, DEVICE_NODES, processes, cgroup_of, pausing)
    return ([problem] if problem else []) + checked


def released(unit: str, run: Runner, log: Log, ledger_path: str = PAUSED_LEDGER) -> list[str]:
    """release, with a ledger that cannot be read or written as one more problem."""
    try:
        return release(unit, run, log, ledger_path)
    except OSError as error:
        return [f"{ledger_path}: the ledger of the containers stopped for starts cannot be kept ({error.strerror}); "
                "start them by hand (docker start)"]


def refusal_path(container: str, folder: str = REFUSALS_DIR) -> str:
    return f"{folder}/{container}.json"


def record_refusal(container: str, reason: str, invocation: str, folder: str = REFUSALS_DIR) -> None:
    os.makedirs(folder, mode=0o755, exist_ok=True)
    write_atomically(refusal_path(container, folder), json.dumps({"invocation": invocation, "refused": reason}) + "\n", RECORD_MODE)


def clear_refusal(container: str, folder: str = REFUSALS_DIR) -> None:
    """Forget a refusal before a start whose outcome a gate will read."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(refusal_path(container, folder))


def refusal(container: str, invocation: str | None = None, folder: str = REFUSALS_DIR) -> str | None:
    """The reason the admission refused the container's start (of that unit invocation when one is given), or None."""
    try:
        with open(refusal_path(container, folder), encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("refused"), str):
        return None
    if invocation is not None and found.get("invocation") != invocation:
        return None
    return "the start was refused: " + found["refused"]


class DoorNotPassed(Exception):
    """A unit's start did not get its container started; the message says why, or where to read why."""


def await_door(plan: t.Mapping[str, t.Any], run: Runner, since: float, refusals_dir: str = REFUSALS_DIR, timeout: float = DOOR_TIMEOUT,
               clock: t.Callable[[], float] = time.monotonic, sleep: t.Callable[[float], None] = time.sleep) -> None:
    """Return once the start asked at ``since`` (seconds since the epoch) passed the unit's door: a container of the unit
    started after it (how it serves then is the readiness wait's or the cluster head's gate's to judge). DoorNotPassed
    with the admission's refusal, the unit failing before its container started, or no verdict within ``timeout``. A
    cluster's worker rank has no readiness wait of its own: whoever starts the cluster's ranks (the cluster role, the
    head's watchdog) waits here before the next ones, so a refusal is named at once, not by a gate's timeout."""
    deadline = clock() + timeout
    cluster = plan.get("cluster") or {}
    where = f"rank {cluster.get('rank')} of cluster {plan['name']} ({plan['unit']})" if cluster else f"instance {plan['name']} ({plan['unit']})"
    while True:
        refused = refusal(plan["container"], folder=refusals_dir)
        if refused:
            raise DoorNotPassed(f"{where}: {refused}")
        try:
            started = started_at(state_of(inspect_container(run, plan["container"])).get("StartedAt"))
            if started is not None and started >= since:
                return
            unit = show_units(run, [plan["unit"]], ("ActiveState", "Job"))[plan["unit"]]
        except StateUnanswered as error:
            raise DoorNotPassed(f"{where}: {error}") from error
        if unit["ActiveState"] == "failed":
            raise DoorNotPassed(f"{where} failed before its container started: `journalctl -u {plan['unit']}` on the node says why")
        # No start job left: systemd will not start this container any more.
        settled = unit["Job"] in ("", "0")
        if settled and unit["ActiveState"] == "inactive":
            raise DoorNotPassed(f"{where}: systemd ended the start without running the unit (a dependency failed?): "
                                f"`systemctl status {plan['unit']}` on the node says why")
        if settled and unit["ActiveState"] == "active" and started is not None:
            raise DoorNotPassed(f"{where}: the unit still runs the container of a start before this one (its stop did not end it), "
                                "so this start did nothing: stop the unit, then start it")
        if clock() >= deadline:
            raise DoorNotPassed(f"{where}: its container did not start within {int(timeout)} s of the start (the fabric wait and the "
                                f"admission come first): `journalctl -u {plan['unit']}` on the node says where it stands")
        sleep(POLL_INTERVAL)


def run_command(argv: list[str]) -> tuple[int, str, str]:
    try:
        completed = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        return 127, "", str(error)
    return completed.returncode, completed.stdout, completed.stderr


def say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def counted_start(unit: str, bound: t.Mapping[str, t.Any], now: float, ledger_dir: str = START_LEDGER_DIR) -> str | None:
    """Record one more start of the unit before it acts; why it must not start: the bound is reached (the starts within
    the window, each recorded by whichever starter), or the record cannot be kept (a full or read-only disk: a start
    nobody counted could repeat without end)."""
    path = start_record(unit, ledger_dir)
    try:
        try:
            with open(path, encoding="utf-8") as handle:
                found = json.load(handle)
        except (FileNotFoundError, ValueError):
            found = []
        # A start recorded "later" than now (the clock stepped back) still counts.
        recent = [moment for moment in found if isinstance(moment, (int, float)) and now - bound["window"] < moment] \
            if isinstance(found, list) else []
        if len(recent) >= bound["starts"]:
            return (f"{len(recent)} starts within the last {bound['window']} s already, the bound on its starts whoever causes "
                    "them (vllm_start_limit_burst); look at its journal, fix the cause, then re-apply site.yml, which relaunches it")
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        write_atomically(path, json.dumps([*recent, now]) + "\n", RECORD_MODE)
    except OSError as error:
        return f"{path}: the start cannot be counted ({error.strerror}), so it is not made; free the disk"
    return None


def clear_starts(unit: str, ledger_dir: str = START_LEDGER_DIR) -> None:
    """Forget the unit's counted starts: a person relaunched it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(start_record(unit, ledger_dir))


def start(plan: t.Mapping[str, t.Any], run: Runner = run_command, log: Log = say, invocation: str = "",
          clock: t.Callable[[], float] = time.time, ledger_dir: str = START_LEDGER_DIR) -> int:
    """The unit's ExecStart: count the start, admit it, then become the plan's docker run; REFUSED with one line naming
    the figures or the bound."""
    with contextlib.suppress(OSError):
        clear_refusal(plan["container"])
    try:
        over = counted_start(plan["unit"], plan["start_bound"], clock(), ledger_dir)
        problems = [over] if over else admit(plan, run, log)
        if not problems:
            sys.stdout.flush()
            os.execv(plan["docker_run"][0], plan["docker_run"])
    except Exception as error:  # noqa: BLE001 - whatever stops the door, the readiness wait must hear of it at once
        problems = [f"the start could not run ({type(error).__name__}: {error})"]
        if plan["paused_containers"] and not plan.get("cluster"):
            problems += released(plan["unit"], run, log)
    reason = " | ".join(problems)
    log(f"start of {plan['name']} refused, not retried: {reason}")
    with contextlib.suppress(OSError):
        record_refusal(plan["container"], reason, invocation)
    return REFUSED


def http_get(url: str, api_key: str | None, timeout: float = 5) -> Reply:
    """One GET of the instance's own URL, as the gate asks it (the host runtime needs no more HTTP than this)."""
    parts = urllib.parse.urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
        try:
            connection.request("GET", parts.path or "/", headers={"Authorization": "Bearer " + api_key} if api_key else {})
            response = connection.getresponse()
            return Reply(response.status, response.read().decode("utf-8", "replace"))
        finally:
            connection.close()
    except (OSError, ValueError, http.client.HTTPException) as error:
        return exception_reply(error)


def inspect(container: str, run: Runner) -> dict[str, t.Any] | None:
    return container_snapshot(inspect_container(run, container, DOCKER_CLIENT))


def ready(plan: t.Mapping[str, t.Any], run: Runner = run_command, log: Log = say, invocation: str | None = None,
          fetch: t.Callable[[str, str | None], Reply] = http_get) -> int:
    """The unit's ExecStartPost: wait until the instance serves (the cold timeout while no start of its settings
    served on the image's caches), compare its KV cache with the best good start, stamp it warm; 0 once it serves."""
    cold_start = plan.get("cold_start") or {}
    timeout, cold = start_timeout(plan["health_timeout"], cold_start)
    try:
        with open(plan["env_path"], encoding="utf-8") as handle:
            api_key = parse_env_file(handle.read()).get("VLLM_API_KEY")
    except OSError as error:
        log(f"{plan['env_path']}: cannot be read ({error.strerror}); re-apply site.yml to this host")
        return 1
    url = plan["url"].rstrip("/")
    result = wait_until_ready(lambda: fetch(url + "/v1/models", api_key), lambda: inspect(plan["container"], run), plan["served_names"],
                              timeout, refusal=lambda: refusal(plan["container"], invocation))
    log(f"{plan['container']}: {'cold' if cold else 'warm'} start, {result['reason']} after {result['elapsed']} s")
    if not result["ok"]:
        return 1
    share = cold_start.get("kv_cache_warn_share")
    tokens, warning = capacity_check(fetch(url + "/metrics", api_key), cold_start["stamp"], share)
    log(f"{plan['container']}: " + (f"WARNING: {warning}" if warning else f"the KV cache holds {tokens:,} tokens" if tokens else
                                    "the KV cache size is not on its /metrics page"))
    try:
        mark_warm(cold_start["stamp"], tokens if share else None, degraded=bool(warning))
    except OSError as error:
        log(f"{cold_start['stamp']}: the warm stamp cannot be written ({error.strerror}); the next start waits the cold timeout")
    return 0


def main(argv: t.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkfleet_runtime", description="The start door of a sparkfleet.vllm unit.")
    parser.add_argument("command", choices=("start", "ready", "release"))
    parser.add_argument("--plan", required=True, help="the unit's plan file")
    args = parser.parse_args(argv)
    try:
        plan = read_plan(args.plan)
    except PlanFileError as error:
        say(str(error))
        return REFUSED if args.command == "start" else 1
    invocation = os.environ.get("INVOCATION_ID", "")
    if args.command == "start":
        return start(plan, invocation=invocation)
    # What the ledger holds for the unit, whatever its plan lists now; a cluster's rank leaves it to its role.
    pauses = not plan.get("cluster") and os.path.exists(PAUSED_LEDGER)
    if args.command == "release":
        problems = released(plan["unit"], run_command, say) if pauses else []
        for problem in problems:
            say(problem)
        return 1 if problems else 0
    try:
        return ready(plan, invocation=invocation)
    finally:
        for problem in released(plan["unit"], run_command, say) if pauses else []:
            say(problem)
