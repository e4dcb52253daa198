#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_unit
short_description: Write a planned vLLM instance's or cluster rank's files and say why the running one differs
version_added: 0.9.0
description:
  - Takes one planned unit (an instance of the plan the vllm role builds, a single instance or a cluster's rank) and
    brings its files to the plan, each written atomically with its mode and owned by root, at the paths the plan
    names (C(kept_files)) - the env file holding the API key (0600), the plan file and the systemd unit (0644).
  - Then reads the unit's state (C(systemctl show)) and the container's (C(docker container inspect)) and returns
    why the running unit differs from its plan (C(drift)) - a rewritten env file or unit, a unit that is not active,
    no container, or a container whose config hash label, image or state is not the plan's. A rewritten plan file
    alone is no drift; it only describes the unit.
  - The role relaunches the unit when C(drift) is not empty; this module never stops or starts anything.
author: sparkfleet.vllm contributors (@sparkfleet)
options:
  plan:
    description:
      - One instance of the host's plan (C(__vllm_plan.instances) in the vllm role, the node's in the cluster role),
        with its C(kept_files), C(unit_file), C(unit), C(container), C(config_hash) and C(run_image).
      - A plan of another release (its C(schema_version)) is refused.
    type: dict
    required: true
  env_file:
    description: The env file's text, which holds the API key (C(__vllm_plan.env_files[name])). Never logged or diffed.
    type: str
    required: true
attributes:
  check_mode:
    support: full
    description: Reports the files it would write and the same drift, and writes nothing.
  diff_mode:
    support: full
    description: Shows the plan file's and the unit's changes; the env file's content is never shown.
notes:
  - Needs C(systemctl) and the C(docker) command on the host, and root to write the files.
"""

EXAMPLES = r"""
- name: Write the files of the instance and compare the running one with its plan
  sparkfleet.vllm.serving_unit:
    plan: "{{ __vllm_plan.instances[0] }}"
    env_file: "{{ __vllm_plan.env_files[__vllm_plan.instances[0].name] }}"
  register: unit

- name: Relaunch it when it drifted
  ansible.builtin.debug:
    msg: "{{ unit.drift | join('; ') }}"
  when: unit.drift | length > 0
"""

RETURN = r"""
written:
  description: The kinds of file whose content was (or in check mode would be) written, among C(env), C(plan) and C(unit).
  returned: success
  type: list
  elements: str
fixed:
  description: The kinds of file whose content was right but whose mode or owner was (or would be) set.
  returned: success
  type: list
  elements: str
drift:
  description: Why the running unit differs from its plan; empty when it runs the plan.
  returned: success
  type: list
  elements: str
unit_state:
  description: The unit's C(LoadState) and C(ActiveState) before any change.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit import UnitError, prepare


def main():
    module = AnsibleModule(
        argument_spec=dict(
            plan=dict(type="dict", required=True),
            env_file=dict(type="str", required=True, no_log=True),
        ),
        supports_check_mode=True,
    )

    def run(argv):
        return module.run_command([module.get_bin_path(argv[0], required=True), *argv[1:]])

    try:
        result = prepare(module.params["plan"], module.params["env_file"], module.check_mode, run)
    except UnitError as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
