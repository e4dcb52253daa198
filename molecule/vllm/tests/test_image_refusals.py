"""Refusals read from a pulled image, on images planted in the lab registry (molecule/shared/planted_images.py): a vLLM
release below the security floor is refused at its pull, and an entrypoint that would swallow the serve arguments and a
speculative key the image's release dropped are refused together after it; each names the image and the fix, and no
unit, container or file of the serving host changes."""

import json

import pytest
from planted_images import vllm_entrypoint, vllm_release
from serving_lab import KEY, SERVE, instances_json, serving_state
from site_runner import assert_refused, docker_host, site


@pytest.fixture(scope="module")
def serve():
    return docker_host(SERVE)


def with_images(first=None, second=None, second_options=None):
    """The lab's two instances, each on the image given (the lab's own otherwise)."""
    settings = json.loads(instances_json())
    for instance, image in zip(settings["vllm_instances"], (first, second), strict=True):
        if image:
            instance["image"] = image
    if second_options:
        settings["vllm_instances"][1]["speculative"]["options"].update(second_options)
    return json.dumps(settings)


def test_a_vllm_below_the_security_floor_is_refused_at_its_pull(serve):
    image = vllm_release("vllm-0.23", "0.23.0")
    before = serving_state(serve)
    result = site("--tags", "vllm", "-e", with_images(second=image), limit=SERVE)
    assert_refused(result, "carries vLLM 0.23.0, below the floor of vLLM 0.24.0: CVE-2026-48710",
                   "accept each advisory by its id in vllm_accepted_advisories: [CVE-2026-48710, vllm-0.24.0-dos]")
    assert serving_state(serve) == before


def test_an_entrypoint_that_swallows_the_arguments_and_a_dropped_speculative_key_are_refused_together(serve):
    shell = vllm_entrypoint("vllm-shell-entrypoint", ["/bin/sh"])
    release_034 = vllm_release("vllm-0.34", "0.34.0")
    before = serving_state(serve)
    result = site("--tags", "vllm", "-e", with_images(first=shell, second=release_034, second_options={"disable_padded_drafter_batch": True}),
                  limit=SERVE)
    assert_refused(result, f"vllm on {SERVE}, no unit changed: instance first: ",
                   "declares the entrypoint ['/bin/sh'], not the vllm-openai kind's ['vllm', 'serve']",
                   "instance second.speculative.options.disable_padded_drafter_batch: vLLM 0.34.0 no longer accepts it (removed in 0.34.0")
    assert serving_state(serve) == before
    assert KEY not in result.stdout + result.stderr
