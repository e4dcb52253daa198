"""build_plan's options as roles/vllm/tasks/plan.yml passes them: the role's defaults
(roles/vllm/defaults/main.yml, the one place they are defined) and, for what the role reads
from the inventory, the host and its own files, the values of a test host. A test states only
what it changes."""

import copy
import hashlib
import pathlib

import yaml

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import PLAN_OPTIONS

ROLE = pathlib.Path(__file__).resolve().parents[2] / "roles" / "vllm"
ROLE_DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
PLAN_TASKS = (ROLE / "tasks" / "plan.yml").read_text()
PLAN_TASK = next(task for task in yaml.safe_load(PLAN_TASKS) if task["name"] == "Plan the vLLM instances of this host")
# The settings a host's plans share (its instances' and a cluster node's), as the task builds them.
NODE_SETTINGS = PLAN_TASK["vars"]["__vllm_node_settings"]
# The role variable of each option that is not named vllm_<option>.
ROLE_VARIABLES = {"vllm_version": "vllm_version", "overrides": "vllm_instance_overrides"}
TEST_HOST = {
    # sparkfleet_hardware_class and its overrides are inventory variables without a default.
    "hardware_class": "dgx_spark",
    "hardware_overrides": {},
    # The role hashes its middleware as the file lookup reads it, trailing newline stripped.
    "guard_digest": hashlib.sha256((ROLE / "files" / "sparkfleet_vllm_guard.py").read_text().rstrip().encode()).hexdigest(),
    # The host's own instances, not a cluster node beside them.
    "cluster": None,
    "reserved_gmu": 0,
    # Facts of a host with loopback only, no wait_online role and no preflight fact of its memory pool.
    "host_addresses": ["127.0.0.1", "::1"],
    "wait_online_enabled": False,
    "memory_total_bytes": None,
    # inventory_hostname.
    "host_name": "spark-1",
}


def plan_options(**changes):
    """Every option of build_plan, ``changes`` laid over them (build_plan refuses a name that is no option)."""
    options = {name: ROLE_DEFAULTS[ROLE_VARIABLES.get(name, f"vllm_{name}")] for name in PLAN_OPTIONS if name not in TEST_HOST}
    # A copy, so no plan shares a mapping with the next.
    return copy.deepcopy({**options, **TEST_HOST, **changes})
