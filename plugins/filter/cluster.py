# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's layout and its agreement checks for the cluster role; the logic is in module_utils."""

from __future__ import annotations

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import agreement_problems, cluster_nodes
from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import nccl_buffer_problem, nccl_max_bytes


def cluster_layout(declaration, reports, inventory):
    return cluster_nodes(declaration, reports, inventory)


def cluster_agreement(reports, nodes):
    errors, warnings = agreement_problems(nodes, reports)
    return {"errors": errors, "warnings": warnings}


def cluster_nccl_problem(command, pool_bytes=None):
    return nccl_buffer_problem(nccl_max_bytes(command), pool_bytes) if command else None


class FilterModule:
    def filters(self):
        return {"cluster_layout": cluster_layout, "cluster_agreement": cluster_agreement, "cluster_nccl_problem": cluster_nccl_problem}
