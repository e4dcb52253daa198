# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The soak: load at a target concurrency for a duration, the box sampled meanwhile, PASS or FAIL with every reason.

Private to the collection. Seed 000 Step 4: rounds of ``vllm bench serve`` (random tokens, ``--ignore-eos``,
``--max-concurrency C --num-prompts C*k``) until the deadline; every 30 s a sample of the KV cache usage, the
waiting requests and MemAvailable, where a gap between samples is the freeze detector (a locked-up host stops
the sampler too); afterwards the failed requests, the kernel's OOM kills and earlyoom's kill lines since the
start, and the restart counts before against after. Added here: every request of a round accounted for (its
completed plus failed is the prompts sent, a missing count is no zero), a tiny completion at every sample (the
liveness routes keep answering while an engine is wedged, vLLM 39863), NVRM ``NV_ERR_NO_MEMORY`` lines and the
watchdog's actions. ``vllm bench serve`` has no duration option and its client waits up to 6 h on a stalled
request, so each round runs under ``timeout`` and the soak keeps its own clock: a round still running at the
deadline gets ``drain_timeout`` more seconds, then is killed and counted as a failure. Each round starts a new
client, whose start (imports, tokenizer, a test request) loads nothing: once a round has shown how long that takes
against its load, the later rounds grow until the load fills ``BUSY_SHARE`` of a round.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import write_atomically
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, inspect_container, show_units, state_of
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import Range
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import is_whole, read_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import (
    BENCH_RANGES,
    CONCURRENCY,
    Outcome,
    RunCommand,
    Which,
    accounting,
    bench_args,
    judge,
    load_result,
    local_tokenizer,
    pick_runner,
    runner_command,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import discover_model, http, label_problems, resolve
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import settings_paths
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import Samples, read_metrics
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import acted

# timeout(1)'s grace between its SIGTERM and its SIGKILL; a Python client ends on SIGTERM within it.
KILL_AFTER = 10
# Our own kill of the runner's client, for a client that outlives the timeout inside the runner (a hung docker).
BACKSTOP = 30
# A failed round is judged by its last lines; tqdm's progress bars before them are not kept.
OUTPUT_TAIL = 20_000
# Five tokens or more: the CPU build's bf16 path has died on a tinier request (NOTES).
PROBE_PROMPT = "Reply with one word: ready."
# The kernel's OOM killer, global or cgroup: "Out of memory: Killed process 1234 (python3) ...".
KERNEL_OOM = "Killed process"
# earlyoom's kill line is "sending SIGTERM to process 1234 uid 0 ...", in every release since 1.2 (kill.c); its
# startup banner "sending SIGTERM when mem <= 10.00% ..." must not count, nor the debug self-test "sending 0 (no-op signal)".
EARLYOOM_KILL = re.compile(r"\bsending SIG(?:TERM|KILL) to process \d+")
INSTANCE_NEEDED = "instance: the soak watches the instance's unit and container, which only its plan names; give the instance's name"
EVIDENCE_LINES = 5
# The share of a round its load should fill. Seen on the lab: rounds of 10 s held 1-2 s of load, and 3 of 14 samples
# saw a request running; the rest was vllm bench's start, during which the engine idles.
BUSY_SHARE = 0.9

SOAK_RANGES: dict[str, Range] = {
    "duration": Range(10, 604_800, "a week is the longest load one report covers", whole=True, unit="seconds"),
    "sample_interval": Range(1, 3_600, "the gap between samples is the freeze detector; seed 000 samples every 30 s",
                             whole=True, unit="seconds"),
    "round_timeout": Range(10, 21_600, "vllm bench's own client waits 6 hours on a stalled request", whole=True, unit="seconds"),
    "drain_timeout": Range(10, 3_600, "a round still running at the deadline is waited for this long, then killed",
                           whole=True, unit="seconds"),
    "probe_timeout": Range(10, 600, "under 10 s a saturated engine reads as dead (llm-d-benchmark 1734)", whole=True, unit="seconds"),
    "probe_max_tokens": Range(1, 5, "a probe measures the queue and a short decode, not throughput", whole=True, unit="tokens"),
    "max_kv_cache_usage": Range(0, 1, "a fraction of the KV cache; seed 000 gates at 0.80", low_open=True),
    "max_probe_failures": Range(0, 1_000_000, "probes allowed to go unanswered", whole=True),
    "min_mem_available_mib": Range(0, 16_777_216, "MemAvailable the host must keep; 0 gates nothing", whole=True, unit="MiB"),
    "max_gap": Range(1, 86_400, "seconds between two samples before the host counts as frozen", unit="seconds"),
}


class Finished(t.NamedTuple):
    """How one round's process ended: ``rc`` None when it could not start; ``timed_out`` when our backstop killed it."""

    rc: int | None
    output: str
    timed_out: bool
    seconds: float


# argv, environment additions, seconds before the backstop kills it.
RunRound = t.Callable[[list[str], dict[str, str], float], Finished]


class Stop(t.Protocol):
    def wait(self, timeout: float | None = None) -> bool: ...


def run_bounded(argv: list[str], environ_update: dict[str, str], seconds: float) -> Finished:
    """One round's process, killed with its whole session after ``seconds``; output to a file, so no pipe fills up."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as output:
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       env=dict(os.environ, **environ_update), start_new_session=True)
        except OSError as error:
            return Finished(None, f"{argv[0]}: {error.strerror or error}", False, 0.0)
        try:
            rc = process.wait(timeout=seconds)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            rc = process.wait()
            timed_out = True
        output.seek(0)
        text = output.read().decode("utf-8", "replace")
    return Finished(rc, text[-OUTPUT_TAIL:], timed_out, time.monotonic() - started)


def read_meminfo() -> str:
    with open("/proc/meminfo", encoding="ascii", errors="replace") as handle:
        return handle.read()


@dataclasses.dataclass(frozen=True)
class Host:
    """What a soak does to the host; tests give their own."""

    run_command: RunCommand
    run_round: RunRound = run_bounded
    clock: t.Callable[[], float] = time.monotonic
    wall: t.Callable[[], float] = time.time
    pause: t.Callable[[float], None] = time.sleep
    meminfo: t.Callable[[], str] = read_meminfo


@dataclasses.dataclass(frozen=True)
class Job:
    """One soak as resolved from the options."""

    params: t.Mapping[str, t.Any]
    endpoint: t.Mapping[str, t.Any]
    unit: str
    runner: str
    plan: t.Mapping[str, t.Any]
    docker: str
    systemctl: str
    journalctl: str
    tokenizer: str
    workdir: str
    thresholds: t.Mapping[str, float]


def thresholds_of(params: t.Mapping[str, t.Any]) -> dict[str, float]:
    """The gate's figures; the gap defaults to three sample intervals (seed 000: 90 s at 30 s)."""
    return {
        "max_kv_cache_usage": params["max_kv_cache_usage"],
        "max_gap": params["max_gap"] if params.get("max_gap") is not None else 3 * params["sample_interval"],
        "max_probe_failures": params["max_probe_failures"],
        "min_mem_available_mib": params["min_mem_available_mib"],
    }


def validate(options: t.Mapping[str, t.Any]) -> list[str]:
    """Problems of a soak request, each naming the option to fix.

    ``options`` are the module's with the runner picked and ``docker``, ``systemctl``, ``journalctl`` and
    ``vllm`` the host's commands (None where absent).
    """
    errors = [] if options.get("instance") else [INSTANCE_NEEDED]
    errors += CONCURRENCY.problems("concurrency", options.get("concurrency"), text=False)
    for name in ("prompts_per_concurrency", "input_tokens", "output_tokens"):
        errors += BENCH_RANGES[name].problems(name, options.get(name), text=False)
    for name, bound in SOAK_RANGES.items():
        if name != "max_gap" or options.get(name) is not None:
            errors += bound.problems(name, options.get(name), text=False)
    gap, interval = options.get("max_gap"), options.get("sample_interval")
    if not errors and gap is not None and gap <= interval:
        errors.append(f"max_gap: {gap} must exceed sample_interval ({interval}): every gap between samples is at least one interval")
    errors += label_problems("label", options.get("label"))
    for field in ("watch_units", "watch_containers"):
        names = options.get(field) or []
        if not all(isinstance(name, str) and name.strip() and not name.startswith("-") for name in names):
            errors.append(f"{field}: {names!r} must be a list of unit or container names")
    for command, why in (("docker", "reads the instance's container"), ("systemctl", "reads the restart counts of the units"),
                         ("journalctl", "counts OOM kills, earlyoom kills, NVRM errors and watchdog actions")):
        if not options.get(command):
            errors.append(f"{command}: the soak {why} with {command}, which this host lacks")
    if options.get("runner") == "container" and not options.get("image"):
        errors.append("image: runner container needs the pinned image (or an instance whose plan names it)")
    if options.get("runner") == "local" and not options.get("vllm"):
        errors.append("runner: local needs the vllm command on this host's PATH; use runner: exec or container")
    return errors


def instance_unit(config_dir: str, name: str) -> str:
    """The systemd unit of an instance, from its plan file (PlanFileError, a ValueError, when it is unusable)."""
    return read_plan(settings_paths(config_dir.rstrip("/"), name)[1])["unit"]


# --- the state before and after -------------------------------------------------------------------------------

def unit_state(run_command: RunCommand, systemctl: str, unit: str) -> dict[str, t.Any]:
    """Load and active state, NRestarts (systemd's automatic restarts) and the invocation id (new at every start)."""
    try:
        shown = show_units(run_command, [unit], ("LoadState", "ActiveState", "NRestarts", "InvocationID"), systemctl)[unit]
    except StateUnanswered as error:
        return {"unit": unit, "error": str(error)}
    restarts = shown["NRestarts"]
    return {"unit": unit, "load_state": shown["LoadState"], "active_state": shown["ActiveState"],
            "n_restarts": int(restarts) if restarts.isdigit() else None, "invocation": shown["InvocationID"] or None}


def container_summary(name: str, record: t.Mapping[str, t.Any] | None) -> dict[str, t.Any]:
    """Id, StartedAt, RestartCount and Running of one container's record."""
    state = state_of(record)
    if not record or not isinstance(record.get("Id"), str) or not state:
        return {"container": name, "missing": True, "error": f"No such container: {name}" if record is None else "docker answered no container record"}
    return {"container": name, "id": record["Id"], "started_at": state.get("StartedAt"), "restart_count": record.get("RestartCount"),
            "running": state.get("Running") is True}


def container_state(run_command: RunCommand, docker: str, name: str) -> dict[str, t.Any]:
    try:
        return container_summary(name, inspect_container(run_command, name, docker))
    except StateUnanswered as error:
        return {"container": name, "missing": True, "error": str(error)}


def host_state(run_command: RunCommand, systemctl: str, docker: str, units: t.Sequence[str], containers: t.Sequence[str]) -> dict[str, t.Any]:
    return {"units": [unit_state(run_command, systemctl, unit) for unit in units],
            "containers": [container_state(run_command, docker, name) for name in containers]}


def state_problems(state: t.Mapping[str, t.Any]) -> list[str]:
    """Why the soak cannot start: a unit missing, or a container not running."""
    problems = []
    for unit in state["units"]:
        if unit.get("error") or unit.get("load_state") != "loaded":
            problems.append(f"unit {unit['unit']} is not installed on this host ({unit.get('error') or unit.get('load_state')})")
    for container in state["containers"]:
        if container.get("missing"):
            problems.append(f"container {container['container']} does not exist ({container.get('error')})")
        elif not container["running"]:
            problems.append(f"container {container['container']} is not running; a soak measures a serving instance")
    return problems


def unit_restarts(old: t.Mapping[str, t.Any], new: t.Mapping[str, t.Any]) -> int:
    """How many times a unit started again between two readings: systemd's own restarts (NRestarts' rise), or one for
    another NRestarts or a new invocation (a manual or watchdog restart)."""
    old_restarts, new_restarts = old.get("n_restarts"), new.get("n_restarts")
    if isinstance(old_restarts, int) and isinstance(new_restarts, int) and new_restarts > old_restarts:
        return new_restarts - old_restarts
    return int(old_restarts != new_restarts or old.get("invocation") != new.get("invocation"))


def container_restarted(old: t.Mapping[str, t.Any], new: t.Mapping[str, t.Any]) -> bool:
    """Whether a container was replaced (another Id) or restarted in place between two readings."""
    return any(old.get(key) != new.get(key) for key in ("id", "started_at", "restart_count"))


def restart_count(before: t.Mapping[str, t.Any], after: t.Mapping[str, t.Any]) -> int:
    """How many times the soaked units started again: each unit's restarts; the instance's own container (the first of
    each list) replaced or restarted while its unit shows nothing, one more; each other watched container replaced or
    restarted, one. One kill of the instance is one restart, although its unit and its container both show it."""
    units = [unit_restarts(old, new) for old, new in zip(before["units"], after["units"], strict=True)]
    containers = [container_restarted(old, new) for old, new in zip(before["containers"], after["containers"], strict=True)]
    own = int(bool(units) and not units[0] and bool(containers) and containers[0])
    return sum(units) + own + sum(containers[1:])


def restart_changes(before: t.Mapping[str, t.Any], after: t.Mapping[str, t.Any]) -> list[str]:
    """Every restart between two states, worded. The instance's unit owns its container with Restart=always, so
    a crash restarts the unit (NRestarts) and replaces the container (a new Id); a manual or watchdog restart of the
    unit counts no NRestarts but starts a new invocation."""
    changes = []
    for old, new in zip(before["units"], after["units"], strict=True):
        unit = old["unit"]
        if new.get("error"):
            changes.append(f"unit {unit} could not be read after the soak ({new['error']})")
            continue
        if old.get("n_restarts") != new.get("n_restarts"):
            changes.append(f"unit {unit} restarted on its own during the soak (NRestarts {old.get('n_restarts')} -> {new.get('n_restarts')})")
        elif old.get("invocation") != new.get("invocation"):
            changes.append(f"unit {unit} was started again during the soak (a new invocation: a manual or watchdog restart)")
    for old, new in zip(before["containers"], after["containers"], strict=True):
        name = old["container"]
        if new.get("missing"):
            changes.append(f"container {name} is gone after the soak ({new.get('error')})")
            continue
        if old.get("id") != new.get("id"):
            changes.append(f"container {name} was replaced during the soak (Id {str(old.get('id'))[:12]} -> {new['id'][:12]}, "
                           f"started {new.get('started_at')})")
        elif container_restarted(old, new):
            changes.append(f"container {name} restarted in place during the soak (RestartCount {old.get('restart_count')} -> "
                           f"{new.get('restart_count')}, started {new.get('started_at')})")
        if not new.get("running"):
            changes.append(f"container {name} is not running after the soak")
    return changes


# --- the journals ---------------------------------------------------------------------------------------------

def journal_lines(run_command: RunCommand, journalctl: str, since: float, selector: list[str]) -> tuple[list[str] | None, str | None]:
    """The messages of one journal selection since an epoch second; (None, why) when the journal cannot be read."""
    rc, out, err = run_command([journalctl, *selector, "--since", f"@{int(since)}", "--output", "cat", "--quiet", "--no-pager"])
    if rc:
        return None, (err or out).strip()[:300] or f"journalctl exited {rc}"
    return [line for line in out.splitlines() if line.strip()], None


def kernel_findings(lines: t.Sequence[str]) -> dict[str, list[str]]:
    """The kernel's OOM kills, and the NVIDIA driver's out-of-memory errors."""
    return {"oom_kills": [line for line in lines if KERNEL_OOM in line],
            "nvrm_no_memory": [line for line in lines if "NVRM" in line and "NV_ERR_NO_MEMORY" in line]}


def earlyoom_kills(lines: t.Sequence[str]) -> list[str]:
    return [line for line in lines if EARLYOOM_KILL.search(line)]


def unit_known(run_command: RunCommand, systemctl: str, unit: str) -> bool:
    try:
        return show_units(run_command, [unit], ("LoadState",), systemctl)[unit]["LoadState"] not in ("", "not-found")
    except StateUnanswered:
        return False


def journal_counts(job: Job, host: Host, since: float) -> tuple[dict[str, t.Any], list[str]]:
    """The counts the gate reads from the journals since the start, with their first lines as evidence; and notes."""
    params, notes = job.params, []
    errors: dict[str, str] = {}
    kernel, why = journal_lines(host.run_command, job.journalctl, since, ["--dmesg"])
    if why:
        errors["kernel"] = why
    found = kernel_findings(kernel or [])
    read: dict[str, list[t.Any]] = {}
    for journal, unit, pick, counted in (("earlyoom", params["earlyoom_unit"], earlyoom_kills, "earlyoom kill"),
                                         ("watchdog", params["watchdog_unit"], acted, "watchdog action")):
        read[journal] = []
        if not unit_known(host.run_command, job.systemctl, unit):
            notes.append(f"{unit} is not installed: no {counted} to count")
            continue
        lines, why = journal_lines(host.run_command, job.journalctl, since, ["--unit", unit])
        if why:
            errors[journal] = why
        read[journal] = pick(lines or [])
    earlyoom, actions = read["earlyoom"], read["watchdog"]
    counts = {
        "oom_kills": len(found["oom_kills"]), "earlyoom_kills": len(earlyoom), "nvrm_no_memory": len(found["nvrm_no_memory"]),
        "watchdog_actions": len(actions), "journal_errors": errors,
        "evidence": {"oom_kills": found["oom_kills"][:EVIDENCE_LINES], "earlyoom_kills": earlyoom[:EVIDENCE_LINES],
                     "nvrm_no_memory": found["nvrm_no_memory"][:EVIDENCE_LINES], "watchdog_actions": actions[:EVIDENCE_LINES]},
    }
    return counts, notes


# --- the samples ----------------------------------------------------------------------------------------------

def gauge_max(samples: Samples, name: str) -> float | None:
    """The highest value of a gauge over its engines: a usage fraction is not summed across data-parallel engines."""
    values = [value for _labels, value in samples.get(name, [])]
    return max(values) if values else None


def gauge_sum(samples: Samples, name: str) -> float | None:
    values = [value for _labels, value in samples.get(name, [])]
    return sum(values) if values else None


def mem_available_mib(meminfo: str) -> float | None:
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) / 1024
    return None


class LiveSampler:
    """One sample per call: the gauges from /metrics, MemAvailable, and a probe sent on its own thread so a slow
    answer never delays the next sample (which would read as a freeze)."""

    def __init__(self, endpoint: t.Mapping[str, t.Any], host: Host, start: float, metrics_timeout: float,
                 probe_timeout: float, probe_max_tokens: int) -> None:
        self.endpoint, self.host, self.start = endpoint, host, start
        self.metrics_timeout, self.probe_timeout, self.probe_max_tokens = metrics_timeout, probe_timeout, probe_max_tokens
        self.probes: list[threading.Thread] = []

    def __call__(self) -> dict[str, t.Any]:
        sample: dict[str, t.Any] = {"t": round(self.host.clock() - self.start, 3), "time": round(self.host.wall(), 3),
                                    "probe_s": None, "probe_error": "no answer before the soak ended"}
        try:
            metrics = read_metrics(self.endpoint["url"], self.endpoint["api_key"], self.metrics_timeout)
            sample.update(kv_cache_usage=gauge_max(metrics, "vllm:kv_cache_usage_perc"),
                          waiting=gauge_sum(metrics, "vllm:num_requests_waiting"),
                          running=gauge_sum(metrics, "vllm:num_requests_running"), metrics_error=None)
        except (ValueError, RuntimeError) as error:
            sample.update(kv_cache_usage=None, waiting=None, running=None, metrics_error=str(error)[:300])
        # After the gauges: a probe in flight would count as a running request, as if the rounds loaded the engine.
        probe = threading.Thread(target=self.probe, args=(sample,), daemon=True)
        probe.start()
        self.probes.append(probe)
        try:
            sample["mem_available_mib"] = mem_available_mib(self.host.meminfo())
        except OSError as error:
            sample["mem_available_mib"] = None
            sample["mem_error"] = str(error)
        return sample

    def probe(self, sample: dict[str, t.Any]) -> None:
        url = self.endpoint["url"] + "/v1/chat/completions"
        payload = {"model": self.endpoint["model"], "messages": [{"role": "user", "content": PROBE_PROMPT}],
                   "max_tokens": self.probe_max_tokens, "temperature": 0}
        started = time.monotonic()
        reply = http("POST", url, self.endpoint["api_key"], payload, timeout=self.probe_timeout)
        seconds = time.monotonic() - started
        try:
            answered = reply.status == 200 and bool(json.loads(reply.body).get("choices"))
        except (ValueError, AttributeError):
            answered = False
        if answered:
            sample.update(probe_s=round(seconds, 3), probe_error=None)
        else:
            sample["probe_error"] = f"HTTP {reply.status}: {reply.body[:200]}" if reply.status is not None else (reply.error or "no reply")

    def settle(self) -> None:
        """Wait for the probes still out; each ends within its own timeout."""
        for probe in self.probes:
            probe.join(self.probe_timeout + 5)


def sample_loop(take: t.Callable[[], dict[str, t.Any]], clock: t.Callable[[], float], interval: float, stop: Stop) -> list[dict[str, t.Any]]:
    """Samples every ``interval`` seconds from the start of the previous one until ``stop`` is set, and one last at
    the stop, so a freeze just before the end still shows as a gap."""
    samples = []
    while True:
        started = clock()
        samples.append(take())
        if stop.wait(max(0.0, started + interval - clock())):
            break
    samples.append(take())
    return samples


def summarize(samples: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """The figures the gate reads from the samples: the maxima, the minimum MemAvailable, the largest gap, the probes."""
    def present(key: str) -> list[float]:
        return [s[key] for s in samples if isinstance(s.get(key), (int, float))]

    kv, waiting, memory, probes = present("kv_cache_usage"), present("waiting"), present("mem_available_mib"), present("probe_s")
    gaps = [(later["t"] - earlier["t"], later["t"]) for earlier, later in zip(samples, samples[1:], strict=False)]
    largest = max(gaps, default=(None, None))
    return {
        "samples": len(samples),
        "max_kv_cache_usage": max(kv, default=None),
        "max_waiting": max(waiting, default=None),
        "min_mem_available_mib": round(min(memory), 1) if memory else None,
        "max_gap_s": round(largest[0], 3) if largest[0] is not None else None,
        "max_gap_at_s": largest[1],
        "probe_median_s": round(statistics.median(probes), 3) if probes else None,
        "probe_max_s": max(probes, default=None),
        "probe_failures": sum(1 for s in samples if s.get("probe_error")),
        "first_probe_error": next((s["probe_error"] for s in samples if s.get("probe_error")), None),
        "metrics_failures": sum(1 for s in samples if s.get("metrics_error")),
        # How many samples that read the gauges saw the rounds' load (a request running or waiting): a soak whose rounds
        # leave the engine idle between short bursts judges little.
        "loaded_samples": sum(1 for s in samples if (s.get("running") or 0) > 0 or (s.get("waiting") or 0) > 0),
        "gauged_samples": sum(1 for s in samples if isinstance(s.get("running"), (int, float))),
    }


def idle_note(summary: t.Mapping[str, t.Any]) -> str | None:
    """What a soak whose samples never saw its load must say: its gates judged an engine at rest."""
    if not summary.get("gauged_samples") or summary.get("loaded_samples"):
        return None
    return (f"none of the {summary['gauged_samples']} samples that read the gauges saw a request running or waiting: the rounds "
            "left the engine idle whenever it was sampled, so the gates judged an engine at rest; raise "
            "soak_prompts_per_concurrency or soak_output_tokens, or sample more often (soak_sample_interval)")


# --- the rounds -----------------------------------------------------------------------------------------------

def bounded(prefix: t.Sequence[str], seconds: int) -> list[str]:
    """A runner's argv with ``vllm`` under timeout(1) where it runs: in the serving container or the bench container,
    killing the docker client would leave vllm bench running inside."""
    guard = ["--kill-after", f"{KILL_AFTER}s", f"{seconds}s", "vllm"]
    if "--entrypoint" in prefix:
        at = prefix.index("--entrypoint")
        return [*prefix[:at + 1], "timeout", *prefix[at + 2:], *guard]
    return [*prefix[:-1], "timeout", *guard]


def round_argv(job: Job, index: int, seconds: int, prompts: int) -> tuple[list[str], str]:
    """One round's argv and result file name."""
    params, plan = job.params, job.plan
    filename = f"round-{index:04d}.json"
    args = bench_args(
        base_url=plan["base_url"], model=job.endpoint["model"], tokenizer=job.tokenizer, concurrency=params["concurrency"],
        num_prompts=prompts, dataset="random", input_tokens=params["input_tokens"],
        output_tokens=params["output_tokens"], dataset_path="", result_dir=plan["data_dir"], result_filename=filename,
        # A seed per round: each round's random prompts differ, so no round reuses another's prefix cache.
        seed=index,
    )
    return bounded(plan["prefix"], seconds) + args, filename


def read_round(path: str) -> t.Any:
    """A round's saved result as vllm_bench reads a run's; a file that cannot be read is judged as no JSON object."""
    try:
        return load_result(path)
    except OSError as error:
        return f"unreadable: {error.strerror or error}"


def one_round(job: Job, host: Host, index: int, seconds: int, started_at: float, prompts: int) -> dict[str, t.Any]:
    """One ``vllm bench serve`` of ``prompts`` under its timeout, judged by its result file as vllm_bench judges a run."""
    argv, filename = round_argv(job, index, seconds, prompts)
    local = os.path.join(job.workdir, filename)
    began = host.clock()
    finished = host.run_round(argv, {"OPENAI_API_KEY": job.endpoint["api_key"] or "EMPTY"}, seconds + KILL_AFTER + BACKSTOP)
    if job.plan["copy_in"]:
        inside = f"{job.plan['data_dir']}/{filename}"
        host.run_command([job.docker, "cp", f"{job.endpoint['container']}:{inside}", local])
        host.run_command([job.docker, "exec", job.endpoint["container"], "rm", "-f", inside])
    saved = read_round(local)
    # timeout(1) exits 124 after its SIGTERM and 137 after its SIGKILL; 137 alone is also a killed container.
    stalled = finished.timed_out or finished.rc == 124 or (finished.rc == 137 and finished.seconds >= seconds)
    if stalled:
        problems = [f"round {index} was still running after {seconds} s and was killed"]
    else:
        problems = [f"round {index}: {problem}" for problem in judge(saved, finished.output, allow_failures=True, prompts=prompts)]
    counted = isinstance(saved, dict) and not stalled
    return {
        "round": index, "t": round(began - started_at, 3), "seconds": round(finished.seconds, 3), "timeout": seconds,
        "exit_code": finished.rc, "stalled": stalled, "prompts": prompts,
        "completed": saved.get("completed") if counted and is_whole(saved.get("completed")) else None,
        "failed": saved.get("failed") if counted and is_whole(saved.get("failed")) else None,
        # A result file whose counts are missing, not counts, or do not add up to the prompts sent.
        "unaccounted": counted and accounting(saved, prompts) is not None,
        # vllm bench's own measure of the load's time, without its start.
        "load_seconds": saved["duration"] if counted and is_positive_seconds(saved.get("duration")) else None,
        "result_file": local if saved is not None else None, "problems": problems,
    }


def is_positive_seconds(value: t.Any) -> bool:
    """A time a result may give: a finite number above zero (JSON readers take NaN and Infinity; a bool is no time)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def round_prompts(params: t.Mapping[str, t.Any], last: t.Mapping[str, t.Any] | None, left: float, timeout: float) -> int:
    """The prompts of the next round: concurrency x prompts_per_concurrency, grown after a round whose every request
    completed until its load would fill ``BUSY_SHARE`` of the round at that round's pace, in whole prompts per stream;
    never more than fit in the ``left`` seconds before the deadline at that pace, nor in ``BUSY_SHARE`` of the round's
    ``timeout``, nor more than the most prompts_per_concurrency allows. A round that failed requests grows nothing: fast
    failures would read as a fast pace."""
    concurrency = params["concurrency"]
    configured = concurrency * params["prompts_per_concurrency"]
    if not last or last["problems"] or last.get("failed") != 0 or not is_whole(last.get("prompts")) or last["prompts"] < 1:
        return configured
    if not is_positive_seconds(last.get("load_seconds")) or not is_positive_seconds(last.get("seconds")):
        return configured
    start_seconds = last["seconds"] - last["load_seconds"]
    per_prompt = last["load_seconds"] / last["prompts"]
    if start_seconds <= 0 or not is_positive_seconds(per_prompt):
        return configured
    busy = start_seconds * BUSY_SHARE / (1 - BUSY_SHARE) / per_prompt
    fitting = min(left - start_seconds, timeout * BUSY_SHARE - start_seconds) / per_prompt
    streams = min(busy, fitting, concurrency * BENCH_RANGES["prompts_per_concurrency"].high) / concurrency
    return max(configured, concurrency * int(streams))


def run_rounds(job: Job, host: Host, started_at: float, deadline: float) -> list[dict[str, t.Any]]:
    """Rounds until the deadline, the first whatever the clock says (a soak judges at least one round, also when its
    start took longer than its duration); the last one may run ``drain_timeout`` past it. After a round that failed, a
    pause of one sample interval, so a restarting server is not hammered by rounds that fail at once."""
    params, rounds = job.params, []
    while not rounds or host.clock() < deadline:
        seconds = max(1, int(min(params["round_timeout"], deadline + params["drain_timeout"] - host.clock())))
        prompts = round_prompts(params, rounds[-1] if rounds else None, deadline - host.clock(), seconds)
        rounds.append(one_round(job, host, len(rounds) + 1, seconds, started_at, prompts))
        if rounds[-1]["problems"] and host.clock() < deadline:
            host.pause(min(params["sample_interval"], deadline - host.clock()))
    return rounds


def round_counts(rounds: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    def whole(value: t.Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return {"rounds": len(rounds), "unfinished_rounds": sum(1 for r in rounds if unfinished(r)),
            "unaccounted_rounds": sum(1 for r in rounds if r.get("unaccounted")),
            "completed_requests": sum(whole(r["completed"]) for r in rounds), "failed_requests": sum(whole(r["failed"]) for r in rounds)}


def unfinished(found: t.Mapping[str, t.Any]) -> bool:
    """A round with nothing to count: stalled, or no result file holding a JSON object."""
    return bool(found["stalled"]) or (found["completed"] is None and not found.get("unaccounted"))


# --- the verdict ----------------------------------------------------------------------------------------------

def first(lines: t.Sequence[t.Any]) -> str:
    return f": {str(lines[0])[:200]}" if lines else ""


def verdict(summary: t.Mapping[str, t.Any], counts: t.Mapping[str, t.Any], changes: t.Sequence[str],
            rounds: t.Sequence[t.Mapping[str, t.Any]], thresholds: t.Mapping[str, float], probe_timeout: float) -> tuple[bool, list[str]]:
    """PASS or FAIL with every reason (seed 000's gate, the probes, NVRM memory errors and the watchdog)."""
    reasons = []
    if counts["failed_requests"]:
        reasons.append(f"{counts['failed_requests']} request(s) failed across {counts['rounds']} round(s) of vllm bench serve")
    if counts["unfinished_rounds"]:
        problems = [p for r in rounds if unfinished(r) for p in r["problems"]]
        reasons.append(f"{counts['unfinished_rounds']} of {counts['rounds']} round(s) did not finish: " + "; ".join(problems[:3]))
    if counts.get("unaccounted_rounds"):
        problems = [p for r in rounds if r.get("unaccounted") for p in r["problems"]]
        reasons.append(f"{counts['unaccounted_rounds']} of {counts['rounds']} round(s) did not account for every request: "
                       + "; ".join(problems[:3]))
    if not counts["rounds"]:
        reasons.append("no round of vllm bench serve ran")
    kv, limit = summary["max_kv_cache_usage"], thresholds["max_kv_cache_usage"]
    if kv is None:
        reasons.append("no sample read vllm:kv_cache_usage_perc from /metrics, so the KV cache is not known to stay under the gate")
    elif kv >= limit:
        reasons.append(f"KV cache usage reached {kv:.1%} (gate: below {limit:.0%})")
    gap = summary["max_gap_s"]
    if gap is not None and gap > thresholds["max_gap"]:
        reasons.append(f"the largest gap between samples was {gap:.1f} s, {summary['max_gap_at_s']:.0f} s into the soak "
                       f"(gate: at most {thresholds['max_gap']:g} s): the host stalled")
    memory, floor = summary["min_mem_available_mib"], thresholds["min_mem_available_mib"]
    if memory is None:
        reasons.append("no sample read MemAvailable from /proc/meminfo")
    elif memory < floor:
        reasons.append(f"MemAvailable fell to {memory:.0f} MiB (gate: at least {floor} MiB)")
    if summary["probe_failures"] > thresholds["max_probe_failures"]:
        # What failed, as the probe saw it: a refusal within milliseconds is no timeout.
        reasons.append(f"{summary['probe_failures']} of {summary['samples']} probe(s) failed (each waits at most {probe_timeout:g} s; "
                       f"the first: {summary.get('first_probe_error') or 'unknown'}) (gate: at most {thresholds['max_probe_failures']:g})")
    evidence = counts["evidence"]
    if counts["oom_kills"]:
        reasons.append(f"{counts['oom_kills']} kernel OOM kill(s) (\"Killed process\" in the kernel journal){first(evidence['oom_kills'])}")
    if counts["earlyoom_kills"]:
        reasons.append(f"{counts['earlyoom_kills']} earlyoom kill(s){first(evidence['earlyoom_kills'])}")
    if counts["nvrm_no_memory"]:
        reasons.append(f"{counts['nvrm_no_memory']} NVIDIA driver memory error(s) (NVRM NV_ERR_NO_MEMORY){first(evidence['nvrm_no_memory'])}")
    reasons += changes
    if counts["watchdog_actions"]:
        actions = "; ".join(f"{a.get('action')} {a.get('unit', '?')}" + (f" ({a['why']})" if a.get("why") else "")
                            for a in evidence["watchdog_actions"])
        reasons.append(f"the watchdog acted {counts['watchdog_actions']} time(s): {actions}")
    for journal, why in counts["journal_errors"].items():
        reasons.append(f"the {journal} journal could not be read ({why}), so what it would count is unknown")
    return not reasons, reasons


# --- the whole soak -------------------------------------------------------------------------------------------

def soak(params: t.Mapping[str, t.Any], run_command: RunCommand, which: Which, check_mode: bool, host: Host | None = None) -> Outcome:
    """vllm_soak from its options to its answer; the module passes AnsibleModule.run_command and get_bin_path."""
    host = host or Host(run_command=run_command)
    empty: dict[str, t.Any] = {"changed": False, "ok": False, "passed": False, "samples": [], "rounds": []}

    def refused(reasons: list[str], **found: t.Any) -> Outcome:
        return Outcome("vllm_soak refused: " + "; ".join(reasons), dict(empty, reasons=reasons, **found))

    try:
        if not params.get("instance"):
            raise ValueError(INSTANCE_NEEDED)
        endpoint = resolve(params)
        unit = instance_unit(params["config_dir"], params["instance"])
    except OSError as error:
        return refused([f"instance {params['instance']}: cannot read its plan file ({error.strerror or error})"])
    except ValueError as error:
        return refused([str(error)])
    docker, systemctl, journalctl, vllm = which("docker"), which("systemctl"), which("journalctl"), which("vllm")
    container, image = endpoint["container"], params["image"] or endpoint["image"]
    runner = pick_runner(params["runner"], container, docker, vllm, run_command)
    errors = validate(dict(params, runner=runner, image=image, docker=docker, systemctl=systemctl, journalctl=journalctl, vllm=vllm))
    if errors:
        return refused(errors)
    before = host_state(run_command, systemctl, docker, [unit, *(params["watch_units"] or [])], [container, *(params["watch_containers"] or [])])
    problems = state_problems(before)
    if problems:
        return refused(problems, runner=runner)
    thresholds = thresholds_of(params)
    if check_mode:
        plan = (f"check mode: would run vllm bench serve (runner {runner}) against {unit} at concurrency {params['concurrency']}, "
                f"{params['concurrency'] * params['prompts_per_concurrency']} prompts of {params['input_tokens']} tokens in and "
                f"{params['output_tokens']} out in the first round (later rounds grow until their load fills "
                f"{BUSY_SHARE:.0%} of a round), for {params['duration']} s, sampling every {params['sample_interval']} s; "
                "nothing was sent")
        # changed as a real soak reports it: it writes its result files.
        return Outcome(None, dict(empty, changed=True, ok=True, passed=None, runner=runner, reasons=[], notes=[plan], thresholds=thresholds))
    workdir = os.path.join(params["results_dir"], params["label"])
    tokenizer = params["tokenizer"] or endpoint["weights"] or endpoint["model"]
    if runner == "local" and not params["tokenizer"] and endpoint["weights"]:
        tokenizer = local_tokenizer(endpoint["weights"], params["models_dir"])
    try:
        discover_model(endpoint, params["timeout"])
        job = Job(params=params, endpoint=endpoint, unit=unit, runner=runner, docker=docker, systemctl=systemctl, journalctl=journalctl,
                  plan=runner_command(runner, docker=docker, container=container, image=image, workdir=workdir,
                                      models_dir=params["models_dir"], host_url=endpoint["url"], container_url=endpoint["container_url"]),
                  tokenizer=tokenizer, workdir=workdir, thresholds=thresholds)
        os.makedirs(workdir, mode=0o755, exist_ok=True)
        # A shorter soak under the same label must not leave an earlier soak's rounds beside its own.
        for stale in glob.glob(os.path.join(workdir, "round-*.json")):
            os.unlink(stale)
        result = run_soak(job, host, before)
        write_atomically(os.path.join(workdir, "soak.json"), (json.dumps(result, indent=1, sort_keys=True) + "\n").encode(), 0o644)
    except ValueError as error:
        return refused([str(error)], runner=runner)
    except OSError as error:
        reason = (f"{error.filename or 'a file'}: {error.strerror or error}; results_dir must be writable by the task's user "
                  "(become: true, or another folder)")
        return Outcome(f"vllm_soak failed: {reason}", dict(empty, runner=runner, reasons=[reason]))
    if not result["passed"] and params["fail_on_verdict"]:
        return Outcome("SOAK FAIL: " + "; ".join(result["reasons"]), result)
    return Outcome(None, result)


def run_soak(job: Job, host: Host, before: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """Load and samples until the deadline, then the counts, the restarts and the verdict."""
    params = job.params
    started_wall, started = host.wall(), host.clock()
    deadline = started + params["duration"]
    sampler = LiveSampler(job.endpoint, host, started, min(params["timeout"], params["sample_interval"]), params["probe_timeout"],
                          params["probe_max_tokens"])
    stop = threading.Event()
    found: dict[str, t.Any] = {}

    def sampling() -> None:
        # A sampler that died must fail the soak, not vanish with its thread.
        try:
            found["samples"] = sample_loop(sampler, host.clock, params["sample_interval"], stop)
        except Exception as error:  # pylint: disable=broad-exception-caught
            found["error"] = f"{type(error).__name__}: {error}"

    thread = threading.Thread(target=sampling, daemon=True)
    thread.start()
    try:
        rounds = run_rounds(job, host, started, deadline)
    finally:
        stop.set()
        thread.join()
        sampler.settle()
    finished_wall = host.wall()
    samples = found.get("samples", [])
    summary = summarize(samples)
    counts, notes = journal_counts(job, host, started_wall)
    notes += [note for note in [idle_note(summary)] if note]
    counts.update(round_counts(rounds))
    after = host_state(host.run_command, job.systemctl, job.docker, [state["unit"] for state in before["units"]],
                       [state["container"] for state in before["containers"]])
    changes = restart_changes(before, after)
    passed, reasons = verdict(summary, counts, changes, rounds, job.thresholds, params["probe_timeout"])
    if "error" in found:
        passed = False
        reasons.append(f"the sampler stopped early ({found['error']}), so the gap and the maxima are incomplete")
    # started_at and finished_at, never started and finished: async_status takes those for its own job state.
    return {
        "changed": True, "ok": True, "passed": passed, "reasons": reasons, "notes": notes, "label": params["label"],
        "instance": params["instance"], "unit": job.unit, "container": job.endpoint["container"], "model": job.endpoint["model"],
        "runner": job.runner, "concurrency": params["concurrency"], "prompts_per_round": params["concurrency"] * params["prompts_per_concurrency"],
        "input_tokens": params["input_tokens"], "output_tokens": params["output_tokens"], "duration": params["duration"],
        "sample_interval": params["sample_interval"], "started_at": started_wall, "finished_at": finished_wall,
        "elapsed_s": round(host.clock() - started, 3), "thresholds": dict(job.thresholds), "summary": summary, "counts": counts,
        "restarts": {"before": before, "after": after, "changes": changes, "count": restart_count(before, after)},
        "rounds": rounds, "samples": samples,
        "result_dir": job.workdir,
    }


# --- the report -----------------------------------------------------------------------------------------------

REPORT_KEYS = ("label", "instance", "unit", "container", "model", "runner", "concurrency", "prompts_per_round", "input_tokens",
               "output_tokens", "duration", "sample_interval", "started_at", "finished_at", "elapsed_s", "passed", "reasons", "notes",
               "thresholds", "summary", "counts", "restarts", "rounds", "samples")


def report_problems(result: t.Any) -> list[str]:
    """Why a registered result cannot be written as a report; the report reads the verdict, the figures and the samples."""
    fix = "; pass the registered result of sparkfleet.vllm.vllm_soak itself"
    if not isinstance(result, dict):
        return ["soak: not a mapping" + fix]
    if result.get("passed") is None and result.get("ok"):
        return ["soak: the soak ran in check mode, so there is nothing to report"]
    missing = [key for key in ("passed", "reasons", "thresholds", "summary", "counts", "rounds", "samples") if key not in result]
    if missing:
        return [f"soak: no {', '.join(missing)} (a soak that was refused or never finished, or another module's result)" + fix]
    problems = []
    if not isinstance(result["passed"], bool):
        problems.append(f"soak.passed: {result['passed']!r} is not true or false" + fix)
    if not isinstance(result["reasons"], list) or not all(isinstance(reason, str) for reason in result["reasons"]):
        problems.append("soak.reasons: not a list of reasons" + fix)
    for key in ("thresholds", "summary", "counts"):
        if not isinstance(result[key], dict):
            problems.append(f"soak.{key}: not a mapping" + fix)
    samples = result["samples"]
    if not isinstance(samples, list) or not all(isinstance(s, dict) and isinstance(s.get("t"), (int, float)) for s in samples):
        problems.append("soak.samples: not a list of samples, each with its time t" + fix)
    if not isinstance(result["rounds"], list) or not all(isinstance(r, dict) for r in result["rounds"]):
        problems.append("soak.rounds: not a list of rounds" + fix)
    return problems


def report_data(title: str, result: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """What report.json holds: the soak's result without Ansible's own keys."""
    return {"title": title, **{key: result.get(key) for key in REPORT_KEYS}}


def figure(value: t.Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def markdown_report(title: str, result: t.Mapping[str, t.Any]) -> str:
    """The report: the verdict with every reason, then each gated figure beside its gate."""
    summary, counts, limits = result["summary"], result["counts"], result["thresholds"]
    passed = result["passed"]
    lines = [f"# {title}", "", f"**SOAK {'PASS' if passed else 'FAIL'}**", ""]
    if not passed:
        lines += ["Reasons:", "", *[f"- {reason}" for reason in result["reasons"]], ""]
    if result.get("notes"):
        lines += ["Notes:", "", *[f"- {note}" for note in result["notes"]], ""]
    sizes = [r.get("prompts") for r in result.get("rounds") or [] if isinstance(r, dict) and is_whole(r.get("prompts"))]
    first_round = result.get("prompts_per_round")
    grown = (f" (later rounds up to {max(sizes)}, grown until their load fills most of a round)"
             if sizes and is_whole(first_round) and max(sizes) > first_round else "")
    lines += [
        f"{result.get('instance')} ({result.get('unit')}, model {result.get('model')}), runner {result.get('runner')}: "
        f"{figure(result.get('duration'), '{:g}')} s at concurrency {result.get('concurrency')}, {first_round} "
        f"prompts a round{grown} of {result.get('input_tokens')} tokens in and {result.get('output_tokens')} out, sampled every "
        f"{figure(result.get('sample_interval'), '{:g}')} s.",
        "",
        "| measure | value | gate |",
        "|---|---:|---|",
        f"| rounds of vllm bench serve | {counts.get('rounds', '-')} ({counts.get('unfinished_rounds', '-')} unfinished) | all finish |",
        f"| requests ok / failed | {counts.get('completed_requests', '-')} / {counts.get('failed_requests', '-')} | none fails |",
        f"| rounds with requests unaccounted for | {counts.get('unaccounted_rounds', '-')} | 0 |",
        f"| max KV cache usage | {figure(summary.get('max_kv_cache_usage'), '{:.1%}')} "
        f"| below {figure(limits.get('max_kv_cache_usage'), '{:.0%}')} |",
        f"| max waiting requests | {figure(summary.get('max_waiting'), '{:g}')} | - |",
        f"| samples that saw the load running | {summary.get('loaded_samples', '-')} of {summary.get('gauged_samples', '-')} | - |",
        f"| min MemAvailable | {figure(summary.get('min_mem_available_mib'), '{:,.0f}')} MiB "
        f"| at least {figure(limits.get('min_mem_available_mib'), '{:,.0f}')} MiB |",
        f"| largest gap between samples | {figure(summary.get('max_gap_s'), '{:.1f}')} s "
        f"| at most {figure(limits.get('max_gap'), '{:g}')} s |",
        f"| probe latency median / max | {figure(summary.get('probe_median_s'), '{:.2f}')} / "
        f"{figure(summary.get('probe_max_s'), '{:.2f}')} s | - |",
        f"| probes unanswered | {summary.get('probe_failures', '-')} of {summary.get('samples', '-')} "
        f"| at most {figure(limits.get('max_probe_failures'), '{:g}')} |",
        f"| kernel OOM kills | {counts.get('oom_kills', '-')} | 0 |",
        f"| earlyoom kills | {counts.get('earlyoom_kills', '-')} | 0 |",
        f"| NVRM NV_ERR_NO_MEMORY | {counts.get('nvrm_no_memory', '-')} | 0 |",
        f"| restarts | {(result.get('restarts') or {}).get('count', '-')} | 0 |",
        f"| watchdog actions | {counts.get('watchdog_actions', '-')} | 0 |",
        "",
    ]
    failed_rounds = [r for r in result["rounds"] if r.get("problems")]
    if failed_rounds:
        lines += ["| round | seconds into the soak | ok / failed | problems |", "|---:|---:|---:|---|"]
        lines += [f"| {r.get('round')} | {figure(r.get('t'), '{:.0f}')} | {figure(r.get('completed'), '{}')} / {figure(r.get('failed'), '{}')} "
                  f"| {'; '.join(r['problems']).replace('|', '/')} |" for r in failed_rounds]
        lines.append("")
    return "\n".join(lines)
