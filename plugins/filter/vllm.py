# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: vllm_plan
short_description: The plan of a host's vLLM instances, validated against one key table
version_added: 0.2.0
description:
  - Validates C(vllm_instances) merged over C(vllm_instance_defaults) against the instance key table (unknown keys are
    refused with the closest known name), and the host as a whole (memory fractions against the hardware class cap,
    unique names, ports and served names, LAN addresses that must exist and need the wait_online role).
  - Applies the hardware class (its environment, batch size and ceiling) and the model catalog entry an instance
    names, refuses contradictions with it and the seed guards, and works out each instance's memory arithmetic.
  - Returns the plan of every instance (unit, container, URL, run image, argv, environment names, ports, served names,
    weights, start-after list, launch checks, memory arithmetic, config hash and unit file), the names to remove, every
    error at once, the warnings, and the env files (the only part holding secrets; use it under no_log).
  - The same file provides C(vllm_drift) (why a running instance differs from its plan),
    C(vllm_pull_reference), C(vllm_run_image), C(meminfo), C(vllm_admission_problem) and
    C(vllm_models_problems).
author: sparkfleet.vllm contributors (@sparkfleet)
positional: _input
options:
  _input:
    description: The host's C(vllm_instances).
    type: list
    elements: dict
    required: true
  defaults:
    description: C(vllm_instance_defaults).
    type: dict
    required: true
  image:
    description: C(vllm_image).
    type: str
  allow_floating_tag:
    description: Accept images not pinned by digest.
    type: bool
  allow_wildcard_bind:
    description: Accept binding 0.0.0.0 or ::.
    type: bool
  registry_mirror:
    description: Registry the images are pulled through.
    type: str
  gmu_cap:
    description: Highest sum of gpu_memory_utilization; null takes the hardware class's ceiling, above it is refused.
    type: float
  hardware_class:
    description: The host's hardware class (C(sparkfleet_hardware_class)); its env, batch size and ceiling apply.
    type: str
  hardware_overrides:
    description: C(sparkfleet_hardware_overrides).
    type: dict
  catalog_extra:
    description: Further model catalog entries (C(vllm_catalog_extra)).
    type: dict
  memory_total_bytes:
    description: The host's memory pool (C(spark_facts) C(memory.pool_bytes)); null uses the class's figure.
    type: int
  vllm_version:
    description: The vLLM release of the image, for the catalog's known-broken combinations.
    type: str
  drop_caches:
    description: Drop the page cache before each launch; null takes the class's setting.
    type: bool
  overrides:
    description: C(vllm_instance_overrides), settings laid over named instances.
    type: dict
  gpus:
    description: Give the containers the GPUs.
    type: bool
  models_dir:
    description: Host directory mounted at /models.
    type: str
  cache_dir:
    description: Host directory of the caches.
    type: str
  config_dir:
    description: Where the env and plan files live.
    type: str
  env:
    description: C(vllm_env).
    type: dict
  health_timeout:
    description: Default seconds of the health gate.
    type: int
  host_addresses:
    description: The host's IP addresses; null when only the inventory is checked (the LAN checks are skipped).
    type: list
    elements: str
  wait_online_enabled:
    description: Whether Docker on this host is ordered after network-online.target; null when unknown.
    type: bool
  readiness_script:
    description: Path of the readiness wait on the host.
    type: str
  start_limit_interval:
    description: StartLimitIntervalSec of the units.
    type: int
  start_limit_burst:
    description: StartLimitBurst of the units.
    type: int
  restart_delay:
    description: RestartSec of the units.
    type: int
"""

EXAMPLES = r"""
- name: Plan this host's instances
  ansible.builtin.set_fact:
    plan: "{{ vllm_instances | sparkfleet.vllm.vllm_plan(vllm_instance_defaults, image=vllm_image, gmu_cap=0.85) }}"
  no_log: true
"""

RETURN = r"""
_value:
  description: C(instances) (the plan of each instance to run, in start order), C(absent) (names declared absent),
    C(errors) (every problem, each naming the variable to fix; when any, the rest is empty), C(warnings),
    C(hardware_class), C(gmu_cap) (the effective cap) and C(env_files).
  type: dict
"""

from ansible_collections.sparkfleet.vllm.plugins.module_utils._memory import admission_problem, parse_meminfo
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import pull_reference, run_image
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import validate_models
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import WILDCARDS, build_plan, canonical_address, drift_reasons, pool_share


def vllm_plan(instances, defaults, **options):
    return build_plan(instances, defaults, **options)


def vllm_drift(plan, files_changed, unit_state, container=None):
    return drift_reasons(plan, bool(files_changed), unit_state or None, container or None)


def vllm_listen_address_problem(address):
    """Why an address a daemon listens on is unfit (empty when fit): not one plain IP, or every interface."""
    canonical = canonical_address(address)
    if canonical is None or canonical != address:
        return f"{address!r} is not one IP address in its plain form"
    return f"{address} is every interface" if canonical in WILDCARDS else ""


def vllm_models_problems(models, allow_branch=False):
    return validate_models("vllm_models", models, bool(allow_branch))


def vllm_admission_problem(meminfo_bytes, name, gpu_memory_utilization):
    return admission_problem(name, float(gpu_memory_utilization), meminfo_bytes)


class FilterModule:
    def filters(self):
        return {
            "vllm_plan": vllm_plan,
            "vllm_drift": vllm_drift,
            "vllm_pull_reference": pull_reference,
            "vllm_run_image": run_image,
            "meminfo": parse_meminfo,
            "vllm_admission_problem": vllm_admission_problem,
            "vllm_models_problems": vllm_models_problems,
            "vllm_listen_address_problem": vllm_listen_address_problem,
            "vllm_pool_share": pool_share,
        }
