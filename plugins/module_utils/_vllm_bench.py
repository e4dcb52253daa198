# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmarks with ``vllm bench serve``: arguments, natural-text datasets, judging runs, the report table.

Private to the collection. Lessons encoded here, from seed 000: a run is judged by the
completed and failed counts in its saved JSON, never by the exit code (``vllm bench serve``
exits 0 when every request failed), and a run with no success is never recorded; random
tokens lie about speculative decoding, so the default dataset is natural text packed to a
token budget with the served model's own tokenizer, in disjoint sets per concurrency so the
prefix cache cannot reuse an earlier round.
"""

from __future__ import annotations

import json
import typing as t

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
ERROR_MARKERS = ("Error", "error:", "Traceback", "Unauthorized", "refused", "No module named")


def validate(options: t.Mapping[str, t.Any]) -> list[str]:
    """Problems of a benchmark request, each naming the option to fix."""
    errors = []
    concurrencies = options.get("concurrencies") or []
    if not concurrencies or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in concurrencies):
        errors.append(f"concurrencies: {concurrencies!r} must be a non-empty list of positive whole numbers")
    elif len(set(concurrencies)) != len(concurrencies):
        errors.append(f"concurrencies: {concurrencies!r} repeats a value")
    for name in ("prompts_per_concurrency", "input_tokens", "output_tokens"):
        value = options.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            errors.append(f"{name}: {value!r} must be a positive whole number")
    if options.get("dataset") == "natural" and not options.get("documents_dir"):
        errors.append("documents_dir: the natural dataset needs a folder of Markdown or text documents on the host")
    if options.get("runner") == "exec" and not options.get("container"):
        errors.append("container: runner exec needs the serving container's name (or give instance)")
    if options.get("runner") == "container" and not options.get("image"):
        errors.append("image: runner container needs the pinned image (or give instance to use the serving image)")
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


def error_lines(output: str, limit: int = 5) -> list[str]:
    lines = [line.strip() for line in (output or "").splitlines() if any(marker in line for marker in ERROR_MARKERS)]
    return lines[-limit:]


def judge(result: t.Mapping[str, t.Any] | None, output: str, allow_failures: bool) -> list[str]:
    """Why a run cannot be recorded; empty when it can."""
    if result is None:
        found = "; ".join(error_lines(output)) or "no error line in its output"
        return [f"vllm bench wrote no result file ({found})"]
    if not isinstance(result, dict):
        return ["the result file does not hold a JSON object; it is not a vllm bench serve result"]
    completed = result.get("completed")
    failed = result.get("failed", 0)
    if not isinstance(completed, int) or isinstance(completed, bool) or completed < 0:
        return [f"the result file's completed is {completed!r}, not a count; it is not a vllm bench serve result"]
    if not isinstance(failed, int) or isinstance(failed, bool) or failed < 0:
        return [f"the result file's failed is {failed!r}, not a count; it is not a vllm bench serve result"]
    reasons = []
    if completed == 0:
        found = "; ".join(error_lines(output)) or "no error line in its output"
        reasons.append(f"no request succeeded ({failed} failed: {found}); the run is not recorded")
    elif failed and not allow_failures:
        reasons.append(f"{failed} of {completed + failed} requests failed; set allow_failures to record such a run")
    return reasons


def figures(result: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    found = {name: result.get(name) for name in FIGURES}
    found["bench_acceptance_rate"] = result.get("spec_decode_acceptance_rate")
    return found


def fmt(value: t.Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) else "-"


def markdown_table(runs: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    """The report's table: TTFT, TPOT, ITL, throughput and draft acceptance by concurrency."""
    lines = [
        "| concurrency | requests ok / failed | mean TTFT ms | p99 TTFT ms | mean TPOT ms | p99 TPOT ms "
        "| mean ITL ms | p99 ITL ms | output tok/s | draft acceptance |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        acceptance = run.get("acceptance")
        lines.append(
            f"| {run['concurrency']} | {run.get('completed', '-')} / {run.get('failed', '-')} "
            f"| {fmt(run.get('mean_ttft_ms'), '{:.1f}')} | {fmt(run.get('p99_ttft_ms'), '{:.1f}')} "
            f"| {fmt(run.get('mean_tpot_ms'), '{:.2f}')} | {fmt(run.get('p99_tpot_ms'), '{:.2f}')} "
            f"| {fmt(run.get('mean_itl_ms'), '{:.2f}')} | {fmt(run.get('p99_itl_ms'), '{:.2f}')} "
            f"| {fmt(run.get('output_throughput'), '{:.1f}')} "
            f"| {fmt(acceptance * 100 if isinstance(acceptance, (int, float)) else None, '{:.1f}%')} |"
        )
    return "\n".join(lines) + "\n"


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
