# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hardware classes, the preflight verdict, the host-preparation settings and the packages still to
install for playbooks; the logic is in module_utils."""

from __future__ import annotations

import json

# Each filter imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md).


def hardware_class(name, overrides=None):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import resolve_class

    return resolve_class(name, overrides)


def inspect_object(stdout):
    """``docker image inspect --format '{{json .}}'`` prints the object; without --format, a list of them."""
    found = json.loads(stdout)
    return found[0] if isinstance(found, list) else found


def spark_preflight(facts, hardware_class_name, overrides=None, instances=None, images=None, missing_weights_gib=0.0,
                    min_free_disk_gib=None, remedies=None, device_nodes=None):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import resolve_class
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._preflight import preflight

    resolved = resolve_class(hardware_class_name, overrides)
    if resolved["errors"]:
        return {"ok": False, "checks": [], "reasons": resolved["errors"], "warnings": [], "lines": resolved["errors"]}
    inspected = [{"ref": result["item"], "inspect": inspect_object(result["stdout"]) if result["rc"] == 0 else None}
                 for result in images or [] if "rc" in result]
    return preflight(facts, hardware_class_name, resolved["values"], instances or [], inspected,
                     float(missing_weights_gib or 0), min_free_disk_gib, remedies or [], device_nodes)


def vllm_image_problems(inspect, ref, facts=None, hardware_class_name=None, overrides=None, level="fail"):
    """The image's failing checks (``level`` fail) or what it leaves unknown (``level`` warn), against the host and the
    CUDA floor of its hardware class."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import resolve_class
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._preflight import image_checks

    if not facts or not inspect:
        return []
    resolved = resolve_class(hardware_class_name, overrides) if hardware_class_name else {"values": {}}
    checks = image_checks([{"ref": ref, "inspect": inspect}], facts, resolved["values"].get("min_image_cuda"))
    return [f"{check['name']}: {check['detail']}" for check in checks if check["status"] == level]


def host_settings_problems(settings):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._memory import host_settings_problems as problems

    return problems(settings)


def packages_to_install(pins, facts):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_facts import packages_to_install as wanted

    return wanted(pins, facts)


def host_python_problem(version_text):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._preflight import host_python_problem as problem

    return problem(version_text)


class FilterModule:
    def filters(self):
        return {"hardware_class": hardware_class, "spark_preflight": spark_preflight, "vllm_image_problems": vllm_image_problems,
                "host_settings_problems": host_settings_problems, "packages_to_install": packages_to_install,
                "host_python_problem": host_python_problem}
