"""A frozen engine on the built-in lab, at the watchdog role's defaults: seconds from the freeze to the watchdog's first
failing sample, to its restart and to the instance serving again (issue 38's goal: serving again within 120 s); then a
saturating load on the same instance, and how many restarts the watchdog made under it (the goal: none).

The lab must be up and converged (scripts/lab) with the inventory's watchdog settings, which are the role's defaults. Run:
  bash -c 'source scripts/lib/common.sh; ensure_all; ensure_serving_lab; python3 benchmarks/frozen_engine.py'
The engine is frozen with SIGSTOP: its engine core where vLLM runs one (VLLM::EngineCore), else the server's own process
(the lab runs the CPU engine inside the server, VLLM_ENABLE_V1_MULTIPROCESSING=0, so /metrics stops answering too and
each sample waits for it as well as for the probe). Each restart spends one of the watchdog's budget (3 in 6 hours at the
defaults) and a start of the unit's bound on starts (3, the converging relaunch among them), so at most two runs on a
freshly converged lab. Every process it starts is stopped by its id; it prints a Markdown table. With --print-commands it
prints the commands it runs on the lab host (the waits repeat theirs), with the key and the engine's pid it reads there
as KEY and PID, and touches nothing.
"""

import argparse
import json
import pathlib
import shlex
import subprocess
import sys
import time

# The lab scenarios' reading of the watchdog's journal and their wait.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "molecule" / "shared"))
from watchdog_journal import journal_decisions, wait_for  # noqa: E402

HOST = "sparkfleet-lab-gx10-1"
UNIT = "sparkfleet-vllm-tiny.service"
CONTAINER = "vllm-tiny"
PORT = 8001
ENV_FILE = "/etc/sparkfleet/vllm/tiny.env"
# Longer than the watchdog's interval x (failures + 1) plus a cold start of the CPU engine beside a busy machine.
SERVE_TIMEOUT = 600
LOAD_CLIENTS = 4


def lab_command(command):
    return ["docker", "exec", HOST, "sh", "-c", command]


class LabHost:
    """The lab host as the scenarios' helpers read it: ``run(command).stdout``."""

    def run(self, command, timeout=60):
        return subprocess.run(lab_command(command), capture_output=True, text=True, timeout=timeout, check=False)


class RecordingHost:
    """A stand-in for the lab host that keeps each command it is given and answers nothing."""

    def __init__(self):
        self.commands = []

    def run(self, command, timeout=60):
        self.commands.append(lab_command(command))
        return subprocess.CompletedProcess(command, 0, "", "")


LAB = LabHost()
KEY_COMMAND = f"cat {ENV_FILE}"
PROCESSES_COMMAND = f"docker top {CONTAINER} -eo pid,args"


def signal_command(signal, pid):
    return f"kill -{signal} {pid}"


def on_host(command, timeout=60):
    result = LAB.run(command, timeout)
    return result.returncode, result.stdout


def api_key():
    _rc, text = on_host(KEY_COMMAND)
    keys = [line.partition("=")[2] for line in text.splitlines() if line.startswith("VLLM_API_KEY=")]
    if not keys:
        raise SystemExit(f"{HOST} has no key in {ENV_FILE}: bring the lab up with scripts/lab first")
    return keys[0]


def completion(key, tokens, timeout):
    body = json.dumps({"model": "tiny", "prompt": "one two three", "max_tokens": tokens})
    return (f"curl -s -m {timeout} -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{PORT}/v1/completions "
            f"-H 'Content-Type: application/json' -H {shlex.quote('Authorization: Bearer ' + key)} -d {shlex.quote(body)}")


def serves(key):
    return on_host(completion(key, 2, 10), timeout=30)[1].strip() == "200"


def decisions(since, host=LAB):
    """The watchdog's journal lines about the unit since ``since`` (the lab hosts share this machine's clock)."""
    return [decision for decision in journal_decisions(host, UNIT, since) if decision.get("unit") == UNIT]


def engine_pid():
    """(pid on the lab host, what it is): the engine core's process, or the server's own where the engine runs in it."""
    _rc, text = on_host(PROCESSES_COMMAND)
    rows = [line.split(None, 1) for line in text.splitlines()[1:] if line.strip()]
    for wanted, what in (("VLLM::EngineCore", "engine core"), ("vllm serve", "server with its engine")):
        found = [int(pid) for pid, args in rows if wanted in args]
        if found:
            return found[0], what
    raise SystemExit(f"no vLLM process in {CONTAINER} on {HOST}: is the lab serving?")


def settled(key, since):
    """Serving, and the watchdog's latest word on the unit says so: the next fault starts from a watched, serving unit."""
    latest = decisions(since)
    # "serving": the line of the undrain at the gateway that follows a restart's serving verdict.
    return serves(key) and latest and latest[-1]["verdict"] in ("answers", "progress", "serving")


def frozen_run(key):
    pid, what = engine_pid()
    frozen = time.time()
    rc, _out = on_host(signal_command("STOP", pid))
    if rc != 0:
        raise SystemExit(f"could not freeze {what} {pid}")
    try:
        restart = wait_for(lambda: [d for d in decisions(frozen) if d["action"] != "none"], SERVE_TIMEOUT, "the watchdog's restart")[0]
    finally:
        on_host(signal_command("CONT", pid) + " 2>/dev/null")
    first = next(d for d in decisions(frozen) if "failing sample" in d.get("why", ""))
    wait_for(lambda: serves(key), SERVE_TIMEOUT, "the instance to serve again")
    serving = time.time() - frozen
    wait_for(lambda: settled(key, restart["time"]), SERVE_TIMEOUT, "the watchdog to see it serve")
    return {"what": what, "first": first["time"] - frozen, "action": restart["time"] - frozen, "serving": serving,
            "verdict": f"{restart['verdict']}, {restart['action']}"}


def load_loop(key, seconds):
    return f"end=$(($(date +%s)+{seconds})); while [ $(date +%s) -lt $end ]; do {completion(key, 256, 120)} >/dev/null; done"


def load_run(key, seconds):
    """LOAD_CLIENTS clients asking for long completions back to back for ``seconds``; the watchdog's decisions meanwhile."""
    started = time.time()
    clients = [subprocess.Popen(lab_command(load_loop(key, seconds)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _client in range(LOAD_CLIENTS)]
    try:
        for client in clients:
            client.wait(timeout=seconds + 180)
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
    seen = decisions(started)
    return {"restarts": sum(1 for d in seen if d["action"] != "none"), "verdicts": sorted({d["verdict"] for d in seen}) or ["(no change)"]}


def planned_commands(arguments, key="KEY", pid="PID"):
    """What a run runs on the lab host, in order, each once where a wait repeats it: argv lists."""
    journal = RecordingHost()
    decisions(0, journal)
    read_journal = journal.commands[0]
    frozen_run_commands = [lab_command(PROCESSES_COMMAND), lab_command(signal_command("STOP", pid)), read_journal,
                           lab_command(signal_command("CONT", pid) + " 2>/dev/null"), lab_command(completion(key, 2, 10)), read_journal]
    return [lab_command(KEY_COMMAND), lab_command(completion(key, 2, 10)), read_journal, *frozen_run_commands * arguments.runs,
            *[lab_command(load_loop(key, arguments.load_seconds))] * LOAD_CLIENTS, read_journal]


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1, choices=(1, 2),
                        help="frozen-engine runs (default 1; each spends a start of the unit's bound, 3 with the relaunch that converged the lab)")
    parser.add_argument("--load-seconds", type=int, default=150, help="seconds of saturating load (default 150: five samples at the defaults)")
    parser.add_argument("--print-commands", action="store_true", help="print the commands a run runs on the lab host, and run none")
    arguments = parser.parse_args(argv)
    if arguments.load_seconds < 1:
        parser.error(f"--load-seconds {arguments.load_seconds}: give at least 1")
    return arguments


def main(argv=None):
    arguments = parse_arguments(argv)
    if arguments.print_commands:
        for command in planned_commands(arguments):
            print(shlex.join(command))
        return
    try:
        measure(arguments)
    except AssertionError as error:
        raise SystemExit(str(error)) from None


def measure(arguments):
    key = api_key()
    wait_for(lambda: settled(key, 0), SERVE_TIMEOUT, "the lab's instance to serve, watched")
    runs = [frozen_run(key) for _run in range(arguments.runs)]
    load = load_run(key, arguments.load_seconds)
    print("| run | frozen | first failing sample s | watchdog's action s | serving again s | verdict, action |")
    print("|---:|---|---:|---:|---:|---|")
    for number, run in enumerate(runs, 1):
        print(f"| {number} | {run['what']} | {run['first']:.1f} | {run['action']:.1f} | {run['serving']:.1f} | {run['verdict']} |")
    print(f"\ngoal: serving again within 120 s of the freeze: {'met' if all(run['serving'] <= 120 for run in runs) else 'missed'}")
    print(f"saturating load ({LOAD_CLIENTS} clients, {arguments.load_seconds} s): {load['restarts']} restarts (goal: none); "
          f"the watchdog's verdicts: {', '.join(load['verdicts'])}")


if __name__ == "__main__":
    main()
