"""The soak on the lab host: playbooks/soak.yml against the real CPU vLLM of instance "first".

One short soak that passes, and one during which the engine gets the SIGTERM earlyoom sends (seed 000
has earlyoom prefer vLLM) to the container's largest process, with no watchdog on the host: the unit
restarts it by itself (Restart=always: vLLM's clean exit after a SIGTERM would leave an on-failure unit
down), and the soak must FAIL naming the restart and the load it lost. Both write their report on the controller. Each soak is kept short for the suite's
budget (about two and a half minutes together); the instance serves again at the end.
"""

import json
import threading
import time

import pytest
from serving_lab import KEY, SERVE, engine_processes, status
from site_runner import docker_host, playbook

PORT = 8001
# A round is dominated by vllm bench's own start (about 10 s here), so a few rounds fit in a minute.
SMALL = {"soak_instance": "first", "soak_concurrency": 2, "soak_prompts_per_concurrency": 2, "soak_sample_interval": 5,
         "soak_input_tokens": 128, "soak_output_tokens": 32, "soak_drain_timeout": 60}


@pytest.fixture(scope="module")
def serve():
    return docker_host(SERVE)


def wait_serving(host, seconds=300):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and status(host, PORT, key=KEY) != "200":
        time.sleep(3)
    return status(host, PORT, key=KEY) == "200"


def report(tmp_path, label):
    folder = tmp_path / SERVE / label
    assert (folder / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((folder / "report.json").read_text()), (folder / "report.md").read_text()


def test_a_quiet_soak_passes(serve, tmp_path):
    assert wait_serving(serve), "instance first is not serving before the soak"
    started = time.monotonic()
    result = playbook("soak.yml", "-e", json.dumps({**SMALL, "soak_duration": 60, "soak_label": "lab-quiet", "soak_report_dir": str(tmp_path)}))
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "SOAK PASS on " + SERVE in result.stdout
    found, markdown = report(tmp_path, "lab-quiet")
    assert found["passed"] is True and found["reasons"] == []
    counts, summary = found["counts"], found["summary"]
    assert counts["rounds"] >= 1 and counts["completed_requests"] >= 4 and counts["failed_requests"] == 0
    assert summary["samples"] >= 10 and summary["max_gap_s"] <= 15 and summary["probe_failures"] == 0
    assert 0 <= summary["max_kv_cache_usage"] < 0.8 and summary["min_mem_available_mib"] > 0
    assert found["restarts"]["changes"] == []
    assert markdown.startswith(f"# {SERVE} first: soak lab-quiet\n\n**SOAK PASS**")
    assert f"| samples that saw the load running | {summary['loaded_samples']} of {summary['gauged_samples']} | - |" in markdown
    assert serve.file("/var/lib/sparkfleet/soak/lab-quiet/soak.json").exists
    print(f"\nsoak.yml on the lab, 60 s at 2 streams, {elapsed:.0f} s in all:\n{markdown}")


def largest_engine_process(host, container):
    """The engine's process with the largest resident set, as earlyoom picks it (its PID on the lab host)."""
    return max(engine_processes(host, container), key=lambda process: process[1])[0]


def restarts(host):
    return int(host.check_output("systemctl show --property=NRestarts --value sparkfleet-vllm-first.service"))


def test_an_engine_terminated_as_earlyoom_does_mid_soak_fails_it_and_its_unit_alone_serves_it_again(serve, tmp_path):
    assert wait_serving(serve), "instance first is not serving before the soak"
    assert serve.run("systemctl cat sparkfleet-watchdog.service").rc != 0, "no watchdog here: the unit restarts alone"
    before, restarts_before = serve.check_output("docker inspect --format '{{.Id}}' vllm-first"), restarts(serve)
    since = serve.check_output("date '+%Y-%m-%d %H:%M:%S'")
    terminated = []

    def terminate():
        terminated.append(serve.run(f"kill -TERM {largest_engine_process(serve, 'vllm-first')}").rc)

    killer = threading.Timer(15, terminate)
    killer.start()
    try:
        result = playbook("soak.yml", "-e", json.dumps({**SMALL, "soak_duration": 40, "soak_label": "lab-killed",
                                                        "soak_report_dir": str(tmp_path)}))
    finally:
        killer.join()
        back = wait_serving(serve)
    assert terminated == [0], "the test could not signal the engine"
    # A failed task's message goes to stderr where the environment asks it to (molecule's verifier does).
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "SOAK FAIL on " + SERVE in output, output[-4000:]
    found, markdown = report(tmp_path, "lab-killed")
    assert found["passed"] is False and "**SOAK FAIL**" in markdown
    reasons = found["reasons"]
    restarted = [r for r in reasons if "sparkfleet-vllm-first.service restarted" in r or "container vllm-first was replaced" in r]
    lost = [r for r in reasons if "request(s) failed" in r or "did not finish" in r]
    assert restarted and lost, reasons
    for reason in reasons:
        assert f"- {reason}" in markdown
    exits = [line for line in serve.check_output(f"journalctl -u sparkfleet-vllm-first.service -o cat --since '{since}'").splitlines()
             if "Main process exited" in line or "Deactivated successfully" in line]
    print("\nsoak.yml on the lab with vllm-first's largest process sent SIGTERM 15 s in; the unit's exit: "
          f"{exits}; reasons:\n" + "\n".join(f"  {r}" for r in reasons))
    assert back, "instance first did not serve again after the SIGTERM"
    assert serve.check_output("docker inspect --format '{{.Id}}' vllm-first") != before
    assert restarts(serve) > restarts_before, "systemd restarted the unit by itself"
