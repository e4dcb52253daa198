"""The metrics reader on /metrics text recorded from the lab's real CPU vLLM 0.32 with ngram speculative decoding.

The before/after pair was taken around one `vllm bench serve` run (random 256-in / 96-out,
concurrency 2, 4 prompts) whose own report said 88 drafts, 264 draft tokens, 253 accepted,
per position 100 / 95.45 / 92.05 %: the counters read here must agree with it.
"""

import http.server
import json
import pathlib
import socket
import threading

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_metrics import (
    acceptance,
    counter_regression,
    counters_delta,
    parse_samples,
    read_metrics,
    speculative_counters,
    summarize,
    workload_profile,
)

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
BEFORE = (FIXTURES / "metrics-ngram-before-bench.txt").read_text()
AFTER = (FIXTURES / "metrics-ngram-after-bench.txt").read_text()
BENCH = json.loads((FIXTURES / "bench-random-c2-ngram.json").read_text())


def test_summary_of_a_real_server():
    summary = summarize(parse_samples(AFTER))
    assert summary["prompt_tokens"] == 2179
    assert summary["generation_tokens"] == 480
    assert summary["prompt_to_generation_ratio"] == pytest.approx(2179 / 480)
    assert summary["requests_finished"]["length"] == 5
    assert summary["requests_finished_total"] == 5
    assert summary["requests_running"] == 0 and summary["requests_waiting"] == 0
    assert summary["kv_cache_usage"] == 0.0
    assert summary["prefix_cache_queries"] == 2179
    assert summary["prefix_cache_hit_rate"] == 0.0
    assert summary["ttft_mean_ms"] > 0 and summary["itl_mean_ms"] > 0
    assert summary["prompt_length"]["count"] == 5
    assert summary["prompt_length"]["buckets"][-1] == {"le": "+Inf", "count": 5}


def test_acceptance_of_one_run_matches_vllm_bench():
    run = acceptance(counters_delta(speculative_counters(parse_samples(BEFORE)), speculative_counters(parse_samples(AFTER))))
    assert (run["drafts"], run["draft_tokens"], run["accepted_tokens"]) == (
        BENCH["spec_decode_num_drafts"], BENCH["spec_decode_draft_tokens"], BENCH["spec_decode_accepted_tokens"])
    assert run["acceptance"] * 100 == pytest.approx(BENCH["spec_decode_acceptance_rate"])
    assert run["mean_acceptance_length"] == pytest.approx(BENCH["spec_decode_acceptance_length"])
    # vllm bench saves per-position rates as fractions and prints them as percent.
    assert [p["rate"] for p in run["acceptance_per_position"]] == pytest.approx(BENCH["spec_decode_per_position_acceptance_rates"])


def test_counters_that_went_backwards_give_no_acceptance_and_say_why():
    before, after = speculative_counters(parse_samples(AFTER)), speculative_counters(parse_samples(BEFORE))
    assert counters_delta(before, after) is None and acceptance(counters_delta(before, after)) is None
    assert "went backwards" in counter_regression(before, after) and "restarted" in counter_regression(before, after)
    restarted = {"drafts": 2, "draft_tokens": 6, "accepted_tokens": 6, "accepted_per_position": {0: 2, 1: 2, 2: 2}}
    assert counters_delta(speculative_counters(parse_samples(BEFORE)), restarted) is None
    assert counter_regression(speculative_counters(parse_samples(BEFORE)), speculative_counters(parse_samples(AFTER))) is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("<html><body>Not Found</body></html>", "not Prometheus text"), ("vllm:num_requests_running{engine=\"0\"} NaN\n", "NaN"),
     ("vllm:num_requests_running{engine=\"0\"} +Inf\n", "is infinite"),
     ("node_load1 0.5\n", "no vllm: metric"), ("", "no vllm: metric")],
)
def test_replies_that_are_not_vllm_metrics_are_clear_errors(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_samples(text)


def test_no_drafter_no_acceptance():
    without = "\n".join(line for line in AFTER.splitlines() if "spec_decode" not in line) + "\n"
    assert summarize(parse_samples(without))["speculative_decoding"] is None
    assert counters_delta(None, speculative_counters(parse_samples(AFTER))) is None


def test_series_of_two_engines_are_summed():
    text = "\n".join([
        "# TYPE vllm:prompt_tokens counter",
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0',
        'vllm:prompt_tokens_total{engine="1",model_name="m"} 50.0',
        "# TYPE vllm:generation_tokens counter",
        'vllm:generation_tokens_total{engine="0",model_name="m"} 10.0',
        'vllm:generation_tokens_total{engine="1",model_name="m"} 5.0',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5',
    ]) + "\n"
    summary = summarize(parse_samples(text))
    assert (summary["prompt_tokens"], summary["generation_tokens"]) == (150, 15)
    assert summary["prompt_to_generation_ratio"] == 10
    # Usage is a share per engine: the fullest one is what runs out first.
    assert summary["kv_cache_usage"] == 0.5


def histogram_text(name, buckets, total_sum):
    lines = [f"# HELP {name} test", f"# TYPE {name} histogram"]
    for le, count in buckets:
        lines.append(f'{name}_bucket{{engine="0",le="{le}",model_name="m"}} {count}')
    lines.append(f'{name}_count{{engine="0",model_name="m"}} {buckets[-1][1]}')
    lines.append(f'{name}_sum{{engine="0",model_name="m"}} {total_sum}')
    return "\n".join(lines)


def seed_000_like(prompt_tokens=63.1e6, generation_tokens=2.21e6):
    """Seed 000's lifetime: 7,138 requests, 59% <= 5k, 91% <= 20k, 98.6% <= 50k, 99.8% <= 100k, all <= 200k."""
    prompts = [("1000", 1000), ("2000", 2500), ("5000", 4211), ("10000", 5500), ("20000", 6496), ("50000", 7038),
               ("100000", 7124), ("200000", 7138), ("+Inf", 7138)]
    generations = [("100", 3000), ("200", 5000), ("500", 6210), ("1000", 7100), ("2000", 7138), ("+Inf", 7138)]
    return "\n".join([
        "# TYPE vllm:prompt_tokens counter", f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt_tokens}',
        "# TYPE vllm:generation_tokens counter", f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {generation_tokens}',
        histogram_text("vllm:request_prompt_tokens", prompts, 1.0),
        histogram_text("vllm:request_generation_tokens", generations, 1.0),
    ]) + "\n"


def test_workload_profile_of_seed_000():
    profile = workload_profile(summarize(parse_samples(seed_000_like())), coverage=0.99)
    assert profile["prompt_to_generation_ratio"] == pytest.approx(28.55, rel=0.01)
    assert profile["prefill_heavy"] is True
    assert profile["prompt_tokens_bound"] == 100000
    assert profile["generation_tokens_bound"] == 1000
    assert profile["recommended_max_model_len"] == 101376
    assert profile["requests_over_prompt_bound"] == 14
    assert profile["reasons"] == []


def test_lower_coverage_recommends_less_and_says_what_it_rejects():
    profile = workload_profile(summarize(parse_samples(seed_000_like())), coverage=0.9)
    assert profile["prompt_tokens_bound"] == 20000
    assert profile["requests_over_prompt_bound"] == 7138 - 6496


def test_decode_heavy_workload():
    assert workload_profile(summarize(parse_samples(seed_000_like(prompt_tokens=1e6, generation_tokens=2e6))))["prefill_heavy"] is False


def test_no_requests_no_recommendation():
    profile = workload_profile(summarize(parse_samples(histogram_text("vllm:request_prompt_tokens", [("+Inf", 0)], 0) + "\n")))
    assert profile["recommended_max_model_len"] is None
    assert "no requests" in profile["reasons"][0]


def test_open_ended_bucket_gives_no_recommendation():
    text = seed_000_like().replace('model_name="m"} 7124', 'model_name="m"} 7000').replace(
        'le="200000",model_name="m"} 7138', 'le="200000",model_name="m"} 7000')
    profile = workload_profile(summarize(parse_samples(text)), coverage=0.99)
    assert profile["prompt_tokens_bound"] is None
    assert "open-ended last bucket" in profile["reasons"][0]


def test_draft_positions_that_are_not_numbers_are_a_clear_error():
    odd = AFTER.replace('position="0"', 'position="first"')
    with pytest.raises(ValueError, match="positions 'first', not draft positions"):
        speculative_counters(parse_samples(odd))


class MetricsHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.authorizations.append(self.headers.get("Authorization"))
        status, body = self.server.answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_args):
        pass


@pytest.fixture
def metrics_server():
    """A local /metrics answering what each test sets, recording the Authorization header of every request."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler)
    server.answer, server.authorizations = (200, AFTER), []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def url_of(server):
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_read_metrics_sends_the_key_and_parses_the_samples(metrics_server):
    samples = read_metrics(url_of(metrics_server), "k" * 20, 5)
    assert speculative_counters(samples)["draft_tokens"] == speculative_counters(parse_samples(AFTER))["draft_tokens"]
    assert read_metrics(url_of(metrics_server), None, 5) == samples
    assert metrics_server.authorizations == ["Bearer " + "k" * 20, None]


@pytest.mark.parametrize(
    ("answer", "fragments"),
    [((401, "Unauthorized"), ["/metrics answered HTTP 401: the server refuses the API key", "give the instance's key in api_key"]),
     ((500, "boom"), ["/metrics answered HTTP 500: boom"]),
     ((200, "<html>a login page</html>"), ["/metrics did not answer Prometheus text: not Prometheus text exposition"]),
     ((200, "node_load1 0.5\n"), ["/metrics did not answer Prometheus text: no vllm: metric"])],
    ids=["401", "500", "html", "not-vllm"],
)
def test_read_metrics_names_what_answered_instead(metrics_server, answer, fragments):
    metrics_server.answer = answer
    with pytest.raises(ValueError) as raised:
        read_metrics(url_of(metrics_server), "k" * 20, 5)
    assert str(raised.value).startswith(url_of(metrics_server) + "/metrics ")
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_read_metrics_names_a_closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(ValueError, match="/metrics did not answer: not answering yet .ConnectionRefusedError"):
        read_metrics(url, None, 5)
