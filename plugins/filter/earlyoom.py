# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: earlyoom_config
short_description: Validate earlyoom settings and build its arguments
version_added: 0.1.0
description:
  - Turns plain process names into the anchored C(--prefer)/C(--avoid) regexes earlyoom expects, writing
    regex characters as one-character classes (C([(]), C([)])) because systemd strips backslashes from
    C(/etc/default/earlyoom).
  - Reports every problem at once, each naming the role variable to fix. Problems are a threshold out of
    range, a name that cannot match (longer than the 15 characters of a process name), a regex that does not
    compile, and an avoid pattern that would shield the model server (the inverse configuration of seed 000).
  - Bounds are C(memory_percent) 1 to 50, C(memory_kill_percent) 1 up to it, C(report_interval) 0 to 86400 and,
    in C(extra_args), swap thresholds C(-s) 1 to 100 percent and C(-S) at least 1 KiB (0 is never reached, so
    earlyoom, which acts when memory and swap are both low, would never act while swap is in use).
author: sparkfleet.vllm contributors (@sparkfleet)
positional: _input
options:
  _input:
    description: The earlyoom role's settings.
    type: dict
    required: true
    suboptions:
      memory_percent:
        description: C(-m) threshold in percent of available memory.
        type: int
      memory_kill_percent:
        description: SIGKILL threshold in percent; null for earlyoom's default.
        type: int
      report_interval:
        description: C(-r) seconds between memory reports.
        type: int
      prefer_lists:
        description: Role variable name to list of plain process names earlyoom should kill first.
        type: dict
      avoid_lists:
        description: Role variable name to list of plain process names earlyoom should spare.
        type: dict
      model_server_names:
        description: Process names of the model server, which the avoid pattern must never match.
        type: list
        elements: str
      prefer_regex:
        description: A full regex used instead of the one built from the prefer names.
        type: str
      avoid_regex:
        description: A full regex used instead of the one built from the avoid names.
        type: str
      extra_args:
        description: Further earlyoom arguments, appended as given.
        type: list
        elements: str
"""

EXAMPLES = r"""
- name: Build earlyoom's arguments
  ansible.builtin.set_fact:
    earlyoom_rendered: >-
      {{ {'memory_percent': 4, 'memory_kill_percent': none, 'report_interval': 3600,
          'prefer_lists': {'earlyoom_prefer_names': ['VLLM::EngineCor', 'vllm']},
          'avoid_lists': {'earlyoom_avoid_names': ['sshd', 'systemd*', '(systemd)']},
          'model_server_names': ['VLLM::EngineCor', 'vllm']} | sparkfleet.vllm.earlyoom_config }}
"""

RETURN = r"""
_value:
  description: C(args) (list of earlyoom arguments), C(prefer_regex), C(avoid_regex) and C(errors) (list of str).
  type: dict
"""

# The filter imports its module_utils when it runs: a task's worker, to find one of the collection's filters, loads
# every filter file before it, and compiles what they import from source (see docs/performance.md).


def earlyoom_config_filter(settings):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._earlyoom import earlyoom_config

    return earlyoom_config(
        memory_percent=settings.get("memory_percent"),
        memory_kill_percent=settings.get("memory_kill_percent"),
        report_interval=settings.get("report_interval"),
        prefer_lists=settings.get("prefer_lists") or {},
        avoid_lists=settings.get("avoid_lists") or {},
        model_server_names=settings.get("model_server_names") or [],
        prefer_regex=settings.get("prefer_regex") or "",
        avoid_regex=settings.get("avoid_regex") or "",
        extra_args=settings.get("extra_args") or [],
    )


class FilterModule:
    def filters(self):
        return {"earlyoom_config": earlyoom_config_filter}
