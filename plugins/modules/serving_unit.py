#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_unit
short_description: One step of relaunching, rolling back or removing a planned vLLM instance, cluster rank or the gateway
version_added: 0.9.0
description:
  - Takes one planned unit (an instance of the plan the vllm role builds, a single instance or a cluster's rank, or the
    LiteLLM gateway's unit the gateway role plans) and runs one step of its transaction on the host. A single instance's relaunch is one step (C(relaunch)); a
    cluster's role orders the steps across its nodes and gates its head with M(sparkfleet.vllm.vllm_health).
  - C(prepare) brings the unit's files to the plan at the paths it names (C(kept_files)), each written atomically
    with its mode and owned by root - the env file holding the API key (0600), the plan file and the systemd unit
    (0644) - after reading the unit's state (C(systemctl show)) and the container's (C(docker container inspect)),
    and returns why the running unit differs from its plan (C(drift)) - a rewritten env file or unit, a unit that
    is not active, no container, or a container whose config hash label, image or state is not the plan's. A
    rewritten plan file alone is no drift; it only describes the unit. A unit that runs its plan (no drift) is
    enabled so it starts at boot (the order among the host's units is in their unit files), and a single
    instance's keeps its files as the last good settings; a unit that drifts is enabled and kept only once its
    relaunch passed the gate (C(relaunch); a cluster's ranks by C(keep)), so a first launch that fails never starts at
    boot.
  - C(hold) marks the unit as running settings nobody judged yet (C(<name>.unjudged.json) beside its last good copies); a
    C(relaunch) with O(keep_last_good) false marks it itself before the start, and a cluster's role marks every rank
    before a rollout's relaunch. C(keep) and a C(restore) clear the mark. While it is there C(prepare) keeps no last good
    copy of the running settings and warns naming the unit, when the settings started and what to do (C(unjudged)), so
    a rollout stopped mid-batch, or one that lost the host, is found by the next run.
  - C(admit) asks, before anything of the unit is stopped, what would refuse its start whether its running engine stops or
    not (C(refusals), empty when nothing; it changes nothing) - with the plan's C(memory_admission), a process outside the
    collection's containers holding the GPU's device nodes, and the plan's share against the memory its image's vLLM
    reads, credited with the share of the unit's last good settings while its container runs them (what its stop gives
    back; not judged here while it runs settings never judged). A cluster's role asks it on every node before any rank
    stops; C(relaunch) asks it first itself. The start's own admission asks again. In check mode it runs no container,
    so the memory is not asked.
  - C(stop) stops the unit (systemd reads its unit file again first) and removes its container.
  - C(start) clears the unit's start limit and the last start's refusal and starts it without waiting for readiness; a
    cluster's rank is waited on until its door passed (a container of the unit started after the start was asked, as the
    head's watchdog waits when it restarts a cluster) and fails naming the admission's refusal, its unit failing first
    (the fabric wait), a start systemd ended without running it, or no container within 600 s. An
    instance's or a rank's unit admits every start itself, whoever causes it (this step, a boot, systemd's restart, the
    watchdog). Its ExecStart runs the host runtime that serving_host installs, which drops the page cache when the plan
    says so (seed 002), stops the other programs' containers the plan lists (C(paused_containers)), refuses a start (the
    plan's C(memory_admission), from C(vllm_memory_admission)) while a process outside the collection's containers holds
    the GPU's device nodes (C(/dev/nvidia*); nvidia-persistenced may) or while the free memory the pinned image's vLLM
    compares with cannot grant the plan's share of CUDA's total - the plan's C(memory_probe), a throwaway container of
    its image without network, stopped after 120 s, that prints the figures (MemAvailable on an integrated GPU such as a
    GB10, CUDA's free memory on a discrete one, the kernel's available memory when the instance gets no GPU) - and logs
    each figure in the unit's journal. A refused start fails the unit without a restart, and the gate fails at once
    with the reason.
  - C(restore) puts the last good copies of the files back (C(restored) is false, and nothing changes, when there is
    no complete copy, or when the plan file's copy is one the one plan-file reader refuses for the unit's kind (damaged,
    or another release's), C(unusable) saying why); C(keep) keeps the files as the last good ones and enables the
    unit; C(last_good) only reads whether a complete copy is there (C(complete)).
  - C(relaunch) relaunches a single instance. First C(admit), whose refusals fail the task with nothing of the unit
    stopped and its last good files back in place; then under the maintenance flag (the plan's C(maintenance_flag),
    holding the unit's name, cleared in every case) C(stop), C(start), then the health gate of M(sparkfleet.vllm.vllm_health) with its warm-up request, reading
    the key, names and URL from the files on the host; once gated, the files are kept as the last good settings.
    When the gate fails, or a stop or start cannot run, the
    last good files are restored, started (admitted on their own memory share, as their restored plan file says) and gated in turn, and the task
    fails saying what went wrong, after how long, whether the last good settings serve again, and the engine
    log's error lines.
  - C(roll_back) puts a single instance that served but was judged worse (a rollout's verdict, O(keep_last_good) false on
    its relaunch) back on its last good settings - restored, started and gated under the maintenance flag - and fails
    when they do not serve (C(served)).
  - C(raise_flag) and C(clear_flag) raise and clear the maintenance flag around a relaunch the role orders
    itself (a cluster's), so the watchdog takes the stopped units for planned work.
  - C(pause) stops the other programs' containers the plan lists (C(paused_containers), from
    C(vllm_launch_paused_containers); seed 002's nvidia_gpu_exporter holds about 9 GiB of the GPU's memory) that run,
    before a cluster's relaunch (a worker has no readiness wait after which its own unit could start them again), and
    returns them (C(paused); in check mode those it would stop, stopping none); one that cannot be stopped fails the
    step, the others started again. The host runtime's ledger records which unit stopped which container, so a
    container another unit's start also needs stays stopped until both are done. C(resume) starts again what the
    unit's pause recorded, after the gate, whatever its outcome. A single instance's unit does both itself at every
    start (its readiness wait, or its stop, starts them again).
  - The gateway's plan (C(kind) C(gateway), C(__gateway_plan.serving_unit)) holds no memory share and no maintenance flag; its
    relaunch is gated by its model list, asked with the master key its env file holds (the env var its plan's C(key_env)
    names), without a warm-up request; its rollback puts back its last good unit and unit plan and keeps the key file and
    routing of now (the backends' keys are the backends'). Routing written after its container started is drift.
  - C(remove) takes a removal (C(vllm_removals), C(cluster_stale_ranks)) instead of a plan, disables and stops its
    unit, removes its container and deletes its files.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  plan:
    description:
      - One instance of the host's plan (C(__vllm_plan.instances) in the vllm role, the node's in the cluster role, the
        gateway's unit in the gateway role), with its C(kept_files), C(unit_file), C(unit), C(container), C(config_hash) and
        C(run_image); for O(step=remove), a removal with C(name), C(unit), C(container) and C(files).
      - It is checked whole by the rules the collection's one plan-file reader applies to a plan file of its kind (an
        instance's or a rank's, or the gateway's), plus what only this module reads; a plan of another release (its
        C(schema_version)) is refused.
    type: dict
    required: true
  step:
    description: The step to run.
    type: str
    choices: [prepare, admit, stop, start, restore, keep, last_good, hold, remove, relaunch, roll_back, raise_flag, clear_flag, pause, resume]
    default: prepare
  env_file:
    description:
      - The env file's text, which holds the API key (C(__vllm_plan.env_files[name])); needed by O(step=prepare).
        Never logged or diffed.
    type: str
  keep_last_good:
    description:
      - With O(step=relaunch), keep the gated files as the last good settings. False leaves the settings before the
        relaunch as the last good ones (the unit is enabled all the same), so a rollout that judges the new settings
        worse puts those back (O(step=roll_back)) and keeps the new ones only once judged (O(step=keep)).
    type: bool
    default: true
    version_added: 0.11.0
  keep_unjudged_mark:
    description:
      - With O(step=restore), leave the unit's mark of settings nobody judged yet (O(step=hold)) in place, for a relaunch
        refused before anything stopped (a cluster's admission on another node), whose unjudged settings still run.
    type: bool
    default: false
    version_added: 0.11.0
attributes:
  check_mode:
    support: full
    details: Reports what the step would change and writes, stops or starts nothing.
  diff_mode:
    support: full
    details: Shows the plan file's and the unit's changes and the files a removal deletes; the env file's content is never shown.
  idempotent:
    support: partial
    details:
      - C(prepare), C(keep), C(restore), C(hold), C(remove), the flags and C(resume) change nothing once done.
      - C(relaunch), C(roll_back), C(stop), C(start) and C(pause) act on the running unit on every run.
notes:
  - Needs C(systemctl) and the C(docker) command on the host, and root.
"""

EXAMPLES = r"""
- name: Write the files of the instance and compare the running one with its plan
  sparkfleet.vllm.serving_unit:
    plan: "{{ __vllm_plan.instances[0] }}"
    env_file: "{{ __vllm_plan.env_files[__vllm_plan.instances[0].name] }}"
  register: unit

- name: Relaunch it behind the health gate when it drifted, rolling back to the last good files on failure
  sparkfleet.vllm.serving_unit:
    plan: "{{ __vllm_plan.instances[0] }}"
    step: relaunch
  when: unit.drift | length > 0

- name: Keep the files that served as the last good ones
  sparkfleet.vllm.serving_unit:
    plan: "{{ __vllm_plan.instances[0] }}"
    step: keep
"""

RETURN = r"""
written:
  description: The kinds of file whose content was (or in check mode would be) written, among C(env), C(plan) and C(unit).
  returned: when O(step) is C(prepare), C(restore) or C(keep)
  type: list
  elements: str
kept:
  description:
    - The kinds of file copied as the last good settings (a single instance that runs its plan, or a relaunch that passed
      its gate with O(keep_last_good)).
  returned: when O(step=prepare), or O(step=relaunch) outside check mode once the gate passed
  type: list
  elements: str
fixed:
  description: The kinds of file whose content was right but whose mode or owner was (or would be) set.
  returned: when O(step=prepare)
  type: list
  elements: str
drift:
  description: Why the running unit differs from its plan; empty when it runs the plan.
  returned: when O(step=prepare)
  type: list
  elements: str
unjudged:
  description: >-
    Set when the unit is marked as running settings a rollout relaunched and never judged (step C(hold)): what happened, when,
    and what to do; the same text is a warning. None otherwise.
  returned: when O(step=prepare)
  type: str
enabled:
  description: Whether the unit was not enabled; a unit that runs its plan was then enabled, one that drifts is enabled by its relaunch once gated.
  returned: when O(step=prepare)
  type: bool
unit_state:
  description: The unit's C(LoadState), C(ActiveState) and C(UnitFileState) before the step.
  returned: when O(step) is C(prepare), C(stop) or C(remove)
  type: dict
restored:
  description: Whether a complete last good copy was there to restore.
  returned: when O(step=restore)
  type: bool
complete:
  description: Whether every file of the unit has its last good copy.
  returned: when O(step=last_good)
  type: bool
removed:
  description: The files a removal deleted (or would delete).
  returned: when O(step=remove)
  type: list
  elements: str
gate:
  description:
    - The health gate's result of the relaunched files (of the first start, when the task failed) - C(ok),
      C(reason) and C(msg), and when the gate ran C(elapsed), C(url), C(served_model_names), C(warmup_reply),
      C(kv_cache_tokens) and C(kv_cache_warning) (also shown as a warning), and on failure C(log_tail) and
      C(log_errors), as M(sparkfleet.vllm.vllm_health) returns them.
  returned: when O(step=relaunch) relaunched
  type: dict
served:
  description: Whether the last good settings serve again after O(step=roll_back).
  returned: when O(step=roll_back) ran outside check mode
  type: bool
paused:
  description: The other programs' containers stopped for a cluster's relaunch (or, in check mode, that would be).
  returned: when O(step=pause)
  type: list
  elements: str
unusable:
  description: Why the last good plan file cannot be restored (damaged, or another release wrote it); absent when it can.
  returned: when O(step=restore) or O(step=last_good) finds such a copy
  type: str
refusals:
  description:
    - What would refuse the unit's start whether its running engine stops or not, each with its figures and the fix;
      empty when nothing would.
  returned: when O(step=admit), and when a relaunch is refused before its stop
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit import STEPS, step
from ansible_collections.sparkfleet.vllm.plugins.module_utils._tools import tool_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            plan=dict(type="dict", required=True),
            step=dict(type="str", choices=list(STEPS), default="prepare"),
            env_file=dict(type="str", no_log=True),
            keep_last_good=dict(type="bool", default=True),
            keep_unjudged_mark=dict(type="bool", default=False),
        ),
        required_if=[("step", "prepare", ("env_file",))],
        supports_check_mode=True,
    )

    run = tool_runner(module)
    params = module.params
    try:
        result = step(params["step"], params["plan"], module.check_mode, run, env_text=params["env_file"],
                      keep_last_good=params["keep_last_good"], keep_unjudged_mark=params["keep_unjudged_mark"])
    except FileProblem as error:
        module.fail_json(msg=str(error))
    if result.get("unjudged"):
        module.warn(result["unjudged"])
    if (result.get("gate") or {}).get("kv_cache_warning"):
        module.warn(f"{params['plan'].get('name')}: {result['gate']['kv_cache_warning']}")
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
