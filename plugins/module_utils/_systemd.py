# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing command lines into systemd unit files, and reading the states of several units in one
``systemctl show``. Private to the collection."""

from __future__ import annotations

import re
import typing as t

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.@\\-]{0,250}")
UNIT_PROPERTIES = ("LoadState", "ActiveState", "UnitFileState")


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


def show_states_args(units: t.Sequence[str]) -> list[str]:
    """systemctl's arguments that show the states of ``units``."""
    return ["show", *[f"--property={name}" for name in UNIT_PROPERTIES], "--", *units]


def parse_show_states(units: t.Sequence[str], out: str) -> dict[str, dict[str, str]]:
    """Each asked unit's LoadState, ActiveState and UnitFileState from ``systemctl show``'s output:
    one block per unit in the order asked, blank lines between. Keyed by the name asked, since an
    alias is shown as its unit (the alias of an enabled unit reads enabled)."""
    blocks = out.strip("\n").split("\n\n") if out.strip() else []
    if len(blocks) != len(units):
        raise ValueError(f"systemctl show answered {len(blocks)} blocks for {len(units)} units")
    states = {}
    for unit, block in zip(units, blocks, strict=True):
        values = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[unit] = {name: values.get(name, "") for name in UNIT_PROPERTIES}
    return states


def listed_unit_states(output: str) -> dict[str, str]:
    """Each unit file ``systemctl list-unit-files --no-legend --plain`` lists, with its state."""
    states = {}
    for line in output.splitlines():
        fields = line.split()
        if fields:
            states[fields[0]] = fields[1] if len(fields) > 1 else ""
    return states
