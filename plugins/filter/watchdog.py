# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog role's plan; the logic is in module_utils/_watchdog.py."""

from __future__ import annotations

# Each filter imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md).


def watchdog_plan_filter(settings, plan_dirs, serving_dirs, node, gateway_config_dir):
    """``gateway_config_dir``: the host's gateway's folder, None when the inventory leaves it at the gateway role's
    default, "" when the host runs no gateway. A whole number given as text (``-e watchdog_interval=30``: extra variables
    are text) is read as the role's argument spec reads it, here on the controller: the host's copy of _watchdog.py
    stands alone and gets the numbers in its configuration file."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import DEFAULT_SETTINGS as GATEWAY_DEFAULTS
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import as_int
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import SETTINGS, watchdog_plan

    folder = GATEWAY_DEFAULTS["config_dir"] if gateway_config_dir is None else gateway_config_dir
    read = {name: as_int(value) if name in SETTINGS and isinstance(value, str) and as_int(value) is not None else value
            for name, value in settings.items()}
    return watchdog_plan(read, plan_dirs, serving_dirs, node, folder)


def watchdog_peer_access(reports, host, previous=None, inventory=()):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import peer_access

    return peer_access(host, reports, previous, inventory)


def watchdog_kept_gateways(previous, host, play_hosts, inventory):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import kept_gateways

    return kept_gateways(host, previous, play_hosts, inventory)


def watchdog_has_peers(deployed, host):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import has_peers

    return has_peers(host, deployed)


def watchdog_host_addresses(facts):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import host_addresses

    return host_addresses(facts)


class FilterModule:
    def filters(self):
        return {"watchdog_plan": watchdog_plan_filter, "watchdog_peer_access": watchdog_peer_access,
                "watchdog_host_addresses": watchdog_host_addresses, "watchdog_has_peers": watchdog_has_peers, "watchdog_kept_gateways": watchdog_kept_gateways}
