# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What systemd and Docker say of the host's units and containers: the one reader of ``systemctl show`` and
``docker container inspect`` for the modules and for the programs on the host (the start door, the watchdog, the boot
check). Part of the host runtime: standard library only. Private to the collection."""

from __future__ import annotations

import calendar
import json
import time
import typing as t

Runner = t.Callable[[list[str]], tuple[int, str, str]]


class StateUnanswered(Exception):
    """systemd or Docker did not answer (not: the unit or the container does not exist); the message says which."""


def show_units(run: Runner, units: t.Sequence[str], properties: t.Sequence[str], systemctl: str = "systemctl") -> dict[str, dict[str, str]]:
    """Each unit's ``properties`` from one ``systemctl show`` (a unit systemd does not know reads LoadState not-found)."""
    rc, out, err = run([systemctl, "show", *[f"--property={name}" for name in properties], "--", *units])
    if rc != 0:
        raise StateUnanswered(f"systemctl show {' '.join(units)} exited {rc}: {(err.strip() or out.strip())[:300]}; is systemd running on the host?")
    return parse_show(units, properties, out)


def parse_show(units: t.Sequence[str], properties: t.Sequence[str], out: str) -> dict[str, dict[str, str]]:
    """``systemctl show``'s output: one block per unit in the order asked, blank lines between. Keyed by the name asked,
    since an alias is shown as its unit. A property systemd did not print reads as empty."""
    blocks = out.strip("\n").split("\n\n") if out.strip() else []
    if len(blocks) != len(units):
        raise StateUnanswered(f"systemctl show answered {len(blocks)} blocks for {len(units)} units")
    found = {}
    for unit, block in zip(units, blocks, strict=True):
        values = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        found[unit] = {name: values.get(name, "") for name in properties}
    return found


def missing_container(stderr: str) -> bool:
    """Whether Docker's error says the container does not exist (not that Docker did not answer)."""
    return "No such object" in stderr or "No such container" in stderr


def inspect_container(run: Runner, name: str, docker: str = "docker") -> dict[str, t.Any] | None:
    """Docker's record of the container of exactly that name; None when there is none."""
    rc, out, err = run([docker, "container", "inspect", name])
    if rc != 0:
        if missing_container(err + out):
            return None
        raise StateUnanswered(f"docker container inspect {name} exited {rc}: {(err.strip() or out.strip())[:300]}; is Docker running on the host?")
    try:
        found = json.loads(out)
    except ValueError as error:
        raise StateUnanswered(f"docker container inspect {name} did not answer JSON ({error})") from error
    record = found[0] if isinstance(found, list) and found else found
    if not isinstance(record, dict):
        raise StateUnanswered(f"docker container inspect {name} answered no container record: {out[:200]!r}")
    # Docker also takes a name for a prefix of a container's ID: only the container of that name is the unit's.
    return record if record.get("Name") in (None, f"/{name}") else None


def state_of(record: t.Mapping[str, t.Any] | None) -> dict[str, t.Any]:
    """The State part of a container's record (empty for none)."""
    state = (record or {}).get("State")
    return state if isinstance(state, dict) else {}


def started_at(text: t.Any) -> float | None:
    """Docker's StartedAt (RFC 3339 with nanoseconds, UTC) in seconds since the epoch; None when unreadable or never started."""
    if not isinstance(text, str) or not text.endswith("Z") or text.startswith("0001-"):
        return None
    whole, _dot, fraction = text[:-1].partition(".")
    try:
        return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)
    except ValueError:
        return None
