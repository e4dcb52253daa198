"""The host runtime's readiness wait, laid out as serving_host installs it, run as a unit's ExecStartPost runs it (nothing of
the collection or Ansible importable but the installed files), against a local HTTP server."""

import http.server
import json
import os
import subprocess
import threading

import pytest
from plan_files import unit_plan, write_plan
from runtime_layout import install_runtime

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import ENTRY


@pytest.fixture
def installed(tmp_path):
    install_runtime(tmp_path)
    (tmp_path / "llm.env").write_text("# Managed\nVLLM_API_KEY=" + "k" * 20 + "\n")
    return tmp_path


def serve(status, body=b"", metrics=b""):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            server.requests.append(self.path)
            wanted = "Bearer " + "k" * 20
            code = status if self.headers.get("Authorization") == wanted else 401
            self.send_response(code)
            self.end_headers()
            self.wfile.write(metrics if self.path == "/metrics" else body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait(installed, server, timeout=20, cold_timeout=30, share=0.9):
    plan = unit_plan(container="vllm-absent-in-this-test", url=f"http://127.0.0.1:{server.server_port}", env_path=str(installed / "llm.env"),
                     paused_containers=[], drop_caches=False, memory_admission=False, health_timeout=timeout)
    plan["cold_start"].update(timeout=cold_timeout, stamp=str(installed / "jit" / "warm" / "key"), kv_cache_warn_share=share)
    write_plan(installed, plan)
    entry = installed / ENTRY.lstrip("/")
    return subprocess.run(
        ["/usr/bin/python3", "-I", str(entry), "ready", "--plan", str(installed / "llm.json")], cwd=installed,
        capture_output=True, text=True, check=False, timeout=60, env={name: value for name, value in os.environ.items() if name != "PYTHONPATH"},
    )


def test_ready_when_the_model_is_listed_and_the_settings_stamped_warm(installed):
    server = serve(200, json.dumps({"data": [{"id": "tiny"}]}).encode())
    try:
        result = wait(installed, server)
        assert result.returncode == 0 and "cold start, ready" in result.stderr
        assert (installed / "jit" / "warm" / "key").is_file(), "the first good start stamps its settings warm"
        again = wait(installed, server)
    finally:
        server.shutdown()
    assert again.returncode == 0 and "warm start, ready" in again.stderr


def test_a_cold_start_waits_the_cold_timeout_and_a_warm_one_the_warm(installed):
    server = serve(503)
    try:
        cold = wait(installed, server, timeout=1, cold_timeout=4)
        (installed / "jit" / "warm").mkdir(parents=True)
        (installed / "jit" / "warm" / "key").write_text("1\n")
        warm = wait(installed, server, timeout=1, cold_timeout=4)
    finally:
        server.shutdown()
    assert cold.returncode == 1 and "cold start, not ready after 4 s" in cold.stderr, cold.stderr
    assert warm.returncode == 1 and "warm start, not ready after 1 s" in warm.stderr, warm.stderr


def test_a_refused_key_fails_at_once(installed):
    (installed / "llm.env").write_text("VLLM_API_KEY=" + "z" * 20 + "\n")
    server = serve(200, b"{}")
    try:
        result = wait(installed, server, timeout=300)
    finally:
        server.shutdown()
    assert result.returncode == 1 and "refuses the API key" in result.stderr
    # At once: one request, not a poll until the 300 s a server still starting gets.
    assert server.requests == ["/v1/models"], result.stderr


def metrics_page(tokens):
    return f'vllm:cache_config_info{{block_size="16",engine="0",kv_cache_size_tokens="{tokens}",num_gpu_blocks="32"}} 1.0\n'.encode()


def test_each_start_compares_its_kv_cache_with_the_last_good_start_and_warns_below_the_share(installed):
    models = json.dumps({"data": [{"id": "tiny"}]}).encode()
    stamp = installed / "jit" / "warm" / "key"
    results = []
    for tokens in (1000, 849, 950):
        server = serve(200, models, metrics_page(tokens))
        try:
            results.append(wait(installed, server, share=0.9))
        finally:
            server.shutdown()
        assert results[-1].returncode == 0, results[-1].stderr
        if tokens == 1000:
            assert "/metrics" in server.requests and json.loads(stamp.read_text())["kv_cache_tokens"] == 1000
    assert "the KV cache holds 1,000 tokens" in results[0].stderr
    assert "WARNING: the KV cache holds 849 tokens, 85 % of the 1,000 of the best good start" in results[1].stderr
    assert "the KV cache holds 950 tokens" in results[2].stderr and "WARNING" not in results[2].stderr, "the degraded start was no reference"
    assert json.loads(stamp.read_text())["kv_cache_tokens"] == 1000, "the best good start stays the reference"


@pytest.mark.parametrize("share", [None, 0, 1.5, "0.9"])
def test_a_plan_file_without_its_kv_cache_share_is_refused_before_any_wait(installed, share):
    server = serve(200, json.dumps({"data": [{"id": "tiny"}]}).encode(), metrics_page(10))
    try:
        result = wait(installed, server, share=share)
    finally:
        server.shutdown()
    path = installed / "llm.json"
    assert result.returncode == 1
    assert result.stderr == f"{path}: no usable cold_start; re-apply site.yml to this host (the serving roles write the plan files)\n"
    assert server.requests == [], "nothing is waited for on a plan file the reader refuses"
