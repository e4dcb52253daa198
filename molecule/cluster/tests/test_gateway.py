"""The lab gateway: a real LiteLLM proxy (the gateway role) on the first lab host in front of both
hosts' single-node tiny instances and the lab cluster's head. Requests are told apart by the
deployment LiteLLM names in each answer (x-litellm-model-id) and by the backends' own request
counters. Times printed are measurements for the log, not thresholds."""

import json
import os
import pathlib
import subprocess
import tempfile
import time

import pytest
from planted_images import litellm_release
from site_runner import INVENTORY, ROOT, assert_refused, bundle_leaks, deployed_secrets, docker_host, playbook, site, state_digest

GATEWAY, OTHER = "sparkfleet-molecule-node-1", "sparkfleet-molecule-node-2"
URL, CONFIG = "http://127.0.0.1:4000", "/etc/sparkfleet/gateway"
GATEWAY_KEY, BACKEND_KEY = os.environ["SPARKFLEET_LAB_GATEWAY_KEY"], os.environ["SPARKFLEET_LAB_API_KEY"]
ROUTE = {host: f"{host}/tiny/tiny/tiny" for host in (GATEWAY, OTHER)}


@pytest.fixture(scope="module")
def gateway():
    return docker_host(GATEWAY)


def ask(host, model="tiny", key=GATEWAY_KEY):
    """(HTTP status, deployment id, seconds) of one chat request through the gateway."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4, "temperature": 0})
    started = time.monotonic()
    result = host.run(f"curl -s -m 60 -o /dev/null -D - -w 'status=%{{http_code}}' -H 'Authorization: Bearer {key}' "
                      f"-H 'Content-Type: application/json' -d '{body}' {URL}/v1/chat/completions")
    headers = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in result.stdout.splitlines() if ":" in line}
    return result.stdout.rsplit("status=", 1)[-1], headers.get("x-litellm-model-id"), round(time.monotonic() - started, 2)


def served_requests(host):
    """The tiny instance's own count of finished requests (vLLM's /metrics on the host)."""
    text = host.check_output("curl -s http://127.0.0.1:8001/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total{"))


def gateway_state(host):
    return state_digest(host, [f"{CONFIG}/plan.json", f"{CONFIG}/drained.json", f"{CONFIG}/litellm/config.yaml", f"{CONFIG}/gateway.env"],
                        ["docker inspect --format '{{.Id}} {{.State.StartedAt}}' sparkfleet-gateway"])


def run_hook(name, host):
    """The sweep's drain or undrain hook (playbooks/tasks/), included from a play on one serving host."""
    with tempfile.TemporaryDirectory() as folder:
        play = pathlib.Path(folder) / "hook.yml"
        play.write_text(json.dumps([{"name": "Run the hook", "hosts": host, "gather_facts": False, "tasks": [
            {"name": "Include it", "ansible.builtin.include_tasks": str(ROOT / "playbooks" / "tasks" / f"gateway_{name}.yml")}]}]))
        return subprocess.run(["ansible-playbook", "-i", str(INVENTORY), str(play)], capture_output=True, text=True, cwd=ROOT, check=False)


def test_the_gateway_routes_every_group_and_keeps_its_keys_secret(gateway):
    assert gateway.run(f"curl -s -o /dev/null -w '%{{http_code}}' {URL}/v1/models").stdout == "401"
    listed = json.loads(gateway.check_output(f"curl -s -H 'Authorization: Bearer {GATEWAY_KEY}' {URL}/v1/models"))
    assert sorted(entry["id"] for entry in listed["data"]) == ["fast", "tiny", "tiny-tp2"]
    status, deployment, seconds = ask(gateway, "tiny-tp2")
    assert (status, deployment) == ("200", f"{GATEWAY}/lab-tp2/tiny-tp2/tiny-tp2"), "the cluster answers through its head"
    config = json.loads(gateway.file(f"{CONFIG}/litellm/config.yaml").content_string.split("\n", 1)[1])
    bases = sorted({d["litellm_params"]["api_base"] for d in config["model_list"]})
    other_address = docker_host(OTHER).interface("eth0").addresses[0]
    assert bases == ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8010/v1", f"http://{other_address}:8001/v1"]
    env = gateway.file(f"{CONFIG}/gateway.env")
    assert (env.user, env.mode) == ("root", 0o600) and f"LITELLM_MASTER_KEY={GATEWAY_KEY}\n" in env.content_string
    for path in (f"{CONFIG}/litellm/config.yaml", f"{CONFIG}/plan.json", f"{CONFIG}/unit-plan.json", "/etc/systemd/system/sparkfleet-gateway.service"):
        text = gateway.file(path).content_string
        assert GATEWAY_KEY not in text and BACKEND_KEY not in text, path
    inspected = json.loads(gateway.check_output("docker inspect sparkfleet-gateway"))[0]
    assert GATEWAY_KEY not in " ".join(inspected["Args"])
    # Relaunched through the serving transaction: its container carries the planned hash, and the unit
    # that passed its gate is kept as the last good one; its keys are not (a rollback keeps the keys of now).
    unit_plan = json.loads(gateway.file(f"{CONFIG}/unit-plan.json").content_string)
    assert inspected["Config"]["Labels"]["sparkfleet.vllm.config-hash"] == unit_plan["config_hash"]
    unit = gateway.file("/etc/systemd/system/sparkfleet-gateway.service").content_string
    assert gateway.file(f"{CONFIG}/last-good/sparkfleet-gateway.service").content_string == unit
    assert not gateway.file(f"{CONFIG}/last-good/gateway.env").exists
    assert gateway.run("systemctl is-enabled sparkfleet-gateway.service").stdout.strip() == "enabled"
    print(f"\ncluster through the gateway: {seconds} s")


def test_litellms_admin_ui_and_api_docs_are_off(gateway):
    """Measured before: the OpenAPI document, /docs and /redoc, and the admin UI's SSO key page answered anyone.
    Off by default now (gateway_admin_ui, gateway_api_docs)."""
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert gateway.run(f"curl -s -o /dev/null -w '%{{http_code}}' {URL}{path}").stdout == "404", path
    assert "Admin UI is Disabled" in gateway.check_output(f"curl -s {URL}/sso/key/generate")


def run_hooks(host):
    """The drain hook and the undrain hook of one run (playbooks/tasks/), as the bench and the sweep include them."""
    with tempfile.TemporaryDirectory() as folder:
        play = pathlib.Path(folder) / "hooks.yml"
        play.write_text(json.dumps([{"name": "Run the hooks", "hosts": host, "gather_facts": False, "tasks": [
            {"name": f"Include the {name} hook", "ansible.builtin.include_tasks": str(ROOT / "playbooks" / "tasks" / f"gateway_{name}.yml"),
             "vars": {"gateway_hook_name": "bench"}} for name in ("drain", "undrain")]}]))
        return subprocess.run(["ansible-playbook", "-i", str(INVENTORY), str(play)], capture_output=True, text=True, cwd=ROOT, check=False)


def started_at(gateway):
    return gateway.check_output("docker inspect --format '{{.State.StartedAt}}' sparkfleet-gateway")


def test_a_drained_node_gets_no_request_and_comes_back_when_undrained(gateway):
    """A hook's run drains the other host (its own drain, hook@...); the operator drains it too, and another hook's run
    (drain and undrain in one play) releases only its own drain and says who keeps the host out; refused drains change
    nothing; the operator's undrain puts the host back whoever drained it. Two LiteLLM restarts in all: a drain or an
    undrain that changes no route leaves its config as it was, so LiteLLM is not restarted for it."""
    other = docker_host(OTHER)
    routes = {ask(gateway)[1] for _request in range(16)}
    assert routes == set(ROUTE.values()), f"both hosts serve the group before the drain: {routes}"

    started = time.monotonic()
    drained = run_hook("drain", OTHER)
    assert drained.returncode == 0, drained.stdout[-3000:]
    drain_seconds = round(time.monotonic() - started, 1)
    record = json.loads(gateway.file(f"{CONFIG}/drained.json").content_string)
    assert (record["schema_version"], record["drained"], list(record["owners"])) == (2, [OTHER], [OTHER]), record
    assert len(record["owners"][OTHER]) == 1 and record["owners"][OTHER][0].startswith("hook@"), "the hook's run owns its drain"
    hook_run = record["owners"][OTHER][0]
    before = served_requests(other)
    answers = [ask(gateway, model) for model in ["tiny", "fast"] * 6]
    assert all(status == "200" for status, _d, _s in answers), answers
    assert {deployment.rsplit("/", 1)[0] for _s, deployment, _t in answers} == {ROUTE[GATEWAY].rsplit("/", 1)[0]}
    assert served_requests(other) == before, "no request reaches the drained node"

    # Draining the other host too would leave every group empty: refused, nothing changed.
    state = gateway_state(gateway)
    refused = playbook("gateway.yml", "-e", json.dumps({"gateway_drain": [GATEWAY]}))
    assert_refused(refused, f"gateway drain: draining {GATEWAY} leaves model group(s) fast, tiny, tiny-tp2 with nothing to route to")
    assert gateway_state(gateway) == state
    unknown = playbook("gateway.yml", "-e", json.dumps({"gateway_undrain": [f"{OTHER}/nothing"]}))
    assert_refused(unknown, f"gateway drain: '{OTHER}/nothing' is not a backend of this gateway")
    assert gateway_state(gateway) == state

    container = started_at(gateway)
    operator = playbook("gateway.yml", "-e", json.dumps({"gateway_drain": [OTHER]}))
    assert operator.returncode == 0, operator.stdout[-3000:]
    hooks = run_hooks(OTHER)
    assert hooks.returncode == 0, hooks.stdout[-3000:]
    assert f"{OTHER} stays out of rotation: drained by {hook_run}, operator" in hooks.stdout + hooks.stderr, hooks.stdout[-3000:]
    record = json.loads(gateway.file(f"{CONFIG}/drained.json").content_string)
    assert (record["drained"], record["owners"]) == ([OTHER], {OTHER: [hook_run, "operator"]}), record
    assert started_at(gateway) == container, "no route changed, so LiteLLM was not restarted"
    assert {ask(gateway)[1] for _request in range(8)} == {ROUTE[GATEWAY]}, "still out of rotation after the second run's undrain"

    started = time.monotonic()
    undrained = playbook("gateway.yml", "-e", json.dumps({"gateway_undrain": [OTHER]}))
    assert undrained.returncode == 0, undrained.stdout[-3000:]
    undrain_seconds = round(time.monotonic() - started, 1)
    assert json.loads(gateway.file(f"{CONFIG}/drained.json").content_string)["drained"] == [], "the operator's undrain releases every owner"
    before = served_requests(other)
    routes = [ask(gateway)[1] for _request in range(16)]
    assert set(routes) == set(ROUTE.values()), routes
    assert served_requests(other) >= before + routes.count(ROUTE[OTHER])
    again = run_hook("undrain", OTHER)
    assert again.returncode == 0 and "changed=0" in again.stdout.split("PLAY RECAP")[1], again.stdout[-2000:]
    print(f"\ndrain (sweep hook, gateway restarted and routing): {drain_seconds} s; undrain (playbooks/gateway.yml): {undrain_seconds} s; "
          f"after the undrain {routes.count(ROUTE[OTHER])} of 16 requests went to {OTHER}")


def test_bench_measures_its_instance_out_of_its_gateways_rotation(gateway, tmp_path):
    """bench.yml drains the measured instance (not its host, whose other units keep serving) at its gateway first and
    undrains it after, as the sweep and the rollout do."""
    settings = {"bench_instance": "tiny", "bench_label": "drained", "bench_dataset": "random", "bench_concurrencies": [1],
                "bench_prompts_per_concurrency": 1, "bench_input_tokens": 64, "bench_output_tokens": 8, "bench_correctness_max_tokens": 8,
                "bench_report_dir": str(tmp_path)}
    started = time.monotonic()
    result = playbook("bench.yml", "-e", json.dumps(settings), limit=OTHER)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    routed = [section for section in result.stdout.split("TASK [")[1:] if section.startswith("sparkfleet.vllm.gateway : Drain or undrain at each gateway]")]
    assert len(routed) == 2 and all(f"changed: [{OTHER} -> {GATEWAY}]" in section for section in routed), routed
    assert f"Find the gateways routing to {OTHER}/tiny]" in result.stdout, "the hook names the measured unit, not its host"
    assert json.loads(gateway.file(f"{CONFIG}/drained.json").content_string)["drained"] == []
    assert json.loads((tmp_path / OTHER / "drained" / "report.json").read_text())["runs"][0]["completed"] == 1
    print(f"\nbench.yml on {OTHER}, drained at the gateway and undrained after: {time.monotonic() - started:.1f} s")


def pause(host, container):
    """docker pause freezes the container's cgroup. On a busy machine the freezer can give up while a
    task sleeps uninterruptibly ("unable to freeze", seen in a suite run beside other work); the
    container is thawed again and a later try freezes it."""
    for _attempt in range(5):
        result = host.run(f"docker pause {container}")
        if result.rc == 0:
            return
        assert "unable to freeze" in result.stderr, result.stderr
        time.sleep(3)
    raise AssertionError(f"docker pause {container}: the freezer gave up five times: {result.stderr}")


def test_a_node_that_stops_answering_leaves_rotation(gateway):
    other = docker_host(OTHER)
    pause(other, "vllm-tiny")
    try:
        answers = [ask(gateway) for _request in range(8)]
    finally:
        other.run_expect([0], "docker unpause vllm-tiny")
    assert all(status == "200" for status, _d, _s in answers), answers
    assert {deployment for _s, deployment, _t in answers} == {ROUTE[GATEWAY]}
    print(f"\nwith {OTHER}'s instance paused, seconds per request through the gateway: {[seconds for _s, _d, seconds in answers]}")


def test_the_gateway_hosts_diagnostics_bundle_holds_none_of_its_keys(gateway, tmp_path):
    """The gateway's master key and the backends' keys (its env file, mode 0600), the instances' and the cluster rank's
    API keys: none in any member of the bundle diagnose.yml brings from the gateway's host."""
    result = playbook("diagnose.yml", "-e", json.dumps({"diagnose_dir": str(tmp_path)}), limit=GATEWAY)
    assert "watchdog/bundles' path due to" not in result.stdout + result.stderr, "a host with no give-up bundle is no warning"
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    secrets = deployed_secrets(gateway)
    assert {GATEWAY_KEY, BACKEND_KEY} <= set(secrets.values()), sorted(secrets)
    bundles = list(tmp_path.rglob("*.tar.gz"))
    assert bundles, result.stdout[-2000:]
    for bundle in bundles:
        members, leaks = bundle_leaks(bundle, secrets)
        assert any("/plans/gateway/" in name for name in members), sorted(members)
        assert not leaks, f"{bundle.name}: keys found in {leaks}"


def test_a_compromised_litellm_release_is_refused_at_its_pull_whatever_is_acknowledged(gateway):
    """LiteLLM 1.82.7 on PyPI was a supply-chain compromise: an image carrying it (planted in the lab registry) is refused
    even with every advisory of the floor table acknowledged, and the running gateway is left as it was."""
    image = litellm_release("litellm-1.82.7", "1.82.7")
    before = gateway_state(gateway)
    result = site("--tags", "gateway", "-e", json.dumps({"gateway_image": image, "gateway_accepted_advisories": ["CVE-2026-59822", "CVE-2026-49468"]}))
    assert_refused(result, "carries LiteLLM 1.82.7: a supply-chain compromise of LiteLLM's PyPI release",
                   "No acknowledgement runs it; pin an image of another release (LiteLLM 1.84.0 or newer)")
    assert gateway_state(gateway) == before
    assert ask(gateway)[0] == "200", "the gateway serves on"
