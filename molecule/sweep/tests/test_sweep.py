"""playbooks/mtp_sweep.yml on a serving host prepared like the serving lab: instance "second" (the
tiny variant model with ngram speculative decoding) swept over draft counts 0 and 2, two repeats
each at two concurrent streams, on natural text (two variants keep the suite within its time budget;
the unit tests cover longer sweeps).

The first run measures every variant, decides and leaves the winner serving; the second adds a
variant that cannot start, skips the two finished ones, and restores the starting settings. A
variant whose answers change is judged out by the unit tests (test_vllm_sweep.py); the real
correctness diff it rests on is the serving lab's (test_a_different_model_changes_answers). Figures printed here are measurements for the log, not thresholds.
"""

import json
import pathlib

import pytest
from serving_lab import KEY, instances_json, status
from site_runner import ROOT, assert_refused, docker_host, playbook

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_sweep import beats, figure

SERVE = "sparkfleet-molecule-sweep"
NGRAM = {"method": "ngram", "options": {"prompt_lookup_max": 3}}
SWEEP = {"sweep_instance": "second", "sweep_label": "lab-sweep", "sweep_repeats": 2, "sweep_concurrencies": [2],
         "sweep_prompts_per_concurrency": 1, "sweep_input_tokens": 256, "sweep_output_tokens": 96,
         "sweep_acceptance_max_tokens": 64, "sweep_correctness_max_tokens": 16, "vllm_version": "0.32.0",
         "sweep_documents_dir": str(ROOT / "docs")}


def ngram(count):
    return {"speculative": {**NGRAM, "num_speculative_tokens": count}} if count else {"speculative": {"num_speculative_tokens": 0}}


def sweep(report_dir, **settings):
    second = json.loads(instances_json())["vllm_instances"][1]
    extra = {"vllm_allow_dev_mode": True, "vllm_instances": [second], **SWEEP, "sweep_report_dir": str(report_dir), **settings}
    return playbook("mtp_sweep.yml", "-e", json.dumps(extra), limit=SERVE)


def records(report_dir):
    folder = pathlib.Path(report_dir) / SERVE / "lab-sweep" / "variants"
    return {path.name: path.stat().st_mtime_ns for path in folder.glob("*.json")}


def decision(report_dir):
    return json.loads((pathlib.Path(report_dir) / SERVE / "lab-sweep" / "decision.json").read_text())


def served_draft_count(host):
    args = json.loads(host.file("/etc/sparkfleet/vllm/second.json").content_string)["serve_args"]
    return json.loads(args[args.index("--speculative-config") + 1])["num_speculative_tokens"] if "--speculative-config" in args else 0


def container_started(host):
    return host.run("docker inspect --format '{{.Id}} {{.State.StartedAt}}' vllm-second").stdout


@pytest.fixture(scope="module")
def serve():
    return docker_host(SERVE)


@pytest.fixture(scope="module")
def first_sweep(serve, tmp_path_factory):
    report_dir = tmp_path_factory.mktemp("sweep")
    result = sweep(report_dir, sweep_draft_counts=[0, 2])
    print(result.stdout[result.stdout.find("TASK [Show the decision]"):][:3000])
    report = pathlib.Path(report_dir) / SERVE / "lab-sweep" / "report.md"
    if report.exists():
        print(report.read_text())
    return result, report_dir


def test_the_sweep_measures_every_variant_with_its_spread(first_sweep):
    result, report_dir = first_sweep
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    found = decision(report_dir)
    assert [v["name"] for v in found["variants"]] == ["k0", "k2"]
    for variant in found["variants"]:
        assert variant["status"] == "ok" and variant["gate"]["ok"], variant
        throughput = variant["summary"]["2"]["output_throughput"]
        assert throughput["n"] == 2 and throughput["mean"] > 0 and throughput["spread_pct"] is not None
    k0, k2 = found["variants"]
    assert k0["categories"]["code"]["acceptance"] is None, "no speculation, no acceptance"
    for variant in (k2,):
        assert set(variant["categories"]) == {"code", "prose", "chat", "structured"}
        assert all(c["acceptance"] is not None and c["output_tokens"] > 0 for c in variant["categories"].values())
        assert len(variant["summary"]["2"]["acceptance_per_position"]) == variant["draft_count"]
    report = (pathlib.Path(report_dir) / SERVE / "lab-sweep" / "report.md").read_text()
    for heading in ("## k0 (draft tokens 0): ok", "## k2 (draft tokens 2): ok", "| prose |", "±"):
        assert heading in report
    assert (pathlib.Path(report_dir) / SERVE / "lab-sweep" / "sweep.png").stat().st_size > 0


def test_the_decision_follows_the_objective_and_the_winner_serves(first_sweep, serve):
    _result, report_dir = first_sweep
    found = decision(report_dir)
    assert found["ok"] and found["winner"] in ("k0", "k2")
    variants = {v["name"]: v for v in found["variants"]}
    winner = variants[found["winner"]]

    def wins(challenger, holder):
        by_throughput = beats(figure(challenger["summary"], 2, "output_throughput"), figure(holder["summary"], 2, "output_throughput"), True, 0)
        by_tpot = not beats(figure(holder["summary"], 2, "output_throughput"), figure(challenger["summary"], 2, "output_throughput"), True, 0) \
            and beats(figure(challenger["summary"], 2, "mean_tpot_ms"), figure(holder["summary"], 2, "mean_tpot_ms"), False, 0)
        return by_throughput or by_tpot

    for name, variant in variants.items():
        if variant["rank"] > winner["rank"]:
            assert not wins(variant, winner), f"{name} beats the winner {winner['name']} beyond the spread"
    assert found["schedule_note"]
    assert served_draft_count(serve) == winner["draft_count"]
    assert status(serve, 8002, key=KEY) == "200"


def test_a_variant_the_plan_refuses_stops_the_sweep_before_the_first_variant(first_sweep, serve):
    _result, report_dir = first_sweep
    before = serve.file("/etc/sparkfleet/vllm/second.json").content_string, container_started(serve)
    variants = [{"name": "k0", "settings": ngram(0)}, {"name": "escape", "settings": {**ngram(2), "model": "/models/../etc"}}]
    result = sweep(report_dir, sweep_variants=variants)
    assert_refused(result, "in the sweep's variant escape (from sweep_variants or sweep_draft_counts); no variant ran",
                   "'/models/../etc' has a '..' segment")
    assert (serve.file("/etc/sparkfleet/vllm/second.json").content_string, container_started(serve)) == before


def test_a_rerun_skips_finished_variants_records_a_failing_one_and_restores_the_start(first_sweep, serve):
    _result, report_dir = first_sweep
    finished = records(report_dir)
    variants = [{"name": f"k{count}", "settings": ngram(count)} for count in (0, 2)]
    variants += [{"name": "broken", "settings": {**ngram(3), "extra_args": ["--no-such-flag"]}}]
    result = sweep(report_dir, sweep_variants=variants, sweep_keep_winner=False)
    print(result.stdout[result.stdout.find("TASK [Show the decision]"):][:3000])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    after = records(report_dir)
    assert {name: after[name] for name in finished} == finished, "the finished variants were not measured again"
    found = {v["name"]: v for v in decision(report_dir)["variants"]}
    assert found["broken"]["status"] == "failed" and found["broken"]["reason"], found["broken"]
    # A flag vLLM refuses: the cold start's first exit is passed over once (its unit starts it again), the second fails
    # the gate, and the role's rollback serves the last good settings.
    for said in ("failed its relaunch: vLLM health gate failed: the container is exited (exit code 2), after its cold start had "
                 "exited once already", "The last good settings were relaunched and serve again.", "unrecognized arguments: --no-such-flag"):
        assert said in found["broken"]["reason"], found["broken"]["reason"]
    assert decision(report_dir)["winner"] != "broken"
    assert not serve.file("/run/sparkfleet/vllm-maintenance").exists, "the failed relaunch's rollback cleared the maintenance flag"
    assert served_draft_count(serve) == 3, "sweep_keep_winner false restores the starting settings"
    assert status(serve, 8002, key=KEY) == "200"
