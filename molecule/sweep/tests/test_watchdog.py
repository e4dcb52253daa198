"""The watchdog on the sweep's serving host, after the sweep (the files' order), with faults injected
for real against the CPU vLLM: a unit stopped under a fresh and then a stale maintenance flag,
an engine core frozen with SIGSTOP while a request is in flight, and a unit down past the restart
budget (the give-up file, a diagnostics bundle without a key, quiet until a planned relaunch hands
it back). Short intervals through the role's variables; each detection time is printed for the
closing note. Every process a test starts is stopped by its recorded id."""

import json
import shlex
import time

import pytest
from serving_lab import KEY, engine_processes, status
from site_runner import bundle_leaks, deployed_secrets, docker_host, playbook, site
from watchdog_journal import admissions, journal_decisions, now, wait_for

SERVE = "sparkfleet-molecule-sweep"
UNIT = "sparkfleet-vllm-second.service"
CONTAINER = "vllm-second"
FLAG = "/run/sparkfleet/vllm-maintenance"
GIVE_UP = f"/var/lib/sparkfleet/watchdog/{UNIT}.person-needed.json"
# The engine core in a process of its own (vLLM's V1 multiprocessing), so it can be frozen alone; bound to the lab
# host's own address too and drafting with n-grams, so the reboot test checks a LAN port and speculative counters.
INSTANCE = {"name": "second", "model": "/models/tiny-llama-variant", "served_model_names": ["tiny-second"], "port": 8002, "api_key": KEY,
            "speculative": {"method": "ngram", "num_speculative_tokens": 3, "options": {"prompt_lookup_max": 3}},
            "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}}
WATCHDOG = {"watchdog_interval": 5, "watchdog_failures": 3, "watchdog_probe_timeout": 10, "watchdog_budget": 2,
            "watchdog_budget_window": 3600, "watchdog_warm_grace": 300, "watchdog_maintenance_max_age": 60, "watchdog_bundle_time_limit": 20}
# The faults stop the unit through systemd, a planned stop that it does not restart: a container stopped under it would
# be restarted by systemd itself (Restart=always) before the watchdog sees it down. The suite once timed out waiting for
# the give-up that way.
STOP = f"systemctl stop {UNIT}"
# A CPU engine starting beside the other lanes took up to 415 s to pass its gate.
SERVE_TIMEOUT = 600


@pytest.fixture(scope="module")
def host():
    return docker_host(SERVE)


@pytest.fixture(scope="module")
def instances(host):
    address = host.check_output("hostname -I").split()[0]
    return {"vllm_instances": [{**INSTANCE, "bind_addresses": ["127.0.0.1", address]}]}


@pytest.fixture(scope="module")
def watched(host, instances):
    # A LAN bind needs wait_online, so Docker starts once the address exists (seed 000's LAN-bind race).
    result = site("--tags", "wait_online,vllm,watchdog", "-e", json.dumps(instances), "-e", json.dumps(WATCHDOG), limit=SERVE)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert host.service("sparkfleet-watchdog.service").is_running
    wait_for(lambda: decisions(host, verdict="answers"), 120, "the watchdog judging the relaunched unit")
    return host


def decisions(host, since=0.0, **match):
    return journal_decisions(host, UNIT, since, **match)


def settled(host):
    """The unit active with no job queued (systemd done stopping the old container and starting the new) and serving."""
    return (host.run(f"systemctl is-active {UNIT}").stdout.strip() == "active" and UNIT not in host.run("systemctl list-jobs --no-legend").stdout
            and status(host, 8002, key=KEY) == "200")


def serving(host, since):
    """The instance serves again and the watchdog's latest decision says so (its grace over), ready for the next fault."""
    wait_for(lambda: settled(host), SERVE_TIMEOUT, "the instance to serve again")
    print(f"watchdog: the instance served again {now(host) - since:.1f} s after the fault")
    wait_for(lambda: (found := decisions(host, since)) and found[-1]["verdict"] in ("answers", "progress"), 120, "the watchdog to see it serve")


def test_a_stopped_unit_waits_out_a_fresh_flag_and_is_started_once_the_flag_is_stale(watched):
    host = watched
    # Decisions from before the flag: the watchdog logs a verdict once, and a sample between the flag and the stop (the
    # container still running) already says maintenance.
    stopped = now(host)
    host.check_output(f"mkdir -p /run/sparkfleet && echo second > {FLAG}")
    try:
        host.check_output(STOP)
        wait_for(lambda: decisions(host, stopped, verdict="maintenance"), 60, "the watchdog to see the flag", explain=lambda: decisions(host, stopped))
        time.sleep(25)
        assert not decisions(host, stopped, action="start"), "a fresh maintenance flag keeps the watchdog off the unit"
        assert host.run(f"docker inspect --format '{{{{.State.Status}}}}' {CONTAINER}").stdout.strip() in ("exited", "")
        aged = now(host)
        host.check_output(f"touch -d '-5 minutes' {FLAG}")
        start = wait_for(lambda: decisions(host, aged, action="start"), 120, "the watchdog to start the unit", explain=lambda: decisions(host, aged))[0]
    finally:
        host.run(f"rm -f {FLAG}")
    assert "a maintenance flag" in start["why"] and "was ignored" in start["why"] and "failing sample 3 of 3" in start["why"]
    print(f"\nwatchdog: stopped container started {start['time'] - aged:.1f} s after the flag went stale: {start['why']}")
    serving(host, aged)


def engine_core_pid(host):
    """The engine core's process on the lab host (vLLM titles it VLLM::EngineCore)."""
    found = [pid for pid, _rss, args in engine_processes(host, CONTAINER) if "VLLM::EngineCore" in args]
    assert len(found) == 1, engine_processes(host, CONTAINER)
    return found[0]


def test_an_engine_core_frozen_with_a_request_in_flight_is_restarted(watched):
    host = watched
    engine = engine_core_pid(host)
    request = ("curl -s -m 300 -o /dev/null http://127.0.0.1:8002/v1/completions -H 'Content-Type: application/json' "
               f"-H 'Authorization: Bearer {KEY}' -d '{{\"model\": \"tiny-second\", \"prompt\": \"one two\", \"max_tokens\": 200}}'")
    frozen = now(host)
    host.check_output(f"kill -STOP {engine}")
    client = None
    try:
        client = int(host.check_output("sh -c " + shlex.quote(f"{request} >/dev/null 2>&1 & echo $!")))
        assert status(host, 8002, "/health") == "200", "a frozen engine core still answers /health: liveness alone would miss it"
        restart = wait_for(lambda: decisions(host, frozen, action="restart"), 180, "the watchdog to restart the wedged unit")[0]
    finally:
        host.run(f"kill -CONT {engine} 2>/dev/null" + (f"; kill {client} 2>/dev/null" if client else ""))
    assert restart["verdict"] == "wedged" and "probe got no answer in 10 s while the container runs" in restart["why"]
    # Its stacks were read before the kill, the frozen engine core's among them, and kept for the bundles.
    stacks = host.file(restart["stacks"])
    assert restart["stacks"].startswith("/var/lib/sparkfleet/watchdog/stacks/") and stacks.mode == 0o600, restart
    assert f"py-spy dump --nonblocking --pid {engine}" in stacks.content_string
    assert "EngineCoreProc.run_busy_loop" in stacks.content_string and KEY not in stacks.content_string
    print(f"\nwatchdog: frozen engine core restarted {restart['time'] - frozen:.1f} s after SIGSTOP: {restart['why']}")
    serving(host, frozen)
    assert engine_core_pid(host) != engine
    assert admissions(host, UNIT, frozen), "the watchdog's restart passed the unit's own door (the host runtime's admission)"


def test_past_the_budget_it_gives_up_with_a_bundle_and_a_planned_relaunch_hands_the_unit_back(watched, instances):
    host = watched
    stopped = now(host)
    host.check_output(STOP)
    give_up = wait_for(lambda: decisions(host, stopped, action="give_up"), 120, "the watchdog to give up", explain=lambda: decisions(host, stopped))[0]
    assert "2 restarts in the last 3600 s used the budget of 2: a person is needed" in give_up["why"]
    print(f"\nwatchdog: gave up {give_up['time'] - stopped:.1f} s after the third fault: {give_up['why']}")
    record = json.loads(host.file(GIVE_UP).content_string)
    # The first failing sample may catch the container while docker stops it: running, the server no longer answering.
    verdicts = [sample["verdict"] for sample in record["evidence"]]
    assert len(verdicts) == 3 and verdicts[-1] == "down" and set(verdicts) <= {"down", "unanswered"}, verdicts
    bundle = record["bundle"]
    assert bundle.startswith("/var/lib/sparkfleet/watchdog/bundles/") and host.file(bundle).mode == 0o600, record
    members = host.check_output(f"tar -tzf {bundle}")
    assert "MANIFEST.json" in members and "plans/" in members
    assert host.run(f"tar -xzOf {bundle} | grep -c -F -e '{KEY}'").stdout.strip() == "0", "no key in the bundle"
    time.sleep(20)
    assert not decisions(host, give_up["time"] + 0.1, action="start"), "quiet once it gave up"
    relaunch = site("--tags", "wait_online,vllm", "-e", json.dumps(instances), limit=SERVE)
    assert relaunch.returncode == 0, (relaunch.stdout + relaunch.stderr)[-3000:]
    assert not host.file(GIVE_UP).exists, "a planned relaunch hands the unit back"
    wait_for(lambda: decisions(host, give_up["time"] + 0.1, verdict="handed_back"), 60, "the watchdog to take the unit back")
    # Judged serving once a probe answers within its 10 s; on two cores busy with the other lanes a probe can take longer,
    # and the unit stays in its warm grace meanwhile (seen in a suite run): the wait is the grace's, not a probe's.
    wait_for(lambda: [line for line in decisions(host, give_up["time"] + 0.1) if line["verdict"] in ("answers", "progress")],
             WATCHDOG["watchdog_warm_grace"] + 60, "the watchdog to judge it serving")


def test_the_diagnose_playbook_brings_the_bundles_without_a_key_to_the_controller(watched, tmp_path):
    result = playbook("diagnose.yml", "-e", json.dumps({"diagnose_dir": str(tmp_path)}), limit=SERVE)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    bundles = list(tmp_path.rglob("*.tar.gz"))
    # Its own, and the one the watchdog made when it gave up (the test before).
    assert len(bundles) == 2 and len(list(tmp_path.rglob("watchdog/*.tar.gz"))) == 1, result.stdout[-2000:]
    secrets = deployed_secrets(watched)
    assert KEY in secrets.values(), "the instance's key is among the values read from the host's env files"
    for bundle in bundles:
        members, leaks = bundle_leaks(bundle, secrets)
        assert any(name.endswith("/MANIFEST.json") for name in members) and any("/plans/" in name for name in members), sorted(members)
        # Both take the stacks the watchdog read from the frozen engine (the test before the last); the playbook's own bundle
        # also reads the serving engine's now (the give-up bundle's engine was stopped: it has none to read).
        assert any("/watchdog-stacks/" in name and b"EngineCoreProc.run_busy_loop" in data for name, data in members.items()), sorted(members)
        if bundle.parent.name != "watchdog":
            stacks = [data.decode() for name, data in members.items() if "/stacks/" in name and "/watchdog-stacks/" not in name]
            assert any("py-spy dump --nonblocking --pid" in text and "EngineCoreProc" in text for text in stacks), sorted(members)
        assert not leaks, f"{bundle.name}: keys found in {leaks}"


def test_the_reboot_test_passes_after_the_lab_host_restarts(watched, tmp_path):
    """The lab host's systemctl reboot ends its systemd and Docker starts it again (restart_policy always): the
    kernel and its boot id stay, PID 1 is new, /run is empty, and everything must come back by itself."""
    host = watched
    install = site("--tags", "earlyoom", limit=SERVE)
    assert install.returncode == 0, (install.stdout + install.stderr)[-3000:]
    first_pid1 = host.check_output("cut -d ' ' -f 22 /proc/1/stat")
    before_reboot = now(host)
    started = time.monotonic()
    result = playbook("reboot_test.yml", "-e", json.dumps({"reboot_test_report_dir": str(tmp_path), "reboot_test_serve_within": SERVE_TIMEOUT}),
                      limit=SERVE)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert f"REBOOT TEST PASS on {SERVE}" in result.stdout
    assert host.check_output("cut -d ' ' -f 22 /proc/1/stat") != first_pid1
    assert admissions(host, UNIT, before_reboot), "the boot's start passed the unit's own door (the host runtime's admission)"
    report = json.loads((tmp_path / SERVE / "report.json").read_text())
    checks = {row["check"]: row for row in report["checks"]}
    assert all(row["passed"] for row in checks.values()) and report["reasons"] == []
    assert "answered 200" in checks["lan_port"]["detail"] and "draft tokens" in checks["speculative"]["detail"]
    assert "earlyoom.service active" in checks["services"]["detail"] and "sparkfleet-watchdog.service active" in checks["services"]["detail"]
    markdown = (tmp_path / SERVE / "report.md").read_text()
    assert KEY not in markdown and KEY not in result.stdout + result.stderr
    print(f"\nreboot_test.yml on the lab host, {elapsed:.0f} s in all, back after {report['reboot_seconds']:.0f} s:\n{markdown}")


def test_the_watchdog_is_removed_with_its_files(watched):
    host = watched
    result = site("--tags", "watchdog", "-e", json.dumps({**WATCHDOG, "watchdog_state": "absent"}), limit=SERVE)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert not host.file("/etc/systemd/system/sparkfleet-watchdog.service").exists
    assert not host.file("/var/lib/sparkfleet/watchdog").exists and not host.file("/usr/local/libexec/sparkfleet/sparkfleet_watchdog.py").exists
    assert host.file("/usr/local/libexec/sparkfleet/sparkfleet_runtime.py").exists, "the serving units' runtime stays"
    assert host.run("systemctl is-active sparkfleet-watchdog.service").stdout.strip() != "active"
