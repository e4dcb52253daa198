# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan of a host: what each vLLM instance is, derived once from the inventory.

Private to the collection. ``build_plan`` validates ``vllm_instances`` against one key table
(``INSTANCE_KEYS``: type, range, doc line, the flag it renders to) and returns, per instance,
every name, path, argument and hash the role, the health gate and the measurement modules
use; nothing downstream re-derives a name or parses argv back. Every problem is reported at
once, each naming the variable and the fix.

Secure by construction: the API key travels only in the env file (never argv, never the
public plan); no env entry and no extra argument can set what the role owns (the key, the
bind address, the port, the served names, any structured setting); binding every interface
needs an explicit opt-in; values are restricted to what their destination (an env file line,
a systemd Exec line, an argv element) carries unchanged.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import ipaddress
import json
import pathlib
import re
import typing as t

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import NETWORK_ENV, ray_start_args, serve_cluster_args
from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster_sequence import start_wave
from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import resolve_class
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import DOCKER_CLIENT
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import ENTRY as RUNTIME_ENTRY
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import REFUSED, RUNTIME_DIR
from ansible_collections.sparkfleet.vllm.plugins.module_utils._image_kinds import IMAGE_KINDS
from ansible_collections.sparkfleet.vllm.plugins.module_utils._image_release import public_version, release_order
from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import memory_probe_argv, paused_containers_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import (
    CATALOG,
    MAX_DRAFT_TOKENS,
    VERSION,
    catalog_id,
    catalog_problems,
    catalog_reference_problems,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import PLAN_SCHEMA_VERSION, is_share, start_record
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import as_bool, as_float, as_int, normal_path, path_problem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import exec_line
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_guards import (
    GIB,
    catalog_defaults,
    catalog_findings,
    memory_report,
    setting_findings,
    text_only_default,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import (
    CONTAINER_PORT,
    INSTANCE_LABEL,
    entrypoint_problem,
    image_kind,
    instance_files,
    parse_image_reference,
    run_image,
    speculative_config,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import host_path

INSTANCE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# A single argv element that cannot be read as a flag, split by a shell or a unit file, or break a line.
TOKEN = re.compile(r"[A-Za-z0-9_.:/@+][A-Za-z0-9_.:/@+=,-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
API_KEY = re.compile(r"[\x21-\x7e]+")
API_KEY_MIN_LENGTH = 16
# Bind addresses are kept in their canonical spelling (ipaddress), so these sets see every way of writing them.
WILDCARDS = frozenset({"0.0.0.0", "::"})
LOOPBACK = frozenset({"127.0.0.1", "::1"})
# Settings that open engine-control routes outside the paths vLLM's own key check guards (vLLM 0.32
# and 0.33 source: entrypoints/serve/{dev,profile,fault_tolerance}, rl/online, scale_out). The
# guard middleware asks for the key there too; they stay an explicit, loopback-only opt-in.
DEV_ROUTE_ENV = {
    "VLLM_SERVER_DEV_MODE": "vLLM's development routes (/server_info with the whole config, /reset_prefix_cache, "
                            "/sleep, /wake_up, /collective_rpc, /pause, /update_weights and more)",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "/v1/load_lora_adapter, /v1/unload_lora_adapter and /adapters, which load adapters "
                                        "from paths the client names",
    "VLLM_ENABLE_COHERE_API": "/cohere/v2/chat",
}
DEV_ROUTE_FLAGS = {
    "--profiler-config": "/start_profile and /stop_profile",
    "--enable-fault-tolerance": "/fault_tolerance/apply",
    "--tokens-only": "/abort_requests, which aborts anyone's request",
    "--enable-scale-out": "the render routes, /inference/v1/generate and /inference/v1/abort_requests, which aborts anyone's request",
    "--enable-tokenizer-info-endpoint": "/tokenizer_info (the tokenizer's config and chat template)",
    "--enable-offline-docs": "/docs and /static, which --disable-fastapi-docs does not close",
}
# Settings that put another server in front of the engine, or swap in the handlers the probes
# answer with, where the key middleware never runs (vLLM 0.32 source: cli/serve.py,
# launchers/grpc_server.py, the SageMaker bootstrap's CUSTOM_* handlers): refused, no opt-in.
GUARD_BYPASS_ENV = {
    "VLLM_USE_RUST_FRONTEND": "runs the separate vllm-rs server instead of vLLM's own",
    "VLLM_RUST_FRONTEND_PATH": "names a vllm-rs server binary to run instead of vLLM's own server",
    "CUSTOM_FASTAPI_PING_HANDLER": "swaps in a handler for /ping, which answers without the key",
    "CUSTOM_FASTAPI_INVOCATION_HANDLER": "swaps in a handler for /invocations",
    "CUSTOM_PRE_PROCESS": "runs a hook of its own on every request",
    "CUSTOM_POST_PROCESS": "runs a hook of its own on every reply",
}
GUARD_BYPASS_FLAGS = {
    "--grpc": "starts a gRPC server with no authentication instead of the HTTP one",
    "--grpc-port": "serves gRPC with no authentication",
}
# Flags whose value is a secret: in argv it lands in the unit's command line, the plan file, its last good copy and every
# process list. Each names where the same secret goes instead: an environment variable of the 0600 env file. Read from
# vLLM 0.32.0's own parser (make_arg_parser in the lab image): --api-key (the role's) and --hf-token are the only two.
SECRET_FLAGS = {"--hf-token": "HF_TOKEN"}
# Secrets inside an argument's value: a Hugging Face or sk- token, or a field named like a secret in a JSON or
# key=value setting (--model-loader-extra-config '{"token": ...}'). Plural and compound names (max_tokens,
# num_speculative_tokens, bos_token) are settings, not secrets.
SECRET_VALUE = re.compile(r"(?<![A-Za-z0-9/._-])(?:hf|sk|ghp|github_pat)_?-?[A-Za-z0-9]{20,}|\bBearer\s+\S{8,}", re.IGNORECASE)
SECRET_FIELD = re.compile(r"[\"']?([A-Za-z0-9_.-]+)[\"']?\s*[:=]")
SECRET_FIELD_NAMES = frozenset({"token", "hf_token", "access_token", "auth_token", "api_token", "bearer_token", "use_auth_token",
                                "authorization", "api_key", "apikey", "secret", "client_secret", "secret_key", "secret_access_key",
                                "aws_secret_access_key", "password", "passwd"})
# The middleware (roles/vllm/files) that asks for the key on every route but the probes: vLLM's own
# check leaves /invocations, /pooling, /score and more open. Mounted read-only from the host runtime's folder.
GUARD_FILE = "sparkfleet_vllm_guard.py"
FABRIC_WAIT_FILE = "cluster_fabric_wait.py"
# The files the units run and the containers mount beside the host runtime (serving_host installs the runtime, which
# runs every start): each helper's name there and its source in the collection. The fabric wait imports the runtime's
# _fabric, the very module_utils file whose verdict the cluster's checks use.
HELPERS = ((GUARD_FILE, f"roles/vllm/files/{GUARD_FILE}"),)
CLUSTER_HELPERS = ((FABRIC_WAIT_FILE, f"roles/cluster/files/{FABRIC_WAIT_FILE}"),)
GUARD_DIR = "/opt/sparkfleet"
GUARD_ARGS = ("--middleware", "sparkfleet_vllm_guard.KeyOnEveryRoute", "--disable-fastapi-docs")
SPECULATIVE_METHODS = ("mtp", "ngram", "draft_model", "eagle", "eagle3", "dflash")
DRAFTER_METHODS = frozenset(SPECULATIVE_METHODS) - {"ngram"}
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "model", "options")
CONFIG_HASH_LABEL = "sparkfleet.vllm.config-hash"
# Environment names the role sets itself: an instance's env may never replace them.
OWNED_ENV = frozenset({"VLLM_API_KEY", "VLLM_HOST_IP", "VLLM_PORT", "PYTHONPATH"})
# Nothing the role deploys reaches the internet on its own: vLLM posts usage statistics to its developers unless one of
# the first three is set (vllm/usage/usage_lib.py), a Ray rank unless RAY_USAGE_STATS_ENABLED is 0, and huggingface_hub
# resolves a model id online unless HF_HUB_OFFLINE (the weights are staged at pinned revisions beforehand). Set in every
# container and owned by the role unless vllm_allow_outbound opts out of all of them; then the names are the operator's.
OFFLINE_ENV = {"VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "0",
               "HF_HUB_OFFLINE": "1"}
# The downloads' cache, shared by every image on the host.
HF_CACHE = ("huggingface", "/root/.cache/huggingface")
# What a start compiles (seed 002: torch.compile's AOT artifacts, FlashInfer's and Triton's JIT kernels), kept per
# image under jit/<image key>/: a start never loads kernels another image built, and their folders stay set aside.
JIT_CACHES = (
    ("vllm", "/root/.cache/vllm"),
    ("flashinfer", "/root/.cache/flashinfer"),
    ("triton", "/root/.triton"),
)
# The stamps of the settings that started well on an image's caches, one file named by each settings' cache key.
WARM_STAMPS = "warm"
# A stamp's path as the plan writes it (serving_unit writes there as root: nothing else is accepted).
STAMP_PATH = re.compile(rf"(?:/(?!\.\.?/)[^/\0]+)+/jit/[0-9a-f]{{16}}/{WARM_STAMPS}/[0-9a-f]{{16}}")
# Seconds a cold start's gate waits for the unit to start its container again after the compile-then-exit
# (seed 001), beyond the unit's RestartSec: docker removes the old one and creates the new.
RESTART_SLACK = 120


@dataclasses.dataclass(frozen=True)
class Key:
    """One instance key: how it is checked, documented and rendered."""

    name: str
    kind: str
    doc: str
    flag: str | None = None
    required: bool = False
    choices: tuple[str, ...] = ()
    # For whole numbers: the largest value any operator means, and why, so a typo in the millions is refused.
    maximum: int | None = None
    bound: str = ""


INSTANCE_KEYS: tuple[Key, ...] = (
    Key("name", "name", "Lower-case letters, digits and dashes; names the unit `sparkfleet-vllm-NAME.service` and the container `vllm-NAME`.", required=True),
    Key("state", "choice", "`present`, or `absent` to stop and remove the instance (an instance left out of the list is removed too).",
        choices=("present", "absent")),
    Key("catalog", "catalog", "A model catalog entry (docs/catalog.md): brings the weights path and the entry's settings, "
        "and its limits are checked (context, drafter size, modalities, known-broken combinations, memory)."),
    Key("image", "image", "The image, `repo[:tag]@sha256:<64 hex>`; here or through `vllm_image`, its default.", required=True),
    Key("model", "weights", "The weights: a path under `/models` (the staged `vllm_models_dir`) or a model id.", required=True),
    Key("served_model_names", "tokens", "Names clients use (`--served-model-name`); unique across the host's instances.",
        flag="--served-model-name", required=True),
    Key("port", "port", "Host port the endpoint is published on.", required=True),
    Key("api_key", "api_key", "Bearer key (put it in vault): printable, no whitespace, at least 16 characters. Reaches only the 0600 env file.",
        required=True),
    Key("bind_addresses", "addresses", "Host addresses the port is published on; `0.0.0.0`/`::` need `vllm_allow_wildcard_bind`, "
        "LAN addresses the wait_online role.", required=True),
    Key("gpu_memory_utilization", "fraction", "Share of the whole (unified) memory pool for this instance; the host's sum stays under `vllm_gmu_cap`.",
        flag="--gpu-memory-utilization", required=True),
    Key("max_model_len", "positive", "Longest context in tokens.", flag="--max-model-len",
        maximum=10_485_760, bound="the longest context any released model declares is 10M tokens"),
    Key("max_num_seqs", "positive", "Most sequences in one batch.", flag="--max-num-seqs",
        maximum=4096, bound="vLLM preallocates per-sequence buffers; on one box a few hundred is already the KV cache's limit"),
    Key("max_num_batched_tokens", "positive", "Most tokens in one scheduler step (chunked prefill size).", flag="--max-num-batched-tokens",
        maximum=1_048_576, bound="the step's activations grow with it; vLLM's own defaults stay at or below 16384"),
    Key("num_gpu_blocks_override", "positive", "Fixed KV-cache block count (the lab's lean start).", flag="--num-gpu-blocks-override",
        maximum=16_777_216, bound="more blocks than 128 GiB of unified memory can hold at any block size"),
    Key("kv_cache_dtype", "token", "KV-cache data type, for example `fp8`.", flag="--kv-cache-dtype"),
    Key("attention_backend", "token", "Attention backend, for example `FLASHINFER`.", flag="--attention-backend"),
    Key("moe_backend", "token", "MoE kernel backend (seeds 000 and 001 disagree on `marlin`: measure it).", flag="--moe-backend"),
    Key("quantization", "token", "Load-time quantization method.", flag="--quantization"),
    Key("dtype", "token", "Model data type, for example `bfloat16` (the CPU lab pins `float32`).", flag="--dtype"),
    Key("reasoning_parser", "token", "Reasoning parser name.", flag="--reasoning-parser"),
    Key("tool_call_parser", "token", "Tool-call parser name; needed by `enable_auto_tool_choice`.", flag="--tool-call-parser"),
    Key("runner", "choice", "`auto`, `generate`, `pooling` or `draft`.", flag="--runner", choices=("auto", "generate", "pooling", "draft")),
    Key("tensor_parallel_size", "positive", "GPUs the model is split over; on a cluster, nodes x GPUs per node.",
        flag="--tensor-parallel-size", maximum=64, bound="the largest cluster the collection plans"),
    Key("enable_expert_parallel", "switch", "Experts split whole across ranks instead of sliced (seed 001: the 26B-A4B's "
        "NVFP4 experts need it at TP=2).", flag="--enable-expert-parallel"),
    Key("enable_auto_tool_choice", "switch", "Let the model choose tools (needs `tool_call_parser`).", flag="--enable-auto-tool-choice"),
    Key("language_model_only", "switch", "Serve text only: drops a multimodal model's encoder and its 4096-token floor.",
        flag="--language-model-only"),
    Key("prefix_caching", "tristate", "true or false renders `--enable-prefix-caching` or `--no-enable-prefix-caching`; "
        "unset keeps vLLM's default.", flag="--enable-prefix-caching"),
    Key("async_scheduling", "tristate", "true or false renders `--async-scheduling` or `--no-async-scheduling`; unset keeps vLLM's "
        "default. With drafts, async scheduling corrupts some answers above concurrency 1 (vllm 46669): a sweep dimension, "
        "checked by the correctness step under load.", flag="--async-scheduling"),
    Key("enforce_eager", "switch", "No CUDA graphs (slow; for tests and debugging).", flag="--enforce-eager"),
    Key("trust_remote_code", "switch", "Run the checkpoint's own Python code.", flag="--trust-remote-code"),
    Key("speculative", "speculative", "`method`, `num_speculative_tokens` (0 turns it off), `model` for drafter methods, `options`.",
        flag="--speculative-config"),
    Key("extra_args", "extra_args", "Further `vllm serve` arguments; never a flag the role owns (any spelling argparse accepts)."),
    Key("env", "env", "Environment added to `vllm_env`; never `VLLM_API_KEY` or another name the role owns."),
    Key("health_timeout", "positive", "Seconds the gate waits for a warm start of this instance; default `vllm_health_timeout`.",
        maximum=14_400, bound="seed 002's coldest first boot took 45 minutes; a gate of hours hides a hung start"),
    Key("cold_timeout", "positive", "Seconds the gate waits for a start that compiles (no good start of these settings on "
        "this image yet); default `vllm_cold_timeout`, at least `health_timeout`.",
        maximum=14_400, bound="seed 002's coldest first boot took 45 minutes; a gate of hours hides a hung start"),
    Key("allow_drafter_on_base_model", "bool", "Accept a drafter on a model that is not instruction-tuned."),
    Key("allow_load_time_quantization", "bool", "Accept `quantization` converting an unquantized checkpoint while it loads "
        "on a unified pool (seed 000: the load spike got the engine OOM-killed)."),
    Key("typical_prompt_tokens", "positive", "Prompt size your clients send (vllm_metrics_info's workload.prompt_tokens_bound); "
        "with speculative decoding, max_num_batched_tokens below it warns.",
        maximum=10_485_760, bound="no model reads a longer prompt"),
)
KEYS_BY_NAME = {key.name: key for key in INSTANCE_KEYS}
# Flags the role sets: from the key table, plus the ones it always renders. vLLM also reads a
# whole argument set from --config; its short forms are -q (--quantization) and -sc
# (--speculative-config) in vLLM 0.32.
# The parallel layout is the plan's too: a cluster renders its ranks and rendezvous, and data or
# pipeline parallelism (not planned) would reopen ports and split the model behind its back.
PARALLEL_FLAGS = {
    "--nnodes": "-n", "--node-rank": "-r", "--master-addr": None, "--master-port": None, "--headless": None,
    "--distributed-executor-backend": None, "--pipeline-parallel-size": "-pp", "--data-parallel-size": "-dp",
    "--data-parallel-rank": "-dpn", "--data-parallel-start-rank": "-dpr", "--data-parallel-size-local": "-dpl",
    "--data-parallel-address": "-dpa", "--data-parallel-rpc-port": "-dpp", "--data-parallel-backend": "-dpb",
    "--data-parallel-hybrid-lb": "-dph", "--data-parallel-external-lb": "-dpe", "--data-parallel-multi-port-external-lb": "-dpm",
}
OWNED_FLAGS = frozenset({key.flag for key in INSTANCE_KEYS if key.flag}
                        | {"--host", "--port", "--api-key", "--model", "--config", "--uds", "--middleware", "--disable-fastapi-docs"}
                        | set(PARALLEL_FLAGS))
OWNED_SHORT_FLAGS = {"-q": "--quantization", "-sc": "--speculative-config", "-tp": "--tensor-parallel-size",
                     "-ep": "--enable-expert-parallel", **{short: flag for flag, short in PARALLEL_FLAGS.items() if short}}


def closest(name: str, known: t.Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def is_int(value: t.Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_value(where: str, key: Key, value: t.Any, options: t.Mapping[str, t.Any]) -> list[str]:
    """Problems of one key's value; ``where`` names the instance."""
    field = f"{where}.{key.name}"
    kind = key.kind
    if kind == "name":
        if not isinstance(value, str) or not INSTANCE_NAME.fullmatch(value):
            return [f"{field}: {value!r} must be lower-case letters, digits and dashes (it names the unit and container)"]
    elif kind == "choice":
        if value not in key.choices:
            return [f"{field}: {value!r} is not one of {', '.join(key.choices)}"]
    elif kind == "image":
        if not isinstance(value, str) or not value:
            return [f"{field}: missing; set vllm_image or the instance's image to repo@sha256:<64 hex>"]
        if CONTROL.search(value) or " " in value:
            return [f"{field}: {value!r} contains whitespace or control characters"]
        if not parse_image_reference(value) and not options["allow_floating_tag"]:
            return [f"{field}: {value!r} is not pinned by digest; give repo@sha256:<64 hex> (a tag may stand before the @), "
                    "or set vllm_allow_floating_tag: true to accept a tag that can move"]
    elif kind == "token":
        if not isinstance(value, str) or not TOKEN.fullmatch(value):
            return [f"{field}: {value!r} must be one word of letters, digits and _.:/@+=,- not starting with a dash "
                    "(it becomes one argument of vllm serve)"]
    elif kind == "weights":
        return weights_problems(field, value)
    elif kind == "tokens":
        if not isinstance(value, list) or not value:
            return [f"{field}: give a non-empty list of names"]
        bad = [name for name in value if not isinstance(name, str) or not TOKEN.fullmatch(name)]
        if bad:
            return [f"{field}: {', '.join(map(repr, bad))} must be one word each of letters, digits and _.:/@+=,- "
                    "(no spaces, no $, no leading dash)"]
    elif kind == "port":
        if not is_int(value) or not 1 <= value <= 65535:
            return [f"{field}: {value!r} must be a TCP port number (1-65535)"]
    elif kind == "positive":
        if not is_int(value) or value <= 0:
            return [f"{field}: {value!r} must be a positive whole number, or unset"]
        if key.maximum is not None and value > key.maximum:
            return [f"{field}: {value} is above {key.maximum:,} ({key.bound}); a typo? Give the value you mean"]
    elif kind == "fraction":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            return [f"{field}: {value!r} must be a fraction between 0 and 1 of the whole memory pool"]
    elif kind == "catalog":
        if catalog_id(value) not in options["catalog"]:
            return [f"{field}: {value!r} is not a catalog entry{closest(str(value), options['catalog'])} "
                    "(docs/catalog.md lists them; vllm_catalog_extra adds your own)"]
    elif kind in ("switch", "bool", "tristate"):
        if not isinstance(value, bool):
            return [f"{field}: {value!r} must be true or false"]
    elif kind == "api_key":
        return api_key_problems(field, value)
    elif kind == "addresses":
        return address_problems(field, value, options)
    elif kind == "speculative":
        return speculative_problems(field, value)
    elif kind == "extra_args":
        return extra_args_problems(field, value)
    elif kind == "env":
        return env_problems(field, value, options["owned_env"])
    return []


def api_key_problems(field: str, value: t.Any) -> list[str]:
    if not isinstance(value, str) or len(value) < API_KEY_MIN_LENGTH:
        return [f"{field}: missing or shorter than {API_KEY_MIN_LENGTH} characters; vLLM would serve without authentication "
                "or with a guessable key. Put a long random key in vault (for example from `openssl rand -hex 32`)"]
    if not API_KEY.fullmatch(value):
        return [f"{field}: contains whitespace or a non-printable character; it is written as one line of the env file, "
                "where a newline would add settings and a space would be cut off by some clients. Use a key of printable "
                "ASCII without spaces (for example from `openssl rand -hex 32`)"]
    return []


def weights_problems(field: str, value: t.Any) -> list[str]:
    """A model path stays inside the models folder the container sees read-only; anything else is a model id."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        return [f"{field}: {value!r} must be one path or model id of letters, digits and _.:/@+=,- (it becomes one argument of vllm serve)"]
    if ".." in value.split("/"):
        return [f"{field}: {value!r} has a '..' segment, which would leave the models folder; give the path under /models/ itself"]
    # One spelling: the plan, the launch check and the staging read the path as written (//models/x is no folder of them).
    if value.startswith("/") and value != normal_path(value):
        return [f"{field}: {value!r} is {normal_path(value)!r} in other words; write it so (one slash between folders, none at the end)"]
    if value.startswith("/") and value != "/models" and not value.startswith("/models/"):
        return [f"{field}: {value!r} is a path outside /models, where the container sees vllm_models_dir (read-only); "
                "give /models/<folder> or a model id"]
    return []


def canonical_address(address: t.Any) -> str | None:
    """The one spelling of an IP address (``0:0::0`` is ``::``), or None for anything else; a zone
    index and an IPv4-mapped form are refused, since Docker and the wildcard opt-in read them otherwise."""
    if not isinstance(address, str) or "%" in address:
        return None
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return None
    return str(parsed)


def is_loopback_address(address: str) -> bool:
    canonical = canonical_address(address)
    return canonical is not None and ipaddress.ip_address(canonical).is_loopback


def address_problems(field: str, value: t.Any, options: t.Mapping[str, t.Any]) -> list[str]:
    if not isinstance(value, list) or not value:
        return [f"{field}: give at least one address (127.0.0.1 keeps the endpoint on loopback)"]
    errors = []
    for given in value:
        address = canonical_address(given)
        if address is None:
            errors.append(f"{field}: {given!r} is not an IP address in plain form (no zone index, no IPv4-mapped IPv6: "
                          "write 192.0.2.10 as such)")
            continue
        if address != given:
            errors.append(f"{field}: {given!r} is {address} written another way; write {address}, so the wildcard opt-in, "
                          "the gateway and the fleet check read it as it is")
            continue
        if address in WILDCARDS and not options["allow_wildcard_bind"]:
            errors.append(
                f"{field}: {address} publishes the endpoint on every interface of the host (LAN, management and any public "
                "address, and Docker's published ports bypass host firewalls). Bind the LAN address you mean, or set "
                "vllm_allow_wildcard_bind: true to accept that"
            )
    return errors


def speculative_problems(field: str, speculative: t.Any) -> list[str]:
    if not isinstance(speculative, dict):
        return [f"{field}: must be a mapping with method, num_speculative_tokens and model"]
    errors = [f"{field}.{name}: unknown key{closest(name, SPECULATIVE_KEYS)}" for name in sorted(set(speculative) - set(SPECULATIVE_KEYS))]
    tokens = speculative.get("num_speculative_tokens", 0)
    if not is_int(tokens) or not 0 <= tokens <= MAX_DRAFT_TOKENS:
        return errors + [f"{field}.num_speculative_tokens: {tokens!r} must be a whole number from 0 (off) to {MAX_DRAFT_TOKENS}: "
                         "acceptance falls with every position (the seeds measured 1 to 5), so longer drafts only add work"]
    if tokens == 0:
        return errors
    method = speculative.get("method")
    if method not in SPECULATIVE_METHODS:
        errors.append(f"{field}.method: {method!r} is not one of {', '.join(SPECULATIVE_METHODS)}")
    model = speculative.get("model")
    if method in DRAFTER_METHODS - {"mtp"} and not model:
        errors.append(f"{field}.model: method {method} needs the drafter model path (mtp alone may use the target's own head)")
    if model is not None:
        errors += weights_problems(f"{field}.model", model)
    extra = speculative.get("options") or {}
    if not isinstance(extra, dict):
        errors.append(f"{field}.options: must be a mapping of further speculative-config keys")
    else:
        clashing = sorted(set(extra) & (set(SPECULATIVE_KEYS) - {"options"}))
        if clashing:
            errors.append(f"{field}.options: {', '.join(clashing)} belong in speculative itself, not in options")
    return errors


# speculative_config keys a vLLM release dropped or deprecates (read in the 0.34.0 wheel's config/speculative.py): a start
# with a dropped key fails, so the plan refuses it for the release the image carries.
SPECULATIVE_KEY_RELEASES: dict[str, dict[str, str]] = {
    "disable_padded_drafter_batch": {"removed_in": "0.34.0"},
    "use_heterogeneous_vocab": {"removed_in": "0.34.0"},
    "parallel_drafting": {"deprecated_in": "0.34.0"},
}


def speculative_release_findings(field: str, keys: t.Iterable[str], version: str | None) -> tuple[list[str], list[str]]:
    """(errors, warnings) of speculative_config keys against the vLLM release that will read them; none when the
    release is unknown (the pull reads it and judges again)."""
    if not version or not VERSION.fullmatch(version):
        return [], []
    errors, warnings = [], []
    # A release candidate of a release already has its changes: compared by its numbers alone, padded (0.34 is 0.34.0).
    reached = release_order(version)[:3]
    for key in sorted(set(keys) & set(SPECULATIVE_KEY_RELEASES)):
        release = SPECULATIVE_KEY_RELEASES[key]
        if "removed_in" in release and reached >= release_order(release["removed_in"])[:3]:
            errors.append(f"{field}.options.{key}: vLLM {version} no longer accepts it (removed in {release['removed_in']}; a start "
                          "with it fails); drop it from the options")
        elif "deprecated_in" in release and reached >= release_order(release["deprecated_in"])[:3]:
            warnings.append(f"{field}.options.{key}: deprecated since vLLM {release['deprecated_in']}; the next release may refuse "
                            "it, so drop it while the rollout can compare")
    return errors, warnings


def pulled_image_problems(instances: t.Sequence[t.Mapping[str, t.Any]], pulled: t.Mapping[str, t.Any], stated: str | None,
                          stated_image: str = "") -> list[str]:
    """What each planned instance's pulled image refuses, before any unit changes: an entrypoint that cannot start the
    plan's command for the image's kind, a vllm_version the inventory states for ``stated_image`` that the image
    contradicts (the plan judged against the stated one), and speculative_config keys the release no longer accepts.
    ``pulled``: image -> {release (None: unread, judged at the floor), entrypoint}, for the images the pull read."""
    problems = []
    for instance in instances:
        read = pulled.get(instance["image"])
        if not isinstance(read, dict):
            continue
        problem = entrypoint_problem(instance["image"], instance["image_kind"], read.get("entrypoint"))
        problems += [f"instance {instance['name']}: {problem}"] if problem else []
        version = read.get("release")
        if not isinstance(version, str) or not VERSION.fullmatch(version):
            continue
        read = public_version(version)
        if stated and VERSION.fullmatch(stated) and instance["image"] == stated_image and release_order(stated) != release_order(read):
            problems.append(f"vllm_version: {stated} is stated, but {instance['image']} (instance {instance['name']}) carries vLLM "
                            f"{version}; set vllm_version to {read}, or leave it empty to judge by the image")
        errors, _warnings = speculative_release_findings(f"instance {instance['name']}.speculative",
                                                         instance["launch_check"]["speculative_keys"], version)
        problems += errors
    return list(dict.fromkeys(problems))


def normalised_flag(argument: str) -> str | None:
    """The long flag an argument names as vLLM's parser reads it (``_`` for ``-``, ``=value`` and
    ``.field`` of a JSON flag dropped), or None for a value."""
    if not argument.startswith("--"):
        return None
    return "--" + argument[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def expanded_flag(argument: str, flags: t.Collection[str]) -> str | None:
    """The long flag of ``flags`` that ``argument`` sets: exactly, negated (``--no-``), or as a
    prefix argparse would expand (vLLM's parser allows abbreviations)."""
    flag = normalised_flag(argument)
    if flag is None or flag == "--":
        return None
    for candidate in [flag] + (["--" + flag[len("--no-"):]] if flag.startswith("--no-") else []):
        if candidate in flags:
            return candidate
        expanded = sorted(known for known in flags if known.startswith(candidate))
        if expanded:
            return expanded[0]
    return None


def owned_flag(argument: str) -> str | None:
    """The flag the role owns that ``argument`` would set: exactly, negated (``--no-``), or as a
    prefix argparse would expand (vLLM's parser allows abbreviations)."""
    if argument.startswith("-") and not argument.startswith("--"):
        name = argument.split("=", 1)[0]
        for short, flag in OWNED_SHORT_FLAGS.items():
            if argument.startswith(short) or (len(name) >= 2 and short.startswith(name)):
                return flag
        return None
    return expanded_flag(argument, OWNED_FLAGS)


def secret_in_value(argument: str) -> bool:
    """Whether an argument (a flag's own value after ``=`` or a separate value) holds a token or a field named like a secret."""
    value = argument.split("=", 1)[1] if argument.startswith("-") and "=" in argument else argument
    if argument.startswith("-") and "=" not in argument:
        return False
    names = {match.group(1).lower().replace("-", "_") for match in SECRET_FIELD.finditer(value)}
    return bool(SECRET_VALUE.search(value) or names & SECRET_FIELD_NAMES)


def extra_args_problems(field: str, extra: t.Any) -> list[str]:
    if not isinstance(extra, list) or not all(isinstance(argument, str) for argument in extra):
        return [f"{field}: must be a list of strings"]
    errors = []
    for argument in extra:
        if CONTROL.search(argument):
            errors.append(f"{field}: {argument!r} contains a control character (a newline would split the unit's command line)")
            continue
        secret = expanded_flag(argument, SECRET_FLAGS)
        if secret or secret_in_value(argument):
            where = f"{argument.split('=', 1)[0]!r} would pass a secret" if secret else "an argument holds a secret-looking value"
            errors.append(f"{field}: {where} on the command line, where the unit, the plan file and every process list show "
                          f"it. Give it in the instance's env or vllm_env as {SECRET_FLAGS.get(secret or '', 'the variable it reads')} "
                          "instead (the role writes those to the 0600 env file only)")
            continue
        bypass = expanded_flag(argument, GUARD_BYPASS_FLAGS)
        if bypass:
            errors.append(f"{field}: {argument.split('=', 1)[0]!r} would set {bypass}, which {GUARD_BYPASS_FLAGS[bypass]}, where the "
                          "role's key check never runs; it is not allowed")
            continue
        flag = owned_flag(argument)
        if flag:
            shown = argument.split("=", 1)[0] + ("=..." if "=" in argument else "")
            errors.append(
                f"{field}: {shown!r} would set {flag}, which the role sets from the instance's keys "
                "(api_key, bind_addresses, port, served_model_names and the key table); set the key instead"
            )
    return errors


def env_problems(field: str, env: t.Any, owned: t.Collection[str] = OWNED_ENV) -> list[str]:
    if not isinstance(env, dict):
        return [f"{field}: must be a mapping of NAME: value"]
    errors = []
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            errors.append(f"{field}: {name!r} is not an environment variable name (letters, digits, underscores, not starting with a digit)")
        elif name in OFFLINE_ENV and name in owned:
            errors.append(f"{field}: {name} is set by the role to keep the container offline; set vllm_allow_outbound: true "
                          "to let it reach the internet and set this name yourself")
        elif name in owned:
            errors.append(f"{field}: {name} is set by the role ({'the api_key' if name == 'VLLM_API_KEY' else 'from the plan'}); "
                          "it may not be replaced through env")
        elif name in GUARD_BYPASS_ENV:
            errors.append(f"{field}: {name} {GUARD_BYPASS_ENV[name]}, where the role's key check never runs; it is not allowed")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            errors.append(f"{field}.{name}: {value!r} must be a string or a number")
        elif CONTROL.search(str(value)):
            errors.append(f"{field}.{name}: contains a newline or control character, which would add lines to the env file")
    return errors


def overridden(instances: t.Any, overrides: t.Any) -> tuple[t.Any, list[str]]:
    """``vllm_instances`` with ``vllm_instance_overrides`` (instance name -> settings) laid over the named
    instances: how the sweep relaunches one instance with a variant's settings while the inventory keeps
    its own. The overridden keys are checked like the instance's own."""
    if not overrides:
        return instances, []
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        return instances, ["vllm_instance_overrides: must map instance names to mappings of instance keys"]
    if not isinstance(instances, list):
        return instances, []
    names = [i.get("name") for i in instances if isinstance(i, dict)]
    errors = [f"vllm_instance_overrides.{name}: no instance of that name in vllm_instances{closest(str(name), [str(n) for n in names])}"
              for name in overrides if name not in names]
    return [{**i, **overrides.get(i.get("name"), {})} if isinstance(i, dict) else i for i in instances], errors


def merged_instances(instances: t.Any, defaults: t.Mapping[str, t.Any], image: str,
                     catalog: t.Mapping[str, t.Mapping[str, t.Any]], variable: str = "vllm_instances") -> tuple[list[dict[str, t.Any]], list[str]]:
    """Each instance over the defaults (and vllm_image) and the catalog entry it names, with the
    structural problems of the list. The instance's own keys always win."""
    if not isinstance(instances, list):
        return [], [f"{variable}: must be a list of mappings"]
    if not isinstance(defaults, dict):
        return [], ["vllm_instance_defaults: must be a mapping of instance keys"]
    errors = [f"vllm_instance_defaults.{name}: unknown key{closest(name, KEYS_BY_NAME)}" for name in defaults if name not in KEYS_BY_NAME]
    if "name" in defaults:
        errors.append("vllm_instance_defaults.name: set per instance, not as a default")
    merged = []
    for index, instance in enumerate(instances):
        if not isinstance(instance, dict):
            errors.append(f"{variable}[{index}]: must be a mapping of instance keys")
            continue
        base = {"image": image, "state": "present"} if image else {"state": "present"}
        entry = catalog.get(catalog_id(instance.get("catalog") or defaults.get("catalog")))  # type: ignore[arg-type]
        brought = catalog_defaults({**defaults, **instance}, entry) if entry else {}
        combined = {**base, **defaults, **brought, **instance, "_index": index, "_own": set(instance)}
        if "speculative" in brought:
            combined["speculative"] = brought["speculative"]
        merged.append(combined)
    return merged, errors


def instance_where(instance: t.Mapping[str, t.Any], options: t.Mapping[str, t.Any]) -> str:
    """How messages name an instance: its place in vllm_instances, or the cluster's instance."""
    if options["cluster"]:
        return "cluster_instance"
    return f"vllm_instances[{instance['_index']}]" + (f" ({instance['name']})" if isinstance(instance.get("name"), str) else "")


def instance_problems(instance: t.Mapping[str, t.Any], options: t.Mapping[str, t.Any]) -> list[str]:
    where = instance_where(instance, options)
    errors = [f"{where}.{name}: unknown key{closest(name, KEYS_BY_NAME)}" for name in sorted(instance["_own"]) if name not in KEYS_BY_NAME]
    if instance.get("state") == "absent":
        return errors + check_value(where, KEYS_BY_NAME["name"], instance.get("name"), options)
    for key in INSTANCE_KEYS:
        value = instance.get(key.name)
        if value is None:
            if key.required and not (key.name == "model" and instance.get("catalog")):
                errors.append(f"{where}.{key.name}: missing; {key.doc}")
            continue
        errors += check_value(where, key, value, options)
    # The instance's own model wins over its catalog entry's: left empty in YAML it would serve nothing.
    if "model" in instance["_own"] and catalog_id(instance.get("catalog")) in options["catalog"]:
        errors += catalog_reference_problems(where, {"catalog": instance["catalog"], "model": instance["model"]}, options["catalog"])
    errors += dev_route_problems(where, instance, options)
    warm, cold = instance.get("health_timeout") or options["health_timeout"], instance.get("cold_timeout") or options["cold_timeout"]
    if is_int(warm) and is_int(cold) and 0 < cold < warm <= KEYS_BY_NAME["health_timeout"].maximum:
        errors.append(f"{where}.cold_timeout: {cold} s is shorter than the {warm} s health_timeout of its warm starts, while a "
                      "start that compiles takes longest (seed 002: 25-45 minutes, later boots 7-10). Raise cold_timeout "
                      "(vllm_cold_timeout) to at least health_timeout")
    if instance.get("enable_auto_tool_choice") and not instance.get("tool_call_parser"):
        errors.append(f"{where}.enable_auto_tool_choice is true without tool_call_parser; vLLM refuses to start. "
                      "Set tool_call_parser (for example gemma4) or turn auto tool choice off")
    return errors


def dev_route_problems(where: str, instance: t.Mapping[str, t.Any], options: t.Mapping[str, t.Any]) -> list[str]:
    """Settings that open routes vLLM's API key does not guard: refused unless vllm_allow_dev_mode,
    and then only on an instance no other host can reach."""
    sources = [("vllm_env", options["env"]), ("sparkfleet_hardware_overrides.env", options["hardware"]["env"]),
               (f"{where}.env", instance.get("env"))]
    if options["cluster"]:
        sources.append(("cluster_node_env", options["cluster"].get("node_env")))
    opened = [(f"{variable}.{name}", DEV_ROUTE_ENV[name]) for variable, env in sources
              for name in sorted(set(env if isinstance(env, dict) else ()) & set(DEV_ROUTE_ENV))]
    arguments = instance.get("extra_args") if isinstance(instance.get("extra_args"), list) else []
    opened += [(f"{where}.extra_args {flag}", DEV_ROUTE_FLAGS[flag]) for flag in
               sorted({expanded_flag(a, DEV_ROUTE_FLAGS) for a in arguments if isinstance(a, str)} - {None})]
    binds = [a for a in instance.get("bind_addresses") if isinstance(a, str)] if isinstance(instance.get("bind_addresses"), list) else []
    exposed = [a for a in binds if not is_loopback_address(a)]
    errors = []
    for setting, routes in opened:
        if not options["allow_dev_mode"]:
            errors.append(f"{setting}: opens {routes}, engine controls vLLM's own key check leaves open (it guards only its /v1 "
                          "paths). Remove it, or set vllm_allow_dev_mode: true for an instance bound to loopback only")
        elif exposed:
            errors.append(f"{setting}: {where} binds {', '.join(exposed)}, where {routes} would answer other hosts; "
                          "with vllm_allow_dev_mode bind 127.0.0.1 or ::1 only")
    return errors


def host_problems(present: t.Sequence[t.Mapping[str, t.Any]], options: t.Mapping[str, t.Any]) -> list[str]:
    """Problems across one host's instances: the shared memory pool, unique names and ports, LAN binds
    (those only when the host's addresses are known: not when only the inventory is checked)."""
    errors: list[str] = []
    gmus = [i.get("gpu_memory_utilization") for i in present]
    cap = options["gmu_cap"]
    # A cap that is no fraction is option_problems' to name.
    if gmus and all(isinstance(g, (int, float)) and not isinstance(g, bool) and 0 < g < 1 for g in gmus) and is_share(cap):
        total = round(sum(gmus) + options["reserved_gmu"], 4)
        if total > options["gmu_cap"]:
            listed = " + ".join(f"{i.get('name')} {i.get('gpu_memory_utilization')}" for i in present)
            listed += f" + this host's vllm_instances {options['reserved_gmu']}" if options["reserved_gmu"] else ""
            errors.append(
                f"{options['variable']}: gpu_memory_utilization adds up to {total} ({listed}), over this hardware class's cap "
                f"of {options['gmu_cap']} (vllm_gmu_cap); each fraction is a share of the whole unified pool. Lower them"
            )
    served = [name for i in present if isinstance(i.get("served_model_names"), list) for name in i["served_model_names"]]
    for field, values in (("name", [i.get("name") for i in present]), ("port", [i.get("port") for i in present]),
                          ("served_model_names", served)):
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            errors.append(f"{options['variable']}: {field} {', '.join(repeated)} used more than once on this host; a client or gateway "
                          "could not tell the instances apart")
    # A worker of a cluster serves no API: the address is the head's.
    if options["host_addresses"] is None or (options["cluster"] and options["cluster"]["rank"] > 0):
        return errors
    for instance in present:
        # Misspelt addresses are refused by the instance's own check.
        binds = instance.get("bind_addresses") if isinstance(instance.get("bind_addresses"), list) else []
        addresses = [a for a in binds if isinstance(a, str) and canonical_address(a) == a]
        lan = [a for a in addresses if a not in LOOPBACK | WILDCARDS]
        missing = [a for a in lan if a not in options["host_addresses"]]
        if missing:
            errors.append(
                f"{options['variable']} ({instance.get('name')}).bind_addresses: {', '.join(missing)} is not an address of this host "
                f"(it has {', '.join(options['host_addresses']) or 'none'}); Docker would fail with 'cannot assign requested address'"
            )
        elif lan and not options["wait_online_enabled"]:
            errors.append(
                f"{options['variable']} ({instance.get('name')}).bind_addresses: {', '.join(lan)} is a LAN address, which needs "
                "the wait_online role on this host so Docker starts after the address exists (seed 000's LAN-bind race)"
            )
    return errors


def serve_args(instance: t.Mapping[str, t.Any], cluster: t.Mapping[str, t.Any] | None = None) -> list[str]:
    """Arguments after ``vllm serve`` (the image's entrypoint), rendered from the key table. A
    cluster node shares the host's network (its ranks talk on many ports), so it binds the
    instance's address itself and adds its rank and rendezvous."""
    if cluster:
        args = [instance["model"], "--host", instance["bind_addresses"][0], "--port", str(instance["port"])]
    else:
        args = [instance["model"], "--host", "0.0.0.0", "--port", str(CONTAINER_PORT)]
    for key in INSTANCE_KEYS:
        value = instance.get(key.name)
        if key.flag is None or value is None or value == "":
            continue
        if key.kind == "tokens":
            args += [key.flag, *value]
        elif key.kind == "switch":
            args += [key.flag] if value else []
        elif key.kind == "tristate":
            args += [key.flag if value else "--no-" + key.flag[2:]]
        elif key.kind == "speculative":
            config = speculative_config(value)
            args += [key.flag, json.dumps(config, sort_keys=True, separators=(",", ":"))] if config else []
        else:
            args += [key.flag, str(value)]
    return args + [*GUARD_ARGS] + (serve_cluster_args(cluster) if cluster else []) + list(instance.get("extra_args") or [])


def container_command(image: str, args: list[str], cluster: t.Mapping[str, t.Any] | None, kind: str) -> list[str]:
    """What follows ``docker run``'s options: the image and ``vllm serve``'s arguments as the image's kind starts them; on
    the Ray backend a worker runs only ``ray start``, and the head starts Ray before handing over to vLLM (the arguments
    reach vLLM as positional parameters, never through the shell's parsing). A kind whose entrypoint must run (NGC's)
    gets these as its command; the others have their entrypoint replaced."""
    started = IMAGE_KINDS[kind]
    if not cluster or cluster["backend"] != "ray":
        return [image, *started["serve_command"], *args]
    ray = ray_start_args(cluster)
    if cluster["rank"] > 0:
        return [image, "ray", *ray] if started["keeps_entrypoint"] else ["--entrypoint", "ray", image, *ray]
    script = "ray " + " ".join(ray[:1] + [a for a in ray[1:] if a != "--block"]) + ' && exec vllm serve "$@"'
    shell = [image, "/bin/sh"] if started["keeps_entrypoint"] else ["--entrypoint", "/bin/sh", image]
    return [*shell, "-c", script, "vllm-serve", *args]


def published_ports(instance: t.Mapping[str, t.Any]) -> list[str]:
    """docker --publish values: the host port on each bind address."""
    return [f"{f'[{a}]' if ':' in a else a}:{instance['port']}:{CONTAINER_PORT}" for a in instance["bind_addresses"]]


def endpoint_url(address: str, port: int) -> str:
    """The URL the host reaches the endpoint on: a wildcard bind is reached on loopback."""
    if address in WILDCARDS:
        address = "127.0.0.1" if address == "0.0.0.0" else "::1"
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def env_file(api_key: str, environment: t.Mapping[str, t.Any]) -> str:
    """The instance's env file (Docker's --env-file format: NAME=value, taken literally to the end of the line)."""
    lines = ["# Managed by Ansible (sparkfleet.vllm.vllm); holds the API key, mode 0600.", f"VLLM_API_KEY={api_key}"]
    lines += [f"{name}={environment[name]}" for name in sorted(environment)]
    return "\n".join(lines) + "\n"


def image_key(image: str) -> str:
    """The name of an image's compile-cache folder: its digest's first 16 hex digits (the same image through a
    mirror or under another name shares it), else a hash of a floating reference."""
    _name, separator, digest = image.partition("@sha256:")
    return digest[:16] if separator and re.fullmatch(r"[0-9a-f]{64}", digest) else hashlib.sha256(image.encode()).hexdigest()[:16]


def jit_folder(cache_dir: str, image: str) -> str:
    return f"{cache_dir}/jit/{image_key(image)}"


def cache_key(image: str, command: t.Sequence[str], environment: t.Mapping[str, t.Any]) -> str:
    """What a start compiles for: the image, the serve command and the environment (never the API key). A start with
    the same key loads the kernels the last one compiled; any other compiles anew (seed 001: a new --max-model-len)."""
    digest = hashlib.sha256(json.dumps({"image": image, "command": list(command), "env": dict(environment)}, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def config_hash(run: t.Sequence[str], env_text: str) -> str:
    """What a container was started with; a running container with another hash is drift."""
    digest = hashlib.sha256(json.dumps({"run": list(run), "env": env_text}, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def instance_plan(instance: t.Mapping[str, t.Any], start_after: list[str], options: t.Mapping[str, t.Any],
                  memory: dict[str, t.Any] | None) -> tuple[dict[str, t.Any], str]:
    """(public plan, env file text) of one valid instance."""
    name = instance["name"]
    cluster = options["cluster"]
    files = instance_files(options["config_dir"], name, bool(cluster))
    container = files["container"]
    image = run_image(instance["image"], options["registry_mirror"])
    environment = {**({} if options["allow_outbound"] else OFFLINE_ENV), **options["hardware"]["env"], **options["env"],
                   **(instance.get("env") or {}), "PYTHONPATH": GUARD_DIR}
    if cluster:
        environment.update({**cluster.get("node_env", {}), **cluster["network_env"]})
    env_text = env_file(instance["api_key"], environment)
    timeout = instance.get("health_timeout") or options["health_timeout"]
    cold_timeout = instance.get("cold_timeout") or options["cold_timeout"]
    jit = jit_folder(options["cache_dir"], instance["image"])
    run = [DOCKER_CLIENT, "run", "--name", container, "--ipc=host", "--env-file", files["env_path"]]
    publications = [] if cluster else published_ports(instance)
    for publication in publications:
        run += ["--publish", publication]
    run += ["--network", "host"] if cluster else []
    # Seed 002's launch: NCCL registers its buffers with the RDMA devices, which needs unlimited locked memory.
    run += ["--device", "/dev/infiniband", "--ulimit", "memlock=-1"] if cluster and cluster["rdma"] else []
    # A crashed engine dumps its whole address space (a 41 GB core on a GX10's weights disk, issue 41): none, or one
    # capped at what the operator asks. Containers take their limits from dockerd, not from the unit.
    run += ["--ulimit", f"core={options['core_dump_mib'] * MIB}"]
    run += ["--volume", f"{options['models_dir']}:/models:ro"]
    run += ["--volume", f"{pathlib.PurePosixPath(RUNTIME_DIR) / GUARD_FILE}:{GUARD_DIR}/{GUARD_FILE}:ro"]
    run += ["--volume", f"{options['cache_dir']}/{HF_CACHE[0]}:{HF_CACHE[1]}"]
    run += [argument for cache, target in JIT_CACHES for argument in ("--volume", f"{jit}/{cache}:{target}")]
    run += ["--gpus", "all"] if options["gpus"] else []
    args = serve_args(instance, cluster)
    kind = image_kind(instance["image"], options["image_kinds"])
    command = container_command(image, args, cluster, kind)
    # The middleware's own text too: a fixed guard restarts the containers that load it.
    digest = config_hash([*run, *command, options["guard_digest"]], env_text)
    run += ["--label", f"{INSTANCE_LABEL}={name}", "--label", f"{CONFIG_HASH_LABEL}={digest}", *command]
    url = endpoint_url(instance["bind_addresses"][0], instance["port"])
    speculative = speculative_config(instance.get("speculative"))
    weights_host_path = host_path(instance["model"], options["models_dir"])
    plan = {
        "schema_version": PLAN_SCHEMA_VERSION,
        "name": name,
        **files,
        "url": url,
        "container_url": url if cluster else f"http://127.0.0.1:{CONTAINER_PORT}",
        "image": instance["image"],
        "run_image": image,
        "image_kind": kind,
        "serve_args": args,
        "docker_run": run,
        "env_names": ["VLLM_API_KEY", *sorted(environment)],
        "port": instance["port"],
        "bind_addresses": list(instance["bind_addresses"]),
        "published_ports": publications,
        "served_names": list(instance["served_model_names"]),
        "model": instance["served_model_names"][0],
        "weights": instance["model"],
        "weights_host_path": weights_host_path,
        "gpu_memory_utilization": instance["gpu_memory_utilization"],
        "memory_probe": memory_probe_argv(image, bool(options["gpus"]), IMAGE_KINDS[kind]["keeps_entrypoint"]),
        "paused_containers": [str(name) for name in options["launch_paused_containers"]]
        if isinstance(options["launch_paused_containers"], list) else [],
        "catalog": instance.get("catalog"),
        "memory": memory,
        "drop_caches": options["drop_caches"],
        "memory_admission": options["memory_admission"],
        "maintenance_flag": options["maintenance_flag"],
        "start_after": start_after,
        "health_timeout": timeout,
        # A start on caches no start of these settings filled yet (no stamp) is cold: it waits cold_timeout, and a
        # single instance's unit may exit once after compiling and start again on its own (seed 001's 31B);
        # a cluster's role relaunches every rank once instead (restarts 0: a rank never restarts alone).
        "cold_start": {
            "timeout": cold_timeout,
            "jit_dir": jit,
            "stamp": f"{jit}/{WARM_STAMPS}/{cache_key(instance['image'], command, environment)}",
            "restarts": 0 if cluster else 1,
            "restart_window": options["restart_delay"] + RESTART_SLACK,
            "kv_cache_warn_share": options["kv_cache_warn_share"],
        },
        "start_bound": start_bound(files["unit"], cold_timeout, options),
        "config_hash": digest,
        "launch_check": {
            "path": weights_host_path,
            "max_model_len": instance.get("max_model_len"),
            "speculative_method": speculative["method"] if speculative else None,
            "speculative_keys": sorted(speculative) if speculative else [],
            "allow_drafter_on_base_model": bool(instance.get("allow_drafter_on_base_model")),
        },
    }
    plan["cluster"] = None if not cluster else {
        "rank": cluster["rank"], "head": cluster["rank"] == 0, "nnodes": cluster["nnodes"], "backend": cluster["backend"],
        "master_addr": cluster["master_addr"], "master_port": cluster["master_port"], "host_ip": cluster["host_ip"],
        "nodes": list(cluster.get("nodes") or []), "start_wave": start_wave(cluster["backend"], cluster["rank"]),
    }
    plan["unit_file"] = unit_file(plan, options)
    return plan, env_text


# How long systemd waits for a unit's stop.
STOP_SECONDS = 60


def start_seconds(cold_timeout: int) -> int:
    """How long systemd lets one start take: the readiness wait gives up after the warm or the cold timeout, as the
    stamp says; systemd after the longer."""
    return cold_timeout + 60


def start_bound(unit: str, cold_timeout: int, options: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The one bound on the unit's starts, whoever causes them (a boot, systemd, the watchdog; Ansible's relaunch, a person
    acting, clears the count): vllm_start_limit_burst starts within a window that holds that many starts which each hang
    until systemd gives up on them, so a start that hangs every time is bounded too (seed 002: about 35 failed starts
    left a GB10 needing a power cycle). systemd's own start limit uses the same window."""
    # Each hung start also spends systemd's stop of it and the door's own work before the next: a minute's slack each.
    hung = options["start_limit_burst"] * (start_seconds(cold_timeout) + options["restart_delay"] + STOP_SECONDS + 60)
    return {"starts": options["start_limit_burst"], "window": max(options["start_limit_interval"], hung),
            "path": start_record(unit)}


def unit_file(plan: t.Mapping[str, t.Any], options: t.Mapping[str, t.Any]) -> str:
    """The systemd unit owning the instance's container. Every start, whoever causes it, runs the host runtime
    (_host_runtime): its ExecStart admits the start and becomes the plan's docker run, its ExecStartPost waits for
    readiness (a worker serves no API: its unit is up once its container runs; the head's wait covers the cluster),
    its ExecStopPost starts again what a start that ended early had stopped. It starts after the instances declared
    before it have passed their readiness wait, so instances sharing one memory pool never profile memory at once
    (seed 000); its automatic restarts are bounded, because on GB10 a crash loop leaks unified memory until the box
    needs a power cycle, and a refused start is not restarted at all. A cluster node's unit does not restart on its
    own: one rank alone never recovers, so restarts are the cluster role's, all ranks at once."""
    container = plan["container"]
    # Isolated: nothing in the environment or the working folder shadows the installed runtime.
    runtime = ["/usr/bin/python3", "-I", RUNTIME_ENTRY]
    ready = not plan.get("cluster") or plan["cluster"]["head"]
    what = f"cluster {plan['name']} rank {plan['cluster']['rank']}" if plan.get("cluster") else f"instance {plan['name']}"
    fabric = (options["cluster"] or {}).get("fabric")
    # Every start of a rank, at boot too, waits for the other nodes on the fast link at the cluster's MTU.
    fabric_wait = ["/usr/bin/python3", "-I", str(pathlib.PurePosixPath(RUNTIME_DIR) / FABRIC_WAIT_FILE),
                   "--source", options["cluster"]["host"], "--interface", fabric["interface"],
                   "--mtu", str(fabric["mtu"]), *[f"--peer={p['name']}={p['address']}" for p in fabric["peers"]]] if fabric else None
    return "\n".join([
        f"# Managed by Ansible (sparkfleet.vllm.{'cluster' if plan.get('cluster') else 'vllm'}): the unit owns the container "
        f"of {'cluster node' if plan.get('cluster') else 'instance'} {plan['name']}.",
        "[Unit]",
        f"Description=vLLM {what} (sparkfleet.vllm)",
        "Requires=docker.service",
        "Wants=network-online.target",
        "After=" + " ".join(["docker.service", "network-online.target", *plan["start_after"]]),
        f"StartLimitIntervalSec={plan['start_bound']['window']}",
        f"StartLimitBurst={options['start_limit_burst']}",
        "",
        "[Service]",
        "Type=simple",
        "ExecStartPre=-" + exec_line([DOCKER_CLIENT, "rm", "--force", container]),
        *([f"ExecStartPre={exec_line(fabric_wait)}"] if fabric_wait else []),
        "ExecStart=" + exec_line([*runtime, "start", "--plan", plan["plan_path"]]),
        *(["ExecStartPost=" + exec_line([*runtime, "ready", "--plan", plan["plan_path"]])] if ready else []),
        "ExecStop=" + exec_line([DOCKER_CLIENT, "stop", "--time", "30", container]),
        # What a start stopped runs again; a container that will not start is the journal's to say, not a failed unit.
        "ExecStopPost=-" + exec_line([*runtime, "release", "--plan", plan["plan_path"]]),
        # A rank restarted alone never rejoins its group (vLLM 32136): the cluster role restarts all ranks together. Any
        # other exit but a planned stop restarts an instance: vLLM exits 0 after the SIGTERM earlyoom sends it (seed 000
        # has earlyoom prefer vLLM), which on-failure would leave down.
        "Restart=no" if plan.get("cluster") else "Restart=always",
        f"RestartSec={options['restart_delay']}",
        f"RestartPreventExitStatus={REFUSED}",
        # The readiness wait gives up after the warm or the cold timeout, as the stamp says; systemd after the longer.
        f"TimeoutStartSec={start_seconds(plan['cold_start']['timeout'])}",
        f"TimeoutStopSec={STOP_SECONDS}",
        # No core dumps from the start door and the Docker client (systemd's DefaultLimitCORE is infinity); the engine's
        # container takes vllm_core_dump_mib through --ulimit.
        "LimitCORE=0",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


# build_plan's options, every one given by the caller (roles/vllm/tasks/plan.yml from the role's variables,
# whose defaults are in roles/vllm/defaults/main.yml): a default here would drift from the role's.
PLAN_OPTIONS: tuple[str, ...] = (
    "image", "allow_floating_tag", "allow_wildcard_bind", "allow_dev_mode", "allow_outbound", "guard_digest", "registry_mirror", "gmu_cap",
    "hardware_class", "hardware_overrides", "catalog_extra", "memory_total_bytes", "vllm_version", "drop_caches", "overrides",
    "cluster", "reserved_gmu", "gpus", "models_dir", "cache_dir", "config_dir", "env", "health_timeout", "cold_timeout",
    "host_addresses",
    "wait_online_enabled", "memory_admission", "start_limit_interval", "start_limit_burst", "restart_delay", "kv_cache_warn_share",
    "maintenance_flag",
    "launch_paused_containers", "cache_backup_dir", "cache_backup_location", "host_name", "core_dump_mib", "image_kinds",
)
# The options an argument spec types as a switch or a number: given as text by -e (extra variables are text), they are
# read as validate_argument_spec reads them before anything checks them.
SWITCH_OPTIONS = ("allow_floating_tag", "allow_wildcard_bind", "allow_dev_mode", "allow_outbound", "drop_caches", "gpus", "memory_admission")
FRACTION_OPTIONS = ("gmu_cap", "kv_cache_warn_share")
CACHE_BACKUP_LOCATIONS = ("host", "controller")
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


MIB = 1024 * 1024
# The largest core an engine may write where the operator asks for one: enough for a Python-level trace and the
# engine core's own stacks, far below the weights it maps.
MAX_CORE_DUMP_MIB = 16_384
# The settings of the units' restarts and the gate: whole numbers, with the largest any operator means.
OPTION_BOUNDS = {
    "start_limit_interval": (86_400, "seconds; a day already forgets no crash loop"),
    "start_limit_burst": (20, "starts; on GB10 each crash leaks unified memory, about 35 left a box needing a power cycle"),
    "restart_delay": (3_600, "seconds between automatic restarts"),
    "health_timeout": (14_400, "seconds; seed 002's coldest first boot took 45 minutes, a gate of hours hides a hung start"),
    "cold_timeout": (14_400, "seconds; seed 002's coldest first boot took 45 minutes, a gate of hours hides a hung start"),
}


# An image repository as a pin names it before its tag and digest: registry[:port]/path.
REPOSITORY = re.compile(r"[a-z0-9][a-z0-9._-]*(?::[0-9]{1,5})?(?:/[a-z0-9][a-z0-9._-]*){0,8}")


def image_kinds_problems(kinds: t.Any) -> list[str]:
    """vllm_image_kinds: an image repository (without tag or digest) to one of the kinds the plan knows how to start."""
    if not isinstance(kinds, dict):
        return [f"vllm_image_kinds: {kinds!r} must map image repositories to kinds ({', '.join(IMAGE_KINDS)})"]
    errors = []
    for repository, kind in kinds.items():
        if not (isinstance(repository, str) and REPOSITORY.fullmatch(repository)):
            errors.append(f"vllm_image_kinds: {repository!r} is not an image repository such as nvcr.io/nvidia/vllm (no tag, no digest)")
        elif kind not in IMAGE_KINDS:
            errors.append(f"vllm_image_kinds.{repository}: {kind!r} is not a kind the collection knows how to start "
                          f"({', '.join(IMAGE_KINDS)})")
    return errors


def host_folder_problems(variable: str, value: t.Any, least_parts: int = 1) -> list[str]:
    """A host folder lands in docker's --volume spec and the units' lines, and the role creates it."""
    problem = path_problem(value, least_parts)
    return [f"{variable}: {value!r} {problem}"] if problem else []


def option_problems(options: t.Mapping[str, t.Any]) -> list[str]:
    errors = env_problems("vllm_env", options["env"], options["owned_env"])
    errors += env_problems("sparkfleet_hardware_overrides.env", options["hardware"]["env"], options["owned_env"])
    if options["cluster"]:
        errors += env_problems("cluster_node_env", options["cluster"].get("node_env") or {}, options["owned_env"])
    cap, ceiling = options["gmu_cap"], options["hardware"]["gmu_ceiling"]
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap <= 1:
        errors.append(f"vllm_gmu_cap: {cap!r} must be a fraction between 0 and 1, or unset for the class's ceiling")
    elif cap > ceiling:
        errors.append(f"vllm_gmu_cap: {cap} is above the {options['hardware_class']} class's ceiling of {ceiling} "
                      f"({options['hardware']['sources'].get('gmu_ceiling', 'see docs/hardware')}). Lower it, or override "
                      "sparkfleet_hardware_overrides.gmu_ceiling if you measured this box higher")
    share = options["kv_cache_warn_share"]
    if not is_share(share):
        errors.append(f"vllm_kv_cache_warn_share: {share!r} must be a fraction above 0 and at most 1, such as 0.9 (1 warns of any "
                      "start with a smaller KV cache than the best good one)")
    version = options["vllm_version"]
    if version and not (isinstance(version, str) and VERSION.fullmatch(version)):
        errors.append(f"vllm_version: {version!r} must be the image's vLLM release such as 0.32.0, or empty")
    if not isinstance(options["drop_caches"], bool):
        errors.append(f"vllm_drop_caches: {options['drop_caches']!r} must be true or false, or unset for the class's setting")
    for name in ("models_dir", "cache_dir"):
        errors += host_folder_problems(f"vllm_{name}", options[name])
    # The role makes the configuration folder root-only (0700) and removes the plan files in it that it no longer plans.
    errors += host_folder_problems("cluster_config_dir" if options["cluster"] else "vllm_config_dir", options["config_dir"], 2)
    # serving_unit writes the flag and deletes it: anywhere else a typo could delete a file the box needs.
    flag = options["maintenance_flag"]
    flag_problem = "must be under /run" if not (isinstance(flag, str) and flag.startswith("/run/")) else path_problem(flag, 2)
    if flag_problem:
        errors.append(f"vllm_maintenance_flag: {flag!r} {flag_problem}; give a file under /run (cleared at boot), such as "
                      "/run/sparkfleet/vllm-maintenance")
    for switch in ("allow_dev_mode", "allow_outbound", "gpus", "memory_admission"):
        if not isinstance(options[switch], bool):
            errors.append(f"vllm_{switch}: {options[switch]!r} must be true or false")
    errors += paused_containers_problems("vllm_launch_paused_containers", options["launch_paused_containers"])
    errors += cache_backup_problems(options)
    errors += image_kinds_problems(options["image_kinds"])
    core = options["core_dump_mib"]
    if not is_int(core) or not 0 <= core <= MAX_CORE_DUMP_MIB:
        errors.append(f"vllm_core_dump_mib: {core!r} must be a whole number of MiB from 0 (no core dump, the default) to "
                      f"{MAX_CORE_DUMP_MIB:,}: an engine's full core runs to tens of GB and fills the weights disk")
    for name, (maximum, why) in OPTION_BOUNDS.items():
        if not is_int(options[name]) or not 1 <= options[name] <= maximum:
            errors.append(f"vllm_{name}: {options[name]!r} must be a whole number from 1 to {maximum:,} ({why})")
    if is_int(options["start_limit_interval"]) and is_int(options["restart_delay"]) and is_int(options["start_limit_burst"]) \
            and options["start_limit_interval"] < options["restart_delay"] * options["start_limit_burst"]:
        errors.append(
            f"vllm_start_limit_interval: {options['start_limit_interval']} s is shorter than vllm_start_limit_burst x "
            f"vllm_restart_delay ({options['start_limit_burst']} x {options['restart_delay']} s), so the limit could never trip "
            "and a crashing engine would restart forever. Raise the interval"
        )
    mirror = options["registry_mirror"]
    if mirror and not TOKEN.fullmatch(mirror):
        errors.append(f"vllm_registry_mirror: {mirror!r} must be host[:port] without spaces")
    return errors


def cache_backup_problems(options: t.Mapping[str, t.Any]) -> list[str]:
    backup, location = options["cache_backup_dir"], options["cache_backup_location"]
    if location not in CACHE_BACKUP_LOCATIONS:
        return [f"vllm_cache_backup_location: {location!r} must be host (a folder on the host: another disk, a mounted share) "
                "or controller"]
    if backup in ("", None):
        return []
    problem = path_problem(backup, 2)
    if problem:
        return [f"vllm_cache_backup_dir: {backup!r} {problem}; give a folder a reinstall does not wipe, or leave it empty"]
    # Compared in one spelling each: /srv//cache/x is /srv/cache/x to the kernel.
    backup_dir, cache_dir = normal_path(backup) + "/", normal_path(str(options["cache_dir"])) + "/"
    if location == "host" and (backup_dir.startswith(cache_dir) or cache_dir.startswith(backup_dir)):
        return [f"vllm_cache_backup_dir: {backup!r} and vllm_cache_dir {options['cache_dir']!r} hold one another; a backup "
                "belongs on another disk or a share, apart from the caches it keeps"]
    if not (isinstance(options["host_name"], str) and HOST_NAME.fullmatch(options["host_name"])):
        return [f"vllm_cache_backup_dir: the backups are kept per host, under the inventory name, and {options['host_name']!r} "
                "is no folder name (letters, digits, dots, dashes and underscores); rename the host in the inventory"]
    return []


def compile_caches(plans: t.Sequence[t.Mapping[str, t.Any]], options: t.Mapping[str, t.Any]) -> list[dict[str, t.Any]]:
    """Each planned image's compile-cache folder, its planned stamps and its backup's path (a folder on the host, or
    a tar on the controller), per host; none without vllm_cache_backup_dir."""
    if not options["cache_backup_dir"]:
        return []
    caches: dict[str, dict[str, t.Any]] = {}
    for plan in plans:
        jit = plan["cold_start"]["jit_dir"]
        backup = f"{options['cache_backup_dir']}/{options['host_name']}/{image_key(plan['image'])}"
        entry = caches.setdefault(jit, {"jit_dir": jit, "stamps": [], "backup": backup + (".tar" if options["cache_backup_location"] == "controller" else "")})
        stamp = plan["cold_start"]["stamp"].rsplit("/", 1)[1]
        entry["stamps"] += [] if stamp in entry["stamps"] else [stamp]
    return list(caches.values())


def pool_share(instances: t.Any, defaults: t.Any) -> float:
    """The share of the memory pool a host's present instances take (what a cluster node on the
    same host must leave them); malformed entries count nothing, their own plan refuses them."""
    if not isinstance(instances, list):
        return 0.0
    base = defaults.get("gpu_memory_utilization") if isinstance(defaults, dict) else None
    shares = [i.get("gpu_memory_utilization", base) for i in instances if isinstance(i, dict) and i.get("state", "present") != "absent"]
    return round(sum(s for s in shares if isinstance(s, (int, float)) and not isinstance(s, bool)), 4)


def text_read(given: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """The options with each text switch or number read as the role's argument spec reads it (``-e vllm_health_timeout=30``
    arrives as "30"); text that reads as neither is left for the checks to name, and so is any other type."""
    readers = {**dict.fromkeys((*OPTION_BOUNDS, "core_dump_mib"), as_int), **dict.fromkeys(SWITCH_OPTIONS, as_bool),
               **dict.fromkeys(FRACTION_OPTIONS, as_float)}
    options = dict(given)
    for name, reader in readers.items():
        read = reader(options[name]) if isinstance(options.get(name), str) and options[name].strip() else None
        if read is not None:
            options[name] = read
    return options


def build_plan(instances: t.Any, defaults: t.Any, **given: t.Any) -> dict[str, t.Any]:
    """The plan of one host: ``instances`` (planned, in start order), ``absent`` (names to remove),
    ``errors`` (every problem; when there is any, nothing else is filled in), ``folders`` (the
    configuration and data folders to create, each with its mode), ``helpers`` (the files the units
    run and mount: path, mode and source in the collection), ``env_files``
    (name -> env file text) and ``endpoints`` (what a gateway needs to route to each instance,
    its key included); those two are the only parts holding secrets."""
    missing, unknown = [name for name in PLAN_OPTIONS if name not in given], sorted(set(given) - set(PLAN_OPTIONS))
    if missing or unknown:
        raise TypeError(f"build_plan: plan options missing: {', '.join(missing) or 'none'}; unknown: {', '.join(unknown) or 'none'}")
    options = text_read(given)
    options["variable"] = "cluster_instance" if options["cluster"] else "vllm_instances"
    options["owned_env"] = (OWNED_ENV | set(NETWORK_ENV) if options["cluster"] else OWNED_ENV) | (
        set() if options["allow_outbound"] is True else set(OFFLINE_ENV))
    plan: dict[str, t.Any] = {"instances": [], "absent": [], "errors": [], "warnings": [], "env_files": {},
                              "endpoints": [], "compile_caches": [], "hardware_class": options["hardware_class"]}
    hardware = resolve_class(options["hardware_class"], options["hardware_overrides"])
    extra_problems = catalog_problems(options["catalog_extra"])
    plan["errors"] = hardware["errors"] + extra_problems
    if plan["errors"]:
        return plan
    options["hardware"] = hardware["values"]
    options["catalog"] = {**CATALOG, **options["catalog_extra"]}
    options["gmu_cap"] = options["hardware"]["gmu_ceiling"] if options["gmu_cap"] in (None, "") else options["gmu_cap"]
    options["gmu_cap"] = float(options["gmu_cap"]) if is_int(options["gmu_cap"]) else options["gmu_cap"]
    options["drop_caches"] = options["hardware"]["drop_caches"] if options["drop_caches"] in (None, "") else options["drop_caches"]
    plan["gmu_cap"] = options["gmu_cap"]
    instances, errors = overridden(instances, options["overrides"])
    merged, merge_errors = merged_instances(instances, defaults, options["image"], options["catalog"], options["variable"])
    errors += merge_errors
    errors += option_problems(options)
    memories: dict[int, dict[str, t.Any] | None] = {}
    for instance in merged:
        problems = instance_problems(instance, options)
        if not problems and instance.get("state") != "absent":
            if instance.get("max_num_batched_tokens") is None and options["hardware"]["max_num_batched_tokens"]:
                instance["max_num_batched_tokens"] = options["hardware"]["max_num_batched_tokens"]
            entry, pool = catalog_entry(instance, options), arithmetic_pool(options)
            text_only = entry and pool and text_only_default(instance_where(instance, options), instance, entry, pool,
                                                             instance.get("max_num_batched_tokens"))
            if text_only:
                instance["language_model_only"] = True
                plan["warnings"].append(text_only)
            problems, warnings, memories[instance["_index"]] = instance_findings(instance, options)
            plan["warnings"] += warnings
        errors += problems
    present = [i for i in merged if i.get("state") != "absent"]
    errors += host_problems(present, options)
    plan["errors"] = errors
    if errors:
        return plan
    # The host's folders the instances need: the configuration (root only, it holds the keys) and
    # what the containers mount (the models, the caches, the readiness wait and the key middleware).
    plan["folders"] = [
        *[{"path": path, "mode": "0700"} for path in (options["config_dir"], f"{options['config_dir']}/last-good")],
        *[{"path": path, "mode": "0755"} for path in (options["models_dir"], f"{options['cache_dir']}/{HF_CACHE[0]}", str(pathlib.PurePosixPath(RUNTIME_DIR)))],
        *[{"path": f"{jit_folder(options['cache_dir'], image)}/{cache}", "mode": "0755"}
          for image in dict.fromkeys(i["image"] for i in present) for cache in (*(name for name, _target in JIT_CACHES), WARM_STAMPS)],
    ]
    plan["helpers"] = [*[{"path": str(pathlib.PurePosixPath(RUNTIME_DIR) / name), "mode": "0644", "source": source}
                         for name, source in HELPERS + (CLUSTER_HELPERS if options["cluster"] else ())]]
    for instance in present:
        public, env_text = instance_plan(instance, [i["unit"] for i in plan["instances"]], options, memories.get(instance["_index"]))
        plan["instances"].append(public)
        plan["env_files"][public["name"]] = env_text
        plan["endpoints"].append({"name": public["name"], "port": public["port"], "bind_addresses": public["bind_addresses"],
                                  "served_names": public["served_names"], "api_key": instance["api_key"],
                                  "head": not public["cluster"] or public["cluster"]["head"]})
    plan["compile_caches"] = compile_caches(plan["instances"], options)
    plan["absent"] = [i["name"] for i in merged if i.get("state") == "absent"]
    return plan


def catalog_entry(instance: t.Mapping[str, t.Any], options: t.Mapping[str, t.Any]) -> dict[str, t.Any] | None:
    return options["catalog"].get(instance["catalog"]) if instance.get("catalog") else None


def arithmetic_pool(options: t.Mapping[str, t.Any]) -> float | None:
    """The memory pool the arithmetic shares out (the host's total, else its class's); None on a class without a GPU."""
    pool = options["memory_total_bytes"] or (options["hardware"]["pool_gib"] or 0) * GIB
    return pool if options["hardware"]["gpu"] and pool else None


def instance_findings(instance: dict[str, t.Any], options: t.Mapping[str, t.Any]) -> tuple[list[str], list[str], dict[str, t.Any] | None]:
    """The seed guards, the catalog's limits and the memory arithmetic of one well-formed instance:
    (errors, warnings, memory report or None when the class has no GPU or the model no entry)."""
    where = instance_where(instance, options)
    hardware = options["hardware"]
    mnbt = instance.get("max_num_batched_tokens")
    entry = catalog_entry(instance, options)
    errors, warnings = setting_findings(where, instance, entry, hardware, mnbt)
    speculative = speculative_config(instance.get("speculative")) or {}
    release_errors, release_warnings = speculative_release_findings(f"{where}.speculative", speculative, options["vllm_version"])
    errors, warnings = errors + release_errors, warnings + release_warnings
    if not entry:
        return errors, warnings, None
    found_errors, found_warnings = catalog_findings(where, instance, instance["catalog"], entry, options["catalog"], mnbt, options["vllm_version"],
                                                    bool(options["cluster"]))
    errors, warnings = errors + found_errors, warnings + found_warnings
    pool = arithmetic_pool(options)
    if not pool:
        return errors, warnings, None
    report, memory_errors, memory_warnings = memory_report(where, instance, entry, pool, mnbt)
    return errors + memory_errors, warnings + memory_warnings, report


def drift_reasons(plan: t.Mapping[str, t.Any], files_changed: bool, unit_state: str | None,
                  container: t.Mapping[str, t.Any] | None) -> list[str]:
    """Why the running instance differs from its plan (empty: it runs the plan). ``container`` is
    Docker's inspect data of the instance's container, None when there is none. Catches files
    written by an interrupted run, a stopped unit and a container changed or started by hand."""
    reasons = ["its settings files changed"] if files_changed else []
    if unit_state != "active":
        reasons.append(f"its unit is {unit_state or 'missing'}")
    if not container:
        return reasons + ["no container runs"]
    config = container.get("Config") or {}
    running_hash = (config.get("Labels") or {}).get(CONFIG_HASH_LABEL)
    if running_hash != plan["config_hash"]:
        reasons.append(f"its container runs config {running_hash or 'none'}, the plan is {plan['config_hash']}")
    if config.get("Image") != plan["run_image"]:
        reasons.append(f"its container runs image {config.get('Image')}, the plan is {plan['run_image']}")
    status = (container.get("State") or {}).get("Status")
    if status != "running":
        reasons.append(f"its container is {status}")
    return reasons


def key_table_markdown() -> str:
    """The README's table of instance keys, generated from the key table."""
    rows = ["| key | type | flag | meaning |", "|---|---|---|---|"]
    for key in INSTANCE_KEYS:
        kind = f"one of {', '.join(key.choices)}" if key.choices else key.kind
        kind += f" up to {key.maximum:,}" if key.maximum else ""
        required = " (required)" if key.required else ""
        rows.append(f"| `{key.name}` | {kind}{required} | {f'`{key.flag}`' if key.flag else '-'} | {key.doc} |")
    return "\n".join(rows)
