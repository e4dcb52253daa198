# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmarks with ``vllm bench serve``: arguments, natural-text datasets, judging runs, the report table.

Private to the collection. Lessons encoded here, from seed 000: a run is judged by the
completed and failed counts in its saved JSON, never by the exit code (``vllm bench serve``
exits 0 when every request failed), and a run with no success is never recorded; every prompt
sent is accounted for (completed plus failed is the prompts sent, a missing count is no zero); random
tokens lie about speculative decoding, so the default dataset is natural text packed to a
token budget with the served model's own tokenizer, in disjoint sets per concurrency so the
prefix cache cannot reuse an earlier round.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import StateUnanswered, inspect_container, state_of
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import Range
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import is_whole
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import (
    discover_model,
    http,
    json_object,
    label_problems,
    reply_problem,
    resolve,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import error_lines
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import (
    acceptance,
    busy_problem,
    counter_regression,
    counters_delta,
    read_metrics,
    speculative_counters,
)

RUNNERS = ("auto", "exec", "container", "local")
DATASETS = ("natural", "random")
PREFIX_CACHE_MODES = ("disjoint", "reset")
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
DEFAULT_INSTRUCTION = (
    "You are building a knowledge graph. From the text below, extract every named entity (people, "
    "projects, tools, components, organisations, concepts) and every relationship between them. Return "
    "a bullet list of entities with their type, then a bullet list of relationships in the form "
    "entity -> relation -> entity. Use only what the text states."
)
FIGURES = (
    "completed",
    "failed",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "output_throughput",
    "total_input_tokens",
    "total_output_tokens",
    "duration",
)
# vllm bench prints a failed request's reason alone ("Error 0: Unauthorized"), a dead server as "Connection refused"
# and a runner without pandas as "No module named"; its Traceback line is kept, it says the run crashed.
OUTPUT_MARKERS = ("Error", "error:", "Traceback", "Unauthorized", "refused", "No module named")
DOCUMENT_PATTERNS = ("*.md", "*.markdown", "*.txt")

# The module passes AnsibleModule.run_command (argv, environ_update=... -> rc, stdout, stderr) and get_bin_path
# (a command's path on this host, or None); tests pass processes of their own.
RunCommand = t.Callable[..., tuple[int, str, str]]
Which = t.Callable[[str], "str | None"]


# A benchmark's sizes, bounded for the time and the memory a run takes; the sweep's sweep_* settings
# of the same names are bounded by these too.
CONCURRENCY = Range(1, 1024, "requests in flight at once; past 1024 the batch is bound by max_num_seqs, not the draft length",
                    whole=True)
BENCH_RANGES: dict[str, Range] = {
    "prompts_per_concurrency": Range(1, 256, "each is a full request; past 256 a run takes longer than it teaches", whole=True),
    "input_tokens": Range(1, 262_144, "the longest context a catalog model takes", whole=True, unit="tokens"),
    "output_tokens": Range(1, 32_768, "decode speed is measured over them; past 32768 a request outlasts the run", whole=True,
                           unit="tokens"),
}


class BenchFailure(Exception):
    """Why the benchmark stopped, worded for the operator."""


class Outcome(t.NamedTuple):
    """What vllm_bench answers: ``msg`` None on success, else the failure; ``result`` the return values."""

    msg: str | None
    result: dict[str, t.Any]


@dataclasses.dataclass(frozen=True)
class Job:
    """One benchmark as resolved from the options: the endpoint, the runner and where its files go."""

    params: t.Mapping[str, t.Any]
    endpoint: dict[str, t.Any]
    runner: str
    docker: str | None
    container: str | None
    vllm: str | None
    plan: dict[str, t.Any]
    workdir: str
    tokenizer: str
    run_command: RunCommand


# Where the measuring playbooks copy their natural text on a host, one folder per measurement's label.
DOCUMENTS_ROOT = "/var/lib/sparkfleet/bench-documents"


def documents_folder(label: str) -> str:
    """The host folder of a measurement's documents; the label is a plain name (the playbooks check it first)."""
    problems = label_problems("label", label)
    if problems:
        raise ValueError(problems[0])
    return f"{DOCUMENTS_ROOT}/{label}"


def validate(options: t.Mapping[str, t.Any]) -> list[str]:
    """Problems of a benchmark request, each naming the option to fix.

    ``options`` are the module's, with the runner picked, the container and image resolved, and
    ``docker`` and ``vllm`` the host's commands (None where absent).
    """
    errors = []
    concurrencies = options.get("concurrencies") or []
    if not isinstance(concurrencies, list) or not concurrencies:
        errors.append(f"concurrencies: {concurrencies!r} must be a non-empty list of {CONCURRENCY.span()}")
    else:
        problems = [p for index, c in enumerate(concurrencies) for p in CONCURRENCY.problems(f"concurrencies[{index}]", c, text=False)]
        errors += problems or ([f"concurrencies: {concurrencies!r} repeats a value"] if len(set(concurrencies)) != len(concurrencies) else [])
    for name, bound in BENCH_RANGES.items():
        errors += bound.problems(name, options.get(name), text=False)
    if options.get("dataset") == "natural" and not options.get("documents_dir"):
        errors.append("documents_dir: the natural dataset needs a folder of Markdown or text documents on the host")
    if options.get("runner") == "exec" and not options.get("container"):
        errors.append("container: runner exec needs the serving container's name (or give instance)")
    if options.get("runner") == "container" and not options.get("image"):
        errors.append("image: runner container needs the pinned image (or give instance to use the serving image)")
    errors += label_problems("label", options.get("label"))
    documents_dir = options.get("documents_dir")
    if documents_dir and options.get("dataset") == "natural" and not os.path.isdir(documents_dir):
        errors.append(f"documents_dir: {documents_dir} is not a folder on this host")
    if options.get("runner") in ("exec", "container") and not options.get("docker"):
        errors.append(f"runner: {options['runner']} needs the docker command on this host")
    if options.get("runner") == "local" and not options.get("vllm"):
        errors.append("runner: local needs the vllm command on this host's PATH; use runner: exec or container")
    return errors


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs: blocks separated by blank lines, whitespace at their ends trimmed."""
    paragraphs, block = [], []
    for line in text.splitlines():
        if line.strip():
            block.append(line.rstrip())
        elif block:
            paragraphs.append("\n".join(block).strip())
            block = []
    if block:
        paragraphs.append("\n".join(block).strip())
    return [p for p in paragraphs if p]


def pack_chunks(paragraphs: t.Sequence[tuple[str, int]], target_tokens: int) -> list[dict[str, t.Any]]:
    """Consecutive paragraphs packed into chunks of about ``target_tokens``.

    A chunk closes before the paragraph that would take it past the target. A paragraph longer
    than the target on its own (a big table or code block) is left out, and so is a closing
    remainder under half the target, so every prompt has the shape asked for.
    """
    chunks: list[dict[str, t.Any]] = []
    texts: list[str] = []
    tokens = 0
    for text, count in paragraphs:
        if count > target_tokens:
            continue
        if texts and tokens + count > target_tokens:
            chunks.append({"text": "\n\n".join(texts), "tokens": tokens})
            texts, tokens = [], 0
        texts.append(text)
        tokens += count
    if texts and tokens >= target_tokens / 2:
        chunks.append({"text": "\n\n".join(texts), "tokens": tokens})
    return chunks


def disjoint_sets(chunks: t.Sequence[dict[str, t.Any]], sizes: t.Sequence[int]) -> list[list[dict[str, t.Any]]]:
    """One set of chunks per size, no chunk in two sets, so no round reuses another's prefix."""
    needed = sum(sizes)
    if needed > len(chunks):
        raise ValueError(
            f"the documents give {len(chunks)} chunks, and {needed} disjoint prompts are needed "
            f"({' + '.join(str(s) for s in sizes)}); add documents to documents_dir, lower "
            "prompts_per_concurrency or input_tokens"
        )
    sets, start = [], 0
    for size in sizes:
        sets.append(list(chunks[start:start + size]))
        start += size
    return sets


def dataset_lines(instruction: str, chunks: t.Sequence[dict[str, t.Any]]) -> str:
    """JSONL for ``--dataset-name custom``: one {"prompt": ...} per chunk."""
    return "".join(json.dumps({"prompt": f"{instruction}\n\n{c['text']}"}) + "\n" for c in chunks)


def bench_args(
    *,
    base_url: str,
    model: str,
    tokenizer: str,
    concurrency: int,
    num_prompts: int,
    dataset: str,
    input_tokens: int,
    output_tokens: int,
    dataset_path: str,
    result_dir: str,
    result_filename: str,
    seed: int,
) -> list[str]:
    """Arguments after ``vllm`` for one run. The key travels in OPENAI_API_KEY, never in argv."""
    args = [
        "bench", "serve",
        "--backend", "openai-chat",
        "--endpoint", "/v1/chat/completions",
        "--base-url", base_url,
        "--model", model,
        "--tokenizer", tokenizer,
        "--max-concurrency", str(concurrency),
        "--num-prompts", str(num_prompts),
        "--percentile-metrics", PERCENTILE_METRICS,
        "--temperature", "0",
        "--seed", str(seed),
        "--save-result",
        "--result-dir", result_dir,
        "--result-filename", result_filename,
    ]
    if dataset == "random":
        # Random tokens never end on their own: --ignore-eos gives every answer its full length.
        args += ["--dataset-name", "random", "--random-input-len", str(input_tokens),
                 "--random-output-len", str(output_tokens), "--ignore-eos"]
    else:
        # Natural answers end naturally (seed 000: no --ignore-eos on the natural round).
        args += ["--dataset-name", "custom", "--dataset-path", dataset_path, "--custom-output-len", str(output_tokens)]
    return args


def output_errors(output: str | None) -> str:
    return "; ".join(error_lines(output, OUTPUT_MARKERS, limit=5, skip=(), engine_log=False)) or "no error line in its output"


def accounting(result: t.Mapping[str, t.Any], prompts: int) -> str | None:
    """Why the result does not account for every prompt sent, or None: its completed and failed must both be counts
    and add up to the prompts sent (a missing ``failed`` is not zero, it is a request nobody counted)."""
    shown = {key: result.get(key) for key in ("completed", "failed")}
    odd = [f"{key} {'missing' if key not in result else repr(value) + ' (not a count)'}" for key, value in shown.items()
           if not is_whole(value)]
    if odd:
        return (f"{prompts} prompts sent, but the result file's {' and '.join(odd)}: its requests are not accounted for, "
                "so it is not a whole vllm bench serve result")
    completed, failed = shown["completed"], shown["failed"]
    if completed + failed < prompts:
        return f"{prompts} prompts sent, {completed} completed, {failed} failed: {prompts - completed - failed} unaccounted for"
    if completed + failed > prompts:
        return (f"{prompts} prompts sent, {completed} completed, {failed} failed: {completed + failed - prompts} more than were sent, "
                "so the result file is not this run's")
    return None


def judge(result: t.Any, output: str, allow_failures: bool, prompts: int) -> list[str]:
    """Why a run that sent ``prompts`` requests cannot be recorded; empty when it can. Every request is accounted for:
    completed plus failed is the prompts sent, or the run is not recorded."""
    if result is None:
        return [f"vllm bench wrote no result file, so none of the {prompts} prompts sent is accounted for ({output_errors(output)})"]
    if not isinstance(result, dict):
        return [f"the result file does not hold a JSON object, so none of the {prompts} prompts sent is accounted for; "
                "it is not a vllm bench serve result"]
    problem = accounting(result, prompts)
    if problem:
        return [problem]
    completed, failed = result["completed"], result["failed"]
    if completed == 0:
        return [f"no request succeeded ({failed} failed: {output_errors(output)}); the run is not recorded"]
    if failed and not allow_failures:
        return [f"{failed} of {prompts} requests failed; set allow_failures to record such a run"]
    return []


def figures(result: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    found = {name: result.get(name) for name in FIGURES}
    found["bench_acceptance_rate"] = result.get("spec_decode_acceptance_rate")
    return found


def fmt(value: t.Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) else "-"


def user_latency(runs: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The latency a user sees, before the queueing figures: the median TTFT at one stream (a mean or a p99 at higher
    concurrency is mostly time spent waiting for a batch slot)."""
    single = next((run for run in runs if run.get("concurrency") == 1 and isinstance(run.get("median_ttft_ms"), (int, float))), None)
    if single is None:
        return "A user's latency: no run at one stream (concurrency 1), so no median TTFT a user would see.\n\n"
    return (f"A user's latency: median TTFT {single['median_ttft_ms']:.1f} ms at one stream, then "
            f"{fmt(single.get('mean_tpot_ms'), '{:.2f}')} ms per output token.\n\n")


def markdown_table(runs: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The report's table: the latency a user sees, then TTFT, TPOT, ITL, throughput and draft acceptance by concurrency."""
    lines = [
        user_latency(runs) + "| concurrency | requests ok / failed | median TTFT ms | mean TTFT ms | p99 TTFT ms | mean TPOT ms "
        "| p99 TPOT ms | mean ITL ms | p99 ITL ms | output tok/s | draft acceptance |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        acceptance = run.get("acceptance")
        lines.append(
            f"| {run['concurrency']} | {run.get('completed', '-')} / {run.get('failed', '-')} "
            f"| {fmt(run.get('median_ttft_ms'), '{:.1f}')} | {fmt(run.get('mean_ttft_ms'), '{:.1f}')} | {fmt(run.get('p99_ttft_ms'), '{:.1f}')} "
            f"| {fmt(run.get('mean_tpot_ms'), '{:.2f}')} | {fmt(run.get('p99_tpot_ms'), '{:.2f}')} "
            f"| {fmt(run.get('mean_itl_ms'), '{:.2f}')} | {fmt(run.get('p99_itl_ms'), '{:.2f}')} "
            f"| {fmt(run.get('output_throughput'), '{:.1f}')} "
            f"| {fmt(acceptance * 100 if isinstance(acceptance, (int, float)) else None, '{:.1f}%')} |"
        )
    return "\n".join(lines) + "\n"


def not_recorded(bench: t.Mapping[str, t.Any]) -> str:
    """The report's paragraph on what the benchmark did not record (a run that failed or did not account for its
    requests, and the concurrencies after it, never run), so a report of the runs that were recorded hides none."""
    reasons = bench.get("reasons") or []
    if not reasons:
        return ""
    return ("Not recorded (the table holds only the runs recorded; a failed run stops the concurrencies after it):\n\n"
            + "".join(f"- {reason}\n" for reason in reasons) + "\n")


def runner_command(
    runner: str,
    *,
    docker: str | None,
    container: str | None,
    image: str | None,
    workdir: str,
    models_dir: str,
    host_url: str,
    container_url: str | None,
) -> dict[str, t.Any]:
    """How a runner invokes ``vllm``: the argv before ``bench serve``, its view of the work dir, and the URL it reaches.

    exec runs in the serving container (the work dir is copied in and out); container runs a throwaway
    container of the pinned image on the host network with the work dir and the weights mounted; local
    runs a ``vllm`` on the host's PATH.
    """
    if runner == "exec":
        return {
            "prefix": [docker, "exec", "--env", "OPENAI_API_KEY", container, "vllm"],
            "python": [docker, "exec", container, "python3"],
            "data_dir": "/tmp/sparkfleet-bench",
            "base_url": container_url,
            "copy_in": True,
        }
    if runner == "container":
        return {
            "prefix": [
                docker, "run", "--rm", "--network", "host", "--env", "OPENAI_API_KEY",
                "--volume", f"{workdir}:/bench", "--volume", f"{models_dir}:/models:ro",
                "--entrypoint", "vllm", image,
            ],
            "python": [docker, "run", "--rm", "--entrypoint", "python3", image],
            "data_dir": "/bench",
            "base_url": host_url,
            "copy_in": False,
        }
    return {"prefix": ["vllm"], "python": ["python3"], "data_dir": workdir, "base_url": host_url, "copy_in": False}


def local_tokenizer(weights: str, models_dir: str) -> str:
    """The host path of weights the serving container sees under /models."""
    if weights == "/models" or weights.startswith("/models/"):
        return models_dir.rstrip("/") + weights[len("/models"):]
    return weights


def is_number(value: t.Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def report_problems(bench: t.Mapping[str, t.Any], correctness: t.Any, metrics: t.Any) -> list[str]:
    """Why registered results cannot be written as a report, each naming the option to fix: the report reads
    concurrency, output_throughput and mean_tpot_ms of each recorded run, and the few figures of the
    correctness line and the workload line."""
    fix = "pass the registered result of {} itself"
    runs = bench.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(run, dict) for run in runs):
        return ["bench.runs: not a list of runs; " + fix.format("vllm_bench")]
    problems = []
    reasons = bench.get("reasons")
    if reasons is not None and not (isinstance(reasons, list) and all(isinstance(reason, str) for reason in reasons)):
        problems.append("bench.reasons: not a list of reasons; " + fix.format("vllm_bench"))
    for index, run in enumerate(runs):
        concurrency = run.get("concurrency")
        if not is_number(concurrency) or isinstance(concurrency, float) or concurrency < 1:
            problems.append(f"bench.runs[{index}].concurrency: {concurrency!r} is not a stream count; " + fix.format("vllm_bench"))
        odd = [name for name in ("output_throughput", "mean_tpot_ms") if run.get(name) is not None and not is_number(run[name])]
        if odd:
            problems.append(f"bench.runs[{index}]: {', '.join(odd)} not a number; " + fix.format("vllm_bench"))
    if isinstance(correctness, dict) and "passed" in correctness:
        comparison = correctness.get("comparison")
        changed = comparison.get("changed_ids") if isinstance(comparison, dict) else None
        if (not is_number(correctness["passed"]) or not is_number(correctness.get("total"))
                or (comparison and not isinstance(comparison, dict))
                or (changed is not None and not (isinstance(changed, list) and all(isinstance(c, str) for c in changed)))):
            problems.append("correctness: not a result of vllm_correctness (passed, total, comparison.changed_ids); "
                            + fix.format("vllm_correctness"))
    workload = metrics.get("workload") if isinstance(metrics, dict) else None
    if workload is not None and not isinstance(workload, dict):
        problems.append("metrics.workload: not a workload profile; " + fix.format("vllm_metrics_info"))
    elif workload and workload.get("requests"):
        ratio = workload.get("prompt_to_generation_ratio")
        if (not is_number(workload["requests"]) or (ratio is not None and not is_number(ratio))
                or (workload.get("recommended_max_model_len") and not is_number(workload.get("coverage")))):
            problems.append("metrics.workload: not a workload profile (requests, prompt_to_generation_ratio, coverage); "
                            + fix.format("vllm_metrics_info"))
    return problems


def pick_runner(runner: str, container: str | None, docker: str | None, vllm: str | None, run_command: RunCommand) -> str:
    """The runner ``auto`` stands for: exec while the serving container runs, else a host vllm, else a container."""
    if runner != "auto":
        return runner
    if docker and container:
        try:
            if state_of(inspect_container(run_command, container, docker)).get("Running") is True:
                return "exec"
        except StateUnanswered:
            pass
    return "local" if vllm else "container"


def benchmark(params: t.Mapping[str, t.Any], run_command: RunCommand, which: Which, check_mode: bool) -> Outcome:
    """vllm_bench from its options to its answer; the module passes AnsibleModule.run_command and get_bin_path."""
    try:
        endpoint = resolve(params)
    except ValueError as error:
        return Outcome(str(error), {"ok": False, "runs": [], "reasons": [str(error)]})
    container = params["container"] or endpoint["container"]
    image = params["image"] or endpoint["image"]
    docker, vllm = which("docker"), which("vllm")
    # Picking the runner only reads the container's state, so every problem can be named in one pass.
    runner = pick_runner(params["runner"], container, docker, vllm, run_command)
    errors = validate(dict(params, runner=runner, container=container, image=image, docker=docker, vllm=vllm))
    if errors:
        return Outcome("vllm_bench refused: " + "; ".join(errors), {"ok": False, "runs": [], "reasons": errors})
    if check_mode:
        return Outcome(None, {"changed": False, "ok": True, "runner": runner, "runs": [], "reasons": ["check mode: no load sent"]})
    workdir = os.path.join(params["results_dir"], params["label"])
    plan = runner_command(runner, docker=docker, container=container, image=image, workdir=workdir, models_dir=params["models_dir"],
                          host_url=endpoint["url"], container_url=endpoint["container_url"])
    tokenizer = params["tokenizer"] or endpoint["weights"] or endpoint["model"]
    if runner == "local" and not params["tokenizer"] and endpoint["weights"]:
        tokenizer = local_tokenizer(endpoint["weights"], params["models_dir"])
    return record(Job(params=params, endpoint=endpoint, runner=runner, docker=docker, container=container, vllm=vllm, plan=plan,
                      workdir=workdir, tokenizer=tokenizer, run_command=run_command))


def record(job: Job) -> Outcome:
    """Every run of the job, stopping at the first that cannot be recorded, and the summary file beside them."""
    params = job.params
    sizes = [c * params["prompts_per_concurrency"] for c in params["concurrencies"]]
    runs: list[dict[str, t.Any]] = []
    reasons: list[str] = []
    result: dict[str, t.Any] = {"changed": False, "ok": False, "runner": job.runner, "runs": runs, "reasons": reasons}
    try:
        check_server(job)
        os.makedirs(job.workdir, mode=0o755, exist_ok=True)
        result["changed"] = True
        result["dataset"] = write_datasets(job, sizes)
        prepare_runner(job)
        for index, concurrency in enumerate(params["concurrencies"]):
            runs.append(run_once(job, index, concurrency, sizes[index]))
            if runs[-1]["reasons"]:
                reasons.extend(runs[-1]["reasons"])
                break
    except (BenchFailure, ValueError) as error:
        # ValueError carries what the endpoint answered (discover_model, the counters' parser), already worded for the operator.
        reasons.append(str(error))
    except OSError as error:
        reasons.append(file_problem(error))
    finally:
        if job.plan["copy_in"]:
            job.run_command([job.docker, "exec", job.container, "rm", "-rf", job.plan["data_dir"]])
    result["ok"] = not reasons
    result["table"] = markdown_table([r for r in runs if not r["reasons"]])
    if os.path.isdir(job.workdir):
        try:
            with open(os.path.join(job.workdir, "summary.json"), "w", encoding="utf-8") as handle:
                json.dump({"label": params["label"], "model": job.endpoint["model"], **result}, handle, indent=1, sort_keys=True)
        except OSError as error:
            reasons.append(file_problem(error))
            result["ok"] = False
    if reasons:
        return Outcome("benchmark not recorded: " + "; ".join(reasons), result)
    return Outcome(None, result)


def check_server(job: Job) -> None:
    """Before anything is written: the served model is known, nobody else's load runs, and a reset is possible."""
    endpoint, timeout = job.endpoint, job.params["timeout"]
    discover_model(endpoint, timeout)
    busy = busy_problem(read_metrics(endpoint["url"], endpoint["api_key"], timeout)) if job.params["require_idle"] else None
    if busy:
        raise BenchFailure(busy + ", or set require_idle: false")
    if job.params["prefix_cache"] == "reset":
        # A server without dev mode refuses here, not after a dataset was built.
        reset_prefix_cache(endpoint, timeout)


def reset_prefix_cache(endpoint: t.Mapping[str, t.Any], timeout: float) -> None:
    url = endpoint["url"] + "/reset_prefix_cache"
    reply = http("POST", url, endpoint["api_key"], timeout=timeout)
    if reply.status in (401, 403, 404, 405):
        raise BenchFailure(
            f"{url} answered HTTP {reply.status}: prefix_cache: reset needs vLLM's development routes (VLLM_SERVER_DEV_MODE=1), "
            "which the vllm role opens only with vllm_allow_dev_mode: true on an instance bound to loopback only; "
            "use prefix_cache: disjoint"
        )
    if reply.status != 200:
        raise BenchFailure(reply_problem(reply, url))


def count_tokens(endpoint: t.Mapping[str, t.Any], text: str, timeout: float) -> int:
    """Tokens of ``text`` by the served model's own tokenizer (the server's /tokenize)."""
    url = endpoint["url"] + "/tokenize"
    payload = {"model": endpoint["model"], "prompt": text, "add_special_tokens": False}
    count = json_object(http("POST", url, endpoint["api_key"], payload, timeout=timeout), url).get("count")
    if not isinstance(count, int) or isinstance(count, bool):
        raise BenchFailure(f"{url} answered without a token count")
    return count


def documents(folder: str) -> list[str]:
    found = sorted({path for pattern in DOCUMENT_PATTERNS for path in glob.glob(os.path.join(folder, "**", pattern), recursive=True)})
    if not found:
        raise BenchFailure(f"documents_dir: {folder} holds no .md, .markdown or .txt document")
    return found


def write_datasets(job: Job, sizes: t.Sequence[int]) -> dict[str, t.Any]:
    """For natural text, one JSONL per concurrency in the work dir, from disjoint chunks; the dataset as reported."""
    params = job.params
    dataset: dict[str, t.Any] = {"kind": params["dataset"]}
    if params["dataset"] != "natural":
        return dataset
    paragraphs = []
    for path in documents(params["documents_dir"]):
        with open(path, encoding="utf-8", errors="replace") as handle:
            for paragraph in split_paragraphs(handle.read()):
                paragraphs.append((paragraph, count_tokens(job.endpoint, paragraph, params["timeout"])))
    chunks = pack_chunks(paragraphs, params["input_tokens"])
    sets = disjoint_sets(chunks, sizes)
    dataset.update(chunks=len(chunks), mean_prompt_tokens={})
    instruction = params["instruction"] or DEFAULT_INSTRUCTION
    for concurrency, chosen in zip(params["concurrencies"], sets, strict=True):
        with open(os.path.join(job.workdir, f"natural-c{concurrency}.jsonl"), "w", encoding="utf-8") as handle:
            handle.write(dataset_lines(instruction, chosen))
        dataset["mean_prompt_tokens"][str(concurrency)] = round(sum(c["tokens"] for c in chosen) / len(chosen), 1)
    return dataset


def prepare_runner(job: Job) -> None:
    """The datasets copied into the serving container for exec, and pandas proven importable for a natural run."""
    docker, container, plan = job.docker, job.container, job.plan
    if plan["copy_in"]:
        job.run_command([docker, "exec", container, "rm", "-rf", plan["data_dir"]])
        rc, _out, err = job.run_command([docker, "cp", job.workdir + "/.", f"{container}:{plan['data_dir']}"])
        if rc:
            raise BenchFailure(f"copying the datasets into {container} failed: {err.strip()}")
    if job.params["dataset"] == "natural":
        rc, _out, err = job.run_command(python_of(job) + ["-c", "import pandas"])
        if rc:
            raise BenchFailure(
                f"runner {job.runner} cannot import pandas, which vllm bench's custom dataset needs ({err.strip()[-200:]}); "
                "build a bench image FROM the serving image's digest with pandas installed and pass it as image with "
                "runner: container, or use dataset: random"
            )


def python_of(job: Job) -> list[str]:
    """The interpreter that runs vllm bench: for a local vllm, the one beside it (often a venv)."""
    if job.runner == "local" and job.vllm:
        beside = os.path.join(os.path.dirname(job.vllm), "python3")
        if os.path.exists(beside):
            return [beside]
    return job.plan["python"]


def counters(endpoint: t.Mapping[str, t.Any], timeout: float) -> dict[str, t.Any] | None:
    return speculative_counters(read_metrics(endpoint["url"], endpoint["api_key"], timeout))


def run_once(job: Job, index: int, concurrency: int, prompts: int) -> dict[str, t.Any]:
    """One ``vllm bench serve`` at ``concurrency``, judged by its saved JSON, with the acceptance the counters moved by."""
    params, endpoint, plan = job.params, job.endpoint, job.plan
    if params["prefix_cache"] == "reset":
        reset_prefix_cache(endpoint, params["timeout"])
    filename = f"c{concurrency}.json"
    local_result = os.path.join(job.workdir, filename)
    if os.path.exists(local_result):
        os.unlink(local_result)
    args = bench_args(
        base_url=plan["base_url"], model=endpoint["model"], tokenizer=job.tokenizer, concurrency=concurrency,
        num_prompts=prompts, dataset=params["dataset"], input_tokens=params["input_tokens"],
        output_tokens=params["output_tokens"], dataset_path=f"{plan['data_dir']}/natural-c{concurrency}.jsonl",
        result_dir=plan["data_dir"], result_filename=filename, seed=1000 + index,
    )
    before = counters(endpoint, params["timeout"])
    rc, out, err = job.run_command(plan["prefix"] + args, environ_update={"OPENAI_API_KEY": endpoint["api_key"] or "EMPTY"})
    after = counters(endpoint, params["timeout"])
    if plan["copy_in"]:
        job.run_command([job.docker, "cp", f"{job.container}:{plan['data_dir']}/{filename}", local_result])
    saved = load_result(local_result)
    figures_found = figures(saved) if isinstance(saved, dict) else {}
    run_acceptance = acceptance(counters_delta(before, after)) or {}
    reasons = [f"concurrency {concurrency}: {reason}" for reason in judge(saved, out + err, params["allow_failures"], prompts)]
    if reasons and saved is not None:
        # Kept for diagnosis under a name no report picks up as a result.
        failed_result = local_result[:-len(".json")] + ".failed.json"
        os.replace(local_result, failed_result)
        local_result = failed_result
    return {
        "concurrency": concurrency,
        "prompts": prompts,
        "exit_code": rc,
        **figures_found,
        "acceptance": run_acceptance.get("acceptance"),
        "mean_acceptance_length": run_acceptance.get("mean_acceptance_length"),
        "acceptance_per_position": run_acceptance.get("acceptance_per_position"),
        "draft_tokens": run_acceptance.get("draft_tokens"),
        "accepted_tokens": run_acceptance.get("accepted_tokens"),
        "acceptance_note": counter_regression(before, after),
        "result_file": local_result if saved is not None else None,
        "reasons": reasons,
    }


def load_result(path: str) -> t.Any:
    """A run's saved result: None when vllm bench wrote none, the text itself when it is not JSON (judge names both)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def file_problem(error: OSError) -> str:
    return (f"{error.filename or 'a file'}: {error.strerror or error}; results_dir must be writable and documents_dir readable "
            "by the task's user (become: true, or other folders)")
