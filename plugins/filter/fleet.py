# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet check's cross-role and cross-host problems for playbooks; the logic is in module_utils."""

from __future__ import annotations

# The fleet check imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md). _run_tags is a leaf
# of a few lines.
from ansible_collections.sparkfleet.vllm.plugins.module_utils._run_tags import tag_in_run

# The variables the fleet check reads of each host besides the roles' folders: inventory settings and the plans the same
# play published.
READ = ("ansible_host", "ansible_port", "sparkfleet_reserved_ports", "sparkfleet_hardware_class", "vllm_endpoints", "cluster_name", "cluster_nodes",
        "cluster_instance",
        "cluster_master_port", "cluster_backend", "gateway_backends", "gateway_port", "vllm_models_source",
        "vllm_models_rsync_port")


def fleet_problems_filter(hosts, hostvars, inventory=None):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._fleet import ROLE_DEFAULT_FOLDERS, fleet_problems

    names_read = (*READ, *ROLE_DEFAULT_FOLDERS)

    def read(names):
        return {host: {name: hostvars[host][name] for name in names_read if name in hostvars[host]} for host in names}

    return fleet_problems(read(hosts), read(inventory or []))


class FilterModule:
    def filters(self):
        return {"fleet_problems": fleet_problems_filter, "tag_in_run": tag_in_run}
