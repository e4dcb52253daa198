# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What vLLM's /metrics says, in the figures an operator reads, and the workload it describes.

Private to the collection. The text is parsed by prometheus_client's own parser, never by
regular expressions. Every series is summed over its engine and model labels, so a
data-parallel server reads as one. Lessons encoded here: seed 000 Step 4 (size the context
from the prompt-length histogram, not the model maximum; a prompt-heavy workload is
benchmarked with long prompts and short answers) and the acceptance rate of speculative
decoding read from the counters before and after a run.
"""

from __future__ import annotations

import math
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import http, reply_problem

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    text_string_to_metric_families = None

PROMETHEUS_CLIENT_MISSING = (
    "the Python library prometheus_client is missing on this host; install it "
    "(the vllm role does: python3-prometheus-client) to read vLLM's /metrics"
)

PROMETHEUS_CLIENT_PURPOSE = "to read vLLM's /metrics (Debian and Ubuntu package python3-prometheus-client, which the vllm role installs)"

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_samples(text: str) -> Samples:
    """Every sample of the exposition, by sample name (``..._total``, ``..._bucket`` and so on)."""
    if text_string_to_metric_families is None:
        raise RuntimeError(PROMETHEUS_CLIENT_MISSING)
    samples: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                if math.isnan(value):
                    raise ValueError(f"sample {sample.name} is NaN")
                if math.isinf(value):
                    raise ValueError(f"sample {sample.name} is infinite")
                samples.setdefault(sample.name, []).append((dict(sample.labels), value))
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise ValueError(f"not Prometheus text exposition ({error}); first characters {text[:80]!r}") from error
    if not any(name.startswith("vllm:") for name in samples):
        raise ValueError(f"no vllm: metric in it (is this a vLLM server?); first characters {text[:80]!r}")
    return samples


def read_metrics(url: str, api_key: str | None, timeout: float) -> Samples:
    """Every sample of ``<url>/metrics``; ValueError saying what answered instead.

    The endpoint's key goes with every read: the vllm role's instances leave /metrics open, but an
    endpoint given by url may sit behind a proxy or another install that checks the key there too.
    """
    metrics_url = url + "/metrics"
    reply = http("GET", metrics_url, api_key, timeout=timeout)
    if reply.status != 200:
        raise ValueError(reply_problem(reply, metrics_url))
    try:
        return parse_samples(reply.body)
    except ValueError as error:
        raise ValueError(f"{metrics_url} did not answer Prometheus text: {error}") from error


def total(samples: Samples, name: str) -> float | None:
    """Sum of one sample name over every label set; None when the server does not export it."""
    values = [value for _labels, value in samples.get(name, [])]
    return sum(values) if values else None


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    summed: dict[str, float] = {}
    for labels, value in samples.get(name, []):
        key = labels.get(label, "")
        summed[key] = summed.get(key, 0.0) + value
    return summed


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def histogram(samples: Samples, name: str) -> dict[str, t.Any]:
    """Count, mean and cumulative buckets of one histogram summed over its label sets."""
    count = total(samples, f"{name}_count")
    buckets = by_label(samples, f"{name}_bucket", "le")
    ordered = sorted(((float(le), n) for le, n in buckets.items()), key=lambda pair: pair[0])
    return {
        "count": int(count) if count is not None else None,
        "mean": ratio(total(samples, f"{name}_sum"), count),
        "buckets": [{"le": le if math.isfinite(le) else "+Inf", "count": int(n)} for le, n in ordered],
    }


def speculative_counters(samples: Samples) -> dict[str, t.Any] | None:
    """The raw speculative-decoding counters; None when the server runs without a drafter."""
    drafts = total(samples, "vllm:spec_decode_num_drafts_total")
    if drafts is None:
        return None
    per_position = by_label(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")
    odd = sorted(position for position in per_position if not position.isdigit())
    if odd:
        raise ValueError(f"vllm:spec_decode_num_accepted_tokens_per_pos_total has positions {', '.join(map(repr, odd))}, "
                         "not draft positions 0, 1, ...; is this a vLLM server?")
    return {
        "drafts": int(drafts),
        "draft_tokens": int(total(samples, "vllm:spec_decode_num_draft_tokens_total") or 0),
        "accepted_tokens": int(total(samples, "vllm:spec_decode_num_accepted_tokens_total") or 0),
        "accepted_per_position": {int(position): int(n) for position, n in per_position.items()},
    }


def acceptance(counters: t.Mapping[str, t.Any] | None) -> dict[str, t.Any] | None:
    """Acceptance overall (accepted / draft tokens) and per draft position (accepted / drafts)."""
    if counters is None:
        return None
    drafts = counters["drafts"]
    return {
        **counters,
        "acceptance": ratio(counters["accepted_tokens"], counters["draft_tokens"]),
        "mean_acceptance_length": 1 + counters["accepted_tokens"] / drafts if drafts else None,
        "acceptance_per_position": [
            {"position": position, "accepted": accepted, "rate": ratio(accepted, drafts)}
            for position, accepted in sorted(counters["accepted_per_position"].items())
        ],
    }


def counter_regression(before: t.Mapping[str, t.Any] | None, after: t.Mapping[str, t.Any] | None) -> str | None:
    """Why the counters cannot be subtracted (one went backwards: the server restarted mid-run), or None."""
    if before is None or after is None:
        return None
    pairs = [(name, before[name], after[name]) for name in ("drafts", "draft_tokens", "accepted_tokens")]
    pairs += [(f"accepted at position {p}", n, after["accepted_per_position"].get(p, 0)) for p, n in before["accepted_per_position"].items()]
    backwards = [f"{name} {old} -> {new}" for name, old, new in pairs if new < old]
    if backwards:
        return ("the speculative-decoding counters went backwards (" + ", ".join(backwards) + "): the server restarted "
                "during the run, so no acceptance can be computed from them")
    return None


def counters_delta(before: t.Mapping[str, t.Any] | None, after: t.Mapping[str, t.Any] | None) -> dict[str, t.Any] | None:
    """What a run added to the speculative-decoding counters; None when either side is missing or they went backwards."""
    if before is None or after is None or counter_regression(before, after):
        return None
    positions = set(before["accepted_per_position"]) | set(after["accepted_per_position"])
    return {
        "drafts": after["drafts"] - before["drafts"],
        "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
        "accepted_tokens": after["accepted_tokens"] - before["accepted_tokens"],
        "accepted_per_position": {
            p: after["accepted_per_position"].get(p, 0) - before["accepted_per_position"].get(p, 0) for p in sorted(positions)
        },
    }


def busy_problem(samples: Samples) -> str | None:
    """Why measuring now would mix someone else's load into the figures (seed 002: gateway traffic made an
    MTP-2 against MTP-3 comparison meaningless), or None when the server is idle."""
    running = int(total(samples, "vllm:num_requests_running") or 0)
    waiting = int(total(samples, "vllm:num_requests_waiting") or 0)
    if running or waiting:
        return (f"{running} requests running and {waiting} waiting that are not ours; the figures would include their load. "
                "Drain the node from its gateway and wait for them to finish")
    return None


def summarize(samples: Samples) -> dict[str, t.Any]:
    """The figures an operator reads off a vLLM server's /metrics."""
    prompt_tokens = total(samples, "vllm:prompt_tokens_total")
    generation_tokens = total(samples, "vllm:generation_tokens_total")
    kv_usage = [value for _labels, value in samples.get("vllm:kv_cache_usage_perc", [])]
    prefix_queries = total(samples, "vllm:prefix_cache_queries_total")
    prefix_hits = total(samples, "vllm:prefix_cache_hits_total")
    ttft = histogram(samples, "vllm:time_to_first_token_seconds")
    itl = histogram(samples, "vllm:inter_token_latency_seconds")
    e2e = histogram(samples, "vllm:e2e_request_latency_seconds")
    finished = {reason: int(n) for reason, n in by_label(samples, "vllm:request_success_total", "finished_reason").items()}
    return {
        "requests_running": int(total(samples, "vllm:num_requests_running") or 0),
        "requests_waiting": int(total(samples, "vllm:num_requests_waiting") or 0),
        "kv_cache_usage": max(kv_usage) if kv_usage else None,
        "prompt_tokens": int(prompt_tokens or 0),
        "generation_tokens": int(generation_tokens or 0),
        "prompt_to_generation_ratio": ratio(prompt_tokens, generation_tokens),
        "requests_finished": finished,
        "requests_finished_total": sum(finished.values()),
        "preemptions": int(total(samples, "vllm:num_preemptions_total") or 0),
        "prefix_cache_queries": int(prefix_queries or 0),
        "prefix_cache_hits": int(prefix_hits or 0),
        "prefix_cache_hit_rate": ratio(prefix_hits, prefix_queries),
        "ttft_mean_ms": ttft["mean"] * 1000 if ttft["mean"] is not None else None,
        "itl_mean_ms": itl["mean"] * 1000 if itl["mean"] is not None else None,
        "e2e_mean_ms": e2e["mean"] * 1000 if e2e["mean"] is not None else None,
        "prompt_length": histogram(samples, "vllm:request_prompt_tokens"),
        "generation_length": histogram(samples, "vllm:request_generation_tokens"),
        "speculative_decoding": acceptance(speculative_counters(samples)),
    }


def covering_bound(length: t.Mapping[str, t.Any], share: float) -> tuple[float | None, float]:
    """Smallest finite bucket bound holding at least ``share`` of the requests, and the share it holds."""
    count = length.get("count") or 0
    for bucket in length.get("buckets", []):
        if bucket["le"] != "+Inf" and bucket["count"] >= share * count:
            return bucket["le"], bucket["count"] / count
    return None, 1.0


def round_up(value: float, step: int) -> int:
    return int(math.ceil(value / step) * step)


def workload_profile(
    summary: t.Mapping[str, t.Any],
    coverage: float = 0.99,
    prefill_heavy_ratio: float = 4.0,
    context_step: int = 1024,
) -> dict[str, t.Any]:
    """Seed 000 Step 4: the prompt:output ratio, prefill-heavy or not, and the context that covers a share of requests.

    The recommended max_model_len is the smallest prompt-length bucket holding ``coverage`` of
    the requests plus the generation-length bucket doing the same, rounded up to
    ``context_step``. The histogram's buckets are coarse (1-2-5 steps), so the figure errs long.
    """
    prompts = summary["prompt_length"]
    requests = prompts.get("count") or 0
    profile: dict[str, t.Any] = {
        "requests": requests,
        "coverage": coverage,
        "prompt_to_generation_ratio": summary["prompt_to_generation_ratio"],
        "prefill_heavy": None,
        "prompt_tokens_bound": None,
        "generation_tokens_bound": None,
        "recommended_max_model_len": None,
        "requests_over_prompt_bound": None,
        "prompt_length_shares": [],
        "reasons": [],
    }
    if not requests:
        profile["reasons"].append("the server has finished no requests yet: no workload to profile")
        return profile
    ratio_value = summary["prompt_to_generation_ratio"]
    if ratio_value is not None:
        profile["prefill_heavy"] = ratio_value >= prefill_heavy_ratio
    profile["prompt_length_shares"] = [
        {"le": bucket["le"], "share": bucket["count"] / requests} for bucket in prompts["buckets"] if bucket["count"]
    ]
    prompt_bound, _held = covering_bound(prompts, coverage)
    generation_bound, _generation_held = covering_bound(summary["generation_length"], coverage)
    profile["prompt_tokens_bound"] = prompt_bound
    profile["generation_tokens_bound"] = generation_bound
    if prompt_bound is None or generation_bound is None:
        profile["reasons"].append(
            f"more than {100 - coverage * 100:g}% of requests fall in the histogram's open-ended last bucket; "
            "it cannot tell how long they were, so no max_model_len is recommended"
        )
        return profile
    over = [b["count"] for b in prompts["buckets"] if b["le"] == prompt_bound][0]
    profile["requests_over_prompt_bound"] = requests - over
    profile["recommended_max_model_len"] = round_up(prompt_bound + generation_bound, context_step)
    return profile
