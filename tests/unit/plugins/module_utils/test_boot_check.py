"""The reboot test's checks: each judged from what a host shows after a boot.

The /proc files and systemd's answers are recorded shapes given as text; the endpoints are a real HTTP
server on this machine answering as vLLM's routes do (a stand-in: the lab's test runs the real vLLM)."""

import contextlib
import http.server
import json
import socket
import threading

import pytest
from plan_files import unit_plan

from ansible_collections.sparkfleet.vllm.plugins.module_utils import _boot_check
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import FIX

KEY = "boot-check-test-key"
PROC_STAT = "cpu  1 2 3\nbtime 1764000000\nprocesses 42\n"
# systemd's comm may hold spaces in general: the fields are counted after the closing parenthesis.
PID1_STAT = "1 (systemd init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 12345 100 200\n"
SWAPS_NONE = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
OPTIONS = {"serve_within": 60, "expect_active": ["earlyoom.service"], "exporter_units": ["prometheus-node-exporter.service"],
           "exporter_urls": [], "timeout": 5}


class VllmRoutes(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body, kind="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.reply(401, '{"error": "Unauthorized"}')
            return False
        return True

    def do_GET(self):
        if self.path == "/metrics":
            self.reply(200, f"vllm:spec_decode_num_draft_tokens_total{{engine=\"0\"}} {self.server.drafts}\n", "text/plain")
        elif self.path == "/v1/models" and self.authorized():
            self.reply(200, json.dumps({"data": [{"id": "tiny"}]}))
        elif self.path == "/metrics-exporter":
            self.reply(200, "node_boot_time_seconds 1\n", "text/plain")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.authorized():
            self.server.drafts += self.server.drafts_per_request
            self.reply(200, json.dumps({"choices": [{"message": {"content": "hello"}}]}))


@contextlib.contextmanager
def vllm_routes(address="127.0.0.1", drafts_per_request=3):
    server = http.server.ThreadingHTTPServer((address, 0), VllmRoutes)
    server.daemon_threads = True
    server.drafts, server.drafts_per_request = 0, drafts_per_request
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def plan(config_dir, name, port, start_after=(), speculative=None, bind=("127.0.0.1",)):
    """The plan file the vllm role writes for instance ``name`` (plan_files.unit_plan), served at ``port`` here."""
    built = unit_plan(name)
    return {**built, "url": f"http://127.0.0.1:{port}", "env_path": f"{config_dir}/{name}.env", "port": port, "bind_addresses": list(bind),
            "start_after": list(start_after), "launch_check": {**built["launch_check"], "speculative_method": speculative}}


def write_plans(folder, *plans):
    for each in plans:
        (folder / f"{each['name']}.json").write_text(json.dumps(each))
        (folder / f"{each['name']}.env").write_text(f"VLLM_API_KEY={KEY}\n")


def show_block(began, active_since, restarts=0, state="active", load="loaded"):
    return (f"LoadState={load}\nActiveState={state}\nNRestarts={restarts}\nInactiveExitTimestampMonotonic={began}\n"
            f"ActiveEnterTimestampMonotonic={active_since}\n")


class Systemd:
    """systemctl and journalctl as they answer after a boot: recorded shapes, keyed by what is asked."""

    def __init__(self, times, states=None, failed="", kernel="", watchdog=""):
        self.times, self.states, self.failed, self.kernel, self.watchdog = times, states or {}, failed, kernel, watchdog
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[:2] == ["systemctl", "list-units"]:
            return 0, self.failed, ""
        if argv[0] == "journalctl":
            return 0, self.kernel if "--dmesg" in argv else self.watchdog, ""
        units = argv[argv.index("--") + 1:]
        blocks = []
        for unit in units:
            load, active = self.states.get(unit, ("loaded", "active"))
            blocks.append(self.times.get(unit) or show_block(1, 2, state=active, load=load))
        return 0, "\n".join(blocks), ""


def host_of(systemd, files=None):
    files = {"/proc/stat": PROC_STAT, "/proc/1/stat": PID1_STAT, "/proc/swaps": SWAPS_NONE, **(files or {})}

    def read(path):
        if path in files and files[path] is None:
            raise PermissionError(13, "Permission denied", path)
        if path in files:
            return files[path]
        with open(path, encoding="utf-8") as handle:
            return handle.read()

    return _boot_check.Host(run_command=systemd, read_text=read, wall=lambda: 1764000200.0, ticks_per_second=100)


def test_the_boot_is_pid_1s_start_whatever_its_name_holds():
    assert _boot_check.booted_at(PROC_STAT, PID1_STAT, 100) == 1764000000 + 123.45
    with pytest.raises(ValueError, match="boot time"):
        _boot_check.booted_at("cpu 1\n", PID1_STAT, 100)


@pytest.mark.parametrize(("field", "value", "variable"), [
    ("serve_within", 30, "reboot_test_serve_within"),
    ("serve_within", "600", "reboot_test_serve_within"),
    ("timeout", 0, "reboot_test_request_timeout"),
    ("expect_active", ["earlyoom.service; reboot"], "reboot_test_expect_active"),
    ("exporter_units", "node_exporter.service", "reboot_test_exporter_units"),
    ("exporter_urls", ["file:///etc/shadow"], "reboot_test_exporter_urls"),
    ("plan_dirs", ["etc/sparkfleet/vllm"], "plan_dirs"),
])
def test_each_bad_option_is_refused_naming_its_variable_before_anything_is_read(field, value, variable):
    systemd = Systemd({})
    result = _boot_check.check({**OPTIONS, "plan_dirs": ["/etc/sparkfleet/vllm"], field: value}, host_of(systemd))
    assert result["ok"] is False and result["passed"] is False
    assert len(result["reasons"]) == 1 and result["reasons"][0].startswith(variable + ":")
    assert systemd.calls == []


def test_units_began_only_after_the_units_they_follow_were_serving():
    plans = [{"unit": "a"}, {"unit": "b", "start_after": ["a"]}]
    kept = _boot_check.order_row(plans, {"a": {"began": 1_000_000, "active_since": 50_000_000},
                                         "b": {"began": 51_000_000, "active_since": 90_000_000}})
    assert kept["passed"] and kept["detail"] == "b after a (+1.0 s)"
    broken = _boot_check.order_row(plans, {"a": {"began": 1_000_000, "active_since": 50_000_000},
                                           "b": {"began": 2_000_000, "active_since": 90_000_000}})
    assert not broken["passed"] and "b began starting 48.0 s before a, which it follows, was serving" in broken["detail"]
    never = _boot_check.order_row(plans, {"a": {"began": None, "active_since": None}, "b": {"began": 2, "active_since": 3}})
    assert not never["passed"] and "never started" in never["detail"]


def test_a_restart_since_the_boot_fails_and_says_which_unit():
    found = _boot_check.restarts_row([{"unit": "a"}, {"unit": "b"}], {"a": {"n_restarts": 0}, "b": {"n_restarts": 2}}, [])
    assert not found["passed"] and found["detail"] == "restarted since the boot: a 0, b 2"


def test_a_watchdog_restart_since_the_boot_fails_though_systemd_counted_none():
    line = json.dumps({"sparkfleet_watchdog": 1, "unit": "a", "verdict": "wedged", "action": "restart", "why": "probe timed out"})
    actions = _boot_check.watchdog_actions(Systemd({}, watchdog=f"{line}\nnot json\n"), 1764000123.0)
    found = _boot_check.restarts_row([{"unit": "a"}], {"a": {"n_restarts": 0}}, actions)
    assert not found["passed"] and found["detail"] == "NRestarts: a 0; the watchdog acted: restart a (probe timed out)"


def test_a_planned_unit_not_installed_or_not_running_fails_a_worker_rank_too():
    times = {"head": {"load_state": "loaded", "active_state": "active"}, "worker": {"load_state": "not-found", "active_state": "inactive"}}
    found = _boot_check.units_row([{"unit": "head"}, {"unit": "worker", "cluster": {"rank": 1, "head": False}}], times)
    assert not found["passed"] and found["detail"] == "not running: worker not-found/inactive"


@pytest.mark.parametrize(("change", "named"), [
    ({"unit": "a.service; rm -rf /"}, "no usable unit, start_bound"), ({"port": "8000"}, "no usable port"),
    ({"start_after": "sparkfleet-vllm-a.service"}, "no usable start_after"), ({"cluster": "head"}, "no usable cluster"),
    ({"bind_addresses": [None]}, "no usable bind_addresses"), ({"schema_version": 1}, "schema_version 1, this release reads 2"),
])
def test_a_damaged_plan_file_fails_the_serving_check_naming_what_is_wrong(tmp_path, change, named):
    """The other plans are still checked: the damaged file is one more reason the serving check fails."""
    good = plan(tmp_path, "second", 9)
    write_plans(tmp_path, {**plan(tmp_path, "first", 9), **change}, good)
    plans, damaged = _boot_check.deployed_plans([str(tmp_path)], _boot_check.read_text)
    assert plans == [good] and len(damaged) == 1
    assert damaged[0].startswith(f"{tmp_path / 'first.json'}: {named}") and damaged[0].endswith(f"; {FIX}")
    result = _boot_check.check({**OPTIONS, "plan_dirs": [str(tmp_path)]}, host_of(Systemd({})), validate_only=True)
    assert result["ok"] and result["damaged_plan_files"] == damaged


def test_systemd_answering_fewer_blocks_than_units_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="1 blocks for 2 units"):
        _boot_check.unit_times(lambda argv: (0, show_block(1, 2), ""), ["a", "b"])


def test_swap_failed_units_and_oom_kills_since_the_boot():
    assert _boot_check.swap_row({"/proc/swaps": SWAPS_NONE}.__getitem__)["passed"]
    swapping = _boot_check.swap_row({"/proc/swaps": SWAPS_NONE + "/swap.img file 8388604 0 -2\n"}.__getitem__)
    assert not swapping["passed"] and swapping["detail"] == "active: /swap.img"
    assert not _boot_check.swap_row(host_of(Systemd({}), {"/proc/swaps": None}).read_text)["passed"]
    failed = _boot_check.failed_units_row(Systemd({}, failed="earlyoom.service loaded failed failed earlyoom\n"))
    assert not failed["passed"] and failed["detail"] == "failed: earlyoom.service"
    systemd = Systemd({}, kernel="Out of memory: Killed process 4242 (python3) total-vm:1kB\nsomething else\n")
    oom = _boot_check.oom_row(systemd, 1764000123.45)
    assert not oom["passed"] and oom["detail"].startswith("1 since the boot: Out of memory: Killed process 4242")
    assert systemd.calls[0][:4] == ["journalctl", "--dmesg", "--since", "@1764000123"]


def test_an_exporter_not_installed_is_noted_but_a_required_unit_not_installed_fails():
    states = {"earlyoom.service": {"active_state": "inactive", "load_state": "not-found"},
              "node_exporter.service": {"active_state": "inactive", "load_state": "not-found"}}
    assert not _boot_check.unit_states_row("services", ["earlyoom.service"], states, required=True)["passed"]
    noted = _boot_check.unit_states_row("exporters", ["node_exporter.service"], states, required=False)
    assert noted["passed"] and noted["detail"] == "node_exporter.service not installed"


def lan_address():
    """This machine's address on its default route (a UDP connect sends nothing), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            return probe.getsockname()[0]
        except OSError:
            return None


def test_a_lan_bound_port_must_answer_on_that_address():
    address = lan_address()
    if address is None or address.startswith("127."):
        pytest.skip("this machine has no address off loopback")
    with vllm_routes("0.0.0.0") as server:
        port = server.server_address[1]
        answered = _boot_check.lan_row([{"unit": "a", "port": port, "bind_addresses": ["127.0.0.1", address]}], {"a": KEY}, 5)
        assert answered["passed"] and answered["detail"] == f"http://{address}:{port}/v1/models answered 200"
        wildcard = _boot_check.lan_row([{"unit": "a", "port": port, "bind_addresses": ["0.0.0.0"]}], {"a": KEY}, 5)
        assert wildcard["passed"] and wildcard["detail"] == "a binds 0.0.0.0 (every interface): no one LAN address to call"
        refused = _boot_check.lan_row([{"unit": "a", "port": port, "bind_addresses": [address]}], {"a": "wrong-key"}, 5)
        assert not refused["passed"] and "gave 401" in refused["detail"]
    assert _boot_check.lan_row([{"unit": "a", "port": 1, "bind_addresses": ["127.0.0.1"]}], {}, 5)["detail"].endswith("no LAN port to check")


def test_a_whole_boot_check_passes_and_the_report_has_a_row_per_check(tmp_path):
    with vllm_routes() as first, vllm_routes() as second:
        plans = [plan(tmp_path, "first", first.server_address[1]),
                 plan(tmp_path, "second", second.server_address[1], start_after=["sparkfleet-vllm-first.service"], speculative="ngram")]
        write_plans(tmp_path, *plans)
        systemd = Systemd({"sparkfleet-vllm-first.service": show_block(2_000_000, 40_000_000),
                           "sparkfleet-vllm-second.service": show_block(41_000_000, 80_000_000)},
                          states={"prometheus-node-exporter.service": ("not-found", "inactive")})
        result = _boot_check.check({**OPTIONS, "plan_dirs": [str(tmp_path), str(tmp_path / "absent")],
                                    "exporter_urls": [f"http://127.0.0.1:{first.server_address[1]}/metrics-exporter"]},
                                   host_of(systemd))
    assert result["ok"] and result["passed"], result["reasons"]
    assert [row["check"] for row in result["checks"]] == [
        "serving", "order", "units", "restarts", "lan_port", "warm_up", "speculative", "services", "exporters", "failed_units", "swap", "oom_kills"]
    rows = {row["check"]: row["detail"] for row in result["checks"]}
    assert rows["speculative"] == "sparkfleet-vllm-second.service: draft tokens 3 -> 6"
    assert rows["warm_up"] == "sparkfleet-vllm-first.service: 'hello'; sparkfleet-vllm-second.service: 'hello'"
    markdown = _boot_check.markdown_report("spark-1: reboot test", result, 95.4)
    assert markdown.startswith("# spark-1: reboot test\n\n**REBOOT TEST PASS**\n\nThe host was back 95 s after the reboot was asked")
    assert markdown.count("| pass |") == 12 and KEY not in markdown and KEY not in json.dumps(result)


def test_a_drafter_that_drafts_nothing_and_an_endpoint_that_never_serves_fail_with_what_was_seen(tmp_path):
    with vllm_routes(drafts_per_request=0) as server:
        plans = [plan(tmp_path, "second", server.server_address[1], speculative="ngram"), plan(tmp_path, "gone", 9)]
        write_plans(tmp_path, *plans)
        systemd = Systemd({p["unit"]: show_block(1, 2) for p in plans})
        host = host_of(systemd)
        # Past the boot's deadline already: the wait gives up at once.
        host = _boot_check.Host(run_command=host.run_command, read_text=host.read_text, wall=lambda: 1764000500.0, ticks_per_second=100)
        result = _boot_check.check({**OPTIONS, "plan_dirs": [str(tmp_path)]}, host)
    assert result["ok"] and not result["passed"]
    failed = {row["check"]: row["detail"] for row in result["checks"] if not row["passed"]}
    assert set(failed) == {"serving", "warm_up", "speculative"}
    assert failed["serving"].startswith("within 60 s of the boot: sparkfleet-vllm-gone.service not by")
    assert "draft tokens 0 -> 0" in failed["speculative"]
    assert any(reason.startswith("serving: ") for reason in result["reasons"])


def test_a_unit_still_in_its_readiness_wait_is_waited_for_until_the_deadline():
    answers = iter([show_block(1, 0, state="activating"), show_block(1, 5)])
    clock = iter([100.0, 101.0, 102.0])
    host = _boot_check.Host(run_command=lambda argv: (0, next(answers), ""), read_text=str, wall=lambda: next(clock), pause=lambda s: None)
    assert _boot_check.settled_unit_times(host, ["a"], deadline=200.0)["a"]["active_state"] == "active"
    stuck = _boot_check.Host(run_command=lambda argv: (0, show_block(1, 0, state="activating"), ""), read_text=str,
                             wall=lambda: 300.0, pause=lambda s: None)
    assert _boot_check.settled_unit_times(stuck, ["a"], deadline=200.0)["a"]["active_state"] == "activating"
