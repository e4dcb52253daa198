# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog role's plan; the logic is in module_utils/_watchdog.py."""

from __future__ import annotations

from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import watchdog_plan


class FilterModule:
    def filters(self):
        return {"watchdog_plan": watchdog_plan}
