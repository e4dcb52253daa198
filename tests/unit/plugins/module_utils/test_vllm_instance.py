import json

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import (
    parse_image_reference,
    published_ports,
    render_serve_args,
    validate_host,
    validate_instance,
)

DIGEST = "sha256:" + "ab" * 32


def instance(**overrides):
    spec = dict(
        name="llm",
        image=f"registry.local:5000/vllm-cpu:0.32.0@{DIGEST}",
        model="/models/tiny-llama",
        served_model_names=["tiny"],
        port=8001,
        bind_addresses=["127.0.0.1"],
        api_key="k" * 32,
        gpu_memory_utilization=0.5,
    )
    spec.update(overrides)
    return spec


def problems(**overrides):
    return validate_instance("vllm_instances[0]", instance(**overrides))


def test_a_good_instance_has_no_problems():
    assert problems() == []


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        (f"vllm/vllm-openai@{DIGEST}", True),
        (f"vllm/vllm-openai:v0.33.0@{DIGEST}", True),
        (f"172.17.0.1:5000/sparkfleet/vllm-cpu:0.32.0@{DIGEST}", True),
        ("vllm/vllm-openai:latest", False),
        ("vllm/vllm-openai:v0.33.0", False),
        ("vllm/vllm-openai@sha256:abc", False),
    ],
)
def test_image_must_be_pinned_by_digest(image, pinned):
    assert (parse_image_reference(image) is not None) is pinned
    assert (problems(image=image) == []) is pinned


def test_floating_tag_needs_the_explicit_opt_out():
    assert validate_instance("vllm_instances[0]", instance(image="vllm/vllm-openai:latest"), allow_floating_tag=True) == []
    assert "vllm_allow_floating_tag" in problems(image="vllm/vllm-openai:latest")[0]


@pytest.mark.parametrize("key", ["", None, "short"])
def test_api_key_required_and_long(key):
    errors = problems(api_key=key)
    assert len(errors) == 1 and "api_key" in errors[0] and "authentication" in errors[0]


def test_auto_tool_choice_without_parser_is_refused():
    errors = problems(enable_auto_tool_choice=True)
    assert errors and "tool_call_parser" in errors[0]
    assert problems(enable_auto_tool_choice=True, tool_call_parser="gemma4") == []


def test_negative_speculative_tokens_refused_and_zero_means_off():
    assert "num_speculative_tokens" in problems(speculative={"method": "ngram", "num_speculative_tokens": -1})[0]
    assert problems(speculative={"method": "mtp", "num_speculative_tokens": 0}) == []
    assert "--speculative-config" not in render_serve_args(instance(speculative={"method": "mtp", "num_speculative_tokens": 0}))


def test_mtp_needs_a_drafter():
    assert "speculative.model" in problems(speculative={"method": "mtp", "num_speculative_tokens": 4})[0]


def test_render_arguments():
    args = render_serve_args(
        instance(
            max_model_len=2048,
            enforce_eager=True,
            dtype="float32",
            speculative={"method": "ngram", "num_speculative_tokens": 3, "options": {"prompt_lookup_max": 3}},
            extra_args=["--seed", "0"],
        )
    )
    assert args[:8] == ["/models/tiny-llama", "--served-model-name", "tiny", "--host", "0.0.0.0", "--port", "8000", "--gpu-memory-utilization"]
    assert "--enforce-eager" in args and args[args.index("--dtype") + 1] == "float32"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    assert args[-2:] == ["--seed", "0"]
    assert not any("k" * 32 in a for a in args), "the API key never appears in the arguments"


def test_extra_args_cannot_override_what_the_role_sets():
    assert "extra_args" in problems(extra_args=["--api-key=x"])[0]


def test_gmu_sum_over_the_cap_is_refused_with_the_numbers():
    errors = validate_host([instance(name="emb", port=8002, gpu_memory_utilization=0.12), instance()], 0.6, ["127.0.0.1"], False)
    assert len(errors) == 1
    assert "0.62" in errors[0] and "emb 0.12 + llm 0.5" in errors[0] and "0.6" in errors[0]


def test_lan_address_must_exist_and_needs_wait_online():
    lan = instance(bind_addresses=["127.0.0.1", "192.0.2.10"])
    assert "is not an address of this host" in validate_host([lan], 0.9, ["127.0.0.1", "10.0.0.5"], True)[0]
    assert "wait_online" in validate_host([lan], 0.9, ["127.0.0.1", "192.0.2.10"], False)[0]
    assert validate_host([lan], 0.9, ["127.0.0.1", "192.0.2.10"], True) == []


def test_duplicate_ports_refused():
    errors = validate_host([instance(), instance(name="other")], 2, ["127.0.0.1"], False)
    assert any("port 8001" in e for e in errors)


def test_published_ports():
    assert published_ports(instance(bind_addresses=["127.0.0.1", "::1"])) == ["127.0.0.1:8001:8000", "[::1]:8001:8000"]


def test_mirror_moves_the_repository_and_keeps_the_digest():
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import pull_repository, run_image

    assert pull_repository("vllm/vllm-openai") == "vllm/vllm-openai"
    assert pull_repository("vllm/vllm-openai", "mirror.lan:5000") == "mirror.lan:5000/vllm/vllm-openai"
    assert pull_repository("127.0.0.1:5000/sparkfleet/vllm-cpu", "172.17.0.1:5000") == "172.17.0.1:5000/sparkfleet/vllm-cpu"
    assert run_image(f"vllm/vllm-openai:v0.33.0@{DIGEST}", "mirror.lan:5000") == f"mirror.lan:5000/vllm/vllm-openai@{DIGEST}"
    assert run_image("vllm/vllm-openai:latest") == "vllm/vllm-openai:latest"


def test_docker_run_owns_the_container_without_the_key():
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import docker_run_args

    args = docker_run_args(instance(), f"repo@{DIGEST}", "/etc/sparkfleet/vllm/llm.env", "/srv/models", "/var/cache/sv", gpus=True)
    assert args[:8] == ["/usr/bin/docker", "run", "--name", "vllm-llm", "--ipc=host", "--env-file", "/etc/sparkfleet/vllm/llm.env", "--publish"]
    assert "/srv/models:/models:ro" in args and "/var/cache/sv/vllm:/root/.cache/vllm" in args
    assert args[args.index("--gpus") + 1] == "all"
    assert args[args.index(f"repo@{DIGEST}") + 1] == "/models/tiny-llama"
    assert "k" * 32 not in " ".join(args)
    assert "--gpus" not in docker_run_args(instance(), "img", "/e", "/m", "/c", gpus=False)
