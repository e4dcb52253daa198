# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kinds of vLLM image and how each starts the server: private to the collection, standard library only (the host
runtime's readers check a plan's memory probe against its kind)."""

from __future__ import annotations

import typing as t

# How each kind of vLLM image starts the server: the entrypoint the image declares and what the container's command
# puts before vllm serve's arguments. An entrypoint the image needs is never replaced (the Ray ranks of a kind whose
# entrypoint runs the command hand theirs to it instead of overriding it).
IMAGE_KINDS: dict[str, dict[str, t.Any]] = {
    "vllm-openai": {
        "entrypoint": ["vllm", "serve"], "serve_command": [], "keeps_entrypoint": False,
        "source": "vLLM's own images (vllm/vllm-openai, and the lab's CPU build): ENTRYPOINT [\"vllm\", \"serve\"]",
    },
    "ngc": {
        "entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"], "serve_command": ["vllm", "serve"], "keeps_entrypoint": True,
        "source": "NVIDIA's NGC vLLM images (nvcr.io/nvidia/vllm): their entrypoint enables CUDA forward compatibility, then "
        "runs the command (seed 003: docker run nvcr.io/nvidia/vllm:TAG vllm serve MODEL); replacing it made FlashInfer's JIT "
        "fail with cudaErrorUnsupportedPtxVersion on a Spark",
    },
}


def keeps_entrypoint(plan: t.Mapping[str, t.Any]) -> bool:
    """Whether a plan's image must run its own entrypoint (a plan written before image kinds had none: vllm-openai)."""
    return bool(IMAGE_KINDS.get(str(plan.get("image_kind") or "vllm-openai"), {}).get("keeps_entrypoint"))
