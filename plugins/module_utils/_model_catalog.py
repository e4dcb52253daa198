# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model catalog: checkpoints the seeds served, with what each can take and what breaks it.

Private to the collection. An instance names an entry (``catalog: <id>``) and overrides it; the
plan refuses contradictions (a context above the model's, a drafter of another size, a known
broken combination for the pinned vLLM). Fleets add their own entries with
``vllm_catalog_extra``, checked by ``catalog_problems`` like the shipped ones.

Memory figures are in GiB and bytes; ``sources`` says, per entry, which are measured in a seed
and which are derived (and how), so an operator knows how far to trust the memory arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing as t

GEMMA4_ATTENTION = (
    "seed 000: TRITON_ATTN is required for Gemma 4, FlashInfer and FlashAttention reject its 512-dim global heads; "
    "seed 001: flash_attn exits during startup"
)
GEMMA4_BROKEN = [
    {"setting": "attention_backend", "values": ["FLASHINFER", "FLASH_ATTN"], "reason": GEMMA4_ATTENTION},
]
MULTIMODAL_FLOOR = 4096
# What every Gemma 4 NVFP4 checkpoint shares; the 26B-A4B's measured activation peak (seed 001)
# stands in for the sizes not measured.
GEMMA4_NVFP4 = {
    "instruction_tuned": True,
    "format": "nvfp4",
    "max_context": 262144,
    "modalities": ["text", "image"],
    "overhead_gib": 1.13,
    "overhead_gib_per_1k_batched": 0.14,
    "instance_defaults": {"attention_backend": "TRITON_ATTN", "kv_cache_dtype": "fp8"},
    "broken": GEMMA4_BROKEN,
}

CATALOG: dict[str, dict[str, t.Any]] = {
    "gemma-4-31b-it-nvfp4": {
        **GEMMA4_NVFP4,
        "title": "Gemma 4 31B (dense), NVFP4",
        "repo": "unsloth/gemma-4-31B-it-NVFP4",
        "size": "31b",
        "weights_gib": 23.55,
        "text_only_weights_gib": 22.47,
        "kv_bytes_per_token": 73000,
        "overhead_gib": 1.5,
        "overhead_gib_per_1k_batched": 0.2,
        "drafters": {
            "dflash": {"model": "z-lab/gemma-4-31B-it-DFlash", "num_speculative_tokens": 8, "weights_gib": 2.86,
                       "options": {"attention_backend": "triton_attn"}},
            "mtp": {"model": "google/gemma-4-31B-it-assistant", "num_speculative_tokens": 2, "weights_gib": 0.88},
        },
        "sources": {
            "max_context": "seed 001's model table",
            "weights_gib": "seed 001 (RTX 5090): 23.55 GiB with the vision tower, 22.47 without",
            "text_only_weights_gib": "seed 001 (RTX 5090): --language-model-only drops the vision tower, 22.47 GiB of weights; "
            "the 31B fits a 32 GB card only so",
            "kv_bytes_per_token": "derived from seed 001 (RTX 5090): 5.37 GiB of fp8 KV held 78,847 tokens",
            "overhead_gib": "estimate, scaled from the 26B-A4B's measured activation peak",
            "drafters": "seed 001: DFlash at k=8 for one stream, MTP at k=2 for eight; DFlash needs triton_attn",
        },
    },
    "gemma-4-26b-a4b-it-nvfp4": {
        **GEMMA4_NVFP4,
        "title": "Gemma 4 26B-A4B (MoE, 3.8B active), NVFP4",
        "repo": "unsloth/gemma-4-26B-A4B-it-NVFP4",
        "size": "26b-a4b",
        "weights_gib": 16.13,
        "kv_bytes_per_token": 17050,
        "drafters": {
            "mtp": {"model": "google/gemma-4-26B-A4B-it-assistant", "num_speculative_tokens": 2, "weights_gib": 0.9},
            "dflash": {"model": "z-lab/gemma-4-26B-A4B-it-DFlash", "num_speculative_tokens": 8, "weights_gib": 2.0,
                       "options": {"attention_backend": "triton_attn"}},
        },
        "broken": GEMMA4_BROKEN + [
            {"setting": "enable_expert_parallel", "values": [False], "topology": "cluster",
             "reason": "seed 001: at TP=2 each expert's NVFP4 weight is sliced to 704 rows, not a multiple of the 128-row scale "
             "tile, and the FLASHINFER_CUTLASS MoE backend refuses to pad it (NotImplementedError at load). Set "
             "enable_expert_parallel: true"},
            {"setting": "speculative_method", "values": ["mtp"], "topology": "cluster",
             "reason": "seed 001: with expert parallelism the drafter inherits it and exits with 'Number of experts in the "
             "model must be greater than 0' on every release measured (vllm#56930 and #56936). Serve it without a drafter"},
            {"setting": "speculative_method", "values": ["dflash"], "topology": "cluster", "broken_from": "0.30.0",
             "reason": "seed 001: v0.30.0 copies expert parallelism into the dense drafter, which exits at start (fixed on "
             "main by vllm#56930 after v0.30.0 was cut; v0.29.0 runs it). Pin v0.29.0, or no drafter"},
        ],
        "sources": {
            "max_context": "seed 001's model table",
            "weights_gib": "seed 001 (RTX 5090): 16.13 GiB of weights",
            "kv_bytes_per_token": "derived from seed 001 (RTX 5090): 10.92 GiB of fp8 KV held 687,683 tokens",
            "overhead_gib": "derived from seed 001 (RTX 5090): KV 10.92 / 9.80 / 7.47 GiB at 8192 / 16384 / 32768 "
            "batched tokens gives 1.13 GiB plus 0.14 GiB per 1024 batched tokens",
            "drafters": "seed 001: MTP at k=2 is the MoE's drafter (+38 % single-stream on a Spark); DFlash at k=8",
        },
    },
    "gemma-4-26b-a4b-it-nvfp4-modelopt": {
        **GEMMA4_NVFP4,
        "title": "Gemma 4 26B-A4B, NVIDIA's NVFP4 (nvfp4_experts_only)",
        "repo": "nvidia/Gemma-4-26B-A4B-NVFP4",
        "size": "26b-a4b",
        "format": "modelopt",
        "weights_gib": 16.5,
        "kv_bytes_per_token": 17050,
        "instance_defaults": {"attention_backend": "TRITON_ATTN", "kv_cache_dtype": "fp8", "quantization": "modelopt"},
        "drafters": {
            "mtp": {"model": "google/gemma-4-26B-A4B-it-assistant", "num_speculative_tokens": 4, "weights_gib": 0.9},
        },
        "sources": {
            "repo": "seed 000 served it from /models/Gemma-4-26B-A4B-NVFP4 with --quantization modelopt; base model "
            "google/gemma-4-26B-A4B-it",
            "weights_gib": "estimate: attention, MLP and router stay in higher precision, so slightly above unsloth's",
            "drafters": "seed 000's sweep kept MTP at 4 draft tokens over 0, 1 and 2",
            "moe_backend": "seed 000 pins --moe-backend marlin (CUTLASS FP4 gave NaNs on sm_121), seed 001 measured "
            "forcing marlin at half the decode speed: measure it on your image",
        },
    },
    "gemma-4-26b-a4b-it-fp8": {
        **GEMMA4_NVFP4,
        "title": "Gemma 4 26B-A4B, pre-quantized FP8 (a third-party compressed-tensors build)",
        "path": "/models/gemma-4-26B-A4B-it-FP8",
        "size": "26b-a4b",
        "format": "fp8",
        "weights_gib": 26.67,
        "kv_bytes_per_token": 17050,
        "drafters": {
            "mtp": {"model": "google/gemma-4-26B-A4B-it-assistant", "num_speculative_tokens": 4, "weights_gib": 0.9},
        },
        "sources": {
            "path": "seed 000 names no repo for it (a third-party build pinned to a revision); stage yours there",
            "weights_gib": "seed 000: 26.67 GiB; FP8 won single-stream decode by about 1.35x over NVFP4 without MTP, and had "
            "no edge once MTP was on (bigger weights, slower load)",
        },
    },
    "gemma-4-26b-a4b-it": {
        **GEMMA4_NVFP4,
        "title": "Gemma 4 26B-A4B, BF16 (unquantized)",
        "repo": "google/gemma-4-26B-A4B-it",
        "size": "26b-a4b",
        "format": "bf16",
        "weights_gib": 48.54,
        "kv_bytes_per_token": 17050,
        "drafters": {
            "mtp": {"model": "google/gemma-4-26B-A4B-it-assistant", "num_speculative_tokens": 2, "weights_gib": 0.9},
        },
        "sources": {
            "weights_gib": "seed 000: 48.54 GiB in BF16; --quantization fp8 at load time took it to 25.69 GiB after a "
            "41 GB resident spike that the kernel OOM-killed on the shared pool",
        },
    },
    "gemma-4-12b-it-nvfp4": {
        **GEMMA4_NVFP4,
        "title": "Gemma 4 12B (dense), NVFP4",
        "repo": "unsloth/gemma-4-12b-it-NVFP4",
        "size": "12b",
        "weights_gib": 9.1,
        "kv_bytes_per_token": 18900,
        "drafters": {
            "dflash": {"model": "z-lab/gemma4-12B-it-DFlash", "num_speculative_tokens": 8, "weights_gib": 1.5,
                       "options": {"attention_backend": "triton_attn"}},
            "mtp": {"model": "google/gemma-4-12B-it-assistant", "num_speculative_tokens": 2, "weights_gib": 0.6},
        },
        "broken": GEMMA4_BROKEN + [
            {"setting": "speculative_method", "values": ["mtp"], "fixed_in": "0.29.0",
             "reason": "seed 001: the 12b's MTP assistant tripped CUDA graph capture until vLLM v0.29.0 (vllm#53884)"},
        ],
        "sources": {
            "weights_gib": "estimate: 12B parameters x 0.76 bytes, the 31B's measured bytes per parameter",
            "kv_bytes_per_token": "derived from seed 001 (RTX 5090): 1.02M tokens at 0.92 of 32 GB after weights and "
            "the 26B-A4B's activation peak",
            "drafters": "seed 001: DFlash at k=8 for one stream (note the gemma4- prefix), MTP at k=2 for eight",
        },
    },
    "gemma-4-e4b-it-nvfp4": {
        **GEMMA4_NVFP4,
        "title": "Gemma 4 E4B (4B effective), NVFP4",
        "repo": "unsloth/gemma-4-E4B-it-NVFP4",
        "size": "e4b",
        "max_context": 131072,
        "modalities": ["text", "image", "audio"],
        "weights_gib": 5.0,
        "kv_bytes_per_token": 12300,
        "drafters": {
            "mtp": {"model": "google/gemma-4-E4B-it-assistant", "num_speculative_tokens": 2, "weights_gib": 0.3},
        },
        "sources": {
            "max_context": "seed 001: the E-series max out at 131,072; vLLM refuses to start above",
            "weights_gib": "estimate",
            "kv_bytes_per_token": "derived from seed 001 (RTX 5090): 1.93M tokens",
            "drafters": "seed 001: MTP only (no DFlash drafter exists), +46 % single-stream on a Spark",
        },
    },
    "gemma-4-e2b-it-nvfp4": {
        **GEMMA4_NVFP4,
        "title": "Gemma 4 E2B (2B effective), NVFP4",
        "repo": "unsloth/gemma-4-E2B-it-NVFP4",
        "size": "e2b",
        "max_context": 131072,
        "modalities": ["text", "image", "audio"],
        "weights_gib": 3.5,
        "kv_bytes_per_token": 4100,
        "drafters": {
            "mtp": {"model": "google/gemma-4-E2B-it-assistant", "num_speculative_tokens": 2, "weights_gib": 0.2},
        },
        "sources": {
            "max_context": "seed 001: 131,072",
            "weights_gib": "estimate",
            "kv_bytes_per_token": "derived from seed 001 (RTX 5090): 6.08M tokens",
            "drafters": "seed 001: MTP only, +43 % single-stream on a Spark",
        },
    },
    "qwen3.5-122b-a10b-hybrid-int4fp8": {
        "title": "Qwen3.5-122B-A10B, hybrid INT4+FP8 with MTP weights (albond's recipe)",
        "repo": None,
        "path": "/models/qwen35-122b-hybrid-int4fp8",
        "size": "122b-a10b",
        "instruction_tuned": True,
        "format": "int4-fp8",
        "max_context": 262144,
        "modalities": ["text"],
        "weights_gib": 66.93,
        "kv_bytes_per_token": 114000,
        "overhead_gib": 8.0,
        "overhead_gib_per_1k_batched": 0.0,
        "instance_defaults": {"attention_backend": "FLASHINFER", "reasoning_parser": "qwen3"},
        "drafters": {
            "mtp": {"model": None, "num_speculative_tokens": 2, "weights_gib": 0.0},
        },
        "broken": [
            {"setting": "prefix_caching", "values": [True], "broken_from": "0.19.0",
             "reason": "seed 002: --enable-prefix-caching crashes Qwen3.5's DeltaNet hybrid attention on vLLM 0.19"},
        ],
        "sources": {
            "path": "seed 002: built on the node by albond's install.sh (no Hub repo), copied to the second node with rsync",
            "weights_gib": "seed 002: 66.93 GiB after model load",
            "kv_bytes_per_token": "derived from seed 002: 268,224 KV tokens in the ~28.5 GiB left at 0.85 after weights "
            "and graph capture",
            "overhead_gib": "derived from seed 002: 0.85 (36.5 GiB after weights) captures its 51 CUDA graphs and holds "
            "a 262k request, 0.80 (30.4 GiB) OOM-kills the engine during capture",
            "drafters": "seed 002: the checkpoint carries its MTP head; MTP-2 chosen over MTP-3 on both nodes",
        },
    },
    "lab-tiny-llama": {
        "title": "The lab's tiny Llama (one layer, built locally), for the CPU build",
        "repo": None,
        "path": "/models/tiny-llama",
        "size": "tiny",
        "instruction_tuned": True,
        "format": "bf16",
        "max_context": 4096,
        "modalities": ["text"],
        "weights_gib": 0.001,
        "kv_bytes_per_token": 256,
        "overhead_gib": 0.05,
        "overhead_gib_per_1k_batched": 0.0,
        "instance_defaults": {},
        "drafters": {},
        "broken": [],
        "sources": {
            "max_context": "its config.json (max_position_embeddings)",
            "kv_bytes_per_token": "1 layer x 1 KV head x 32 dims x 2 (K and V) x 4 bytes (float32)",
        },
    },
}

# What an entry must hold, and of which type; optional keys may be absent.
REQUIRED: dict[str, tuple[type, ...]] = {
    "title": (str,), "size": (str,), "instruction_tuned": (bool,), "format": (str,), "max_context": (int,),
    "modalities": (list,), "weights_gib": (int, float), "kv_bytes_per_token": (int,), "overhead_gib": (int, float),
    "overhead_gib_per_1k_batched": (int, float), "instance_defaults": (dict,), "drafters": (dict,), "broken": (list,),
}
OPTIONAL: dict[str, tuple[type, ...]] = {"repo": (str, type(None)), "path": (str,), "sources": (dict,), "text_only_weights_gib": (int, float)}
DRAFTER_KEYS: dict[str, tuple[type, ...]] = {
    "model": (str, type(None)), "num_speculative_tokens": (int,), "weights_gib": (int, float), "options": (dict,),
}
BROKEN_SETTINGS = ("attention_backend", "prefix_caching", "speculative_method", "quantization", "moe_backend", "enable_expert_parallel")
TOPOLOGIES = ("cluster",)
ENTRY_ID = re.compile(r"[a-z0-9][a-z0-9.-]*")
# A release as PEP 440 writes it: vLLM publishes 0.10.1.1, 0.32.0rc1, nightly 0.33.0.dev5+g1a2b3c and
# 0.32.0+cpu builds. Comparisons use the release numbers alone: a release candidate or a build of
# a release carries that release's code, and a dev build of the next one carries it too.
VERSION = re.compile(r"(?P<release>\d+(\.\d+){1,3})((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9]+([._-][A-Za-z0-9]+)*)?")
# Acceptance compounds towards zero along the draft (the reason is the refusal's own words).
MAX_DRAFT_TOKENS = 16
DRAFT_TOKENS_WHY = ("a draft token counts only when every one before it was accepted; seed 001's best was 8, "
                    f"past {MAX_DRAFT_TOKENS} more drafts only cost")
_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_WHOLE = re.compile(r"[+-]?\d+")
# Checkpoint formats that are already quantized; anything else is quantized at load time by --quantization.
UNQUANTIZED = frozenset({"bf16", "fp16", "fp32"})


def as_number(value: t.Any, whole: bool = False) -> int | float | None:
    """A finite number (whole when asked) from an inventory value, numeric text included (extra vars are
    text); None for anything else, so that "5%" or "two" is refused instead of read as 0."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if _WHOLE.fullmatch(text):
            return int(text)
        if whole or not _DECIMAL.fullmatch(text):
            return None
        value = float(text)
    if isinstance(value, int):
        return value
    if not isinstance(value, float) or not math.isfinite(value):
        return None
    if whole:
        return int(value) if value.is_integer() else None
    return value


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a number may take, and why: a bound that lets a check be switched off by a zero, a
    negative or a typo is what this refuses."""

    low: float
    high: float
    why: str
    low_open: bool = False
    high_open: bool = False
    whole: bool = False
    unit: str = ""

    def span(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        if self.low == self.high:
            return f"{self.low}" + (f" {self.unit}" if self.unit else "")
        if not self.low_open and not self.high_open:
            limits = f"from {self.low} to {self.high}"
        else:
            low = f"above {self.low}" if self.low_open else f"at least {self.low}"
            high = f"below {self.high}" if self.high_open else f"at most {self.high}"
            limits = f"{low} and {high}"
        return f"{kind} {limits}" + (f" {self.unit}" if self.unit else "")

    def contains(self, number: float) -> bool:
        above = number > self.low if self.low_open else number >= self.low
        below = number < self.high if self.high_open else number <= self.high
        return above and below

    def problem(self, field: str, value: t.Any, text: bool = True) -> str | None:
        """``"<field>: <value> <what is wrong>; <the fix> (<why>)"``, or None when the value is in range.
        ``text`` False refuses numeric text too, for values handed on unconverted."""
        number = None if isinstance(value, str) and not text else as_number(value, self.whole)
        if number is None:
            return f"{field}: {value!r} is not {'a whole number' if self.whole else 'a number'}; give {self.span()} ({self.why})"
        if not self.contains(number):
            return f"{field}: {value!r} is out of range; give {self.span()} ({self.why})"
        return None

    def problems(self, field: str, value: t.Any, text: bool = True) -> list[str]:
        found = self.problem(field, value, text)
        return [found] if found else []


# The numbers of an entry: each bound keeps the memory arithmetic and the context check meaningful.
ENTRY_RANGES: dict[str, Range] = {
    "max_context": Range(1, 10_485_760, "the longest context in tokens; no released model declares more than 10M", whole=True),
    "weights_gib": Range(0, 1024, "the memory arithmetic subtracts it from the pool; 0 would hide the weights",
                         low_open=True, unit="GiB"),
    "kv_bytes_per_token": Range(1, 2**22, "the KV cache one token takes over all layers; 0 would switch the memory "
                                "check off, and no model takes 4 MiB", whole=True),
    "overhead_gib": Range(0, 64, "activations and CUDA graphs take some memory in every engine; 0 or less would hide it",
                          low_open=True, unit="GiB"),
    "overhead_gib_per_1k_batched": Range(0, 4, "activation memory grows with the batched tokens; a negative rate "
                                         "would hand it to the KV cache", unit="GiB"),
}
DRAFTER_RANGES: dict[str, Range] = {
    "num_speculative_tokens": Range(1, MAX_DRAFT_TOKENS, "the recommended draft count; " + DRAFT_TOKENS_WHY, whole=True),
    "weights_gib": Range(0, 64, "0 for a head built into the checkpoint; a negative size would hide the target's weights",
                         unit="GiB"),
}


TYPE_WORDS = {str: "text", int: "a whole number", float: "a number", bool: "true or false", list: "a list", dict: "a mapping",
              type(None): "null"}


def wrong_type(field: str, value: t.Any, kinds: tuple[type, ...]) -> str:
    wanted = " or ".join(dict.fromkeys(TYPE_WORDS[kind] for kind in kinds))
    return f"{field}: {value!r} has the wrong type; give {wanted}"


def drafter_problems(field: str, method: str, drafter: t.Mapping[str, t.Any]) -> list[str]:
    errors = [f"{field}.{key}: unknown key" for key in sorted(set(drafter) - set(DRAFTER_KEYS))]
    for key, kinds in DRAFTER_KEYS.items():
        if key not in drafter or key == "model":
            continue
        value = drafter[key]
        if not isinstance(value, kinds) or isinstance(value, bool):
            errors.append(wrong_type(f"{field}.{key}", value, kinds))
        elif key in DRAFTER_RANGES:
            errors += DRAFTER_RANGES[key].problems(f"{field}.{key}", value)
    if "num_speculative_tokens" not in drafter:
        errors.append(f"{field}.num_speculative_tokens: missing; give {DRAFTER_RANGES['num_speculative_tokens'].span()}, "
                      "the draft count instances get unless they set their own")
    model = drafter.get("model")
    if "model" not in drafter or (model is None and method != "mtp"):
        errors.append(f"{field}.model: missing; give the drafter's Hub id (such as google/gemma-4-31B-it-assistant)"
                      + (", or null for an MTP head built into the checkpoint" if method == "mtp" else
                         f": a {method} drafter is a checkpoint of its own"))
    elif model is not None and (not isinstance(model, str) or not model or any(c.isspace() for c in model)):
        null_for_mtp = ", or null for an MTP head built into the checkpoint" if method == "mtp" else ""
        errors.append(f"{field}.model: {model!r} is not a Hub id; give the drafter's id (such as "
                      f"google/gemma-4-31B-it-assistant){null_for_mtp}")
    return errors


def catalog_problems(entries: t.Any, where: str = "vllm_catalog_extra") -> list[str]:
    """Problems of catalog entries (the shipped ones are checked by the unit tests with the same function)."""
    if not isinstance(entries, dict):
        return [f"{where}: must be a mapping of entry id -> entry"]
    errors = []
    for entry_id, entry in entries.items():
        field = f"{where}.{entry_id}"
        if not isinstance(entry_id, str) or not ENTRY_ID.fullmatch(entry_id):
            errors.append(f"{field}: ids are lower-case letters, digits, dots and dashes")
        if not isinstance(entry, dict):
            errors.append(f"{field}: must be a mapping")
            continue
        for key in sorted(set(REQUIRED) - set(entry)):
            errors.append(f"{field}.{key}: missing")
        for key in sorted(set(entry) - set(REQUIRED) - set(OPTIONAL)):
            errors.append(f"{field}.{key}: unknown key")
        for key, kinds in {**REQUIRED, **OPTIONAL}.items():
            if key in entry and (not isinstance(entry[key], kinds) or (isinstance(entry[key], bool) and bool not in kinds)):
                errors.append(wrong_type(f"{field}.{key}", entry[key], kinds))
            elif key in entry and key in ENTRY_RANGES:
                errors += ENTRY_RANGES[key].problems(f"{field}.{key}", entry[key])
        if not entry.get("repo") and not entry.get("path"):
            errors.append(f"{field}: give repo (a Hub id) or path (where the checkpoint is on the host)")
        for method, drafter in (entry.get("drafters") or {}).items() if isinstance(entry.get("drafters"), dict) else ():
            if method not in ("mtp", "dflash", "eagle", "eagle3", "draft_model") or not isinstance(drafter, dict):
                errors.append(f"{field}.drafters.{method}: a drafter method (mtp, dflash, eagle, eagle3, draft_model) "
                              "mapping to its settings")
                continue
            errors += drafter_problems(f"{field}.drafters.{method}", method, drafter)
        for index, rule in enumerate(entry.get("broken") or []) if isinstance(entry.get("broken"), list) else ():
            errors += broken_rule_problems(f"{field}.broken[{index}]", rule)
    return errors


def catalog_id(value: t.Any) -> str | None:
    """An instance's ``catalog`` as a key to look the entry up by: text only (a list or a mapping is no id)."""
    return value if isinstance(value, str) else None


def catalog_reference_problems(field: str, instance: t.Mapping[str, t.Any], catalog: t.Mapping[str, t.Any]) -> list[str]:
    """An instance naming a catalog entry (``field`` names the instance): the name must be an entry's id,
    and a ``model`` kept beside it must name weights, since the instance's own keys win over the entry's:
    left empty in YAML (null), blank or a list, it would replace the entry's checkpoint with nothing."""
    name = instance.get("catalog")
    if name is None:
        return []
    if catalog_id(name) not in catalog:
        return [f"{field}.catalog: {name!r} is not a catalog entry's id; give one as text (docs/catalog.md lists them; "
                "vllm_catalog_extra adds your own)"]
    if "model" not in instance:
        return []
    model = instance["model"]
    if isinstance(model, str) and model.strip() and not any(c.isspace() for c in model):
        return []
    entry = catalog[name]
    brought = entry.get("path") or entry.get("repo") if isinstance(entry, dict) else None
    return [f"{field}.model: {model!r} is no checkpoint, and it would replace catalog entry {name}'s ({brought or 'none given'}); "
            "remove the model key to serve the entry's checkpoint, or give a path under /models or a Hub id"]


def broken_rule_problems(field: str, rule: t.Any) -> list[str]:
    if not isinstance(rule, dict) or rule.get("setting") not in BROKEN_SETTINGS or not isinstance(rule.get("values"), list) \
            or not isinstance(rule.get("reason"), str):
        return [f"{field}: needs setting (one of {', '.join(BROKEN_SETTINGS)}), values (a list) and reason"]
    errors = [f"{field}.{key}: {rule[key]!r} is not a version such as 0.29.0 (or 0.29.0rc1); give the vLLM release" for key in ("fixed_in", "broken_from")
              if key in rule and not (isinstance(rule[key], str) and VERSION.fullmatch(rule[key]))]
    if "topology" in rule and rule["topology"] not in TOPOLOGIES:
        errors.append(f"{field}.topology: {rule['topology']!r}; only cluster (the rule holds across nodes only), or leave it out")
    return errors


def version_tuple(version: str) -> tuple[int, ...]:
    """The release numbers of a version VERSION accepts (0.32.0rc1 -> (0, 32, 0)); callers check the
    form first, so anything else is a programming error."""
    found = VERSION.fullmatch(version) if isinstance(version, str) else None
    if not found:
        raise ValueError(f"{version!r} is not a version such as 0.32.0")
    return tuple(int(part) for part in found.group("release").split("."))


def drafter_index(catalog: t.Mapping[str, t.Mapping[str, t.Any]]) -> dict[str, str]:
    """Drafter model id (and its directory name) -> the size of the target it was trained for."""
    index = {}
    for entry in catalog.values():
        for drafter in entry["drafters"].values():
            if drafter.get("model"):
                index[drafter["model"]] = entry["size"]
                index[drafter["model"].rsplit("/", 1)[-1]] = entry["size"]
    return index


def weights_path(entry: t.Mapping[str, t.Any]) -> str:
    """Where the entry's checkpoint is inside the container: its path, or the staged repo's directory."""
    return entry.get("path") or f"/models/{entry['repo'].rsplit('/', 1)[-1]}"


def catalog_table_markdown(catalog: t.Mapping[str, t.Mapping[str, t.Any]] | None = None) -> str:
    """The catalog table of docs/catalog.md, generated from the data."""
    catalog = CATALOG if catalog is None else catalog
    rows = ["| entry | checkpoint | format | max context | modalities | weights GiB | KV bytes/token | drafters (k) | known broken |",
            "|---|---|---|---:|---|---:|---:|---|---|"]
    for entry_id, entry in catalog.items():
        drafters = ", ".join(f"{method} {d['num_speculative_tokens']}" for method, d in entry["drafters"].items()) or "-"
        broken = "; ".join(f"{rule['setting']} {'/'.join(map(str, rule['values']))}{' (cluster)' if rule.get('topology') else ''}"
                           for rule in entry["broken"]) or "-"
        rows.append(f"| `{entry_id}` | {entry.get('repo') or entry.get('path')} | {entry['format']} | {entry['max_context']:,} | "
                    f"{', '.join(entry['modalities'])} | {entry['weights_gib']} | {entry['kv_bytes_per_token']:,} | {drafters} | {broken} |")
    return "\n".join(rows)


def catalog_page(entry_id: str) -> str:
    """The documentation page of one entry (docs/catalog/ID.md), generated from the data."""
    entry = CATALOG[entry_id]
    lines = [f"# Catalog entry `{entry_id}`", "", entry["title"] + ".", "",
             "Generated from `plugins/module_utils/_model_catalog.py`; an instance uses it with "
             f"`catalog: {entry_id}` and may override any key.", "",
             "| value | setting | where it comes from |", "|---|---|---|"]
    for key in ("repo", "path", "size", "instruction_tuned", "format", "max_context", "modalities", "weights_gib",
                "kv_bytes_per_token", "overhead_gib", "overhead_gib_per_1k_batched", "instance_defaults"):
        if key in entry:
            lines.append(f"| `{key}` | `{entry[key]}` | {entry.get('sources', {}).get(key, '')} |")
    lines += ["", "## Drafters", ""]
    if entry["drafters"]:
        lines += [f"- `{method}`: `{d['model'] or 'built into the checkpoint'}`, {d['num_speculative_tokens']} draft tokens"
                  + (f", options `{d['options']}`" if d.get("options") else "") for method, d in entry["drafters"].items()]
        lines += ["", entry.get("sources", {}).get("drafters", "")]
    else:
        lines.append("None.")
    lines += ["", "## Refused combinations", ""]
    if entry["broken"]:
        for rule in entry["broken"]:
            versions = " ".join(part for part in (
                f"from vLLM {rule['broken_from']}" if rule.get("broken_from") else "",
                f"until vLLM {rule['fixed_in']}" if rule.get("fixed_in") else "") if part) or "on every vLLM known"
            across = ", across nodes" if rule.get("topology") else ""
            lines.append(f"- `{rule['setting']}` = {', '.join(f'`{v}`' for v in rule['values'])} ({versions}{across}): {rule['reason']}")
    else:
        lines.append("None known.")
    for key in sorted(set(entry.get("sources", {})) - {"drafters"} - set(entry)):
        lines += ["", f"Note ({key}): {entry['sources'][key]}"]
    return "\n".join(lines) + "\n"
