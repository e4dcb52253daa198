# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Image references and the speculative config of a vLLM instance.

Private to the collection. Images are pinned by digest (seed 000's floating latest tag) and
containers always run the digest; speculative decoding with num_speculative_tokens 0 means
no speculative config at all (vLLM refuses k <= 0).
"""

from __future__ import annotations

import re
import typing as t

DIGEST_REFERENCE = re.compile(r"(?P<repository>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?@(?P<digest>sha256:[0-9a-f]{64})")
# The shape of an instance's plan file (/etc/sparkfleet/vllm/NAME.json): raised when a reader could misread an older one.
PLAN_SCHEMA_VERSION = 1
CONTAINER_PORT = 8000


def unit_names(name: str, cluster: bool) -> tuple[str, str]:
    """(systemd unit, container) of an instance or of a cluster's rank on a node."""
    return f"sparkfleet-{'cluster' if cluster else 'vllm'}-{name}.service", f"vllm-{'cluster-' if cluster else ''}{name}"


def parse_image_reference(image: str) -> dict[str, str | None] | None:
    """Split ``repo[:tag]@sha256:<64 hex>``; None when the reference is not pinned by digest."""
    match = DIGEST_REFERENCE.fullmatch(image or "")
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


def pull_reference(image: str, mirror: str = "") -> dict[str, t.Any]:
    """What to pull and what must arrive: by tag when the pin names one (so a moved tag is caught),
    else by digest; ``digest`` is None for an unpinned image."""
    parts = parse_image_reference(image)
    if not parts:
        repository, _sep, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
        return {"image": image, "repository": repository or image, "tag": tag or None, "digest": None, "run": image}
    repository = pull_repository(parts["repository"], mirror)
    return {"image": image, "repository": repository, "tag": parts["tag"], "digest": parts["digest"],
            "run": f"{repository}@{parts['digest']}"}
