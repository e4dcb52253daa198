# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The reboot test's checks on one host after a boot: is everything the collection set up back, in order, unharmed.

Private to the collection. Seed 000 Step 6 ends with a reboot: the instances come back in their declared order
and serve within a time limit, answer a warm-up chat, move their speculative counters where configured, on every
address they are bound to; earlyoom, the watchdog and the exporters run; no unit failed, swap stayed off and
nothing was OOM-killed since the boot. Each check is one row of the report, with what was seen.

The boot is PID 1's start (the kernel's boot time plus PID 1's start in clock ticks), not the kernel's: a lab
host is a container whose restart keeps the kernel and its boot id, and on a real host the two differ by a second.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import time
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, show_units
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import PlanFileError, read_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import unit_name_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import http, instance_endpoint
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_gate import Endpoint, gate
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import parse_env_file
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import WILDCARDS, endpoint_url, is_loopback_address
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import SERVICE, acted

RunCommand = t.Callable[[list[str]], tuple[int, str, str]]

# Seed 002: a warm boot serves in 7-10 minutes; a cold first boot (compilation) took up to 45.
SERVE_WITHIN = (60, 14_400)
KERNEL_OOM = "Killed process"
# Repeats, so an n-gram drafter finds matches to propose.
SPECULATIVE_PROMPT = "Continue the pattern: red green blue red green blue red green blue red green blue"
UNIT_TIMES = ("LoadState", "ActiveState", "NRestarts", "InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic")


@dataclasses.dataclass(frozen=True)
class Host:
    """What the checks read on the host; tests give their own."""

    run_command: RunCommand
    read_text: t.Callable[[str], str]
    wall: t.Callable[[], float] = time.time
    ticks_per_second: int = 100
    pause: t.Callable[[float], None] = time.sleep


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def local_host(run_command: RunCommand) -> Host:
    return Host(run_command=run_command, read_text=read_text, ticks_per_second=os.sysconf("SC_CLK_TCK"))


def option_problems(params: t.Mapping[str, t.Any]) -> list[str]:
    """Each bad option, naming the playbook variable that sets it and the fix."""
    problems = []
    low, high = SERVE_WITHIN
    within = params.get("serve_within")
    if isinstance(within, bool) or not isinstance(within, int) or not low <= within <= high:
        problems.append(f"reboot_test_serve_within: {within!r} must be whole seconds from {low} to {high} "
                        "(seed 002: a warm boot serves in 7-10 minutes, a cold first boot in up to 45)")
    request = params.get("timeout")
    if isinstance(request, bool) or not isinstance(request, int) or not 1 <= request <= 300:
        problems.append(f"reboot_test_request_timeout: {request!r} must be whole seconds from 1 to 300")
    for field in ("expect_active", "exporter_units"):
        names = params.get(field) or []
        if not isinstance(names, list) or unit_name_problems(names):
            problems.append(f"reboot_test_{field}: {names!r} must be a list of systemd unit names")
    for url in params.get("exporter_urls") or []:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
            problems.append(f"reboot_test_exporter_urls: {url!r} must be an http:// or https:// URL of an exporter")
    folders = params.get("plan_dirs") or []
    if not folders or not all(isinstance(f, str) and f.startswith("/") for f in folders):
        problems.append(f"plan_dirs: {folders!r} must be absolute folders (vllm_config_dir and cluster_config_dir)")
    return problems


def booted_at(proc_stat: str, pid1_stat: str, ticks_per_second: int) -> float:
    """PID 1's start as an epoch second: the kernel's btime plus PID 1's start time (field 22 of /proc/1/stat,
    counted after the command name's closing parenthesis, which may hold spaces)."""
    btime = next((int(line.split()[1]) for line in proc_stat.splitlines() if line.startswith("btime ")), None)
    fields = pid1_stat.rpartition(")")[2].split()
    if btime is None or len(fields) < 20 or not fields[19].isdigit():
        raise ValueError("cannot read the boot time from /proc/stat and /proc/1/stat")
    return btime + int(fields[19]) / ticks_per_second


def deployed_plans(plan_dirs: t.Sequence[str], read: t.Callable[[str], str]) -> tuple[list[dict[str, t.Any]], list[str]]:
    """The plan files of the instances and cluster ranks the host runs, in each folder's order; and each file that is
    no usable plan, with why (_plan_file.read_plan's message)."""
    plans, damaged = [], []
    for folder in plan_dirs:
        for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
            try:
                plans.append(read_plan(path, read))
            except PlanFileError as error:
                damaged.append(str(error))
    return plans, damaged


def serves_api(plan: t.Mapping[str, t.Any]) -> bool:
    """A single instance or a cluster's head: a worker rank serves no API."""
    return not plan.get("cluster") or bool(plan["cluster"].get("head"))


def unit_times(run_command: RunCommand, units: t.Sequence[str]) -> dict[str, dict[str, t.Any]]:
    """Each unit's state, restarts and the monotonic times it left inactive and became active (None: never since boot)."""
    if not units:
        return {}
    try:
        shown = show_units(run_command, units, UNIT_TIMES)
    except StateUnanswered as error:
        raise ValueError(str(error)) from error
    found = {}
    for unit, values in shown.items():
        numbers = {name: int(values[name]) if values[name].isdigit() else None
                   for name in ("NRestarts", "InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic")}
        found[unit] = {"load_state": values["LoadState"], "active_state": values["ActiveState"], "n_restarts": numbers["NRestarts"],
                       "began": numbers["InactiveExitTimestampMonotonic"], "active_since": numbers["ActiveEnterTimestampMonotonic"]}
    return found


# systemd's states on the way to another; the endpoint can answer before the unit's own readiness wait ends.
CHANGING = ("activating", "deactivating", "reloading")


def settled_unit_times(host: Host, units: t.Sequence[str], deadline: float) -> dict[str, dict[str, t.Any]]:
    """The units' times once none is still changing state, or as they are at the deadline."""
    while True:
        times = unit_times(host.run_command, units)
        if host.wall() >= deadline or not any(times[unit]["active_state"] in CHANGING for unit in units):
            return times
        host.pause(2)


def row(name: str, passed: bool, detail: str) -> dict[str, t.Any]:
    return {"check": name, "passed": passed, "detail": detail}


def order_row(plans: t.Sequence[t.Mapping[str, t.Any]], times: t.Mapping[str, t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """Each unit began starting only once every unit it follows (its plan's start_after) was active."""
    wrong, seen = [], []
    for plan in plans:
        unit = plan["unit"]
        began = times[unit]["began"]
        for earlier in plan.get("start_after") or []:
            ready = (times.get(earlier) or {}).get("active_since")
            if not ready or not began:
                wrong.append(f"{unit} or {earlier}, which it follows, never started since the boot")
            elif began < ready:
                wrong.append(f"{unit} began starting {(ready - began) / 1e6:.1f} s before {earlier}, which it follows, was serving")
            else:
                seen.append(f"{unit} after {earlier} (+{(began - ready) / 1e6:.1f} s)")
    if not any(plan.get("start_after") for plan in plans):
        return row("order", not wrong, "one unit: no order to keep" if len(plans) <= 1 else "no unit follows another")
    return row("order", not wrong, "; ".join(wrong or seen))


def units_row(plans: t.Sequence[t.Mapping[str, t.Any]], times: t.Mapping[str, t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """Every planned unit, a cluster's worker ranks too (they serve no API), is installed and active."""
    states = {plan["unit"]: (times[plan["unit"]]["load_state"], times[plan["unit"]]["active_state"]) for plan in plans}
    wrong = [f"{unit} {load}/{active}" for unit, (load, active) in states.items() if (load, active) != ("loaded", "active")]
    return row("units", not wrong, ("not running: " + ", ".join(wrong)) if wrong else (", ".join(states) + " active") if states else "no unit planned")


def restarts_row(plans: t.Sequence[t.Mapping[str, t.Any]], times: t.Mapping[str, t.Mapping[str, t.Any]],
                 watchdog_actions: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """No unit restarted since the boot: by systemd (NRestarts) or by the watchdog (whose starts systemd does not count)."""
    counts = {plan["unit"]: times[plan["unit"]]["n_restarts"] for plan in plans}
    restarted = {unit: n for unit, n in counts.items() if n != 0}
    detail = ", ".join(f"{unit} {'unknown' if n is None else n}" for unit, n in counts.items()) or "no unit planned"
    acts = [f"{a.get('action')} {a.get('unit', '?')}" + (f" ({a['why'][:120]})" if a.get("why") else "") for a in watchdog_actions]
    text = ("restarted since the boot: " if restarted else "NRestarts: ") + detail
    return row("restarts", not restarted and not acts, text + ("; the watchdog acted: " + "; ".join(acts) if acts else ""))


def watchdog_actions(run_command: RunCommand, since: float) -> list[dict[str, t.Any]]:
    """The watchdog's actions since the boot, from its journal; none where it is not installed."""
    rc, out, err = run_command(["journalctl", "--unit", SERVICE, "--since", f"@{int(since)}", "--output", "cat", "--quiet", "--no-pager"])
    if rc:
        raise ValueError(f"the watchdog's journal could not be read: {(err or out).strip()[:300]}")
    return acted(out.splitlines())


def serving_row(served: t.Mapping[str, t.Mapping[str, t.Any]], within: int, damaged: t.Sequence[str]) -> dict[str, t.Any]:
    """Every instance served in time; a damaged plan file fails it too, since what it plans cannot be checked."""
    seen = [f"{unit} {'at' if r['came_up'] else 'not by'} {r['since_boot']:.0f} s" + ("" if r["came_up"] else f" ({r.get('reason')})")
            for unit, r in served.items()]
    seen += [f"not checked, a damaged plan file: {path}" for path in damaged]
    return row("serving", all(r["came_up"] for r in served.values()) and not damaged,
               f"within {within} s of the boot: " + ("; ".join(seen) or "no instance planned"))


def speculative_row(plans: t.Sequence[t.Mapping[str, t.Any]], endpoints: t.Mapping[str, t.Mapping[str, t.Any]], timeout: float) -> dict[str, t.Any]:
    """Where speculative decoding is configured, one request moves the draft counter. A repeating prompt, since an
    n-gram drafter proposes only tokens the prompt already holds."""
    moved, wrong = [], []
    for plan in plans:
        if not (plan.get("launch_check") or {}).get("speculative_method"):
            continue
        endpoint = endpoints[plan["unit"]]
        before = speculative_drafts(endpoint["url"], endpoint["api_key"], timeout)
        payload = {"model": endpoint["model"], "messages": [{"role": "user", "content": SPECULATIVE_PROMPT}], "max_tokens": 24, "temperature": 0}
        reply = http("POST", endpoint["url"] + "/v1/chat/completions", endpoint["api_key"], payload, timeout=max(timeout, 60))
        after = speculative_drafts(endpoint["url"], endpoint["api_key"], timeout)
        if reply.status != 200 or before is None or after is None or after <= before:
            wrong.append(f"{plan['unit']}: draft tokens {before} -> {after} over a request that answered "
                         f"{reply.status if reply.status is not None else reply.error}")
        else:
            moved.append(f"{plan['unit']}: draft tokens {before} -> {after}")
    if not moved and not wrong:
        return row("speculative", True, "no instance decodes speculatively")
    return row("speculative", not wrong, "; ".join(wrong + moved))


def exporter_row(units_row: dict[str, t.Any], urls: t.Sequence[str], timeout: float) -> dict[str, t.Any]:
    """The exporter units' states, then each exporter URL answering on its bind address."""
    answers, wrong = [], []
    for url in urls:
        reply = http("GET", url, None, timeout=timeout)
        (answers if reply.status == 200 else wrong).append(f"{url} {reply.status if reply.status is not None else reply.error}")
    details = [units_row["detail"]] if units_row["detail"] != "none asked" else []
    return row("exporters", units_row["passed"] and not wrong, "; ".join(wrong + details + answers) or "no exporter asked")


def lan_addresses(plan: t.Mapping[str, t.Any]) -> list[str]:
    """The specific LAN addresses of a plan: a wildcard bind names no address to call."""
    return [address for address in plan.get("bind_addresses") or [] if not is_loopback_address(address) and address not in WILDCARDS]


def lan_row(plans: t.Sequence[t.Mapping[str, t.Any]], keys: t.Mapping[str, str | None], timeout: float) -> dict[str, t.Any]:
    """Every non-loopback address an instance publishes its port on answers /v1/models with the key."""
    answers, wrong = [], []
    for plan in plans:
        for address in lan_addresses(plan):
            url = endpoint_url(address, plan["port"]) + "/v1/models"
            reply = http("GET", url, keys[plan["unit"]], timeout=timeout)
            (answers if reply.status == 200 else wrong).append(
                f"{url} {'answered' if reply.status == 200 else 'gave'} {reply.status if reply.status is not None else reply.error}")
    wildcard = [f"{plan['unit']} binds {address} (every interface): no one LAN address to call"
                for plan in plans for address in plan.get("bind_addresses") or [] if address in WILDCARDS]
    if not answers and not wrong:
        return row("lan_port", True, "; ".join(wildcard) or "every instance is bound to loopback only: no LAN port to check")
    return row("lan_port", not wrong, "; ".join(wrong + answers + wildcard))


def speculative_drafts(url: str, key: str | None, timeout: float) -> int | None:
    """vllm:spec_decode_num_draft_tokens_total summed over the engines, None when the server reports none."""
    reply = http("GET", url + "/metrics", key, timeout=timeout)
    if reply.status != 200:
        return None
    try:
        values = [float(line.rsplit(" ", 1)[1]) for line in reply.body.splitlines()
                  if line.startswith("vllm:spec_decode_num_draft_tokens_total") and " " in line]
        return int(sum(values)) if values else None
    except (ValueError, OverflowError):
        return None


def unit_states_row(name: str, units: t.Sequence[str], states: t.Mapping[str, t.Mapping[str, t.Any]], required: bool) -> dict[str, t.Any]:
    """Each unit active; one not installed fails where required (earlyoom, the watchdog) and is noted otherwise (an exporter)."""
    seen, wrong = [], []
    for unit in units:
        state = states[unit]["active_state"]
        if state == "active":
            seen.append(f"{unit} active")
        elif state == "inactive" and states[unit].get("load_state") == "not-found" and not required:
            seen.append(f"{unit} not installed")
        else:
            wrong.append(f"{unit} {state or 'unknown'}")
    return row(name, not wrong, "; ".join(wrong + seen) or "none asked")


def swap_row(read: t.Callable[[str], str]) -> dict[str, t.Any]:
    try:
        proc_swaps = read("/proc/swaps")
    except OSError as error:
        return row("swap", False, f"/proc/swaps could not be read ({error})")
    active = [line.split()[0] for line in proc_swaps.splitlines()[1:] if line.strip()]
    return row("swap", not active, "active: " + ", ".join(active) if active else "no swap active")


def failed_units_row(run_command: RunCommand) -> dict[str, t.Any]:
    rc, out, err = run_command(["systemctl", "list-units", "--state=failed", "--plain", "--no-legend", "--no-pager"])
    if rc:
        return row("failed_units", False, f"systemctl list-units failed: {(err or out).strip()[:300]}")
    failed = [line.split()[0] for line in out.splitlines() if line.strip()]
    return row("failed_units", not failed, ("failed: " + ", ".join(failed)) if failed else "no failed unit")


def oom_row(run_command: RunCommand, since: float) -> dict[str, t.Any]:
    """The kernel's OOM kills since the boot, by time as well: journalctl --dmesg reads the kernel's current boot, which a
    lab host's restart keeps."""
    rc, out, err = run_command(["journalctl", "--dmesg", "--since", f"@{int(since)}", "--output", "cat", "--quiet", "--no-pager"])
    if rc:
        return row("oom_kills", False, f"the kernel journal could not be read: {(err or out).strip()[:300]}")
    kills = [line for line in out.splitlines() if KERNEL_OOM in line]
    return row("oom_kills", not kills, f"{len(kills)} since the boot: {kills[0][:200]}" if kills else "none since the boot")


def check(params: t.Mapping[str, t.Any], host: Host, validate_only: bool = False) -> dict[str, t.Any]:
    """Every check after a boot; ``ok`` false with ``reasons`` when they could not run, ``passed`` their verdict."""
    problems = option_problems(params)
    if problems:
        return {"ok": False, "passed": False, "reasons": problems, "checks": []}
    try:
        boot = booted_at(host.read_text("/proc/stat"), host.read_text("/proc/1/stat"), host.ticks_per_second)
        plans, damaged = deployed_plans(params["plan_dirs"], host.read_text)
        keys = {plan["unit"]: parse_env_file(host.read_text(plan["env_path"])).get("VLLM_API_KEY") for plan in plans}
        serving = [plan for plan in plans if serves_api(plan)]
        endpoints = {plan["unit"]: instance_endpoint(plan, {"VLLM_API_KEY": keys[plan["unit"]] or ""}) for plan in serving}
    except (OSError, ValueError) as error:
        reason = f"cannot read the host's boot or its plan files: {error}; run with become: true after the vllm role"
        return {"ok": False, "passed": False, "reasons": [reason], "checks": []}
    if validate_only:
        return {"ok": True, "passed": True, "reasons": [], "checks": [], "booted_at": boot, "damaged_plan_files": damaged,
                "serving_seconds": {}}
    deadline = boot + params["serve_within"]
    served = {}
    for plan in serving:
        endpoint = endpoints[plan["unit"]]
        remaining = max(1.0, deadline - host.wall())
        result = gate(Endpoint(endpoint["url"], endpoint["api_key"], endpoint["served_names"], None, remaining), None, warmup=True)
        # The gate's warm-up runs only once the endpoint serves: its reply key says it came up.
        served[plan["unit"]] = {**result, "came_up": result["ok"] or "warmup_reply" in result, "since_boot": round(host.wall() - boot, 1)}
    rows = [serving_row(served, params["serve_within"], damaged)]
    try:
        times = settled_unit_times(host, [plan["unit"] for plan in plans], deadline)
        rows += [order_row(plans, times), units_row(plans, times), restarts_row(plans, times, watchdog_actions(host.run_command, boot))]
    except ValueError as error:
        rows += [row(name, False, str(error)) for name in ("order", "units", "restarts")]
    rows.append(lan_row(serving, keys, params["timeout"]))
    warm = [f"{unit}: {r['warmup_reply']!r}" if r.get("warmup_reply") is not None else f"{unit}: {r.get('reason')}" for unit, r in served.items()]
    rows.append(row("warm_up", all(r.get("warmup_reply") is not None for r in served.values()), "; ".join(warm) or "no instance planned"))
    rows.append(speculative_row(serving, endpoints, params["timeout"]))
    units = [*params["expect_active"], *params["exporter_units"]]
    try:
        states = unit_times(host.run_command, units)
        rows.append(unit_states_row("services", params["expect_active"], states, required=True))
        exporters = unit_states_row("exporters", params["exporter_units"], states, required=False)
    except ValueError as error:
        rows.append(row("services", False, str(error)))
        exporters = row("exporters", False, str(error))
    rows.append(exporter_row(exporters, params["exporter_urls"], params["timeout"]))
    rows.append(failed_units_row(host.run_command))
    rows.append(swap_row(host.read_text))
    rows.append(oom_row(host.run_command, boot))
    failed = [f"{r['check']}: {r['detail']}" for r in rows if not r["passed"]]
    return {"ok": True, "passed": not failed, "reasons": failed, "checks": rows, "booted_at": boot,
            "damaged_plan_files": damaged, "serving_seconds": {unit: r["since_boot"] for unit, r in served.items() if r["came_up"]}}


def markdown_report(title: str, result: t.Mapping[str, t.Any], reboot_seconds: float | None) -> str:
    """The report: the verdict, then one row per check with what was seen."""
    lines = [f"# {title}", "", f"**REBOOT TEST {'PASS' if result['passed'] else 'FAIL'}**", ""]
    if reboot_seconds is not None:
        lines += [f"The host was back {reboot_seconds:.0f} s after the reboot was asked; PID 1 started at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(result['booted_at']))}.", ""]
    lines += ["| check | result | seen |", "|---|---|---|"]
    lines += [f"| {r['check']} | {'pass' if r['passed'] else 'FAIL'} | {r['detail'].replace('|', '/')} |" for r in result["checks"]]
    return "\n".join(lines) + "\n"
