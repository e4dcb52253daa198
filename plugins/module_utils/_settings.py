# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The key-table shape of the cluster's and the gateway's role settings.

Private to the collection. Each role lists its scalar settings once (``Setting``: the key, its
kind, its bounds and why they are the bounds), and ``setting_problems`` checks a settings mapping
against the table, every problem at once, each naming the variable, what is wrong and the fix.
What only a role can judge (a subnet, an address against it, a drop-in's folder) stays with the
role; the shared kinds are the ones both read the same way. A value is read as the role's argument
spec reads its type: an extra variable (``-e cluster_ping_count=5``) arrives as text, which
validate_argument_spec accepts for an int, a float or a bool without converting the variable, so a
role passes its settings through ``coerced`` (``as_int``, ``as_float``, ``as_bool`` accept the same
text) before ``setting_problems`` checks their types and the plan uses them. Standard library only.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
import typing as t

# One path component as a unit file, an env file and a docker volume spec all carry it unchanged:
# no ':' (docker reads host:container:mode), no whitespace, no quoting, no shell or unit specials.
PATH_PART = re.compile(r"[A-Za-z0-9_@+][A-Za-z0-9_.@+-]*")
# Ansible's boolean spellings (module_utils.parsing.convert_bool), compared lower-cased.
TRUE_WORDS = frozenset({"y", "yes", "on", "1", "true", "t"})
FALSE_WORDS = frozenset({"n", "no", "off", "0", "false", "f"})
# A Debian package version as apt-get reads NAME=VERSION: epoch, upstream, revision; no spaces or commas.
DEBIAN_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One role setting: how it is checked; ``why`` is the reason its refusal gives for the bounds.
    For a path, ``low`` is the fewest components it may have."""

    name: str
    kind: str
    why: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()


def is_int(value: t.Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_int(value: t.Any) -> int | None:
    """A whole number as an argument spec's int takes it: an int, an integral float, or text of one
    (``"30"``, ``" 30 "``, ``"30.0"``); None otherwise. A bool is no number here, though Ansible would
    take true as 1: a switch given for a count is a mistake to name."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = decimal.Decimal(value.strip() if isinstance(value, str) else value)
    except (decimal.DecimalException, ValueError):
        return None
    if not number.is_finite() or number != number.to_integral_value():
        return None
    return int(number)


def as_float(value: t.Any) -> float | None:
    """A finite number as an argument spec's float takes it: an int, a float, or text of one (``"18"``, ``"18.5"``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def as_bool(value: t.Any) -> bool | None:
    """A bool as an argument spec's bool takes it: true or false, Ansible's words for them in any case
    (yes, no, on, off, y, n, t, f, 1, 0) and the numbers 1 and 0."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, (str, int, float)):
        return None
    word = value.strip().lower() if isinstance(value, str) else value
    if word in TRUE_WORDS or (not isinstance(word, str) and word == 1):
        return True
    if word in FALSE_WORDS or (not isinstance(word, str) and word == 0):
        return False
    return None


READERS: dict[str, t.Callable[[t.Any], t.Any]] = {"bool": as_bool, "port": as_int, "count": as_int, "number": as_float}


def coerced(table: t.Sequence[Setting], settings: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """``settings`` with each text value of a bool, port, count or number setting converted as the role's
    argument spec reads it. Only text: that is what an extra variable gives, and a value of another type
    (an int 1 for a switch, true for a count) was written so and is ``setting_problems``' to name, as is
    text that does not convert."""
    converted = dict(settings)
    for setting in table:
        reader = READERS.get(setting.kind)
        value = settings.get(setting.name)
        if reader and isinstance(value, str) and reader(value) is not None:
            converted[setting.name] = reader(value)
    return converted


def shown(number: float | None) -> str:
    return str(int(number)) if isinstance(number, float) and number.is_integer() else str(number)


def path_problem(value: t.Any, least_parts: int = 1) -> str | None:
    """What is wrong with an absolute path the role writes or mounts (None: nothing)."""
    if not isinstance(value, str) or not value.startswith("/"):
        return "must be an absolute path"
    parts = [part for part in value.split("/") if part]
    if any(part in (".", "..") for part in parts):
        return "must not step through '.' or '..' (the role would write outside the folder it names)"
    bad = [part for part in parts if not PATH_PART.fullmatch(part)]
    if bad:
        return (f"has {', '.join(map(repr, bad))}, which a unit file, an env file or a docker volume spec (host:container:mode) "
                "would not carry unchanged; use letters, digits and _.@+-")
    if len(parts) < least_parts:
        return f"is too close to / (give at least {least_parts} levels, such as /etc/sparkfleet/NAME)"
    return None


def normal_path(path: str) -> str:
    """One spelling of a path path_problem accepts, to compare it by: the kernel reads ``/etc//x/`` as
    ``/etc/x``, so a check comparing the text would let the doubled slash pass where ``/etc/x`` fails
    (posixpath.normpath keeps a leading ``//``, which POSIX leaves to the system; Linux reads it as ``/``)."""
    return "/" + "/".join(part for part in path.split("/") if part)


def dropin_problem(variable: str, path: t.Any, folders: t.Sequence[str], consequence: str) -> str | None:
    """Beyond being a path (path_problem's check): a drop-in its reader reads, a .conf file in one
    of ``folders`` (where systemd looks), worded to name ``variable``; compared in one spelling."""
    if path_problem(path):
        return None
    parent, name = normal_path(path).rsplit("/", 1)
    if parent in {normal_path(folder) for folder in folders} and name.endswith(".conf"):
        return None
    return (f"{variable}: {path} is not a file its reader reads: drop-ins end in .conf in {' or '.join(folders)} (such as "
            f"{folders[0]}/10-sparkfleet.conf), so {consequence}")


def value_problem(setting: Setting, value: t.Any) -> str | None:
    """What is wrong with one value (None: nothing), worded to follow ``<variable>: <value> ``."""
    kind = setting.kind
    if kind == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if kind == "choice":
        return None if value in setting.choices else f"is not one of {', '.join(setting.choices)}"
    if kind == "port":
        return None if is_int(value) and 1 <= value <= 65535 else f"must be a port number between 1 and 65535; {setting.why}"
    low, high = setting.low or 0, setting.high or 0
    if kind == "count":
        if is_int(value) and low <= value <= high:
            return None
        return f"must be a whole number from {shown(low)} to {shown(high)}; {setting.why}"
    if kind == "number":
        if not isinstance(value, bool) and isinstance(value, (int, float)) and low < value <= high:
            return None
        return f"must be a number above {shown(low)} and at most {shown(high)}; {setting.why}"
    if kind == "path":
        problem = path_problem(value, int(low or 1))
        return f"{problem}; {setting.why}" if problem else None
    if kind == "version":
        if value == "" or (isinstance(value, str) and DEBIAN_VERSION.fullmatch(value)):
            return None
        return f"must be empty or one Debian package version (such as 3:20221126-1+deb12u1); {setting.why}"
    raise ValueError(f"unknown setting kind {kind!r} of {setting.name}")


def setting_problems(prefix: str, table: t.Sequence[Setting], settings: t.Mapping[str, t.Any]) -> list[str]:
    """Every problem of ``settings`` (key -> value) against ``table``; a variable is ``prefix`` + key."""
    errors = []
    for setting in table:
        problem = value_problem(setting, settings.get(setting.name))
        if problem:
            errors.append(f"{prefix}{setting.name}: {settings.get(setting.name)!r} {problem}")
    return errors


def bounds_table(prefix: str, table: t.Sequence[Setting]) -> str:
    """The bounds of a table's settings and why, as docs/cluster.md and docs/gateway.md show them."""
    rows = ["| variable | bounds | why |", "|---|---|---|"]
    for setting in table:
        low, high = setting.low or 0, setting.high or 0
        bounds = {
            "count": f"{shown(low)} to {shown(high)}",
            "number": f"above {shown(low)}, at most {shown(high)}",
            "port": "1 to 65535",
            "path": "absolute, no `..`, no `:`" + (f", at least {shown(low)} levels" if low > 1 else ""),
            "version": "empty, or one Debian version",
        }.get(setting.kind)
        if bounds:
            rows.append(f"| `{prefix}{setting.name}` | {bounds} | {setting.why} |")
    return "\n".join(rows)
