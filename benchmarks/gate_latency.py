"""The health gate's latency against the real CPU vLLM: from the container's exit to the module's
failure (issue 21's goal: at most 3 s) and from the server's first good answer to the module's
success (goal: at most 1 s), at the gate's default poll interval and at a shorter one.

Needs the lab's environment (Docker, the venv, the lab vLLM image and tiny model):
  bash -c 'source scripts/lib/common.sh; ensure_all; ensure_serving_lab; python3 benchmarks/gate_latency.py'
Runs vllm_health as Ansible runs a module (its file, the arguments on stdin) on this machine,
against containers it starts on this machine's Docker (loopback only) and removes by the names it
gave them. The first good answer is found by a prober asking /v1/models every 50 ms beside the
gate. Prints a Markdown table; each figure is the median of the runs.
"""

import datetime
import http.client
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request

from lab_vllm import DOCKER, NAME, PORT, REMOVE_COMMAND, benchmark_setup, module_command, print_commands, remove, run_module, serve, serve_command

INTERVALS = (2.0, 0.5)
# vLLM refuses an unknown flag at once: a container that exits.
EXITING = ["--no-such-flag"]
FINISHED_AT_COMMAND = [DOCKER, "inspect", "--format", "{{.State.FinishedAt}}", NAME]


def gate_arguments(key, interval):
    return {"url": f"http://127.0.0.1:{PORT}", "api_key": key, "served_model_names": ["tiny"], "container": NAME, "timeout": 600, "interval": interval}


def planned_commands(image, model, key, runs):
    """Every command a run starts, in order: (argv, stdin or None)."""
    commands = []
    for interval in INTERVALS:
        health = module_command("vllm_health", gate_arguments(key, interval))
        exiting = [(REMOVE_COMMAND, None), (serve_command(image, model, key, EXITING), None), health, (FINISHED_AT_COMMAND, None)]
        serving = [(REMOVE_COMMAND, None), (serve_command(image, model, key), None), health]
        commands += exiting * runs + serving * runs
    return [*commands, (REMOVE_COMMAND, None)]


def gate(key, interval):
    """Run vllm_health until it decides; (monotonic and wall time it returned, its result)."""
    result = run_module("vllm_health", gate_arguments(key, interval))
    return time.monotonic(), time.time(), result


def exit_latency(image, model, key, interval):
    """Seconds from the container's exit (Docker's FinishedAt) to the gate's failure."""
    serve(image, model, key, EXITING)
    _returned, wall, result = gate(key, interval)
    if not result.get("failed"):
        raise SystemExit(f"the gate passed a container that exits: {result}")
    finished = subprocess.run(FINISHED_AT_COMMAND, capture_output=True, text=True, check=True).stdout
    exited = datetime.datetime.fromisoformat(finished.strip()[:26].rstrip("Z") + "+00:00").timestamp()
    return wall - exited


def first_answer(key, found, stop):
    """Ask /v1/models every 50 ms until it lists tiny; the monotonic time it first did."""
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/models", headers={"Authorization": f"Bearer {key}"})
    while not stop.is_set():
        try:
            with urllib.request.urlopen(request, timeout=1) as reply:
                if "tiny" in reply.read().decode():
                    found.append(time.monotonic())
                    return
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            pass
        time.sleep(0.05)


def ready_latency(image, model, key, interval):
    """Seconds from the server's first good answer to the gate's success."""
    serve(image, model, key)
    found, stop = [], threading.Event()
    prober = threading.Thread(target=first_answer, args=(key, found, stop), daemon=True)
    prober.start()
    try:
        returned, _wall, result = gate(key, interval)
    finally:
        stop.set()
        prober.join()
    if not result.get("ok") or not found:
        raise SystemExit(f"the gate did not pass a serving container: {result}")
    return returned - found[0]


def main(argv=None):
    arguments, image, model, key = benchmark_setup(__doc__, 3, argv)
    runs = arguments.runs
    if arguments.print_commands:
        print_commands(planned_commands(image, model, key, runs))
        return
    rows = []
    try:
        for interval in INTERVALS:
            exits = [exit_latency(image, model, key, interval) for _run in range(runs)]
            readies = [ready_latency(image, model, key, interval) for _run in range(runs)]
            rows.append((interval, statistics.median(exits), max(exits), statistics.median(readies), max(readies)))
    finally:
        remove()
    print(f"| poll interval s | exit -> failure s (median of {runs}) | worst | first good answer -> success s (median) | worst |")
    print("|---:|---:|---:|---:|---:|")
    for interval, exit_median, exit_worst, ready_median, ready_worst in rows:
        print(f"| {interval:g} | {exit_median:.2f} | {exit_worst:.2f} | {ready_median:.2f} | {ready_worst:.2f} |")
    print("\ngoals: exit -> failure at most 3 s, first good answer -> success at most 1 s")


if __name__ == "__main__":
    main()
