"""The plan on the serving lab host: refusals before any change, drift caught and relaunched, the gate's fast failures.

Runs after the measurement tests and before test_serving.py on the same converged host; every
test leaves both instances serving the scenario's settings.
"""

import concurrent.futures
import datetime
import json
import os
import shlex
import subprocess
import time

import pytest
from serving_lab import KEY, SERVE, instances_json, serving_state, status
from site_runner import INVENTORY, ROOT, assert_refused, docker_host, module, site
from watchdog_journal import wait_for


@pytest.fixture(scope="module")
def serve():
    return docker_host(SERVE)


def planned(host, name):
    return json.loads(host.file(f"/etc/sparkfleet/vllm/{name}.json").content_string)


def running_hash(host, name):
    return host.check_output(f"docker inspect --format '{{{{index .Config.Labels \"sparkfleet.vllm.config-hash\"}}}}' vllm-{name}")


def bad_instance(index, **defect):
    spec = {"name": f"bad-{index}", "model": "/models/tiny-llama", "served_model_names": [f"bad-{index}"], "port": 9000 + index, "api_key": KEY}
    spec.update(defect)
    return spec


# One run, one defect per instance: the plan reports every problem at once, each naming its variable.
REFUSALS = [
    ({"env": {"VLLM_API_KEY": "x" * 20}}, "vllm_instances[0] (bad-0).env: VLLM_API_KEY is set by the role"),
    ({"api_key": "k" * 20 + "\nVLLM_HOST=evil"}, "vllm_instances[1] (bad-1).api_key: contains whitespace or a non-printable character"),
    ({"extra_args": ["--api_key=" + "s" * 20]}, "vllm_instances[2] (bad-2).extra_args: '--api_key=...' would set --api-key"),
    ({"extra_args": ["--ho", "0.0.0.0"]}, "vllm_instances[3] (bad-3).extra_args: '--ho' would set --host"),
    ({"bind_addresses": ["0.0.0.0"]}, "vllm_instances[4] (bad-4).bind_addresses: 0.0.0.0 publishes the endpoint on every interface"),
    ({"max_model_length": 4096}, "vllm_instances[5] (bad-5).max_model_length: unknown key; did you mean max_model_len?"),
    ({"served_model_names": ["tiny-first"]}, "served_model_names tiny-first used more than once"),
    ({"api_key": " " * 16}, "vllm_instances[7] (bad-7).api_key: contains whitespace"),
    ({"served_model_names": ["tiny $HOME"]}, "vllm_instances[8] (bad-8).served_model_names: 'tiny $HOME'"),
    ({"image": "172.17.0.1:5000/sparkfleet/vllm-cpu:moving"}, "vllm_instances[9] (bad-9).image: '172.17.0.1:5000/sparkfleet/vllm-cpu:moving' is not pinned"),
    ({"api_key": ""}, "vllm_instances[10] (bad-10).api_key: missing or shorter than 16"),
    ({"bind_addresses": ["127.0.0.1", "192.0.2.10"]}, "192.0.2.10 is not an address of this host"),
    ({"enable_auto_tool_choice": True}, "enable_auto_tool_choice is true without tool_call_parser"),
    ({"speculative": {"method": "ngram", "num_speculative_tokens": -1}}, "speculative.num_speculative_tokens: -1"),
]


def test_every_bad_setting_is_refused_at_once_and_nothing_changes(serve):
    before = serving_state(serve)
    first = json.loads(instances_json())["vllm_instances"][0]
    instances = [first] + [bad_instance(index, **defect) for index, (defect, _fragment) in enumerate(REFUSALS)]
    # The first instance keeps its place so the indexes above stay those of the defects.
    instances = instances[1:] + [first]
    result = site("--tags", "vllm", "-e", json.dumps({"vllm_instances": instances}))
    # 15 instances at 0.1 each, over the cpu_lab class's ceiling (docs/hardware/cpu_lab.md).
    assert_refused(result, "nothing was changed", "over this hardware class's cap of 0.9 (vllm_gmu_cap)",
                   *[fragment for _defect, fragment in REFUSALS])
    output = result.stdout + result.stderr
    assert "s" * 20 not in output and "VLLM_HOST=evil" not in output, "a refused key is never echoed"
    assert serving_state(serve) == before


def test_the_gate_fails_at_once_on_errors_waiting_cannot_fix(serve):
    for api_key, fragment in (("a" * 10 + "\n" + "b" * 10, "cannot be sent"), ("wrong-key-wrong-key-wrong", "refuses the API key")):
        result = module(SERVE, "vllm_health", {"url": "http://127.0.0.1:8001", "api_key": api_key, "served_model_names": ["tiny-first"],
                                               "timeout": 300})
        assert result.get("failed") and fragment in result["msg"], result
        assert result["elapsed"] < 30 and result["ok"] is False and result["reasons"]


def test_a_start_is_refused_right_before_it_with_the_memory_the_image_sees_and_the_strays_on_the_device_nodes(serve):
    """The start's admission on the real host and image, run as the unit's ExecStart runs it: the memory probe runs the
    pinned image in a throwaway container (the CPU build reports the kernel's available memory), and a process holding
    a device node named like the GPU's (a stand-in: the lab has no GPU) is named. A relaunch on the same plan asks the
    same before it stops anything, the memory credited with what the running engine gives back. Nothing is started or
    stopped: the running instance keeps its container."""
    before, containers = serving_state(serve), serve.check_output("docker ps --all --quiet --no-trunc")
    # A copy of first's plan file with a share the lab cannot grant.
    plan = {**planned(serve, "first"), "gpu_memory_utilization": 0.99}
    greedy = "/tmp/sparkfleet-test-greedy-first.json"
    serve.check_output(f"printf '%s' {shlex.quote(json.dumps(plan))} > {greedy}")
    serve.check_output("mknod -m 0666 /dev/nvidia9 c 1 3")
    holder = "sparkfleet-test-device-holder"
    try:
        serve.check_output(f"systemd-run --unit {holder} sh -c 'exec 3</dev/nvidia9; exec sleep infinity'")
        pid = wait_for_pid(serve, holder)
        result = serve.run(f"/usr/bin/python3 /usr/local/libexec/sparkfleet/sparkfleet_runtime.py start --plan {greedy}")
        relaunch = module(SERVE, "serving_unit", {"plan": plan, "step": "relaunch"})
    finally:
        serve.run(f"systemctl stop {holder}")
        serve.run(f"rm -f /dev/nvidia9 {greedy} /run/sparkfleet/admission/vllm-first.json")
    refusal = result.stderr.splitlines()[-1]
    print(f"\nthe admission refused: {refusal}")
    assert result.rc == 78 and refusal.startswith(f"start of first refused, not retried: first: pid {pid} (sleep) holds /dev/nvidia9"), result.stderr
    assert " | first: gpu_memory_utilization 0.99 asks for " in refusal
    assert "but the free memory its vLLM compares that with, MemAvailable (CPU build), is " in refusal
    print(f"the relaunch refused: {relaunch['msg']}")
    assert relaunch.get("failed") and relaunch["msg"].startswith(
        "vLLM instance first was not relaunched, nothing of it was stopped (its last good files are back in place): "
        f"first: pid {pid} (sleep) holds /dev/nvidia9"), relaunch
    assert " its running engine gives back at its stop, is " in relaunch["msg"]
    assert serving_state(serve) == before and status(serve, 8001, key=KEY) == "200"
    assert serve.check_output("docker ps --all --quiet --no-trunc") == containers, "the probe's throwaway container is gone"


def moment(docker_time):
    """Docker's RFC 3339 time with nanoseconds, to the microsecond."""
    whole, _dot, fraction = docker_time.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}")


def container_id(host, name):
    return host.run(f"docker inspect --format '{{{{.Id}}}}' vllm-{name}").stdout.strip()


def kill_once_started(host, name, given_up):
    """docker kill the instance's container once its unit runs one (labelled with a config hash, unlike one run by
    hand); its id (None when the run ended first)."""
    while not given_up():
        found = host.run(f"docker inspect --format '{{{{.Id}}}} {{{{.State.Status}}}} "
                         f"{{{{index .Config.Labels \"sparkfleet.vllm.config-hash\"}}}}' vllm-{name}").stdout.split()
        if len(found) == 3 and found[1] == "running":
            host.check_output(f"docker kill vllm-{name}")
            return found[0]
        time.sleep(0.5)
    return None


def wait_for_pid(host, unit):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pid = host.check_output(f"systemctl show --property=MainPID --value {unit}").strip()
        if pid not in ("", "0"):
            return int(pid)
        time.sleep(0.5)
    raise AssertionError(f"{unit} has no main process after 30 s")


def test_an_interrupted_run_and_a_container_replaced_by_hand_are_relaunched_behind_the_gate(serve):
    """Check mode names the drift of an interrupted run; one re-run relaunches the instance once, behind the gate, naming
    that drift and a container replaced by hand."""
    changed = instances_json(max_num_seqs=8)
    result = subprocess.run(["ansible-playbook", "-i", str(INVENTORY), str(ROOT / "molecule" / "vllm" / "interrupted_run.yml"), "-e", changed],
                            capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    plan = planned(serve, "second")
    old = running_hash(serve, "second")
    assert plan["config_hash"] != old, "the files hold the new settings, the old container still runs"
    assert status(serve, 8002, key=KEY) == "200"

    check = site("--check", "--diff", "--tags", "vllm", "-e", changed)
    assert check.returncode == 0, check.stdout[-3000:]
    assert f"second would be relaunched behind the health gate: its container runs config {old}, the plan is {plan['config_hash']}" in check.stdout
    assert "first would be relaunched" not in check.stdout
    assert running_hash(serve, "second") == old, "check mode changed nothing"

    # Then the operator stops the unit and runs the image by hand under the instance's name, holding its
    # port, with no labels. The drift is read from the unit and the container's labels, not from what the
    # container runs, so it idles instead of starting a second vLLM beside the lane's others.
    image = plan["run_image"]
    serve.check_output("systemctl stop sparkfleet-vllm-second.service")
    serve.check_output("docker rm --force vllm-second")
    serve.check_output(f"docker run -d --name vllm-second -p 127.0.0.1:8002:8000 --entrypoint sleep {image} infinity")

    # A stand-in for seed 002's GPU exporter, which the role's default pauses around each launch (the lab has no GPU to hold).
    exporter_started = "docker inspect --format '{{.State.Running}} {{.State.StartedAt}}' nvidia_gpu_exporter"
    serve.check_output(f"docker run -d --init --name nvidia_gpu_exporter --network none --entrypoint sleep {image} infinity")
    # The image's caches are wiped (every warm stamp removed), so the re-run's start is cold.
    warm = plan["cold_start"]["jit_dir"] + "/warm"
    serve.check_output(f"rm -f {shlex.quote(warm)}/*")
    try:
        before = serve.check_output(exporter_started)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(site, "--tags", "vllm", "-e", instances_json())
            # Seed 001's compile-then-exit, as the engine exiting on its own once it runs (the CPU build compiles nothing).
            killed = kill_once_started(serve, "second", running.done)
            rerun = running.result()
        after = serve.check_output(exporter_started)
    finally:
        serve.run("docker rm --force nvidia_gpu_exporter")
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    # The re-run names both drifts it relaunched for (check mode's wording is asserted above, for the interrupted run's).
    assert "second is relaunched behind the health gate" in rerun.stdout and "its unit is inactive" in rerun.stdout
    assert "its container runs config none" in rerun.stdout, "the container run by hand carries no config label"
    print(f"\ndrift: the re-run relaunched and gated second in {time.monotonic() - started:.0f} s, past its cold start's exit")
    assert killed and "(cold start, past the container is exited (exit code 137) after compiling)" in rerun.stdout, rerun.stdout[-3000:]
    assert container_id(serve, "second") != killed, "its unit started a new container after the exit"
    assert serve.file(planned(serve, "second")["cold_start"]["stamp"]).exists, "the start that served stamped its settings warm"
    assert module(SERVE, "vllm_health", {"instance": "second"})["start"] == "warm"
    assert after.startswith("true ") and after != before, "the exporter was stopped for the start and started again"
    instance_started = serve.check_output("docker inspect --format '{{.State.StartedAt}}' vllm-second")
    assert moment(after.split()[1]) > moment(instance_started), "the exporter started again only after the instance's start, once ready"
    # The unit's own start did it (the host runtime), as at every start: its journal tells each step in order.
    steps = ("page cache", "nvidia_gpu_exporter", "no stray", "memory:")

    def door_lines():
        found = [line for line in journal(serve, "second") if line.startswith(steps)]
        return found if found and found[-1] == "nvidia_gpu_exporter started again" else None

    # journald reads the unit's output stream on its own time: the last line may land a moment after the run ended.
    door = wait_for(door_lines, 60, "the start's steps in the unit's journal")
    assert door[-5:-1] == ["page cache kept (vllm_drop_caches is off for this host)", "nvidia_gpu_exporter stopped for the start",
                           "no stray holder of /dev/nvidia*", door[-2]] and door[-2].endswith(": admitted"), door
    assert door[-1] == "nvidia_gpu_exporter started again"
    assert running_hash(serve, "second") == planned(serve, "second")["config_hash"] != plan["config_hash"]
    assert serve.service("sparkfleet-vllm-second.service").is_running
    listed = json.loads(serve.check_output(f"curl -s -H 'Authorization: Bearer {KEY}' http://127.0.0.1:8002/v1/models"))
    assert [entry["id"] for entry in listed["data"]] == ["tiny-second"]


def journal(host, name):
    return host.check_output(f"journalctl --unit sparkfleet-vllm-{name}.service --no-pager --output cat").splitlines()


def test_a_start_the_memory_cannot_hold_fails_its_unit_once_with_the_figures_whoever_starts_it(serve):
    """A plan file whose share the memory cannot grant, started by systemd as a boot or the watchdog would: the unit's own
    admission refuses it in one journal line, exit 78, and systemd does not restart it. The second instance is
    relaunched on its plan again afterwards."""
    unit, plan_path = "sparkfleet-vllm-second.service", "/etc/sparkfleet/vllm/second.json"
    saved = serve.file(plan_path).content_string
    greedy = json.loads(saved)
    greedy["gpu_memory_utilization"] = 1.0
    try:
        # printf, not echo: the shell's echo would turn the JSON's \n escapes into line breaks.
        serve.check_output(f"printf '%s' {shlex.quote(json.dumps(greedy))} > {plan_path}")
        restarted = serve.run(f"systemctl restart {unit}")
        shown = serve.check_output(f"systemctl show --property=ActiveState,ExecMainStatus,NRestarts {unit}")
    finally:
        serve.check_output(f"printf '%s' {shlex.quote(saved)} > {plan_path}")
    assert restarted.rc != 0 and sorted(shown.split()) == ["ActiveState=failed", "ExecMainStatus=78", "NRestarts=0"], shown
    # journald reads the unit's output stream on its own time: the line may land a moment after the unit failed.
    refusal = wait_for(lambda: [line for line in journal(serve, "second") if line.startswith("start of second refused")], 60,
                       "the refusal in the unit's journal")
    assert "gpu_memory_utilization 1.0 asks for" in refusal[-1] and "lower it, or free the memory first" in refusal[-1]
    rerun = site("--tags", "vllm", "-e", instances_json())
    assert rerun.returncode == 0 and "second serves tiny-second" in rerun.stdout, rerun.stdout[-3000:]


def test_settings_match_the_plan_after_the_relaunches_and_a_second_run_keeps_the_containers(serve):
    before = serving_state(serve)
    result = site("--tags", "vllm", "-e", instances_json())
    assert result.returncode == 0 and "changed=0" in result.stdout.split("PLAY RECAP")[1], result.stdout[-3000:]
    assert serving_state(serve) == before, "a run with nothing to change restarted or rewrote something"
    for name in ("first", "second"):
        assert running_hash(serve, name) == planned(serve, name)["config_hash"]
        assert serve.file(f"/etc/sparkfleet/vllm/last-good/{name}.json").content_string == serve.file(f"/etc/sparkfleet/vllm/{name}.json").content_string
    unit = serve.file("/etc/systemd/system/sparkfleet-vllm-second.service").content_string
    window = planned(serve, "second")["start_bound"]["window"]
    assert f"StartLimitIntervalSec={window}" in unit and "StartLimitBurst=3" in unit and window >= 1800
    assert serve.check_output("systemctl show --property=StartLimitBurst --value sparkfleet-vllm-second.service") == "3"
    assert os.environ["SPARKFLEET_LAB_API_KEY"] not in unit
    # The readiness wait read the KV cache the engine sized and the warm stamp keeps it for the next starts.
    kept = json.loads(serve.file(planned(serve, "second")["cold_start"]["stamp"]).content_string)
    journal = serve.check_output("journalctl -u sparkfleet-vllm-second.service -o cat")
    print(f"\nsecond's warm stamp: {kept}; its readiness said: {[line for line in journal.splitlines() if 'KV cache' in line][-1:]}")
    assert kept["kv_cache_tokens"] > 0 and f"vllm-second: the KV cache holds {kept['kv_cache_tokens']:,} tokens" in journal
