"""The soak (module_utils _soak): rounds under their own timeout and the soak's clock, the sampler and its gap
detector, the journals' counts, restart detection, every FAIL reason of the gate, and the report. The whole run
goes against a local HTTP stand-in of vLLM, real threads and real processes where time is short enough."""

import dataclasses
import http.server
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest
from plan_files import unit_plan, write_plan
from threaded_server import serving

from ansible_collections.sparkfleet.vllm.plugins.module_utils import _soak
from ansible_collections.sparkfleet.vllm.plugins.module_utils._soak import (
    Finished,
    Host,
    Job,
    bounded,
    container_state,
    container_summary,
    earlyoom_kills,
    kernel_findings,
    markdown_report,
    report_problems,
    restart_changes,
    round_counts,
    run_bounded,
    run_rounds,
    run_soak,
    sample_loop,
    soak,
    summarize,
    unit_state,
    validate,
    verdict,
)

KEY = "k" * 40
ROOT = pathlib.Path(__file__).resolve().parents[4]
MODULES = ROOT / ".cache" / "collections" / "ansible_collections" / "sparkfleet" / "vllm" / "plugins" / "modules"
OPTIONS = {
    "instance": "llm", "config_dir": "/etc/sparkfleet/vllm", "url": None, "api_key": None, "model": None, "timeout": 10,
    "label": "soak", "concurrency": 2, "prompts_per_concurrency": 3, "duration": 100, "sample_interval": 30, "input_tokens": 64,
    "output_tokens": 16, "round_timeout": 1800, "drain_timeout": 300, "probe_timeout": 10, "probe_max_tokens": 5,
    "max_kv_cache_usage": 0.8, "max_gap": None, "max_probe_failures": 0, "min_mem_available_mib": 0,
    "earlyoom_unit": "earlyoom.service", "watchdog_unit": "sparkfleet-watchdog.service", "watch_units": [], "watch_containers": [],
    "runner": "local", "image": None, "models_dir": "/srv/models", "tokenizer": None, "results_dir": "/var/lib/sparkfleet/soak",
    "fail_on_verdict": True,
}
MEMINFO = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   12582912 kB\n"
INSPECT = [{"Id": "a" * 64, "RestartCount": 0, "State": {"Running": True, "StartedAt": "2026-12-01T10:00:00Z", "OOMKilled": False}}]
EARLYOOM_BANNER = [
    "earlyoom 1.7",
    "mem total: 23890 MiB, swap total:    0 MiB",
    "sending SIGTERM when mem <= 10.00% and swap <= 10.00%,",
    "        SIGKILL when mem <=  5.00% and swap <=  5.00%",
    "mem avail: 20012 of 21701 MiB (92.22%), swap free:    0 of    0 MiB ( 0.00%)",
]


# --- fakes ------------------------------------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def result_file(argv):
    """Where a vllm bench serve argv saves its result."""
    return os.path.join(argv[argv.index("--result-dir") + 1], argv[argv.index("--result-filename") + 1])


def write_result(argv, completed, failed=0):
    with open(result_file(argv), "w", encoding="utf-8") as handle:
        json.dump({"completed": completed, "failed": failed}, handle)


class Machine:
    """systemctl, docker and journalctl as answers to argv, with a state the test changes between before and after."""

    def __init__(self):
        self.inspect = json.loads(json.dumps(INSPECT))
        self.restarts, self.invocation = 0, "1" * 32
        self.kernel, self.earlyoom, self.watchdog = [], [], []
        self.units = {"sparkfleet-vllm-llm.service", "earlyoom.service", "sparkfleet-watchdog.service"}
        self.journal_rc = 0
        self.commands = []

    def run_command(self, argv, environ_update=None):
        self.commands.append(list(argv))
        name = os.path.basename(argv[0])
        if name == "systemctl":
            loaded = argv[-1] in self.units
            return 0, (f"LoadState={'loaded' if loaded else 'not-found'}\nActiveState={'active' if loaded else 'inactive'}\n"
                       f"NRestarts={self.restarts if loaded else 0}\nInvocationID={self.invocation if loaded else ''}\n"), ""
        if name == "docker" and argv[1:3] == ["container", "inspect"]:
            return 0, json.dumps(self.inspect), ""
        if name == "journalctl":
            if self.journal_rc:
                return self.journal_rc, "", "Failed to open journal"
            lines = self.kernel if "--dmesg" in argv else self.earlyoom if "earlyoom.service" in argv else self.watchdog
            return 0, "".join(line + "\n" for line in lines), ""
        raise AssertionError(f"unexpected command {argv}")


class VllmHandler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/metrics":
            self.answer(200, f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {self.server.kv}\n'
                             'vllm:num_requests_waiting{engine="0",model_name="tiny"} 3\n'
                             'vllm:num_requests_running{engine="0",model_name="tiny"} 2\n')
        else:
            self.answer(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.probes.append(body)
        if self.headers.get("Authorization") != "Bearer " + KEY:
            self.answer(401, '{"error": "Unauthorized"}')
        else:
            time.sleep(self.server.probe_delay)
            self.answer(200, '{"choices": [{"message": {"content": "ready"}}]}')

    def log_message(self, *_args):
        pass


class VllmStandIn(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), VllmHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.kv, self.probes, self.probe_delay = 0.25, [], 0.0


@pytest.fixture
def vllm():
    with serving(VllmStandIn()) as server:
        yield server


def endpoint(url="http://127.0.0.1:9"):
    return {"url": url, "api_key": KEY, "model": "tiny", "weights": "/models/tiny", "container": "vllm-llm",
            "container_url": "http://127.0.0.1:8000", "image": "registry.example/vllm@sha256:" + "0" * 64}


def job(tmp_path, url="http://127.0.0.1:9", **params):
    options = dict(OPTIONS, **params)
    return Job(params=options, endpoint=endpoint(url), unit="sparkfleet-vllm-llm.service", runner="local",
               plan={"prefix": ["vllm"], "python": ["python3"], "data_dir": str(tmp_path), "base_url": url, "copy_in": False},
               docker="/usr/bin/docker", systemctl="/usr/bin/systemctl", journalctl="/usr/bin/journalctl", tokenizer="/srv/models/tiny",
               workdir=str(tmp_path), thresholds=_soak.thresholds_of(options))


# --- the rounds and the soak's clock ----------------------------------------------------------------------------

def test_a_soak_whose_deadline_passed_before_its_first_round_still_runs_one(tmp_path):
    """Found in the suite on a busy machine: a 10 ms soak whose sampler thread took the first milliseconds ran no round."""
    clock, runs = FakeClock(), []

    def run_round(argv, env, seconds):
        runs.append(seconds)
        clock.now += 5
        write_result(argv, completed=6)
        return Finished(0, "", False, 5.0)

    host = Host(run_command=Machine().run_command, run_round=run_round, clock=clock)
    rounds = run_rounds(job(tmp_path, duration=100), host, clock.now - 200, clock.now - 100)
    assert len(rounds) == 1 and len(runs) == 1, "one round, and no second past the deadline"
    assert rounds[0]["timeout"] == 100 + job(tmp_path, duration=100).params["drain_timeout"] - 200, "bounded by what is left of the drain"


def test_rounds_stop_at_the_deadline_and_the_last_may_run_into_the_drain(tmp_path):
    clock, runs = FakeClock(), []

    def run_round(argv, env, seconds):
        runs.append((clock.now, argv, env, seconds))
        clock.now += 40
        write_result(argv, completed=6)
        return Finished(0, "", False, 40.0)

    host = Host(run_command=Machine().run_command, run_round=run_round, clock=clock)
    rounds = run_rounds(job(tmp_path, duration=100), host, clock.now, clock.now + 100)
    assert [r["t"] for r in rounds] == [0, 40, 80]
    assert clock.now == 1120, "no round starts after the deadline"
    # Each round's own timeout: the round timeout, or what is left of the deadline plus the drain.
    assert [argv[:5] for _at, argv, _env, _s in runs] == [["timeout", "--kill-after", "10s", f"{s}s", "vllm"] for s in (400, 360, 320)]
    assert [seconds for *_rest, seconds in runs] == [440, 400, 360]
    assert all(env == {"OPENAI_API_KEY": KEY} for _at, _argv, env, _s in runs)
    argv = runs[0][1]
    for flag, value in (("--max-concurrency", "2"), ("--num-prompts", "6"), ("--random-input-len", "64"), ("--random-output-len", "16")):
        assert argv[argv.index(flag) + 1] == value
    assert "--ignore-eos" in argv and KEY not in " ".join(argv)
    assert len({argv[argv.index("--seed") + 1] for _at, argv, _env, _s in runs}) == 3, "every round draws other prompts"
    assert round_counts(rounds) == {"rounds": 3, "unfinished_rounds": 0, "unaccounted_rounds": 0, "completed_requests": 18, "failed_requests": 0}


def test_rounds_grow_until_their_load_fills_most_of_a_round_and_never_past_the_deadline(tmp_path):
    """Issue 39: rounds of 10 s held 1-2 s of load, the rest vllm bench's start. Here each round takes 8 s to start and
    0.5 s per prompt at concurrency 2: the first sends the configured 6 prompts (3 s of load), the next grows until its
    load is nine times the start (72 s, 144 prompts), and the last shrinks to what fits before the deadline."""
    clock, sent = FakeClock(), []

    def run_round(argv, env, seconds):
        prompts = int(argv[argv.index("--num-prompts") + 1])
        sent.append(prompts)
        load = prompts * 0.5
        clock.now += 8 + load
        with open(result_file(argv), "w", encoding="utf-8") as handle:
            json.dump({"completed": prompts, "failed": 0, "duration": load}, handle)
        return Finished(0, "", False, 8 + load)

    host = Host(run_command=Machine().run_command, run_round=run_round, clock=clock)
    start = clock.now
    rounds = run_rounds(job(tmp_path, duration=200), host, start, start + 200)
    assert sent == [6, 144, 144, 42], "grown to 144 prompts (72 s of load), then only what the 29 s left hold"
    assert [r["prompts"] for r in rounds] == sent and [r["load_seconds"] for r in rounds] == [3.0, 72.0, 72.0, 21.0]
    assert clock.now == start + 200, "the last round ends at the deadline, not past it"
    assert all(prompts % 2 == 0 for prompts in sent), "whole prompts per stream"
    assert round_counts(rounds)["completed_requests"] == sum(sent)


def clean(seconds, load, prompts=6, **changes):
    return {"problems": [], "failed": 0, "seconds": seconds, "load_seconds": load, "prompts": prompts, **changes}


@pytest.mark.parametrize("last, left, timeout, expected", [
    (None, 1000, 1800, 6),
    (clean(11, 3), 1000, 1800, 144),
    # A round that failed requests (fast failures read as a fast pace), or had problems, teaches nothing.
    (clean(11, 3, failed=2), 1000, 1800, 6),
    (clean(11, 3, failed=None), 1000, 1800, 6),
    (clean(11, 3, problems=["round 1: 2 failed"]), 1000, 1800, 6),
    # Nor a round without a time of its load that can be divided: missing, zero, negative, NaN, infinite, a bool, tiny.
    (clean(11, None), 1000, 1800, 6),
    (clean(11, 0), 1000, 1800, 6),
    (clean(11, -3), 1000, 1800, 6),
    (clean(11, float("nan")), 1000, 1800, 6),
    (clean(11, float("inf")), 1000, 1800, 6),
    (clean(11, True), 1000, 1800, 6),
    (clean(11, 5e-324), 1000, 1800, 6),
    (clean(float("nan"), 3), 1000, 1800, 6),
    (clean(11, 3, prompts=0), 1000, 1800, 6),
    # A round no longer than its load: nothing to win.
    (clean(3, 3), 1000, 1800, 6),
    (clean(101, 100), 1000, 1800, 6),
    # Little time left: what fits, but never fewer than configured.
    (clean(11, 3), 28, 1800, 40),
    (clean(11, 3), 5, 1800, 6),
    # Never a round its own timeout would kill: start plus load within 90 % of it (200 s + 120 x 4/3 s = 360 s of 400).
    (clean(208, 8), 10 ** 6, 400, 120),
    (clean(358, 8), 10 ** 6, 400, 6),
    # Never past 256 prompts per stream, however slow the start.
    (clean(10_000, 1), 10 ** 9, 21_600, 512),
])
def test_the_next_round_size(last, left, timeout, expected):
    assert _soak.round_prompts({"concurrency": 2, "prompts_per_concurrency": 3}, last, left, timeout) == expected


def test_a_round_stalled_at_the_deadline_is_killed_after_the_drain_and_counted(tmp_path):
    clock = FakeClock()

    def run_round(argv, env, seconds):
        if clock.now >= 1080:
            # timeout(1) in the runner ends the stalled client after the seconds it was given, with 124.
            budget = int(argv[3].rstrip("s"))
            clock.now += budget
            return Finished(124, "Terminated", False, float(budget))
        clock.now += 40
        write_result(argv, completed=6)
        return Finished(0, "", False, 40.0)

    host = Host(run_command=Machine().run_command, run_round=run_round, clock=clock, pause=lambda s: None)
    rounds = run_rounds(job(tmp_path, duration=100, drain_timeout=60), host, clock.now, clock.now + 100)
    assert len(rounds) == 3 and rounds[-1]["timeout"] == 80
    assert clock.now == 1160, "the stalled round ended at the deadline plus the drain"
    assert rounds[-1]["stalled"] and rounds[-1]["problems"] == ["round 3 was still running after 80 s and was killed"]
    assert round_counts(rounds)["unfinished_rounds"] == 1


def test_a_round_that_fails_at_once_is_followed_by_a_pause_not_a_storm(tmp_path):
    clock, pauses = FakeClock(), []

    def run_round(argv, env, seconds):
        clock.now += 1
        return Finished(1, "Error response from daemon: container vllm-llm is restarting", False, 1.0)

    def pause(seconds):
        pauses.append(seconds)
        clock.now += seconds

    host = Host(run_command=Machine().run_command, run_round=run_round, clock=clock, pause=pause)
    rounds = run_rounds(job(tmp_path, duration=100, sample_interval=30), host, clock.now, clock.now + 100)
    assert len(rounds) == 4 and pauses == [30, 30, 30, 6]
    assert rounds[0]["problems"] == ["round 1: vllm bench wrote no result file, so none of the 6 prompts sent is accounted for "
                                     "(Error response from daemon: container vllm-llm is restarting)"]
    assert round_counts(rounds)["unfinished_rounds"] == 4


# Rounds of 6 prompts whose result files do not account for every one: the file's text, and the round's counts as kept.
UNACCOUNTED_ROUNDS = {
    "failed-missing": ('{"completed": 6}', 6, None, "round 1: 6 prompts sent, but the result file's failed missing"),
    "failed-null": ('{"completed": 6, "failed": null}', 6, None, "the result file's failed None (not a count)"),
    "failed-text": ('{"completed": 4, "failed": "2"}', 4, None, "the result file's failed '2' (not a count)"),
    "failed-negative": ('{"completed": 7, "failed": -1}', 7, None, "the result file's failed -1 (not a count)"),
    "completed-missing": ('{"failed": 0}', None, 0, "the result file's completed missing"),
    "shortfall": ('{"completed": 3, "failed": 0}', 3, 0, "round 1: 6 prompts sent, 3 completed, 0 failed: 3 unaccounted for"),
    "more-than-sent": ('{"completed": 6, "failed": 1}', 6, 1, "round 1: 6 prompts sent, 6 completed, 1 failed: 1 more than were sent"),
}


@pytest.mark.parametrize(("text", "completed", "failed", "problem"), UNACCOUNTED_ROUNDS.values(), ids=UNACCOUNTED_ROUNDS.keys())
def test_a_round_that_does_not_account_for_every_request_fails_the_soak(tmp_path, text, completed, failed, problem):
    clock = FakeClock()

    def run_round(argv, env, seconds):
        clock.now += 60
        pathlib.Path(result_file(argv)).write_text(text)
        return Finished(0, "", False, 60.0)

    host = Host(run_command=Machine().run_command, run_round=run_round, clock=clock, pause=lambda s: None)
    rounds = run_rounds(job(tmp_path, duration=50), host, clock.now, clock.now + 50)
    assert len(rounds) == 1 and problem in rounds[0]["problems"][0], rounds[0]["problems"]
    assert (rounds[0]["prompts"], rounds[0]["completed"], rounds[0]["failed"], rounds[0]["unaccounted"]) == (6, completed, failed, True)
    found = round_counts(rounds)
    assert (found["unaccounted_rounds"], found["unfinished_rounds"]) == (1, 0)
    passed, reasons = verdict(passing_summary(), counts(**found), [], rounds, thresholds(), 30)
    assert not passed and reasons[-1] == f"1 of 1 round(s) did not account for every request: {rounds[0]['problems'][0]}"


@pytest.mark.parametrize(("text", "problem"), [(None, "vllm bench wrote no result file, so none of the 6 prompts sent is accounted for"),
                                               ("{\"completed\": 6,", "the result file does not hold a JSON object, so none of the 6"),
                                               ("[6, 0]", "the result file does not hold a JSON object, so none of the 6")])
def test_a_round_without_a_result_to_count_did_not_finish(tmp_path, text, problem):
    clock = FakeClock()

    def run_round(argv, env, seconds):
        clock.now += 60
        if text is not None:
            pathlib.Path(result_file(argv)).write_text(text)
        return Finished(0, "", False, 60.0)

    host = Host(run_command=Machine().run_command, run_round=run_round, clock=clock, pause=lambda s: None)
    rounds = run_rounds(job(tmp_path, duration=50), host, clock.now, clock.now + 50)
    assert problem in rounds[0]["problems"][0] and not rounds[0]["unaccounted"]
    assert (round_counts(rounds)["unfinished_rounds"], round_counts(rounds)["unaccounted_rounds"]) == (1, 0)


def test_the_backstop_kills_a_runner_that_outlives_its_timeout_with_its_children():
    started = time.monotonic()
    finished = run_bounded(["sh", "-c", "sleep 30 & sleep 30; echo never"], {}, 0.5)
    assert finished.timed_out and finished.rc is not None and time.monotonic() - started < 5
    assert "never" not in finished.output


def test_the_timeout_inside_the_runner_ends_a_stalled_vllm_bench(tmp_path):
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\necho started\nexec sleep 30\n")
    fake.chmod(0o755)
    argv = bounded([str(fake)], 1)
    assert argv == ["timeout", "--kill-after", "10s", "1s", "vllm"]
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    started = time.monotonic()
    finished = run_bounded(argv, env, 20)
    assert (finished.rc, finished.timed_out) == (124, False) and time.monotonic() - started < 10
    assert "started" in finished.output


def test_the_timeout_goes_inside_the_serving_container_and_the_bench_container():
    exec_prefix = ["/usr/bin/docker", "exec", "--env", "OPENAI_API_KEY", "vllm-llm", "vllm"]
    assert bounded(exec_prefix, 60) == [*exec_prefix[:-1], "timeout", "--kill-after", "10s", "60s", "vllm"]
    container_prefix = ["/usr/bin/docker", "run", "--rm", "--entrypoint", "vllm", "img@sha256:0"]
    assert bounded(container_prefix, 60) == ["/usr/bin/docker", "run", "--rm", "--entrypoint", "timeout", "img@sha256:0",
                                             "--kill-after", "10s", "60s", "vllm"]


# --- the sampler and the gap detector -----------------------------------------------------------------------------

class FakeStop:
    """Stop.wait over the fake clock: it advances the clock, and is set once the clock passes ``until``."""

    def __init__(self, clock, until):
        self.clock, self.until = clock, until

    def wait(self, timeout=None):
        self.clock.now += timeout
        return self.clock.now >= self.until


def test_samples_every_interval_from_the_previous_start_and_one_at_the_stop():
    clock = FakeClock()

    def take():
        clock.now += 2
        return {"t": clock.now - 2 - 1000}

    samples = sample_loop(take, clock, 30, FakeStop(clock, 1100))
    assert [s["t"] for s in samples] == [0, 30, 60, 90, 120]


def test_a_freeze_shows_as_the_largest_gap():
    clock, frozen = FakeClock(), []

    def take():
        started = clock.now - 1000
        if started == 60 and not frozen:
            frozen.append(True)
            clock.now += 100  # the host locked up in the middle of this sample
        return {"t": started}

    samples = sample_loop(take, clock, 30, FakeStop(clock, 1300))
    summary = summarize(samples)
    assert (summary["max_gap_s"], summary["max_gap_at_s"]) == (100, 160)
    passed, reasons = verdict(summary | {"max_kv_cache_usage": 0.1, "min_mem_available_mib": 1}, counts(), [], [], thresholds(), 10)
    assert not passed and reasons == ["the largest gap between samples was 100.0 s, 160 s into the soak (gate: at most 90 s): the host stalled"]


def test_a_gap_of_exactly_the_gate_passes():
    summary = summarize([{"t": 0}, {"t": 90}, {"t": 120}])
    assert summary["max_gap_s"] == 90
    assert verdict(summary | {"max_kv_cache_usage": 0.1, "min_mem_available_mib": 1}, counts(), [], [], thresholds(), 10) == (True, [])


def test_one_kill_is_one_restart_although_its_unit_and_container_both_show_it():
    unit = {"unit": "u", "n_restarts": 0, "invocation": "a"}
    container = {"container": "c", "id": "1", "started_at": "t0", "running": True}
    before = {"units": [unit], "containers": [container]}
    killed = {"units": [{**unit, "n_restarts": 1, "invocation": "b"}], "containers": [{**container, "id": "2", "started_at": "t1"}]}
    assert len(_soak.restart_changes(before, killed)) == 2 and _soak.restart_count(before, killed) == 1
    by_hand = {"units": [{**unit, "invocation": "b"}], "containers": [{**container, "id": "2"}]}
    assert _soak.restart_count(before, by_hand) == 1 and _soak.restart_count(before, before) == 0
    twice = {"units": [{**unit, "n_restarts": 2, "invocation": "c"}], "containers": [{**container, "id": "3"}]}
    assert _soak.restart_count(before, twice) == 2
    # Watched units and containers (watch_units, watch_containers) need not come in pairs: each counts on its own.
    exporter = {"unit": "node_exporter.service", "n_restarts": 0, "invocation": "x"}
    watched = {"units": [unit, exporter], "containers": [container]}
    restarted = {"units": [unit, {**exporter, "invocation": "y"}], "containers": [container]}
    assert _soak.restart_count(watched, restarted) == 1 and _soak.restart_count(watched, watched) == 0
    gpu = {"container": "nvidia_gpu_exporter", "id": "9", "started_at": "t0", "running": True}
    assert _soak.restart_count({"units": [unit], "containers": [container, gpu]},
                               {"units": [unit], "containers": [container, {**gpu, "started_at": "t2"}]}) == 1


def test_summary_of_the_samples():
    samples = [
        {"t": 0, "kv_cache_usage": 0.2, "waiting": 0, "running": 0, "mem_available_mib": 9000.0, "probe_s": 0.2, "probe_error": None,
         "metrics_error": None},
        {"t": 30, "kv_cache_usage": 0.6, "waiting": 14, "running": 2, "mem_available_mib": 8000.0, "probe_s": 0.4, "probe_error": None,
         "metrics_error": None},
        {"t": 61, "kv_cache_usage": None, "waiting": None, "mem_available_mib": 8500.0, "probe_s": None, "probe_error": "HTTP 503: ",
         "metrics_error": "refused"},
    ]
    assert summarize(samples) == {
        "samples": 3, "max_kv_cache_usage": 0.6, "max_waiting": 14, "min_mem_available_mib": 8000.0, "max_gap_s": 31, "max_gap_at_s": 61,
        "probe_median_s": 0.3, "probe_max_s": 0.4, "probe_failures": 1, "first_probe_error": "HTTP 503: ", "metrics_failures": 1,
        "loaded_samples": 1, "gauged_samples": 2,
    }


def test_a_soak_whose_samples_never_saw_its_load_says_so():
    idle = [{"t": t, "running": 0, "waiting": 0} for t in (0, 30, 60)]
    note = _soak.idle_note(summarize(idle))
    assert note.startswith("none of the 3 samples that read the gauges saw a request running or waiting") and "soak_sample_interval" in note
    assert _soak.idle_note(summarize([*idle, {"t": 90, "running": 1, "waiting": 0}])) is None
    assert _soak.idle_note(summarize([{"t": 0, "running": None, "metrics_error": "refused"}])) is None, "no gauge read, nothing to say"


def test_the_live_sampler_reads_the_gauges_memory_and_a_probe(vllm):
    host = Host(run_command=Machine().run_command, meminfo=lambda: MEMINFO)
    sampler = _soak.LiveSampler(endpoint(vllm.url), host, time.monotonic(), 5, 10, 5)
    sample = sampler()
    sampler.settle()
    assert sample["kv_cache_usage"] == 0.25 and sample["waiting"] == 3 and sample["running"] == 2
    assert sample["mem_available_mib"] == 12288 and sample["probe_error"] is None and 0 <= sample["probe_s"] < 5
    assert vllm.probes[0]["max_tokens"] == 5 and vllm.probes[0]["model"] == "tiny"


def test_a_slow_probe_does_not_delay_the_next_sample(vllm):
    vllm.probe_delay = 1.5
    host = Host(run_command=Machine().run_command, meminfo=lambda: MEMINFO)
    sampler = _soak.LiveSampler(endpoint(vllm.url), host, time.monotonic(), 5, 10, 5)
    started = time.monotonic()
    sample = sampler()
    assert time.monotonic() - started < 1.0 and sample["probe_s"] is None
    sampler.settle()
    assert sample["probe_s"] >= 1.5 and sample["probe_error"] is None


def test_an_unanswered_probe_and_unreadable_metrics_are_recorded():
    host = Host(run_command=Machine().run_command, meminfo=lambda: MEMINFO)
    sampler = _soak.LiveSampler(endpoint("http://127.0.0.1:9"), host, time.monotonic(), 2, 10, 5)
    sample = sampler()
    sampler.settle()
    assert sample["kv_cache_usage"] is None and "did not answer" in sample["metrics_error"]
    assert sample["probe_s"] is None and sample["probe_error"]


# --- the journals -----------------------------------------------------------------------------------------------

def test_earlyoom_banner_is_not_a_kill():
    kills = [
        'sending SIGTERM to process 4242 uid 0 "python3": oom_score 800, VmRSS 20480 MiB, cmdline "python3 -m vllm"',
        "escalating to SIGKILL after 0.5 seconds",
        'sending SIGKILL to process 4242 uid 0 "python3": badness 800, VmRSS 20480 MiB',
    ]
    assert earlyoom_kills(EARLYOOM_BANNER) == []
    assert earlyoom_kills([*EARLYOOM_BANNER, *kills]) == [kills[0], kills[2]]
    assert earlyoom_kills(['sending 0 (no-op signal) to process 4242 uid 0 "python3"']) == []


def test_kernel_oom_kills_and_nvrm_out_of_memory_are_counted():
    lines = [
        "Out of memory: Killed process 4242 (python3) total-vm:1000kB, anon-rss:900kB",
        "Memory cgroup out of memory: Killed process 4343 (vllm) total-vm:1000kB",
        "NVRM: GPU at PCI:0000:01:00: GPU-0123",
        "NVRM: nvAssertOkFailedNoLog: Assertion failed: NV_ERR_NO_MEMORY (0x00000051) returned from pRmApi->AllocWithHandle",
        "NV_ERR_NO_MEMORY without the driver's prefix is not the driver's line",
    ]
    found = kernel_findings(lines)
    assert found == {"oom_kills": lines[:2], "nvrm_no_memory": [lines[3]]}


def test_journals_of_units_not_installed_count_nothing_and_say_so(tmp_path):
    machine = Machine()
    machine.units = {"sparkfleet-vllm-llm.service"}
    counts_found, notes = _soak.journal_counts(job(tmp_path), Host(run_command=machine.run_command), 1_700_000_000.7)
    assert (counts_found["earlyoom_kills"], counts_found["watchdog_actions"], counts_found["journal_errors"]) == (0, 0, {})
    assert notes == ["earlyoom.service is not installed: no earlyoom kill to count",
                     "sparkfleet-watchdog.service is not installed: no watchdog action to count"]
    kernel = [c for c in machine.commands if c[0].endswith("journalctl")]
    assert kernel == [["/usr/bin/journalctl", "--dmesg", "--since", "@1700000000", "--output", "cat", "--quiet", "--no-pager"]]


# --- restarts ---------------------------------------------------------------------------------------------------

def state(restarts=0, invocation="1", container_id="a" * 64, started="2026-12-01T10:00:00Z", restart_count=0, running=True, missing=False):
    unit = {"unit": "sparkfleet-vllm-llm.service", "load_state": "loaded", "n_restarts": restarts, "invocation": invocation}
    box = ({"container": "vllm-llm", "missing": True, "error": "No such container: vllm-llm"} if missing else
           {"container": "vllm-llm", "id": container_id, "started_at": started, "restart_count": restart_count, "running": running})
    return {"units": [unit], "containers": [box]}


@pytest.mark.parametrize(("after", "expected"), [
    (state(), []),
    (state(restarts=1, invocation="2", container_id="b" * 64, started="2026-12-01T10:20:00Z"),
     ["unit sparkfleet-vllm-llm.service restarted on its own during the soak (NRestarts 0 -> 1)",
      "container vllm-llm was replaced during the soak (Id aaaaaaaaaaaa -> bbbbbbbbbbbb, started 2026-12-01T10:20:00Z)"]),
    (state(invocation="2", container_id="b" * 64),
     ["unit sparkfleet-vllm-llm.service was started again during the soak (a new invocation: a manual or watchdog restart)",
      "container vllm-llm was replaced during the soak (Id aaaaaaaaaaaa -> bbbbbbbbbbbb, started 2026-12-01T10:00:00Z)"]),
    (state(started="2026-12-01T10:30:00Z", restart_count=1),
     ["container vllm-llm restarted in place during the soak (RestartCount 0 -> 1, started 2026-12-01T10:30:00Z)"]),
    (state(running=False), ["container vllm-llm is not running after the soak"]),
    (state(missing=True), ["container vllm-llm is gone after the soak (No such container: vllm-llm)"]),
], ids=["unchanged", "crash-restarted-by-the-unit", "restarted-by-hand", "restarted-in-place", "stopped", "removed"])
def test_restart_detection(after, expected):
    assert restart_changes(state(), after) == expected


def test_the_states_are_read_from_systemctl_and_docker_inspect():
    machine = Machine()
    assert unit_state(machine.run_command, "/usr/bin/systemctl", "sparkfleet-vllm-llm.service") == {
        "unit": "sparkfleet-vllm-llm.service", "load_state": "loaded", "active_state": "active", "n_restarts": 0, "invocation": "1" * 32}
    assert container_state(machine.run_command, "/usr/bin/docker", "vllm-llm") == {
        "container": "vllm-llm", "id": "a" * 64, "started_at": "2026-12-01T10:00:00Z", "restart_count": 0, "running": True}
    assert container_summary("vllm-llm", None)["missing"] is True
    assert container_summary("vllm-llm", {"Name": "/vllm-llm", "State": "running"})["missing"] is True


# --- the gate: every reason ---------------------------------------------------------------------------------------

def thresholds(**changed):
    return {"max_kv_cache_usage": 0.8, "max_gap": 90, "max_probe_failures": 0, "min_mem_available_mib": 0, **changed}


def passing_summary():
    return {"samples": 120, "max_kv_cache_usage": 0.41, "max_waiting": 14, "min_mem_available_mib": 12000.0, "max_gap_s": 31.0,
            "max_gap_at_s": 600, "probe_median_s": 0.2, "probe_max_s": 1.1, "probe_failures": 0, "metrics_failures": 0}


def counts(**changed):
    return {"rounds": 25, "unfinished_rounds": 0, "unaccounted_rounds": 0, "completed_requests": 1200, "failed_requests": 0, "oom_kills": 0,
            "earlyoom_kills": 0,
            "nvrm_no_memory": 0, "watchdog_actions": 0, "journal_errors": {},
            "evidence": {"oom_kills": [], "earlyoom_kills": [], "nvrm_no_memory": [], "watchdog_actions": []}, **changed}


def evidence(**lines):
    return {"oom_kills": [], "earlyoom_kills": [], "nvrm_no_memory": [], "watchdog_actions": [], **lines}


UNACCOUNTED = {"round": 3, "stalled": False, "completed": 17, "failed": 0, "unaccounted": True,
               "problems": ["round 3: 20 prompts sent, 17 completed, 0 failed: 3 unaccounted for"]}
STALLED = {"round": 25, "stalled": True, "completed": None, "failed": None, "problems": ["round 25 was still running after 300 s and was killed"]}

FAILURES = {
    "failed-requests": ({}, {"failed_requests": 3}, [], [], {},
                        "3 request(s) failed across 25 round(s) of vllm bench serve"),
    "unfinished-round": ({}, {"unfinished_rounds": 1}, [], [STALLED], {},
                         "1 of 25 round(s) did not finish: round 25 was still running after 300 s and was killed"),
    "unaccounted-round": ({}, {"unaccounted_rounds": 1}, [], [UNACCOUNTED], {},
                          "1 of 25 round(s) did not account for every request: round 3: 20 prompts sent, 17 completed, 0 failed: 3 unaccounted for"),
    "no-round": ({}, {"rounds": 0, "completed_requests": 0}, [], [], {}, "no round of vllm bench serve ran"),
    "kv-at-the-gate": ({"max_kv_cache_usage": 0.8}, {}, [], [], {}, "KV cache usage reached 80.0% (gate: below 80%)"),
    "kv-unknown": ({"max_kv_cache_usage": None}, {}, [], [], {},
                   "no sample read vllm:kv_cache_usage_perc from /metrics, so the KV cache is not known to stay under the gate"),
    "gap": ({"max_gap_s": 95.5}, {}, [], [], {},
            "the largest gap between samples was 95.5 s, 600 s into the soak (gate: at most 90 s): the host stalled"),
    "memory-floor": ({"min_mem_available_mib": 900.0}, {}, [], [], {"min_mem_available_mib": 1024},
                     "MemAvailable fell to 900 MiB (gate: at least 1024 MiB)"),
    "memory-unknown": ({"min_mem_available_mib": None}, {}, [], [], {}, "no sample read MemAvailable from /proc/meminfo"),
    "probes": ({"probe_failures": 2, "first_probe_error": "HTTP 401: unauthorized"}, {}, [], [], {},
               "2 of 120 probe(s) failed (each waits at most 30 s; the first: HTTP 401: unauthorized) (gate: at most 0)"),
    "kernel-oom": ({}, {"oom_kills": 1, "evidence": evidence(oom_kills=["Out of memory: Killed process 4242 (python3)"])}, [], [], {},
                   '1 kernel OOM kill(s) ("Killed process" in the kernel journal): Out of memory: Killed process 4242 (python3)'),
    "earlyoom": ({}, {"earlyoom_kills": 1, "evidence": evidence(earlyoom_kills=["sending SIGTERM to process 4242 uid 0"])}, [], [], {},
                 "1 earlyoom kill(s): sending SIGTERM to process 4242 uid 0"),
    "nvrm": ({}, {"nvrm_no_memory": 1, "evidence": evidence(nvrm_no_memory=["NVRM: NV_ERR_NO_MEMORY"])}, [], [], {},
             "1 NVIDIA driver memory error(s) (NVRM NV_ERR_NO_MEMORY): NVRM: NV_ERR_NO_MEMORY"),
    "restart": ({}, {}, ["unit sparkfleet-vllm-llm.service restarted on its own during the soak (NRestarts 0 -> 1)"], [], {},
                "unit sparkfleet-vllm-llm.service restarted on its own during the soak (NRestarts 0 -> 1)"),
    "watchdog": ({}, {"watchdog_actions": 1, "evidence": evidence(watchdog_actions=[
        {"action": "restart", "unit": "sparkfleet-vllm-llm.service", "why": "no forward progress"}])}, [], [], {},
        "the watchdog acted 1 time(s): restart sparkfleet-vllm-llm.service (no forward progress)"),
    "journal-unreadable": ({}, {"journal_errors": {"kernel": "Failed to open journal"}}, [], [], {},
                           "the kernel journal could not be read (Failed to open journal), so what it would count is unknown"),
}


def test_a_quiet_soak_passes():
    assert verdict(passing_summary(), counts(), [], [], thresholds(), 30) == (True, [])


@pytest.mark.parametrize(("summary_change", "counts_change", "changes", "rounds", "threshold_change", "reason"), FAILURES.values(),
                         ids=FAILURES.keys())
def test_each_fail_reason(summary_change, counts_change, changes, rounds, threshold_change, reason):
    passed, reasons = verdict(passing_summary() | summary_change, counts(**counts_change), changes, rounds, thresholds(**threshold_change), 30)
    assert (passed, reasons) == (False, [reason])


def test_every_reason_is_given_at_once():
    passed, reasons = verdict(passing_summary() | {"max_kv_cache_usage": 0.9, "max_gap_s": 200.0}, counts(failed_requests=2, oom_kills=1),
                              ["container vllm-llm is not running after the soak"], [], thresholds(), 30)
    assert not passed and len(reasons) == 5


def test_the_gap_gate_defaults_to_three_intervals():
    assert _soak.thresholds_of(dict(OPTIONS, sample_interval=30))["max_gap"] == 90
    assert _soak.thresholds_of(dict(OPTIONS, sample_interval=5, max_gap=40.0))["max_gap"] == 40.0


# --- options ------------------------------------------------------------------------------------------------------

TOOLS = {"docker": "/usr/bin/docker", "systemctl": "/usr/bin/systemctl", "journalctl": "/usr/bin/journalctl", "vllm": "/usr/bin/vllm"}


@pytest.mark.parametrize(("change", "fragment"), [
    ({"instance": None}, "instance: the soak watches the instance's unit and container"),
    ({"concurrency": 0}, "concurrency: 0 is out of range"),
    ({"duration": 5}, "duration: 5 is out of range"),
    ({"probe_timeout": 1}, "probe_timeout: 1 is out of range; give a whole number from 10 to 600 seconds (under 10 s a saturated engine"),
    ({"probe_max_tokens": 64}, "probe_max_tokens: 64 is out of range"),
    ({"max_kv_cache_usage": 0}, "max_kv_cache_usage: 0 is out of range"),
    ({"max_gap": 30.0}, "max_gap: 30.0 must exceed sample_interval (30)"),
    ({"label": "../x"}, "label: '../x' must be a plain name"),
    ({"watch_units": ["--all"]}, "watch_units: ['--all'] must be a list of unit or container names"),
    ({"journalctl": None}, "journalctl: the soak counts OOM kills, earlyoom kills, NVRM errors and watchdog actions with journalctl"),
    ({"runner": "local", "vllm": None}, "runner: local needs the vllm command"),
])
def test_bad_options_are_refused_naming_the_option(change, fragment):
    errors = validate(dict(OPTIONS, **TOOLS) | change)
    assert any(fragment in error for error in errors), errors


def test_good_options_pass():
    assert validate(dict(OPTIONS, **TOOLS)) == []


# --- the whole soak -----------------------------------------------------------------------------------------------

def plan_files(tmp_path, url):
    config = tmp_path / "config"
    config.mkdir()
    write_plan(config, unit_plan(url=url, health_timeout=600))
    (config / "llm.env").write_text(f"VLLM_API_KEY={KEY}\n")
    return str(config)


def which(name):
    return TOOLS.get(name)


def quick_rounds(machine, event=None):
    """Rounds of 0.1 s that save a result; ``event`` happens to the machine during each."""
    def run_round(argv, env, seconds):
        time.sleep(0.1)
        if event:
            event(machine)
        write_result(argv, completed=6)
        return Finished(0, "", False, 0.1)

    return run_round


def test_a_quiet_soak_passes_end_to_end(tmp_path, vllm, soak_for):
    machine = Machine()
    machine.earlyoom = EARLYOOM_BANNER
    host = Host(run_command=machine.run_command, run_round=quick_rounds(machine), meminfo=lambda: MEMINFO)
    params = dict(OPTIONS, config_dir=plan_files(tmp_path, vllm.url), results_dir=str(tmp_path / "results"), sample_interval=1,
                  max_gap=5.0)
    outcome = soak_for(params, machine, host, duration=0.6)
    assert outcome.msg is None, outcome.msg
    result = outcome.result
    assert result["passed"] is True and result["reasons"] == [] and result["notes"] == []
    assert result["counts"]["rounds"] >= 3 and result["counts"]["failed_requests"] == 0 and result["counts"]["earlyoom_kills"] == 0
    assert result["summary"]["max_kv_cache_usage"] == 0.25 and result["summary"]["probe_failures"] == 0
    assert len(result["samples"]) >= 2 and KEY not in json.dumps(result)
    saved = json.loads((tmp_path / "results" / "soak" / "soak.json").read_text())
    assert saved["passed"] is True and "started" not in saved and "finished" not in saved


def test_a_container_killed_during_the_soak_fails_it(tmp_path, vllm, soak_for):
    def killed(machine):
        machine.restarts, machine.invocation = 1, "2" * 32
        machine.inspect[0]["Id"] = "b" * 64

    machine = Machine()
    host = Host(run_command=machine.run_command, run_round=quick_rounds(machine, killed), meminfo=lambda: MEMINFO)
    params = dict(OPTIONS, config_dir=plan_files(tmp_path, vllm.url), results_dir=str(tmp_path / "results"), sample_interval=1,
                  max_gap=5.0)
    outcome = soak_for(params, machine, host, duration=0.4)
    assert outcome.msg.startswith("SOAK FAIL: unit sparkfleet-vllm-llm.service restarted on its own during the soak (NRestarts 0 -> 1); "
                                  "container vllm-llm was replaced during the soak (Id aaaaaaaaaaaa -> bbbbbbbbbbbb")
    assert outcome.result["passed"] is False
    quiet = soak_for(dict(params, fail_on_verdict=False, label="again"), machine, host, duration=0.3)
    assert quiet.msg is None and quiet.result["passed"] is True, "the state before is read again at each soak's start"


@pytest.fixture
def soak_for(monkeypatch):
    """soak() with a duration under the option's floor of 10 s, which a test cannot wait for."""
    original = _soak.run_soak

    def run(params, machine, host, duration):
        monkeypatch.setattr(_soak, "run_soak", lambda job, host, before: original(
            dataclasses.replace(job, params=dict(job.params, duration=duration)), host, before))
        return soak(params, machine.run_command, which, False, host)

    return run


def test_check_mode_sends_nothing_and_says_what_it_would_do(tmp_path, vllm):
    machine = Machine()
    params = dict(OPTIONS, config_dir=plan_files(tmp_path, vllm.url), results_dir=str(tmp_path / "results"))
    outcome = soak(params, machine.run_command, which, True, Host(run_command=machine.run_command, run_round=None))
    assert outcome.msg is None and outcome.result["passed"] is None and outcome.result["changed"] is True
    assert outcome.result["notes"] == ["check mode: would run vllm bench serve (runner local) against sparkfleet-vllm-llm.service at "
                                       "concurrency 2, 6 prompts of 64 tokens in and 16 out in the first round (later rounds grow until their load fills 90% "
                                       "of a round), for 100 s, sampling every 30 s; "
                                       "nothing was sent"]
    assert vllm.probes == [] and not (tmp_path / "results").exists()
    assert {os.path.basename(c[0]) for c in machine.commands} == {"systemctl", "docker"}


def test_a_stopped_instance_is_refused_before_any_load(tmp_path, vllm):
    machine = Machine()
    machine.inspect[0]["State"]["Running"] = False
    params = dict(OPTIONS, config_dir=plan_files(tmp_path, vllm.url), results_dir=str(tmp_path / "results"))
    outcome = soak(params, machine.run_command, which, False, Host(run_command=machine.run_command, run_round=None))
    assert outcome.msg == "vllm_soak refused: container vllm-llm is not running; a soak measures a serving instance"
    assert vllm.probes == []


def test_an_instance_never_deployed_is_refused(tmp_path):
    outcome = soak(dict(OPTIONS, config_dir=str(tmp_path)), Machine().run_command, which, False)
    assert outcome.msg.startswith("vllm_soak refused: instance llm: ") and "does not exist" in outcome.msg


def test_the_module_refuses_without_a_traceback(tmp_path):
    payload = {"ANSIBLE_MODULE_ARGS": {"label": "soak", "config_dir": str(tmp_path)}}
    env = {**os.environ, "PYTHONPATH": str(MODULES.parents[4])}
    done = subprocess.run([sys.executable, str(MODULES / "vllm_soak.py")], input=json.dumps(payload), capture_output=True, text=True,
                          env=env, check=False, timeout=60)
    assert "Traceback" not in done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["failed"] is True and result["msg"].startswith("vllm_soak refused: instance: the soak watches")


# --- the report ---------------------------------------------------------------------------------------------------

def soak_result(passed=True, reasons=()):
    samples = [{"t": t, "time": 1_700_000_000 + t, "kv_cache_usage": 0.1 * i, "waiting": i, "running": 2, "mem_available_mib": 9000 - i,
                "probe_s": None if i == 2 else 0.2, "probe_error": "HTTP 503: " if i == 2 else None} for i, t in enumerate((0, 30, 60, 90))]
    return {"changed": True, "ok": True, "passed": passed, "reasons": list(reasons), "notes": ["earlyoom.service is not installed: no "
            "earlyoom kill to count"], "label": "c8", "instance": "llm", "unit": "sparkfleet-vllm-llm.service", "model": "tiny",
            "runner": "exec", "concurrency": 8, "prompts_per_round": 48, "input_tokens": 4096, "output_tokens": 256, "duration": 90,
            "sample_interval": 30, "thresholds": thresholds(), "summary": summarize(samples),
            "counts": counts(failed_requests=0 if passed else 2),
            "restarts": {"changes": [] if passed else ["container vllm-llm was replaced"], "count": 0 if passed else 1},
            "rounds": [{"round": 1, "t": 0, "completed": 46, "failed": 2, "problems": ["round 1: 2 | 48 requests failed"]}] if not passed else [],
            "samples": samples, "ansible_job_id": "j1", "started": 1, "finished": 1}


def test_the_report_of_a_pass():
    markdown = markdown_report("spark-1 llm: soak c8", soak_result())
    assert markdown.startswith("# spark-1 llm: soak c8\n\n**SOAK PASS**\n\nNotes:\n\n- earlyoom.service is not installed")
    assert "Reasons:" not in markdown
    assert "| max KV cache usage | 30.0% | below 80% |" in markdown
    assert "| largest gap between samples | 30.0 s | at most 90 s |" in markdown
    assert "| probes unanswered | 1 of 4 | at most 0 |" in markdown
    assert "| min MemAvailable | 8,997 MiB | at least 0 MiB |" in markdown
    assert "concurrency 8, 48 prompts a round of 4096 tokens in" in markdown


def test_the_report_says_how_far_the_rounds_grew():
    grown = dict(soak_result(), rounds=[{"round": 1, "t": 0, "completed": 48, "failed": 0, "prompts": 48, "problems": []},
                                        {"round": 2, "t": 60, "completed": 400, "failed": 0, "prompts": 400, "problems": []}])
    assert ("concurrency 8, 48 prompts a round (later rounds up to 400, grown until their load fills most of a round) of 4096 tokens in"
            in markdown_report("t", grown))


def test_the_report_of_a_fail_gives_every_reason():
    reasons = ["2 request(s) failed across 1 round(s) of vllm bench serve", "container vllm-llm was replaced"]
    markdown = markdown_report("t", soak_result(False, reasons))
    assert "**SOAK FAIL**\n\nReasons:\n\n- 2 request(s) failed across 1 round(s) of vllm bench serve\n- container vllm-llm was replaced\n" in markdown
    assert "| 1 | 0 | 46 / 2 | round 1: 2 / 48 requests failed |" in markdown
    assert "| restarts | 1 | 0 |" in markdown


def test_the_report_keeps_the_soak_without_ansibles_keys():
    data = _soak.report_data("t", soak_result())
    assert data["title"] == "t" and data["passed"] is True and len(data["samples"]) == 4
    assert not {"ansible_job_id", "started", "finished", "changed"} & set(data)


@pytest.mark.parametrize(("result", "fragment"), [
    ({"changed": False, "ok": True, "passed": None, "reasons": []}, "the soak ran in check mode"),
    ({"ok": False, "passed": False, "reasons": ["refused"], "samples": [], "rounds": []}, "soak: no thresholds, summary, counts"),
    (soak_result() | {"passed": "yes"}, "soak.passed: 'yes' is not true or false"),
    (soak_result() | {"samples": [{"kv": 1}]}, "soak.samples: not a list of samples"),
])
def test_report_problems(result, fragment):
    assert any(fragment in problem for problem in report_problems(result)), report_problems(result)
    assert report_problems(soak_result()) == []


def test_the_plot_is_a_png():
    pytest.importorskip("matplotlib")
    from ansible_collections.sparkfleet.vllm.plugins.modules import vllm_soak_report

    png = vllm_soak_report.plot_png(vllm_soak_report.load_pyplot(), "t", soak_result(False, ["x"]))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_sampler_thread_runs_beside_the_rounds(tmp_path, vllm):
    """run_soak's own thread: samples keep coming while a round runs, and stop when the rounds end. The round waits for
    the sampler's third reading rather than for a time, so a busy machine changes nothing here (the gap gate has tests of
    its own with given times)."""
    machine = Machine()
    readers, seen = [], []

    def meminfo():
        readers.append(threading.current_thread())
        return MEMINFO

    def run_round(argv, env, seconds):
        deadline = time.monotonic() + 60
        while len(readers) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(len(readers))
        write_result(argv, completed=6)
        return Finished(0, "", False, 0.35)

    host = Host(run_command=machine.run_command, run_round=run_round, meminfo=meminfo)
    # A duration shorter than the first round: that round ends past it, whenever the readings come, so there is one round.
    soak_job = job(tmp_path, vllm.url, duration=0.01, sample_interval=0.1, max_gap=1.0)
    result = run_soak(soak_job, host, state(invocation="1" * 32))
    assert len(result["rounds"]) == 1 and seen[0] >= 3, "the sampler read while the round ran"
    assert threading.current_thread() not in readers, "the readings came from the sampler's own thread"
    assert len(result["samples"]) >= 3 and not any(reader.is_alive() for reader in readers), "the sampler stopped with the rounds"
