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

from ansible_collections.sparkfleet.vllm.plugins.module_utils._image_kinds import IMAGE_KINDS
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import STATE_DIR as WATCHDOG_STATE_DIR
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import person_needed_path

DIGEST_REFERENCE = re.compile(r"(?P<repository>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?@(?P<digest>sha256:[0-9a-f]{64})")
CONTAINER_PORT = 8000


UNIT_FOLDER = "/etc/systemd/system"
# The label on every container of the collection's instances and ranks.
INSTANCE_LABEL = "sparkfleet.vllm.instance"
# An instance's or a rank's name as the plan allows it (lower-case letters, digits and dashes).
UNIT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def unit_names(name: str, cluster: bool) -> tuple[str, str]:
    """(systemd unit, container) of an instance or of a cluster's rank on a node."""
    return f"sparkfleet-{'cluster' if cluster else 'vllm'}-{name}.service", f"vllm-{'cluster-' if cluster else ''}{name}"


def settings_paths(config_dir: str, name: str) -> tuple[str, str]:
    """(env file, plan file) of an instance or a rank, in its role's configuration folder."""
    return f"{config_dir}/{name}.env", f"{config_dir}/{name}.json"


def instance_files(config_dir: str, name: str, cluster: bool) -> dict[str, t.Any]:
    """Where an instance's or a rank's files live: its env file (the API key, 0600), its plan and its
    unit, each with a last good copy. The plan carries these paths; an instance no longer planned
    is found from its name (deployed_instances)."""
    unit, container = unit_names(name, cluster)
    last_good = f"{config_dir}/last-good"
    env_path, plan_path = settings_paths(config_dir, name)
    kept = [(env_path, "0600"), (plan_path, "0644"), (f"{UNIT_FOLDER}/{unit}", "0644")]
    return {
        "unit": unit, "container": container,
        "env_path": env_path, "plan_path": plan_path, "unit_path": kept[2][0], "last_good_dir": last_good,
        "watchdog_give_up": person_needed_path(WATCHDOG_STATE_DIR, unit),
        "kept_files": [{"path": path, "last_good": f"{last_good}/{path.rsplit('/', 1)[1]}", "mode": mode} for path, mode in kept],
    }


def unjudged_mark(last_good_dir: str, name: str) -> str:
    """Where a unit relaunched with its last good settings held (a rollout's) is marked until they are judged: beside its
    last good copies, in the root-only configuration folder, on the host itself."""
    return f"{last_good_dir.rstrip('/')}/{name}.unjudged.json"


def removal(config_dir: str, name: str, cluster: bool) -> dict[str, t.Any]:
    """What removing an instance or a rank no longer planned stops and deletes: its unit, its
    container, its files, their last good copies and an unjudged mark a stopped rollout left."""
    files = instance_files(config_dir, name, cluster)
    return {"name": name, "unit": files["unit"], "container": files["container"],
            "files": [kept["path"] for kept in files["kept_files"]] + [kept["last_good"] for kept in files["kept_files"]]
            + [unjudged_mark(files["last_good_dir"], name)]}


def deployed_instances(paths: t.Iterable[str], config_dir: str) -> list[str]:
    """The names of the single instances deployed on a host, from the paths of its units
    (UNIT_FOLDER/sparkfleet-vllm-NAME.service) and plan files (config_dir/NAME.json); a file
    whose name is no instance name is none of ours."""
    names = set()
    for path in paths:
        folder, file_name = path.rsplit("/", 1) if "/" in path else ("", path)
        if folder == UNIT_FOLDER and file_name.startswith("sparkfleet-vllm-") and file_name.endswith(".service"):
            name = file_name.removeprefix("sparkfleet-vllm-").removesuffix(".service")
        elif folder == config_dir.rstrip("/") and file_name.endswith(".json"):
            name = file_name.removesuffix(".json")
        else:
            continue
        if UNIT_NAME.fullmatch(name):
            names.add(name)
    return sorted(names)


def parse_image_reference(image: str) -> dict[str, str | None] | None:
    """Split ``repo[:tag]@sha256:<64 hex>``; None when the reference is not pinned by digest."""
    match = DIGEST_REFERENCE.fullmatch(image or "")
    return match.groupdict() if match else None


# The repositories whose kind is known without the inventory saying so; any other is vllm-openai unless
# vllm_image_kinds maps it.
KNOWN_REPOSITORIES = {"nvcr.io/nvidia/vllm": "ngc"}


def image_kind(image: str, kinds: t.Mapping[str, str]) -> str:
    """The kind of a pinned image: the inventory's mapping of its repository, else the known repositories', else
    vllm-openai."""
    reference = parse_image_reference(image) or {}
    repository = reference.get("repository") or ""
    return kinds.get(repository) or KNOWN_REPOSITORIES.get(repository) or "vllm-openai"


def entrypoint_problem(image: str, kind: str, entrypoint: t.Any) -> str | None:
    """Why the entrypoint a pulled image declares cannot start the plan's command for its kind; None when it can."""
    expected = IMAGE_KINDS[kind]["entrypoint"]
    declared = list(entrypoint) if isinstance(entrypoint, list) else []
    if declared == expected:
        return None
    other = next((name for name, known in IMAGE_KINDS.items() if known["entrypoint"] == declared), None)
    shown = declared or "none"
    if other:
        fix = f"map its repository to {other} in vllm_image_kinds"
    else:
        known = ", ".join(f"{name}: {kind_of['entrypoint']}" for name, kind_of in IMAGE_KINDS.items())
        fix = f"pin an image whose entrypoint is {expected}, or one of the known kinds ({known})"
    return (f"{image} declares the entrypoint {shown}, not the {kind} kind's {expected}: the serve arguments would reach "
            f"{shown} instead of vllm serve and the engine would not start; {fix}")


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
