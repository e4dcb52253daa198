#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gateway_route
short_description: Write the LiteLLM gateway's routing from its plan, draining or undraining nodes
version_added: 0.5.0
description:
  - Keeps three files in I(config_dir) on the gateway host, all mode 0600 - C(plan.json) (the gateway's plan, as the
    gateway role computed it from the serving hosts' instance plans; no secret), C(drained.json) (the nodes and
    instances taken out of rotation) and C(litellm/config.yaml) (LiteLLM's config - every deployment of the plan that
    is not drained, keys only as C(os.environ/...) references).
  - Each drained name records who drained it (I(owner)) - the operator, a playbook hook's run (C(bench@RUN),
    C(sweep@RUN), C(rollout@RUN)) or a backend's watchdog (C(watchdog@HOST), through the watchdog's peer command
    only). A name stays out of rotation while it has an owner. The operator's undrain puts a name back whoever
    drained it; a hook's undrain releases only that run's own drain, so a unit the operator (or the watchdog) drained
    stays out, and the module says so (C(held)) and warns.
  - Reads and writes the routing under the lock the watchdog's drains take (C(.route.lock) in I(config_dir)), so a
    drain of a playbook and a drain of a watchdog at once both land.
  - C(plan.json) and C(drained.json) carry a C(schema_version). A file that is truncated, incomplete, or of another
    schema is refused naming the file and the fix, never read as a guess. A drained list of an older release (schema
    1, no owners) is read as the operator's drains.
  - With I(plan) the plan file is replaced; without it the plan already on the host is read, so a drain needs no
    inventory of the backends (the sweep and the watchdog drain from a serving host's play).
  - A drain names an inventory host (every instance on it) or C(host/instance). A drain that leaves a model group with
    nothing to route to is refused, and nothing is written, unless I(force). So is a request that contradicts itself -
    a host and one of its instances, one drained and the other undrained - or an undrain of an instance whose host
    stays drained, which would do nothing (an operator's request; a hook's undrain of it only releases its own drain).
  - The caller restarts the gateway when C(config_changed) is true; LiteLLM reads its config at start.
  - The logic is in the collection's private module_utils C(_gateway), unit-tested.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  config_dir:
    description: The gateway's folder on its host.
    type: path
    default: /etc/sparkfleet/gateway
  plan:
    description: The gateway plan without its env file (the role's C(gateway_plan) filter). Read from the host when omitted.
    type: dict
  drain:
    description: Hosts or C(host/instance) to take out of rotation.
    type: list
    elements: str
    default: []
  undrain:
    description: Hosts or C(host/instance) to put back into rotation.
    type: list
    elements: str
    default: []
  force:
    description: Drain even when a model group is left with nothing to route to (a planned outage).
    type: bool
    default: false
  owner:
    description:
      - Who drains or undrains - C(operator), or a hook's run C(NAME@RUN) (letters, digits, C(_.:-) after the C(@)).
        C(watchdog@HOST) is the watchdog's own and refused here.
    type: str
    default: operator
attributes:
  check_mode:
    support: full
    details: Computes and reports the routing and what would change, and writes nothing.
  diff_mode:
    support: full
    details: Shows the drained list and the config before and after; neither holds a secret.
  idempotent:
    support: full
    details: A run with the same plan and drains writes nothing and reports no change.
"""

EXAMPLES = r"""
- name: Take spark-2 out of rotation for an isolated benchmark
  sparkfleet.vllm.gateway_route:
    drain: [spark-2]
  delegate_to: gateway-1
  register: route

- name: Put one instance back
  sparkfleet.vllm.gateway_route:
    undrain: [spark-2/chat]
  delegate_to: gateway-1

- name: Release this bench run's drain only (an operator's drain of spark-2 stays)
  sparkfleet.vllm.gateway_route:
    undrain: [spark-2]
    owner: bench@20250101T120000Z-1a2b
  delegate_to: gateway-1
"""

RETURN = r"""
ok:
  description: Whether the routing was written (or would be, in check mode).
  type: bool
  returned: always
drained:
  description: What is out of rotation after this run.
  type: list
  elements: str
  returned: success
owners:
  description: Per drained name, who drained it (C(operator), C(NAME@RUN), C(watchdog@HOST)).
  type: dict
  returned: success
left_by_runs:
  description: >-
    Names out of rotation only for other playbook runs (owners such as C(bench@...), C(sweep@...), C(rollout@...)): a run
    stopped or lost before its undrain hook left them; each is also a warning naming the operator's undrain command.
  returned: success
  type: dict
not_routed:
  description: >-
    Of the names a hook's run gave (C(owner) C(NAME@RUN)), those this gateway does not route, left alone: a run names the
    units it measures at every gateway routing to their hosts. The operator's names are never skipped (an unknown one is
    refused).
  type: list
  elements: str
  returned: success
held:
  description: Of the names undrained, those that stay out of rotation because another owner drained them (or their host), with those owners.
  type: dict
  returned: success
in_rotation:
  description: Each model group and the ids (C(host/instance/served name/group)) of its deployments in rotation.
  type: dict
  returned: success
url:
  description: Where the gateway answers on its host.
  type: str
  returned: success
unit:
  description: The gateway's systemd unit, to restart when its config changed.
  type: str
  returned: success
config_changed:
  description: Whether LiteLLM's config changed, so the gateway must restart to route by it.
  type: bool
  returned: always
reasons:
  description: Why a drain or undrain was refused, or why the gateway's files cannot be read.
  type: list
  elements: str
  returned: always
"""

import fcntl
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import DEFAULT_SETTINGS, gateway_files
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway_routes import (
    OPERATOR,
    ROUTE_LOCK,
    UNIT,
    apply_request,
    drain_problems,
    drained_file,
    held_by_others,
    in_rotation,
    kept_out,
    left_by_runs,
    owner_problem,
    plan_file,
    plan_problem,
    read_drained,
    read_plan,
    render_config,
    routed_here,
    targets,
)


def read_text(path: str) -> str | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def refuse(module: AnsibleModule, reasons: list[str]) -> None:
    module.fail_json(msg=" | ".join(reasons), ok=False, config_changed=False, reasons=reasons)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": DEFAULT_SETTINGS["config_dir"]},
            "plan": {"type": "dict"},
            "drain": {"type": "list", "elements": "str", "default": []},
            "undrain": {"type": "list", "elements": "str", "default": []},
            "force": {"type": "bool", "default": False},
            "owner": {"type": "str", "default": OPERATOR},
        },
        supports_check_mode=True,
    )
    problem = owner_problem(module.params["owner"])
    if problem:
        refuse(module, [problem])
    config_dir = module.params["config_dir"]
    try:
        # The watchdog's drains take the same lock from their read to their write: neither loses the other's update.
        # Check mode writes nothing, not even the lock file, and judges what it reads.
        if module.check_mode:
            route(module, config_dir)
        else:
            os.makedirs(config_dir, mode=0o700, exist_ok=True)
            with open(os.path.join(config_dir, ROUTE_LOCK), "a", encoding="utf-8") as lock:
                os.chmod(lock.name, 0o600)
                fcntl.flock(lock, fcntl.LOCK_EX)
                route(module, config_dir)
    except OSError as error:
        refuse(module, [f"{config_dir}: the gateway's routing lock cannot be taken ({error}); give a config_dir the task's user can "
                        "write (become: true), then re-run"])


def route(module: AnsibleModule, config_dir: str) -> None:
    files = gateway_files(config_dir)
    paths = {name: files[name] for name in ("plan", "drained", "config")}
    try:
        before = {name: read_text(path) for name, path in paths.items()}
    except (OSError, UnicodeDecodeError) as error:
        refuse(module, [f"{config_dir}: the gateway's files cannot be read ({error}); check the folder, or re-run site.yml --tags gateway"])
    plan = module.params["plan"]
    if plan is not None:
        problem = plan_problem(plan, "plan (the gateway role's gateway_plan)")
    elif before["plan"] is None:
        problem = (f"no gateway plan at {paths['plan']}: this host runs no gateway yet; apply site.yml (the gateway role) "
                   "first")
    else:
        plan, problem = read_plan(before["plan"], paths["plan"])
    if problem:
        refuse(module, [problem])
    record, problem = read_drained(before["drained"], paths["drained"])
    if problem:
        refuse(module, [problem])
    owner = module.params["owner"]
    drain, not_routed = routed_here(plan, module.params["drain"], owner)
    undrain, not_routed_back = routed_here(plan, module.params["undrain"], owner)
    problems = drain_problems(plan, record, drain, undrain, module.params["force"], owner)
    if problems:
        refuse(module, problems)
    known = targets(plan)
    stale = sorted(name for name in record if name not in known)
    after_record = {name: owners for name, owners in apply_request(record, drain, undrain, owner).items() if name not in stale}
    after_drained = sorted(after_record)
    after = {"plan": plan_file(plan), "drained": drained_file(after_record), "config": render_config(plan, after_drained)}
    changed_names = [name for name in paths if before[name] != after[name]]
    if changed_names and not module.check_mode:
        try:
            os.makedirs(files["litellm_dir"], mode=0o700, exist_ok=True)
            for name in changed_names:
                write_atomically(paths[name], after[name], 0o600)
        except OSError as error:
            refuse(module, [f"{config_dir}: the gateway's files cannot be written ({error}); give a config_dir the task's user can "
                            "write (become: true), then re-run"])
    rotation: dict[str, list[str]] = {group: [] for group in plan["groups"]}
    for deployment in in_rotation(plan, after_drained):
        rotation.setdefault(deployment["group"], []).append(deployment["id"])
    held = held_by_others(after_record, undrain)
    result = {
        "changed": bool(changed_names), "ok": True, "url": plan["url"], "unit": UNIT, "drained": after_drained, "owners": after_record,
        "held": held, "in_rotation": rotation, "config_changed": "config" in changed_names, "reasons": [],
        "not_routed": sorted({*not_routed, *not_routed_back}),
        "diff": [{"before_header": paths[name], "after_header": paths[name], "before": before[name] or "", "after": after[name]}
                 for name in ("drained", "config") if name in changed_names],
    }
    warnings = [f"dropped from the drained list, no longer backends: {', '.join(stale)}"] if stale else []
    kept = kept_out(after_drained, undrain)
    if kept:
        warnings.append(f"{', '.join(kept)}: drained by name, so still out of rotation; undrain by name to put back")
    warnings += [f"{name} stays out of rotation: drained by {', '.join(owners)}, whose drain {owner} does not undo; the operator "
                 f"puts it back (playbooks/gateway.yml -e '{{\"gateway_undrain\": [\"{name}\"]}}') when it may serve"
                 for name, owners in held.items()]
    left = {name: owners for name, owners in left_by_runs(after_record, owner).items() if name not in held}
    result["left_by_runs"] = left
    warnings += [f"{name} is out of rotation only for {', '.join(owners)}, a run that never undrained it (stopped or lost); "
                 f"put it back when it may serve: playbooks/gateway.yml -e '{{\"gateway_undrain\": [\"{name}\"]}}'"
                 for name, owners in left.items()]
    if warnings:
        result["warnings"] = warnings
    module.exit_json(**result)


if __name__ == "__main__":
    main()
