#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench
short_description: Benchmark a vLLM endpoint with vllm bench serve, reporting draft acceptance
version_added: 0.2.0
description:
  - Runs C(vllm bench serve) (not a home-made load generator) once per concurrency in O(concurrencies), with
    C(prompts_per_concurrency) times the concurrency prompts, at temperature 0.
  - Judges every run by the completed and failed counts in the JSON it saved, never by the exit code
    (C(vllm bench serve) exits 0 when every request failed); a run with no success, or with any failure unless
    O(allow_failures), is not recorded and fails the module (seed 000, "the benchmark that silently didn't run").
  - Reads the speculative-decoding counters from C(/metrics) before and after each run and reports the
    acceptance the run itself produced, overall and per draft position.
  - The default dataset is natural text (seed 000, "random tokens lie about speculative decoding"), Markdown or
    text documents from O(documents_dir) split on paragraph boundaries, packed to about O(input_tokens) tokens
    counted by the served model's own tokenizer (the server's C(/tokenize)), wrapped in O(instruction), and
    in disjoint sets per concurrency so no round reuses another's prefix cache.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.vllm_endpoint
options:
  label:
    description: Name of this benchmark; its datasets, per-run JSON and summary go to O(results_dir)/O(label).
    type: str
    required: true
  concurrencies:
    description: Concurrent streams, one run each.
    type: list
    elements: int
    default: [1, 4, 8]
  prompts_per_concurrency:
    description: Prompts per stream; a run sends this times its concurrency.
    type: int
    default: 6
  dataset:
    description: C(natural) (documents packed to a token budget) or C(random) (random tokens, C(--ignore-eos)).
    type: str
    choices: [natural, random]
    default: natural
  documents_dir:
    description: Host folder of C(.md), C(.markdown) and C(.txt) documents for the natural dataset, read recursively.
    type: path
  instruction:
    description: Task put before every natural-text chunk; the default is seed 000's knowledge-graph extraction prompt.
    type: str
  input_tokens:
    description: Prompt size, the natural chunks' target or the random input length.
    type: int
    default: 1000
  output_tokens:
    description: Longest answer; natural answers may end sooner, random ones run to it.
    type: int
    default: 384
  prefix_cache:
    description:
      - C(disjoint) keeps rounds from sharing prompts (natural sets are disjoint; random runs use distinct seeds).
      - "C(reset) also empties the prefix cache before each run through C(/reset_prefix_cache), one of vLLM's
        development routes, which the vllm role opens only with C(vllm_allow_dev_mode: true) on an instance bound to
        loopback only. Where the route is absent (HTTP 404) or refused (HTTP 401), the module fails before any load
        is sent; use C(disjoint) there."
    type: str
    choices: [disjoint, reset]
    default: disjoint
  allow_failures:
    description: Record runs in which some requests failed (never runs in which all failed).
    type: bool
    default: false
  runner:
    description:
      - Where C(vllm bench serve) runs. C(exec) in the serving container, C(container) in a throwaway
        container of O(image) on the host network, C(local) with the host's own C(vllm).
      - C(auto) takes C(exec) when the instance's container is running, else C(local) when C(vllm) is on PATH,
        else C(container).
      - The custom dataset loader imports pandas, which serving images may lack; the module checks before the
        first run and names the fix (a bench image built from the same digest plus pandas).
    type: str
    choices: [auto, exec, container, local]
    default: auto
  container:
    description: Serving container for the C(exec) runner; defaults to the instance's.
    type: str
  image:
    description: Image for the C(container) runner; defaults to the instance's pinned image.
    type: str
  models_dir:
    description: Host folder mounted at C(/models) in serving containers, mounted the same way for the C(container) runner.
    type: path
    default: /srv/models
  tokenizer:
    description: Tokenizer path as the runner sees it; defaults to the instance's weights.
    type: str
  results_dir:
    description: Host folder under which each label's files are kept.
    type: path
    default: /var/lib/sparkfleet/bench
  require_idle:
    description:
      - Refuse to start while the server has requests running or waiting that are not the benchmark's; in seed 002
        gateway traffic made an MTP-2 against MTP-3 comparison meaningless. Drain the node first.
    type: bool
    default: true
requirements:
  - prometheus_client (Debian and Ubuntu package python3-prometheus-client; the vllm role installs it)
attributes:
  check_mode:
    support: partial
    description: Can run in check mode, where it sends no load.
    details: Validates the options, resolves the endpoint and picks the runner, then returns without sending load.
  diff_mode:
    support: none
    description: Writes result files; no diff is shown.
notes:
  - The key reaches C(vllm bench serve) as C(OPENAI_API_KEY) in its environment, never on a command line.
"""

EXAMPLES = r"""
- name: Natural-text benchmark of the LLM instance at 1, 4 and 8 streams
  sparkfleet.vllm.vllm_bench:
    instance: llm
    label: mtp4-natural
    documents_dir: /srv/bench/docs
  register: bench

- name: Random-token shape of seed 000's first sweep, in a bench image that has pandas
  sparkfleet.vllm.vllm_bench:
    instance: llm
    label: random-4k
    dataset: random
    input_tokens: 4096
    output_tokens: 128
    runner: container
    image: registry.example/vllm-bench@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
"""

RETURN = r"""
ok:
  description: Whether every run was recorded.
  returned: always
  type: bool
runner:
  description: The runner used.
  returned: success
  type: str
dataset:
  description: dataset kind, and for natural text the chunk count and mean prompt tokens per concurrency.
  returned: success
  type: dict
runs:
  description:
    - Per concurrency, completed, failed, mean_ttft_ms, p99_ttft_ms, mean_tpot_ms, p99_tpot_ms, mean_itl_ms,
      p99_itl_ms, output_throughput (tok/s), total_input_tokens, total_output_tokens, duration, acceptance
      (from the counters, null without a drafter), mean_acceptance_length, acceptance_per_position,
      acceptance_note (why acceptance is null although the server drafts, because its counters went backwards during the
      run, so it restarted), bench_acceptance_rate (vllm bench's own figure, percent) and result_file.
  returned: always
  type: list
  elements: dict
table:
  description: The runs as a Markdown table.
  returned: success
  type: str
reasons:
  description: Why a run was not recorded.
  returned: always
  type: list
  elements: str
"""

import glob
import json
import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import (
    DEFAULT_INSTRUCTION,
    bench_args,
    dataset_lines,
    disjoint_sets,
    figures,
    judge,
    local_tokenizer,
    markdown_table,
    pack_chunks,
    runner_command,
    split_paragraphs,
    validate,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import (
    ENDPOINT_ARGUMENT_SPEC,
    discover_model,
    http,
    json_object,
    label_problems,
    reply_problem,
    resolve,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import (
    PROMETHEUS_CLIENT_PURPOSE,
    acceptance,
    busy_problem,
    counter_regression,
    counters_delta,
    parse_samples,
    speculative_counters,
    text_string_to_metric_families,
)

DOCUMENT_PATTERNS = ("*.md", "*.markdown", "*.txt")


class BenchFailure(Exception):
    pass


def samples(endpoint, timeout):
    reply = http("GET", endpoint["url"] + "/metrics", None, timeout=timeout)
    if reply.status != 200:
        raise BenchFailure(reply_problem(reply, endpoint["url"] + "/metrics"))
    try:
        return parse_samples(reply.body)
    except ValueError as error:
        raise BenchFailure(f"{endpoint['url']}/metrics did not answer Prometheus text: {error}") from error


def counters(endpoint, timeout):
    return speculative_counters(samples(endpoint, timeout))


def count_tokens(endpoint, text, timeout):
    payload = {"model": endpoint["model"], "prompt": text, "add_special_tokens": False}
    try:
        count = json_object(http("POST", endpoint["url"] + "/tokenize", endpoint["api_key"], payload, timeout=timeout),
                            endpoint["url"] + "/tokenize").get("count")
    except ValueError as error:
        raise BenchFailure(str(error)) from error
    if not isinstance(count, int) or isinstance(count, bool):
        raise BenchFailure(f"{endpoint['url']}/tokenize answered without a token count")
    return count


def reset_prefix_cache(endpoint, timeout):
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


def documents(folder):
    found = sorted({path for pattern in DOCUMENT_PATTERNS for path in glob.glob(os.path.join(folder, "**", pattern), recursive=True)})
    if not found:
        raise BenchFailure(f"documents_dir: {folder} holds no .md, .markdown or .txt document")
    return found


def natural_sets(endpoint, params, sizes):
    paragraphs = []
    for path in documents(params["documents_dir"]):
        with open(path, encoding="utf-8", errors="replace") as handle:
            for paragraph in split_paragraphs(handle.read()):
                paragraphs.append((paragraph, count_tokens(endpoint, paragraph, params["timeout"])))
    chunks = pack_chunks(paragraphs, params["input_tokens"])
    try:
        return chunks, disjoint_sets(chunks, sizes)
    except ValueError as error:
        raise BenchFailure(str(error)) from error


def pick_runner(module, params, container, docker):
    runner = params["runner"]
    if runner != "auto":
        return runner
    if docker and container:
        rc, out, _err = module.run_command([docker, "inspect", "--format", "{{.State.Running}}", container])
        if rc == 0 and out.strip() == "true":
            return "exec"
    if module.get_bin_path("vllm"):
        return "local"
    return "container"


def python_of(module, runner, plan):
    """The interpreter that runs vllm bench: for a local vllm, the one beside it (often a venv)."""
    if runner == "local":
        beside = os.path.join(os.path.dirname(module.get_bin_path("vllm", required=True)), "python3")
        return [beside] if os.path.exists(beside) else plan["python"]
    return plan["python"]


def file_problem(error):
    return (f"{error.filename or 'a file'}: {error.strerror or error}; results_dir must be writable and documents_dir readable "
            "by the task's user (become: true, or other folders)")


def run(module, argv, key):
    return module.run_command(argv, environ_update={"OPENAI_API_KEY": key or "EMPTY"})


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ENDPOINT_ARGUMENT_SPEC,
            label=dict(type="str", required=True),
            concurrencies=dict(type="list", elements="int", default=[1, 4, 8]),
            prompts_per_concurrency=dict(type="int", default=6),
            dataset=dict(type="str", choices=["natural", "random"], default="natural"),
            documents_dir=dict(type="path"),
            instruction=dict(type="str"),
            input_tokens=dict(type="int", default=1000, no_log=False),
            output_tokens=dict(type="int", default=384, no_log=False),
            prefix_cache=dict(type="str", choices=["disjoint", "reset"], default="disjoint"),
            allow_failures=dict(type="bool", default=False),
            runner=dict(type="str", choices=["auto", "exec", "container", "local"], default="auto"),
            container=dict(type="str"),
            image=dict(type="str"),
            models_dir=dict(type="path", default="/srv/models"),
            tokenizer=dict(type="str", no_log=False),
            results_dir=dict(type="path", default="/var/lib/sparkfleet/bench"),
            require_idle=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    if text_string_to_metric_families is None:
        missing = missing_required_lib("prometheus_client", reason=PROMETHEUS_CLIENT_PURPOSE)
        module.fail_json(msg=missing, ok=False, runs=[], reasons=[missing])
    params = module.params
    try:
        endpoint = resolve(params)
    except ValueError as error:
        module.fail_json(msg=str(error), ok=False, runs=[], reasons=[str(error)])
    container = params["container"] or endpoint["container"]
    image = params["image"] or endpoint["image"]
    docker = module.get_bin_path("docker")
    # Picking the runner only reads the container's state, so every problem can be named in one pass.
    runner = pick_runner(module, params, container, docker)
    errors = validate(dict(params, runner=runner, container=container, image=image))
    errors += label_problems("label", params["label"])
    if params["documents_dir"] and params["dataset"] == "natural" and not os.path.isdir(params["documents_dir"]):
        errors.append(f"documents_dir: {params['documents_dir']} is not a folder on this host")
    if runner in ("exec", "container") and not docker:
        errors.append(f"runner: {runner} needs the docker command on this host")
    if errors:
        module.fail_json(msg="vllm_bench refused: " + "; ".join(errors), ok=False, runs=[], reasons=errors)
    if module.check_mode:
        module.exit_json(changed=False, ok=True, runner=runner, runs=[], reasons=["check mode: no load sent"])

    workdir = os.path.join(params["results_dir"], params["label"])
    plan = runner_command(
        runner, docker=docker, container=container, image=image, workdir=workdir,
        models_dir=params["models_dir"], host_url=endpoint["url"], container_url=endpoint["container_url"],
    )
    tokenizer = params["tokenizer"] or endpoint["weights"] or endpoint["model"]
    if runner == "local" and not params["tokenizer"] and endpoint["weights"]:
        tokenizer = local_tokenizer(endpoint["weights"], params["models_dir"])
    sizes = [c * params["prompts_per_concurrency"] for c in params["concurrencies"]]
    runs, reasons = [], []
    result = {"changed": False, "ok": False, "runner": runner, "runs": runs, "reasons": reasons}
    try:
        discover_model(endpoint, params["timeout"])
        busy = busy_problem(samples(endpoint, params["timeout"])) if params["require_idle"] else None
        if busy:
            raise BenchFailure(busy + ", or set require_idle: false")
        if params["prefix_cache"] == "reset":
            # Before anything is written: a server without dev mode refuses here, not after a dataset was built.
            reset_prefix_cache(endpoint, params["timeout"])
        os.makedirs(workdir, mode=0o755, exist_ok=True)
        result["changed"] = True
        dataset = {"kind": params["dataset"]}
        if params["dataset"] == "natural":
            chunks, sets = natural_sets(endpoint, params, sizes)
            dataset.update(chunks=len(chunks), mean_prompt_tokens={})
            instruction = params["instruction"] or DEFAULT_INSTRUCTION
            for concurrency, chosen in zip(params["concurrencies"], sets, strict=True):
                with open(os.path.join(workdir, f"natural-c{concurrency}.jsonl"), "w", encoding="utf-8") as handle:
                    handle.write(dataset_lines(instruction, chosen))
                dataset["mean_prompt_tokens"][str(concurrency)] = round(sum(c["tokens"] for c in chosen) / len(chosen), 1)
        result["dataset"] = dataset
        if plan["copy_in"]:
            module.run_command([docker, "exec", container, "rm", "-rf", plan["data_dir"]])
            rc, _out, err = module.run_command([docker, "cp", workdir + "/.", f"{container}:{plan['data_dir']}"])
            if rc:
                raise BenchFailure(f"copying the datasets into {container} failed: {err.strip()}")
        if params["dataset"] == "natural":
            rc, _out, err = module.run_command(python_of(module, runner, plan) + ["-c", "import pandas"])
            if rc:
                raise BenchFailure(
                    f"runner {runner} cannot import pandas, which vllm bench's custom dataset needs ({err.strip()[-200:]}); "
                    "build a bench image FROM the serving image's digest with pandas installed and pass it as image with "
                    "runner: container, or use dataset: random"
                )
        for index, concurrency in enumerate(params["concurrencies"]):
            runs.append(bench_once(module, params, endpoint, plan, runner, docker, container, workdir, tokenizer,
                                   index, concurrency, sizes[index]))
            if runs[-1]["reasons"]:
                reasons.extend(runs[-1]["reasons"])
                break
    except (BenchFailure, ValueError) as error:
        # ValueError carries what the endpoint answered (discover_model, the counters' parser), already worded for the operator.
        reasons.append(str(error))
    except OSError as error:
        reasons.append(file_problem(error))
    finally:
        if plan["copy_in"]:
            module.run_command([docker, "exec", container, "rm", "-rf", plan["data_dir"]])
    result["ok"] = not reasons
    result["table"] = markdown_table([r for r in runs if not r["reasons"]])
    if os.path.isdir(workdir):
        try:
            with open(os.path.join(workdir, "summary.json"), "w", encoding="utf-8") as handle:
                json.dump({"label": params["label"], "model": endpoint["model"], **result}, handle, indent=1, sort_keys=True)
        except OSError as error:
            reasons.append(file_problem(error))
            result["ok"] = False
    if reasons:
        module.fail_json(msg="benchmark not recorded: " + "; ".join(reasons), **result)
    module.exit_json(**result)


def bench_once(module, params, endpoint, plan, runner, docker, container, workdir, tokenizer, index, concurrency, prompts):
    if params["prefix_cache"] == "reset":
        reset_prefix_cache(endpoint, params["timeout"])
    filename = f"c{concurrency}.json"
    local_result = os.path.join(workdir, filename)
    if os.path.exists(local_result):
        os.unlink(local_result)
    args = bench_args(
        base_url=plan["base_url"], model=endpoint["model"], tokenizer=tokenizer, concurrency=concurrency,
        num_prompts=prompts, dataset=params["dataset"], input_tokens=params["input_tokens"],
        output_tokens=params["output_tokens"], dataset_path=f"{plan['data_dir']}/natural-c{concurrency}.jsonl",
        result_dir=plan["data_dir"], result_filename=filename, seed=1000 + index,
    )
    before = counters(endpoint, params["timeout"])
    rc, out, err = run(module, plan["prefix"] + args, endpoint["api_key"])
    after = counters(endpoint, params["timeout"])
    if plan["copy_in"]:
        module.run_command([docker, "cp", f"{container}:{plan['data_dir']}/{filename}", local_result])
    saved = None
    if os.path.exists(local_result):
        with open(local_result, encoding="utf-8") as handle:
            try:
                saved = json.load(handle)
            except ValueError:
                saved = {}
    figures_found = figures(saved) if isinstance(saved, dict) else {}
    run_acceptance = acceptance(counters_delta(before, after)) or {}
    reasons = [f"concurrency {concurrency}: {reason}" for reason in judge(saved, out + err, params["allow_failures"])]
    regression = counter_regression(before, after)
    if reasons and saved:
        # Kept for diagnosis under a name no report picks up as a result.
        os.replace(local_result, local_result[:-len(".json")] + ".failed.json")
        local_result = local_result[:-len(".json")] + ".failed.json"
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
        "acceptance_note": regression,
        "result_file": local_result if saved else None,
        "reasons": reasons,
    }


if __name__ == "__main__":
    main()
