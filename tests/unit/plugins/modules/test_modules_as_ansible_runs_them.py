"""The modules run as Ansible runs them (their arguments on stdin, a fresh interpreter) against real
local inputs: a small HTTP server on 127.0.0.1 answering 401, non-JSON and wrong-shaped JSON, a
closed port, a port that answers something other than HTTP, damaged files, fake executables on
PATH printing garbled output, and prometheus_client made unimportable. Every failure must be a
fail_json naming the cause, never a traceback."""

import hashlib
import http.server
import json
import os
import pathlib
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
import time

import pytest
from plan_files import unit_plan, write_plan
from threaded_server import serving

ROOT = pathlib.Path(__file__).resolve().parents[4]
COLLECTIONS = ROOT / ".cache" / "collections"
MODULES = COLLECTIONS / "ansible_collections" / "sparkfleet" / "vllm" / "plugins" / "modules"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
KEY = "k" * 40


def run(module, args, pythonpath=(), path=None):
    payload = {"ANSIBLE_MODULE_ARGS": args}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(COLLECTIONS)])}
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run([sys.executable, str(MODULES / f"{module}.py")], input=json.dumps(payload), capture_output=True,
                          text=True, env=env, check=False, timeout=60)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return json.loads(done.stdout)


def refused(module, args, *fragments, **how):
    result = run(module, args, **how)
    assert result.get("failed") is True, result
    for fragment in fragments:
        assert fragment in result["msg"], result["msg"]
    return result


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        kind = "#stream" if b'"stream": true' in body else "#tools" if b'"tools":' in body else ""
        route = self.path + (kind if self.path + kind in self.server.routes else "")
        status, body, delay = self.server.routes.get(route, (404, '{"detail": "Not Found"}', 0))
        time.sleep(delay)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = answer

    def log_message(self, *_args):
        pass


class Server(http.server.ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.routes = {}
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def server():
    """A vLLM stand-in whose routes each test sets: path -> (status, body, seconds before answering)."""
    with serving(Server()) as running:
        yield running


class NotHttp(socketserver.StreamRequestHandler):
    def handle(self):
        self.rfile.readline()
        self.wfile.write(b"SSH-2.0-OpenSSH_9.6\r\n")


@pytest.fixture
def not_http():
    """A port answering something other than HTTP, as another daemon on vLLM's port would."""
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), NotHttp) as running:
        thread = threading.Thread(target=running.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{running.server_address[1]}"
        running.shutdown()
        thread.join()


@pytest.fixture
def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def no_prometheus(tmp_path):
    """A PYTHONPATH entry that shadows prometheus_client with a package that cannot be imported."""
    package = tmp_path / "shadow" / "prometheus_client"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('prometheus_client is made unimportable by the test')\n")
    return [package.parent]


def fake_tools(folder, **scripts):
    """Executables on a PATH of their own, each printing its text and exiting 0."""
    folder.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}\nEOF\n")
        (folder / name).chmod(0o755)
    return folder


def bench(url, tmp_path, **args):
    return {"url": url, "label": "x", "dataset": "random", "runner": "local", "concurrencies": [1], "results_dir": str(tmp_path / "bench"),
            "timeout": 5, **args}


@pytest.fixture
def vllm_on_path(tmp_path):
    """The local runner needs a vllm on PATH before anything is sent; these tests stop before it runs."""
    return {"path": fake_tools(tmp_path / "bin", vllm="")}


def test_bench_names_a_refused_key_on_v1_models(server, tmp_path, vllm_on_path):
    server.routes["/v1/models"] = (401, '{"error": "Unauthorized"}', 0)
    refused("vllm_bench", bench(server.url, tmp_path), "/v1/models answered HTTP 401: the server refuses the API key",
            "give the instance's key in api_key", **vllm_on_path)


@pytest.mark.parametrize(("status", "body"), [(404, '{"detail": "Not Found"}'), (401, '{"error": "Unauthorized"}')])
def test_bench_reset_without_the_development_routes_names_vllm_allow_dev_mode(server, tmp_path, vllm_on_path, status, body):
    server.routes["/reset_prefix_cache"] = (status, body, 0)
    refused("vllm_bench", bench(server.url, tmp_path, model="m", require_idle=False, prefix_cache="reset"),
            f"/reset_prefix_cache answered HTTP {status}: prefix_cache: reset needs vLLM's development routes",
            "opens only with vllm_allow_dev_mode: true on an instance bound to loopback only; use prefix_cache: disjoint", **vllm_on_path)
    assert not (tmp_path / "bench").exists()


def test_bench_names_a_metrics_page_that_is_not_prometheus_text(server, tmp_path, vllm_on_path):
    server.routes["/metrics"] = (200, "<html>a login page</html>", 0)
    refused("vllm_bench", bench(server.url, tmp_path, model="m"), "/metrics did not answer Prometheus text", **vllm_on_path)


@pytest.mark.skipif(shutil.which("vllm") is not None, reason="this host has a vllm on PATH")
def test_bench_local_runner_without_vllm_is_refused_with_the_other_problems(server, tmp_path):
    refused("vllm_bench", bench(server.url, tmp_path, concurrencies=[0]), "vllm_bench refused: concurrencies[0]: 0 is out of range",
            "; runner: local needs the vllm command on this host's PATH; use runner: exec or container")
    assert not (tmp_path / "bench").exists()


def test_bench_names_a_plan_file_of_an_older_release(tmp_path):
    path = write_plan(tmp_path, {"name": "llm", "url": "http://127.0.0.1:1", "served_names": ["gemma"]})
    (tmp_path / "llm.env").write_text(f"VLLM_API_KEY={KEY}\n")
    args = {"instance": "llm", "config_dir": str(tmp_path), "label": "x", "dataset": "random", "runner": "local"}
    refused("vllm_bench", args, f"{path}: schema_version None, this release reads 2", "re-apply site.yml to this host")
    write_plan(tmp_path, unit_plan(schema_version=1))
    refused("vllm_bench", args, f"{path}: schema_version 1, this release reads 2", "re-apply site.yml to this host")
    write_plan(tmp_path, unit_plan(served_names="gemma", model=None))
    refused("vllm_bench", args, f"{path}: no usable model, served_names; re-apply site.yml to this host")


@pytest.mark.parametrize("module", ["vllm_bench", "vllm_acceptance", "vllm_metrics_info"])
def test_modules_reading_metrics_name_a_missing_prometheus_client(module, no_prometheus, server, tmp_path):
    args = {"vllm_bench": bench(server.url, tmp_path), "vllm_acceptance": {"url": server.url, "categories": {"code": ["q"]}},
            "vllm_metrics_info": {"url": server.url}}[module]
    refused(module, args, "Failed to import the required Python library (prometheus_client)", "python3-prometheus-client",
            pythonpath=no_prometheus)


def test_acceptance_names_what_the_endpoint_answered(server):
    categories = {"code": ["Write a parser."]}
    server.routes["/v1/models"] = (200, '{"data": [{"name": "no id"}]}', 0)
    refused("vllm_acceptance", {"url": server.url, "categories": categories}, "/v1/models lists no model", "give model")
    server.routes["/metrics"] = (200, "not: prometheus {", 0)
    refused("vllm_acceptance", {"url": server.url, "model": "m", "categories": categories}, "/metrics did not answer Prometheus text")


@pytest.mark.parametrize(
    ("route", "fragments"),
    [((401, "Unauthorized", 0), ["/metrics answered HTTP 401: the server refuses the API key"]),
     ((200, "<html>", 0), ["/metrics did not answer Prometheus text"]),
     ((200, "", 2), ["/metrics did not answer", "timed out"])],
    ids=["401", "html", "timeout"],
)
def test_metrics_info_names_each_unexpected_reply(server, route, fragments):
    server.routes["/metrics"] = route
    refused("vllm_metrics_info", {"url": server.url, "timeout": 1}, *fragments)


def test_metrics_info_names_a_closed_port_and_a_port_that_is_not_http(closed_port, not_http):
    refused("vllm_metrics_info", {"url": closed_port}, "/metrics did not answer", "ConnectionRefusedError", "check url")
    refused("vllm_metrics_info", {"url": not_http}, "/metrics did not answer", "the answer is not HTTP", "another program answers")


def test_health_names_a_model_list_of_another_shape_and_a_plan_file_of_another_type(server, tmp_path):
    server.routes["/v1/models"] = (200, '{"data": [{"id": 1}]}', 0)
    refused("vllm_health", {"url": server.url, "api_key": KEY, "served_model_names": ["gemma"], "timeout": 5},
            "200 with a body that is not a model list")
    path = write_plan(tmp_path, unit_plan(url=server.url, served_names=["gemma"], model="gemma"))
    (tmp_path / "llm.env").mkdir()
    refused("vllm_health", {"instance": "llm", "config_dir": str(tmp_path)}, "instance llm: cannot read", "llm.env (Is a directory)")
    (tmp_path / "llm.env").rmdir()
    (tmp_path / "llm.env").write_text(f"VLLM_API_KEY={KEY}\n")
    write_plan(tmp_path, unit_plan(url=server.url, health_timeout="600"))
    refused("vllm_health", {"instance": "llm", "config_dir": str(tmp_path)}, f"{path}: no usable health_timeout; re-apply site.yml to this host")


def test_correctness_names_replies_of_another_shape_and_a_damaged_reference(server, tmp_path):
    args = {"url": server.url, "model": "m", "label": "x", "results_dir": str(tmp_path / "results")}
    server.routes["/v1/chat/completions"] = (200, "<html>", 0)
    refused("vllm_correctness", args, "case arith-1:", "/v1/chat/completions answered 200 with something that is not a JSON object")
    server.routes["/v1/chat/completions"] = (200, '{"choices": [{"message": {"content": ["parts"]}}]}', 0)
    refused("vllm_correctness", args, "case arith-1:", "choices[0].message.content that is not text")
    reference = tmp_path / "reference.json"
    reference.write_text('{"label": "old", "results": [{"id": "arith-1"}]}')
    refused("vllm_correctness", dict(args, reference=str(reference)), "has results without id, pass and answer",
            "run the reference label again")
    assert not (tmp_path / "results").exists()


def chunk(text):
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) + "\n\n"


def test_correctness_calls_a_tool_end_to_end_and_fails_a_reply_that_does_not(server, tmp_path):
    args = {"url": server.url, "model": "m", "label": "x", "results_dir": str(tmp_path / "results"), "stream_cases": 0, "tool_call": "always"}
    server.routes["/v1/chat/completions"] = (200, '{"choices": [{"message": {"content": "42"}}]}', 0)
    call = {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris, France"}'}}
    server.routes["/v1/chat/completions#tools"] = (200, json.dumps({"choices": [{"message": {"content": None, "tool_calls": [call]}}]}), 0)
    called = run("vllm_correctness", args)
    assert called.get("failed") is not True and called["tool_call"]["pass"] is True, called.get("msg")
    assert run("vllm_correctness", dict(args, tool_call="auto"))["tool_call"] is None, "no parser known for a bare url"
    server.routes["/v1/chat/completions#tools"] = (200, '{"choices": [{"message": {"content": "<tool_call>{get_weather"}}]}', 0)
    refused("vllm_correctness", args, "the tool-call case failed (the endpoint's parser): the model called no tool; it answered "
            "'<tool_call>{get_weather' (the parser found no call in it)")


def test_correctness_fails_when_a_streamed_answer_is_not_the_non_streamed_one(server, tmp_path):
    args = {"url": server.url, "model": "m", "label": "x", "results_dir": str(tmp_path / "results"), "stream_cases": 2}
    server.routes["/v1/models"] = (200, '{"data": [{"id": "m"}]}', 0)
    server.routes["/v1/chat/completions"] = (200, '{"choices": [{"message": {"content": "The answer is 42."}}]}', 0)
    server.routes["/v1/chat/completions#stream"] = (200, chunk("The answer") + chunk(" is 42.") + "data: [DONE]\n\n", 0)
    agreed = run("vllm_correctness", args)
    assert agreed.get("failed") is not True and (agreed["streamed"], agreed["stream_mismatches"]) == (2, []), agreed.get("msg")
    server.routes["/v1/chat/completions#stream"] = (200, chunk("The answer") + chunk(" 42 is.") + "data: [DONE]\n\n", 0)
    result = refused("vllm_correctness", args, "2 of 2 greedy answers differ when streamed (arith-1: 'The answer is 42.' streamed as "
                     "'The answer 42 is.'", "rerun on an idle instance")
    assert [m["id"] for m in result["stream_mismatches"]] == ["arith-1", "arith-2"]
    server.routes["/v1/chat/completions#stream"] = (200, chunk("The answer"), 0)
    refused("vllm_correctness", args, "case arith-1 streamed:", "the stream ended without [DONE]: it was cut short")


@pytest.mark.parametrize(
    ("output", "fragment", "staged_manifest", "damage"),
    [("Fetching [1/3] {garbled", "hf download --dry-run printed no JSON list of files but 'Fetching [1/3] {garbled'", "[1]",
      ".sparkfleet-manifest.json does not hold a manifest object"),
     ('[WARN] mirror slow\n[{"name": "config.json"}]', "hf download --dry-run printed no JSON list of files",
      json.dumps({"repo": "a/b", "revision": COMMIT, "files": ["config.json"]}),
      ".sparkfleet-manifest.json is damaged (its files are not a mapping of path to size and sha256)"),
     ("[]", "the hub lists no file for it; check the include patterns", None, None)],
    ids=["garbled", "wrong-shape", "empty"],
)
def test_model_stage_names_garbled_hf_output_and_a_damaged_manifest(tmp_path, output, fragment, staged_manifest, damage):
    tools = fake_tools(tmp_path / "bin", docker=output)
    models = tmp_path / "models"
    if staged_manifest:
        (models / "b").mkdir(parents=True)
        (models / "b" / ".sparkfleet-manifest.json").write_text(staged_manifest)
    result = refused("vllm_model_stage", {"repo": "a/b", "revision": COMMIT, "image": "img", "models_dir": str(models)},
                     f"listing a/b at {COMMIT} on the Hugging Face Hub failed: {fragment}", "nothing is staged", path=tools)
    assert result["damaged"] == ([damage] if damage else [])


def test_model_check_names_a_config_that_is_not_an_object(tmp_path):
    (tmp_path / "config.json").write_text("[1]")
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / ".sparkfleet-manifest.json").write_text('"damaged"')
    refused("vllm_model_check", {"path": str(tmp_path), "instance": "chat"},
            f"vllm_instances (chat).model: {tmp_path}/config.json is not a JSON object; the staged copy is damaged")


def test_model_check_gives_the_manifest_checksum_the_cluster_nodes_compare(tmp_path):
    """The cluster refuses ranks that would load different checkpoints by this checksum: it must be
    the manifest's bytes' SHA-256 (as stat gave it before), and None for a checkpoint without one."""
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 4096}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    found = run("vllm_model_check", {"path": str(tmp_path), "instance": "chat"})
    assert found["ok"] is True and found["manifest_sha256"] is None, found
    manifest = b'{"repo": "a/b", "files": {}}'
    (tmp_path / ".sparkfleet-manifest.json").write_bytes(manifest)
    found = run("vllm_model_check", {"path": str(tmp_path), "instance": "chat"})
    assert found["manifest_sha256"] == hashlib.sha256(manifest).hexdigest()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [({"bench": {"runs": [{"concurrency": "four", "output_throughput": "fast"}]}}, "bench.runs[0].concurrency: 'four' is not a stream count"),
     ({"bench": {"runs": [{"concurrency": 1}]}, "metrics": {"workload": {"requests": 5, "prompt_to_generation_ratio": "high"}}},
      "metrics.workload: not a workload profile")],
    ids=["run", "workload"],
)
def test_bench_report_names_registered_results_of_another_shape(tmp_path, args, fragment):
    refused("vllm_bench_report", {"dest": str(tmp_path / "report"), "title": "t", "plot": False, **args}, fragment)
    assert not (tmp_path / "report").exists()


def test_host_fact_modules_read_garbled_tools_without_a_traceback(tmp_path):
    garbled = {"nvidia-smi": "garbled, [N/A]\n\x01", "docker": "[1]", "systemctl": "Id\n=", "dpkg-query": "garbled\tline",
               "apt-get": "Inst"}
    tools = fake_tools(tmp_path / "bin", **garbled)
    facts = run("spark_facts", {"models_dir": str(tmp_path / "models")}, path=tools)
    assert facts.get("failed") is not True, facts.get("msg")
    assert facts["facts"]["docker"]["error"] == "docker info did not answer with its JSON object"
    assert facts["facts"]["gpu"]["present"] is False
    driver = run("nvidia_driver_info", {"simulate_upgrade": True}, path=tools)
    assert driver.get("failed") is not True, driver.get("msg")
    assert driver["packages"] == [] and driver["nvidia_smi_versions"] == [] and driver["upgrade_changes"] == []


def test_host_facts_carry_the_network_facts_the_boot_order_and_the_packages_in_the_same_read(tmp_path):
    """The plan's bind addresses and a cluster's fast link come from this read (no setup call): the
    names are setup's, read from this machine's real interfaces; the packages from its real dpkg."""
    dropin = tmp_path / "10-wait-online.conf"
    dropin.write_text("[Unit]\n")
    found = run("spark_facts", {"models_dir": str(tmp_path), "network": True, "docker_network_dropin": str(dropin),
                                "packages": ["bash", "sparkfleet-no-such-package"]})
    bash = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "bash"], capture_output=True, text=True, check=True).stdout
    assert found["facts"]["packages"] == {"bash": bash, "sparkfleet-no-such-package": None}
    network = found["ansible_facts"]
    assert "127.0.0.1" == network["ansible_lo"]["ipv4"]["address"]
    assert "lo" in network["ansible_interfaces"] and isinstance(network["ansible_all_ipv4_addresses"], list)
    assert "ansible_module_setup" not in network and "ansible_distribution" not in network
    assert found["facts"]["docker"]["waits_for_network"] is True
    assert found["facts"]["docker"]["client"] is os.path.exists("/usr/bin/docker")
    dropin.unlink()
    without = run("spark_facts", {"models_dir": str(tmp_path), "docker_network_dropin": str(dropin)})
    assert "ansible_facts" not in without and without["facts"]["docker"]["waits_for_network"] is False
    assert "rdma" not in without["facts"]


def test_host_facts_read_a_cluster_nodes_rdma_devices_in_the_same_read(tmp_path):
    """This machine has no RDMA: ibdev2netdev's recorded output of two Sparks stands in for it, a real
    process on the module's PATH; show_gids is missing, as on a host without the RDMA packages."""
    recorded = (pathlib.Path(__file__).parents[2] / "fixtures" / "fabric" / "ibdev2netdev_two_sparks.txt").read_text()
    tools = fake_tools(tmp_path / "bin", ibdev2netdev=recorded)
    found = run("spark_facts", {"models_dir": str(tmp_path), "rdma": True}, path=tools)
    assert found["facts"]["rdma"]["tools"] == {"ibdev2netdev": True, "show_gids": False}
    assert [link["device"] for link in found["facts"]["rdma"]["rdma_links"] if link["up"]] == ["rocep1s0f0", "roceP2p1s0f0"]


def test_driver_info_judges_the_flavour_and_the_kernel_line_the_board_asks_for(tmp_path):
    """No GPU or DGX OS here: dpkg-query and apt-get are real processes replaying the names DGX OS gives the
    proprietary modules and a 7.x kernel; the running kernel is this machine's own, off a line it cannot be on."""
    listing = ("nvidia-driver-580\t580.173.02-0ubuntu1\tinstalled\tok\n"
               "linux-image-6.17.0-1021-nvidia\t6.17.0-1021.21\tinstalled\tok\n"
               "linux-nvidia-hwe-24.04\t6.17.0-1021.21\tinstalled\tok")
    simulation = "Inst linux-image-7.0.0-1004-nvidia (7.0.0-1004.4 Ubuntu:24.04/noble-updates [arm64])"
    tools = fake_tools(tmp_path / "bin", **{"dpkg-query": listing, "apt-get": simulation})
    driver = run("nvidia_driver_info", {"simulate_upgrade": True, "flavour": "open", "kernel_line": "1.0"}, path=tools)
    assert driver["ok"] is False and driver["flavour"] == "open"
    assert driver["kernel"] == {"line": "1.0", "running": os.uname().release, "releases": ["6.17.0-1021-nvidia"],
                                "metapackages": ["linux-nvidia-hwe-24.04"],
                                "incoming": [{"name": "linux-image-7.0.0-1004-nvidia", "version": "7.0.0-1004.4",
                                              "release": "7.0.0-1004-nvidia"}]}
    joined = " | ".join(driver["reasons"])
    assert "proprietary kernel-module flavour are installed: nvidia-driver-580" in joined
    assert f"the running kernel {os.uname().release} is not on the 1.0 line" in joined
    assert "sudo apt-mark hold linux-nvidia-hwe-24.04" in joined
    either = run("nvidia_driver_info", {"simulate_upgrade": True}, path=tools)
    assert either["ok"] is True and either["kernel"]["line"] is None and either["flavour"] is None
    refused("nvidia_driver_info", {"kernel_line": "6.17.0"}, "kernel_line: '6.17.0' is not a kernel line", path=tools)


def test_image_release_refuses_what_it_cannot_read_without_a_traceback(tmp_path):
    """Docker may be absent, stopped or without the image here: each is a refusal naming the image and the fix (the real
    read, on the lab's images, is the serving scenario's)."""
    image = "127.0.0.1:5000/sparkfleet/no-such-image@sha256:" + "0" * 64
    refused("image_release", {"image": image, "engine": "vllm", "record_dir": str(tmp_path)},
            f"image {image} could not be inspected, so its release is unread", "pull it first")
    refused("image_release", {"image": image, "engine": "vllm", "timeout": 0}, "timeout: 0 must be 1 to 3600 seconds")
    refused("image_release", {"image": image, "engine": "sglang"}, "value of engine must be one of: vllm, litellm")
    assert list(tmp_path.iterdir()) == []


class Garbling(http.server.BaseHTTPRequestHandler):
    """A chat endpoint that answers every case right alone and garbles one answer in four while other requests are in
    flight (the first such, then every fourth): the corruption vllm 46669 shows (speculative decoding with async
    scheduling, concurrency above 1)."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        server = self.server
        with server.lock:
            server.in_flight += 1
            crowded = server.in_flight > 1
            if crowded:
                server.crowded_answers += 1
            garble = crowded and server.crowded_answers % 4 == 1
        # Long enough that the load check's requests overlap on a busy machine.
        time.sleep(0.3)
        right = server.answers[body["messages"][0]["content"]]
        content = server.garbled if garble else right
        payload = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        with server.lock:
            server.in_flight -= 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args):
        pass


@pytest.mark.parametrize("garbled", ["Lyon", "\ufffd\x07q\ufffd\ufffd\x01"], ids=["wrong-answer", "token-soup"])
def test_correctness_under_load_fails_a_server_that_garbles_answers_only_in_a_batch(tmp_path, garbled):
    cases = [{"id": f"capital-{n}", "prompt": f"Capital of country {n}?", "check": {"exact": f"City {n}"}} for n in range(3)]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbling)
    server.lock, server.in_flight, server.crowded_answers = threading.Lock(), 0, 0
    server.answers = {case["prompt"]: case["check"]["exact"] for case in cases}
    server.garbled = garbled
    args = {"url": f"http://127.0.0.1:{server.server_address[1]}", "model": "m", "label": "load", "builtin_cases": False,
            "cases": cases, "stream_cases": 0, "tool_call": "never", "results_dir": str(tmp_path), "load_concurrency": 4}
    with serving(server):
        alone = run("vllm_correctness", dict(args, load_concurrency=0))
        assert alone.get("failed") is not True and alone["passed"] == 3 and alone["load"] is None, alone.get("msg")
        result = refused("vllm_correctness", args, "went wrong with 4 requests in flight", "--no-async-scheduling")
    load = result["load"]
    assert (load["concurrency"], load["requests"]) == (4, 8)
    assert 1 <= len(load["corrupted"]) <= 3 and all(c["alone"].startswith("City ") for c in load["corrupted"])
    expected = "its known answer was right alone and wrong under load" if garbled == "Lyon" else "token soup"
    assert all(c["reason"].startswith(expected) for c in load["corrupted"]), load["corrupted"]
    assert sum(c["wrong"] for c in load["corrupted"]) == (server.crowded_answers + 3) // 4, "the first crowded answer, then every fourth"


def test_correctness_under_load_passes_a_server_that_answers_the_same_in_a_batch(server, tmp_path):
    server.routes["/v1/chat/completions"] = (200, '{"choices": [{"message": {"content": "The answer is 42."}}]}', 0.02)
    args = {"url": server.url, "model": "m", "label": "x", "results_dir": str(tmp_path), "stream_cases": 0, "load_concurrency": 3}
    steady = run("vllm_correctness", args)
    assert steady.get("failed") is not True, steady.get("msg")
    assert steady["load"] == {"concurrency": 3, "requests": 20, "corrupted": []}
    refused("vllm_correctness", dict(args, load_concurrency=1025), "load_concurrency is 1025", "at most 1024")
