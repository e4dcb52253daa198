"""What the benchmarks that need a real vLLM share: the lab's tiny model served by the CPU build on
this machine's Docker, on loopback only and with vLLM's usage reports off, and a module of the collection run as Ansible runs it (its
file, the arguments on stdin). Imported by the scripts beside it."""

import argparse
import json
import os
import pathlib
import secrets
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The collection's own code, as the scripts beside this one import it.
sys.path.insert(0, str(ROOT / ".cache" / "collections"))
DOCKER = "/usr/bin/docker"
PORT = 18031
NAME = "sparkfleet-bench-vllm"


def benchmark_setup(doc, default_runs):
    """The runs asked for on the command line, the lab's image and model, and a fresh key for the endpoint."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, default=default_runs, help=f"runs of each case (default {default_runs})")
    image, model = lab_vllm()
    return parser.parse_args().runs, image, model, secrets.token_urlsafe(24)


def lab_vllm():
    """The lab's vLLM image and tiny model, from the environment ensure_serving_lab sets."""
    image, model = os.environ.get("SPARKFLEET_VLLM_IMAGE_LOCAL"), os.environ.get("SPARKFLEET_TINY_MODEL")
    if not image or not model:
        raise SystemExit("SPARKFLEET_VLLM_IMAGE_LOCAL and SPARKFLEET_TINY_MODEL are empty; run through scripts/lib/common.sh's "
                         "ensure_all and ensure_serving_lab (see the script's docstring)")
    return image, model


def serve(image, model, key, extra=()):
    """Start the tiny model as NAME on 127.0.0.1:PORT (a container of that name left by an earlier run goes first)."""
    remove()
    subprocess.run([DOCKER, "run", "-d", "--name", NAME, "-p", f"127.0.0.1:{PORT}:8000", "-v", f"{model}:/models/tiny:ro",
                    "-e", "VLLM_ENABLE_V1_MULTIPROCESSING=0", "-e", "VLLM_NO_USAGE_STATS=1", "-e", "DO_NOT_TRACK=1",
                    image, "/models/tiny", "--served-model-name", "tiny", "--dtype", "float32",
                    "--enforce-eager", "--num-gpu-blocks-override", "32", "--max-model-len", "2048", "--api-key", key, *extra],
                   check=True, capture_output=True)


def remove():
    subprocess.run([DOCKER, "rm", "-f", NAME], capture_output=True, check=False)


def run_module(name, arguments):
    """One of the collection's modules run on this machine; its result."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".cache" / "collections")}
    done = subprocess.run([sys.executable, str(ROOT / "plugins" / "modules" / f"{name}.py")],
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": arguments}), capture_output=True, text=True, env=env, check=False)
    try:
        return json.loads(done.stdout)
    except ValueError as error:
        raise SystemExit(f"{name} printed no result: {done.stdout[-2000:]} {done.stderr[-2000:]}") from error
