# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One planned serving unit on its host (a vLLM instance, a cluster's rank or the LiteLLM gateway), step by step:
its files written from the plan, each atomically with its mode, and why the running unit differs
from its plan, a unit that runs it enabled for boot (prepare); the unit stopped and its container removed (stop); the page cache
dropped, the memory admitted, the start limit cleared and the unit started (start); its last good
files restored (restore) or its files kept as the last good ones and the unit enabled (keep); a unit no longer planned
removed with its files (remove). A single instance's whole relaunch is one step (relaunch: under
the maintenance flag, stop, start and gate, and on a failed gate restore, start and gate the last
good files); a cluster's role orders stop and start across its nodes, gates its head and raises
and clears the flag around them (raise_flag, clear_flag). The gateway (kind ``gateway``) relaunches
the same way, without the flag (the watchdog watches the engines only) and without a memory share;
its gate waits for its model list, asked with its master key.

Private to the collection; the serving_unit module is its caller. Check mode is answered here:
the same comparison, nothing written, stopped or started. The env file holds the API key, so its
content never reaches a diff or a result.
"""

from __future__ import annotations

import json
import os
import time
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem, read_file, sync_files, write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import (
    PAUSED_LEDGER,
    REFUSALS_DIR,
    DoorNotPassed,
    await_door,
    before_stop,
    clear_refusal,
    clear_starts,
    running,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import pause as host_pause
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import release as host_release
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, inspect_container, show_units, started_at
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import (
    GATEWAY,
    INSTANCE,
    PlanFileError,
    parsed_plan,
    read_plan,
    schema_version,
    unusable_keys_of,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import path_problem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import UNIT_PROPERTIES
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import read_endpoint
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_gate import Endpoint, gate
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import is_warm, mark_warm, parse_env_file
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import unjudged_mark
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import STAMP_PATH, drift_reasons

# What each of the plan's kept_files holds, in their order.
FILE_KINDS = ("env", "plan", "unit")
# A rewritten env file or unit makes the running unit stale. The plan file drives each start (the host runtime reads
# it), but its container's settings are the config hash's, whose drift is read from the running container.
RELAUNCHING_KINDS = frozenset(("env", "unit"))
# What a rollback puts back. The gateway's env file holds the backends' keys, which belong to the
# backends (relaunched on new keys before the gateway) and to its routing (gateway_route's, written
# for the new plan): its rollback puts back its unit, on the keys and routing of now.
ROLLED_BACK_KINDS = {"instance": frozenset(FILE_KINDS), "gateway": frozenset(("plan", "unit"))}
SECRET_KINDS = frozenset(("env",))
HIDDEN = "(the env file holds the API key; its content is not shown)\n"
STEPS = ("prepare", "admit", "stop", "start", "restore", "keep", "last_good", "hold", "remove", "relaunch", "roll_back", "raise_flag",
         "clear_flag", "pause", "resume")

Runner = t.Callable[[list[str]], tuple[int, str, str]]


class UnitError(FileProblem):
    """What stopped the unit's state from being read or changed, with the fix; its files' problems
    are FileProblem, the base class, so ``except FileProblem`` catches both."""


# What a plan's key holds, where its name alone would not say how the plan builder writes it.
WHAT_KEYS_HOLD = {
    "memory_probe": "memory_probe (the memory check the plan builder writes for the plan's run_image)",
    "cold_start": "cold_start (its timeout, restarts, restart window and the warm stamp under the cache folder's jit/<image>/warm/)",
    "maintenance_flag": "maintenance_flag (the absolute path the vllm role plans as vllm_maintenance_flag)",
    "paused_containers": "paused_containers (other programs' containers, as vllm_launch_paused_containers lists them)",
}
# Read by the transaction alone (drift, the unjudged mark, the unit it writes), whatever the unit's kind.
TRANSACTION_KEYS = ("name", "run_image", "unit_file", "config_hash")
GIVE_THE_PLAN = ("give the plan its role built (one of __vllm_plan.instances, the cluster role's node plan, or "
                 "__gateway_plan.serving_unit)")


def plan_problem(plan: t.Any) -> str | None:
    """Why ``plan`` is not one planned instance, rank or gateway of this release (None: it is): the keys the one plan-file
    reader requires of its kind's file, and what only the transaction reads (its unit file, hash and kept files)."""
    kind = plan_kind(plan) if isinstance(plan, dict) else INSTANCE
    if not isinstance(plan, dict) or plan.get("schema_version") != schema_version(kind):
        version = plan.get("schema_version") if isinstance(plan, dict) else None
        return (f"plan: schema_version {version!r}, while this release reads {schema_version(kind)}; {GIVE_THE_PLAN}, not a "
                "plan file of another release")
    missing = unusable_keys_of(plan, kind)
    missing += [key for key in TRANSACTION_KEYS if key not in missing and not (isinstance(plan.get(key), str) and plan[key])]
    if kind == INSTANCE and "cold_start" not in missing and not STAMP_PATH.fullmatch(plan["cold_start"]["stamp"]):
        missing.append("cold_start")
    missing = [WHAT_KEYS_HOLD.get(key, key) for key in missing]
    kept = plan.get("kept_files")
    if missing or not isinstance(kept, list) or len(kept) != len(FILE_KINDS) or not all(
            isinstance(entry, dict) and all(str(entry.get(key, "")).startswith("/") for key in ("path", "last_good"))
            and entry.get("mode") in ("0600", "0644") for entry in kept):
        shown = ", ".join(missing) if missing else "kept_files (env, plan and unit: absolute path, last good path and mode each)"
        return f"plan: lacks {shown}; {GIVE_THE_PLAN}"
    return None


def is_gateway(plan: t.Mapping[str, t.Any]) -> bool:
    return plan.get("kind") == GATEWAY


def plan_kind(plan: t.Mapping[str, t.Any]) -> str:
    """The kind of plan file the one reader reads for the unit."""
    return GATEWAY if is_gateway(plan) else INSTANCE


def noun(plan: t.Mapping[str, t.Any]) -> str:
    return "gateway" if is_gateway(plan) else "instance"


def rolled_back(plan: t.Mapping[str, t.Any]) -> list[tuple[str, dict[str, t.Any]]]:
    """(kind, kept file) of each file a rollback puts back and a gated relaunch keeps."""
    kinds = ROLLED_BACK_KINDS[noun(plan)]
    return [(kind, kept) for kind, kept in zip(FILE_KINDS, plan["kept_files"], strict=True) if kind in kinds]


def plan_text(plan: t.Mapping[str, t.Any]) -> str:
    """The plan file: the plan as JSON, keys sorted, as the roles wrote it with to_nice_json before."""
    return json.dumps(plan, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def planned_files(plan: t.Mapping[str, t.Any], env_text: str) -> list[dict[str, t.Any]]:
    """Each file of the unit: kind, path, mode and content (bytes)."""
    contents = {"env": env_text, "plan": plan_text(plan), "unit": plan["unit_file"]}
    return [unit_file(kind, kept["path"], kept["mode"], contents[kind].encode("utf-8"))
            for kind, kept in zip(FILE_KINDS, plan["kept_files"], strict=True)]


def unit_file(kind: str, path: str, mode: str, content: bytes) -> dict[str, t.Any]:
    """One of the unit's files as sync_files takes it, its content hidden from diffs when it holds the key."""
    return {"label": kind, "path": path, "mode": int(mode, 8), "content": content, "hidden": HIDDEN if kind in SECRET_KINDS else None}


def unit_state(run: Runner, unit: str) -> dict[str, str]:
    """The unit's LoadState, ActiveState and UnitFileState as systemd reports them (not-found, inactive
    and empty for a unit it does not know)."""
    try:
        return show_units(run, [unit], UNIT_PROPERTIES)[unit]
    except StateUnanswered as error:
        raise UnitError(str(error)) from error


def container_state(run: Runner, container: str) -> dict[str, t.Any] | None:
    """Docker's inspect data of the container, None when there is no such container."""
    try:
        return inspect_container(run, container)
    except StateUnanswered as error:
        raise UnitError(str(error)) from error


def prepare(plan: t.Mapping[str, t.Any], env_text: str, check_mode: bool, run: Runner) -> dict[str, t.Any]:
    """Bring the unit's files to its plan and say why the running unit is not the plan (drift). A
    unit that runs its plan is enabled so it starts at boot (its order among the host's units is in
    the unit files); a single instance's also keeps its files as the last good settings. A unit that
    drifts is enabled and kept only once its relaunch passed the gate (a cluster's ranks once the
    head passed it: step keep), so a first launch that fails never starts at boot. In check mode
    nothing is written and the answer is the same (``enabled``: the unit is not enabled yet)."""
    # Read before anything is written, so a host whose systemd or Docker cannot answer is left as it was.
    state = unit_state(run, plan["unit"])
    container = container_state(run, plan["container"])
    synced = sync_files(planned_files(plan, env_text), check_mode)
    relaunching = bool(RELAUNCHING_KINDS.intersection(synced["content"]))
    drift = drift_reasons(plan, relaunching, state["ActiveState"], container) + routing_drift(plan, container)
    enabling = state["UnitFileState"] != "enabled"
    kept: dict[str, t.Any] = {"changed": False, "written": []}
    unjudged = read_unjudged(plan)
    if not drift and not check_mode:
        if enabling:
            enable(plan["unit"], run)
        # A check run wrote none of the files it reported, so it has nothing new to keep; a rank's
        # files are kept only once its cluster's head passed the gate; settings nobody judged, never.
        if not plan.get("cluster") and unjudged is None:
            kept = keep(plan, False)
    return {"changed": bool(synced["content"] or synced["metadata"]) or kept["changed"] or (enabling and not drift),
            "written": synced["content"], "fixed": synced["metadata"], "enabled": enabling, "kept": kept["written"],
            "drift": drift, "unit_state": state, "diff": synced["diff"],
            "unjudged": unjudged_report(plan, unjudged, drift) if unjudged is not None else None,
            # Whether a start of these settings served on the image's caches here (a cluster's gate is cold when any node lacks it).
            "warm": is_warm((plan.get("cold_start") or {}).get("stamp"))}


def routing_drift(plan: t.Mapping[str, t.Any], container: t.Mapping[str, t.Any] | None) -> list[str]:
    """The gateway reads its routing at start only: routing written after its container started (a run
    cut short before the relaunch, a drain whose restart failed) is not served yet."""
    routing = plan.get("routing_file")
    started = started_at((container or {}).get("State", {}).get("StartedAt")) if routing else None
    try:
        written = os.stat(routing).st_mtime if started is not None else None
    except OSError:
        return []
    return [f"its routing ({routing}) changed after its container started"] if written is not None and written > started else []


def enable(unit: str, run: Runner) -> None:
    """Enable the unit so it starts at boot (a no-op for one already enabled)."""
    rc, out, err = run(["systemctl", "enable", "--", unit])
    if rc != 0:
        raise UnitError(f"systemctl enable {unit} exited {rc}: {err.strip() or out.strip()}; a unit of that name masked, "
                        "transient or generated outside the collection blocks it (systemctl unmask, or remove the other unit)")


def stop(plan: t.Mapping[str, t.Any], check_mode: bool, run: Runner) -> dict[str, t.Any]:
    """Stop the unit (systemd reads its unit file again first) and remove its container: one left
    from the stopped run, or started by hand, would look like a failed start to the gate."""
    if not check_mode:
        checked(run, ["systemctl", "daemon-reload"])
    state = unit_state(run, plan["unit"])
    running = state["ActiveState"] not in ("inactive", "failed")
    if not check_mode and (running or state["LoadState"] != "not-found"):
        checked(run, ["systemctl", "stop", plan["unit"]])
    # Read after the stop: a unit restarting on its own may have created it meanwhile.
    container = container_state(run, plan["container"])
    if not check_mode and container is not None:
        checked(run, ["docker", "rm", "--force", plan["container"]])
    return {"changed": running or container is not None, "unit_state": state}


def start(plan: t.Mapping[str, t.Any], check_mode: bool, run: Runner, refusals_dir: str = REFUSALS_DIR) -> dict[str, t.Any]:
    """Clear the start limit and the host runtime's count of starts (a deliberate relaunch is a person acting, not a crash
    loop) and the last start's refusal, and start the unit without waiting for it to serve: the gate waits. An instance's
    or a rank's unit admits its own start (the host runtime drops the page cache, stops the GPU holders the plan names and
    checks the memory, at every start); a cluster rank's start returns once its door passed (the host runtime's
    await_door), as the head's watchdog's restart of the cluster does, so the ranks after a refused one are not started."""
    if check_mode:
        return {"changed": True}
    clear_refusal(plan["container"], refusals_dir)
    if plan.get("start_bound"):
        clear_starts(plan["unit"])
    rc, out, err = run(["systemctl", "reset-failed", plan["unit"]])
    if rc != 0 and "not loaded" not in err + out:
        raise UnitError(f"systemctl reset-failed {plan['unit']} exited {rc}: {err.strip() or out.strip()}")
    asked = time.time()
    checked(run, ["systemctl", "start", "--no-block", plan["unit"]])
    if plan.get("cluster"):
        try:
            await_door(plan, run, asked, refusals_dir)
        except DoorNotPassed as error:
            raise UnitError(str(error)) from error
    return {"changed": True}


def restore(plan: t.Mapping[str, t.Any], check_mode: bool, run: Runner, keep_mark: bool = False) -> dict[str, t.Any]:
    """Put the last good files back (systemd reads the restored unit at once); ``restored`` is
    false, and nothing is touched, when the unit has no complete last good copy. ``keep_mark``: the
    running settings stay unjudged (a relaunch refused before its stop leaves them running)."""
    kept_files = rolled_back(plan)
    copies, unusable = last_good_copies(plan)
    if copies is None:
        return {"changed": False, "restored": False, **({"unusable": unusable} if unusable else {})}
    files = [unit_file(kind, kept["path"], kept["mode"], copy[0]) for (kind, kept), copy in zip(kept_files, copies, strict=True)]
    synced = sync_files(files, check_mode)
    if not check_mode:
        checked(run, ["systemctl", "daemon-reload"])
    cleared = False if keep_mark else clear_unjudged(plan, check_mode)
    return {"changed": bool(synced["content"] or synced["metadata"]) or cleared, "restored": True, "written": synced["content"]}


def unjudged_path(plan: t.Mapping[str, t.Any]) -> str:
    """The unit's unjudged mark, on the host itself: a controller lost mid-batch knows nothing of it."""
    return unjudged_mark(os.path.dirname(plan["kept_files"][0]["last_good"]), plan["name"])


def hold(plan: t.Mapping[str, t.Any], check_mode: bool) -> dict[str, t.Any]:
    """Mark the unit as running settings nobody judged yet, before they start: until step keep or a restore clears it,
    prepare keeps no last good copy of them and reports the unit (a rollout stopped mid-batch, a host lost in one)."""
    marker = json.dumps({"config_hash": plan["config_hash"], "since": round(time.time())}, sort_keys=True) + "\n"
    synced = sync_files([unit_file("unjudged", unjudged_path(plan), "0600", marker.encode())], check_mode)
    return {"changed": bool(synced["content"])}


def read_unjudged(plan: t.Mapping[str, t.Any]) -> dict[str, t.Any] | None:
    """The unit's unjudged mark (config_hash and since: what started unjudged and when), None without one; a mark that is
    no JSON still marks the unit."""
    found = read_file(unjudged_path(plan))
    if found is None:
        return None
    try:
        mark = json.loads(found[0])
    except ValueError:
        mark = None
    if not isinstance(mark, dict):
        return {"config_hash": None, "since": None}
    return {"config_hash": mark.get("config_hash") if isinstance(mark.get("config_hash"), str) else None,
            "since": mark.get("since") if isinstance(mark.get("since"), int) and not isinstance(mark.get("since"), bool) else None}


def clear_unjudged(plan: t.Mapping[str, t.Any], check_mode: bool) -> bool:
    """Settings were judged (kept) or put back (restored): the mark goes. Whether there was one."""
    path = unjudged_path(plan)
    if not os.path.lexists(path):
        return False
    if not check_mode:
        try:
            os.unlink(path)
        except OSError as error:
            raise UnitError(f"{path}: the unjudged mark cannot be removed ({error.strerror}); run the task as root") from error
    return True


def unjudged_report(plan: t.Mapping[str, t.Any], mark: t.Mapping[str, t.Any], drift: t.Sequence[str]) -> str:
    """What an operator reads about a unit left unjudged, and what to do."""
    since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(mark["since"])) if mark.get("since") is not None else "an unknown time"
    running = "runs" if mark.get("config_hash") == plan["config_hash"] else "ran"
    outcome = ("its relaunch now keeps the plan's settings as the last good ones" if drift else
               "no last good copy is taken of them until they are judged")
    return (f"{plan['name']} {running} settings relaunched at {since} with their last good copy held (a rollout's) and never judged: "
            f"the rollout was stopped or lost its host before keeping or rolling them back; {outcome}. To judge them, put the "
            "settings before back in the inventory and run site.yml (its relaunch on them clears this), then roll the change out again")


def last_good_copies(plan: t.Mapping[str, t.Any]) -> tuple[list[t.Any] | None, str]:
    """The last good copy of each file a rollback puts back; None when one is missing, or, saying why, when the plan
    file's is one the one plan-file reader refuses for the unit's kind (damaged, or another release wrote it: restored,
    it would only be refused)."""
    kept_files = rolled_back(plan)
    copies = [read_file(kept["last_good"]) for _kind, kept in kept_files]
    if any(copy is None for copy in copies):
        return None, ""
    for (kind, kept), copy in zip(kept_files, copies, strict=True):
        if kind == "plan":
            try:
                parsed_plan(kept["last_good"], copy[0].decode("utf-8", "replace"), plan_kind(plan))
            except PlanFileError as error:
                return None, str(error)
    return copies, ""


def last_good(plan: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """Whether the unit has a complete last good copy to restore (read only): a cluster rolls back
    only when every rank has one."""
    copies, unusable = last_good_copies(plan)
    return {"changed": False, "complete": copies is not None, **({"unusable": unusable} if unusable else {})}


def keep(plan: t.Mapping[str, t.Any], check_mode: bool) -> dict[str, t.Any]:
    """Keep the unit's files, which just passed the gate, as its last good settings."""
    files = []
    for kind, kept in rolled_back(plan):
        current = read_file(kept["path"])
        if current is None:
            raise UnitError(f"{kept['path']}: missing, so it cannot be kept as the last good copy; re-run the play")
        files.append(unit_file(kind, kept["last_good"], kept["mode"], current[0]))
    synced = sync_files(files, check_mode)
    cleared = clear_unjudged(plan, check_mode)
    return {"changed": bool(synced["content"] or synced["metadata"]) or cleared, "written": synced["content"]}


def keep_gated(plan: t.Mapping[str, t.Any], check_mode: bool, run: Runner) -> dict[str, t.Any]:
    """A unit that passed its gate: its files kept as the last good settings, its settings stamped warm on the image's
    caches (a cluster's workers run no readiness wait that would), then the unit enabled so it starts at boot (step
    keep, and a relaunch once gated)."""
    kept = keep(plan, check_mode)
    stamp = (plan.get("cold_start") or {}).get("stamp")
    stamped = bool(stamp) and not is_warm(stamp)
    if stamped and not check_mode:
        try:
            mark_warm(stamp)
        except OSError as error:
            raise UnitError(f"{stamp}: the warm stamp cannot be written ({error.strerror}); run the task as root") from error
    if not check_mode:
        enable(plan["unit"], run)
    return {**kept, "changed": kept["changed"] or stamped, "stamped": stamped}


def removal_problem(removal: t.Any) -> str | None:
    if not isinstance(removal, dict) or not all(isinstance(removal.get(key), str) and removal[key] for key in ("name", "unit", "container")) \
            or not isinstance(removal.get("files"), list) or not all(isinstance(path, str) and path.startswith("/") for path in removal["files"]):
        return "plan: a removal needs name, unit, container and files (absolute paths), as vllm_removals and cluster_stale_ranks give them"
    return None


def remove(removal: t.Mapping[str, t.Any], check_mode: bool, run: Runner) -> dict[str, t.Any]:
    """Stop and disable the unit of an instance or rank no longer planned, remove its container
    and delete its files (key, plan, unit, last good copies); systemd then forgets the unit."""
    state = unit_state(run, removal["unit"])
    container = container_state(run, removal["container"])
    present = [path for path in removal["files"] if os.path.lexists(path)]
    diff = [{"before_header": path, "after_header": path, "before": "(present)\n", "after": "(removed)\n"} for path in present]
    if not check_mode:
        if state["LoadState"] != "not-found":
            checked(run, ["systemctl", "disable", "--now", removal["unit"]])
        if container is not None:
            checked(run, ["docker", "rm", "--force", removal["container"]])
        for path in present:
            try:
                os.unlink(path)
            except OSError as error:
                raise UnitError(f"{path}: cannot be removed ({error.strerror}); run the task as root (become: true)") from error
        if present:
            checked(run, ["systemctl", "daemon-reload"])
    changed = state["LoadState"] != "not-found" or container is not None or bool(present)
    return {"changed": changed, "removed": present, "unit_state": state, "diff": diff}


def raise_flag(flag: str, name: str, check_mode: bool) -> dict[str, t.Any]:
    """Tell the watchdog that the unit's stop is planned work: the flag names the unit."""
    content = f"{name}\n".encode()
    before = read_file(flag)
    if before is not None and before[0] == content:
        # A flag left by an interrupted run is stale to the watchdog, which judges by its age: raised anew, it is fresh.
        if not check_mode:
            try:
                os.utime(flag)
            except OSError as error:
                raise UnitError(f"{flag}: the maintenance flag cannot be refreshed ({error.strerror}); run the task as root") from error
        return {"changed": False}
    if not check_mode:
        try:
            os.makedirs(os.path.dirname(flag), mode=0o755, exist_ok=True)
            write_atomically(flag, content, 0o644)
        except OSError as error:
            raise UnitError(f"{flag}: the maintenance flag cannot be raised ({error.strerror}); run the task as root") from error
    return {"changed": True}


def clear_flag(flag: str, check_mode: bool) -> dict[str, t.Any]:
    if not os.path.lexists(flag):
        return {"changed": False}
    if not check_mode:
        try:
            os.unlink(flag)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise UnitError(f"{flag}: the maintenance flag cannot be cleared ({error.strerror}); run the task as root") from error
    return {"changed": True}


def gate_files(plan: t.Mapping[str, t.Any], run: Runner) -> dict[str, t.Any]:
    """The gate of the unit as its files on the host describe it: after a rollback these are the last
    good settings, gated with their own key, names and URL."""
    env, settings = (kept["path"] for kept in plan["kept_files"][:2])
    try:
        if is_gateway(plan):
            return gate(gateway_endpoint(env, settings), run, what="The gateway's gate")
        found = read_endpoint(env, settings, plan["name"])
    except ValueError as error:
        return {"ok": False, "reason": str(error), "msg": str(error)}
    return gate(Endpoint.of_instance(found), run, warmup=True)


def gateway_endpoint(env_path: str, plan_path: str) -> Endpoint:
    """The gateway as its files describe it: its URL, container and timeout from its unit's plan, its
    master key from its env file. LiteLLM lists its model groups once it answers; which of them are in
    rotation is the drained list's business, so the gate asks for none by name."""
    plan = read_plan(plan_path, kind=GATEWAY)
    env = read_file(env_path)
    if env is None:
        raise ValueError(f"gateway: {env_path} does not exist; re-apply the gateway role")
    return Endpoint(plan["url"], parse_env_file(env[0].decode("utf-8", "replace")).get(plan["key_env"]), [],
                    plan["container"], float(plan["health_timeout"]))


def held_share(plan: t.Mapping[str, t.Any], run: Runner) -> float | None:
    """The share of the memory the unit's running engine holds, which its stop gives back: none while its container does
    not run; its last good settings' share while it runs them; None (not known) when it runs settings never judged (a
    held relaunch's) or its last good plan file cannot be read."""
    container = container_state(run, plan["container"])
    if not container or not (container.get("State") or {}).get("Running"):
        return 0.0
    if read_unjudged(plan) is not None:
        return None
    kept_plan = dict(zip(FILE_KINDS, plan["kept_files"], strict=True))["plan"]
    try:
        return float(read_plan(kept_plan["last_good"])["gpu_memory_utilization"])
    except (PlanFileError, KeyError, TypeError, ValueError):
        return None


def admit(plan: t.Mapping[str, t.Any], run: Runner, check_mode: bool = False) -> dict[str, t.Any]:
    """Whether the unit's start would be refused for a reason its running engine's stop does not remove (the host
    runtime's before_stop), asked before anything of it is stopped; ``refusals`` lists them. Changes nothing; the
    start's own admission asks again. Check mode runs no container, so the memory's probe is left out."""
    if is_gateway(plan):
        return {"changed": False, "refusals": []}
    refusals = before_stop(plan, run, None if check_mode else held_share(plan, run))
    cluster = plan.get("cluster")
    if isinstance(cluster, dict):
        # A cluster's role joins every node's refusals: each names its node.
        node = next((entry.get("name") for entry in cluster.get("nodes") or [] if isinstance(entry, dict) and entry.get("rank") == cluster.get("rank")), "?")
        refusals = [f"{node} (rank {cluster.get('rank')}): {refusal}" for refusal in refusals]
    return {"changed": False, "refusals": refusals}


def launch(plan: t.Mapping[str, t.Any], run: Runner) -> dict[str, t.Any]:
    """Stop, start and gate; a step that cannot run is a failed gate with its cause."""
    try:
        stop(plan, False, run)
        start(plan, False, run)
    except FileProblem as error:
        return {"ok": False, "reason": str(error), "msg": str(error)}
    return gate_files(plan, run)


def roll_back(plan: t.Mapping[str, t.Any], run: Runner) -> tuple[bool, str]:
    """Relaunch the last good files; whether they serve, and what came of it as a failure's message says it."""
    try:
        restored = restore(plan, False, run)
        if not restored["restored"]:
            stop(plan, False, run)
            unusable = f" ({restored['unusable']})" if restored.get("unusable") else ""
            return False, f"There were no last good settings to roll back to{unusable}; the {noun(plan)} is stopped."
    except FileProblem as error:
        return False, f"The rollback could not run ({error}); the {noun(plan)} is down."
    again = launch(plan, run)
    if again["ok"] and is_gateway(plan):
        return True, "The last good unit was relaunched, on the keys and routing of now, and answers again."
    if again["ok"]:
        return True, "The last good settings were relaunched and serve again."
    return False, f"The last good settings were relaunched but do not serve either ({again['msg']}); the {noun(plan)} is down."


def relaunch(plan: t.Mapping[str, t.Any], flag: str | None, check_mode: bool, run: Runner,
             keep_last_good: bool = True) -> dict[str, t.Any]:
    """Relaunch a single instance behind its health gate, under the maintenance flag (cleared in
    every case; the gateway has none), and keep its files as the last good settings once gated
    (``keep_last_good``; a rollout keeps them only once it judged them, step keep, or rolls back to
    the last good ones, step roll_back). A failed gate restores the last good files and relaunches
    and gates them; the result then has ``failed`` and a ``msg`` saying what went wrong, after how
    long, what the rollback achieved and the engine log's error lines."""
    if check_mode:
        return {"changed": True}
    refusals = admit(plan, run)["refusals"]
    if refusals:
        restored = restore(plan, False, run, keep_mark=True)
        files = ("its last good files are back in place" if restored["restored"] else
                 f"its new files stay in place: {restored['unusable']}" if restored.get("unusable") else
                 "its new files stay in place (it has no last good copy)")
        return {"changed": restored["changed"], "failed": True, "refusals": refusals,
                "msg": f"vLLM instance {plan['name']} was not relaunched, nothing of it was stopped ({files}): " + " | ".join(refusals)}
    if not keep_last_good:
        hold(plan, False)
    try:
        if flag:
            raise_flag(flag, plan["name"], False)
            hand_back_to_watchdog(plan["watchdog_give_up"])
        verdict = launch(plan, run)
        rollback = None if verdict["ok"] else roll_back(plan, run)[1]
    finally:
        flag_left = flag_not_cleared(flag) if flag else ""
    if rollback is None:
        kept = keep_gated(plan, False, run)["written"] if keep_last_good else []
        if not keep_last_good:
            enable(plan["unit"], run)
        return {"changed": True, "gate": verdict, "kept": kept,
                **({"failed": True, "msg": f"{plan['name']} passed its gate, but {flag_left}"} if flag_left else {})}
    errors = " / ".join(verdict.get("log_errors", [])) or "none found"
    failed = "The LiteLLM gateway" if is_gateway(plan) else f"vLLM instance {plan['name']}"
    return {"changed": True, "failed": True, "gate": verdict,
            "msg": (f"{failed} failed its relaunch: {verdict['msg']} (detected after {verdict.get('elapsed', '?')} s). "
                    f"{rollback} Errors in the {'gateway' if is_gateway(plan) else 'engine'} log: {errors}"
                    + (f". Also {flag_left}" if flag_left else ""))}


def pause(plan: t.Mapping[str, t.Any], run: Runner, check_mode: bool = False, ledger_path: str = PAUSED_LEDGER) -> dict[str, t.Any]:
    """Stop the other programs' containers the plan lists that run (a GPU exporter holding memory, seed 002) for a
    cluster's relaunch, whose workers have no readiness wait to start them again: the host runtime's ledger records
    them for the rank's unit, so step resume (or the unit's stop) starts them again. One that cannot be stopped fails the
    step: the ones already stopped run again."""
    names = list(plan.get("paused_containers") or [])
    if check_mode:
        stopping = [name for name in names if running(name, run)]
        return {"changed": bool(stopping), "paused": stopping}
    lines: list[str] = []
    stopped, problems = host_pause(plan["unit"], names, run, lines.append, ledger_path)
    if problems:
        try:
            problems += host_release(plan["unit"], run, lines.append, ledger_path)
        except OSError as error:
            problems += [f"{', '.join(stopped)} could not be started again ({ledger_path}: {error.strerror}); start them by hand"] if stopped else []
    if problems:
        return {"changed": bool(lines), "failed": True, "paused": [],
                "msg": f"{plan['name']} was not relaunched, nothing of it was stopped: " + "; ".join(problems)}
    return {"changed": bool(stopped), "paused": stopped}


def resume(plan: t.Mapping[str, t.Any], run: Runner, ledger_path: str = PAUSED_LEDGER) -> dict[str, t.Any]:
    """Start again what the unit's pause (or its start) stopped, as the ledger records; fails naming any that did not start."""
    lines: list[str] = []
    try:
        problems = host_release(plan["unit"], run, lines.append, ledger_path)
    except OSError as error:
        problems = [f"{ledger_path}: the ledger of stopped containers cannot be read ({error.strerror}); start them by hand"]
    return {"changed": bool(lines), **({"failed": True, "msg": "; ".join(problems)} if problems else {})}


def roll_back_judged(plan: t.Mapping[str, t.Any], flag: str | None, check_mode: bool,
                     run: Runner) -> dict[str, t.Any]:
    """Put a single instance that served but was judged worse than before (a rollout's verdict) back on
    its last good settings, stopped, restored, started and gated under the maintenance flag; fails
    when they do not serve."""
    if check_mode:
        return {"changed": last_good(plan)["complete"]}
    try:
        if flag:
            raise_flag(flag, plan["name"], False)
            hand_back_to_watchdog(plan["watchdog_give_up"])
        served, outcome = roll_back(plan, run)
    finally:
        flag_left = flag_not_cleared(flag) if flag else ""
    also = f" Also {flag_left}" if flag_left else ""
    return {"changed": True, "served": served, "msg": outcome + also, **({} if served and not flag_left else {"failed": True})}


def hand_back_to_watchdog(give_up: str) -> None:
    """A planned relaunch is a person's answer to the watchdog having given up on the unit: its
    give-up file goes, and the watchdog judges the unit again with a fresh restart budget."""
    try:
        os.unlink(give_up)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise UnitError(f"{give_up}: the watchdog's give-up cannot be cleared ({error.strerror}); run the task as root") from error


def flag_not_cleared(flag: str) -> str:
    """Why the flag is still raised ('' once it is cleared): a flag left raised keeps the watchdog off
    the instance, so it is reported beside the relaunch's outcome, never instead of it."""
    try:
        clear_flag(flag, False)
    except FileProblem as error:
        return str(error)
    return ""


def checked(run: Runner, argv: list[str]) -> str:
    rc, out, err = run(argv)
    if rc != 0:
        raise UnitError(f"{' '.join(argv)} exited {rc}: {err.strip() or out.strip()}")
    return out


def step(name: str, plan: t.Any, check_mode: bool, run: Runner, env_text: str | None = None,
         keep_last_good: bool = True, keep_unjudged_mark: bool = False) -> dict[str, t.Any]:
    """One step of the transaction on one unit; UnitError says what stopped it and the fix."""
    problem = removal_problem(plan) if name == "remove" else plan_problem(plan)
    if problem:
        raise UnitError(problem)
    flag = plan.get("maintenance_flag")
    flagged = ("raise_flag", "clear_flag") if is_gateway(plan) else ("relaunch", "roll_back", "raise_flag", "clear_flag")
    flag_problem = path_problem(flag, 2) if name in flagged else None
    if flag_problem:
        raise UnitError(f"plan: maintenance_flag {flag!r} {flag_problem}; step {name} needs the flag's path as the vllm role "
                        "plans it (vllm_maintenance_flag)")
    give_up_problem = path_problem(plan.get("watchdog_give_up"), 2) if name in ("relaunch", "roll_back") and not is_gateway(plan) else None
    if give_up_problem:
        raise UnitError(f"plan: watchdog_give_up {plan.get('watchdog_give_up')!r} {give_up_problem}; a relaunch hands the unit back "
                        "to the watchdog at the path the vllm role plans")
    if name == "prepare":
        return prepare(plan, env_text or "", check_mode, run)
    if name == "admit":
        return admit(plan, run, check_mode)
    if name == "stop":
        return stop(plan, check_mode, run)
    if name == "start":
        return start(plan, check_mode, run)
    if name == "restore":
        return restore(plan, check_mode, run, keep_mark=keep_unjudged_mark)
    if name == "keep":
        return keep_gated(plan, check_mode, run)
    if name == "last_good":
        return last_good(plan)
    if name == "hold":
        return hold(plan, check_mode)
    if name == "relaunch":
        return relaunch(plan, flag, check_mode, run, keep_last_good)
    if name == "roll_back":
        if is_gateway(plan) or plan.get("cluster"):
            raise UnitError(f"step roll_back: {plan['name']} is {'the gateway' if is_gateway(plan) else 'a cluster rank'}; only a single "
                            "instance is rolled back alone (a cluster's role rolls every rank back together)")
        return roll_back_judged(plan, flag, check_mode, run)
    if name in ("pause", "resume") and is_gateway(plan):
        return {"changed": False, "paused": []}
    if name == "pause":
        return pause(plan, run, check_mode)
    if name == "resume" and check_mode:
        return {"changed": False}
    if name == "resume":
        return resume(plan, run)
    if name == "raise_flag":
        return raise_flag(flag, plan["name"], check_mode)
    if name == "clear_flag":
        return clear_flag(flag, check_mode)
    return remove(plan, check_mode, run)
