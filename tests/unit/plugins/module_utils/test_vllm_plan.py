"""The plan of a host: one key table, every guard, the rendering the role and the modules read."""

import json
import pathlib
import re
import shlex

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from plan_options import NODE_SETTINGS, PLAN_TASK, ROLE, ROLE_DEFAULTS, plan_options

from ansible_collections.sparkfleet.vllm.plugins.filter.vllm import vllm_helper_files, vllm_removals
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_instance import (
    parse_image_reference,
    pull_reference,
    pull_repository,
    run_image,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_models import model_folder
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import (
    INSTANCE_KEYS,
    OFFLINE_ENV,
    OWNED_FLAGS,
    PLAN_OPTIONS,
    STAMP_PATH,
    build_plan,
    drift_reasons,
    key_table_markdown,
    owned_flag,
)

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.local:5000/vllm-cpu:0.32.0@{DIGEST}"
KEY = "k" * 32


def instance(**overrides):
    spec = dict(name="llm", model="/models/tiny-llama", served_model_names=["tiny"], port=8001, api_key=KEY)
    spec.update(overrides)
    return spec


DEFAULTS = ROLE_DEFAULTS["vllm_instance_defaults"]


def plan(*instances, defaults=None, **options):
    """The plan on the lab's class unless a test names another (no class env, no class batch size)."""
    return build_plan(list(instances) or [instance()], DEFAULTS if defaults is None else defaults,
                      **plan_options(**{"image": IMAGE, "hardware_class": "cpu_lab", **options}))


def errors(*instances, **options):
    return plan(*instances, **options)["errors"]


def only_error(*instances, **options):
    found = errors(*instances, **options)
    assert len(found) == 1, found
    return found[0]


def test_a_good_instance_has_no_problems_and_a_full_plan():
    result = plan(instance())
    assert result["errors"] == [] and result["absent"] == []
    llm = result["instances"][0]
    assert (llm["unit"], llm["container"], llm["url"]) == ("sparkfleet-vllm-llm.service", "vllm-llm", "http://127.0.0.1:8001")
    assert (llm["served_names"], llm["model"], llm["weights"], llm["weights_host_path"]) == (["tiny"], "tiny", "/models/tiny-llama", "/srv/models/tiny-llama")
    assert llm["run_image"] == f"registry.local:5000/vllm-cpu@{DIGEST}"
    assert llm["env_names"] == ["VLLM_API_KEY", *sorted([*OFFLINE_ENV, "PYTHONPATH"])] and llm["start_after"] == []
    assert re.fullmatch(r"[0-9a-f]{16}", llm["config_hash"])


def test_the_plan_names_every_file_and_folder_the_run_writes_and_mounts():
    """Found when read: the env and plan paths were built in five places, the cache folders in three."""
    result = plan(instance(), config_dir="/etc/sparkfleet/vllm")
    llm = result["instances"][0]
    assert (llm["env_path"], llm["plan_path"], llm["unit_path"]) == (
        "/etc/sparkfleet/vllm/llm.env", "/etc/sparkfleet/vllm/llm.json", "/etc/systemd/system/sparkfleet-vllm-llm.service")
    assert llm["kept_files"] == [
        {"path": "/etc/sparkfleet/vllm/llm.env", "last_good": "/etc/sparkfleet/vllm/last-good/llm.env", "mode": "0600"},
        {"path": "/etc/sparkfleet/vllm/llm.json", "last_good": "/etc/sparkfleet/vllm/last-good/llm.json", "mode": "0644"},
        {"path": "/etc/systemd/system/sparkfleet-vllm-llm.service", "last_good": "/etc/sparkfleet/vllm/last-good/sparkfleet-vllm-llm.service",
         "mode": "0644"}]
    run = llm["docker_run"]
    assert run[run.index("--env-file") + 1] == llm["env_path"]
    mounted = [run[at + 1].split(":")[0] for at, argument in enumerate(run) if argument == "--volume"]
    folders = {folder["path"]: folder["mode"] for folder in result["folders"]}
    helpers = {helper["path"]: helper["source"] for helper in result["helpers"]}
    assert set(mounted) <= {path for path, mode in folders.items() if mode == "0755"} | set(helpers)
    assert [path for path, mode in folders.items() if mode == "0700"] == ["/etc/sparkfleet/vllm", "/etc/sparkfleet/vllm/last-good"]
    unit = llm["unit_file"]
    assert [path for path in helpers if any(path in argument for argument in run)] == [
        "/usr/local/libexec/sparkfleet/sparkfleet_vllm_guard.py"], "it mounts the guard"
    runtime = "/usr/bin/python3 -I /usr/local/libexec/sparkfleet/sparkfleet_runtime.py"
    assert [line for line in unit.splitlines() if runtime in line] == [
        f"ExecStart={runtime} start --plan /etc/sparkfleet/vllm/llm.json", f"ExecStartPost={runtime} ready --plan /etc/sparkfleet/vllm/llm.json",
        f"ExecStopPost=-{runtime} release --plan /etc/sparkfleet/vllm/llm.json"], "every start passes the host runtime"
    assert "RestartPreventExitStatus=78" in unit.splitlines(), "a refused start is not restarted"
    assert llm["memory_admission"] is True and llm["docker_run"][:2] == ["/usr/bin/docker", "run"]
    root = pathlib.Path(__file__).resolve().parents[4]
    assert all((root / source).is_file() for source in helpers.values()), "every helper's source is a file of the collection"


def test_the_helpers_content_is_read_from_the_collection_and_nothing_outside_it():
    root = pathlib.Path(__file__).resolve().parents[4]
    helpers = plan(instance())["helpers"]
    files = vllm_helper_files(helpers, str(root))
    assert [file["path"] for file in files] == [helper["path"] for helper in helpers]
    assert files[0]["content"] == (root / "roles" / "vllm" / "files" / "sparkfleet_vllm_guard.py").read_text()
    for source in ("../../etc/passwd", "roles/vllm/files/missing.py"):
        with pytest.raises(AnsibleFilterError, match="is not a file of the collection"):
            vllm_helper_files([{"path": "/usr/local/libexec/sparkfleet/x.py", "mode": "0644", "source": source}], str(root))


def test_an_instance_no_longer_planned_is_removed_with_the_files_the_plan_gave_it():
    config = "/etc/sparkfleet/vllm"
    planned = plan(instance(), instance(name="gone", port=8002, state="absent"), config_dir=config)
    deployed = [f"{config}/llm.json", f"{config}/old.json", "/etc/systemd/system/sparkfleet-vllm-older.service",
                "/etc/systemd/system/sparkfleet-vllm-older.service.bak", f"{config}/Notes Here.json", f"{config}/last-good/x.json"]
    removals = vllm_removals(deployed, planned, config)
    assert [r["name"] for r in removals] == ["gone", "old", "older"], "a file that names no instance of ours is left alone"
    was_planned = plan(instance(name="old"), config_dir=config)["instances"][0]
    old = removals[1]
    assert (old["unit"], old["container"]) == (was_planned["unit"], was_planned["container"])
    assert old["files"] == [f["path"] for f in was_planned["kept_files"]] + [f["last_good"] for f in was_planned["kept_files"]] + [
        f"{was_planned['last_good_dir']}/{was_planned['name']}.unjudged.json"], "a mark a stopped rollout left goes too"


def test_a_checkpoint_is_staged_in_its_name_or_its_repos():
    assert model_folder({"repo": "nvidia/Gemma-4-26B-A4B-it-NVFP4"}) == "Gemma-4-26B-A4B-it-NVFP4"
    assert model_folder({"repo": "nvidia/Gemma-4-26B-A4B-it-NVFP4", "name": "gemma"}) == "gemma"


def test_every_option_is_given_and_a_missing_or_unknown_one_is_named():
    options = plan_options()
    del options["memory_admission"], options["hardware_class"]
    with pytest.raises(TypeError, match="^build_plan: plan options missing: hardware_class, memory_admission; unknown: none$"):
        build_plan([instance()], DEFAULTS, **options)
    with pytest.raises(TypeError, match="^build_plan: plan options missing: none; unknown: gmu_ceiling$"):
        build_plan([instance()], DEFAULTS, **plan_options(gmu_ceiling=0.9))


def test_the_roles_pass_every_option_and_install_the_plans_folders_and_helpers():
    node_plan = yaml.safe_load((ROLE.parent / "cluster" / "tasks" / "node_plan.yml").read_text())
    calls = {"instances": PLAN_TASK["ansible.builtin.set_fact"]["__vllm_plan"],
             "cluster node": next(t for t in node_plan if t["name"] == "Plan this node with the host's vLLM settings")
             ["ansible.builtin.set_fact"]["__cluster_plan"]}
    for plan_of, call in calls.items():
        assert any(f"**{spread}" in call for spread in ("__vllm_node_settings.options", "(vllm_node_settings.options")), plan_of
        passed = re.findall(r"\b([a-z_]+)=(?!=)", call.split("sparkfleet.vllm.vllm_plan(", 1)[1])
        assert sorted([*NODE_SETTINGS["options"], *passed]) == sorted(PLAN_OPTIONS), f"{plan_of}: each option once, none the plan does not know"
    main = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    cluster = yaml.safe_load((ROLE.parent / "cluster" / "tasks" / "deploy.yml").read_text())
    for tasks, plan_fact in ((main, "__vllm_plan"), (cluster, "__cluster_plan")):
        install = next(t["sparkfleet.vllm.host_files"] for t in tasks if "helpers" in str(t.get("sparkfleet.vllm.host_files")))
        assert install["folders"].startswith(f"{{{{ {plan_fact}.folders ")
        assert install["files"].startswith(f"{{{{ {plan_fact}.helpers | sparkfleet.vllm.vllm_helper_files(role_path ~ '/../..') ")


def test_the_key_never_reaches_the_public_plan():
    result = plan(instance(env={"HF_HOME": "/root/.cache/huggingface"}))
    assert KEY not in json.dumps(result["instances"]) and KEY not in json.dumps(result["errors"])
    assert result["env_files"]["llm"].splitlines()[1:] == [
        f"VLLM_API_KEY={KEY}", "DO_NOT_TRACK=1", "HF_HOME=/root/.cache/huggingface", "HF_HUB_OFFLINE=1", "PYTHONPATH=/opt/sparkfleet",
        "RAY_USAGE_STATS_ENABLED=0", "VLLM_DO_NOT_TRACK=1", "VLLM_NO_USAGE_STATS=1"]


def test_nothing_deployed_phones_home_unless_the_operator_opts_in():
    """vLLM's usage statistics (vllm/usage/usage_lib.py reads VLLM_NO_USAGE_STATS, VLLM_DO_NOT_TRACK and DO_NOT_TRACK),
    Ray's, and huggingface_hub's online look-ups are off in every container, the cluster's ranks included."""
    offline = plan(instance())["env_files"]["llm"].splitlines()
    assert all(f"{name}={value}" in offline for name, value in OFFLINE_ENV.items())
    online = plan(instance(), allow_outbound=True)
    assert not any(line.split("=", 1)[0] in OFFLINE_ENV for line in online["env_files"]["llm"].splitlines())
    assert online["instances"][0]["config_hash"] != plan(instance())["instances"][0]["config_hash"], "opting in relaunches"
    for spelling in ("HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_DO_NOT_TRACK", "RAY_USAGE_STATS_ENABLED"):
        error = only_error(instance(env={spelling: "0"}))
        assert error.startswith(f"vllm_instances[0] (llm).env: {spelling} is set by the role to keep the container offline")
        assert "vllm_allow_outbound: true" in error
        assert only_error(instance(), env={spelling: "0"}).startswith(f"vllm_env: {spelling} is set by the role")
        assert errors(instance(env={spelling: "0"}), allow_outbound=True) == [], "opted in, the names are the operator's"
    assert only_error(instance(), allow_outbound="maybe") == "vllm_allow_outbound: 'maybe' must be true or false"


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        (f"vllm/vllm-openai@{DIGEST}", True),
        (f"vllm/vllm-openai:v0.33.0@{DIGEST}", True),
        (f"172.17.0.1:5000/sparkfleet/vllm-cpu:0.32.0@{DIGEST}", True),
        ("vllm/vllm-openai:latest", False),
        ("vllm/vllm-openai@sha256:abc", False),
        (f"vllm/vllm-openai@{DIGEST}\n", False),
    ],
)
def test_image_must_be_pinned_by_digest(image, pinned):
    assert (parse_image_reference(image) is not None) is pinned
    assert (errors(instance(image=image)) == []) is pinned


def test_floating_tag_needs_the_explicit_opt_out():
    assert errors(instance(image="vllm/vllm-openai:v1"), allow_floating_tag=True) == []
    assert "vllm_allow_floating_tag" in only_error(instance(image="vllm/vllm-openai:v1"))


def test_unknown_keys_are_refused_with_the_closest_name():
    assert "max_model_length: unknown key; did you mean max_model_len?" in only_error(instance(max_model_length=4096))
    assert "vllm_instance_defaults.gpu_memory_utilisation: unknown key; did you mean gpu_memory_utilization?" in errors(
        defaults={**DEFAULTS, "gpu_memory_utilisation": 0.5})[0]
    assert "speculative.num_tokens: unknown key" in only_error(instance(speculative={"method": "ngram", "num_speculative_tokens": 2, "num_tokens": 2}))


@pytest.mark.parametrize(
    ("key", "why"),
    [("", "shorter than 16"), (None, "missing"), ("tiny-key", "shorter than 16"), (" " * 16, "whitespace"),
     ("a" * 15 + "\n", "whitespace"), ("a" * 16 + "\nVLLM_HOST=x", "whitespace"), ("a" * 10 + " " + "b" * 10, "whitespace"),
     ("a" * 16 + "\x00", "non-printable")],
)
def test_api_key_printable_without_whitespace_and_long(key, why):
    error = only_error(instance(api_key=key))
    assert "api_key" in error and why in error
    assert key is None or not key.strip() or key.strip() not in error, "the key itself never appears in an error"


def test_env_may_not_replace_the_key_or_break_the_file():
    assert "VLLM_API_KEY is set by the role" in only_error(instance(env={"VLLM_API_KEY": "x" * 20}))
    assert "not an environment variable name" in only_error(instance(env={"BAD NAME": "1"}))
    assert "newline" in only_error(instance(env={"HF_HOME": "1\nVLLM_API_KEY=x"}))
    assert "must be a string or a number" in only_error(instance(env={"X": {"nested": 1}}))
    assert "vllm_env: VLLM_API_KEY is set by the role" in only_error(instance(), env={"VLLM_API_KEY": "y" * 20})


@pytest.mark.parametrize(
    ("argument", "flag"),
    [("--api-key=x", "--api-key"), ("--api_key=secret", "--api-key"), ("--api-k", "--api-key"), ("--api_k", "--api-key"),
     ("--host", "--host"), ("--ho=0.0.0.0", "--host"), ("--port=1", "--port"), ("--served_model_name", "--served-model-name"),
     ("--gpu-memory-util=0.9", "--gpu-memory-utilization"), ("--config=x.yaml", "--config"), ("-q", "--quantization"),
     ("-qfp8", "--quantization"), ("--uds=/tmp/s", "--uds"), ("--max-model", "--max-model-len"), ("-sc", "--speculative-config"),
     ("-s", "--speculative-config"), ("--speculative-config.num_speculative_tokens=4", "--speculative-config"),
     ("--no-enforce-eager", "--enforce-eager"), ("--no-trust-remote", "--trust-remote-code"),
     # The parallel layout: a rank, a rendezvous address or a data-parallel port is the plan's to set.
     ("-tp", "--tensor-parallel-size"), ("-tp=2", "--tensor-parallel-size"), ("--nnodes=3", "--nnodes"), ("-n", "--nnodes"),
     ("-r", "--node-rank"), ("--master-addr=10.0.0.9", "--master-addr"), ("--master_port", "--master-port"),
     ("--headless", "--headless"), ("--distributed-executor", "--distributed-executor-backend"),
     ("-pp", "--pipeline-parallel-size"), ("--data-parallel-address=0.0.0.0", "--data-parallel-address"), ("-dpa", "--data-parallel-size"),
     ("--no-enable-expert-parallel", "--enable-expert-parallel"), ("-ep", "--enable-expert-parallel")],
)
def test_extra_args_cannot_set_what_the_role_owns(argument, flag):
    assert owned_flag(argument) == flag
    error = only_error(instance(extra_args=[argument]))
    assert f"would set {flag}" in error
    assert "secret" not in error, "a value given with = is not echoed"


@pytest.mark.parametrize("argument", ["--seed", "0", "--max-loras=2",
                                      "--disable-log-requests", "-dcp", "2", "-O3", "--compilation-config.level=3"])
def test_extra_args_that_the_role_does_not_own_pass(argument):
    assert owned_flag(argument) is None
    assert errors(instance(extra_args=[argument])) == []


HF_TOKEN = "hf_" + "Ab3" * 12


@pytest.mark.parametrize("arguments", [
    ["--hf-token", HF_TOKEN], [f"--hf-token={HF_TOKEN}"], ["--hf_token", HF_TOKEN], ["--hf-tok", HF_TOKEN], [f"--hf-t={HF_TOKEN}"],
    ["--hf-token"], [f"--model-loader-extra-config={{\"token\": \"{HF_TOKEN}\"}}"],
    ["--model-loader-extra-config", '{"hf_token": "abcdefgh12345678"}'], ["--kv-transfer-config", '{"password": "hunter2hunter2"}'],
    ["--model-loader-extra-config", "{'aws_secret_access_key': 'abcdefgh'}"], ["--some-config", "api-key=abcdefghijkl"],
    ["--tokenizer", HF_TOKEN], ["--seed", "sk-" + "x" * 30], ["--model-loader-extra-config", '{"use_auth_token": "abcdefgh1"}'],
    ["--allowed-headers", '{"Authorization": "Bearer abcdefgh12"}'], ["--some-config", "bearer abcdefgh123"],
])
def test_extra_args_never_carry_a_secret_in_any_spelling(arguments):
    """Found on the lab: a Hugging Face token given as two extra arguments reached the plan file, its last good copy and
    the diagnostics bundle. A secret goes through the instance's env (the 0600 env file); the refusal never echoes it."""
    found = errors(instance(extra_args=arguments))
    assert found and all("on the command line" in error and "0600 env file" in error for error in found), found
    text = " ".join(found)
    assert HF_TOKEN not in text and "hunter2" not in text and "abcdefgh" not in text and "x" * 30 not in text
    if arguments[0].startswith("--hf"):
        assert "as HF_TOKEN instead" in text


@pytest.mark.parametrize("arguments", [["--max-logprobs=20"], ["--tokenizer", "/models/tiny-llama"],
                                       ["--hf-overrides", '{"bos_token": "<s>", "max_tokens": 5}'],
                                       ["--override-generation-config", '{"num_speculative_tokens": 3}'], ["--tokenizer-mode=auto"],
                                       ["--enable-sleep-mode"], ["--tokenizer", "/models/sk_" + "a" * 24],
                                       ["--tokenizer", "/models/tiny-hf" + "b" * 24]])
def test_settings_named_like_tokens_are_no_secrets(arguments):
    assert errors(instance(extra_args=arguments)) == []


def test_a_secret_given_through_env_reaches_only_the_env_file():
    result = plan(instance(env={"HF_TOKEN": HF_TOKEN}))
    assert result["errors"] == [] and f"HF_TOKEN={HF_TOKEN}" in result["env_files"]["llm"].splitlines()
    assert HF_TOKEN not in json.dumps(result["instances"]) and "HF_TOKEN" in result["instances"][0]["env_names"]


@pytest.mark.parametrize(("option", "text", "read"), [
    ("health_timeout", "900", 900), ("cold_timeout", " 3600 ", 3600), ("start_limit_burst", "3.0", 3), ("restart_delay", "10", 10),
    ("allow_outbound", "yes", True), ("allow_dev_mode", "False", False), ("allow_wildcard_bind", "no", False), ("drop_caches", "on", True),
    ("gmu_cap", "0.5", 0.5), ("gpus", "false", False), ("gpus", "yes", True), ("kv_cache_warn_share", "0.8", 0.8),
])
def test_switches_and_numbers_given_as_text_by_extra_vars_read_as_the_argument_spec_reads_them(option, text, read):
    """Found in a reading: -e vllm_health_timeout=900 (extra variables are text) was refused although the role's argument
    spec takes it as an int."""
    assert errors(instance(), **{option: text}) == []
    assert plan(instance(), **{option: text})["errors"] == plan(instance(), **{option: read})["errors"] == []


def test_gpus_off_as_text_gives_no_container_the_gpus():
    """A review found -e vllm_gpus=false rendering --gpus all: the text "false" is true to Python."""
    planned = plan(instance(), gpus="false")["instances"][0]
    assert "--gpus" not in planned["docker_run"] and "--gpus" not in planned["memory_probe"]


@pytest.mark.parametrize(("option", "text", "fragment"), [
    ("health_timeout", "soon", "vllm_health_timeout: 'soon' must be a whole number"), ("restart_delay", "1e999", "vllm_restart_delay"),
    ("allow_outbound", "maybe", "vllm_allow_outbound: 'maybe' must be true or false"), ("start_limit_burst", "2.5", "vllm_start_limit_burst"),
    ("gmu_cap", "most", "vllm_gmu_cap: 'most'"), ("gpus", "some", "vllm_gpus: 'some' must be true or false"),
    ("kv_cache_warn_share", "most", "vllm_kv_cache_warn_share: 'most' must be a fraction above 0 and at most 1"),
])
def test_text_that_reads_as_no_value_of_its_type_is_named(option, text, fragment):
    assert any(fragment in error for error in errors(instance(), **{option: text}))


@pytest.mark.parametrize("share", [0, -0.5, 1.01, 90, True, None, [0.9]])
def test_a_kv_cache_share_that_is_no_fraction_is_refused_naming_the_variable(share):
    assert any(error.startswith(f"vllm_kv_cache_warn_share: {share!r} must be a fraction above 0 and at most 1")
               for error in errors(instance(), kv_cache_warn_share=share))


def test_every_start_compares_its_kv_cache_at_the_planned_share():
    planned = plan(instance(), kv_cache_warn_share=0.75)["instances"][0]
    assert planned["cold_start"]["kv_cache_warn_share"] == 0.75, "the readiness wait reads it from the plan file"


@pytest.mark.parametrize("model", [None, "", "   ", ["/models/x"], 7, True, {"path": "/models/x"}, "two words"])
def test_a_model_left_empty_beside_a_catalog_entry_is_named_never_a_traceback(model):
    """Found in a reading: `model:` left empty beside `catalog:` ended the plan in a traceback (AttributeError in
    host_path), which no_log hid on a real host as "censored"."""
    found = errors(instance(catalog="gemma-4-26b-a4b-it-nvfp4", model=model))
    assert found and any(".model:" in error for error in found), found


BAD_VALUES = (None, "", " ", "x\n", -1, 0, 1.5, True, [], ["a", 3], {}, {"a": None}, 10**30, float("nan"))


@pytest.mark.parametrize("key", [key.name for key in INSTANCE_KEYS])
def test_no_value_of_any_type_in_any_key_ends_the_plan_in_a_traceback(key):
    """Every key with values of every JSON shape (the plan runs under no_log on a host: a traceback shows only "censored")."""
    for value in BAD_VALUES:
        for where in ("instance", "defaults"):
            given = instance(**{key: value}) if where == "instance" else instance()
            defaults = {**DEFAULTS, key: value} if where == "defaults" and key != "name" else DEFAULTS
            result = plan(given, defaults=defaults)
            assert isinstance(result["errors"], list), (key, value)


@pytest.mark.parametrize("model", ["//models/tiny-llama", "/models//tiny-llama", "/models/tiny-llama/", "///models/tiny-llama"])
def test_a_model_path_in_another_spelling_is_refused_naming_the_one_to_write(model):
    """A review found //models/x passing the check but not the launch check's host path (it skipped the model check)."""
    assert only_error(instance(model=model)).endswith("is '/models/tiny-llama' in other words; write it so (one slash between folders, "
                                                      "none at the end)")


def test_extra_args_with_a_newline_are_refused():
    assert "control character" in only_error(instance(extra_args=["--seed\n0"]))


def test_every_flag_of_the_key_table_is_owned():
    assert {key.flag for key in INSTANCE_KEYS if key.flag} <= OWNED_FLAGS


@pytest.mark.parametrize("address", ["0.0.0.0", "::"])
def test_wildcard_bind_needs_the_opt_in_and_says_what_it_exposes(address):
    error = only_error(instance(bind_addresses=[address]))
    assert "every interface" in error and "vllm_allow_wildcard_bind" in error
    result = plan(instance(bind_addresses=[address]), allow_wildcard_bind=True)
    assert result["errors"] == [] and result["instances"][0]["url"] in ("http://127.0.0.1:8001", "http://[::1]:8001")


@pytest.mark.parametrize("names", [["two words"], ["$HOME"], ["-x"], ["a;b"], [""], []])
def test_served_names_are_single_plain_words(names):
    assert "served_model_names" in only_error(instance(served_model_names=names))


def test_model_and_parser_values_are_single_words():
    assert "model" in only_error(instance(model="/models/x y"))
    assert "reasoning_parser" in only_error(instance(reasoning_parser="--api-key"))


def test_repeated_names_ports_and_served_names_are_refused():
    found = errors(instance(), instance(name="other", port=8002, served_model_names=["tiny"]), gmu_cap=1.0)
    assert any("served_model_names tiny used more than once" in e for e in found)
    found = errors(instance(), instance(served_model_names=["x"]), gmu_cap=1.0)
    assert any("name llm used more than once" in e for e in found) and any("port 8001" in e for e in found)


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1, True, "0.5"])
def test_memory_fraction_range(value):
    assert "gpu_memory_utilization" in only_error(instance(gpu_memory_utilization=value))


def test_gmu_sum_over_the_cap_is_refused_with_the_numbers():
    found = errors(instance(name="emb", port=8002, served_model_names=["e"], gpu_memory_utilization=0.12), instance(), gmu_cap=0.6)
    assert len(found) == 1 and "0.62" in found[0] and "emb 0.12 + llm 0.5" in found[0] and "0.6" in found[0]


def test_lan_address_must_exist_and_needs_wait_online():
    lan = instance(bind_addresses=["127.0.0.1", "192.0.2.10"])
    assert "is not an address of this host" in only_error(lan, host_addresses=["127.0.0.1", "10.0.0.5"], wait_online_enabled=True)
    assert "wait_online" in only_error(lan, host_addresses=["127.0.0.1", "192.0.2.10"])
    assert errors(lan, host_addresses=["127.0.0.1", "192.0.2.10"], wait_online_enabled=True) == []


@pytest.mark.parametrize("bad", [{"max_model_len": 0}, {"max_num_seqs": -1}, {"port": 70000}, {"port": True}, {"enforce_eager": "yes"},
                                 {"runner": "fast"}, {"name": "Bad_Name"}, {"name": "x\n"}, {"health_timeout": 0}])
def test_values_out_of_range_are_refused(bad):
    assert next(iter(bad)) in only_error(instance(**bad))


def test_auto_tool_choice_without_parser_is_refused():
    assert "tool_call_parser" in only_error(instance(enable_auto_tool_choice=True))
    assert errors(instance(enable_auto_tool_choice=True, tool_call_parser="gemma4")) == []


def test_speculative_guards_and_zero_means_off():
    assert "num_speculative_tokens" in only_error(instance(speculative={"method": "ngram", "num_speculative_tokens": -1}))
    assert "speculative.model" in only_error(instance(speculative={"method": "dflash", "num_speculative_tokens": 4}))
    assert errors(instance(speculative={"method": "mtp", "num_speculative_tokens": 2})) == [], "mtp may use the target's own head"
    assert "belong in speculative itself" in only_error(instance(speculative={"method": "ngram", "num_speculative_tokens": 2,
                                                                              "options": {"num_speculative_tokens": 9}}))
    off = plan(instance(speculative={"method": "mtp", "num_speculative_tokens": 0}))
    assert off["errors"] == [] and "--speculative-config" not in off["instances"][0]["serve_args"]


def test_rendered_arguments_follow_the_key_table():
    args = plan(instance(max_model_len=2048, enforce_eager=True, dtype="float32", extra_args=["--seed", "0"],
                         speculative={"method": "ngram", "num_speculative_tokens": 3, "options": {"prompt_lookup_max": 3}}))["instances"][0]["serve_args"]
    assert args[:7] == ["/models/tiny-llama", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "tiny"]
    assert "--enforce-eager" in args and args[args.index("--dtype") + 1] == "float32"
    assert json.loads(args[args.index("--speculative-config") + 1]) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    assert args[-2:] == ["--seed", "0"] and KEY not in " ".join(args)


def test_docker_run_owns_the_container_and_carries_the_hash():
    llm = plan(instance(), gpus=True, models_dir="/srv/models", cache_dir="/var/cache/sv")["instances"][0]
    run = llm["docker_run"]
    assert run[:8] == ["/usr/bin/docker", "run", "--name", "vllm-llm", "--ipc=host", "--env-file", "/etc/sparkfleet/vllm/llm.env", "--publish"]
    assert "/srv/models:/models:ro" in run and run[run.index("--gpus") + 1] == "all"
    assert f"sparkfleet.vllm.config-hash={llm['config_hash']}" in run
    assert run[run.index(llm["run_image"]) + 1:] == llm["serve_args"]
    assert "--gpus" not in plan(instance(), gpus=False)["instances"][0]["docker_run"]


def test_compile_caches_are_kept_per_image_and_the_downloads_shared():
    llm = plan(instance(), cache_dir="/var/cache/sv")["instances"][0]
    jit = f"/var/cache/sv/jit/{DIGEST.removeprefix('sha256:')[:16]}"
    assert llm["cold_start"]["jit_dir"] == jit
    volumes = [llm["docker_run"][i + 1] for i, arg in enumerate(llm["docker_run"]) if arg == "--volume"]
    assert {f"{jit}/vllm:/root/.cache/vllm", f"{jit}/flashinfer:/root/.cache/flashinfer", f"{jit}/triton:/root/.triton",
            "/var/cache/sv/huggingface:/root/.cache/huggingface"} <= set(volumes)
    other = plan(instance(), cache_dir="/var/cache/sv", image=f"other/image@sha256:{'b' * 64}")["instances"][0]
    assert other["cold_start"]["jit_dir"] == "/var/cache/sv/jit/" + "b" * 16, "another image's kernels are never loaded"
    mirrored = plan(instance(), cache_dir="/var/cache/sv", registry_mirror="mirror.lan:5000")["instances"][0]
    assert mirrored["cold_start"]["jit_dir"] == jit, "the same image through a mirror shares its caches"
    two = plan(instance(), instance(name="b", port=8002, served_model_names=["b"], gpu_memory_utilization=0.1, image=f"other/image@sha256:{'b' * 64}"),
               cache_dir="/var/cache/sv")
    folders = [folder["path"] for folder in two["folders"]]
    assert {f"{jit}/warm", f"{jit}/triton", "/var/cache/sv/jit/" + "b" * 16 + "/vllm", "/var/cache/sv/huggingface"} <= set(folders)


def test_a_start_is_cold_until_its_settings_served_on_the_image():
    llm = plan(instance(), cache_dir="/var/cache/sv")["instances"][0]
    cold = llm["cold_start"]
    assert cold["timeout"] == 2700 and cold["restarts"] == 1 and cold["restart_window"] == 10 + 120
    assert STAMP_PATH.fullmatch(cold["stamp"]) and cold["stamp"].startswith(cold["jit_dir"] + "/warm/")
    assert "TimeoutStartSec=2760" in llm["unit_file"].splitlines(), "at boot systemd waits as long as a cold start may take"
    assert llm["health_timeout"] == 1200, "the readiness wait reads both timeouts and the stamp from the plan file"
    # What compiles differently is another stamp; the key and the published port are not.
    for changed in (instance(max_model_len=1024), instance(env={"X": "1"})):
        assert plan(changed, cache_dir="/var/cache/sv")["instances"][0]["cold_start"]["stamp"] != cold["stamp"]
    for same in (instance(api_key="z" * 32), instance(port=9000)):
        assert plan(same, cache_dir="/var/cache/sv")["instances"][0]["cold_start"]["stamp"] == cold["stamp"]
    assert plan(instance(cold_timeout=5000, health_timeout=600))["instances"][0]["cold_start"]["timeout"] == 5000


@pytest.mark.parametrize(("changes", "options"), [({"cold_timeout": 600}, {}), ({}, {"cold_timeout": 900, "health_timeout": 1000})])
def test_a_cold_timeout_shorter_than_the_warm_one_is_refused(changes, options):
    errors = plan(instance(**changes), **options)["errors"]
    assert len(errors) == 1 and "cold_timeout" in errors[0] and "Raise cold_timeout (vllm_cold_timeout)" in errors[0]


def test_config_hash_follows_every_setting_and_the_key():
    base = plan(instance())["instances"][0]["config_hash"]
    assert plan(instance())["instances"][0]["config_hash"] == base
    for changed in (instance(api_key="z" * 32), instance(max_model_len=1024), instance(env={"X": "1"}), instance(port=9000)):
        assert plan(changed)["instances"][0]["config_hash"] != base
    assert plan(instance(), image=f"other/image@{DIGEST}")["instances"][0]["config_hash"] != base


def test_start_order_and_absent_instances():
    result = plan(instance(name="emb", port=8002, served_model_names=["e"], gpu_memory_utilization=0.1),
                  instance(gpu_memory_utilization=0.5), {"name": "old", "state": "absent"})
    assert [i["name"] for i in result["instances"]] == ["emb", "llm"]
    assert result["instances"][1]["start_after"] == ["sparkfleet-vllm-emb.service"]
    assert result["absent"] == ["old"]
    assert "After=docker.service network-online.target sparkfleet-vllm-emb.service" in result["instances"][1]["unit_file"]


def unit_line(unit_file, prefix):
    return next(line for line in unit_file.splitlines() if line.startswith(prefix))[len(prefix):]


def test_unit_quotes_every_value_for_systemd_and_bounds_restarts():
    llm = plan(instance(extra_args=["--override-generation-config", '{"temperature": 0.6, "x": "$HOME 100%"}']),
               start_limit_interval=900, start_limit_burst=2, restart_delay=15)["instances"][0]
    unit = llm["unit_file"]
    # The container's command reaches systemd only as the plan file's path: the host runtime reads the argv from the JSON.
    assert shlex.split(unit_line(unit, "ExecStart=")) == ["/usr/bin/python3", "-I", "/usr/local/libexec/sparkfleet/sparkfleet_runtime.py",
                                                          "start", "--plan", llm["plan_path"]]
    assert '{"temperature": 0.6, "x": "$HOME 100%"}' in llm["docker_run"] and "$HOME" not in unit
    # systemd reads a double-quoted word with C escapes, $$ for $ and %% for %: the stop line quotes its container so.
    exec_stop = unit_line(unit, "ExecStop=")
    assert shlex.split(exec_stop.replace("$$", "$").replace("%%", "%")) == ["/usr/bin/docker", "stop", "--time", "30", llm["container"]]
    # Two starts that each hang until systemd gives up (2700 + 60 s), its stop (60 s), a minute of the door's own work and
    # the restart delay fit in the window.
    assert llm["start_bound"] == {"starts": 2, "window": 2 * (2700 + 60 + 60 + 60 + 15), "path": f"/var/lib/sparkfleet/starts/{llm['unit']}.json"}
    assert "StartLimitIntervalSec=5790" in unit and "TimeoutStopSec=60" in unit and "StartLimitBurst=2" in unit and "RestartSec=15" in unit
    short = plan(instance(cold_timeout=60, health_timeout=30), start_limit_interval=900)["instances"][0]
    assert short["start_bound"]["window"] == 900, "the interval given holds when starts that hang are shorter"
    assert "Restart=always" in unit, "a clean exit (vLLM after a SIGTERM) restarts too"
    assert KEY not in unit


def test_a_start_limit_that_could_never_trip_is_refused():
    assert "could never trip" in only_error(instance(), start_limit_interval=20, start_limit_burst=3, restart_delay=10)
    assert "vllm_start_limit_burst" in only_error(instance(), start_limit_burst=0)


def test_every_error_at_once_and_no_plan_then():
    result = plan(instance(api_key="short", port=0, served_model_names=["a b"]))
    assert len(result["errors"]) == 3 and result["instances"] == [] and result["env_files"] == {}


def test_key_table_markdown_lists_every_key():
    table = key_table_markdown()
    for key in INSTANCE_KEYS:
        assert f"| `{key.name}` |" in table


def test_mirror_moves_the_repository_and_keeps_the_digest():
    assert pull_repository("vllm/vllm-openai") == "vllm/vllm-openai"
    assert pull_repository("vllm/vllm-openai", "mirror.lan:5000") == "mirror.lan:5000/vllm/vllm-openai"
    assert pull_repository("127.0.0.1:5000/sparkfleet/vllm-cpu", "172.17.0.1:5000") == "172.17.0.1:5000/sparkfleet/vllm-cpu"
    assert run_image(f"vllm/vllm-openai:v0.33.0@{DIGEST}", "mirror.lan:5000") == f"mirror.lan:5000/vllm/vllm-openai@{DIGEST}"
    assert run_image("vllm/vllm-openai:v1") == "vllm/vllm-openai:v1"


def test_pull_reference_pulls_by_tag_when_the_pin_names_one():
    assert pull_reference(f"r.lan:5000/vllm:v1@{DIGEST}") == {
        "image": f"r.lan:5000/vllm:v1@{DIGEST}", "repository": "r.lan:5000/vllm", "tag": "v1", "digest": DIGEST,
        "run": f"r.lan:5000/vllm@{DIGEST}"}
    assert pull_reference(f"vllm@{DIGEST}")["tag"] is None
    floating = pull_reference("r.lan:5000/vllm:v1")
    assert (floating["repository"], floating["tag"], floating["digest"]) == ("r.lan:5000/vllm", "v1", None)


def running(llm, **changes):
    container = {"Config": {"Labels": {"sparkfleet.vllm.config-hash": llm["config_hash"]}, "Image": llm["run_image"]},
                 "State": {"Status": "running"}}
    for path, value in changes.items():
        section, key = path.split("__")
        container[section][key] = value
    return container


def test_an_instance_running_its_plan_has_no_drift():
    llm = plan(instance())["instances"][0]
    assert drift_reasons(llm, False, "active", running(llm)) == []


@pytest.mark.parametrize(
    ("files_changed", "unit", "changes", "fragment"),
    [
        (True, "active", {}, "its settings files changed"),
        (False, "inactive", {}, "its unit is inactive"),
        (False, "failed", {}, "its unit is failed"),
        (False, "active", {"Config__Labels": {}}, "its container runs config none"),
        (False, "active", {"Config__Labels": {"sparkfleet.vllm.config-hash": "0123456789abcdef"}}, "runs config 0123456789abcdef, the plan is"),
        (False, "active", {"Config__Image": "other/image@sha256:" + "cd" * 32}, "its container runs image other/image"),
        (False, "active", {"State__Status": "exited"}, "its container is exited"),
    ],
)
def test_drift_names_what_differs_from_the_plan(files_changed, unit, changes, fragment):
    llm = plan(instance())["instances"][0]
    reasons = drift_reasons(llm, files_changed, unit, running(llm, **changes))
    assert len(reasons) == 1 and fragment in reasons[0]


def test_no_container_is_drift():
    llm = plan(instance())["instances"][0]
    assert drift_reasons(llm, False, None, None) == ["its unit is missing", "no container runs"]


@pytest.mark.parametrize("model, fragment", [
    ("/models/../etc", "'..' segment"), ("/models/a/../../root", "'..' segment"), ("../models", "'..' segment"),
    ("/root/weights", "outside /models"), ("/etc/passwd", "outside /models"),
])
def test_a_model_path_stays_inside_the_models_folder(model, fragment):
    assert fragment in only_error(instance(model=model))
    assert fragment in only_error(instance(speculative={"method": "draft_model", "num_speculative_tokens": 3, "model": model}))


def test_model_ids_and_paths_under_models_pass():
    for model in ("/models/tiny-llama", "/models", "Qwen/Qwen3-0.6B", "org/model.v2"):
        assert errors(instance(model=model)) == []


@pytest.mark.parametrize("variable", ["models_dir", "cache_dir", "config_dir"])
@pytest.mark.parametrize(("folder", "problem"), [
    ("/srv/a:/etc", "has 'a:', which a unit file"), ("/srv/../etc", "must not step through '.' or '..'"), ("relative", "must be an absolute path"),
    ("/srv/./x", "must not step through '.' or '..'"), ("/srv/a b", "has 'a b'"), ("/srv/a,b", "has 'a,b'"), ("/", "is too close to /"),
])
def test_host_folders_are_plain_absolute_paths(variable, folder, problem):
    assert only_error(instance(), **{variable: folder}).startswith(f"vllm_{variable}: {folder!r} {problem}")


@pytest.mark.parametrize(("flag", "problem"), [
    ("/etc/passwd", "must be under /run"), ("/run/../etc/passwd", "must not step through '.' or '..'"), ("/run", "must be under /run"),
    ("run/sparkfleet/flag", "must be under /run"), ("/run/a b", "has 'a b'"), (None, "must be under /run"),
])
def test_the_maintenance_flag_is_a_file_under_run_which_the_relaunch_may_delete(flag, problem):
    error = only_error(instance(), maintenance_flag=flag)
    assert error.startswith(f"vllm_maintenance_flag: {flag!r} {problem}")
    assert error.endswith("; give a file under /run (cleared at boot), such as /run/sparkfleet/vllm-maintenance")


@pytest.mark.parametrize("folder", ["/etc", "/root", "/usr"])
def test_the_configuration_folder_is_not_a_system_folder(folder):
    """The role makes it root-only (0700) and removes the plan files in it that it no longer plans."""
    assert only_error(instance(), config_dir=folder) == f"vllm_config_dir: {folder!r} is too close to / (give at least 2 levels, such as /etc/sparkfleet/NAME)"


@pytest.mark.parametrize("address, canonical", [("0:0::0", "::"), ("::0", "::"), ("0000::", "::"), ("0:0:0:0:0:0:0:1", "::1")])
def test_every_spelling_of_an_address_must_be_its_canonical_form(address, canonical):
    problem = only_error(instance(bind_addresses=[address]), allow_wildcard_bind=True)
    assert f"is {canonical} written another way" in problem


@pytest.mark.parametrize("address", ["::ffff:0.0.0.0", "::ffff:127.0.0.1", "fe80::1%eth0"])
def test_mapped_and_zoned_addresses_are_refused(address):
    assert "not an IP address in plain form" in only_error(instance(bind_addresses=[address]), allow_wildcard_bind=True)


@pytest.mark.parametrize("key, value, maximum", [
    ("max_num_seqs", 5_000_000, "4,096"), ("max_model_len", 20_000_000, "10,485,760"), ("tensor_parallel_size", 1000, "64"),
    ("health_timeout", 10**6, "14,400"), ("max_num_batched_tokens", 10**8, "1,048,576"),
])
def test_whole_numbers_in_the_millions_are_refused_with_why(key, value, maximum):
    assert f"is above {maximum}" in only_error(instance(**{key: value}))


def test_draft_counts_are_bounded():
    speculative = {"method": "ngram", "num_speculative_tokens": 1_000_000}
    assert "from 0 (off) to 16" in only_error(instance(speculative=speculative))
    assert errors(instance(speculative={**speculative, "num_speculative_tokens": 16})) == []


@pytest.mark.parametrize("name, value", [("start_limit_burst", 1000), ("start_limit_interval", 10**7), ("restart_delay", 0),
                                         ("health_timeout", -5)])
def test_restart_and_gate_settings_are_bounded(name, value):
    assert any(e.startswith(f"vllm_{name}: {value!r} must be a whole number from 1 to") for e in errors(instance(), **{name: value}))


@pytest.mark.parametrize("source, setting", [
    ("vllm_env", "vllm_env.VLLM_SERVER_DEV_MODE"), ("env", "(llm).env.VLLM_SERVER_DEV_MODE"),
    ("class_env", "sparkfleet_hardware_overrides.env.VLLM_SERVER_DEV_MODE"),
    ("profiler", "(llm).extra_args --profiler-config"), ("tokens_only", "(llm).extra_args --tokens-only"),
])
def test_settings_that_open_engine_controls_need_the_opt_in(source, setting):
    given = {"VLLM_SERVER_DEV_MODE": "1"}
    spec, options = {
        "vllm_env": (instance(), {"env": given}), "env": (instance(env=given), {}),
        "class_env": (instance(), {"hardware_overrides": {"env": given}}),
        "profiler": (instance(extra_args=['--profiler_config={"profiler": "torch"}']), {}),
        "tokens_only": (instance(extra_args=["--tokens-only"]), {}),
    }[source]
    problem = only_error(spec, **options)
    assert setting in problem and "key check leaves open" in problem and "vllm_allow_dev_mode: true" in problem


def test_every_served_route_asks_for_the_key_through_the_guard_middleware():
    llm = plan(instance())["instances"][0]
    serve = llm["serve_args"]
    assert serve[serve.index("--middleware") + 1] == "sparkfleet_vllm_guard.KeyOnEveryRoute" and "--disable-fastapi-docs" in serve
    assert "/usr/local/libexec/sparkfleet/sparkfleet_vllm_guard.py:/opt/sparkfleet/sparkfleet_vllm_guard.py:ro" in llm["docker_run"]
    for argument in ("--middleware=my.Open", "--disable-fastapi-docs", "--middle=x"):
        assert "which the role sets" in only_error(instance(extra_args=[argument]))
    assert "PYTHONPATH is set by the role" in only_error(instance(env={"PYTHONPATH": "/tmp"}))


def test_dev_mode_with_the_opt_in_is_loopback_only():
    loopback = instance(env={"VLLM_SERVER_DEV_MODE": "1"}, bind_addresses=["127.0.0.1", "::1"])
    assert errors(loopback, allow_dev_mode=True) == []
    lan = instance(env={"VLLM_SERVER_DEV_MODE": "1"}, bind_addresses=["127.0.0.1", "192.0.2.10"])
    problem = only_error(lan, allow_dev_mode=True, host_addresses=["192.0.2.10"], wait_online_enabled=True)
    assert "binds 192.0.2.10" in problem and "bind 127.0.0.1 or ::1 only" in problem
    wildcard = instance(env={"VLLM_SERVER_DEV_MODE": "1"}, bind_addresses=["0.0.0.0"])
    assert "binds 0.0.0.0" in only_error(wildcard, allow_dev_mode=True, allow_wildcard_bind=True)


@pytest.mark.parametrize("argument", ["--tokens-onl", "--profiler-conf={}", "--profiler_config={}", "--enable-fault-tol",
                                      "--enable-scale-out", "--enable-tokenizer-info-endpoint", "--enable_offline_docs"])
def test_dev_flags_in_any_spelling_argparse_expands_need_the_opt_in(argument):
    assert "vllm_allow_dev_mode: true" in only_error(instance(extra_args=[argument]))


@pytest.mark.parametrize("name", ["VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_ENABLE_COHERE_API"])
def test_env_that_adds_routes_needs_the_opt_in(name):
    """vLLM 0.32 registers the LoRA load routes (and SageMaker's /adapters) and the Cohere API on these."""
    assert f"(llm).env.{name}: opens" in only_error(instance(env={name: "1"}))
    assert errors(instance(env={name: "1"}, bind_addresses=["127.0.0.1"]), allow_dev_mode=True) == []


@pytest.mark.parametrize("setting", [
    {"extra_args": ["--grpc"]}, {"extra_args": ["--grpc-port=50051"]}, {"env": {"VLLM_USE_RUST_FRONTEND": "1"}},
    {"env": {"VLLM_RUST_FRONTEND_PATH": "/tmp/server"}}, {"env": {"CUSTOM_FASTAPI_PING_HANDLER": "mine:ping"}},
    {"env": {"CUSTOM_PRE_PROCESS": "mine:hook"}},
])
def test_settings_that_replace_the_guarded_server_are_refused_even_with_the_opt_in(setting):
    """Another server (gRPC, vllm-rs) or a swapped-in handler answers where the key middleware never runs."""
    problem = only_error(instance(bind_addresses=["127.0.0.1"], **setting), allow_dev_mode=True)
    assert "where the role's key check never runs; it is not allowed" in problem


def test_a_changed_guard_middleware_changes_the_config_hash():
    first, second = (plan(instance(), guard_digest=digest)["instances"][0]["config_hash"] for digest in ("a" * 64, "b" * 64))
    assert first != second


@pytest.mark.parametrize("address, fragment", [
    ("192.0.2.10", ""), ("::1", ""), ("", "not one IP address"), ("192.0.2.10\nuse chroot = no", "not one IP address"),
    ("0.0.0.0", "every interface"), ("::ffff:192.0.2.10", "not one IP address"), ("0:0::0", "not one IP address"),
])
def test_the_model_sources_listen_address_is_one_plain_address(address, fragment):
    from ansible_collections.sparkfleet.vllm.plugins.filter.vllm import vllm_listen_address_problem

    problem = vllm_listen_address_problem(address)
    assert (fragment in problem) if fragment else problem == ""


def test_the_compile_caches_are_backed_up_per_host_and_image_where_the_operator_says():
    assert plan(instance())["compile_caches"] == [], "no backup without vllm_cache_backup_dir"
    two = plan(instance(), instance(name="b", port=8002, served_model_names=["b"], gpu_memory_utilization=0.1, max_model_len=512),
               cache_dir="/var/cache/sv", cache_backup_dir="/mnt/backup")
    first, second = two["instances"]
    key = DIGEST.removeprefix("sha256:")[:16]
    assert two["compile_caches"] == [{
        "jit_dir": f"/var/cache/sv/jit/{key}", "backup": f"/mnt/backup/spark-1/{key}",
        "stamps": [first["cold_start"]["stamp"].rsplit("/", 1)[1], second["cold_start"]["stamp"].rsplit("/", 1)[1]],
    }], "one folder per image, both instances' stamps in it"
    controller = plan(instance(), cache_backup_dir="/srv/sparkfleet/caches", cache_backup_location="controller")["compile_caches"]
    assert controller[0]["backup"] == f"/srv/sparkfleet/caches/spark-1/{key}.tar"


@pytest.mark.parametrize(("options", "fragment"), [
    ({"cache_backup_dir": "backups"}, "vllm_cache_backup_dir: 'backups' "),
    ({"cache_backup_dir": "/var/cache/sv/backup", "cache_dir": "/var/cache/sv"}, "hold one another"),
    ({"cache_backup_dir": "/var/cache", "cache_dir": "/var/cache/sv"}, "hold one another"),
    ({"cache_backup_dir": "/var//cache/sv/backup", "cache_dir": "/var/cache/sv"}, "hold one another"),
    ({"cache_backup_dir": "/var/cache/sv/./backup", "cache_dir": "/var/cache/sv"}, "must not step through"),
    ({"cache_backup_dir": "/var/cache/sv/backup", "cache_dir": "/var/cache//sv/"}, "hold one another"),
    ({"cache_backup_dir": "/var/cache/", "cache_dir": "//var/cache/sv"}, "hold one another"),
    ({"cache_backup_dir": "/mnt/b", "cache_backup_location": "nfs"}, "vllm_cache_backup_location: 'nfs' must be host"),
    ({"cache_backup_dir": "/mnt/b", "host_name": "../spark"}, "rename the host in the inventory"),
])
def test_a_backup_place_that_could_not_keep_the_caches_apart_is_refused(options, fragment):
    found = errors(instance(), **options)
    assert len(found) == 1 and fragment in found[0], found


def test_no_image_anywhere_is_refused_naming_vllm_image():
    """vllm_image defaults to empty: an inventory that sets neither it nor the instance's image got a traceback."""
    found = errors(instance(), image="")
    assert found == ["vllm_instances[0] (llm).image: missing; The image, `repo[:tag]@sha256:<64 hex>`; here or through `vllm_image`, its default."]


def test_no_engine_or_unit_process_dumps_a_core_unless_the_operator_caps_one():
    """A crash wrote a 41 GB core to a GX10's weights disk (systemd's DefaultLimitCORE is infinity): the container gets
    --ulimit core=0 (dockerd, not the unit, gives a container its limits) and the unit LimitCORE=0."""
    llm = plan(instance())["instances"][0]
    run = llm["docker_run"]
    assert run[run.index("--ulimit") + 1] == "core=0" and "LimitCORE=0" in llm["unit_file"].splitlines()
    capped = plan(instance(), core_dump_mib="512")["instances"][0]["docker_run"]
    assert f"core={512 * 1024 * 1024}" in capped, "-e gives text; read as the argument spec reads it"
    assert capped != run, "another limit is another container: drift, a relaunch"


@pytest.mark.parametrize("value", [-1, 16385, "lots", 1.5, True, None])
def test_a_core_dump_limit_out_of_its_bounds_is_refused(value):
    assert only_error(instance(), core_dump_mib=value).startswith(f"vllm_core_dump_mib: {value!r} must be a whole number of MiB from 0")


@pytest.mark.parametrize(("kinds", "fragment"), [
    ([], "vllm_image_kinds: [] must map image repositories to kinds (vllm-openai, ngc)"),
    ({"nvcr.io/nvidia/vllm:26.05": "ngc"}, "vllm_image_kinds: 'nvcr.io/nvidia/vllm:26.05' is not an image repository"),
    ({"Registry/vllm": "ngc"}, "is not an image repository"),
    ({"registry.local/vllm": "sglang"}, "vllm_image_kinds.registry.local/vllm: 'sglang' is not a kind the collection knows"),
    ({"registry.local/vllm; rm -rf /": "ngc"}, "is not an image repository"),
], ids=["list", "tag", "upper-case", "unknown-kind", "injection"])
def test_an_image_kind_mapping_of_another_shape_is_refused(kinds, fragment):
    assert fragment in only_error(instance(), image_kinds=kinds)


def test_an_instance_of_vllms_own_image_serves_through_its_entrypoint():
    llm = plan(instance())["instances"][0]
    assert llm["image_kind"] == "vllm-openai" and "--entrypoint" not in llm["docker_run"]
    assert llm["docker_run"][llm["docker_run"].index(llm["run_image"]) + 1] == llm["serve_args"][0]
