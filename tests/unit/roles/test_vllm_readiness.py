"""The units' readiness wait, laid out as the vllm role installs it, run as systemd runs it, against a local HTTP server."""

import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture
def installed(tmp_path):
    shutil.copy(ROOT / "roles" / "vllm" / "files" / "vllm_readiness.py", tmp_path)
    shutil.copy(ROOT / "plugins" / "module_utils" / "_vllm_health.py", tmp_path)
    (tmp_path / "llm.env").write_text("# Managed\nVLLM_API_KEY=" + "k" * 20 + "\n")
    return tmp_path


def serve(status, body=b""):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            wanted = "Bearer " + "k" * 20
            code = status if self.headers.get("Authorization") == wanted else 401
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait(installed, server, timeout="20", cold_timeout="30"):
    # As on the host: nothing of the collection or Ansible importable, only the installed files side by side.
    return subprocess.run(
        [sys.executable, str(installed / "vllm_readiness.py"), "--container", "vllm-absent-in-this-test", "--url",
         f"http://127.0.0.1:{server.server_port}", "--env-file", str(installed / "llm.env"), "--timeout", timeout,
         "--cold-timeout", cold_timeout, "--stamp", str(installed / "jit" / "warm" / "key"), "--served-name=tiny"],
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
        cold = wait(installed, server, timeout="1", cold_timeout="4")
        (installed / "jit" / "warm").mkdir(parents=True)
        (installed / "jit" / "warm" / "key").write_text("1\n")
        warm = wait(installed, server, timeout="1", cold_timeout="4")
    finally:
        server.shutdown()
    assert cold.returncode == 1 and "cold start, not ready after 4 s" in cold.stderr, cold.stderr
    assert warm.returncode == 1 and "warm start, not ready after 1 s" in warm.stderr, warm.stderr


def test_a_refused_key_fails_at_once(installed):
    (installed / "llm.env").write_text("VLLM_API_KEY=" + "z" * 20 + "\n")
    server = serve(200, b"{}")
    try:
        result = wait(installed, server, timeout="300")
    finally:
        server.shutdown()
    assert result.returncode == 1 and "refuses the API key" in result.stderr
    # At once: not after the 300 s it would wait for a server still starting (a loaded machine takes a moment).
    assert float(re.search(r"after ([0-9.]+) s", result.stderr).group(1)) < 10, result.stderr
