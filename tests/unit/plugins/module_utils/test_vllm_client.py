import json

import pytest
from plan_options import plan_options

from ansible_collections.sparkfleet.vllm.plugins.module_utils._plan_file import FIX, PlanFileError
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import (
    instance_endpoint,
    json_object,
    label_problems,
    resolve,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_health import Reply, parse_env_file
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import build_plan

DIGEST = "sha256:" + "a" * 64


def planned():
    instance = {"name": "llm", "model": "/models/gemma", "served_model_names": ["gemma-it", "gemma"], "port": 8001, "api_key": "k" * 20,
                "bind_addresses": ["127.0.0.1", "192.0.2.5"], "gpu_memory_utilization": 0.5}
    plan = build_plan([instance], {}, **plan_options(image=f"r/vllm@{DIGEST}", host_addresses=["192.0.2.5"], wait_online_enabled=True))
    assert plan["errors"] == []
    return plan["instances"][0], plan["env_files"]["llm"]


def test_endpoint_of_a_deployed_instance_is_read_from_its_plan():
    plan, env = planned()
    endpoint = instance_endpoint(plan, parse_env_file(env))
    assert endpoint == {
        "url": "http://127.0.0.1:8001",
        "api_key": "k" * 20,
        "model": "gemma-it",
        "served_names": ["gemma-it", "gemma"],
        "health_timeout": 1200,
        "cold_start": {"timeout": 2700, "stamp": plan["cold_start"]["stamp"], "restarts": 1, "restart_window": 130, "kv_cache_warn_share": 0.9},
        "weights": "/models/gemma",
        "container": "vllm-llm",
        "container_url": "http://127.0.0.1:8000",
        "image": f"r/vllm@{DIGEST}",
        "tool_parser": None,
    }


def test_an_instance_that_lets_the_model_choose_tools_names_its_parser():
    instance = {"name": "llm", "model": "/models/qwen", "served_model_names": ["qwen"], "port": 8001, "api_key": "k" * 20,
                "bind_addresses": ["127.0.0.1"], "gpu_memory_utilization": 0.5, "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    plan = build_plan([instance], {}, **plan_options(image=f"r/vllm@{DIGEST}"))
    assert plan["errors"] == []
    assert instance_endpoint(plan["instances"][0], parse_env_file(plan["env_files"]["llm"]))["tool_parser"] == "hermes"


@pytest.mark.parametrize(("text", "fragment"), [
    (json.dumps({"name": "llm", "serve_args": []}), "schema_version None, this release reads 2"),
    (json.dumps({**planned()[0], "schema_version": 1}), "schema_version 1, this release reads 2"),
    (json.dumps({**planned()[0], "served_names": "gemma-it", "health_timeout": "1200"}), "no usable served_names, health_timeout"),
    ("[1]", "holds no plan object"),
    ("{", "not valid JSON"),
])
def test_a_plan_file_the_one_reader_refuses_is_refused_with_its_path_and_the_fix(tmp_path, text, fragment):
    (tmp_path / "llm.json").write_text(text)
    (tmp_path / "llm.env").write_text("VLLM_API_KEY=secret\n")
    with pytest.raises(PlanFileError) as refused:
        resolve({"instance": "llm", "config_dir": str(tmp_path)})
    assert str(refused.value).startswith(f"{tmp_path / 'llm.json'}: {fragment}") and str(refused.value).endswith(f"; {FIX}")


def test_explicit_options_win_and_an_endpoint_is_required(tmp_path):
    plan, env = planned()
    (tmp_path / "llm.json").write_text(json.dumps(plan))
    (tmp_path / "llm.env").write_text(env)
    endpoint = resolve({"instance": "llm", "config_dir": str(tmp_path), "url": "http://10.0.0.1:9/", "api_key": None, "model": None})
    assert (endpoint["url"], endpoint["api_key"], endpoint["model"]) == ("http://10.0.0.1:9", "k" * 20, "gemma-it")
    with pytest.raises(ValueError, match="other.json does not exist; is other deployed by the vllm role on this host?"):
        resolve({"instance": "other", "config_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="give instance"):
        resolve({"instance": None, "config_dir": str(tmp_path), "url": None})


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [(Reply(200, "<html>"), "not a JSON object"), (Reply(200, "[1]"), "not a JSON object"), (Reply(200, "NaN"), "not a JSON object"),
     (Reply(500, "boom"), "answered HTTP 500"), (Reply(None, "", "not answering yet (refused)"), "did not answer: not answering yet (refused); check url"),
     (Reply(401, "Unauthorized"), "answered HTTP 401: the server refuses the API key sent (or its absence); give the instance's key")],
)
def test_unexpected_replies_are_clear_errors(reply, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        json_object(reply, "http://x/tokenize")


@pytest.mark.parametrize("label", ["..", ".", "../x", "a/b", "", " ", "x\n", "-x", "a" * 101, None])
def test_labels_are_plain_names(label):
    assert label_problems("label", label)


@pytest.mark.parametrize("label", ["mtp4-natural", "bf16", "run_2.b", "K3"])
def test_plain_labels_pass(label):
    assert label_problems("label", label) == []


def test_an_env_file_that_cannot_be_read_names_become(tmp_path):
    plan, _env = planned()
    (tmp_path / "llm.json").write_text(json.dumps(plan))
    (tmp_path / "llm.env").mkdir()
    with pytest.raises(ValueError, match=r"instance llm: cannot read .*llm.env \(Is a directory\); .* become: true"):
        resolve({"instance": "llm", "config_dir": str(tmp_path)})
