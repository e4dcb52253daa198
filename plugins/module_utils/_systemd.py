# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing command lines into systemd unit files, unit names, and the unit files systemd lists (a unit's state is
_host_state's). Private to the collection."""

from __future__ import annotations

import re
import typing as t

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.@\\-]{0,250}")
# What the modules read of a unit: whether systemd knows it, runs it and starts it at boot.
UNIT_PROPERTIES = ("LoadState", "ActiveState", "UnitFileState")
# A property's name as systemctl show takes it (NRestarts, ActiveEnterTimestamp): it reaches systemctl's command line.
PROPERTY_NAME = re.compile(r"[A-Z][A-Za-z]{0,63}")


def quote_exec_argument(argument: str) -> str:
    """One argument as systemd's Exec*= parser reads it back unchanged.

    systemd expands % specifiers and $ variables and splits on whitespace; inside double
    quotes it takes C-style backslash escapes.
    """
    escaped = argument.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(argument):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def exec_line(arguments: t.Sequence[str]) -> str:
    return " ".join(quote_exec_argument(str(argument)) for argument in arguments)


def unit_name_problems(units: t.Sequence[t.Any]) -> list[str]:
    return [f"units[{index}]: {unit!r} is not a systemd unit name (letters, digits and :_.@\\-)"
            for index, unit in enumerate(units) if not isinstance(unit, str) or not UNIT_NAME.fullmatch(unit)]


def property_name_problems(properties: t.Sequence[t.Any]) -> list[str]:
    return [f"properties[{index}]: {name!r} is not a systemd property name (such as NRestarts: a capital, then letters)"
            for index, name in enumerate(properties) if not isinstance(name, str) or not PROPERTY_NAME.fullmatch(name)]


def listed_unit_states(output: str) -> dict[str, str]:
    """Each unit file ``systemctl list-unit-files --no-legend --plain`` lists, with its state."""
    states = {}
    for line in output.splitlines():
        fields = line.split()
        if fields:
            states[fields[0]] = fields[1] if len(fields) > 1 else ""
    return states
