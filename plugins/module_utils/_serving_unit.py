# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One planned serving unit on its host (a vLLM instance or a cluster's rank): its files written
from the plan, each atomically with its mode, and why the running unit differs from its plan.

Private to the collection; the serving_unit module is its caller. Check mode is answered here:
the same comparison, nothing written. The env file holds the API key, so its content never
reaches a diff or a result.
"""

from __future__ import annotations

import json
import os
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import PLAN_SCHEMA_VERSION
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import drift_reasons

# What each of the plan's kept_files holds, in their order.
FILE_KINDS = ("env", "plan", "unit")
# A rewritten env file or unit makes the running unit stale; the plan file only describes it.
RELAUNCHING_KINDS = frozenset(("env", "unit"))
SECRET_KINDS = frozenset(("env",))
HIDDEN = "(the env file holds the API key; its content is not shown)\n"

Runner = t.Callable[[list[str]], tuple[int, str, str]]


class UnitError(Exception):
    """What stopped the unit's files or state from being read or written, with the fix."""


def plan_problem(plan: t.Any) -> str | None:
    """Why ``plan`` is not one planned instance or rank of this release (None: it is)."""
    if not isinstance(plan, dict) or plan.get("schema_version") != PLAN_SCHEMA_VERSION:
        version = plan.get("schema_version") if isinstance(plan, dict) else None
        return (f"plan: schema_version {version!r}, while this release reads {PLAN_SCHEMA_VERSION}; give one instance of the "
                "plan the vllm role built (__vllm_plan.instances), not a plan file of another release")
    kept = plan.get("kept_files")
    missing = [key for key in ("name", "unit", "container", "unit_file", "config_hash", "run_image") if not plan.get(key)]
    if missing or not isinstance(kept, list) or len(kept) != len(FILE_KINDS) or not all(
            isinstance(entry, dict) and str(entry.get("path", "")).startswith("/") and entry.get("mode") in ("0600", "0644")
            for entry in kept):
        shown = ", ".join(missing) if missing else "kept_files (env, plan and unit: absolute path and mode each)"
        return f"plan: lacks {shown}; give one instance of the plan the vllm role built (__vllm_plan.instances)"
    return None


def plan_text(plan: t.Mapping[str, t.Any]) -> str:
    """The plan file: the plan as JSON, keys sorted, as the roles wrote it with to_nice_json before."""
    return json.dumps(plan, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def planned_files(plan: t.Mapping[str, t.Any], env_text: str) -> list[dict[str, t.Any]]:
    """Each file of the unit: kind, path, mode and content."""
    contents = {"env": env_text, "plan": plan_text(plan), "unit": plan["unit_file"]}
    return [{"kind": kind, "path": kept["path"], "mode": int(kept["mode"], 8), "content": contents[kind]}
            for kind, kept in zip(FILE_KINDS, plan["kept_files"], strict=True)]


def read_file(path: str) -> tuple[str, int, tuple[int, int]] | None:
    """(content, mode, (uid, gid)) of a file, None when there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            status = os.fstat(handle.fileno())
            return handle.read(), status.st_mode & 0o7777, (status.st_uid, status.st_gid)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UnitError(f"{path}: cannot be read ({error.strerror}); run the task as root (become: true)") from error


def sync_files(files: list[dict[str, t.Any]], check_mode: bool) -> dict[str, list[t.Any]]:
    """Write each file whose content differs, and set the mode and root ownership of each whose
    content is right but whose metadata is not. Returns the kinds rewritten (``content``), the
    kinds whose mode or owner were set (``metadata``) and the diffs (the env file's hidden)."""
    found: dict[str, list[t.Any]] = {"content": [], "metadata": [], "diff": []}
    owner = (0, 0) if os.geteuid() == 0 else None
    for file in files:
        before = read_file(file["path"])
        if before is None or before[0] != file["content"]:
            found["content"].append(file["kind"])
            secret = file["kind"] in SECRET_KINDS
            found["diff"].append({"before_header": file["path"], "after_header": file["path"],
                                  "before": "" if before is None else HIDDEN if secret else before[0],
                                  "after": HIDDEN if secret else file["content"]})
            if not check_mode:
                write(file, owner)
        elif before[1] != file["mode"] or (owner is not None and before[2] != owner):
            found["metadata"].append(file["kind"])
            if not check_mode:
                set_metadata(file, owner)
    return found


def write(file: t.Mapping[str, t.Any], owner: tuple[int, int] | None) -> None:
    try:
        write_atomically(file["path"], file["content"], file["mode"])
        if owner is not None:
            os.chown(file["path"], *owner)
    except FileNotFoundError as error:
        raise UnitError(f"{file['path']}: its folder {os.path.dirname(file['path'])} does not exist; the role creates it "
                        "before this step (plan folders)") from error
    except OSError as error:
        raise UnitError(f"{file['path']}: cannot be written ({error.strerror}); run the task as root (become: true)") from error


def set_metadata(file: t.Mapping[str, t.Any], owner: tuple[int, int] | None) -> None:
    try:
        os.chmod(file["path"], file["mode"])
        if owner is not None:
            os.chown(file["path"], *owner)
    except OSError as error:
        raise UnitError(f"{file['path']}: its mode cannot be set ({error.strerror}); run the task as root (become: true)") from error


def unit_state(run: Runner, unit: str) -> dict[str, str]:
    """The unit's LoadState and ActiveState as systemd reports them (not-found and inactive for a unit it does not know)."""
    rc, out, err = run(["systemctl", "show", "--property=LoadState", "--property=ActiveState", unit])
    if rc != 0:
        raise UnitError(f"systemctl show {unit} exited {rc}: {err.strip() or out.strip()}; is systemd running on the host?")
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {"LoadState": values.get("LoadState", ""), "ActiveState": values.get("ActiveState", "")}


def container_state(run: Runner, container: str) -> dict[str, t.Any] | None:
    """Docker's inspect data of the container, None when there is no such container."""
    rc, out, err = run(["docker", "container", "inspect", container])
    if rc != 0:
        if "no such container" in (err + out).lower():
            return None
        raise UnitError(f"docker container inspect {container} exited {rc}: {err.strip() or out.strip()}; is Docker running on the host?")
    try:
        found = json.loads(out)
    except ValueError as error:
        raise UnitError(f"docker container inspect {container} did not answer JSON ({error})") from error
    return found[0] if isinstance(found, list) and found and isinstance(found[0], dict) else None


def prepare(plan: t.Mapping[str, t.Any], env_text: str, check_mode: bool, run: Runner) -> dict[str, t.Any]:
    """Bring the unit's files to its plan and say why the running unit is not the plan (drift).
    In check mode nothing is written and the answer is the same."""
    problem = plan_problem(plan)
    if problem:
        raise UnitError(problem)
    # Read before anything is written, so a host whose systemd or Docker cannot answer is left as it was.
    state = unit_state(run, plan["unit"])
    container = container_state(run, plan["container"])
    synced = sync_files(planned_files(plan, env_text), check_mode)
    relaunching = bool(RELAUNCHING_KINDS.intersection(synced["content"]))
    drift = drift_reasons(plan, relaunching, state["ActiveState"], container)
    return {"changed": bool(synced["content"] or synced["metadata"]), "written": synced["content"], "fixed": synced["metadata"],
            "drift": drift, "unit_state": state, "diff": synced["diff"]}
