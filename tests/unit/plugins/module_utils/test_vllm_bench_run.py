"""vllm_bench's whole run (module_utils benchmark()) against real processes: a local HTTP stand-in of vLLM
(/v1/models, /metrics with speculative counters that move per request, /tokenize, /reset_prefix_cache,
/v1/chat/completions checking the key), a fake `vllm` that sends its prompts there and saves a result file
as `vllm bench serve` does (exiting 0 when every request failed), and a fake `docker` for the exec runner."""

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest
from plan_files import unit_plan, write_plan
from threaded_server import serving

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import benchmark

KEY = "k" * 40
OPTIONS = {
    "instance": None, "config_dir": "/etc/sparkfleet/vllm", "url": None, "api_key": None, "model": None, "timeout": 10,
    "label": "lab", "concurrencies": [1, 2], "prompts_per_concurrency": 2, "dataset": "natural", "documents_dir": None,
    "instruction": None, "input_tokens": 25, "output_tokens": 16, "prefix_cache": "disjoint", "allow_failures": False,
    "runner": "local", "container": None, "image": None, "models_dir": "/srv/models", "tokenizer": None, "results_dir": None,
    "require_idle": True,
}

FAKE_VLLM = """#!{python}
import argparse, json, os, sys, urllib.error, urllib.request
parser = argparse.ArgumentParser()
parser.add_argument("command", nargs=2)
for flag in ("--base-url", "--model", "--tokenizer", "--num-prompts", "--max-concurrency", "--result-dir", "--result-filename",
             "--dataset-name", "--dataset-path"):
    parser.add_argument(flag)
args, _rest = parser.parse_known_args()
if args.dataset_name == "custom":
    with open(args.dataset_path, encoding="utf-8") as handle:
        prompts = [json.loads(line)["prompt"] for line in handle]
    if len(prompts) != int(args.num_prompts):
        sys.exit(f"{{args.dataset_path}} holds {{len(prompts)}} prompts, not {{args.num_prompts}}")
completed, errors = 0, []
for _ in range(int(args.num_prompts)):
    request = urllib.request.Request(args.base_url + "/v1/chat/completions", data=b"{{}}", method="POST",
                                     headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}})
    try:
        urllib.request.urlopen(request, timeout=5).read()
        completed += 1
    except urllib.error.HTTPError as error:
        errors.append(error.reason)
if errors:
    print("Failed requests during benchmark run detected (capping to 10):")
    for index, reason in enumerate(errors):
        print(f"Error {{index}}: {{reason}}")
result = {{"completed": completed, "failed": len(errors), "mean_ttft_ms": 12.5, "median_ttft_ms": 11.0, "p99_ttft_ms": 20.0, "mean_tpot_ms": 3.25,
          "output_throughput": 100.0, "argv": sys.argv[1:]}}
# A result that loses requests, or a count, as the test asks through the environment.
result["completed"] -= int(os.environ.get("FAKE_BENCH_LOST", "0"))
for key in filter(None, os.environ.get("FAKE_BENCH_DROP", "").split(",")):
    del result[key]
os.makedirs(args.result_dir, exist_ok=True)
with open(os.path.join(args.result_dir, args.result_filename), "w", encoding="utf-8") as handle:
    handle.write(os.environ.get("FAKE_BENCH_TEXT") or json.dumps(result))
"""

FAKE_PYTHON = "#!/bin/sh\n{body}\n"

# A serving container that shares the host's network and keeps its files under ROOT.
FAKE_DOCKER = """#!{python}
import os, shutil, subprocess, sys
ROOT, VLLM = {root!r}, {vllm!r}
args = sys.argv[1:]
with open(os.path.join(ROOT, "docker-calls.jsonl"), "a", encoding="utf-8") as log:
    log.write(repr(args) + "\\n")
if args[:2] == ["container", "inspect"]:
    print('[{{"Name": "/' + args[2] + '", "State": {{"Running": true}}}}]')
elif args[0] == "cp" and ":" in args[2]:
    shutil.copytree(args[1], ROOT + args[2].split(":", 1)[1], dirs_exist_ok=True)
elif args[0] == "cp":
    shutil.copy(ROOT + args[1].split(":", 1)[1], args[2])
elif args[0] == "exec":
    rest = args[1:]
    if rest[0] == "--env":
        rest = rest[2:]
    command = rest[1:]
    if command[:2] == ["rm", "-rf"]:
        shutil.rmtree(ROOT + command[2], ignore_errors=True)
    elif command[0] == "python3":
        pass
    elif command[0] == "vllm":
        mapped = [ROOT + a if a.startswith("/tmp/sparkfleet-bench") else a for a in command[1:]]
        sys.exit(subprocess.run([VLLM, *mapped], check=False).returncode)
    else:
        sys.exit(f"fake docker exec: unexpected {{command}}")
else:
    sys.exit(f"fake docker: unexpected {{args}}")
"""


class VllmHandler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.server.requests.append(("GET", self.path, self.headers.get("Authorization")))
        if self.path == "/metrics":
            self.answer(200, self.server.metrics())
        elif self.path == "/v1/models":
            self.answer(200, json.dumps({"data": [{"id": "tiny"}]}))
        else:
            self.answer(404, '{"detail": "Not Found"}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests.append(("POST", self.path, self.headers.get("Authorization")))
        if self.path == "/tokenize":
            self.answer(200, json.dumps({"count": len(json.loads(body)["prompt"].split())}))
        elif self.path == "/reset_prefix_cache":
            self.answer(*self.server.reset)
        elif self.path == "/v1/chat/completions" and self.headers.get("Authorization") != "Bearer " + KEY:
            self.answer(401, '{"error": "Unauthorized"}')
        elif self.path == "/v1/chat/completions":
            with self.server.lock:
                # Each answer drafts three tokens once and has the first two accepted.
                self.server.counters = [n + step for n, step in zip(self.server.counters, (1, 3, 2, 1, 1, 0), strict=True)]
            self.answer(200, '{"choices": [{"message": {"content": "ok"}}]}')
        else:
            self.answer(404, '{"detail": "Not Found"}')

    def log_message(self, *_args):
        pass


class VllmStandIn(http.server.ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), VllmHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.requests, self.lock, self.running = [], threading.Lock(), 0
        self.counters = [0, 0, 0, 0, 0, 0]
        self.reset = (200, "")

    def metrics(self):
        drafts, draft_tokens, accepted, *per_position = self.counters
        lines = [f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {self.running}',
                 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0',
                 f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="tiny"}} {drafts}',
                 f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="tiny"}} {draft_tokens}',
                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="tiny"}} {accepted}']
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="{p}"}} {n}'
                  for p, n in enumerate(per_position)]
        return "\n".join(lines) + "\n"


@pytest.fixture
def vllm():
    with serving(VllmStandIn()) as server:
        yield server


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Host:
    """AnsibleModule.run_command and get_bin_path over a PATH of fake tools only, recording every command."""

    def __init__(self, bin_dir):
        self.bin_dir, self.commands = bin_dir, []

    def run_command(self, argv, environ_update=None):
        self.commands.append(list(argv))
        env = {**os.environ, "PATH": f"{self.bin_dir}{os.pathsep}/usr/bin:/bin", **(environ_update or {})}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=60)
        return done.returncode, done.stdout, done.stderr

    def which(self, name):
        return shutil.which(name, path=str(self.bin_dir))


@pytest.fixture
def local(tmp_path):
    """A host with a local vllm and, beside it, a python3 that has pandas."""
    bin_dir = tmp_path / "bin"
    executable(bin_dir / "vllm", FAKE_VLLM.format(python=sys.executable))
    executable(bin_dir / "python3", FAKE_PYTHON.format(body="exit 0"))
    return Host(bin_dir)


@pytest.fixture
def documents(tmp_path):
    """Twelve paragraphs of ten words: packed two to a chunk of 25 tokens, six disjoint prompts."""
    folder = tmp_path / "docs"
    (folder / "nested").mkdir(parents=True)
    paragraphs = [" ".join(f"w{p}x{i}" for i in range(10)) for p in range(12)]
    (folder / "a.md").write_text("\n\n".join(paragraphs[:6]) + "\n")
    (folder / "nested" / "b.txt").write_text("\n\n".join(paragraphs[6:]) + "\n")
    (folder / "ignored.json").write_text("{}")
    return str(folder)


def options(tmp_path, vllm, **changes):
    return {**OPTIONS, "url": vllm.url, "api_key": KEY, "model": "tiny", "results_dir": str(tmp_path / "results"), **changes}


def test_natural_runs_are_measured_and_recorded_with_the_acceptance_they_produced(tmp_path, vllm, local, documents):
    msg, result = benchmark(options(tmp_path, vllm, documents_dir=documents), local.run_command, local.which, False)
    assert msg is None, msg
    assert (result["ok"], result["changed"], result["runner"], result["reasons"]) == (True, True, "local", [])
    assert result["dataset"] == {"kind": "natural", "chunks": 6, "mean_prompt_tokens": {"1": 20.0, "2": 20.0}}
    assert [(run["concurrency"], run["prompts"], run["completed"], run["failed"]) for run in result["runs"]] == [(1, 2, 2, 0), (2, 4, 4, 0)]
    for run in result["runs"]:
        prompts = run["prompts"]
        assert (run["draft_tokens"], run["accepted_tokens"]) == (3 * prompts, 2 * prompts)
        assert run["acceptance"] == pytest.approx(2 / 3) and run["mean_acceptance_length"] == 3
        assert [p["rate"] for p in run["acceptance_per_position"]] == [1, 1, 0]
        assert run["acceptance_note"] is None and run["exit_code"] == 0
    workdir = tmp_path / "results" / "lab"
    assert run["result_file"] == str(workdir / "c2.json")
    assert sorted(p.name for p in workdir.iterdir()) == ["c1.json", "c2.json", "natural-c1.jsonl", "natural-c2.jsonl", "summary.json"]
    first_prompts = [json.loads(line)["prompt"] for line in (workdir / "natural-c1.jsonl").read_text().splitlines()]
    second_prompts = [json.loads(line)["prompt"] for line in (workdir / "natural-c2.jsonl").read_text().splitlines()]
    assert len(first_prompts) == 2 and len(second_prompts) == 4 and not set(first_prompts) & set(second_prompts)
    assert all(prompt.startswith("You are building a knowledge graph.") for prompt in first_prompts + second_prompts)
    summary = json.loads((workdir / "summary.json").read_text())
    assert (summary["label"], summary["model"], summary["ok"]) == ("lab", "tiny", True)
    assert result["table"].count("\n| ") == 3 and "| 66.7% |" in result["table"]
    assert result["table"].startswith("A user's latency: median TTFT 11.0 ms at one stream, then 3.25 ms per output token.")
    argv = json.loads((workdir / "c1.json").read_text())["argv"]
    assert argv[argv.index("--result-dir") + 1] == str(workdir) and argv[argv.index("--seed") + 1] == "1000"
    assert KEY not in " ".join(argv), "the key reaches vllm bench in its environment only"
    # Every call to the server carried the key, /metrics included.
    assert {auth for _method, path, auth in vllm.requests if path != "/v1/chat/completions"} == {"Bearer " + KEY}
    assert [c[:2] for c in local.commands] == [[str(local.bin_dir / "python3"), "-c"], ["vllm", "bench"], ["vllm", "bench"]]


def test_a_wrong_key_fails_the_run_although_vllm_bench_exits_zero(tmp_path, vllm, local):
    msg, result = benchmark(options(tmp_path, vllm, api_key="wrong-key", dataset="random", concurrencies=[1, 2]),
                            local.run_command, local.which, False)
    assert msg == ("benchmark not recorded: concurrency 1: no request succeeded (2 failed: Error 0: Unauthorized; Error 1: Unauthorized); "
                   "the run is not recorded")
    assert result["ok"] is False and len(result["runs"]) == 1, "the second concurrency is not run"
    run = result["runs"][0]
    assert (run["exit_code"], run["completed"], run["failed"]) == (0, 0, 2)
    workdir = tmp_path / "results" / "lab"
    assert not (workdir / "c1.json").exists() and run["result_file"] == str(workdir / "c1.failed.json")
    assert json.loads((workdir / "summary.json").read_text())["ok"] is False
    assert result["dataset"] == {"kind": "random"} and "wrong-key" not in json.dumps(result)


UNACCOUNTED_RUNS = {
    "lost": ({"FAKE_BENCH_LOST": "1"}, "concurrency 1: 2 prompts sent, 1 completed, 0 failed: 1 unaccounted for"),
    "no-failed": ({"FAKE_BENCH_DROP": "failed"}, "concurrency 1: 2 prompts sent, but the result file's failed missing"),
    "no-counts": ({"FAKE_BENCH_DROP": "completed,failed"}, "the result file's completed missing and failed missing"),
    "not-json": ({"FAKE_BENCH_TEXT": "Traceback"}, "concurrency 1: the result file does not hold a JSON object, so none of the 2"),
}


@pytest.mark.parametrize(("environ", "fragment"), UNACCOUNTED_RUNS.values(), ids=UNACCOUNTED_RUNS.keys())
def test_a_run_that_does_not_account_for_every_prompt_is_not_recorded(tmp_path, vllm, local, monkeypatch, environ, fragment):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    msg, result = benchmark(options(tmp_path, vllm, dataset="random", concurrencies=[1, 2], allow_failures=True),
                            local.run_command, local.which, False)
    assert msg.startswith("benchmark not recorded: ") and fragment in msg, msg
    assert result["ok"] is False and len(result["runs"]) == 1 and result["runs"][0]["reasons"] == result["reasons"]
    workdir = tmp_path / "results" / "lab"
    # Kept for diagnosis under a name no report picks up as a result.
    assert not (workdir / "c1.json").exists() and (workdir / "c1.failed.json").exists()
    assert "| 1 |" not in result["table"], "a run that does not account for its requests is not tabled"


def test_a_run_that_wrote_no_result_file_accounts_for_none_of_its_prompts(tmp_path, vllm, local):
    executable(local.bin_dir / "vllm", "#!/bin/sh\necho 'Error: the engine is gone' >&2\nexit 0\n")
    msg, result = benchmark(options(tmp_path, vllm, dataset="random", concurrencies=[2]), local.run_command, local.which, False)
    assert msg == ("benchmark not recorded: concurrency 2: vllm bench wrote no result file, so none of the 4 prompts sent is accounted "
                   "for (Error: the engine is gone)")
    assert result["runs"][0]["result_file"] is None


def test_a_runner_without_pandas_is_named_with_the_fix_before_any_load(tmp_path, vllm, local, documents):
    executable(local.bin_dir / "python3", FAKE_PYTHON.format(body="echo \"ModuleNotFoundError: No module named 'pandas'\" >&2; exit 1"))
    msg, result = benchmark(options(tmp_path, vllm, documents_dir=documents), local.run_command, local.which, False)
    assert msg.startswith("benchmark not recorded: runner local cannot import pandas, which vllm bench's custom dataset needs "
                          "(ModuleNotFoundError: No module named 'pandas'); build a bench image FROM the serving image's digest")
    assert result["runs"] == [] and not any(path == "/v1/chat/completions" for _m, path, _a in vllm.requests)


def test_too_few_documents_say_what_to_change(tmp_path, vllm, local, documents):
    msg, _result = benchmark(options(tmp_path, vllm, documents_dir=documents, prompts_per_concurrency=3), local.run_command, local.which, False)
    assert "the documents give 6 chunks, and 9 disjoint prompts are needed (3 + 6); add documents to documents_dir" in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    msg, _result = benchmark(options(tmp_path, vllm, documents_dir=str(empty)), local.run_command, local.which, False)
    assert msg == f"benchmark not recorded: documents_dir: {empty} holds no .md, .markdown or .txt document"


def test_a_busy_server_is_refused_before_anything_is_written(tmp_path, vllm, local):
    vllm.running = 1
    msg, result = benchmark(options(tmp_path, vllm, dataset="random"), local.run_command, local.which, False)
    assert "1 requests running and 0 waiting that are not ours" in msg and msg.endswith(", or set require_idle: false")
    assert result["changed"] is False and not (tmp_path / "results").exists()
    msg, _result = benchmark(options(tmp_path, vllm, dataset="random", concurrencies=[1], require_idle=False),
                             local.run_command, local.which, False)
    assert msg is None


@pytest.mark.parametrize("status", [404, 401])
def test_reset_without_development_routes_is_refused_before_anything_is_written(tmp_path, vllm, local, status):
    vllm.reset = (status, '{"detail": "Not Found"}')
    msg, result = benchmark(options(tmp_path, vllm, dataset="random", prefix_cache="reset"), local.run_command, local.which, False)
    assert f"/reset_prefix_cache answered HTTP {status}: prefix_cache: reset needs vLLM's development routes (VLLM_SERVER_DEV_MODE=1)" in msg
    assert result["changed"] is False and not (tmp_path / "results").exists() and local.commands == []


def test_reset_empties_the_prefix_cache_before_each_run(tmp_path, vllm, local):
    msg, _result = benchmark(options(tmp_path, vllm, dataset="random", prefix_cache="reset"), local.run_command, local.which, False)
    assert msg is None
    assert sum(path == "/reset_prefix_cache" for _m, path, _a in vllm.requests) == 3, "once up front, then before each of two runs"


def test_refusals_are_named_in_one_pass_and_check_mode_sends_nothing(tmp_path, vllm, local):
    msg, result = benchmark(options(tmp_path, vllm, label="../escape", concurrencies=[0], documents_dir="/nowhere"),
                            local.run_command, local.which, True)
    assert msg.startswith("vllm_bench refused: concurrencies[0]: 0 is out of range")
    assert "label: '../escape' must be a plain name" in msg and "documents_dir: /nowhere is not a folder on this host" in msg
    assert result == {"ok": False, "runs": [], "reasons": result["reasons"]} and len(result["reasons"]) == 3
    msg, result = benchmark(options(tmp_path, vllm, dataset="random"), local.run_command, local.which, True)
    assert msg is None and result == {"changed": False, "ok": True, "runner": "local", "runs": [], "reasons": ["check mode: no load sent"]}
    assert vllm.requests == [] and local.commands == []
    msg, result = benchmark(dict(OPTIONS, instance="missing", config_dir=str(tmp_path)), local.run_command, local.which, False)
    assert "missing.json does not exist" in msg and result == {"ok": False, "runs": [], "reasons": [msg]}


def test_exec_runs_in_the_serving_container_and_leaves_nothing_there(tmp_path, vllm, documents):
    root = tmp_path / "container"
    root.mkdir()
    image_vllm = executable(tmp_path / "image" / "vllm", FAKE_VLLM.format(python=sys.executable))
    host = Host(tmp_path / "bin")
    executable(host.bin_dir / "docker", FAKE_DOCKER.format(python=sys.executable, root=str(root), vllm=str(image_vllm)))
    config = tmp_path / "etc"
    write_plan(config, unit_plan(url=vllm.url, container_url=vllm.url, health_timeout=600))
    (config / "llm.env").write_text(f"VLLM_API_KEY={KEY}\n")
    params = dict(OPTIONS, instance="llm", config_dir=str(config), runner="auto", documents_dir=documents,
                  results_dir=str(tmp_path / "results"), concurrencies=[1])
    msg, result = benchmark(params, host.run_command, host.which, False)
    assert msg is None, msg
    assert result["runner"] == "exec" and (result["runs"][0]["completed"], result["runs"][0]["failed"]) == (2, 0)
    argv = json.loads((tmp_path / "results" / "lab" / "c1.json").read_text())["argv"]
    assert argv[argv.index("--tokenizer") + 1] == "/models/tiny", "the tokenizer as the serving container sees it"
    assert argv[argv.index("--result-dir") + 1] == str(root) + "/tmp/sparkfleet-bench"
    assert not (root / "tmp" / "sparkfleet-bench").exists(), "the datasets and results copied in are removed"
    docker = str(host.bin_dir / "docker")
    assert host.commands[0] == [docker, "container", "inspect", "vllm-llm"]
    assert host.commands[-1] == [docker, "exec", "vllm-llm", "rm", "-rf", "/tmp/sparkfleet-bench"]
