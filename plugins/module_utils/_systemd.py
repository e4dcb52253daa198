# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing command lines into systemd unit files. Private to the collection."""

from __future__ import annotations

import re
import typing as t

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


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
