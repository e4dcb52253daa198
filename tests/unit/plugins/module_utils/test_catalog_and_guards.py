"""Hardware classes and the model catalog as data, each catalog contradiction, each seed guard and
the memory arithmetic, as the plan applies them."""

import pytest
from plan_options import plan_options

from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import CLASSES, resolve_class
from ansible_collections.sparkfleet.vllm.plugins.module_utils._model_catalog import CATALOG, VERSION, as_number, catalog_problems, version_tuple
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import build_plan

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.local:5000/vllm:0.32.0@{DIGEST}"
KEY = "k" * 32
GIB = 2**30
# seed 000's embeddings instance: 7.56 GiB of weights, 8k context (1.12 GiB of KV for it), about
# 1.96 GiB of CUDA graphs and activations; a fleet adds it as its own catalog entry.
EMBEDDINGS = {"embeddings": {
    "title": "seed 000's embeddings model", "path": "/models/embeddings", "size": "embed", "instruction_tuned": True,
    "format": "bf16", "max_context": 8192, "modalities": ["text"], "weights_gib": 7.56, "kv_bytes_per_token": 146800,
    "overhead_gib": 1.965, "overhead_gib_per_1k_batched": 0.0, "instance_defaults": {}, "drafters": {}, "broken": []}}


def instance(**overrides):
    spec = dict(name="llm", served_model_names=["chat"], port=8001, api_key=KEY, bind_addresses=["127.0.0.1"],
                gpu_memory_utilization=0.5, max_num_seqs=8)
    spec.update(overrides)
    if "catalog" not in spec:
        spec.setdefault("model", "/models/x")
    return spec


def plan(*instances, **options):
    return build_plan(list(instances), {}, **plan_options(**{"image": IMAGE, "vllm_version": "0.32.0", **options}))


def errors(*instances, **options):
    return plan(*instances, **options)["errors"]


def only_error(*instances, **options):
    found = errors(*instances, **options)
    assert len(found) == 1, found
    return found[0]


def warnings(*instances, **options):
    result = plan(*instances, **options)
    assert result["errors"] == [], result["errors"]
    return result["warnings"]


def test_the_shipped_catalog_and_classes_are_valid_data():
    assert catalog_problems(CATALOG, "CATALOG") == []
    for name in CLASSES:
        assert resolve_class(name)["errors"] == [], name
    assert set(CLASSES) == {"dgx_spark", "asus_gx10", "rtx_pro_6000", "rtx_5090", "cpu_lab"}


def test_catalog_extra_entries_are_checked_like_the_shipped_ones():
    bad = {"Bad Id": {"title": "x"}, "no-source": {**EMBEDDINGS["embeddings"], "path": None, "max_context": "8k"},
           "odd-drafter": {**EMBEDDINGS["embeddings"], "drafters": {"medusa": {}}, "broken": [{"setting": "colour"}]}}
    found = " | ".join(catalog_problems(bad))
    for fragment in ("vllm_catalog_extra.Bad Id: ids are lower-case", "vllm_catalog_extra.Bad Id.size: missing",
                     "no-source.max_context: '8k' has the wrong type", "no-source: give repo (a Hub id) or path",
                     "odd-drafter.drafters.medusa: a drafter method", "odd-drafter.broken[0]: needs setting"):
        assert fragment in found
    assert "vllm_catalog_extra" in only_error(instance(catalog="embeddings"), catalog_extra={"e": "not a mapping"})


def test_class_values_apply_and_overrides_are_checked():
    spark = plan(instance(catalog="gemma-4-26b-a4b-it-nvfp4", gpu_memory_utilization=0.6))
    llm = spark["instances"][0]
    assert spark["gmu_cap"] == 0.85 and llm["drop_caches"] is True
    assert {"MAX_JOBS", "FLASHINFER_NVCC_THREADS", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"} <= set(llm["env_names"])
    assert "PYTORCH_CUDA_ALLOC_CONF" not in llm["env_names"], "seed 002 measured it crashing a GB10 at 0.85"
    args = llm["serve_args"]
    assert args[args.index("--max-num-batched-tokens") + 1] == "32768" and args[0] == "/models/gemma-4-26B-A4B-it-NVFP4"
    assert plan(instance(), hardware_class="asus_gx10")["gmu_cap"] == 0.85
    five = plan(instance(catalog="gemma-4-26b-a4b-it-nvfp4", gpu_memory_utilization=0.9), hardware_class="rtx_5090")
    assert "8192" in five["instances"][0]["serve_args"] and five["instances"][0]["drop_caches"] is False
    assert "--max-num-batched-tokens" not in plan(instance(), hardware_class="cpu_lab")["instances"][0]["serve_args"]
    own = plan(instance(max_num_batched_tokens=16384), hardware_overrides={"max_num_batched_tokens": 4096})
    assert "16384" in own["instances"][0]["serve_args"]
    assert "4096" in plan(instance(), hardware_overrides={"max_num_batched_tokens": 4096})["instances"][0]["serve_args"]


def test_a_cap_above_the_class_ceiling_and_bad_classes_are_refused():
    message = only_error(instance(), hardware_class="asus_gx10", gmu_cap=0.9)
    assert "vllm_gmu_cap: 0.9 is above the asus_gx10 class's ceiling of 0.85" in message and "seed 002" in message
    measured = {"gmu_ceiling": 0.9, "free_memory_baseline_gib": 110}
    assert errors(instance(), hardware_class="asus_gx10", gmu_cap=0.9, hardware_overrides=measured) == []
    assert "'gb10' is not a hardware class" in only_error(instance(), hardware_class="gb10")
    found = " | ".join(errors(instance(), hardware_overrides={"gmu_celing": 0.9, "production": "yes", "gmu_ceiling": True}))
    assert "gmu_celing: not a value a class has" in found and "production: 'yes' has the wrong type" in found
    assert "gmu_ceiling: True has the wrong type" in found


def test_catalog_entry_brings_settings_and_the_instance_overrides_them():
    llm = plan(instance(catalog="gemma-4-31b-it-nvfp4", gpu_memory_utilization=0.8, kv_cache_dtype="auto",
                        speculative={"method": "dflash"}))["instances"][0]
    args = llm["serve_args"]
    assert args[args.index("--attention-backend") + 1] == "TRITON_ATTN" and args[args.index("--kv-cache-dtype") + 1] == "auto"
    spec = args[args.index("--speculative-config") + 1]
    assert '"model":"/models/gemma-4-31B-it-DFlash"' in spec and '"num_speculative_tokens":8' in spec and '"attention_backend":"triton_attn"' in spec
    assert llm["catalog"] == "gemma-4-31b-it-nvfp4"
    assert "did you mean gemma-4-e4b-it-nvfp4?" in only_error(instance(catalog="gemma-4-e4b-it-nvfp"))


@pytest.mark.parametrize(("settings", "fragment"), [
    pytest.param({"catalog": "gemma-4-e2b-it-nvfp4", "max_model_len": 262144},
                 "max_model_len: 262144 is above gemma-4-e2b-it-nvfp4's maximum context of 131072", id="context-above-the-model"),
    pytest.param({"catalog": "gemma-4-31b-it-nvfp4", "speculative": {"method": "mtp", "model": "google/gemma-4-26B-A4B-it-assistant"}},
                 "is the drafter of the 26b-a4b model, this instance serves gemma-4-31b-it-nvfp4 (31b)", id="drafter-of-another-size"),
    pytest.param({"catalog": "gemma-4-12b-it-nvfp4", "speculative": {"method": "dflash", "model": "/models/gemma-4-31B-it-DFlash"}},
                 "is the drafter of the 31b model", id="staged-drafter-of-another-size"),
    pytest.param({"catalog": "gemma-4-26b-a4b-it-nvfp4", "speculative": {"method": "dflash", "options": {"attention_backend": "flash_attn"}}},
                 "needs triton_attn", id="dflash-without-triton"),
    pytest.param({"catalog": "gemma-4-26b-a4b-it-nvfp4", "attention_backend": "FLASHINFER"},
                 "attention_backend FLASHINFER with catalog entry gemma-4-26b-a4b-it-nvfp4 is known to break", id="gemma-flashinfer"),
    pytest.param({"catalog": "gemma-4-26b-a4b-it-nvfp4", "max_num_batched_tokens": 2048},
                 "2048 is below 4096, the floor of a multimodal model's encoder", id="multimodal-floor"),
    pytest.param({"catalog": "qwen3.5-122b-a10b-hybrid-int4fp8", "prefix_caching": True, "gpu_memory_utilization": 0.85},
                 "prefix_caching True with catalog entry qwen3.5-122b-a10b-hybrid-int4fp8 is known to break", id="qwen-prefix-caching"),
    pytest.param({"catalog": "qwen3.5-122b-a10b-hybrid-int4fp8", "speculative": {"method": "mtp", "model": "/models/other"},
                  "gpu_memory_utilization": 0.85}, "carries its own MTP head", id="qwen-mtp-with-a-model"),
])
def test_catalog_contradictions_are_refused(settings, fragment):
    assert fragment in only_error(instance(**settings))


def test_language_model_only_lifts_the_multimodal_floor_and_versions_decide_known_breakage():
    assert errors(instance(catalog="gemma-4-31b-it-nvfp4", gpu_memory_utilization=0.8, max_num_batched_tokens=2048,
                           language_model_only=True)) == []
    twelve = instance(catalog="gemma-4-12b-it-nvfp4", speculative={"method": "mtp"})
    assert "until vLLM 0.29.0" not in " ".join(errors(twelve)) and errors(twelve) == []
    assert "tripped CUDA graph capture" in only_error(twelve, vllm_version="0.28.1")
    unknown = warnings(twelve, vllm_version="")
    assert any("set vllm_version" in warning for warning in unknown)
    assert errors(instance(catalog="qwen3.5-122b-a10b-hybrid-int4fp8", prefix_caching=True, gpu_memory_utilization=0.85),
                  vllm_version="0.18.0") == []
    assert "'latest' must be the image's vLLM release" in only_error(instance(), vllm_version="latest")


def test_load_time_quantization_on_a_unified_pool_is_refused_unless_forced():
    message = only_error(instance(catalog="gemma-4-26b-a4b-it", quantization="fp8", gpu_memory_utilization=0.6))
    assert "quantizes the checkpoint while it loads" in message and "seed 000" in message
    assert errors(instance(catalog="gemma-4-26b-a4b-it", quantization="fp8", gpu_memory_utilization=0.6,
                           allow_load_time_quantization=True)) == []
    assert "while it loads" in only_error(instance(model="/models/some-bf16", quantization="bitsandbytes"))
    assert errors(instance(catalog="gemma-4-26b-a4b-it-nvfp4-modelopt", gpu_memory_utilization=0.6)) == [], "modelopt is the format"
    assert errors(instance(model="/models/x", quantization="fp8"), hardware_class="rtx_pro_6000") == [], "a discrete card has room"


def test_warnings_name_their_reason():
    assert any("20-55 %" in w for w in warnings(instance(model="/models/x", enforce_eager=True)))
    assert warnings(instance(model="/models/x", enforce_eager=True), hardware_class="cpu_lab") == []
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    found = warnings(instance(model="/models/x", speculative=spec, typical_prompt_tokens=20000, max_num_batched_tokens=8192))
    assert any("below the typical prompt of 20000 tokens" in w for w in found)
    assert any("GGUF" in w for w in warnings(instance(model="/models/llama.Q4_K_M.gguf")))
    unset = instance(model="/models/x")
    del unset["max_num_seqs"]
    assert any("max_num_seqs: unset" in w for w in warnings(unset))


def test_memory_arithmetic_seed_000_embeddings_need_real_headroom():
    small = instance(name="embed", catalog="embeddings", gpu_memory_utilization=0.08, max_model_len=8192)
    message = only_error(small, catalog_extra=EMBEDDINGS)
    assert "0.08 is too small" in message and "leaves 0.21 GiB of KV cache; one 8192-token request needs 1.12 GiB" in message
    report = plan({**small, "gpu_memory_utilization": 0.12}, catalog_extra=EMBEDDINGS)["instances"][0]["memory"]
    assert abs(report["kv_gib"] - 5.06) < 0.05 and report["share_gib"] == 14.6, "seed 000 measured 5.06 GiB of KV at 0.12"


def test_memory_arithmetic_seed_002_refuses_080_and_takes_085():
    qwen = instance(catalog="qwen3.5-122b-a10b-hybrid-int4fp8", max_model_len=262144, gpu_memory_utilization=0.80, max_num_seqs=1)
    message = only_error(qwen, hardware_class="asus_gx10")
    assert "0.8 is too small" in message and "Give it at least 0.84" in message
    report = plan({**qwen, "gpu_memory_utilization": 0.85}, hardware_class="asus_gx10")["instances"][0]["memory"]
    assert report["share_gib"] == 103.44 and report["weights_gib"] == 66.93 and report["full_length_requests"] >= 1


def test_memory_arithmetic_uses_the_host_pool_and_warns_about_concurrency():
    five = instance(catalog="gemma-4-26b-a4b-it-nvfp4", gpu_memory_utilization=0.92, max_num_seqs=64)
    result = plan(five, hardware_class="rtx_5090", memory_total_bytes=32607 * 2**20)
    memory = result["instances"][0]["memory"]
    assert memory["share_gib"] == 29.3 and "KV cache" in memory["arithmetic"]
    assert any("max_num_seqs is 64" in w for w in result["warnings"])
    smaller = {**five, "gpu_memory_utilization": 0.5}
    assert "0.5 is too small" in only_error(smaller, hardware_class="rtx_5090", memory_total_bytes=32607 * 2**20)
    assert plan(instance(catalog="lab-tiny-llama", gpu_memory_utilization=0.1), hardware_class="cpu_lab")["instances"][0]["memory"] is None


def test_inventory_only_plans_skip_what_needs_the_host():
    lan = instance(model="/models/x", bind_addresses=["192.0.2.10"])
    assert "not an address of this host" in only_error(lan, host_addresses=["127.0.0.1"])
    assert errors(lan, host_addresses=None, wait_online_enabled=None) == []


def test_overrides_lay_settings_over_named_instances_and_are_checked():
    instances = [instance(name="embed", port=8001, served_model_names=["embed"], gpu_memory_utilization=0.2),
                 instance(name="chat", port=8002, gpu_memory_utilization=0.4, speculative={"method": "ngram", "num_speculative_tokens": 3})]
    result = plan(*instances, overrides={"chat": {"speculative": {"num_speculative_tokens": 0}, "max_num_seqs": 4}})
    chat = result["instances"][1]
    assert "--speculative-config" not in chat["serve_args"] and chat["serve_args"][chat["serve_args"].index("--max-num-seqs") + 1] == "4"
    assert "--max-num-seqs" in result["instances"][0]["serve_args"] and result["instances"][0]["serve_args"][
        result["instances"][0]["serve_args"].index("--max-num-seqs") + 1] == "8", "the other instance keeps its own"
    assert "vllm_instance_overrides.caht: no instance of that name in vllm_instances; did you mean chat?" in only_error(
        *instances, overrides={"caht": {"max_num_seqs": 4}})
    assert "max_num_seq: unknown key" in only_error(*instances, overrides={"chat": {"max_num_seq": 4}})


@pytest.mark.parametrize(("changes", "expected"), [
    pytest.param({"weights_gib": -5}, "embeddings.weights_gib: -5 is out of range; give a number above 0 and at most 1024 GiB",
                 id="negative-weights"),
    pytest.param({"weights_gib": 0}, "embeddings.weights_gib: 0 is out of range", id="no-weights"),
    pytest.param({"max_context": 0}, "embeddings.max_context: 0 is out of range; give a whole number from 1 to 10485760", id="no-context"),
    pytest.param({"kv_bytes_per_token": 0}, "embeddings.kv_bytes_per_token: 0 is out of range; give a whole number from 1 to 4194304 "
                 "(the KV cache one token takes over all layers; 0 would switch the memory check off", id="kv-check-off"),
    pytest.param({"overhead_gib": -1.5}, "embeddings.overhead_gib: -1.5 is out of range; give a number above 0 and at most 64 GiB",
                 id="negative-overhead"),
    pytest.param({"overhead_gib_per_1k_batched": -0.1}, "embeddings.overhead_gib_per_1k_batched: -0.1 is out of range; give a number "
                 "from 0 to 4 GiB", id="negative-activation-rate"),
    pytest.param({"max_context": 8192.0}, "embeddings.max_context: 8192.0 has the wrong type; give a whole number", id="float-context"),
    pytest.param({"drafters": {"mtp": {"model": "a/b", "num_speculative_tokens": 40}}},
                 "embeddings.drafters.mtp.num_speculative_tokens: 40 is out of range; give a whole number from 1 to 16", id="drafts"),
    pytest.param({"drafters": {"mtp": {"model": "a/b"}}}, "embeddings.drafters.mtp.num_speculative_tokens: missing", id="no-draft-count"),
    pytest.param({"drafters": {"mtp": {"model": "a/b", "num_speculative_tokens": 2, "weights_gib": -1}}},
                 "embeddings.drafters.mtp.weights_gib: -1 is out of range; give a number from 0 to 64 GiB", id="negative-drafter"),
])
def test_catalog_extra_numbers_are_bounded(changes, expected):
    found = catalog_problems({"embeddings": {**EMBEDDINGS["embeddings"], **changes}})
    assert any(expected in e for e in found), found
    assert all(e.startswith("vllm_catalog_extra.embeddings.") for e in found)


@pytest.mark.parametrize(("drafter", "expected"), [
    pytest.param({"model": 5}, "dflash.model: 5 is not a Hub id; give the drafter's id", id="number"),
    pytest.param({"model": ""}, "dflash.model: '' is not a Hub id; give the drafter's id", id="empty"),
    pytest.param({"model": "z-lab/my drafter"}, "dflash.model: 'z-lab/my drafter' is not a Hub id", id="spaces"),
    pytest.param({"model": None}, "dflash.model: missing; give the drafter's Hub id (such as google/gemma-4-31B-it-assistant): "
                 "a dflash drafter is a checkpoint of its own", id="null-for-a-drafter-checkpoint"),
    pytest.param({}, "dflash.model: missing", id="absent"),
])
def test_a_catalog_drafter_model_that_is_empty_or_a_number_is_refused_not_raised(drafter, expected):
    """It used to raise AttributeError in the plan, which no_log shows the operator as 'censored'."""
    extra = {"embeddings": {**EMBEDDINGS["embeddings"], "drafters": {"dflash": {"num_speculative_tokens": 4, **drafter}}}}
    message = only_error(instance(catalog="embeddings", gpu_memory_utilization=0.2, speculative={"method": "mtp", "model": "/m/x"}),
                         catalog_extra=extra)
    assert message.startswith("vllm_catalog_extra.embeddings.drafters.") and expected in message
    built_in = {"embeddings": {**EMBEDDINGS["embeddings"], "drafters": {"mtp": {"model": None, "num_speculative_tokens": 2}}}}
    assert catalog_problems(built_in) == [], "an MTP head built into the checkpoint has model: null"


@pytest.mark.parametrize(("version", "release"), [
    ("0.32.0", (0, 32, 0)), ("0.32.0rc1", (0, 32, 0)), ("0.33.0.dev5", (0, 33, 0)), ("0.32.0+cpu", (0, 32, 0)),
    ("0.33.0.dev5+g1a2b3c.d20260101", (0, 33, 0)), ("0.10.1.1", (0, 10, 1, 1)), ("0.19.1.post1", (0, 19, 1)), ("13.0", (13, 0)),
])
def test_pep_440_versions_compare_by_their_release(version, release):
    assert VERSION.fullmatch(version) and version_tuple(version) == release


def test_versions_decide_known_breakage_by_release_and_a_bad_one_is_refused_not_raised():
    twelve = instance(catalog="gemma-4-12b-it-nvfp4", speculative={"method": "mtp"})
    assert errors(twelve, vllm_version="0.29.0rc1") == [], "a release candidate of the fixed release counts as fixed"
    assert "tripped CUDA graph capture" in only_error(twelve, vllm_version="0.28.1+cu130")
    for bad in ("latest", "v0.32.0", "0.32.0-rc1 ", "0"):
        assert f"vllm_version: {bad!r} must be the image's vLLM release" in only_error(twelve, vllm_version=bad)
    with pytest.raises(ValueError, match="is not a version such as 0.32.0"):
        version_tuple("latest")
    bad_rule = {"setting": "prefix_caching", "values": [True], "reason": "r", "fixed_in": "0.29"}
    assert catalog_problems({"e": {**EMBEDDINGS["embeddings"], "broken": [bad_rule]}}) == []
    bad_rule["fixed_in"] = "v0.29.0"
    assert "e.broken[0].fixed_in: 'v0.29.0' is not a version such as 0.29.0" in catalog_problems(
        {"e": {**EMBEDDINGS["embeddings"], "broken": [bad_rule]}})[0]


@pytest.mark.parametrize(("overrides", "expected"), [
    pytest.param({"min_free_disk_gib": -100}, "sparkfleet_hardware_overrides.min_free_disk_gib: -100 is out of range; give a number "
                 "above 0 and at most 65536 GiB (0 or less would pass a full disk)", id="disk-check-off"),
    pytest.param({"free_memory_baseline_gib": -5}, "sparkfleet_hardware_overrides.free_memory_baseline_gib: -5 is out of range; give a "
                 "number above 0 and at most 121.69 GiB", id="negative-baseline"),
    pytest.param({"free_memory_baseline_gib": 400}, "free_memory_baseline_gib: 400 is out of range; give a number above 0 and at most "
                 "121.69 GiB (memory free after a clean boot; 0 or less would hide crash-loop residue; the pool is 121.69 GiB)",
                 id="baseline-above-the-pool"),
    pytest.param({"shm_size_ceiling_gib": 0}, "sparkfleet_hardware_overrides.shm_size_ceiling_gib: 0 is out of range", id="no-shm"),
    pytest.param({"pool_gib": -1}, "sparkfleet_hardware_overrides.pool_gib: -1 is out of range; give a number above 0 and at most "
                 "1024 GiB", id="negative-pool"),
    pytest.param({"pool_gib": 50}, "sparkfleet_hardware_overrides.pool_gib: 50 is below the dgx_spark class's free_memory_baseline_gib "
                 "of 117.0; raise pool_gib, or override free_memory_baseline_gib too", id="pool-below-the-class-baseline"),
    pytest.param({"max_num_batched_tokens": 0}, "sparkfleet_hardware_overrides.max_num_batched_tokens: 0 is out of range; give a whole "
                 "number from 1 to 1048576", id="no-batch"),
    pytest.param({"gmu_ceiling": 1.0}, "sparkfleet_hardware_overrides.gmu_ceiling: 1.0 is out of range; give a number above 0 and "
                 "below 1 (the whole pool leaves nothing for the OS", id="whole-pool"),
    pytest.param({"gmu_ceiling": -0.5}, "sparkfleet_hardware_overrides.gmu_ceiling: -0.5 is out of range", id="negative-ceiling"),
    pytest.param({"driver_branch": "58"}, "sparkfleet_hardware_overrides.driver_branch: '58' is not a driver branch; give its "
                 "three-digit major version such as '580'", id="driver-branch"),
    pytest.param({"driver_flavour": "proprietary"}, "sparkfleet_hardware_overrides.driver_flavour: 'proprietary' is not a flavour the "
                 "guard holds to; give 'open'", id="driver-flavour"),
    pytest.param({"driver_flavour": "Open"}, "sparkfleet_hardware_overrides.driver_flavour: 'Open' is not a flavour", id="flavour-case"),
    pytest.param({"kernel_line": "6.17.0-1021-nvidia"}, "sparkfleet_hardware_overrides.kernel_line: '6.17.0-1021-nvidia' is not a "
                 "kernel line; give its major.minor such as '6.17'", id="kernel-release-for-line"),
    pytest.param({"kernel_line": "6"}, "sparkfleet_hardware_overrides.kernel_line: '6' is not a kernel line", id="kernel-major-only"),
    pytest.param({"kernel_line": 6.17}, "sparkfleet_hardware_overrides.kernel_line: 6.17 has the wrong type", id="kernel-line-float"),
])
def test_hardware_overrides_are_bounded(overrides, expected):
    resolved = resolve_class("dgx_spark", overrides)
    assert resolved["values"] == {} and any(expected in e for e in resolved["errors"]), resolved["errors"]


def test_hardware_overrides_in_range_apply():
    values = resolve_class("cpu_lab", {"free_memory_baseline_gib": 20, "shm_size_ceiling_gib": 4, "min_free_disk_gib": 0.5})["values"]
    assert values["free_memory_baseline_gib"] == 20 and values["shm_size_ceiling_gib"] == 4
    assert resolve_class("dgx_spark", {"pool_gib": 110, "free_memory_baseline_gib": 95, "driver_branch": None})["errors"] == []
    gb10 = resolve_class("asus_gx10", {"kernel_line": "7.0", "driver_flavour": None})["values"]
    assert (gb10["kernel_line"], gb10["driver_flavour"]) == ("7.0", None)
    assert (resolve_class("dgx_spark")["values"]["driver_flavour"], resolve_class("dgx_spark")["values"]["kernel_line"]) == ("open", "6.17")


@pytest.mark.parametrize(("value", "whole", "number"), [
    (3, True, 3), ("3", True, 3), (3.0, True, 3), (2.5, True, None), ("2.5", False, 2.5), ("5%", False, None), ("two", False, None),
    (True, False, None), (float("nan"), False, None), (float("inf"), False, None), (None, False, None), ("", False, None),
])
def test_numbers_are_read_from_inventory_values_or_refused(value, whole, number):
    assert as_number(value, whole) == number


def test_the_31b_serves_text_only_by_default_where_only_its_text_weights_fit():
    """Seed 001: on a 32 GB card the 31B fits only without its vision tower (22.47 GiB of weights against 23.55), which
    also drops the encoder's 4096-token batch floor."""
    card = {"hardware_class": "rtx_5090", "memory_total_bytes": 32607 * 2**20}
    spec = instance(catalog="gemma-4-31b-it-nvfp4", gpu_memory_utilization=0.92, max_model_len=65536, max_num_batched_tokens=2048, max_num_seqs=1)
    result = plan(spec, **card)
    assert result["errors"] == []
    served = result["instances"][0]
    assert "--language-model-only" in served["serve_args"]
    assert served["memory"]["weights_gib"] == 22.47 and "minus weights 22.47 GiB (text only)" in served["memory"]["arithmetic"]
    assert any(w.startswith("vllm_instances[0] (llm).language_model_only: true by default: with the vision tower 0.92 x 31.84 GiB")
               and "set language_model_only: false to serve images" in w for w in result["warnings"]), result["warnings"]
    kept = errors({**spec, "language_model_only": False}, **card)
    assert "2048 is below 4096, the floor of a multimodal model's encoder" in kept[0], "an explicit false is the operator's"
    assert "gpu_memory_utilization: 0.92 is too small" in kept[1] and "minus weights 23.55 GiB," in kept[1]
    roomy = plan({**spec, "gpu_memory_utilization": 0.5, "max_num_batched_tokens": 8192}, hardware_class="dgx_spark")
    assert "--language-model-only" not in roomy["instances"][0]["serve_args"] and roomy["instances"][0]["memory"]["weights_gib"] == 23.55


def test_the_plan_refuses_speculative_keys_the_stated_release_dropped_before_any_host_changes():
    """vLLM 0.34 dropped two speculative_config keys (a start with them fails) and deprecated a third; with vllm_version
    stated the fleet check refuses them, and the plan records the keys the pull's read release is judged against."""
    speculative = {"method": "ngram", "num_speculative_tokens": 3,
                   "options": {"prompt_lookup_max": 3, "disable_padded_drafter_batch": True, "parallel_drafting": True}}
    refused = only_error(instance(speculative=speculative), vllm_version="0.34.0")
    assert refused.startswith("vllm_instances[0] (llm).speculative.options.disable_padded_drafter_batch: vLLM 0.34.0 no longer")
    kept = {**speculative, "options": {"prompt_lookup_max": 3, "parallel_drafting": True}}
    assert any("parallel_drafting: deprecated since vLLM 0.34.0" in w for w in warnings(instance(speculative=kept), vllm_version="0.34.0"))
    planned = plan(instance(speculative=speculative), vllm_version="0.33.0")
    assert planned["errors"] == []
    assert planned["instances"][0]["launch_check"]["speculative_keys"] == [
        "disable_padded_drafter_batch", "method", "num_speculative_tokens", "parallel_drafting", "prompt_lookup_max"]
