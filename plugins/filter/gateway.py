# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's plan for the gateway role; the logic is in module_utils."""

from __future__ import annotations

# Each filter imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md).


def gateway_plan_filter(settings, hostvars, gateway_host):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import backend_reports, gateway_plan

    names = settings.get("backends") if isinstance(settings, dict) else None
    return gateway_plan(settings, backend_reports(names, hostvars), gateway_host)


def gateway_settings_problems(settings):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import DEFAULT_SETTINGS, settings_problems

    return settings_problems({**DEFAULT_SETTINGS, **settings})


def gateway_routers(gateways, hostvars, drain, undrain=()):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import DEFAULT_SETTINGS, drain_requests

    known = [gateway for gateway in gateways if gateway in hostvars]
    requests = drain_requests(known, {gateway: hostvars[gateway].get("gateway_backends") or [] for gateway in known},
                              list(drain), list(undrain))
    for request in requests:
        request["config_dir"] = hostvars[request["gateway"]].get("gateway_config_dir") or DEFAULT_SETTINGS["config_dir"]
    return requests


class FilterModule:
    def filters(self):
        return {"gateway_plan": gateway_plan_filter, "gateway_settings_problems": gateway_settings_problems,
                "gateway_routers": gateway_routers}
