# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build and check earlyoom's --prefer/--avoid arguments from plain process names.

Private to the collection. Lessons encoded here come from seed 000: earlyoom must prefer
the model server and avoid the host's plumbing (the inverse config killed ~250 host
processes while the one process that held the memory was spared), literal parentheses
are written as [(] and [)] because systemd strips backslashes from /etc/default/earlyoom,
and earlyoom matches /proc/PID/comm, which the kernel truncates to 15 characters.
"""

from __future__ import annotations

import re
import typing as t

COMM_MAX_LENGTH = 15
MEMORY_PERCENT_RANGE = (1, 50)
# Reports further apart than a day say nothing about the memory event an operator looks into.
REPORT_INTERVAL_MAX = 86400
# Characters that mean something to a regex and are written as a one-character class.
BRACKETED_CHARACTERS = frozenset("().+?{}|")
# Characters with no safe spelling inside EARLYOOM_ARGS (systemd splits on whitespace,
# strips backslashes and may expand $).
FORBIDDEN_CHARACTERS = frozenset(" \t\\[]^$\"'`")


def name_to_regex(name: str) -> str:
    """Translate a plain process name (``*`` is the only wildcard) into a regex fragment."""
    parts = []
    for char in name:
        if char == "*":
            parts.append(".*")
        elif char in BRACKETED_CHARACTERS:
            parts.append("[" + char + "]")
        else:
            parts.append(char)
    return "".join(parts)


def names_to_regex(names: t.Sequence[str]) -> str:
    """Anchored alternation of the names, as earlyoom's --prefer/--avoid expect."""
    return "^(" + "|".join(name_to_regex(name) for name in names) + ")$"


def name_problems(variable: str, names: t.Sequence[str]) -> list[str]:
    problems = []
    for name in names:
        if not isinstance(name, str) or not name:
            problems.append(f"{variable}: entry {name!r} is not a non-empty process name")
            continue
        bad = sorted(set(name) & FORBIDDEN_CHARACTERS)
        if bad:
            problems.append(
                f"{variable}: {name!r} contains {' '.join(repr(c) for c in bad)}, which cannot be written safely "
                "into /etc/default/earlyoom; give a plain process name (use * as the only wildcard)"
            )
        if "*" not in name and len(name) > COMM_MAX_LENGTH:
            problems.append(
                f"{variable}: {name!r} is longer than the {COMM_MAX_LENGTH} characters the kernel keeps of a "
                f"process name, so it can never match; use {name[:COMM_MAX_LENGTH]!r}"
            )
    return problems


def compile_problem(variable: str, pattern: str) -> str | None:
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"{variable}: regex {pattern!r} does not compile ({exc}); fix the expression or leave it empty to build it from the name lists"
    return None


# earlyoom arguments an operator may add, with the form of their value; everything else is either
# set by the role from its variables or weakens the guard, and is refused with the reason.
EXTRA_VALUES = {"-s": re.compile(r"[0-9]{1,3}(,[0-9]{1,3})?"), "-S": re.compile(r"[0-9]{1,12}(,[0-9]{1,12})?")}
EXTRA_SWITCHES = frozenset({"-n", "-d", "-p", "--sort-by-rss", "--syslog"})
REFUSED_EXTRA = {
    "-m": "set by earlyoom_memory_percent and earlyoom_memory_kill_percent",
    "-M": "a size threshold that would bypass earlyoom_memory_percent",
    "-r": "set by earlyoom_report_interval",
    "--prefer": "set by earlyoom_prefer_names (and checked against the model server)",
    "--avoid": "set by earlyoom_avoid_names (and checked against the model server)",
    "--ignore": "would exempt processes from killing outside earlyoom_avoid_names' checks",
    "--dryrun": "earlyoom would never kill, switching the guard off",
    "-i": "earlyoom would ignore the oom_score_adj that marks the model server as the one to kill",
    "-g": "earlyoom would kill a whole process group, not the one process",
    "-N": "runs a script as root on every kill",
    "-k": "an obsolete option",
}


def threshold_problems(argument: str, flag: str, value: str) -> list[str]:
    """A -s or -S value earlyoom takes but that would switch its swap condition off: earlyoom acts only
    when memory and swap are both low, and a threshold of 0 is never reached while swap has a byte
    free; a swap percent above 100 or a kill threshold above the warning one means nothing."""
    first, _comma, kill = value.partition(",")
    numbers = [int(first)] + ([int(kill)] if kill else [])
    if flag == "-s" and not all(1 <= number <= 100 for number in numbers):
        return [f"earlyoom_extra_args: {argument!r} is out of range; give swap percents from 1 to 100 (0 would never be reached)"]
    if flag == "-S" and not all(number >= 1 for number in numbers):
        return [f"earlyoom_extra_args: {argument!r} is out of range; give swap sizes of at least 1 KiB (0 would never be reached)"]
    if kill and numbers[1] > numbers[0]:
        return [f"earlyoom_extra_args: {argument!r} puts the kill threshold above the warning one; give KILL at most the first value"]
    return []


def extra_args_problems(extra_args: t.Any) -> list[str]:
    """Problems of earlyoom_extra_args: each flag must be one the role leaves to the operator, with a well-formed value."""
    if not isinstance(extra_args, list) or not all(isinstance(a, str) for a in extra_args):
        return ["earlyoom_extra_args: must be a list of strings"]
    errors = []
    expecting: str | None = None
    for argument in extra_args:
        if set(argument) & FORBIDDEN_CHARACTERS or not argument:
            errors.append(f"earlyoom_extra_args: {argument!r} contains whitespace, quotes or other characters that break EARLYOOM_ARGS")
            expecting = None
            continue
        if expecting:
            if not EXTRA_VALUES[expecting].fullmatch(argument):
                errors.append(f"earlyoom_extra_args: {expecting} {argument!r} is not a threshold (PERCENT[,KILL_PERCENT] or KiB[,KiB])")
            else:
                errors += threshold_problems(f"{expecting} {argument}", expecting, argument)
            expecting = None
            continue
        flag = argument.split("=", 1)[0] if argument.startswith("--") else argument[:2]
        if flag in REFUSED_EXTRA:
            errors.append(f"earlyoom_extra_args: {argument!r} is refused: {REFUSED_EXTRA[flag]}")
        elif flag in EXTRA_VALUES:
            value = argument[2:]
            if value:
                if not EXTRA_VALUES[flag].fullmatch(value):
                    errors.append(f"earlyoom_extra_args: {argument!r} is not a threshold (PERCENT[,KILL_PERCENT] or KiB[,KiB])")
                else:
                    errors += threshold_problems(argument, flag, value)
            else:
                expecting = flag
        elif argument not in EXTRA_SWITCHES:
            errors.append(
                f"earlyoom_extra_args: {argument!r} is not an argument the role passes through; allowed are "
                f"{', '.join(sorted([*EXTRA_VALUES, *EXTRA_SWITCHES]))}"
            )
    if expecting:
        errors.append(f"earlyoom_extra_args: {expecting} needs a value after it")
    return errors


def example_process_name(name: str) -> str:
    """A concrete process name that a plain name with wildcards stands for."""
    return name.replace("*", "")


def earlyoom_config(
    memory_percent: t.Any,
    memory_kill_percent: t.Any,
    report_interval: t.Any,
    prefer_lists: t.Mapping[str, t.Sequence[str]],
    avoid_lists: t.Mapping[str, t.Sequence[str]],
    model_server_names: t.Sequence[str],
    prefer_regex: str = "",
    avoid_regex: str = "",
    extra_args: t.Sequence[str] = (),
) -> dict[str, t.Any]:
    """Validate the earlyoom settings and render its argument list.

    ``prefer_lists`` and ``avoid_lists`` map each role variable to its names, so that an
    error names the variable holding the offending entry. Returns ``{"args": [...],
    "prefer_regex": str, "avoid_regex": str, "errors": [...]}``; every problem is reported
    at once.
    """
    prefer_names = [name for names in prefer_lists.values() for name in names]
    avoid_names = [name for names in avoid_lists.values() for name in names]
    errors: list[str] = []
    low, high = MEMORY_PERCENT_RANGE
    if not isinstance(memory_percent, int) or isinstance(memory_percent, bool) or not low <= memory_percent <= high:
        errors.append(
            f"earlyoom_memory_percent: {memory_percent!r} is out of range; give a whole percent of available memory "
            f"from {low} to {high} (seed 000 uses 4 on a 128 GB Spark)"
        )
    if memory_kill_percent is not None:
        if (
            not isinstance(memory_kill_percent, int)
            or isinstance(memory_kill_percent, bool)
            or not isinstance(memory_percent, int)
            or not 1 <= memory_kill_percent <= memory_percent
        ):
            errors.append(
                f"earlyoom_memory_kill_percent: {memory_kill_percent!r} must be a whole percent from 1 up to "
                f"earlyoom_memory_percent ({memory_percent!r}), or null for earlyoom's default (half of it)"
            )
    if not isinstance(report_interval, int) or isinstance(report_interval, bool) or not 0 <= report_interval <= REPORT_INTERVAL_MAX:
        errors.append(f"earlyoom_report_interval: {report_interval!r} is out of range; give whole seconds from 0 (no reports) "
                      f"to {REPORT_INTERVAL_MAX} (a day; reports further apart say nothing about a memory event)")

    for variable, names in (*prefer_lists.items(), *avoid_lists.items()):
        errors += name_problems(variable, names)
    if not prefer_names and not prefer_regex:
        errors.append("earlyoom_prefer_names: empty; earlyoom must prefer the model server (seed 000), list its process names")

    prefer = prefer_regex or names_to_regex(prefer_names)
    avoid = avoid_regex or (names_to_regex(avoid_names) if avoid_names else "")
    for variable, pattern in (("earlyoom_prefer_regex", prefer_regex), ("earlyoom_avoid_regex", avoid_regex)):
        if pattern:
            problem = compile_problem(variable, pattern)
            if problem:
                errors.append(problem)
            bad = sorted(set(pattern) & (FORBIDDEN_CHARACTERS - {"[", "]", "^", "$", "\\"}))
            if bad:
                errors.append(f"{variable}: {pattern!r} contains whitespace or quotes, which break EARLYOOM_ARGS")

    if not errors and model_server_names and not any(re.search(prefer, name) for name in model_server_names):
        errors.append(
            f"earlyoom_prefer_names: the prefer pattern {prefer!r} matches none of earlyoom_model_server_names "
            f"({', '.join(model_server_names)}); earlyoom would not kill the model server first (seed 000)"
        )
    errors += inverse_config_problems(prefer_names, avoid_lists, model_server_names, avoid_regex)
    errors += extra_args_problems(list(extra_args))
    if errors:
        return {"args": [], "prefer_regex": prefer, "avoid_regex": avoid, "errors": errors}

    memory = str(memory_percent) if memory_kill_percent is None else f"{memory_percent},{memory_kill_percent}"
    args = ["-m", memory, "-r", str(report_interval), "--prefer", prefer]
    if avoid:
        args += ["--avoid", avoid]
    args += list(extra_args)
    return {"args": args, "prefer_regex": prefer, "avoid_regex": avoid, "errors": []}


def inverse_config_problems(
    prefer_names: t.Sequence[str],
    avoid_lists: t.Mapping[str, t.Sequence[str]],
    model_server_names: t.Sequence[str],
    avoid_regex: str,
) -> list[str]:
    """Refuse an avoid pattern that would shield the model server (seed 000's rampage)."""
    protected = [example_process_name(name) for name in prefer_names if isinstance(name, str)]
    protected += [name for name in model_server_names if isinstance(name, str) and name not in protected]
    problems = []
    if avoid_regex:
        if compile_problem("earlyoom_avoid_regex", avoid_regex):
            return problems
        caught = [name for name in protected if re.search(avoid_regex, name)]
        if caught:
            problems.append(
                f"earlyoom_avoid_regex: {avoid_regex!r} matches {', '.join(caught)}: earlyoom would spare the model "
                "server and kill the host's plumbing instead (seed 000); remove those names from the avoid pattern"
            )
        return problems
    for variable, entries in avoid_lists.items():
        for entry in entries:
            if not isinstance(entry, str) or not entry or set(entry) & FORBIDDEN_CHARACTERS:
                continue
            entry_regex = "^" + name_to_regex(entry) + "$"
            caught = [name for name in protected if re.search(entry_regex, name)]
            if caught:
                problems.append(
                    f"{variable}: entry {entry!r} matches {', '.join(caught)}: earlyoom would spare the model "
                    "server and kill the host's plumbing instead (seed 000); remove it from the avoid list"
                )
    return problems
