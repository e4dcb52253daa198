"""What the benchmarks share: their command line; for those that need a real vLLM, the lab's tiny model served by the CPU build on
this machine's Docker, on loopback only and with vLLM's usage reports off, and a module of the collection run as Ansible runs it (its
file, the arguments on stdin). Imported by the scripts beside it.

Each script that imports it takes --print-commands: it prints every command a run starts, in order (a module run as its
interpreter, file and the arguments it reads on stdin), and starts none; tests/unit/test_benchmarks.py checks them
against the collection's modules."""

import argparse
import json
import os
import pathlib
import secrets
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The collection's own code, as the scripts beside this one import it.
sys.path.insert(0, str(ROOT / ".cache" / "collections"))
DOCKER = "/usr/bin/docker"
PORT = 18031
NAME = "sparkfleet-bench-vllm"
REMOVE_COMMAND = [DOCKER, "rm", "-f", NAME]


def command_line(doc, argv, runs_help, print_help="print the commands a run starts, in order, and start none", default_runs=3):
    """Every benchmark's options, ``runs`` (at least 1) and ``print_commands``; its docstring is the help's epilog."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0], epilog=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=default_runs, help=f"{runs_help} (default {default_runs})")
    parser.add_argument("--print-commands", action="store_true", help=print_help)
    arguments = parser.parse_args(argv)
    if arguments.runs < 1:
        parser.error(f"--runs {arguments.runs}: give at least 1")
    return arguments


def benchmark_setup(doc, default_runs, argv=None):
    """The command line's options (``runs``, ``print_commands``), the lab's image and model, and a fresh key for the endpoint."""
    arguments = command_line(doc, argv, "runs of each case", default_runs=default_runs)
    image, model = lab_vllm()
    return arguments, image, model, secrets.token_urlsafe(24)


def lab_vllm():
    """The lab's vLLM image and tiny model, from the environment ensure_serving_lab sets."""
    image, model = os.environ.get("SPARKFLEET_VLLM_IMAGE_LOCAL"), os.environ.get("SPARKFLEET_TINY_MODEL")
    if not image or not model:
        raise SystemExit("SPARKFLEET_VLLM_IMAGE_LOCAL and SPARKFLEET_TINY_MODEL are empty; run through scripts/lib/common.sh's "
                         "ensure_all and ensure_serving_lab (see the script's docstring)")
    return image, model


def serve_command(image, model, key, extra=()):
    """The tiny model as NAME on 127.0.0.1:PORT, as the lab's cpu_lab profile starts it: on the CPU backend
    --gpu-memory-utilization is the share of the machine's memory vLLM reserves, and at its default (0.92) a start
    beside the lab hosts or the suite's lanes is refused."""
    return [DOCKER, "run", "-d", "--name", NAME, "-p", f"127.0.0.1:{PORT}:8000", "-v", f"{model}:/models/tiny:ro",
            "-e", "VLLM_ENABLE_V1_MULTIPROCESSING=0", "-e", "VLLM_NO_USAGE_STATS=1", "-e", "DO_NOT_TRACK=1",
            image, "/models/tiny", "--served-model-name", "tiny", "--dtype", "float32", "--gpu-memory-utilization", "0.1",
            "--enforce-eager", "--num-gpu-blocks-override", "32", "--max-model-len", "2048", "--api-key", key, *extra]


def serve(image, model, key, extra=()):
    """Start the tiny model (a container of that name left by an earlier run goes first)."""
    remove()
    subprocess.run(serve_command(image, model, key, extra), check=True, capture_output=True)


def remove():
    subprocess.run(REMOVE_COMMAND, capture_output=True, check=False)


def module_command(name, arguments):
    """(argv, stdin) of one of the collection's modules run as Ansible runs it: its file, the arguments on stdin."""
    return [sys.executable, str(ROOT / "plugins" / "modules" / f"{name}.py")], json.dumps({"ANSIBLE_MODULE_ARGS": arguments})


def print_commands(commands):
    """Each (argv, stdin or None) as one shell line."""
    for argv, stdin in commands:
        print(shlex.join(argv) + (f" <<< {shlex.quote(stdin)}" if stdin is not None else ""))


def run_module(name, arguments):
    """One of the collection's modules run on this machine; its result."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".cache" / "collections")}
    argv, stdin = module_command(name, arguments)
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, check=False)
    try:
        return json.loads(done.stdout)
    except ValueError as error:
        raise SystemExit(f"{name} printed no result: {done.stdout[-2000:]} {done.stderr[-2000:]}") from error
