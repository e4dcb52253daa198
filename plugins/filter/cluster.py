# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's layout and its agreement checks for the cluster role; the logic is in module_utils."""

from __future__ import annotations

# Each filter imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md).

# What each node's own host vars add to the declaration of its group: key -> variable.
NODE_VARS = {"ansible_host": "ansible_host", "ansible_port": "ansible_port", "node_env": "cluster_node_env",
             "vllm_env": "vllm_env", "fast_interface": "cluster_fast_interface", "rdma_devices": "cluster_rdma_devices",
             "gid_index": "cluster_gid_index"}

# What the cross-host check reads of each host.
FLEET_VARS = ("cluster_name", "cluster_nodes", "sparkfleet_hardware_class")


def cluster_layout(declaration, reports, inventory):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import cluster_nodes

    return cluster_nodes(declaration, reports, inventory)


def cluster_agreement(reports, nodes):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import agreement_problems

    errors, warnings = agreement_problems(nodes, reports)
    return {"errors": errors, "warnings": warnings}


def cluster_nccl_problem(command, pool_bytes=None):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import nccl_buffer_problem

    return nccl_buffer_problem(command, pool_bytes) if command else None


def cluster_node_vars(nodes, hostvars):
    known = [node for node in nodes if isinstance(node, str) and node in hostvars] if isinstance(nodes, list) else []
    node_vars = {}
    for node in known:
        variables = hostvars[node]
        values = {key: variables[name] for key, name in NODE_VARS.items() if name in variables}
        values["hardware_env"] = (variables.get("sparkfleet_hardware_overrides") or {}).get("env")
        node_vars[node] = values
    return node_vars


def cluster_fleet_problems(hosts, hostvars, cluster=None):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import fleet_cluster_problems

    declarations = {host: {name: hostvars[host][name] for name in FLEET_VARS if name in hostvars[host]}
                    for host in hosts if host in hostvars}
    return fleet_cluster_problems(declarations, cluster or None)


def cluster_stale_ranks(deployed, keep, config_dir):
    """The host's rank plan files (path -> text, as folder_files_info reads them) -> the ranks to remove and the files refused."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import stale_ranks

    return stale_ranks({path: text for path, text in (deployed or {}).items() if text is not None}, keep or "", config_dir)


def cluster_nccl_probe(image):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import nccl_probe_argv

    return nccl_probe_argv(image)


def cluster_nccl_verdict(probe, serve_args, image):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import nccl_verdict

    return nccl_verdict(probe if isinstance(probe, dict) else {}, serve_args or [], image)


class FilterModule:
    def filters(self):
        return {"cluster_layout": cluster_layout, "cluster_agreement": cluster_agreement, "cluster_nccl_problem": cluster_nccl_problem,
                "cluster_node_vars": cluster_node_vars, "cluster_fleet_problems": cluster_fleet_problems,
                "cluster_stale_ranks": cluster_stale_ranks, "cluster_nccl_probe": cluster_nccl_probe,
                "cluster_nccl_verdict": cluster_nccl_verdict}
