"""Images planted in the lab registry for the refusals that read a pulled image: each built FROM one of the lab's own
images with one change (a package's dist-info folder renamed to another release, another entrypoint), pushed, and
pinned by the digest the registry gave, as the lab hosts pull it. Only metadata changes, so each push is one small
layer; the images stay in the registry for the next run, which rebuilds them from the cache."""

import json
import os
import subprocess

DOCKER = "/usr/bin/docker"
# The lab's images as this machine's dockerd holds them (scripts/lib/common.sh pushes them from 127.0.0.1:5000).
LOCAL_REGISTRY = "127.0.0.1:5000"
VLLM_PACKAGES = "/opt/vllm/lib/python3.11/site-packages"
LITELLM_PACKAGES = "/opt/litellm/lib/python3.11/site-packages"


def local(pinned):
    """The local tag of a lab image pinned as the lab hosts pull it (registry:5000/repo:tag@sha256:...)."""
    reference = pinned.split("@", 1)[0]
    return LOCAL_REGISTRY + reference[reference.index("/"):]


def plant(name, base, *lines):
    """The image built FROM ``base`` (a pinned lab image) with ``lines`` of a Dockerfile after it, pushed to the lab
    registry; returns it pinned as the lab hosts pull it."""
    tag = f"{LOCAL_REGISTRY}/sparkfleet/planted-{name}:lab"
    dockerfile = "\n".join([f"FROM {local(base)}", *lines]) + "\n"
    for argv, given in (([DOCKER, "build", "--quiet", "--tag", tag, "-"], dockerfile), ([DOCKER, "push", "--quiet", tag], None)):
        done = subprocess.run(argv, input=given, text=True, capture_output=True, check=False)
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}"
    digests = subprocess.run([DOCKER, "image", "inspect", "--format", "{{range .RepoDigests}}{{println .}}{{end}}", tag],
                             capture_output=True, text=True, check=True).stdout.split()
    digest = next(line.split("@", 1)[1] for line in digests if line.startswith(f"{LOCAL_REGISTRY}/sparkfleet/planted-{name}@"))
    return f"{os.environ['SPARKFLEET_REGISTRY']}/sparkfleet/planted-{name}:lab@{digest}"


def vllm_release(name, release):
    """The lab's vLLM image claiming another release in its package metadata (the folder image_release reads)."""
    return plant(name, os.environ["SPARKFLEET_VLLM_IMAGE"],
                 f"RUN mv {VLLM_PACKAGES}/vllm-0.32.0+cpu.dist-info {VLLM_PACKAGES}/vllm-{release}.dist-info")


def litellm_release(name, release):
    """The lab's LiteLLM image claiming another release in its package metadata."""
    return plant(name, os.environ["SPARKFLEET_LITELLM_IMAGE"],
                 f"RUN mv {LITELLM_PACKAGES}/litellm-*.dist-info {LITELLM_PACKAGES}/litellm-{release}.dist-info")


def vllm_entrypoint(name, entrypoint):
    """The lab's vLLM image with another entrypoint."""
    return plant(name, os.environ["SPARKFLEET_VLLM_IMAGE"], f"ENTRYPOINT {json.dumps(entrypoint)}")
