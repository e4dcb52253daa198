# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM instance spec: validation and rendering into ``vllm serve`` arguments.

Private to the collection. Pure functions over plain data; every problem is reported at
once, each naming the variable to fix. Lessons encoded here: images pinned by digest
(seed 000's floating latest tag), an API key always (seed 000's launcher would have started
an unauthenticated server), utilization fractions as shares of the whole unified pool
(seeds 000, 002, 004), and the startup errors vLLM itself raises (auto tool choice without a
parser, speculative config with num_speculative_tokens <= 0).
"""

from __future__ import annotations

import ipaddress
import json
import re
import typing as t

DIGEST_REFERENCE = re.compile(r"^(?P<repository>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?@(?P<digest>sha256:[0-9a-f]{64})$")
INSTANCE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
SPECULATIVE_METHODS = frozenset({"mtp", "ngram", "draft_model", "eagle", "eagle3", "dflash"})
API_KEY_MIN_LENGTH = 16
CONTAINER_PORT = 8000

# Structured setting -> vllm serve flag, for the settings that are passed as they are.
VALUE_FLAGS = (
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("max_model_len", "--max-model-len"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("attention_backend", "--attention-backend"),
    ("moe_backend", "--moe-backend"),
    ("quantization", "--quantization"),
    ("dtype", "--dtype"),
    ("reasoning_parser", "--reasoning-parser"),
    ("tool_call_parser", "--tool-call-parser"),
    ("num_gpu_blocks_override", "--num-gpu-blocks-override"),
    ("runner", "--runner"),
)
SWITCH_FLAGS = (
    ("enable_auto_tool_choice", "--enable-auto-tool-choice"),
    ("enforce_eager", "--enforce-eager"),
    ("trust_remote_code", "--trust-remote-code"),
)


def parse_image_reference(image: str) -> dict[str, str | None] | None:
    """Split ``repo[:tag]@sha256:<64 hex>``; None when the reference is not pinned by digest."""
    match = DIGEST_REFERENCE.match(image or "")
    return match.groupdict() if match else None


def speculative_config(speculative: t.Mapping[str, t.Any] | None) -> dict[str, t.Any] | None:
    """The --speculative-config JSON object, or None when speculative decoding is off (k=0)."""
    if not speculative or not speculative.get("num_speculative_tokens"):
        return None
    config = {"method": speculative["method"], "num_speculative_tokens": speculative["num_speculative_tokens"]}
    if speculative.get("model"):
        config["model"] = speculative["model"]
    config.update(speculative.get("options") or {})
    return config


def validate_instance(variable: str, instance: t.Mapping[str, t.Any], allow_floating_tag: bool = False) -> list[str]:
    """Problems of one instance, each prefixed with ``variable`` (for example vllm_instances[0])."""
    errors: list[str] = []
    name = instance.get("name")
    where = f"{variable} ({name})" if name else variable
    if not isinstance(name, str) or not INSTANCE_NAME.match(name):
        errors.append(f"{where}.name: {name!r} must be lower-case letters, digits and dashes (it names the unit and container)")

    image = instance.get("image", "")
    if not parse_image_reference(image) and not allow_floating_tag:
        errors.append(
            f"{where}.image: {image!r} is not pinned by digest; give repo@sha256:<64 hex> (a tag may stand before the @), "
            "or set vllm_allow_floating_tag: true to accept a tag that can move"
        )

    if not instance.get("model"):
        errors.append(f"{where}.model: missing; give the model path inside the container (for example /models/NAME)")
    names = instance.get("served_model_names")
    if not names or not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        errors.append(f"{where}.served_model_names: give a non-empty list of names clients use")

    port = instance.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        errors.append(f"{where}.port: {port!r} must be a TCP port number")

    key = instance.get("api_key")
    if not isinstance(key, str) or len(key) < API_KEY_MIN_LENGTH:
        errors.append(
            f"{where}.api_key: missing or shorter than {API_KEY_MIN_LENGTH} characters; vLLM would serve without "
            "authentication. Put a long random key in vault"
        )

    gmu = instance.get("gpu_memory_utilization")
    if not isinstance(gmu, (int, float)) or isinstance(gmu, bool) or not 0 < gmu < 1:
        errors.append(f"{where}.gpu_memory_utilization: {gmu!r} must be a fraction between 0 and 1 of the whole memory pool")

    for key_name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks_override"):
        value = instance.get(key_name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            errors.append(f"{where}.{key_name}: {value!r} must be a positive whole number, or unset")

    for address in instance.get("bind_addresses") or []:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            errors.append(f"{where}.bind_addresses: {address!r} is not an IP address")
    if not instance.get("bind_addresses"):
        errors.append(f"{where}.bind_addresses: give at least one address (127.0.0.1 keeps it on loopback)")

    if instance.get("enable_auto_tool_choice") and not instance.get("tool_call_parser"):
        errors.append(
            f"{where}.enable_auto_tool_choice is true without tool_call_parser; vLLM refuses to start. "
            "Set tool_call_parser (for example gemma4) or turn auto tool choice off"
        )

    errors += speculative_problems(where, instance.get("speculative"))

    extra = instance.get("extra_args") or []
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        errors.append(f"{where}.extra_args: must be a list of strings")
    elif any(a.split("=")[0] in ("--api-key", "--port", "--host") for a in extra):
        errors.append(f"{where}.extra_args: --api-key, --host and --port are set by the role; use api_key, bind_addresses and port")
    return errors


def speculative_problems(where: str, speculative: t.Any) -> list[str]:
    if speculative is None:
        return []
    if not isinstance(speculative, dict):
        return [f"{where}.speculative: must be a mapping with method, num_speculative_tokens and model"]
    errors = []
    tokens = speculative.get("num_speculative_tokens", 0)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        errors.append(
            f"{where}.speculative.num_speculative_tokens: {tokens!r} must be a whole number >= 0 (0 turns speculative decoding off)"
        )
        return errors
    if tokens == 0:
        return errors
    method = speculative.get("method")
    if method not in SPECULATIVE_METHODS:
        errors.append(f"{where}.speculative.method: {method!r} is not one of {', '.join(sorted(SPECULATIVE_METHODS))}")
    if method in ("mtp", "draft_model", "eagle", "eagle3", "dflash") and not speculative.get("model"):
        errors.append(f"{where}.speculative.model: method {method} needs the drafter model path")
    return errors


def validate_host(
    instances: t.Sequence[t.Mapping[str, t.Any]],
    gmu_cap: float,
    host_addresses: t.Sequence[str],
    wait_online_enabled: bool,
) -> list[str]:
    """Problems across one host's instances: the shared memory pool, ports, names, LAN binds."""
    errors: list[str] = []
    gmus = [i.get("gpu_memory_utilization") for i in instances]
    if all(isinstance(g, (int, float)) for g in gmus):
        total = round(sum(gmus), 4)
        if total > gmu_cap:
            listed = " + ".join(f"{i.get('name')} {i.get('gpu_memory_utilization')}" for i in instances)
            errors.append(
                f"vllm_instances: gpu_memory_utilization adds up to {total} ({listed}), over this hardware class's cap "
                f"of {gmu_cap} (vllm_gmu_cap); each fraction is a share of the whole unified pool. Lower them"
            )
    for field in ("name", "port"):
        values = [i.get(field) for i in instances]
        duplicates = sorted({str(v) for v in values if values.count(v) > 1})
        if duplicates:
            errors.append(f"vllm_instances: {field} {', '.join(duplicates)} used by more than one instance")
    loopback_or_any = {"127.0.0.1", "::1", "0.0.0.0", "::"}
    for instance in instances:
        lan = [a for a in instance.get("bind_addresses") or [] if a not in loopback_or_any]
        missing = [a for a in lan if a not in host_addresses]
        if missing:
            errors.append(
                f"vllm_instances ({instance.get('name')}).bind_addresses: {', '.join(missing)} is not an address of this host "
                f"(it has {', '.join(host_addresses) or 'none'}); Docker would fail with 'cannot assign requested address'"
            )
        elif lan and not wait_online_enabled:
            errors.append(
                f"vllm_instances ({instance.get('name')}).bind_addresses: {', '.join(lan)} is a LAN address, which needs "
                "the wait_online role on this host so Docker starts after the address exists (seed 000's LAN-bind race)"
            )
    return errors


def render_serve_args(instance: t.Mapping[str, t.Any]) -> list[str]:
    """Arguments after ``vllm serve`` (the image's entrypoint). The API key travels in VLLM_API_KEY."""
    args = [str(instance["model"]), "--served-model-name", *instance["served_model_names"]]
    args += ["--host", "0.0.0.0", "--port", str(CONTAINER_PORT)]
    for key, flag in VALUE_FLAGS:
        value = instance.get(key)
        if value is not None and value != "":
            args += [flag, str(value)]
    for key, flag in SWITCH_FLAGS:
        if instance.get(key):
            args.append(flag)
    spec = speculative_config(instance.get("speculative"))
    if spec:
        args += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    args += list(instance.get("extra_args") or [])
    return args


def published_ports(instance: t.Mapping[str, t.Any]) -> list[str]:
    """docker -p values: the host port on each bind address."""
    ports = []
    for address in instance["bind_addresses"]:
        host = f"[{address}]" if ":" in address else address
        ports.append(f"{host}:{instance['port']}:{CONTAINER_PORT}")
    return ports


def pull_repository(repository: str, mirror: str = "") -> str:
    """The repository to pull from: the image's own, or the same path on a registry mirror."""
    if not mirror:
        return repository
    first, _separator, rest = repository.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        repository = rest
    return f"{mirror.rstrip('/')}/{repository}"


def run_image(image: str, mirror: str = "") -> str:
    """The reference containers run: always the digest when the image is pinned."""
    parts = parse_image_reference(image)
    if not parts:
        return image
    return f"{pull_repository(parts['repository'], mirror)}@{parts['digest']}"


CACHE_MOUNTS = (
    ("huggingface", "/root/.cache/huggingface"),
    ("vllm", "/root/.cache/vllm"),
    ("flashinfer", "/root/.cache/flashinfer"),
    ("triton", "/root/.triton"),
)


def docker_run_args(
    instance: t.Mapping[str, t.Any],
    image: str,
    env_file: str,
    models_dir: str,
    cache_dir: str,
    gpus: bool,
) -> list[str]:
    """The foreground ``docker run`` a systemd unit owns for one instance."""
    args = ["/usr/bin/docker", "run", "--name", f"vllm-{instance['name']}", "--ipc=host", "--env-file", env_file]
    for publication in published_ports(instance):
        args += ["--publish", publication]
    args += ["--volume", f"{models_dir}:/models:ro"]
    for name, target in CACHE_MOUNTS:
        args += ["--volume", f"{cache_dir}/{name}:{target}"]
    args += ["--label", f"sparkfleet.vllm.instance={instance['name']}"]
    if gpus:
        args += ["--gpus", "all"]
    return args + [image, *render_serve_args(instance)]
