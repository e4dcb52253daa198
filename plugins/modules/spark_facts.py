#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spark_facts
short_description: Read what a serving host is (board, GPU, driver, unified memory, swap, device holders, Docker)
version_added: 0.3.0
description:
  - Reads, and never changes, the facts the preflight and the instance plan need. The board from DMI (DGX Spark
    Founders Edition, ASUS GX10, other), the OS release, the CPU architecture, the NVIDIA driver version and branch,
    the GPU's name and compute capability, its SM clock, power draw and utilisation (seed 002's power-delivery wedge
    shows as a clock under 1 GHz and under 15 W while loaded).
  - Memory is read where it really is. nvidia-smi reports C([N/A]) for memory on a GB10, so on a unified pool the
    total and the available memory come from C(/proc/meminfo); on a discrete card from nvidia-smi.
  - Swap that is active (C(/proc/swaps)) or comes back at boot (C(/etc/fstab)); the processes other than
    nvidia-persistenced that hold the GPU's device nodes, each marked with the collection's container it runs in,
    if any; Docker's version and whether the NVIDIA runtime is configured; the running instance containers; the
    free disk at the models directory; the state of the sleep and suspend targets; how many package indexes apt
    holds and how old they are (none on a host that never fetched its lists).
  - With O(network), the host's network facts as C(setup) gathers them (C(gather_subset=network)), so the plan's
    bind addresses and a cluster's fast link are read in this same call.
  - A host without a GPU (the CPU lab) is reported as such, with the nvidia-smi error, rather than failing.
  - All parsing is in the collection's private module_utils C(_host_facts), tested on recorded real outputs.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  models_dir:
    description: Directory whose free disk is reported (its nearest existing parent when it does not exist yet).
    type: path
    default: /srv/models
  cache_dir:
    description: The vllm role's cache folder (C(vllm_cache_dir)), whose C(huggingface/) folder's usage is reported.
    type: path
    default: /var/cache/sparkfleet/vllm
  device_nodes:
    description: Glob patterns of the device nodes whose holders are reported.
    type: list
    elements: str
    default: ['/dev/nvidia*']
  network:
    description:
      - Also return the network facts (addresses, interfaces, default routes) as host facts, the ones
        C(ansible.builtin.setup) returns with C(gather_subset=network), without the minimal set it adds.
    type: bool
    default: false
  packages:
    description:
      - Debian packages whose installed version C(facts.packages) gives (None for one not installed), read with one
        C(dpkg-query); the roles skip an install the host already has at its pin.
    type: list
    elements: str
    default: []
  docker_network_dropin:
    description:
      - The drop-in that orders C(docker.service) after the network (the wait_online role's); C(facts.docker.waits_for_network)
        says whether it exists. Omitted, that fact is false.
    type: path
  rdma:
    description:
      - Also read the RDMA device ports (C(ibdev2netdev)) and the GID table (C(show_gids)) into C(facts.rdma), as
        M(sparkfleet.vllm.cluster_fabric) reads them; a cluster's node reports them to the other nodes.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: Read-only; the same facts in check mode.
  diff_mode:
    support: none
    details: Changes nothing, so there is nothing to diff.
  idempotent:
    support: full
    details: Reads only.
notes:
  - Reading other processes' open files needs root, as does reading the holders of the device nodes.
"""

EXAMPLES = r"""
- name: Read the host's facts
  sparkfleet.vllm.spark_facts:
    models_dir: /srv/models
  register: spark

- name: Show the unified pool
  ansible.builtin.debug:
    msg: "{{ (spark.facts.memory.pool_bytes / 1024**3) | round(2) }} GiB, {{ spark.facts.gpu.name or 'no GPU' }}"
"""

RETURN = r"""
ok:
  description: True; the module only fails when it cannot read the host at all.
  returned: always
  type: bool
reasons:
  description: Empty; present for the collection's common result shape.
  returned: always
  type: list
  elements: str
facts:
  description:
    - C(board) (kind dgx_spark, asus_gx10, other or unknown; vendor, product, bios_version), C(os), C(architecture).
    - C(gpu) (present, count, name, driver_version, driver_branch, compute_capability, memory_reported, sm_clock_mhz,
      power_draw_w, utilization_percent, detail when there is none).
    - C(memory) (source, unified, pool_bytes, available_bytes, system_total_bytes, system_available_bytes).
    - C(swap) (active, fstab), C(device_holders) (pid, command, paths, container), C(docker) (present, version,
      runtimes, default_runtime, architecture, nvidia_runtime, instance_containers), C(disk) (path, free_bytes,
      total_bytes), C(sleep_targets) (unit -> state; empty when systemd did not answer, and then
      C(sleep_targets_error) says why, otherwise None), C(power) (loaded, wedge_suspected, reason),
      C(package_lists) (indexes, the number of package indexes apt holds; age_seconds, the newest one's age, or None),
      C(packages) (each package of O(packages) with its installed version, or None).
    - C(storage), what fills a serving host's disks, each folder as C(path), C(exists), C(used_bytes) (walked without
      following links, at most 200000 files; C(complete) false when it stopped there), C(free_bytes) and C(total_bytes)
      of its filesystem; C(var_tmp) (C(/var/tmp)), C(hf_cache) (O(cache_dir)C(/huggingface)), and
      C(docker_reclaimable_bytes) (what C(docker system df) says a prune would free, or None).
    - C(docker) also holds C(client), whether the Docker client the units run (C(/usr/bin/docker)) exists, and
      C(waits_for_network), whether O(docker_network_dropin) exists.
    - With O(rdma), C(rdma) (rdma_links, gids and tools, as M(sparkfleet.vllm.cluster_fabric) returns them).
  returned: always
  type: dict
ansible_facts:
  description: The network facts, with O(network) only (their names as C(setup) gives them, C(ansible_default_ipv4) and so on).
  returned: when O(network) is true
  type: dict
"""

import os
import platform
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.facts.namespace import PrefixFactNamespace
from ansible.module_utils.facts.network.linux import LinuxNetworkCollector

from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import read_rdma
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_facts import (
    NVIDIA_SMI_ARGS,
    SLEEP_TARGETS,
    UNIT_STATE_PROPERTIES,
    dpkg_query_args,
    folder_usage,
    installed_packages,
    package_lists,
    package_name_problems,
    parse_docker_df,
    summarise,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, show_units
from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import device_holders, open_files, process_cgroup
from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import read_text as read
from ansible_collections.sparkfleet.vllm.plugins.module_utils._tools import tool_runner
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import INSTANCE_LABEL
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import HF_CACHE

DMI_FIELDS = ("sys_vendor", "product_name", "board_vendor", "board_name", "bios_version")
APT_LISTS = "/var/lib/apt/lists"
# Where a GX10's /var/tmp grew to 303 GB (epappas/gx10-cluster): reported by preflight.
VAR_TMP = "/var/tmp"


def file_mtimes(folder):
    """Each file's modification time in a folder; empty when the folder cannot be read."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return {}
    mtimes = {}
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                mtimes[entry.name] = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
    return mtimes


def disk(models_dir):
    path = models_dir
    while not os.path.isdir(path) and path != "/":
        path = os.path.dirname(path) or "/"
    stats = os.statvfs(path)
    return {"path": path, "free_bytes": stats.f_bavail * stats.f_frsize, "total_bytes": stats.f_blocks * stats.f_frsize}


def network_facts(module):
    """The facts setup's network subset gathers, named as setup names them."""
    collector = LinuxNetworkCollector(namespace=PrefixFactNamespace(namespace_name="ansible", prefix="ansible_"))
    return collector.collect_with_namespace(module=module)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            models_dir=dict(type="path", default="/srv/models"),
            cache_dir=dict(type="path", default="/var/cache/sparkfleet/vllm"),
            device_nodes=dict(type="list", elements="str", default=["/dev/nvidia*"]),
            network=dict(type="bool", default=False),
            packages=dict(type="list", elements="str", default=[]),
            docker_network_dropin=dict(type="path"),
            rdma=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    packages = module.params["packages"]
    problems = package_name_problems(packages)
    if problems:
        module.fail_json(msg="; ".join(problems))
    dpkg_query = module.get_bin_path("dpkg-query") if packages else None
    # dpkg-query exits 1 when a package is unknown and still lists the others.
    packages_text = module.run_command([dpkg_query, *dpkg_query_args(packages)])[1] if dpkg_query else ""
    nvidia_smi = module.get_bin_path("nvidia-smi")
    gpu_text, gpu_error = None, "is not installed"
    if nvidia_smi:
        rc, out, err = module.run_command([nvidia_smi, *NVIDIA_SMI_ARGS])
        gpu_text, gpu_error = (out, None) if rc == 0 else (None, (err or out).strip() or f"exited {rc}")
    docker = module.get_bin_path("docker")
    docker_text, containers, docker_df = None, {}, None
    if docker:
        rc, out, _err = module.run_command([docker, "info", "--format", "{{json .}}"])
        docker_text = out if rc == 0 else None
        rc, out, _err = module.run_command([docker, "ps", "--no-trunc", "--filter", f"label={INSTANCE_LABEL}",
                                            "--format", "{{.ID}} {{.Names}}"])
        containers = dict(line.split(" ", 1) for line in out.splitlines() if " " in line) if rc == 0 else {}
        rc, out, _err = module.run_command([docker, "system", "df", "--format", "{{json .}}"])
        docker_df = parse_docker_df(out) if rc == 0 else None
    holders = device_holders(open_files(), module.params["device_nodes"])
    for holder in holders:
        cgroup = process_cgroup(holder["pid"])
        holder["container"] = next((name for cid, name in containers.items() if cid in cgroup), None)
    systemctl = module.get_bin_path("systemctl")
    # Facts report what the host answers; preflight names sleep targets whose states were not read, and why.
    units, units_error = {}, None if systemctl else "systemctl is not on the host's PATH"
    if systemctl:
        try:
            units = show_units(module.run_command, list(SLEEP_TARGETS), UNIT_STATE_PROPERTIES, systemctl)
        except StateUnanswered as error:
            units_error = str(error)
    facts = summarise(
        dmi={name: read(f"/sys/class/dmi/id/{name}") or None for name in DMI_FIELDS},
        os_release=read("/etc/os-release"),
        architecture=platform.machine(),
        gpu_text=gpu_text,
        gpu_error=gpu_error,
        meminfo_text=read("/proc/meminfo"),
        swaps_text=read("/proc/swaps"),
        fstab_text=read("/etc/fstab"),
        holders=holders,
        docker_text=docker_text,
        disk=disk(module.params["models_dir"]),
        units=units,
        lists=package_lists(file_mtimes(APT_LISTS), time.time()),
        packages=installed_packages(packages_text, packages),
    )
    facts["docker"]["instance_containers"] = sorted(containers.values())
    facts["sleep_targets_error"] = units_error
    facts["storage"] = {"var_tmp": folder_usage(VAR_TMP), "hf_cache": folder_usage(os.path.join(module.params["cache_dir"], HF_CACHE[0])),
                        "docker_reclaimable_bytes": docker_df}
    facts["docker"]["client"] = os.path.exists(DOCKER_CLIENT)
    dropin = module.params["docker_network_dropin"]
    facts["docker"]["waits_for_network"] = bool(dropin) and os.path.exists(dropin)
    if module.params["rdma"]:
        facts["rdma"] = read_rdma(tool_runner(module))
    extra = {}
    if module.params["network"]:
        # As setup does with a collector that fails: the other facts are still worth the read.
        try:
            extra["ansible_facts"] = network_facts(module)
        except Exception as error:  # pylint: disable=broad-exception-caught
            module.warn(f"the network facts could not be read ({error}); the plan cannot check the instances' bind addresses")
            extra["ansible_facts"] = {}
    module.exit_json(changed=False, ok=True, reasons=[], facts=facts, **extra)


if __name__ == "__main__":
    main()
