"""The key middleware every vLLM container loads, driven as an ASGI server drives it."""

import asyncio
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
KEY = "k" * 32


@pytest.fixture
def guard():
    spec = importlib.util.spec_from_file_location("sparkfleet_vllm_guard", ROOT / "roles" / "vllm" / "files" / "sparkfleet_vllm_guard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(guard, path, headers=(), kind="http"):
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    middleware = guard.KeyOnEveryRoute(app)
    scope = {"type": kind, "path": path, "method": "POST", "headers": [(name.encode(), value.encode()) for name, value in headers]}
    asyncio.run(middleware(scope, receive, send))
    return reached, sent


@pytest.mark.parametrize("path", ["/invocations", "/pooling", "/score", "/tokenize", "/server_info", "/v1/models", "/health/",
                                  "//health", "/docs"])
def test_every_route_but_the_probes_needs_the_key(guard, monkeypatch, path):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    reached, sent = call(guard, path)
    assert reached == [] and sent[0]["status"] == 401 and json.loads(sent[1]["body"])["error"]["code"] == 401
    reached, _sent = call(guard, path, [("Authorization", f"Bearer {KEY}")])
    assert reached == [path]
    for wrong in ([("authorization", "Bearer nope")], [("authorization", KEY)],
                  [("authorization", f"Bearer {KEY}"), ("authorization", "Bearer other")]):
        assert call(guard, path, wrong)[0] == []


@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics", "/version", "/load"])
def test_the_probes_answer_without_the_key(guard, monkeypatch, path):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert call(guard, path)[0] == [path]


def test_a_websocket_without_the_key_is_closed(guard, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    reached, sent = call(guard, "/v1/realtime", kind="websocket")
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_without_a_key_in_the_environment_only_the_probes_answer(guard, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert call(guard, "/health")[0] == ["/health"]
    assert call(guard, "/v1/models", [("Authorization", "Bearer ")])[0] == []
