# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: vllm_problems
short_description: Every problem of a host's vLLM instances, at once
version_added: 0.1.0
description:
  - Validates each instance (image pinned by digest, API key, memory fraction, parsers, speculative
    config, ports, bind addresses) and the host as a whole (the sum of gpu_memory_utilization against the
    hardware class cap, LAN addresses that must exist and need the wait_online role).
  - Returns a list of messages, each naming the variable to fix; empty when all is well.
  - The same file provides C(vllm_serve_args), C(vllm_published_ports), C(vllm_image_parts),
    C(systemd_exec_line), C(meminfo), C(vllm_admission_problem), C(vllm_pull_repository), C(vllm_run_image),
    C(vllm_docker_run), C(vllm_models_problems) and C(vllm_launch_checks).
author: sparkfleet.vllm contributors (@sparkfleet)
positional: _input
options:
  _input:
    description: The host's instances, each already merged with the instance defaults.
    type: list
    elements: dict
    required: true
  gmu_cap:
    description: Highest sum of gpu_memory_utilization for the host's hardware class.
    type: float
    required: true
  host_addresses:
    description: The host's IP addresses.
    type: list
    elements: str
    required: true
  wait_online_enabled:
    description: Whether Docker on this host is ordered after network-online.target.
    type: bool
    required: true
  allow_floating_tag:
    description: Accept images that are not pinned by digest.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Refuse bad instances
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join(' | ') }}"
  vars:
    problems: "{{ vllm_instances | sparkfleet.vllm.vllm_problems(0.85, ansible_all_ipv4_addresses, true) }}"
"""

RETURN = r"""
_value:
  description: Messages, each naming the variable to fix.
  type: list
  elements: str
"""

from ansible_collections.sparkfleet.vllm.plugins.module_utils._memory import admission_problem, parse_meminfo
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import exec_line
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import (
    docker_run_args,
    parse_image_reference,
    published_ports,
    pull_repository,
    render_serve_args,
    run_image,
    validate_host,
    validate_instance,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import host_path, validate_models


def vllm_problems(instances, gmu_cap, host_addresses, wait_online_enabled, allow_floating_tag=False):
    problems = []
    for index, instance in enumerate(instances):
        problems += validate_instance(f"vllm_instances[{index}]", instance, allow_floating_tag)
    problems += validate_host(instances, float(gmu_cap), list(host_addresses), bool(wait_online_enabled))
    return problems


def vllm_models_problems(models, allow_branch=False):
    return validate_models("vllm_models", models, bool(allow_branch))


def vllm_launch_checks(instances, models_dir):
    """What vllm_model_check needs of each instance whose weights live under /models (no secrets)."""
    checks = []
    for instance in instances:
        path = host_path(str(instance.get("model", "")), models_dir)
        if path is None:
            continue
        speculative = instance.get("speculative") or {}
        checks.append({
            "instance": instance["name"],
            "path": path,
            "max_model_len": instance.get("max_model_len"),
            "speculative_method": speculative.get("method") if speculative.get("num_speculative_tokens") else None,
            "allow_drafter_on_base_model": bool(instance.get("allow_drafter_on_base_model")),
        })
    return checks


def vllm_image_parts(image):
    return parse_image_reference(image) or {"repository": image, "tag": None, "digest": None}


def vllm_admission_problem(meminfo_bytes, name, gpu_memory_utilization):
    return admission_problem(name, float(gpu_memory_utilization), meminfo_bytes)


class FilterModule:
    def filters(self):
        return {
            "vllm_problems": vllm_problems,
            "vllm_serve_args": render_serve_args,
            "vllm_published_ports": published_ports,
            "vllm_image_parts": vllm_image_parts,
            "systemd_exec_line": exec_line,
            "meminfo": parse_meminfo,
            "vllm_admission_problem": vllm_admission_problem,
            "vllm_pull_repository": pull_repository,
            "vllm_run_image": run_image,
            "vllm_docker_run": docker_run_args,
            "vllm_models_problems": vllm_models_problems,
            "vllm_launch_checks": vllm_launch_checks,
        }
