"""Model staging logic: pinned revisions, manifests and damage, what a checkpoint declares, launch checks."""

import re

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import (
    front_matter_base_model,
    hf_download_args,
    host_path,
    launch_problems,
    listing_bytes,
    listing_problems,
    manifest,
    model_facts,
    parse_listing,
    validate_models,
    verify,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
GOOD = {"repo": "nvidia/Gemma-4-26B-A4B-it-NVFP4", "revision": COMMIT}


def test_a_pinned_model_is_valid():
    assert validate_models("vllm_models", [GOOD, {"repo": "google/drafter", "revision": COMMIT, "name": "d", "include": ["*.json"]}]) == []


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"repo": "nvidia/x", "revision": "main"}, "vllm_models[0] (nvidia/x).revision: 'main' is not a commit hash"),
        ({"repo": "nvidia/x"}, "revision: missing; pin the commit hash"),
        ({"repo": "no-owner", "revision": COMMIT}, ".repo: 'no-owner' must be a Hugging Face repo id"),
        ({"repo": "a/b", "revision": COMMIT, "name": "../escape"}, ".name: '../escape' must be a plain directory name"),
        ({"repo": "a/b", "revision": COMMIT, "include": "*.json"}, ".include: must be a list of glob patterns"),
        ({"repo": "a/b", "revision": COMMIT, "instruction_tuned": "yes"}, ".instruction_tuned: 'yes' must be true, false or unset"),
        ({"repo": "a/b", "revision": COMMIT, "sha": "x"}, "unknown keys sha"),
        # A trailing newline would reach the hf command line and the staging folder's name.
        ({"repo": "a/b\n", "revision": COMMIT}, ".repo: 'a/b\\n' must be a Hugging Face repo id"),
        ({"repo": "a/b", "revision": COMMIT + "\n"}, "is not a commit hash"),
        ({"repo": "a/b", "revision": COMMIT, "name": "b\n"}, ".name: 'b\\n' must be a plain directory name"),
    ],
)
def test_bad_entries_name_the_key(entry, fragment):
    assert any(fragment in problem for problem in validate_models("vllm_models", [entry]))


def test_branch_accepted_only_with_the_opt_out():
    branch = {"repo": "a/b", "revision": "main"}
    assert validate_models("vllm_models", [branch], allow_branch=True) == []
    assert validate_models("vllm_models", [dict(branch, allow_branch=True)]) == []


def test_two_models_in_one_directory_refused():
    problems = validate_models("vllm_models", [GOOD, dict(GOOD, repo="other/Gemma-4-26B-A4B-it-NVFP4")])
    assert problems == ["vllm_models: name Gemma-4-26B-A4B-it-NVFP4 used by more than one model (each is a directory)"]


def test_download_args_never_carry_the_token():
    args = hf_download_args("a/b", COMMIT, "/stage/.partial-b", ["*.json", "*.safetensors"])
    assert args == ["download", "a/b", "--revision", COMMIT, "--include", "*.json", "--include", "*.safetensors",
                    "--local-dir", "/stage/.partial-b"]
    assert hf_download_args("a/b", COMMIT, "", [], dry_run=True)[-3:] == ["--dry-run", "--format", "json"]


FILES = {
    "config.json": {"size": 10, "sha256": "c"},
    "model.safetensors.index.json": {"size": 20, "sha256": "i"},
    "model-00001-of-00002.safetensors": {"size": 100, "sha256": "a"},
    "model-00002-of-00002.safetensors": {"size": 50, "sha256": "b"},
}


def test_manifest_records_revision_files_and_index():
    recorded = manifest("a/b", COMMIT, FILES, {"base_model": "google/gemma", "quantization": "modelopt", "max_position_embeddings": 262144})
    assert recorded["revision"] == COMMIT and recorded["safetensors_index_sha256"] == "i"
    assert list(recorded["files"]) == sorted(FILES)
    assert recorded["base_model"] == "google/gemma"


def test_an_intact_copy_verifies_quickly():
    recorded = manifest("a/b", COMMIT, FILES, {})
    quick = {path: {"size": entry["size"]} for path, entry in FILES.items()}
    quick["model.safetensors.index.json"]["sha256"] = "i"
    assert verify(recorded, quick, full=False) == []


def test_damage_is_named():
    recorded = manifest("a/b", COMMIT, FILES, {})
    present = {path: dict(entry) for path, entry in FILES.items()}
    del present["model-00002-of-00002.safetensors"]
    present["config.json"]["size"] = 9
    present["model.safetensors.index.json"]["sha256"] = "changed"
    present["model-00001-of-00002.safetensors"]["sha256"] = "flipped"
    assert verify(recorded, present, full=False) == [
        "config.json has 9 bytes, the manifest 10",
        "model-00002-of-00002.safetensors is missing",
        "model.safetensors.index.json differs from the manifest (sha256)",
    ]
    assert "model-00001-of-00002.safetensors differs from the manifest (sha256)" in verify(recorded, present, full=True)


def test_missing_files_of_a_listing():
    assert listing_problems(["config.json", "model.safetensors"], {"config.json": {"size": 1}}) == ["model.safetensors"]


def test_base_model_from_the_model_card():
    assert front_matter_base_model("---\nlicense: x\nbase_model: google/gemma-4-26b-a4b-it\n---\n# Card") == ["google/gemma-4-26b-a4b-it"]
    assert front_matter_base_model("---\nbase_model:\n- google/a-it\n- google/b\ntags: []\n---\n") == ["google/a-it", "google/b"]
    assert front_matter_base_model("---\nbase_model: [google/a, 'google/b']\n---\n") == ["google/a", "google/b"]
    assert front_matter_base_model("# no front matter\nbase_model: x") == []


@pytest.mark.parametrize(
    ("name", "tuned"),
    [
        ("google/gemma-4-26b-a4b-it", True),
        ("Qwen/Qwen3.5-122B-A10B-Instruct", True),
        ("meta-llama/Llama-3.1-8B-Instruct", True),
        ("google/gemma-4-26b-a4b", False),
        ("google/gemma-4-26b-a4b-pt", False),
        ("acme/italian-base", False),
    ],
)
def test_instruction_tuning_judged_by_the_base_model_name(name, tuned):
    readme = f"---\nbase_model: {name}\n---\n"
    facts = model_facts({"max_position_embeddings": 4096}, readme, "nvidia/quantized-NVFP4")
    assert facts["instruction_tuned"] is tuned
    assert facts["judged_by"] == name


def test_facts_of_a_quantized_multimodal_config():
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "quantization_config": {"quant_method": "modelopt"},
              "text_config": {"max_position_embeddings": 262144}}
    facts = model_facts(config, None, "nvidia/Gemma-4-26B-A4B-it-NVFP4")
    assert (facts["quantization"], facts["max_position_embeddings"], facts["instruction_tuned"]) == ("modelopt", 262144, True)


FACTS_BASE = {"max_position_embeddings": 4096, "instruction_tuned": False, "judged_by": "google/gemma-base"}
WEIGHTS = ["config.json", "model.safetensors"]
MTP = {"speculative": {"method": "mtp", "num_speculative_tokens": 4}}


def test_mtp_drafter_on_a_base_model_refused_unless_forced():
    problems = launch_problems("vllm_instances (llm)", WEIGHTS, FACTS_BASE, MTP)
    assert len(problems) == 1 and "mtp drafter on google/gemma-base, which is not an instruction-tuned model" in problems[0]
    assert launch_problems("vllm_instances (llm)", WEIGHTS, FACTS_BASE, dict(MTP, allow_drafter_on_base_model=True)) == []
    assert launch_problems("vllm_instances (llm)", WEIGHTS, FACTS_BASE, MTP, instruction_tuned_override=True) == []
    ngram = {"speculative": {"method": "ngram", "num_speculative_tokens": 3}}
    assert launch_problems("vllm_instances (llm)", WEIGHTS, FACTS_BASE, ngram) == []


def test_context_beyond_the_models_maximum_refused():
    problems = launch_problems("vllm_instances (llm)", WEIGHTS, FACTS_BASE, {"max_model_len": 8192})
    assert problems == ["vllm_instances (llm).max_model_len: 8192 is more than the model's own maximum of 4096 "
                        "(max_position_embeddings); lower it"]


def test_no_config_or_weights_refused():
    problems = launch_problems("vllm_instances (llm)", ["README.md"], None, {})
    assert [p.split(": ")[1][:9] for p in problems] == ["no config", "no weight"]


def test_host_path_of_a_container_model_path():
    assert host_path("/models/gemma", "/srv/models") == "/srv/models/gemma"
    assert host_path("/opt/weights", "/srv/models") is None


def test_the_dry_run_listing_is_found_after_warning_lines():
    output = '[WARN] slow mirror\n[{"file": "config.json", "size": 10}, {"file": "model.safetensors", "size": 99}]\n'
    assert parse_listing(output) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize(
    ("output", "fragment"),
    [("Fetching [1/3] {garbled", "printed no JSON list of files but 'Fetching [1/3] {garbled'"),
     ('[{"name": "config.json"}]', "printed no JSON list of files"), ("[1, 2]", "printed no JSON list of files"),
     ("", "printed no JSON list of files"), ("[]", "the hub lists no file for it; check the include patterns")],
)
def test_a_dry_run_listing_of_another_shape_is_a_clear_error(output, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_listing(output)


@pytest.mark.parametrize("files", [["config.json"], {"config.json": 10}, {"config.json": {"sha256": "x"}}, None])
def test_a_manifest_of_another_shape_is_damage(files):
    assert verify({"repo": "a/b", "files": files}, {}, False) == [
        ".sparkfleet-manifest.json is damaged (its files are not a mapping of path to size and sha256)"
    ]


def test_a_config_that_is_no_object_declares_nothing():
    facts = model_facts([1], None, "google/gemma-it")
    assert (facts["architectures"], facts["max_position_embeddings"], facts["instruction_tuned"]) == ([], None, True)


def test_the_dry_runs_sizes_add_up_as_huggingface_hubs_cli_prints_them():
    # huggingface_hub 2.4.0 (the lab image's): a line, then each file with its size in units of 1000, "-" when it is there.
    printed = ('[dry-run] Will download 3 files (out of 4) totalling 4.9G.\n'
               '[{"file": "config.json", "size": "1.2K"}, {"file": "model.safetensors", "size": "4.9G"}, '
               '{"file": "README.md", "size": "-"}, {"file": "tokenizer.json", "size": "512.0"}]\n')
    assert listing_bytes(printed) == 1200 + 4_900_000_000 + 512
    assert parse_listing(printed) == ["config.json", "model.safetensors", "README.md", "tokenizer.json"]
    assert listing_bytes('[{"file": "config.json"}]') is None, "a CLI that prints no size lets the download through"
    assert listing_bytes('[{"file": "config.json", "size": "lots"}]') is None
