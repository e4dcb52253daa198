"""playbooks/rollout.yml on the serving lab host, its two instances as two units sharing the host,
no gateway in front. In check mode it lists the batches and changes nothing; a bad change (the
canary's checkpoint swapped for the tiny variant, whose greedy answers differ) is rolled back on the
canary and the second batch never starts. The cluster scenario rolls a good change out through the
gateway with the cluster whole in a batch. The lab measures small (one repeat at two streams of
64-token prompts, on two busy cores, speed not judged): the lab proves the path and the correctness
verdict; the speed verdict and its spread over the repeats are unit-tested."""

import json
import time

import pytest
from serving_lab import SERVE, instances_json, serving_state
from site_runner import ROOT, docker_host, playbook

SMALL = {"rollout_repeats": 1, "rollout_concurrencies": [2], "rollout_prompts_per_concurrency": 2, "rollout_input_tokens": 64,
         "rollout_output_tokens": 16, "rollout_correctness_max_tokens": 16, "rollout_judge_speed": False,
         "rollout_documents_dir": str(ROOT / "docs" / "hardware")}
# Both units change, so there is a second batch; the canary's change is the bad one.
BAD = {"vllm_instance_overrides": {"first": {"model": "/models/tiny-llama-variant"}, "second": {"max_num_seqs": 8}}}
GOOD = {"vllm_instance_overrides": {"first": {"max_num_seqs": 8}, "second": {"max_num_seqs": 8}}}


@pytest.fixture(scope="module")
def serve():
    return docker_host(SERVE)


def rollout(tmp_path, label, change, *args):
    settings = tmp_path / f"{label}.json"
    settings.write_text(json.dumps({**json.loads(instances_json()), **SMALL, **change, "rollout_label": label,
                                    "rollout_report_dir": str(tmp_path / "reports")}))
    started = time.monotonic()
    result = playbook("rollout.yml", "-e", f"@{settings}", *args)
    print(f"rollout {label}: rc {result.returncode} after {time.monotonic() - started:.0f} s")
    return result, tmp_path / "reports" / label


def plan_of(host, path):
    return json.loads(host.file(path).content_string)


def test_check_mode_lists_the_batches_and_changes_nothing(serve, tmp_path):
    before = serving_state(serve)
    result, report = rollout(tmp_path, "checked", GOOD, "--check")
    assert result.returncode == 0, result.stdout[-3000:]
    assert f'"batch 1 (canary): {SERVE}/first (' in result.stdout and f'"batch 2: {SERVE}/second (' in result.stdout, result.stdout[-3000:]
    assert serving_state(serve) == before and not report.exists()


def test_a_bad_change_is_rolled_back_on_the_canary_and_the_next_batch_never_starts(serve, tmp_path):
    second_started = serve.check_output("docker inspect --format '{{.State.StartedAt}}' vllm-second")
    result, report = rollout(tmp_path, "bad", BAD)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"Rollout bad stopped: {SERVE}/first: correctness: " in output, output[-3000:]
    assert "greedy answers changed" in output and "more than rollout_max_changed_answers (0)" in output
    assert plan_of(serve, "/etc/sparkfleet/vllm/first.json")["weights"] == plan_of(serve, "/etc/sparkfleet/vllm/last-good/first.json")["weights"]
    assert "tiny-llama-variant" not in serve.check_output("docker inspect --format '{{.Args}}' vllm-first"), "the canary serves its last good weights"
    assert serve.run("curl -sf http://127.0.0.1:8001/health").rc == 0
    assert serve.check_output("docker inspect --format '{{.State.StartedAt}}' vllm-second") == second_started, "batch 2 never started"
    assert '"--max-num-seqs"' not in serve.file("/etc/sparkfleet/vllm/second.json").content_string
    markdown = (report / "report.md").read_text()
    print(markdown)
    assert f"| 1 (canary) | {SERVE}/first | regressed |" in markdown and f"| 2 | {SERVE}/second | not started |" in markdown
    assert f"- {SERVE}/second (not started): an earlier batch failed, so this batch never started" in markdown
    records = json.loads((report / "report.json").read_text())["records"]
    assert [(record["id"], record["verdict"]) for record in records] == [(f"{SERVE}/first", "regressed")]
    assert records[0]["reasons"][-1] == "rolled back: the last good settings serve again"
