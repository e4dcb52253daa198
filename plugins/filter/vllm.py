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
    weights, start-after list, launch checks, memory arithmetic, config hash, unit file, and every file's path with its
    last good copy), the names to remove, the host's folders, every error at once, the warnings, and the env files (the
    only part holding secrets; use it under no_log).
  - Every option is required and has no default of its own (the vllm role's defaults are the defaults); a missing or
    unknown option is an error naming it.
  - The same file provides C(vllm_removals) (the instances no longer planned), C(vllm_helper_files), C(vllm_model_folder),
    C(vllm_pull_reference), C(vllm_run_image), C(meminfo), C(vllm_models_problems), C(vllm_pulled_image_problems), C(py_spy_wheel), C(image_leftovers) and
    C(measure_documents_folder).
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
    required: true
  allow_floating_tag:
    description: Accept images not pinned by digest (C(vllm_allow_floating_tag)).
    type: bool
    required: true
  allow_wildcard_bind:
    description: Accept binding 0.0.0.0 or C(::) (C(vllm_allow_wildcard_bind)).
    type: bool
    required: true
  allow_dev_mode:
    description: Accept settings that open vLLM's engine controls, on loopback-only instances (C(vllm_allow_dev_mode)).
    type: bool
    required: true
  guard_digest:
    description: SHA-256 of the key middleware the containers mount; a changed middleware changes the config hash.
    type: str
    required: true
  registry_mirror:
    description: Registry the images are pulled through (C(vllm_registry_mirror)).
    type: str
    required: true
  gmu_cap:
    description: Highest sum of gpu_memory_utilization; null takes the hardware class's ceiling, above it is refused.
    type: float
    required: true
  hardware_class:
    description: The host's hardware class (C(sparkfleet_hardware_class)); its env, batch size and ceiling apply.
    type: str
    required: true
  hardware_overrides:
    description: C(sparkfleet_hardware_overrides).
    type: dict
    required: true
  catalog_extra:
    description: Further model catalog entries (C(vllm_catalog_extra)).
    type: dict
    required: true
  memory_total_bytes:
    description: The host's memory pool (C(spark_facts) C(memory.pool_bytes)); null uses the class's figure.
    type: int
    required: true
  vllm_version:
    description: The vLLM release of the image, for the catalog's known-broken combinations.
    type: str
    required: true
  drop_caches:
    description: Drop the page cache before each launch; null takes the class's setting.
    type: bool
    required: true
  overrides:
    description: C(vllm_instance_overrides), settings laid over named instances.
    type: dict
    required: true
  cluster:
    description: The cluster node this plan is for (the cluster role's), or null for the host's own instances.
    type: dict
    required: true
  reserved_gmu:
    description: The share of the memory pool the host's own instances take, which a cluster node leaves them.
    type: float
    required: true
  gpus:
    description: Give the containers the GPUs (C(vllm_gpus)).
    type: bool
    required: true
  models_dir:
    description: Host directory mounted at /models (C(vllm_models_dir)).
    type: str
    required: true
  cache_dir:
    description: Host directory of the caches (C(vllm_cache_dir)).
    type: str
    required: true
  config_dir:
    description: Where the env and plan files live (C(vllm_config_dir)).
    type: str
    required: true
  env:
    description: C(vllm_env).
    type: dict
    required: true
  health_timeout:
    description: Default seconds of the health gate for a warm start (C(vllm_health_timeout)).
    type: int
    required: true
  cold_timeout:
    description: Default seconds of the health gate for a cold start, which compiles (C(vllm_cold_timeout)).
    type: int
    required: true
  host_addresses:
    description: The host's IP addresses; null when only the inventory is checked (the LAN checks are skipped).
    type: list
    elements: str
    required: true
  wait_online_enabled:
    description: Whether Docker on this host is ordered after network-online.target; null when unknown.
    type: bool
    required: true
  memory_admission:
    description: Whether every start of the units checks the memory and the GPU's holders first (C(vllm_memory_admission)).
    type: bool
    required: true
  start_limit_interval:
    description: StartLimitIntervalSec of the units (C(vllm_start_limit_interval)).
    type: int
    required: true
  start_limit_burst:
    description: StartLimitBurst of the units (C(vllm_start_limit_burst)).
    type: int
    required: true
  restart_delay:
    description: RestartSec of the units (C(vllm_restart_delay)).
    type: int
    required: true
  kv_cache_warn_share:
    description: The share of the best good start's KV cache below which a start is warned of (C(vllm_kv_cache_warn_share)).
    type: float
    required: true
  maintenance_flag:
    description: The file that exists while a planned relaunch runs (C(vllm_maintenance_flag)); a file under C(/run).
    type: str
    required: true
  launch_paused_containers:
    description: Other programs' containers stopped around each launch (C(vllm_launch_paused_containers)).
    type: list
    elements: str
    required: true
  cache_backup_dir:
    description: Where the compile caches are backed up (C(vllm_cache_backup_dir)); empty for none.
    type: str
    required: true
  cache_backup_location:
    description: C(host) or C(controller) (C(vllm_cache_backup_location)).
    type: str
    required: true
  host_name:
    description: The host's inventory name, under which its backups are kept.
    type: str
    required: true
"""

EXAMPLES = r"""
# The vllm role's tasks/plan.yml passes every option from its variables; this is the same call without a cluster.
- name: Plan this host's instances
  ansible.builtin.set_fact:
    plan: >-
      {{ vllm_instances | sparkfleet.vllm.vllm_plan(vllm_instance_defaults, image=vllm_image,
         allow_floating_tag=vllm_allow_floating_tag, allow_wildcard_bind=vllm_allow_wildcard_bind, allow_dev_mode=vllm_allow_dev_mode,
         guard_digest='', registry_mirror=vllm_registry_mirror, gmu_cap=vllm_gmu_cap, hardware_class=sparkfleet_hardware_class,
         hardware_overrides={}, catalog_extra=vllm_catalog_extra, memory_total_bytes=none, vllm_version=vllm_version,
         drop_caches=vllm_drop_caches, overrides=vllm_instance_overrides, cluster=none, reserved_gmu=0, gpus=vllm_gpus,
         models_dir=vllm_models_dir, cache_dir=vllm_cache_dir, config_dir=vllm_config_dir, env=vllm_env,
         health_timeout=vllm_health_timeout, cold_timeout=vllm_cold_timeout, host_addresses=ansible_facts.all_ipv4_addresses + ['127.0.0.1'],
         wait_online_enabled=true, memory_admission=vllm_memory_admission,
         start_limit_interval=vllm_start_limit_interval, start_limit_burst=vllm_start_limit_burst,
         restart_delay=vllm_restart_delay, kv_cache_warn_share=vllm_kv_cache_warn_share, maintenance_flag=vllm_maintenance_flag,
         launch_paused_containers=vllm_launch_paused_containers, cache_backup_dir=vllm_cache_backup_dir,
         cache_backup_location=vllm_cache_backup_location, host_name=inventory_hostname) }}
  no_log: true
"""

RETURN = r"""
_value:
  description: C(instances) (the plan of each instance to run, in start order), C(absent) (names declared absent),
    C(errors) (every problem, each naming the variable to fix; when any, the rest is empty), C(warnings),
    C(hardware_class), C(gmu_cap) (the effective cap) and C(env_files).
  type: dict
"""

import pathlib

from ansible.errors import AnsibleFilterError

# Each filter imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md).


def vllm_plan(instances, defaults, **options):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import build_plan

    return build_plan(instances, defaults, **options)


def vllm_helper_files(helpers, collection_root):
    """The plan's helpers as host_files takes them: each source read from the collection on the controller."""
    root = pathlib.Path(collection_root).resolve()
    files = []
    for helper in helpers:
        source = (root / helper["source"]).resolve()
        if root not in source.parents or not source.is_file():
            raise AnsibleFilterError(f"vllm_helper_files: {helper['source']!r} is not a file of the collection at {root}")
        files.append({"path": helper["path"], "mode": helper["mode"], "content": source.read_text(encoding="utf-8")})
    return files


def host_runtime(collection_root):
    """The host runtime's folders and files as host_files takes them, each file read from the collection."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import runtime_files

    folders, files = runtime_files()
    return {"folders": folders, "files": vllm_helper_files(files, collection_root)}


def vllm_removals(deployed_paths, plan, config_dir):
    """Paths of the host's units and plan files -> what removing each instance deployed but no longer planned (or declared
    absent) stops and deletes."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import deployed_instances, removal

    planned = {instance["name"] for instance in plan["instances"]}
    names = sorted(set(deployed_instances(deployed_paths or [], config_dir)) | set(plan["absent"]))
    return [removal(config_dir, name, False) for name in names if name not in planned]


def vllm_listen_address_problem(address):
    """Why an address a daemon listens on is unfit (empty when fit): not one plain IP, or every interface."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import WILDCARDS, canonical_address

    canonical = canonical_address(address)
    if canonical is None or canonical != address:
        return f"{address!r} is not one IP address in its plain form"
    return f"{address} is every interface" if canonical in WILDCARDS else ""


def vllm_models_problems(models, allow_branch=False):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import validate_models

    return validate_models("vllm_models", models, bool(allow_branch))


def vllm_pulled_image_problems(instances, pulled, stated_version="", stated_image=""):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import pulled_image_problems

    return pulled_image_problems(instances or [], pulled or {}, stated_version or None, stated_image or "")


def measure_documents_folder(label):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import documents_folder

    try:
        return documents_folder(label)
    except ValueError as error:
        raise AnsibleFilterError(f"measure_documents_folder: {error}") from None


def vllm_model_folder(model):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import model_folder

    return model_folder(model)


def vllm_pull_reference(image, mirror=""):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import pull_reference

    return pull_reference(image, mirror)


def vllm_run_image(image, mirror=""):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import run_image

    return run_image(image, mirror)


def meminfo(text):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._memory import parse_meminfo

    return parse_meminfo(text)


def vllm_pool_share(instances, defaults):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import pool_share

    return pool_share(instances, defaults)


def py_spy_wheel(wheels, architecture=None):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._py_spy import wheel_for

    return wheel_for(wheels, architecture)


def image_leftovers(records, listing, jit_root):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._image_release import image_leftovers as leftovers

    return leftovers(records, listing, jit_root)


class FilterModule:
    def filters(self):
        return {
            "vllm_plan": vllm_plan,
            "vllm_removals": vllm_removals,
            "vllm_helper_files": vllm_helper_files,
            "host_runtime": host_runtime,
            "vllm_model_folder": vllm_model_folder,
            "vllm_pull_reference": vllm_pull_reference,
            "vllm_run_image": vllm_run_image,
            "measure_documents_folder": measure_documents_folder,
            "meminfo": meminfo,
            "vllm_models_problems": vllm_models_problems,
            "vllm_listen_address_problem": vllm_listen_address_problem,
            "vllm_pool_share": vllm_pool_share,
            "vllm_pulled_image_problems": vllm_pulled_image_problems,
            "py_spy_wheel": py_spy_wheel,
            "image_leftovers": image_leftovers,
        }
