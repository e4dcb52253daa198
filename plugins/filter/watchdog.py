# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog role's plan; the logic is in module_utils/_watchdog.py."""

from __future__ import annotations

from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import peer_access, watchdog_plan


def watchdog_peer_access(reports, host):
    return peer_access(host, reports)


class FilterModule:
    def filters(self):
        return {"watchdog_plan": watchdog_plan, "watchdog_peer_access": watchdog_peer_access}
