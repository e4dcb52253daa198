"""Benchmark logic: judging runs on result files recorded from the lab's real `vllm bench serve`, datasets, argv."""

import json
import pathlib

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_bench import (
    accounting,
    bench_args,
    dataset_lines,
    disjoint_sets,
    figures,
    judge,
    load_result,
    local_tokenizer,
    markdown_table,
    not_recorded,
    pack_chunks,
    report_problems,
    runner_command,
    split_paragraphs,
    validate,
)

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
GOOD = json.loads((FIXTURES / "bench-random-c2-ngram.json").read_text())
# Recorded with a wrong OPENAI_API_KEY: every request got 401 and vllm bench still exited 0.
WRONG_KEY = json.loads((FIXTURES / "bench-wrong-key.json").read_text())
WRONG_KEY_OUTPUT = (FIXTURES / "bench-wrong-key-output.txt").read_text()

VALID = {"label": "mtp4", "concurrencies": [1, 2], "prompts_per_concurrency": 6, "input_tokens": 1000, "output_tokens": 384,
         "dataset": "random", "runner": "auto"}


def test_a_run_with_successes_is_recorded():
    assert judge(GOOD, "", allow_failures=False, prompts=4) == []
    found = figures(GOOD)
    assert (found["completed"], found["failed"]) == (4, 0)
    assert found["mean_tpot_ms"] == pytest.approx(3.0679, rel=1e-3)
    assert found["bench_acceptance_rate"] == pytest.approx(95.83, rel=1e-3)


def test_all_requests_failed_is_refused_with_the_error_lines():
    reasons = judge(WRONG_KEY, WRONG_KEY_OUTPUT, allow_failures=True, prompts=2)
    assert len(reasons) == 1
    assert "no request succeeded (2 failed" in reasons[0]
    assert "Unauthorized" in reasons[0]


def test_some_failures_refused_unless_allowed():
    partial = dict(GOOD, completed=3, failed=1)
    assert judge(partial, "", allow_failures=False, prompts=4) == ["1 of 4 requests failed; set allow_failures to record such a run"]
    assert judge(partial, "", allow_failures=True, prompts=4) == []


def test_missing_result_file_names_the_crash():
    output = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'pandas'\n"
    reasons = judge(None, output, allow_failures=False, prompts=20)
    assert reasons[0].startswith("vllm bench wrote no result file, so none of the 20 prompts sent is accounted for")
    assert "No module named 'pandas'" in reasons[0]


@pytest.mark.parametrize("result", [[1, 2], "text", "{not json", 3, True])
def test_a_file_that_is_not_a_json_object_accounts_for_nothing(result):
    assert judge(result, "", allow_failures=True, prompts=20) == [
        "the result file does not hold a JSON object, so none of the 20 prompts sent is accounted for; it is not a vllm bench serve result"]


UNCOUNTED = {key: value for key, value in GOOD.items() if key not in ("completed", "failed")}
# Every spelling of a result that does not account for the prompts sent (20 here): a count missing, null, text,
# negative, fractional or true; completed and failed that fall short of the prompts, or exceed them.
UNACCOUNTED = {
    "failed-missing": ({"completed": 20}, "20 prompts sent, but the result file's failed missing"),
    "completed-missing": ({"failed": 0}, "20 prompts sent, but the result file's completed missing"),
    "both-missing": ({}, "20 prompts sent, but the result file's completed missing and failed missing"),
    "failed-null": ({"completed": 20, "failed": None}, "the result file's failed None (not a count)"),
    "completed-null": ({"completed": None, "failed": 0}, "the result file's completed None (not a count)"),
    "failed-text": ({"completed": 17, "failed": "3"}, "the result file's failed '3' (not a count)"),
    "completed-text": ({"completed": "20", "failed": 0}, "the result file's completed '20' (not a count)"),
    "failed-negative": ({"completed": 23, "failed": -3}, "the result file's failed -3 (not a count)"),
    "completed-negative": ({"completed": -1, "failed": 21}, "the result file's completed -1 (not a count)"),
    "completed-fraction": ({"completed": 19.5, "failed": 0.5}, "completed 19.5 (not a count) and failed 0.5 (not a count)"),
    "completed-true": ({"completed": True, "failed": 0}, "the result file's completed True (not a count)"),
    "shortfall": ({"completed": 17, "failed": 0}, "20 prompts sent, 17 completed, 0 failed: 3 unaccounted for"),
    "shortfall-with-failures": ({"completed": 10, "failed": 5}, "20 prompts sent, 10 completed, 5 failed: 5 unaccounted for"),
    "nothing-counted": ({"completed": 0, "failed": 0}, "20 prompts sent, 0 completed, 0 failed: 20 unaccounted for"),
    "more-than-sent": ({"completed": 20, "failed": 2}, "20 prompts sent, 20 completed, 2 failed: 2 more than were sent"),
}


@pytest.mark.parametrize(("counts", "fragment"), UNACCOUNTED.values(), ids=UNACCOUNTED.keys())
@pytest.mark.parametrize("allow_failures", [True, False])
def test_a_result_that_does_not_account_for_every_prompt_is_not_recorded(counts, fragment, allow_failures):
    result = {**UNCOUNTED, **counts}
    reasons = judge(result, "", allow_failures=allow_failures, prompts=20)
    assert len(reasons) == 1 and fragment in reasons[0], reasons
    assert accounting(result, 20) == reasons[0]


def test_a_result_without_failed_is_not_read_as_zero_failures():
    assert judge({**UNCOUNTED, "completed": 4}, "", allow_failures=False, prompts=4) == [
        "4 prompts sent, but the result file's failed missing: its requests are not accounted for, so it is not a whole vllm bench serve result"]


def test_a_saved_result_is_read_as_json_or_as_the_text_it_holds(tmp_path):
    assert load_result(str(tmp_path / "absent.json")) is None
    (tmp_path / "broken.json").write_text('{"completed": 4,')
    assert load_result(str(tmp_path / "broken.json")) == '{"completed": 4,'
    (tmp_path / "good.json").write_text('{"completed": 4, "failed": 0}')
    assert load_result(str(tmp_path / "good.json")) == {"completed": 4, "failed": 0}


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"concurrencies": []}, "concurrencies"),
        ({"concurrencies": [1, 0]}, "concurrencies"),
        ({"concurrencies": [2, 2]}, "repeats"),
        ({"prompts_per_concurrency": 0}, "prompts_per_concurrency"),
        ({"output_tokens": -1}, "output_tokens"),
        # The sweep's bounds: a run of millions of prompts or tokens is a typo, not a benchmark.
        ({"concurrencies": [1, 5000]}, "concurrencies[1]: 5000 is out of range"),
        ({"prompts_per_concurrency": 10**6}, "prompts_per_concurrency: 1000000 is out of range"),
        ({"input_tokens": 10**7}, "input_tokens: 10000000 is out of range"),
        ({"dataset": "natural"}, "documents_dir"),
        ({"runner": "exec"}, "container"),
        ({"runner": "container"}, "image"),
        ({"label": "../escape"}, "label: '../escape' must be a plain name"),
        ({"dataset": "natural", "documents_dir": "/nowhere"}, "documents_dir: /nowhere is not a folder on this host"),
        ({"runner": "exec", "container": "vllm-llm"}, "runner: exec needs the docker command on this host"),
        ({"runner": "local"}, "runner: local needs the vllm command on this host's PATH"),
    ],
)
def test_bad_requests_are_named(change, fragment):
    assert any(fragment in problem for problem in validate(dict(VALID, **change)))


def test_a_natural_request_with_documents_on_the_host_is_valid(tmp_path):
    assert validate(dict(VALID, dataset="natural", documents_dir=str(tmp_path), runner="local", vllm="/usr/bin/vllm")) == []
    assert validate(dict(VALID, runner="exec", container="vllm-llm", docker="/usr/bin/docker")) == []


def test_valid_request():
    assert validate(VALID) == []


def test_paragraphs_split_on_blank_lines():
    text = "# Title\n\nFirst line\nsecond line\n\n\n  \nLast one.\n"
    assert split_paragraphs(text) == ["# Title", "First line\nsecond line", "Last one."]


def test_chunks_pack_to_the_target_and_skip_what_cannot_fit():
    paragraphs = [("a", 40), ("b", 40), ("c", 40), ("huge table", 500), ("d", 90), ("e", 20)]
    chunks = pack_chunks(paragraphs, 100)
    assert [(c["text"], c["tokens"]) for c in chunks] == [("a\n\nb", 80), ("c", 40), ("d", 90)]


def test_a_short_remainder_is_dropped():
    assert pack_chunks([("a", 90), ("b", 30)], 100) == [{"text": "a", "tokens": 90}]


def test_sets_are_disjoint_and_sized_per_concurrency():
    chunks = [{"text": str(i), "tokens": 1} for i in range(10)]
    sets = disjoint_sets(chunks, [1, 2, 4])
    assert [len(s) for s in sets] == [1, 2, 4]
    texts = [c["text"] for s in sets for c in s]
    assert len(texts) == len(set(texts))


def test_not_enough_documents_says_what_to_change():
    with pytest.raises(ValueError, match="3 chunks, and 7 disjoint prompts are needed .1 \\+ 2 \\+ 4.; add documents"):
        disjoint_sets([{"text": "x", "tokens": 1}] * 3, [1, 2, 4])


def test_dataset_lines_wrap_each_chunk_in_the_instruction():
    lines = dataset_lines("Extract.", [{"text": "one", "tokens": 1}, {"text": "two\nlines", "tokens": 2}]).splitlines()
    assert [json.loads(line) for line in lines] == [{"prompt": "Extract.\n\none"}, {"prompt": "Extract.\n\ntwo\nlines"}]


def common_args(dataset):
    return bench_args(base_url="http://127.0.0.1:8000", model="tiny", tokenizer="/models/tiny", concurrency=4,
                      num_prompts=24, dataset=dataset, input_tokens=4096, output_tokens=128,
                      dataset_path="/bench/natural-c4.jsonl", result_dir="/bench", result_filename="c4.json", seed=1001)


def test_random_args_ignore_eos_natural_do_not():
    random_args = common_args("random")
    assert random_args[:2] == ["bench", "serve"]
    assert "--ignore-eos" in random_args and "--random-input-len" in random_args
    natural = common_args("natural")
    assert "--ignore-eos" not in natural
    assert natural[natural.index("--dataset-name") + 1] == "custom"
    assert natural[natural.index("--dataset-path") + 1] == "/bench/natural-c4.jsonl"
    for args in (random_args, natural):
        assert args[args.index("--temperature") + 1] == "0"
        assert args[args.index("--max-concurrency") + 1] == "4"
        assert not any("key" in a.lower() for a in args)


def test_runners():
    common = {"docker": "/usr/bin/docker", "container": "vllm-llm", "image": "r/vllm@sha256:" + "0" * 64,
              "workdir": "/var/lib/sparkfleet/bench/x", "models_dir": "/srv/models",
              "host_url": "http://127.0.0.1:8001", "container_url": "http://127.0.0.1:8000"}
    exec_plan = runner_command("exec", **common)
    assert exec_plan["prefix"] == ["/usr/bin/docker", "exec", "--env", "OPENAI_API_KEY", "vllm-llm", "vllm"]
    assert (exec_plan["base_url"], exec_plan["copy_in"]) == ("http://127.0.0.1:8000", True)
    container_plan = runner_command("container", **common)
    assert container_plan["prefix"][-1] == common["image"]
    assert "/var/lib/sparkfleet/bench/x:/bench" in container_plan["prefix"]
    assert "/srv/models:/models:ro" in container_plan["prefix"]
    assert (container_plan["base_url"], container_plan["data_dir"]) == ("http://127.0.0.1:8001", "/bench")
    local_plan = runner_command("local", **common)
    assert (local_plan["prefix"], local_plan["data_dir"]) == (["vllm"], "/var/lib/sparkfleet/bench/x")


def test_local_tokenizer_maps_the_models_mount():
    assert local_tokenizer("/models/gemma", "/srv/models/") == "/srv/models/gemma"
    assert local_tokenizer("/opt/weights", "/srv/models") == "/opt/weights"


def test_table_has_one_row_per_concurrency():
    rows = [dict(figures(GOOD), concurrency=2, acceptance=0.9583), dict(concurrency=4, completed=24, failed=0, acceptance=None)]
    table = markdown_table(rows).splitlines()
    assert len(table) == 6 and table[0] == "A user's latency: no run at one stream (concurrency 1), so no median TTFT a user would see."
    assert table[4].startswith("| 2 | 4 / 0 | 37.5 | 42.1 |") and table[4].endswith("| 569.2 | 95.8% |")
    assert table[5].endswith("| - | - |")
    single = markdown_table([dict(figures(GOOD), concurrency=1)]).splitlines()
    assert single[0].startswith("A user's latency: median TTFT 37.5 ms at one stream, then ") and single[0].endswith(" ms per output token.")


RUN = {"concurrency": 4, "output_throughput": 120.5, "mean_tpot_ms": 20.1, "reasons": []}


def test_registered_results_of_the_right_shape_make_a_report():
    correctness = {"passed": 19, "total": 20, "comparison": {"changed_ids": ["arith-1"], "reference_label": "base"}}
    metrics = {"workload": {"requests": 10, "prompt_to_generation_ratio": 5.0, "recommended_max_model_len": 8192, "coverage": 0.99}}
    assert report_problems({"runs": [RUN, dict(RUN, concurrency=8, output_throughput=None)]}, correctness, metrics) == []
    assert report_problems({"runs": [RUN]}, None, {"workload": None}) == []


@pytest.mark.parametrize(
    ("bench", "correctness", "metrics", "fragment"),
    [({"runs": {"c4": RUN}}, None, None, "bench.runs: not a list of runs; pass the registered result of vllm_bench itself"),
     ({"runs": [dict(RUN, concurrency=True)]}, None, None, "bench.runs[0].concurrency: True is not a stream count"),
     ({"runs": [dict(RUN, mean_tpot_ms="20")]}, None, None, "bench.runs[0]: mean_tpot_ms not a number"),
     ({"runs": [RUN]}, {"passed": 3, "total": 4, "comparison": {"changed_ids": "arith-1"}}, None, "correctness: not a result of"),
     ({"runs": [RUN]}, None, {"workload": "busy"}, "metrics.workload: not a workload profile; pass the registered result of vllm_metrics_info"),
     ({"runs": [RUN]}, None, {"workload": {"requests": 3, "recommended_max_model_len": 4096}}, "metrics.workload: not a workload profile")],
)
def test_registered_results_of_another_shape_name_the_option(bench, correctness, metrics, fragment):
    problems = report_problems(bench, correctness, metrics)
    assert len(problems) == 1 and fragment in problems[0], problems


def test_a_report_names_what_the_benchmark_did_not_record():
    assert not_recorded({"runs": [RUN], "reasons": []}) == ""
    assert not_recorded({"runs": [RUN]}) == ""
    text = not_recorded({"runs": [RUN], "reasons": ["concurrency 8: 32 prompts sent, 30 completed, 0 failed: 2 unaccounted for"]})
    assert text.startswith("Not recorded (the table holds only the runs recorded; a failed run stops the concurrencies after it):")
    assert "- concurrency 8: 32 prompts sent, 30 completed, 0 failed: 2 unaccounted for\n" in text


@pytest.mark.parametrize("reasons", ["concurrency 8 failed", [1], {"c8": "failed"}, [None]])
def test_reasons_of_another_shape_are_refused(reasons):
    assert report_problems({"runs": [RUN], "reasons": reasons}, None, None) == [
        "bench.reasons: not a list of reasons; pass the registered result of vllm_bench itself"]


@pytest.mark.parametrize("label", ["tiny-natural", "seqs-8", "v0.34_a"])
def test_a_measurements_documents_have_one_folder_per_label(label):
    from ansible_collections.sparkfleet.vllm.plugins.filter.vllm import FilterModule

    folder = FilterModule().filters()["measure_documents_folder"](label)
    assert folder == f"/var/lib/sparkfleet/bench-documents/{label}"


@pytest.mark.parametrize("label", ["../etc", "a/b", "", ".hidden", None, 5, "two words"])
def test_a_label_that_is_no_plain_name_names_no_folder(label):
    from ansible.errors import AnsibleFilterError

    from ansible_collections.sparkfleet.vllm.plugins.filter.vllm import FilterModule

    with pytest.raises(AnsibleFilterError, match="measure_documents_folder: label: .* must be a plain name"):
        FilterModule().filters()["measure_documents_folder"](label)
