# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the seeds learned the hard way, checked before a launch: catalog contradictions, the
settings that crash or slow a unified-memory box, and the memory arithmetic of each instance.

Private to the collection; ``_vllm_plan.build_plan`` calls it for every instance. Each finding
is an error (the plan refuses) or a warning (shown, the run goes on), and names its reason.
"""

from __future__ import annotations

import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import (
    MULTIMODAL_FLOOR,
    UNQUANTIZED,
    VERSION,
    drafter_index,
    version_tuple,
    weights_path,
)

GIB = 1024**3
# --quantization methods that convert an unquantized checkpoint while it loads.
LOAD_TIME_METHODS = frozenset({"fp8", "bitsandbytes", "experts_int8", "ptpc_fp8", "fbgemm_fp8", "torchao"})


def drafter_path(model: str | None) -> str | None:
    """Where a catalog drafter is staged (vllm_models puts a repo under its own name)."""
    return f"/models/{model.rsplit('/', 1)[-1]}" if model else None


def catalog_defaults(instance: t.Mapping[str, t.Any], entry: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The settings an entry brings to an instance that names it (the instance's own keys win)."""
    settings = {**entry["instance_defaults"], "model": weights_path(entry)}
    speculative = instance.get("speculative")
    if isinstance(speculative, dict) and speculative.get("method") in entry["drafters"]:
        drafter = entry["drafters"][speculative["method"]]
        own_options = speculative.get("options") if isinstance(speculative.get("options"), dict) else {}
        filled = {
            "num_speculative_tokens": drafter["num_speculative_tokens"],
            **({"model": drafter_path(drafter["model"])} if drafter["model"] else {}),
            **speculative,
        }
        if drafter.get("options") or own_options:
            filled["options"] = {**drafter.get("options", {}), **own_options}
        settings["speculative"] = filled
    return settings


def speculative_method(instance: t.Mapping[str, t.Any]) -> str | None:
    speculative = instance.get("speculative")
    if isinstance(speculative, dict) and speculative.get("num_speculative_tokens", 0):
        return speculative.get("method")
    return None


def setting_value(instance: t.Mapping[str, t.Any], setting: str) -> t.Any:
    if setting == "speculative_method":
        return speculative_method(instance)
    value = instance.get(setting)
    return value.upper() if setting == "attention_backend" and isinstance(value, str) else value


def broken_findings(where: str, entry_id: str, entry: t.Mapping[str, t.Any], instance: t.Mapping[str, t.Any],
                    vllm_version: str, cluster: bool = False) -> tuple[list[str], list[str]]:
    errors, warnings = [], []
    # A malformed vllm_version is the plan's to refuse (it names the variable); here it counts as unknown.
    version = version_tuple(vllm_version) if isinstance(vllm_version, str) and VERSION.fullmatch(vllm_version) else None
    for rule in entry["broken"]:
        if rule.get("topology") == "cluster" and not cluster:
            continue
        value = setting_value(instance, rule["setting"])
        if rule["setting"] == "enable_expert_parallel":
            value = bool(value)
        if value is None or value not in rule["values"]:
            continue
        if version and rule.get("broken_from") and version < version_tuple(rule["broken_from"]):
            continue
        if version and rule.get("fixed_in") and version >= version_tuple(rule["fixed_in"]):
            continue
        across = " across nodes" if rule.get("topology") == "cluster" else ""
        message = f"{where}: {rule['setting']} {value} with catalog entry {entry_id}{across} is known to break: {rule['reason']}"
        if rule.get("fixed_in") and not version:
            warnings.append(f"{message}. Fixed in vLLM {rule['fixed_in']}; set vllm_version to the image's release to check it")
        else:
            errors.append(message + ". Change the setting, or use another entry if yours is a different checkpoint")
    return errors, warnings


def catalog_findings(where: str, instance: t.Mapping[str, t.Any], entry_id: str, entry: t.Mapping[str, t.Any],
                     catalog: t.Mapping[str, t.Mapping[str, t.Any]], mnbt: int | None, vllm_version: str,
                     cluster: bool = False) -> tuple[list[str], list[str]]:
    """Contradictions between an instance and the catalog entry it names."""
    errors: list[str] = []
    max_model_len = instance.get("max_model_len")
    if isinstance(max_model_len, int) and max_model_len > entry["max_context"]:
        errors.append(f"{where}.max_model_len: {max_model_len} is above {entry_id}'s maximum context of {entry['max_context']}; "
                      "vLLM refuses to start. Lower it")
    speculative = instance.get("speculative") if isinstance(instance.get("speculative"), dict) else {}
    drafter_model = speculative.get("model") if speculative_method(instance) else None
    if isinstance(drafter_model, str):
        drafters = drafter_index(catalog)
        trained_for = drafters.get(drafter_model) or drafters.get(drafter_model.rstrip("/").rsplit("/", 1)[-1])
        if trained_for and trained_for != entry["size"]:
            errors.append(f"{where}.speculative.model: {drafter_model} is the drafter of the {trained_for} model, this instance "
                          f"serves {entry_id} ({entry['size']}); a drafter only fits the size it was trained with. "
                          f"Use {entry_id}'s own drafter ({', '.join(entry['drafters']) or 'none known'})")
    method = speculative_method(instance)
    if method and not entry["instruction_tuned"] and not instance.get("allow_drafter_on_base_model"):
        errors.append(f"{where}.speculative: {entry_id} is not instruction-tuned; seed 000 saw an MTP drafter on a base "
                      "model make decode 38 % slower. Serve the -it model, or set allow_drafter_on_base_model")
    if method in entry["drafters"] and entry["drafters"][method].get("options", {}).get("attention_backend"):
        wanted = entry["drafters"][method]["options"]["attention_backend"]
        given = (speculative.get("options") or {}).get("attention_backend")
        if given != wanted:
            errors.append(f"{where}.speculative.options.attention_backend: {given!r}; {entry_id}'s {method} drafter needs "
                          f"{wanted} (seed 001: the drafter's card suggests flash_attn, which cannot start with Gemma 4)")
    if method == "mtp" and method in entry["drafters"] and not entry["drafters"]["mtp"]["model"] and drafter_model:
        errors.append(f"{where}.speculative.model: {entry_id} carries its own MTP head; leave model unset")
    if set(entry["modalities"]) - {"text"} and not instance.get("language_model_only") and mnbt is not None and mnbt < MULTIMODAL_FLOOR:
        errors.append(f"{where}.max_num_batched_tokens: {mnbt} is below {MULTIMODAL_FLOOR}, the floor of a multimodal model's "
                      f"encoder (seed 001: 'max_tokens_per_mm_item (2496) is larger than max_num_batched_tokens'). Raise it, "
                      "or set language_model_only: true to serve text only")
    broken_errors, warnings = broken_findings(where, entry_id, entry, instance, vllm_version, cluster)
    return errors + broken_errors, warnings


def setting_findings(where: str, instance: t.Mapping[str, t.Any], entry: t.Mapping[str, t.Any] | None,
                     hardware: t.Mapping[str, t.Any], mnbt: int | None) -> tuple[list[str], list[str]]:
    """The seed guards that do not need a catalog entry (it sharpens some of them)."""
    errors, warnings = [], []
    quantization = instance.get("quantization")
    if isinstance(quantization, str) and hardware.get("unified_memory") and hardware.get("gpu") \
            and not instance.get("allow_load_time_quantization"):
        load_time = (entry["format"] in UNQUANTIZED) if entry else quantization in LOAD_TIME_METHODS
        if load_time:
            errors.append(
                f"{where}.quantization: {quantization} quantizes the checkpoint while it loads, reading full-precision tensors "
                "into the unified pool first (seed 000: a 41 GB spike, the engine OOM-killed, 354 s to load). Serve a "
                "pre-quantized checkpoint (the catalog's NVFP4 entries), or drop the flag if the checkpoint already is in that "
                "format, or set allow_load_time_quantization: true"
            )
    if instance.get("enforce_eager") and hardware.get("production"):
        warnings.append(f"{where}.enforce_eager: no CUDA graphs costs 20-55 % of decode speed (seed 000); keep it for debugging")
    typical = instance.get("typical_prompt_tokens")
    if speculative_method(instance) and isinstance(typical, int) and mnbt is not None and mnbt < typical:
        warnings.append(f"{where}.max_num_batched_tokens: {mnbt} is below the typical prompt of {typical} tokens; with "
                        "speculative decoding each prompt is prefilled in several chunks that stall the draft steps. "
                        f"Raise it to at least {typical}")
    model = instance.get("model")
    if (isinstance(model, str) and model.lower().endswith(".gguf")) or quantization == "gguf" or (entry and entry["format"] == "gguf"):
        warnings.append(f"{where}.model: GGUF is llama.cpp's format; vLLM reads it but not on its fast path (seed 004). "
                        "Prefer an NVFP4, AWQ or FP8 checkpoint")
    if hardware.get("production") and instance.get("max_num_seqs") is None:
        warnings.append(f"{where}.max_num_seqs: unset, so vLLM batches up to its default; seed 004 keeps it near 4 for one "
                        "interactive user, seed 000 ran 8 for a 16-worker client, seed 001 64 for a team. Set it")
    return errors, warnings


def model_weights_gib(instance: t.Mapping[str, t.Any], entry: t.Mapping[str, t.Any]) -> float:
    """The weights the instance loads: the text-only ones when it serves text only and the catalog knows them (seed 001:
    the 31B's 22.47 GiB without its vision tower against 23.55 GiB with it)."""
    if instance.get("language_model_only") and entry.get("text_only_weights_gib"):
        return entry["text_only_weights_gib"]
    return entry["weights_gib"]


def text_only_default(where: str, instance: t.Mapping[str, t.Any], entry: t.Mapping[str, t.Any], pool_bytes: float,
                      mnbt: int | None) -> str | None:
    """Why an instance serves text only without saying so (None: it does not): it leaves language_model_only unset, the
    catalog knows the model's text-only weights, and only those leave room for a full-length request (seed 001: the 31B
    fits a 32 GB card only without vision, which also drops the encoder's 4096-token batch floor)."""
    if instance.get("language_model_only") is not None or not entry.get("text_only_weights_gib"):
        return None
    # Unset, vLLM batches 8192 tokens, as the arithmetic below assumes; with vision never fewer than the encoder's floor.
    with_vision, vision_errors, _warnings = memory_report(where, instance, entry, pool_bytes, max(mnbt or 8192, MULTIMODAL_FLOOR))
    text_only, text_errors, _warnings = memory_report(where, {**instance, "language_model_only": True}, entry, pool_bytes, mnbt)
    if not vision_errors or text_errors:
        return None
    return (f"{where}.language_model_only: true by default: with the vision tower {with_vision['arithmetic']}, which does not fit; "
            f"text only {text_only['arithmetic']}. Image requests get HTTP 400; set language_model_only: false to serve images "
            "(with a shorter max_model_len or a larger gpu_memory_utilization)")


def memory_report(where: str, instance: t.Mapping[str, t.Any], entry: t.Mapping[str, t.Any], pool_bytes: float,
                  mnbt: int | None) -> tuple[dict[str, t.Any], list[str], list[str]]:
    """The instance's memory arithmetic (seed 004): weights + drafter + activation/graph headroom + the KV
    cache one full-length request needs must fit its share of the pool. Returns (report, errors, warnings).
    Tensor parallelism splits the weights and the KV cache over the ranks (seed 001: 2.44x the 31B's KV at
    TP=2); each rank's pool holds its part. A model with fewer KV heads than ranks replicates them
    (seed 001's E2B), so the split is an upper bound there."""
    gmu = instance["gpu_memory_utilization"]
    share = gmu * pool_bytes / GIB
    ranks = instance.get("tensor_parallel_size") or 1
    method = speculative_method(instance)
    drafter_gib = entry["drafters"].get(method, {}).get("weights_gib", 0.0) / ranks if method else 0.0
    overhead = entry["overhead_gib"] + entry["overhead_gib_per_1k_batched"] * (mnbt or 8192) / 1024
    full_weights_gib = model_weights_gib(instance, entry)
    weights_gib = round(full_weights_gib / ranks, 2)
    kv_gib = share - weights_gib - drafter_gib - overhead
    context = instance.get("max_model_len") or entry["max_context"]
    per_request = context * entry["kv_bytes_per_token"] / ranks / GIB
    seqs = instance.get("max_num_seqs")
    report = {
        "share_gib": round(share, 2), "weights_gib": weights_gib, "drafter_gib": round(drafter_gib, 2), "ranks": ranks,
        "headroom_gib": round(overhead, 2), "kv_gib": round(kv_gib, 2), "max_model_len": context,
        "full_length_request_gib": round(per_request, 2),
        "full_length_requests": round(kv_gib / per_request, 2) if per_request else None,
        "arithmetic": (f"{gmu} x {pool_bytes / GIB:.2f} GiB = {share:.2f} GiB; minus weights {weights_gib} GiB"
                       + (" (text only)" if full_weights_gib != entry["weights_gib"] else "")
                       + (f" (1/{ranks} of {full_weights_gib} GiB per rank)" if ranks > 1 else "")
                       + (f", drafter {drafter_gib:.2f} GiB" if drafter_gib else "")
                       + f", headroom {overhead:.2f} GiB (activations at {mnbt or 8192} batched tokens, CUDA graphs) "
                       f"leaves {kv_gib:.2f} GiB of KV cache; one {context}-token request needs {per_request:.2f} GiB"),
    }
    errors, warnings = [], []
    if kv_gib < per_request:
        needed = (weights_gib + drafter_gib + overhead + per_request) * GIB / pool_bytes
        errors.append(
            f"{where}.gpu_memory_utilization: {gmu} is too small: {report['arithmetic']}, so vLLM would fail at startup or "
            f"during CUDA graph capture (seed 000's embeddings instance at 0.08, seed 002's 0.80). Give it at least "
            f"{needed:.2f}, or lower max_model_len"
        )
    elif isinstance(seqs, int) and kv_gib < seqs * per_request:
        warnings.append(f"{where}: the KV cache holds {kv_gib / per_request:.1f} full-length requests, max_num_seqs is {seqs}; "
                        "long requests beyond that wait or get preempted")
    return report, errors, warnings
