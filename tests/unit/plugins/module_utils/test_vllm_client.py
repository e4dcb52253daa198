import json

import pytest
from plan_options import plan_options

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


def test_a_plan_file_of_another_shape_is_a_clear_error(tmp_path):
    (tmp_path / "llm.json").write_text(json.dumps({"name": "llm", "serve_args": []}))
    (tmp_path / "llm.env").write_text("VLLM_API_KEY=secret\n")
    with pytest.raises(ValueError, match="has schema_version None, this collection reads 1: another release wrote it; re-apply"):
        resolve({"instance": "llm", "config_dir": str(tmp_path)})
    (tmp_path / "llm.json").write_text(json.dumps({"schema_version": 1, "name": "llm", "serve_args": []}))
    with pytest.raises(ValueError, match="of instance llm has no usable url, model, .*; re-apply the vllm role"):
        resolve({"instance": "llm", "config_dir": str(tmp_path)})
    (tmp_path / "llm.json").write_text("[1]")
    with pytest.raises(ValueError, match="does not hold a plan object"):
        resolve({"instance": "llm", "config_dir": str(tmp_path)})
    (tmp_path / "llm.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        resolve({"instance": "llm", "config_dir": str(tmp_path)})


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


def test_a_plan_file_with_keys_of_another_type_names_them():
    plan, env = planned()
    with pytest.raises(ValueError, match="has no usable served_names, health_timeout; re-apply the vllm role"):
        instance_endpoint(dict(plan, served_names="gemma-it", health_timeout="1200"), parse_env_file(env))


def test_an_env_file_that_cannot_be_read_names_become(tmp_path):
    plan, _env = planned()
    (tmp_path / "llm.json").write_text(json.dumps(plan))
    (tmp_path / "llm.env").mkdir()
    with pytest.raises(ValueError, match=r"instance llm: cannot read .*llm.env \(Is a directory\); .* become: true"):
        resolve({"instance": "llm", "config_dir": str(tmp_path)})
