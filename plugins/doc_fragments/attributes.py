# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return what would change without changing the host.
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run with C(--diff).
  idempotent:
    description:
      - When run twice in a row outside check mode with the same arguments, the second run reports no change.
      - This assumes the host and the endpoints the module reads did not change in between.
  action_group:
    description: Use C(group/sparkfleet.vllm.sparkfleet_vllm) in C(module_defaults) to set defaults for this module.
    support: full
    membership:
      - sparkfleet.vllm.sparkfleet_vllm
"""
