"""The benchmark module's overhead: vllm_bench against the same vllm bench serve run directly
(issue 21's goal: within 3 %), on the real CPU vLLM serving the lab's tiny model.

Needs the lab's environment (Docker, the venv, the lab vLLM image and tiny model):
  bash -c 'source scripts/lib/common.sh; ensure_all; ensure_serving_lab; python3 benchmarks/bench_overhead.py'
Both run vllm bench inside the serving container (the exec runner), on random prompts of the same
shape and seed (the module seeds its first concurrency with 1000); the direct run is the argv the module's own bench_args builds, through docker exec.
The module adds what the figures need: the dataset and result files copied in and out, the
/metrics read before and after, the result parsed. Prints a Markdown table; each figure is the
median of the runs, alternating module and direct runs so drift on the machine hits both alike.
"""

import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request

from lab_vllm import DOCKER, NAME, PORT, REMOVE_COMMAND, benchmark_setup, module_command, print_commands, remove, run_module, serve, serve_command

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import bench_args

SHAPE = {"concurrency": 4, "prompts": 64, "input_tokens": 128, "output_tokens": 128}
DIRECT_RESULT = "/tmp/direct.json"
DIRECT_RESULT_COMMAND = [DOCKER, "exec", NAME, "cat", DIRECT_RESULT]


def module_arguments(key, results_dir):
    return {"url": f"http://127.0.0.1:{PORT}", "api_key": key, "model": "tiny", "tokenizer": "/models/tiny", "container": NAME, "runner": "exec",
            "dataset": "random", "concurrencies": [SHAPE["concurrency"]], "prompts_per_concurrency": SHAPE["prompts"],
            "input_tokens": SHAPE["input_tokens"], "output_tokens": SHAPE["output_tokens"], "label": "overhead", "results_dir": results_dir}


def direct_command():
    """vllm bench serve inside the container, as the module's own bench_args builds it for its first concurrency (seed 1000)."""
    folder, file_name = DIRECT_RESULT.rsplit("/", 1)
    args = bench_args(base_url="http://127.0.0.1:8000", model="tiny", tokenizer="/models/tiny", concurrency=SHAPE["concurrency"],
                      num_prompts=SHAPE["prompts"] * SHAPE["concurrency"], dataset="random", input_tokens=SHAPE["input_tokens"],
                      output_tokens=SHAPE["output_tokens"], dataset_path="", result_dir=folder, result_filename=file_name, seed=1000)
    return [DOCKER, "exec", "--env", "OPENAI_API_KEY", NAME, "vllm", *args]


def planned_commands(image, model, key, runs, results_dir):
    """Every command a run starts, in order: (argv, stdin or None); the key reaches the direct run in its environment."""
    direct = [(direct_command(), None), (DIRECT_RESULT_COMMAND, None)]
    measured = [module_command("vllm_bench", module_arguments(key, results_dir)), *direct]
    return [(REMOVE_COMMAND, None), (serve_command(image, model, key), None), *direct, *measured * runs, (REMOVE_COMMAND, None)]


def wait_served(key):
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/models", headers={"Authorization": f"Bearer {key}"})
    for _attempt in range(600):
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                if "tiny" in reply.read().decode():
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit("the tiny model did not serve within 10 minutes")


def through_module(key, results_dir):
    started = time.monotonic()
    result = run_module("vllm_bench", module_arguments(key, results_dir))
    seconds = time.monotonic() - started
    if result.get("failed"):
        raise SystemExit(f"vllm_bench failed: {result.get('msg')}")
    return seconds, result["runs"][0]["output_throughput"]


def directly(key):
    started = time.monotonic()
    subprocess.run(direct_command(), env={**os.environ, "OPENAI_API_KEY": key}, check=True, capture_output=True)
    seconds = time.monotonic() - started
    result = json.loads(subprocess.run(DIRECT_RESULT_COMMAND, capture_output=True, text=True, check=True).stdout)
    return seconds, result["output_throughput"]


def measure(image, model, key, runs, results_dir):
    """(module runs, direct runs), alternating, each (wall seconds, output tokens/s); the container is removed at the end."""
    module_runs, direct_runs = [], []
    try:
        serve(image, model, key)
        wait_served(key)
        directly(key)
        for _run in range(runs):
            module_runs.append(through_module(key, results_dir))
            direct_runs.append(directly(key))
    finally:
        remove()
    return module_runs, direct_runs


def main(argv=None):
    arguments, image, model, key = benchmark_setup(__doc__, 3, argv)
    runs = arguments.runs
    with tempfile.TemporaryDirectory() as results_dir:
        if arguments.print_commands:
            print_commands(planned_commands(image, model, key, runs, results_dir))
            return
        module_runs, direct_runs = measure(image, model, key, runs, results_dir)
    module_seconds, direct_seconds = (statistics.median(run[0] for run in module_runs), statistics.median(run[0] for run in direct_runs))
    print(f"| run (median of {runs}) | wall s | output tok/s |")
    print("|---|---:|---:|")
    print(f"| vllm_bench (exec runner) | {module_seconds:.2f} | {statistics.median(run[1] for run in module_runs):.1f} |")
    print(f"| vllm bench serve, docker exec | {direct_seconds:.2f} | {statistics.median(run[1] for run in direct_runs):.1f} |")
    print(f"\nmodule overhead: {(module_seconds / direct_seconds - 1) * 100:+.1f} % of the wall time (goal within 3 %)")


if __name__ == "__main__":
    main()
