# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Weights staged like images: pinned revisions, manifests, and the checks before a launch uses them.

Private to the collection. Pure functions over plain data. Lessons encoded here: a revision
is a commit hash (a branch moves like a floating tag); a staged copy carries a manifest
(revision, files, sizes, sha256 of each file and of the safetensors index) so a re-run
verifies it cheaply and notices damage; seed 000 checked that the quantized checkpoint's
base model was the instruction-tuned one, because an MTP drafter made the base model 38%
slower; a max_model_len beyond the model's own maximum is refused before vLLM refuses it.
"""

from __future__ import annotations

import json
import os
import re
import typing as t

COMMIT = re.compile(r"[0-9a-f]{40}")
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
DIRECTORY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MANIFEST = ".sparkfleet-manifest.json"
PARTIAL_PREFIX = ".partial-"
# A size as huggingface_hub's CLI prints it in a dry run (_format_size): one decimal, units of 1000, no B.
HF_SIZE_UNITS = ("", "K", "M", "G", "T", "P", "E", "Z")
HF_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTPEZ]?)")
INDEX_FILES = ("model.safetensors.index.json",)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
# Names of instruction-tuned checkpoints: Gemma's -it, Llama's and Qwen's Instruct, chat models.
INSTRUCTION_TUNED = re.compile(r"(?i)(?:^|[-_/.])(?:it|instruct|chat)(?:$|[-_/.])|instruct")
MAX_LENGTH_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions", "max_seq_len")
DRAFTER_METHODS = ("mtp",)


def read_text(path: str) -> str | None:
    """A file's text; None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def read_json(path: str) -> t.Any:
    """A JSON file's value; None when it is missing or not JSON."""
    text = read_text(path)
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return None


def default_name(repo: str) -> str:
    return repo.rsplit("/", 1)[-1]


def model_folder(model: t.Mapping[str, t.Any]) -> str:
    """The folder under the models directory a vllm_models entry is staged in: its name, or its repo's."""
    return model.get("name") or default_name(model["repo"])


def validate_models(variable: str, models: t.Any, allow_branch: bool = False) -> list[str]:
    """Problems of a vllm_models list, each naming the entry and the key to fix."""
    if not isinstance(models, list):
        return [f"{variable}: must be a list of models, each with repo and revision"]
    errors: list[str] = []
    names: list[str] = []
    for index, model in enumerate(models):
        where = f"{variable}[{index}]"
        if not isinstance(model, dict):
            errors.append(f"{where}: must be a mapping with repo, revision and optionally name and include")
            continue
        repo = model.get("repo")
        where = f"{where} ({repo})" if isinstance(repo, str) else where
        if not isinstance(repo, str) or not REPO_ID.fullmatch(repo):
            errors.append(f"{where}.repo: {repo!r} must be a Hugging Face repo id, owner/name")
        revision = model.get("revision")
        if not isinstance(revision, str) or not revision:
            errors.append(f"{where}.revision: missing; pin the commit hash (40 hex digits) shown on the model's Files page")
        elif not COMMIT.fullmatch(revision) and not (allow_branch or model.get("allow_branch")):
            errors.append(
                f"{where}.revision: {revision!r} is not a commit hash; a branch or tag can move under you like a floating "
                "image tag. Pin the 40-hex commit, or set allow_branch: true on the entry (or vllm_models_allow_branch)"
            )
        name = model.get("name", default_name(repo) if isinstance(repo, str) else None)
        if not isinstance(name, str) or not DIRECTORY_NAME.fullmatch(name):
            errors.append(f"{where}.name: {name!r} must be a plain directory name under vllm_models_dir")
        else:
            names.append(name)
        include = model.get("include", [])
        if not isinstance(include, list) or not all(isinstance(p, str) and p for p in include):
            errors.append(f"{where}.include: must be a list of glob patterns (for example '*.safetensors')")
        tuned = model.get("instruction_tuned")
        if tuned is not None and not isinstance(tuned, bool):
            errors.append(f"{where}.instruction_tuned: {tuned!r} must be true, false or unset (then guessed from the names)")
        unknown = sorted(set(model) - {"repo", "revision", "name", "include", "allow_branch", "instruction_tuned"})
        if unknown:
            errors.append(f"{where}: unknown keys {', '.join(unknown)}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        errors.append(f"{variable}: name {', '.join(duplicates)} used by more than one model (each is a directory)")
    return errors


def hf_download_args(repo: str, revision: str, local_dir: str, include: t.Sequence[str], dry_run: bool = False) -> list[str]:
    """Arguments after ``hf``. The token travels in HF_TOKEN, never in argv."""
    args = ["download", repo, "--revision", revision]
    for pattern in include:
        args += ["--include", pattern]
    if dry_run:
        return args + ["--dry-run", "--format", "json"]
    return args + ["--local-dir", local_dir]


def listing_entries(output: str) -> list[dict[str, t.Any]]:
    """The entries ``hf download --dry-run --format json`` lists (each with its file, and its size where the CLI gives
    one); ValueError saying what came instead.

    The JSON array may follow warning or progress lines, some with brackets of their own, so it
    is sought at every ``[`` rather than at the first.
    """
    decoder = json.JSONDecoder()
    text = output or ""
    empty = False
    for start in [index for index, character in enumerate(text) if character == "["]:
        try:
            value, _end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        empty = empty or value == []
        if isinstance(value, list) and value and all(isinstance(e, dict) and isinstance(e.get("file"), str) and e["file"] for e in value):
            return value
    if empty:
        raise ValueError("the hub lists no file for it; check the include patterns and the revision")
    raise ValueError(f"hf download --dry-run printed no JSON list of files but {text.strip()[-200:]!r}; give an image "
                     "whose hf CLI has download --dry-run --format json")


def parse_listing(output: str) -> list[str]:
    """The files ``hf download --dry-run --format json`` lists; ValueError saying what came instead."""
    return [entry["file"] for entry in listing_entries(output)]


def listing_bytes(output: str) -> int | None:
    """The bytes the listed files will take, from the sizes the CLI prints (huggingface_hub's units of 1000 with one
    decimal: "4.9G"; "-" for a file it will not download); None when any size is missing or unreadable."""
    total = 0.0
    for entry in listing_entries(output):
        size = entry.get("size")
        found = HF_SIZE.fullmatch(size.strip()) if isinstance(size, str) else None
        if size == "-":
            continue
        if not found:
            return None
        total += float(found[1]) * 1000 ** HF_SIZE_UNITS.index(found[2])
    return round(total)


def is_weights(path: str) -> bool:
    return path.endswith(WEIGHT_SUFFIXES)


def listing_problems(expected: t.Iterable[str], present: t.Mapping[str, int]) -> list[str]:
    """Files the hub listed that did not arrive."""
    return sorted(set(expected) - set(present))


def manifest(
    repo: str,
    revision: str,
    files: t.Mapping[str, dict[str, t.Any]],
    facts: t.Mapping[str, t.Any],
) -> dict[str, t.Any]:
    """What a staged copy holds; files maps a relative path to its size and sha256."""
    index = next((files[name]["sha256"] for name in INDEX_FILES if name in files), None)
    return {
        "repo": repo,
        "revision": revision,
        "files": {path: dict(files[path]) for path in sorted(files)},
        "safetensors_index_sha256": index,
        "base_model": facts.get("base_model"),
        "quantization": facts.get("quantization"),
        "max_position_embeddings": facts.get("max_position_embeddings"),
    }


def verify(recorded: t.Mapping[str, t.Any], present: t.Mapping[str, dict[str, t.Any]], full: bool) -> list[str]:
    """Damage of a staged copy: missing files, other sizes, a changed index, and with ``full`` any changed content.

    ``present`` maps each file now on disk to its size, and its sha256 where it was computed
    (always for the index; for every file when ``full``).
    """
    files = recorded.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("size"), int) and not isinstance(e["size"], bool) for e in files.values()
    ):
        return [f"{MANIFEST} is damaged (its files are not a mapping of path to size and sha256)"]
    problems = []
    for path, expected in files.items():
        found = present.get(path)
        if found is None:
            problems.append(f"{path} is missing")
        elif found["size"] != expected["size"]:
            problems.append(f"{path} has {found['size']} bytes, the manifest {expected['size']}")
        elif (full or path in INDEX_FILES) and found.get("sha256") and found["sha256"] != expected.get("sha256"):
            problems.append(f"{path} differs from the manifest (sha256)")
    return problems


def front_matter_base_model(readme: str | None) -> list[str]:
    """``base_model`` from a model card's YAML front matter (a string or a list)."""
    if not readme or not readme.startswith("---"):
        return []
    block = readme[3:].split("\n---", 1)[0]
    values: list[str] = []
    lines = block.splitlines()
    for index, line in enumerate(lines):
        match = re.match(r"^base_model\s*:\s*(.*)$", line)
        if not match:
            continue
        inline = match.group(1).strip().strip("'\"")
        if inline.startswith("["):
            values += [v.strip().strip("'\"") for v in inline.strip("[]").split(",") if v.strip()]
        elif inline:
            values.append(inline)
        else:
            for item in lines[index + 1:]:
                listed = re.match(r"^\s*-\s*(.+)$", item)
                if not listed:
                    break
                values.append(listed.group(1).strip().strip("'\""))
    return values


def model_facts(config: t.Mapping[str, t.Any], readme: str | None, repo: str | None = None) -> dict[str, t.Any]:
    """What a checkpoint declares: base model, quantization, maximum length, instruction tuning.

    A config.json that is no JSON object declares nothing: its facts are those of an empty one.
    """
    config = config if isinstance(config, t.Mapping) else {}
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    maximum = next((source[key] for source in (config, text_config) for key in MAX_LENGTH_KEYS if isinstance(source.get(key), int)), None)
    quantization = config.get("quantization_config") if isinstance(config.get("quantization_config"), dict) else None
    bases = front_matter_base_model(readme)
    base = bases[0] if bases else None
    named = base or repo or config.get("_name_or_path")
    return {
        "architectures": config.get("architectures") or [],
        "quantization": (quantization or {}).get("quant_method"),
        "base_model": base,
        "max_position_embeddings": maximum,
        "instruction_tuned": bool(named and INSTRUCTION_TUNED.search(str(named))) if named else None,
        "judged_by": named,
    }


def launch_problems(
    where: str,
    files: t.Iterable[str],
    facts: t.Mapping[str, t.Any] | None,
    instance: t.Mapping[str, t.Any],
    instruction_tuned_override: bool | None = None,
) -> list[str]:
    """Why an instance must not launch on these weights."""
    names = list(files)
    errors = []
    if "config.json" not in names:
        errors.append(f"{where}.model: no config.json in the model directory; is the model staged (vllm_models)?")
    if not any(is_weights(name) for name in names):
        errors.append(f"{where}.model: no weights (*.safetensors, *.bin) in the model directory")
    if facts is None:
        return errors
    maximum = facts.get("max_position_embeddings")
    wanted = instance.get("max_model_len")
    if isinstance(maximum, int) and isinstance(wanted, int) and wanted > maximum:
        errors.append(
            f"{where}.max_model_len: {wanted} is more than the model's own maximum of {maximum} "
            "(max_position_embeddings); lower it"
        )
    speculative = instance.get("speculative") or {}
    method = speculative.get("method") if speculative.get("num_speculative_tokens") else None
    tuned = facts.get("instruction_tuned") if instruction_tuned_override is None else instruction_tuned_override
    if method in DRAFTER_METHODS and tuned is False and not instance.get("allow_drafter_on_base_model"):
        errors.append(
            f"{where}.speculative: an {method} drafter on {facts.get('judged_by')}, which is not an instruction-tuned model "
            "(seed 000: the drafter made a base model 38% slower). Serve the -it/Instruct checkpoint, set "
            "instruction_tuned: true on its vllm_models entry if the name misleads, or allow_drafter_on_base_model: true"
        )
    return errors


def host_path(model: str, models_dir: str) -> str | None:
    """The host directory of a model path the container sees under /models; None when it is elsewhere."""
    if model == "/models" or model.startswith("/models/"):
        return os.path.join(models_dir, model[len("/models/"):]) if model != "/models" else models_dir
    return None
