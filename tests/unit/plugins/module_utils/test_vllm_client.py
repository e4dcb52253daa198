from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_client import (
    host_url,
    instance_endpoint,
    parse_env_file,
    resolve,
)

SETTINGS = {
    "name": "llm",
    "image": "r/vllm@sha256:" + "a" * 64,
    "serve_args": ["/models/gemma", "--served-model-name", "gemma-it", "gemma", "--host", "0.0.0.0", "--port", "8000"],
    "published_ports": ["127.0.0.1:8001:8000", "192.0.2.5:8001:8000"],
}


def test_endpoint_of_a_deployed_instance():
    endpoint = instance_endpoint(SETTINGS, parse_env_file("PYTORCH_CUDA_ALLOC_CONF=a=b\nVLLM_API_KEY=k=ey\n"))
    assert endpoint == {
        "url": "http://127.0.0.1:8001",
        "api_key": "k=ey",
        "model": "gemma-it",
        "weights": "/models/gemma",
        "container": "vllm-llm",
        "container_url": "http://127.0.0.1:8000",
        "image": SETTINGS["image"],
    }


def test_host_url_of_wildcard_and_ipv6():
    assert host_url(["0.0.0.0:9000:8000"]) == "http://127.0.0.1:9000"
    assert host_url(["[::1]:9000:8000"]) == "http://[::1]:9000"


def test_explicit_options_win_and_an_endpoint_is_required(tmp_path):
    import json

    (tmp_path / "llm.json").write_text(json.dumps(SETTINGS))
    (tmp_path / "llm.env").write_text("VLLM_API_KEY=secret\n")
    endpoint = resolve({"instance": "llm", "config_dir": str(tmp_path), "url": "http://10.0.0.1:9/", "api_key": None, "model": None})
    assert (endpoint["url"], endpoint["api_key"], endpoint["model"]) == ("http://10.0.0.1:9", "secret", "gemma-it")
    try:
        resolve({"instance": "other", "config_dir": str(tmp_path)})
    except ValueError as error:
        assert "other.json does not exist; is other deployed by the vllm role on this host?" in str(error)
    else:
        raise AssertionError("a missing instance must be refused")
    try:
        resolve({"instance": None, "config_dir": str(tmp_path), "url": None})
    except ValueError as error:
        assert "give instance" in str(error)
    else:
        raise AssertionError("no endpoint must be refused")
