"""The serving_unit module run as Ansible runs it (its arguments on stdin), writing a planned
instance's files into a temporary folder, with stand-ins for systemctl and docker on PATH that
replay outputs recorded on a lab host (tests/unit/fixtures/serving_unit): drift, check mode, a
plan file that alone relaunches nothing, modes restored, and every failure named without a traceback.
A relaunch's gate polls a real local HTTP server standing in for the instance's API."""

import calendar
import copy
import http.server
import json
import os
import pathlib
import stat
import subprocess
import sys
import time

import pytest
from plan_files import rank_plan
from plan_options import ROLE_DEFAULTS, plan_options
from threaded_server import serving

from ansible_collections.sparkfleet.vllm.plugins.module_utils import _serving_unit
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import backend_reports, gateway_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import build_plan

ROOT = pathlib.Path(__file__).resolve().parents[4]
COLLECTIONS = ROOT / ".cache" / "collections"
MODULE = COLLECTIONS / "ansible_collections" / "sparkfleet" / "vllm" / "plugins" / "modules" / "serving_unit.py"
RECORDED = ROOT / "tests" / "unit" / "fixtures" / "serving_unit"
KEY = "k" * 32
IMAGE = "registry.local:5000/vllm-cpu:0.32.0@sha256:" + "ab" * 32
# Replays what the state file says the host has, in the recorded formats; anything else fails as the real tools would.
STAND_IN = """#!/usr/bin/env python3
import json, pathlib, sys
here = pathlib.Path(__file__).parent
state = json.loads((here / "state.json").read_text())
tool, args = pathlib.Path(sys.argv[0]).name, sys.argv[1:]
with open(here / "calls.log", "a") as log:
    log.write(" ".join([tool, *args]) + "\\n")
def save():
    (here / "state.json").write_text(json.dumps(state))
def unit_text(unit):
    enabled = "enabled" if unit in state["enabled"] else "disabled"
    return state["active"].replace("ActiveState=active", "ActiveState=" + state["units"][unit]).replace("UnitFileState=enabled", "UnitFileState=" + enabled)
if tool == "docker" and state.get("docker_down"):
    sys.stderr.write("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\\n")
    sys.exit(1)
if tool == "systemctl" and args[:5] == ["show", "--property=LoadState", "--property=ActiveState", "--property=UnitFileState", "--"]:
    sys.stdout.write(unit_text(args[5]) if args[5] in state["units"] else state["not_found"])
elif tool == "systemctl" and args[:2] == ["enable", "--"] and args[2] in state.get("masked", []):
    sys.stderr.write(state["enable_masked"])
    sys.exit(1)
elif tool == "systemctl" and args[:2] == ["enable", "--"]:
    state["enabled"] = sorted(set(state["enabled"]) | {args[2]})
    save()
elif tool == "systemctl" and args == ["daemon-reload"]:
    pass
elif tool == "systemctl" and args[0] == "stop":
    state["units"][args[1]] = "inactive"
    save()
elif tool == "systemctl" and args[:2] == ["start", "--no-block"]:
    state["units"][args[2]] = "active"
    if "flag" in state:
        flag = pathlib.Path(state["flag"])
        with open(here / "calls.log", "a") as log:
            log.write(f"maintenance flag at start: {flag.read_text().strip() if flag.exists() else 'none'}\\n")
    if state.get("starts"):
        name, container = state["starts"].pop(0)
        state["containers"][name] = container
    save()
elif tool == "systemctl" and args[:2] == ["disable", "--now"]:
    state["units"].pop(args[2], None)
    state["enabled"] = [unit for unit in state["enabled"] if unit != args[2]]
    save()
elif tool == "systemctl" and args[0] == "reset-failed":
    if args[1] not in state["units"]:
        sys.stderr.write(f"Failed to reset failed state of unit {args[1]}: Unit {args[1]} not loaded.\\n")
        sys.exit(1)
elif tool == "docker" and args[:2] == ["container", "inspect"] and args[2] in state["containers"]:
    # The recorded record, under the name asked (docker names each container's record by it).
    sys.stdout.write(json.dumps([{**state["containers"][args[2]], "Name": "/" + args[2]}]))
elif tool == "docker" and args[:2] == ["container", "inspect"]:
    sys.stdout.write("[]\\n")
    sys.stderr.write(state["missing"].replace("vllm-nothere", args[2]))
    sys.exit(1)
elif tool == "docker" and args[:3] == ["logs", "--tail", "1000"]:
    sys.stderr.write(state.get("logs", {}).get(args[3], ""))
elif tool == "docker" and args[:2] == ["rm", "--force"]:
    state["containers"].pop(args[2], None)
    save()
else:
    sys.stderr.write(f"unexpected {tool} {args}\\n")
    sys.exit(2)
"""


@pytest.fixture
def host(tmp_path):
    """A host: the configuration and unit folders, and the stand-ins with a state the test sets."""
    (tmp_path / "config" / "last-good").mkdir(parents=True)
    (tmp_path / "units").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("systemctl", "docker"):
        (bin_dir / tool).write_text(STAND_IN)
        (bin_dir / tool).chmod(0o755)
    return tmp_path


def set_state(host, units=None, containers=None, docker_down=False, enabled=None, **more):
    """The host's units (name: ActiveState; enabled unless ``enabled`` lists others) and containers."""
    units = units or {}
    state = {"units": units, "containers": containers or {}, "docker_down": docker_down, **more,
             "enabled": list(units) if enabled is None else enabled,
             "active": (RECORDED / "systemctl-show-active-enabled.txt").read_text(),
             "not_found": (RECORDED / "systemctl-show-not-found.txt").read_text(),
             "enable_masked": (RECORDED / "systemctl-enable-masked.stderr").read_text(),
             "missing": (RECORDED / "docker-container-inspect-missing.stderr").read_text()}
    (host / "bin" / "state.json").write_text(json.dumps(state))


def planned(host, **changes):
    """The vllm role's plan of one instance, its files in the test's folders; and its env file. Without the memory
    admission: its probe runs the image in Docker, which the stand-ins do not replay (the admission a relaunch asks before
    its stop: test_admit_before_stop.py, and on the lab)."""
    instance = {"name": "tiny", "model": "/models/tiny-llama", "served_model_names": ["tiny"], "port": 8001, "api_key": KEY, **changes}
    result = build_plan([instance], ROLE_DEFAULTS["vllm_instance_defaults"],
                        **plan_options(image=IMAGE, hardware_class="cpu_lab", config_dir=str(host / "config"), cache_dir=str(host / "cache"),
                                       memory_admission=False))
    assert result["errors"] == []
    plan = result["instances"][0]
    plan["kept_files"][2] = {**plan["kept_files"][2], "path": str(host / "units" / plan["unit"])}
    plan["maintenance_flag"] = str(host / "run" / "vllm-maintenance")
    plan["watchdog_give_up"] = str(host / "watchdog" / f"{plan['unit']}.person-needed.json")
    return plan, result["env_files"]["tiny"]


def running(plan, config_hash=None, status="running"):
    """The recorded inspect data of a running instance, as this plan's container."""
    container = json.loads((RECORDED / "docker-container-inspect-running.json").read_text())[0]
    container["Config"]["Labels"]["sparkfleet.vllm.config-hash"] = config_hash or plan["config_hash"]
    container["Config"]["Image"] = plan["run_image"]
    container["State"]["Status"] = status
    return container


def active(unit):
    return {unit: "active"}


def calls(host):
    log = host / "bin" / "calls.log"
    return [line for line in log.read_text().splitlines()
            if " show " not in f" {line} " and " inspect " not in f" {line} "] if log.exists() else []


def forget_calls(host):
    (host / "bin" / "calls.log").unlink(missing_ok=True)


def host_state(host):
    return json.loads((host / "bin" / "state.json").read_text())


def run(host, plan, env_file=None, check_mode=False, step="prepare", **args):
    given = {"plan": plan, "step": step, **({"env_file": env_file} if env_file is not None else {}), **args}
    payload = {"ANSIBLE_MODULE_ARGS": {**given, "_ansible_check_mode": check_mode, "_ansible_diff": True}}
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS), "PATH": f"{host / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(payload), capture_output=True, text=True, env=env, check=False)
    assert "Traceback" not in done.stdout + done.stderr and KEY not in done.stdout + done.stderr, done.stdout + done.stderr
    return json.loads(done.stdout)


def files(host):
    return {path.relative_to(host).as_posix(): (path.read_text(), stat.S_IMODE(path.stat().st_mode))
            for folder in ("config", "units") for path in sorted((host / folder).rglob("*")) if path.is_file()}


def test_a_fresh_host_gets_every_file_with_its_mode_and_the_instance_is_launched(host):
    set_state(host)
    plan, env_file = planned(host)
    result = run(host, plan, env_file)
    assert result["changed"] and result["written"] == ["env", "plan", "unit"] and result["fixed"] == []
    assert result["drift"] == ["its settings files changed", "its unit is inactive", "no container runs"]
    assert result["unit_state"] == {"LoadState": "not-found", "ActiveState": "inactive", "UnitFileState": ""}
    assert result["enabled"] and calls(host) == [], "a unit that drifts is enabled only once its relaunch passed the gate"
    written = files(host)
    assert written["config/tiny.env"] == (env_file, 0o600)
    assert json.loads(written["config/tiny.json"][0]) == plan and written["config/tiny.json"][1] == 0o644
    assert written["units/sparkfleet-vllm-tiny.service"] == (plan["unit_file"], 0o644)
    assert [entry["before"] for entry in result["diff"]] == ["", "", ""]
    assert "API key" in result["diff"][0]["after"], "the env file's content never reaches a diff"


def test_a_host_running_its_plan_keeps_it_as_the_last_good_settings_and_then_changes_nothing(host):
    plan, env_file = planned(host)
    set_state(host)
    assert run(host, plan, env_file)["kept"] == [], "a unit that does not run its plan keeps nothing"
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan)})
    assert run(host, plan, env_file, check_mode=True)["kept"] == [], "a check run keeps nothing"
    first = run(host, plan, env_file)
    assert first["changed"] and first["written"] == [] and first["drift"] == [] and first["kept"] == ["env", "plan", "unit"]
    written = files(host)
    assert written["config/last-good/tiny.env"] == written["config/tiny.env"]
    assert written[f"config/last-good/{plan['unit']}"] == written[f"units/{plan['unit']}"]
    again = run(host, plan, env_file)
    assert not again["changed"] and again["written"] == again["kept"] == [] and again["drift"] == [] and again["diff"] == []
    assert files(host) == written


def test_a_unit_not_enabled_is_enabled_for_boot_and_check_mode_only_says_so(host):
    plan, env_file = planned(host)
    set_state(host)
    run(host, plan, env_file)
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan)}, enabled=[])
    forget_calls(host)
    checked = run(host, plan, env_file, check_mode=True)
    assert checked["changed"] and checked["enabled"] and checked["drift"] == [] and calls(host) == []
    assert checked["unit_state"]["UnitFileState"] == "disabled"
    applied = run(host, plan, env_file)
    assert applied["changed"] and applied["enabled"] and applied["written"] == [] and applied["drift"] == []
    assert calls(host) == [f"systemctl enable -- {plan['unit']}"]
    assert not run(host, plan, env_file)["changed"], "an enabled unit is left alone"
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan)}, enabled=[], masked=[plan["unit"]])
    blocked = run(host, plan, env_file)
    assert blocked["failed"] and blocked["msg"].startswith(f"systemctl enable {plan['unit']} exited 1: Failed to enable unit, unit ")
    assert "systemctl unmask, or remove the other unit" in blocked["msg"]


def test_check_mode_answers_the_same_and_writes_nothing(host):
    set_state(host)
    plan, env_file = planned(host)
    checked = run(host, plan, env_file, check_mode=True)
    assert files(host) == {}
    assert checked["changed"] and checked["written"] == ["env", "plan", "unit"]
    assert checked["drift"] == ["its settings files changed", "its unit is inactive", "no container runs"]
    applied = run(host, plan, env_file)
    assert {key: applied[key] for key in ("written", "drift")} == {key: checked[key] for key in ("written", "drift")}


def test_a_plan_file_alone_rewritten_relaunches_nothing_and_a_changed_setting_does(host):
    plan, env_file = planned(host)
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan)})
    run(host, plan, env_file)
    described = copy.deepcopy(plan)
    described["memory"] = {"note": "a field a newer release adds to the plan"}
    result = run(host, described, env_file)
    assert result["written"] == ["plan"] and result["drift"] == [], "a plan file describes the unit; it is not the unit"
    changed, changed_env = planned(host, max_num_seqs=8)
    result = run(host, changed, changed_env)
    # The unit runs the plan file's docker run through the host runtime: its own text stays.
    assert result["written"] == ["plan"]
    assert result["drift"] == [f"its container runs config {plan['config_hash']}, the plan is {changed['config_hash']}"]


def test_a_secret_file_made_readable_is_closed_again_without_a_relaunch(host):
    plan, env_file = planned(host)
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan)})
    run(host, plan, env_file)
    (host / "config" / "tiny.env").chmod(0o644)
    result = run(host, plan, env_file)
    assert result["changed"] and result["written"] == [] and result["fixed"] == ["env"] and result["drift"] == []
    assert files(host)["config/tiny.env"][1] == 0o600


@pytest.mark.parametrize(("container", "reason"), [
    pytest.param({"config_hash": "0123456789abcdef"}, "its container runs config 0123456789abcdef, the plan is", id="other-settings"),
    pytest.param({"status": "exited"}, "its container is exited", id="exited"),
])
def test_a_container_changed_by_hand_is_drift(host, container, reason):
    plan, env_file = planned(host)
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan, **container)})
    run(host, plan, env_file)
    result = run(host, plan, env_file)
    assert not result["changed"] and len(result["drift"]) == 1 and result["drift"][0].startswith(reason)


@pytest.mark.parametrize(("damage", "fragment"), [
    pytest.param(lambda plan: {**plan, "schema_version": 0}, "plan: schema_version 0, while this release reads 2", id="other-release"),
    pytest.param(lambda plan: {**plan, "kept_files": plan["kept_files"][:2]}, "plan: lacks kept_files", id="files-missing"),
    pytest.param(lambda plan: {k: v for k, v in plan.items() if k != "config_hash"}, "plan: lacks config_hash", id="hash-missing"),
    pytest.param(lambda plan: {**plan, "kept_files": [{k: v for k, v in kept.items() if k != "last_good"} for kept in plan["kept_files"]]},
                 "plan: lacks kept_files", id="last-good-missing"),
    pytest.param(lambda plan: {**plan, "gpu_memory_utilization": "0.5"}, "plan: lacks gpu_memory_utilization", id="share-as-text"),
    pytest.param(lambda plan: {**plan, "memory_probe": ["/bin/sh", "-c", "id"]}, "plan: lacks memory_probe (the memory check the plan "
                 "builder writes for the plan's run_image)", id="foreign-command"),
    pytest.param(lambda plan: {**plan, "memory_probe": [*plan["memory_probe"][:-3], "other/image", *plan["memory_probe"][-2:]]},
                 "plan: lacks memory_probe", id="probe-of-another-image"),
    pytest.param(lambda plan: {**plan, "memory_probe": [*plan["memory_probe"][:-4], "--gpus", "all", *plan["memory_probe"][-4:]]},
                 "plan: lacks memory_probe", id="probe-given-a-gpu-the-instance-lacks"),
])
def test_a_plan_that_is_not_this_releases_is_refused_writing_nothing(host, damage, fragment):
    set_state(host)
    plan, env_file = planned(host)
    result = run(host, damage(plan), env_file)
    assert result["failed"] and result["msg"].startswith(fragment) and "__vllm_plan.instances" in result["msg"]
    assert files(host) == {}


def test_a_stopped_docker_and_a_missing_folder_are_named_with_the_fix_and_change_nothing(host):
    plan, env_file = planned(host)
    set_state(host, docker_down=True)
    result = run(host, plan, env_file)
    assert result["failed"] and result["msg"].startswith(f"docker container inspect {plan['container']} exited 1: Cannot connect")
    assert result["msg"].endswith("is Docker running on the host?") and files(host) == {}, "a host that cannot answer is left as it was"
    set_state(host)
    (host / "config" / "last-good").rmdir()
    (host / "config").rmdir()
    result = run(host, plan, env_file)
    assert result["failed"] and result["msg"] == (f"{host}/config/tiny.env: its folder {host}/config does not exist; the role creates it "
                                                  "before writing the file (its planned folders)")


def test_a_relaunch_stops_removes_the_container_starts_and_keeps_the_settings_that_served(host):
    plan, env_file = planned(host)
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan, config_hash="0123456789abcdef")})
    assert run(host, plan, env_file)["drift"]
    stopped = run(host, plan, step="stop")
    assert stopped["changed"] and stopped["unit_state"]["ActiveState"] == "active"
    started = run(host, plan, step="start")
    kept = run(host, plan, step="keep")
    assert started["changed"] and kept["changed"] and kept["written"] == ["env", "plan", "unit"]
    assert calls(host) == ["systemctl daemon-reload", f"systemctl stop {plan['unit']}", f"docker rm --force {plan['container']}",
                           f"systemctl reset-failed {plan['unit']}", f"systemctl start --no-block {plan['unit']}",
                           f"systemctl enable -- {plan['unit']}"]
    written = files(host)
    assert written["config/last-good/tiny.env"] == written["config/tiny.env"] and written["config/last-good/tiny.env"][1] == 0o600
    assert written[f"config/last-good/{plan['unit']}"] == written[f"units/{plan['unit']}"]
    assert not run(host, plan, step="keep")["changed"], "kept once"


def test_a_unit_systemd_never_loaded_starts_without_a_start_limit_to_clear(host):
    plan, env_file = planned(host)
    set_state(host)
    run(host, plan, env_file)
    assert not run(host, plan, step="stop")["changed"]
    assert run(host, plan, step="start")["changed"]
    assert host_state(host)["units"] == {plan["unit"]: "active"}
    assert calls(host)[-1] == f"systemctl start --no-block {plan['unit']}"


def test_a_rollback_restores_the_last_good_files_and_without_them_touches_nothing(host):
    plan, env_file = planned(host)
    set_state(host)
    run(host, plan, env_file)
    nothing = run(host, plan, step="restore")
    assert not nothing["changed"] and not nothing["restored"], "no last good copy yet"
    assert {key: value for key, value in run(host, plan, step="last_good").items() if key != "invocation"} == {"changed": False, "complete": False}
    run(host, plan, step="keep")
    assert run(host, plan, step="last_good")["complete"] is True
    good = files(host)
    failing, failing_env = planned(host, max_num_seqs=8)
    run(host, failing, failing_env)
    assert files(host) != good
    checked = run(host, failing, step="restore", check_mode=True)
    assert checked["restored"] and checked["written"] == ["plan"] and files(host)["config/tiny.json"] != good["config/tiny.json"]
    restored = run(host, failing, step="restore")
    assert restored["changed"] and restored["restored"] and files(host) == good
    assert calls(host)[-1] == "systemctl daemon-reload", "systemd reads the restored unit before it is started again"


def test_a_unit_no_longer_planned_is_removed_with_its_files_and_check_mode_only_names_them(host):
    plan, env_file = planned(host)
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan)})
    run(host, plan, env_file)
    run(host, plan, step="keep")
    forget_calls(host)
    removal = {"name": "tiny", "unit": plan["unit"], "container": plan["container"],
               "files": [entry["path"] for entry in plan["kept_files"]] + [entry["last_good"] for entry in plan["kept_files"]]}
    before = files(host)
    checked = run(host, removal, step="remove", check_mode=True)
    assert checked["changed"] and checked["removed"] == removal["files"] and files(host) == before and calls(host) == []
    assert [entry["before_header"] for entry in checked["diff"]] == removal["files"]
    removed = run(host, removal, step="remove")
    assert removed["changed"] and files(host) == {}
    assert calls(host) == [f"systemctl disable --now {plan['unit']}", f"docker rm --force {plan['container']}", "systemctl daemon-reload"]
    assert not run(host, removal, step="remove")["changed"]
    bad = run(host, {**removal, "files": ["relative/path"]}, step="remove")
    assert bad["failed"] and bad["msg"].startswith("plan: a removal needs name, unit, container and files (absolute paths)")


def test_a_launch_pauses_only_the_plans_exporters_and_a_stuck_one_stops_nothing_of_the_unit(host):
    """Steps pause and resume, as the cluster role calls them around its ranks' launch (an instance's unit does both
    itself), recorded in the host runtime's ledger."""
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit import pause, resume

    plan, _env_file = planned(host)
    assert plan["paused_containers"] == ["nvidia_gpu_exporter"], "the role's default, seed 002's exporter"
    state = {"nvidia_gpu_exporter": "true"}

    def docker(argv):
        if argv[1:3] == ["container", "inspect"]:
            return 0, json.dumps([{"Name": f"/{argv[-1]}", "State": {"Running": state[argv[-1]] == "true"}}]), ""
        if state.get("stuck"):
            return 1, "", "Error response from daemon: tried to kill container, but did not receive an exit event"
        state[argv[-1]] = "true" if argv[1] == "start" else "false"
        return 0, "", ""

    ledger = str(host / "state" / "paused.json")
    assert pause(plan, docker, True, ledger) == {"changed": True, "paused": ["nvidia_gpu_exporter"]}, "check mode says what it would stop"
    assert state["nvidia_gpu_exporter"] == "true", "and stops nothing"
    assert pause(plan, docker, False, ledger) == {"changed": True, "paused": ["nvidia_gpu_exporter"]} and state["nvidia_gpu_exporter"] == "false"
    assert json.loads((host / "state" / "paused.json").read_text()) == {"nvidia_gpu_exporter": [plan["unit"]]}
    assert resume(plan, docker, ledger) == {"changed": True} and state["nvidia_gpu_exporter"] == "true"
    assert resume(plan, docker, ledger) == {"changed": False}, "what the ledger holds for the unit, once"
    state["stuck"] = "yes"
    stuck = pause(plan, docker, False, ledger)
    assert stuck["failed"] and stuck["paused"] == [] and stuck["msg"].startswith(
        "tiny was not relaunched, nothing of it was stopped: nvidia_gpu_exporter could not be stopped for the start")


class Vllm(http.server.BaseHTTPRequestHandler):
    """vLLM's API as the gate reads it: /v1/models lists the names the key it is sent serves."""

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        names = self.server.serves.get(self.headers.get("Authorization", "").removeprefix("Bearer "))
        if names and self.path == "/metrics":
            page = self.server.metrics.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
        elif names:
            self.reply(200, {"data": [{"id": name} for name in names]})
        else:
            self.reply(401, {"error": "Unauthorized"})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply(200, {"choices": [{"message": {"content": "Hello, operator"}}]})

    def log_message(self, *args):
        pass


@pytest.fixture
def vllm():
    """A real HTTP server on a free local port standing in for the instance's API; ``serves`` maps a key to its names."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Vllm)
    server.serves, server.metrics = {}, ""
    with serving(server):
        yield server


def exited_with_a_bad_flag():
    return json.loads((RECORDED / "docker-inspect-exited-bad-flag.json").read_text())[0]


def relaunch(host, plan, **args):
    return run(host, plan, step="relaunch", **args)


def test_a_relaunch_is_gated_under_the_maintenance_flag_which_it_clears(host, vllm):
    plan, env_file = planned(host, port=vllm.server_port)
    vllm.serves[KEY] = ["tiny"]
    set_state(host, flag=str(host / "run" / "vllm-maintenance"), starts=[(plan["container"], running(plan))])
    run(host, plan, env_file)
    forget_calls(host)
    checked = relaunch(host, plan, check_mode=True)
    assert checked["changed"] and calls(host) == [] and not (host / "run").exists()
    assert not (host / "config" / "last-good" / "tiny.env").exists()
    (host / "watchdog").mkdir()
    pathlib.Path(plan["watchdog_give_up"]).write_text("{}")
    done = relaunch(host, plan)
    assert not pathlib.Path(plan["watchdog_give_up"]).exists(), "a planned relaunch hands a unit the watchdog gave up on back to it"
    assert done["changed"] and done["gate"]["ok"] and done["gate"]["served_model_names"] == ["tiny"]
    assert done["gate"]["warmup_reply"] == "Hello, operator"
    assert done["kept"] == ["env", "plan", "unit"], "the settings that passed the gate are kept as the last good ones"
    assert (host / "config" / "last-good" / "tiny.env").read_text() == env_file
    assert calls(host) == ["systemctl daemon-reload", f"systemctl reset-failed {plan['unit']}", f"systemctl start --no-block {plan['unit']}",
                           "maintenance flag at start: tiny", f"systemctl enable -- {plan['unit']}"]
    assert host_state(host)["enabled"] == [plan["unit"]], "enabled for boot once it passed the gate"
    assert not (host / "run" / "vllm-maintenance").exists()


def test_a_relaunch_whose_kv_cache_falls_below_the_share_of_the_last_good_start_passes_with_a_warning(host, vllm):
    """Seed 000: two instances started at once and the KV cache fell from 41.22 to 34.99 GiB, and nobody noticed."""
    plan, env_file = planned(host, port=vllm.server_port)
    vllm.serves[KEY] = ["tiny"]
    vllm.metrics = 'vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="800",num_gpu_blocks="50"} 1.0\n'
    set_state(host, flag=str(host / "run" / "vllm-maintenance"), starts=[(plan["container"], running(plan))])
    run(host, plan, env_file)
    stamp = pathlib.Path(plan["cold_start"]["stamp"])
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text('{"time": 1, "kv_cache_tokens": 1000}\n')
    done = relaunch(host, plan)
    assert done["gate"]["ok"] and done["gate"]["kv_cache_tokens"] == 800 and not done.get("failed")
    assert done["gate"]["kv_cache_warning"].startswith("the KV cache holds 800 tokens, 80 % of the 1,000 of the best good start")
    assert "tiny: the KV cache holds 800 tokens" in json.dumps(done["warnings"]), "shown as a warning"
    vllm.metrics = vllm.metrics.replace('"800"', '"950"')
    again = relaunch(host, plan)
    assert again["gate"]["kv_cache_tokens"] == 950 and again["gate"]["kv_cache_warning"] is None and "warnings" not in again


def test_a_failed_relaunch_serves_the_last_good_settings_gated_with_their_own_key(host, vllm):
    good, good_env = planned(host, port=vllm.server_port)
    vllm.serves[KEY] = ["tiny"]
    set_state(host, flag=str(host / "run" / "vllm-maintenance"), logs={good["container"]: (RECORDED / "docker-logs-bad-flag.stderr").read_text()},
              starts=[(good["container"], exited_with_a_bad_flag()), (good["container"], running(good))])
    run(host, good, good_env)
    run(host, good, step="keep")
    kept = files(host)
    failing, failing_env = planned(host, port=vllm.server_port, api_key="n" * 32, served_model_names=["renamed"], extra_args=["--no-such-flag"])
    run(host, failing, failing_env)
    # Settings that served on these caches before: their first exit is a failure (a cold start's is in test_vllm_health).
    pathlib.Path(failing["cold_start"]["stamp"]).write_text("1\n")
    result = relaunch(host, failing)
    assert result["failed"] and result["msg"].startswith(
        "vLLM instance tiny failed its relaunch: vLLM health gate failed: the container is exited (exit code 2) (detected after ")
    assert "The last good settings were relaunched and serve again. Errors in the engine log: " in result["msg"]
    assert "vllm: error: unrecognized arguments: --no-such-flag" in result["msg"]
    assert "n" * 32 not in json.dumps(result)
    assert files(host) == kept, "the last good files are back"
    assert [line for line in calls(host) if "start" in line] == [f"systemctl start --no-block {good['unit']}", "maintenance flag at start: tiny"] * 2
    assert host_state(host)["containers"][good["container"]]["State"]["Status"] == "running"
    assert not (host / "run" / "vllm-maintenance").exists()


def test_last_good_settings_that_do_not_serve_either_are_named_and_the_instance_is_down(host, vllm):
    good, good_env = planned(host, port=vllm.server_port)
    set_state(host, starts=[(good["container"], exited_with_a_bad_flag()), (good["container"], running(good))])
    run(host, good, good_env)
    run(host, good, step="keep")
    failing, failing_env = planned(host, port=vllm.server_port, max_num_seqs=8)
    run(host, failing, failing_env)
    result = relaunch(host, failing)
    assert result["failed"] and "The last good settings were relaunched but do not serve either (vLLM health gate failed: " in result["msg"]
    assert "the server refuses the API key the gate was given); the instance is down." in result["msg"]
    assert not (host / "run" / "vllm-maintenance").exists()


def test_a_failed_relaunch_without_last_good_settings_stops_the_unit(host, vllm):
    plan, env_file = planned(host, port=vllm.server_port)
    set_state(host, starts=[(plan["container"], exited_with_a_bad_flag())])
    run(host, plan, env_file)
    result = relaunch(host, plan)
    assert result["failed"] and "There were no last good settings to roll back to; the instance is stopped." in result["msg"]
    assert result["msg"].endswith("Errors in the engine log: none found")
    assert host_state(host)["units"][plan["unit"]] == "inactive" and plan["container"] not in host_state(host)["containers"]
    assert host_state(host)["enabled"] == [], "a first launch that failed never starts at boot"
    assert not (host / "run" / "vllm-maintenance").exists()


def test_a_last_good_plan_another_release_wrote_is_no_copy_to_roll_back_to(host, vllm):
    """After an upgrade, the last good plan file of the release before (schema 1) would only be refused by the start
    door: the rollback says so instead of restoring it."""
    plan, env_file = planned(host, port=vllm.server_port)
    set_state(host, starts=[(plan["container"], exited_with_a_bad_flag())])
    run(host, plan, env_file)
    run(host, plan, step="keep")
    last_good_plan = pathlib.Path(plan["kept_files"][1]["last_good"])
    last_good_plan.write_text(json.dumps({**json.loads(last_good_plan.read_text()), "schema_version": 1}))
    found = run(host, plan, step="last_good")
    assert found["complete"] is False and found["unusable"].startswith(f"{last_good_plan}: schema_version 1, this release reads 2")
    result = relaunch(host, plan)
    assert result["failed"] and f"There were no last good settings to roll back to ({last_good_plan}: schema_version 1" in result["msg"]
    assert host_state(host)["units"][plan["unit"]] == "inactive" and json.loads(last_good_plan.read_text())["schema_version"] == 1


def test_a_start_that_cannot_run_rolls_back_like_a_failed_gate(host):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._serving_unit import relaunch as relaunch_unit

    plan, env_file = planned(host)
    set_state(host)
    run(host, plan, env_file)
    ran = []

    def denied(argv):
        ran.append(" ".join(argv))
        if argv[:2] == ["systemctl", "reset-failed"]:
            return 1, "", "Failed to reset failed state of unit: Access denied"
        if argv[:3] == ["docker", "container", "inspect"]:
            return 1, "[]", "Error response from daemon: No such container: vllm-tiny"
        return 0, "LoadState=loaded\nActiveState=inactive\n" if argv[1] == "show" else "", ""

    result = relaunch_unit(plan, str(host / "run" / "vllm-maintenance"), False, denied)
    assert result["failed"] and result["msg"] == (
        f"vLLM instance tiny failed its relaunch: systemctl reset-failed {plan['unit']} exited 1: Failed to reset failed state of unit: "
        "Access denied (detected after ? s). There were no last good settings to roll back to; the instance is stopped. "
        "Errors in the engine log: none found")
    assert not any(line.startswith("systemctl start") for line in ran) and not (host / "run" / "vllm-maintenance").exists()


MASTER = "sk-" + "m" * 40


def gateway(host, port, master_key=MASTER):
    """The gateway role's plan of its unit, in front of one instance, its files in the test's folders; and its env file."""
    backend, _env = planned(host)
    hostvars = {"spark-1": {"ansible_host": "127.0.0.1", "vllm_endpoints": [
        {"name": "tiny", "port": backend["port"], "bind_addresses": ["127.0.0.1"], "served_names": ["tiny"], "api_key": KEY}]}}
    plan = gateway_plan({"image": IMAGE, "master_key": master_key, "backends": ["spark-1"], "port": port,
                         "config_dir": str(host / "config"), "ready_timeout": 4}, backend_reports(["spark-1"], hostvars), "spark-1")
    assert plan["errors"] == []
    unit = plan["serving_unit"]
    unit["kept_files"][2] = {**unit["kept_files"][2], "path": str(host / "units" / unit["unit"])}
    return unit, plan["env_file"]


def test_the_gateway_relaunches_gated_by_its_model_list_asked_with_its_master_key_without_a_flag(host, vllm):
    unit, env_file = gateway(host, vllm.server_port)
    vllm.serves[MASTER] = ["tiny"]
    set_state(host, starts=[(unit["container"], running(unit))])
    prepared = run(host, unit, env_file)
    assert prepared["drift"] == ["its settings files changed", "its unit is inactive", "no container runs"]
    assert files(host)["config/gateway.env"] == (env_file, 0o600) and MASTER not in json.dumps(prepared)
    forget_calls(host)
    done = relaunch(host, unit)
    assert done["changed"] and done["gate"]["ok"] and done["kept"] == ["plan", "unit"], "its keys are the backends': never rolled back"
    assert "warmup_reply" not in done["gate"], "LiteLLM is not asked to generate"
    assert calls(host) == ["systemctl daemon-reload", f"systemctl reset-failed {unit['unit']}", f"systemctl start --no-block {unit['unit']}",
                           f"systemctl enable -- {unit['unit']}"]
    assert not (host / "run").exists(), "the watchdog's flag is the engines' only"


def test_a_gateway_that_fails_its_gate_serves_its_last_good_unit_again_on_the_keys_of_now(host, vllm):
    good, good_env = gateway(host, vllm.server_port)
    vllm.serves[MASTER] = ["tiny"]
    set_state(host, logs={good["container"]: "litellm: error: unrecognized arguments\n"},
              starts=[(good["container"], exited_with_a_bad_flag()), (good["container"], running(good))])
    run(host, good, good_env)
    run(host, good, step="keep")
    kept = files(host)
    failing, failing_env = gateway(host, vllm.server_port, master_key="sk-" + "n" * 40)
    vllm.serves["sk-" + "n" * 40] = ["tiny"]
    run(host, failing, failing_env)
    result = relaunch(host, failing)
    assert result["failed"] and result["msg"].startswith(
        "The LiteLLM gateway failed its relaunch: The gateway's gate failed: the container is exited (exit code 2)")
    assert "The last good unit was relaunched, on the keys and routing of now, and answers again. Errors in the gateway log: " in result["msg"]
    assert "n" * 40 not in json.dumps(result)
    now = files(host)
    assert now["config/gateway.env"] == (failing_env, 0o600), "the keys of now stay: the backends and the routing use them"
    assert {path: now[path] for path in kept if path != "config/gateway.env"} == {path: kept[path] for path in kept if path != "config/gateway.env"}
    assert host_state(host)["containers"][good["container"]]["State"]["Status"] == "running"


def test_a_gateway_unit_plan_its_gate_cannot_read_fails_the_gate_naming_it_and_is_no_copy_to_roll_back_to(host, vllm):
    """The gateway's unit plan is read by the one plan-file reader, as the gateway kind: a damaged one fails the gate
    naming the file and the key, and a last good one of another release is no copy to restore."""
    good, good_env = gateway(host, vllm.server_port)
    vllm.serves[MASTER] = ["tiny"]
    set_state(host, starts=[(good["container"], running(good))])
    run(host, good, good_env)
    run(host, good, step="keep")
    plan_path = pathlib.Path(good["kept_files"][1]["path"])
    plan_path.write_text(json.dumps({**json.loads(plan_path.read_text()), "key_env": "$(reboot)"}))
    gate = _serving_unit.gate_files(good, lambda argv: (0, "", ""))
    assert gate["ok"] is False and gate["reason"].startswith(f"{plan_path}: no usable key_env; "), gate
    last_good_plan = pathlib.Path(good["kept_files"][1]["last_good"])
    last_good_plan.write_text(json.dumps({**json.loads(last_good_plan.read_text()), "schema_version": 1}))
    found = run(host, good, step="last_good")
    assert found["complete"] is False and found["unusable"].startswith(f"{last_good_plan}: schema_version 1, this release reads 2")
    assert MASTER not in json.dumps([gate, found])


def test_routing_written_after_the_gateways_container_started_is_drift(host, vllm):
    """LiteLLM reads its routing at start: a run cut short before the relaunch, or a drain whose
    restart failed, leaves it serving the old routing; the next run relaunches it."""
    unit, env_file = gateway(host, vllm.server_port)
    container = running(unit)
    started = container["State"]["StartedAt"]
    set_state(host, units=active(unit["unit"]), containers={unit["container"]: container})
    run(host, unit, env_file)
    routing = pathlib.Path(unit["routing_file"])
    routing.parent.mkdir(parents=True)
    routing.write_text("{}\n")
    stamp = calendar.timegm(time.strptime(started.split(".")[0], "%Y-%m-%dT%H:%M:%S"))
    os.utime(routing, (stamp - 60, stamp - 60))
    assert run(host, unit, env_file)["drift"] == [], "routing older than the container is what it serves"
    os.utime(routing, (stamp + 60, stamp + 60))
    assert run(host, unit, env_file)["drift"] == [f"its routing ({routing}) changed after its container started"]


def test_the_maintenance_flag_is_raised_with_the_units_name_and_cleared(host):
    plan, _env_file = planned(host)
    flag = host / "run" / "vllm-maintenance"
    assert run(host, plan, step="raise_flag", check_mode=True)["changed"] and not flag.exists()
    assert run(host, plan, step="raise_flag")["changed"]
    assert flag.read_text() == "tiny\n" and stat.S_IMODE(flag.stat().st_mode) == 0o644
    assert not run(host, plan, step="raise_flag")["changed"]
    assert run(host, plan, step="clear_flag")["changed"] and not flag.exists()
    assert not run(host, plan, step="clear_flag")["changed"]
    relative = run(host, {**plan, "maintenance_flag": "run/flag"}, step="relaunch")
    assert relative["failed"] and relative["msg"].startswith("plan: lacks maintenance_flag (the absolute path the vllm role plans as "
                                                             "vllm_maintenance_flag)")
    shallow = run(host, {**plan, "maintenance_flag": "/flag"}, step="relaunch")
    assert shallow["failed"] and shallow["msg"] == ("plan: maintenance_flag '/flag' is too close to / (give at least 2 levels, such as "
                                                    "/etc/sparkfleet/NAME); step relaunch needs the flag's path as the vllm role plans it "
                                                    "(vllm_maintenance_flag)")
    assert not (host / "config" / "tiny.env").exists()


def test_vllm_health_gates_a_deployed_instance_from_its_files_with_the_same_gate(host, vllm):
    """The vllm_health module reads the files prepare wrote and runs the relaunch's gate: ready with its
    warm-up reply, and on an exited container the engine log's error lines."""
    plan, env_file = planned(host, port=vllm.server_port)
    vllm.serves[KEY] = ["tiny"]
    set_state(host, containers={plan["container"]: running(plan)},
              logs={plan["container"]: (RECORDED / "docker-logs-bad-flag.stderr").read_text()})
    run(host, plan, env_file)
    module = MODULE.with_name("vllm_health.py")
    env = {**os.environ, "PYTHONPATH": str(COLLECTIONS), "PATH": f"{host / 'bin'}{os.pathsep}{os.environ['PATH']}"}

    def gate(**more):
        payload = {"ANSIBLE_MODULE_ARGS": {"instance": "tiny", "config_dir": str(host / "config"), "warmup": True, "interval": 0.2, **more}}
        done = subprocess.run([sys.executable, str(module)], input=json.dumps(payload), capture_output=True, text=True, env=env, check=False)
        assert "Traceback" not in done.stdout + done.stderr and KEY not in done.stdout + done.stderr, done.stdout + done.stderr
        return json.loads(done.stdout)

    ready = gate()
    assert ready["ok"] and ready["warmup_reply"] == "Hello, operator" and ready["served_model_names"] == ["tiny"]
    assert (ready["start"], ready["timeout"]) == ("cold", 2700), "no start of these settings served on the image's caches yet"
    assert run(host, plan, step="keep")["stamped"] and pathlib.Path(plan["cold_start"]["stamp"]).is_file()
    assert not run(host, plan, step="keep")["stamped"]
    assert (gate()["start"], gate()["timeout"]) == ("warm", 1200)
    assert (gate(cold=True)["start"], gate(cold=True)["timeout"]) == ("cold", 2700), "a cluster whose worker lacks its stamp"
    set_state(host, containers={plan["container"]: exited_with_a_bad_flag()},
              logs={plan["container"]: (RECORDED / "docker-logs-bad-flag.stderr").read_text()})
    failed = gate()
    assert failed["failed"] and failed["msg"] == "vLLM health gate failed: the container is exited (exit code 2)"
    assert failed["log_errors"] == ["vllm: error: unrecognized arguments: --no-such-flag"]


def test_a_flag_left_by_an_interrupted_run_is_made_fresh_when_raised_again(tmp_path):
    flag = tmp_path / "vllm-maintenance"
    flag.write_text("tiny\n")
    os.utime(flag, (1_000_000, 1_000_000))
    assert _serving_unit.raise_flag(str(flag), "tiny", check_mode=True) == {"changed": False}
    assert flag.stat().st_mtime == 1_000_000
    assert _serving_unit.raise_flag(str(flag), "tiny", check_mode=False) == {"changed": False}
    assert time.time() - flag.stat().st_mtime < 60


def test_a_held_relaunch_keeps_the_settings_before_until_judged_and_roll_back_serves_them_again(host, vllm):
    good, good_env = planned(host, port=vllm.server_port)
    vllm.serves[KEY] = ["tiny"]
    set_state(host, flag=str(host / "run" / "vllm-maintenance"), starts=[(good["container"], running(good))])
    run(host, good, good_env)
    run(host, good, step="keep")
    kept = files(host)
    changed, changed_env = planned(host, port=vllm.server_port, max_num_seqs=8)
    set_state(host, flag=str(host / "run" / "vllm-maintenance"), enabled=[],
              starts=[(changed["container"], running(changed)), (good["container"], running(good))])
    run(host, changed, changed_env)
    held = relaunch(host, changed, keep_last_good=False)
    assert held["gate"]["ok"] and held["kept"] == [], "a held relaunch keeps nothing"
    assert host_state(host)["enabled"] == [changed["unit"]], "the held unit still starts at boot"
    marked = {path for path in files(host) if path.endswith(".unjudged.json")}
    assert marked == {"config/last-good/tiny.unjudged.json"}, "the held settings are marked until judged"
    assert {path: kept[path] for path in kept if "last-good" in path} == {
        path: text for path, text in files(host).items() if "last-good" in path and path not in marked}
    assert run(host, changed, step="roll_back", check_mode=True)["changed"], "check mode: last good settings to go back to"
    forget_calls(host)
    rolled = run(host, changed, step="roll_back")
    assert rolled["served"] and rolled["msg"] == "The last good settings were relaunched and serve again." and not rolled.get("failed")
    assert files(host) == kept, "the settings before the change are back"
    assert [line for line in calls(host) if "start" in line] == [f"systemctl start --no-block {good['unit']}", "maintenance flag at start: tiny"]
    assert not (host / "run" / "vllm-maintenance").exists()


def test_a_rollout_stopped_after_a_held_relaunch_leaves_a_mark_the_next_run_reports_and_never_keeps(host, vllm):
    """Found in a reading: a rollout stopped (or its host lost) between the held relaunch and its verdict left the unit on
    unjudged settings, and the next site.yml, seeing no drift, kept them as the last good ones."""
    good, good_env = planned(host, port=vllm.server_port)
    vllm.serves[KEY] = ["tiny"]
    set_state(host, flag=str(host / "run" / "vllm-maintenance"), starts=[(good["container"], running(good))])
    run(host, good, good_env)
    run(host, good, step="keep")
    before = {path: text for path, text in files(host).items() if "last-good" in path}
    changed, changed_env = planned(host, port=vllm.server_port, max_num_seqs=8)
    set_state(host, flag=str(host / "run" / "vllm-maintenance"), starts=[(changed["container"], running(changed))])
    run(host, changed, changed_env)
    assert relaunch(host, changed, keep_last_good=False)["gate"]["ok"]
    mark = json.loads((host / "config" / "last-good" / "tiny.unjudged.json").read_text())
    assert mark["config_hash"] == changed["config_hash"] and isinstance(mark["since"], int)
    assert stat.S_IMODE((host / "config" / "last-good" / "tiny.unjudged.json").stat().st_mode) == 0o600
    for check_mode in (True, False):
        nexts = run(host, changed, changed_env, check_mode=check_mode)
        assert nexts["drift"] == [] and nexts["kept"] == [], "settings nobody judged are never kept as the last good ones"
        assert nexts["unjudged"].startswith("tiny runs settings relaunched at ") and "never judged" in nexts["unjudged"]
        assert any("never judged" in str(warning) for warning in nexts["warnings"]), nexts["warnings"]
    assert {path: text for path, text in files(host).items() if "last-good" in path and "unjudged" not in path} == before
    # The inventory moved on meanwhile (another setting): the relaunch that follows keeps, and that clears the mark.
    other, other_env = planned(host, port=vllm.server_port, max_num_seqs=4)
    drifted = run(host, other, other_env)
    assert drifted["drift"] and "its relaunch now keeps" in drifted["unjudged"] and drifted["unjudged"].startswith("tiny ran ")
    assert run(host, changed, step="keep")["changed"]
    assert not (host / "config" / "last-good" / "tiny.unjudged.json").exists()
    assert run(host, changed, changed_env)["unjudged"] is None


@pytest.mark.parametrize("damage", ["", "not json", "[]", '{"since": "yesterday", "config_hash": 7}'])
def test_a_mark_that_cannot_be_read_still_marks_and_a_restore_clears_it(host, damage):
    """A cluster's rank is marked by step hold on every node (the cluster role, before a rollout's relaunch); whatever
    the mark holds, it marks. A restore (the rollback to the settings before) clears it."""
    plan, env_file = planned(host)
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan)})
    run(host, plan, env_file)
    run(host, plan, step="keep")
    assert run(host, plan, step="hold", check_mode=True)["changed"] and not (host / "config" / "last-good" / "tiny.unjudged.json").exists()
    assert run(host, plan, step="hold")["changed"]
    (host / "config" / "last-good" / "tiny.unjudged.json").write_text(damage)
    found = run(host, plan, env_file)
    assert "at an unknown time" in found["unjudged"] and found["kept"] == []
    assert run(host, plan, step="restore", check_mode=True)["changed"]
    assert (host / "config" / "last-good" / "tiny.unjudged.json").exists(), "check mode removes nothing"
    assert run(host, plan, step="restore")["restored"]
    assert run(host, plan, env_file)["unjudged"] is None


def test_a_restore_after_a_refused_admission_keeps_the_mark_of_the_settings_still_running(host):
    """A cluster's relaunch refused by another node's admission stops nothing: its last good files go back, and the
    settings a rollout marked as not judged still run, so their mark stays (the next run reports them, never keeps them)."""
    plan, env_file = planned(host)
    set_state(host, units=active(plan["unit"]), containers={plan["container"]: running(plan)})
    run(host, plan, env_file)
    run(host, plan, step="keep")
    run(host, plan, step="hold")
    restored = run(host, plan, step="restore", keep_unjudged_mark=True)
    assert restored["restored"] and not restored["changed"], "the files were the last good ones already"
    assert (host / "config" / "last-good" / "tiny.unjudged.json").exists()
    assert "never judged" in run(host, plan, env_file)["unjudged"]


def test_roll_back_without_last_good_settings_fails_with_the_unit_stopped(host, vllm):
    plan, env_file = planned(host, port=vllm.server_port)
    set_state(host, flag=str(host / "run" / "vllm-maintenance"), starts=[(plan["container"], running(plan))])
    run(host, plan, env_file, check_mode=True)
    assert not run(host, plan, step="roll_back", check_mode=True)["changed"]
    rolled = run(host, plan, step="roll_back")
    assert rolled["failed"] and not rolled["served"]
    assert rolled["msg"] == "There were no last good settings to roll back to; the instance is stopped."


def test_roll_back_is_refused_for_a_cluster_rank(host):
    plan, _env_file = planned(host)
    result = run(host, {**plan, "cluster": rank_plan(0)["cluster"]}, step="roll_back")
    assert result["failed"] and "only a single instance is rolled back alone" in result["msg"]


@pytest.mark.parametrize("stamp", ["/etc/passwd", "/var/cache/x/jit/" + "a" * 16 + "/warm/../../../../etc/cron.d/x",
                                   "relative/jit/" + "a" * 16 + "/warm/" + "b" * 16])
def test_a_plan_whose_warm_stamp_is_anywhere_else_is_refused_before_root_writes_it(host, stamp):
    plan, env_file = planned(host)
    plan["cold_start"] = {**plan["cold_start"], "stamp": stamp}
    result = run(host, plan, env_file)
    assert result["failed"] and "cold_start (its timeout, restarts, restart window and the warm stamp" in result["msg"]
    assert not (host / "config" / "tiny.env").exists()
