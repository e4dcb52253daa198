"""The diagnostics bundle against a host replayed from recordings: plan and env files with generated
keys in tmp_path, commands answered from recorded outputs, and every member of the tarball read back.

Where a recording stands in for a tool this machine lacks (a GPU, RDMA, a serving host's journal), the
recording says where it comes from."""

import builtins
import gzip
import http.server
import json
import os
import pathlib
import secrets
import shlex
import stat
import tarfile
import time

import pytest
from threaded_server import serving

from ansible_collections.sparkfleet.vllm.plugins.module_utils._diagnose import (
    MISSING,
    REDACTED,
    STACK_FILES_KEPT,
    STACK_PROCESSES,
    DiagnoseError,
    bundle_path,
    collect_bundle,
    config_dir_problems,
    config_folders,
    env_secrets,
    http_get,
    plan_secrets,
    redact_args,
    run_command,
    save_engine_stacks,
    scrub,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_paths import PY_SPY
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import exec_line

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
# Recorded on a lab host (Debian 12, Docker 20.10.24): tests/unit/fixtures/serving_unit/README.md.
INSPECT_RUNNING = (FIXTURES / "serving_unit" / "docker-container-inspect-running.json").read_text()
INSPECT_MISSING = (FIXTURES / "serving_unit" / "docker-container-inspect-missing.stderr").read_text()
LOGS_BAD_FLAG = (FIXTURES / "serving_unit" / "docker-logs-bad-flag.stderr").read_text()
SHOW_ACTIVE = (FIXTURES / "serving_unit" / "systemctl-show-active-enabled.txt").read_text()
METRICS = (FIXTURES / "vllm-0.32-cpu" / "metrics-ngram-before-bench.txt").read_text()
# Public DGX Spark and ConnectX recordings: tests/unit/fixtures/fabric/README.md.
IBDEV2NETDEV = (FIXTURES / "fabric" / "ibdev2netdev_two_sparks.txt").read_text()
SHOW_GIDS = (FIXTURES / "fabric" / "show_gids_roce.txt").read_text()
# Recorded on this suite's machine (Debian 12, no GPU, no systemd as PID 1, no kernel journal).
UNAME = "Linux vm 6.18.44-fc-v1147 #1 SMP PREEMPT_DYNAMIC @0 x86_64 GNU/Linux\n"
IP_BR_ADDR = "lo               UNKNOWN        127.0.0.1/8 ::1/128 \neth0             UP             192.0.2.2/24 fd00::2/64 fe80::fc:ff:fe00:1/64 \n"
JOURNAL_NO_KERNEL = (0, "-- No entries --\n", "No journal files were found.\n")
DPKG_NOTHING = (1, "", "dpkg-query: no packages found matching nvidia-*\ndpkg-query: no packages found matching cuda-*\n")
IMAGES = ("REPOSITORY                           TAG                 DIGEST                                                                    IMAGE ID"
          "                                                                  CREATED       SIZE\n"
          "127.0.0.1:5000/sparkfleet/vllm-cpu   2ac8b4ccc169        sha256:24ec098e1216f5d76e6c83fbc90359e24f37ba8342b05e586a0e8d1a64d2e631   "
          "sha256:4867721b336432981d56da9d7af9c351010f97a0d7b2a28e503becc7dea999e0   9 hours ago   2.68GB\n")
# Stand-ins in the tools' formats, for what this machine cannot produce: a serving host's kernel journal
# (the OOM killer's and NVIDIA's NVRM/Xid lines as the kernel prints them), systemd 252's list-units, a
# GB10's nvidia-smi -q and apt holds.
KERNEL_JOURNAL = """\
2026-12-04T09:12:01+0000 spark-1 kernel: r8169 0000:01:00.0 enP7s7: Link is Up - 1Gbps/Full
2026-12-04T09:40:17+0000 spark-1 kernel: python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0
2026-12-04T09:40:17+0000 spark-1 kernel: Out of memory: Killed process 48213 (python3) total-vm:131642048kB, anon-rss:118423552kB
2026-12-04T09:41:02+0000 spark-1 kernel: NVRM: Xid (PCI:000f:01:00): 31, pid=48213, name=python3, Ch 00000008, intr 00000000
2026-12-04T09:41:05+0000 spark-1 kernel: docker0: port 1(veth3f2a1b0) entered disabled state
"""
LIST_UNITS = """\
UNIT                           LOAD   ACTIVE SUB     DESCRIPTION
sparkfleet-cluster-big.service loaded active running vLLM cluster big rank 0 (sparkfleet.vllm)
sparkfleet-vllm-tiny.service   loaded active running vLLM instance tiny (sparkfleet.vllm)
sparkfleet-watchdog.service    loaded active running sparkfleet.vllm watchdog

LOAD   = Reflects whether the unit definition was properly loaded.
ACTIVE = The high-level unit activation state, i.e. generalization of SUB.
SUB    = The low-level unit activation state, values depend on unit type.
3 loaded units listed.
"""
NVIDIA_SMI_Q = """\
==============NVSMI LOG==============

Timestamp                                 : Thu Dec  4 09:45:00 2026
Driver Version                            : 580.95.05
CUDA Version                              : 13.0

Attached GPUs                             : 1
GPU 0000000F:01:00.0
    Product Name                          : NVIDIA GB10
"""
HOLDS = "nvidia-driver-580-open\nlinux-image-nvidia-hwe-24.04\n"

# Recorded on a lab host serving the suite's CPU vLLM: tests/unit/fixtures/py_spy/README.md.
STACK_FIXTURES = FIXTURES / "py_spy"
DOCKER_TOP = (STACK_FIXTURES / "docker-top-vllm-tiny.txt").read_text()
DUMPS = {"2317": (0, (STACK_FIXTURES / "dump-2317.txt").read_text(), ""),
         "2583": (1, "", (STACK_FIXTURES / "dump-not-python.stderr").read_text()),
         "2584": (0, (STACK_FIXTURES / "dump-2584.txt").read_text(), "")}


@pytest.fixture
def keys():
    return {name: secrets.token_urlsafe(32) for name in ("api", "old_api", "hf", "cluster", "master", "backend", "unlisted", "container_only")}


@pytest.fixture
def config(tmp_path, keys):
    """The three config folders as the roles write them, each env file 0600."""
    vllm, cluster, gateway = (tmp_path / "etc" / name for name in ("vllm", "cluster", "gateway"))
    for folder in (vllm / "last-good", cluster / "last-good", gateway / "last-good", gateway / "litellm"):
        folder.mkdir(parents=True)

    def plan(folder, name, **extra):
        unit, container = extra.pop("unit"), extra.pop("container")
        (folder / f"{name}.json").write_text(json.dumps({
            "schema_version": 1, "name": name, "unit": unit, "container": container,
            "env_path": str(folder / f"{name}.env"), "plan_path": str(folder / f"{name}.json"),
            "env_names": ["VLLM_API_KEY", "HF_TOKEN"], **extra}, indent=2))

    def env(path, text):
        path.write_text(text)
        path.chmod(0o600)

    plan(vllm, "tiny", unit="sparkfleet-vllm-tiny.service", container="vllm-tiny", url="http://127.0.0.1:8001", cluster=None)
    plan(vllm / "last-good", "tiny", unit="sparkfleet-vllm-tiny.service", container="vllm-tiny", url="http://127.0.0.1:8001", cluster=None)
    env(vllm / "tiny.env", f"VLLM_API_KEY={keys['api']}\nHF_TOKEN={keys['hf']}\nVLLM_ENABLE_V1_MULTIPROCESSING=0\n")
    env(vllm / "last-good" / "tiny.env", f"VLLM_API_KEY={keys['old_api']}\n")
    plan(cluster, "big", unit="sparkfleet-cluster-big.service", container="vllm-cluster-big", url="http://10.0.0.1:8100",
         cluster={"rank": 0, "head": True, "nnodes": 2})
    env(cluster / "big.env", f"VLLM_API_KEY={keys['cluster']}\n")
    (gateway / "plan.json").write_text(json.dumps({"schema_version": 1, "url": "http://127.0.0.1:4000", "deployments": [
        {"model_name": "tiny", "litellm_params": {"api_base": "http://127.0.0.1:8001/v1", "api_key": "os.environ/SPARKFLEET_TINY_KEY"}}]}))
    (gateway / "unit-plan.json").write_text(json.dumps({"schema_version": 1, "kind": "gateway", "name": "gateway",
                                                        "unit": "sparkfleet-gateway.service", "container": "sparkfleet-gateway",
                                                        "url": "http://127.0.0.1:4000"}))
    (gateway / "litellm" / "config.yaml").write_text(
        "model_list:\n  - model_name: tiny\n    litellm_params:\n      api_key: os.environ/SPARKFLEET_TINY_KEY\n")
    env(gateway / "gateway.env", f"LITELLM_MASTER_KEY={keys['master']}\nSPARKFLEET_TINY_KEY={keys['api']}\n"
                                 f"SPARKFLEET_OLD_KEY={keys['backend']}\n")
    return [str(vllm), str(cluster), str(gateway)]


def inspect_with_keys(keys):
    """The recorded container, as if started with its key in the environment and on the command line."""
    container = json.loads(INSPECT_RUNNING)
    config = container[0]["Config"]
    config["Env"] = [f"VLLM_API_KEY={keys['api']}" if entry.startswith("VLLM_API_KEY=") else entry for entry in config["Env"]]
    config["Env"] += [f"HF_TOKEN={keys['hf']}", f"WANDB_API_KEY={keys['container_only']}"]
    config["Cmd"].append(f"--api-key={keys['api']}")
    container[0]["Args"] += ["--api-key", keys["api"]]
    return json.dumps(container, indent=4)


class Host:
    """A fake Runner: answers each command from the recordings, records the calls; `overrides` maps an
    argv prefix (a tuple) to a result or to a callable of (argv, timeout)."""

    def __init__(self, keys, overrides=None):
        self.keys, self.calls = keys, []
        self.overrides = overrides or {}

    def __call__(self, argv, timeout):
        self.calls.append((argv, timeout))
        for prefix, answer in self.overrides.items():
            if tuple(argv[:len(prefix)]) == prefix:
                return answer(argv, timeout) if callable(answer) else answer
        return self.answer(argv)

    def answer(self, argv):
        keys, command = self.keys, " ".join(argv)
        if argv[0] == "systemctl":
            if argv[1] == "list-units":
                return 0, LIST_UNITS, ""
            # A unit whose ExecStart shows a key no env file names: caught by its shape alone.
            return 0, SHOW_ACTIVE + f"ExecStart={{ path=/usr/bin/docker ; argv[]=/usr/bin/docker run vllm serve --api-key {keys['unlisted']} }}\n", ""
        if command.startswith("journalctl -k -b 0"):
            return 0, KERNEL_JOURNAL, ""
        if command.startswith("journalctl -k -b -1"):
            return 1, "", "Specifying boot ID or boot offset has no effect, no persistent journal was found.\n"
        if argv[0] == "journalctl":
            # The readiness wait once printed the header it sent.
            return 0, f"2026-12-04T09:00:01+0000 spark-1 python3[812]: GET /v1/models Authorization: Bearer {keys['api']} -> 200\n", ""
        if argv[1:3] == ["inspect", "vllm-tiny"]:
            return 0, inspect_with_keys(keys), ""
        if argv[1:2] == ["inspect"]:
            return 1, "[]\n", INSPECT_MISSING
        if argv[1:2] == ["logs"]:
            # vLLM prints its non-default arguments at start, a key given as --api-key among them; a library
            # prints a key only the container's environment holds.
            return 0, "", LOGS_BAD_FLAG + (f"INFO 12-04 09:00:00 [utils.py:253] non-default args: {{'api_key': ['{keys['api']}']}}\n"
                                           f"wandb: using the key {keys['container_only']}\n")
        if argv[1:3] == ["image", "ls"]:
            return 0, IMAGES, ""
        if argv[1:3] == ["top", "vllm-tiny"]:
            return 0, DOCKER_TOP, ""
        if argv[1:2] == ["top"]:
            return 1, "", f"Error response from daemon: No such container: {argv[2]}\n"
        answers = {"uname": (0, UNAME, ""), "dpkg-query": DPKG_NOTHING, "apt-mark": (0, HOLDS, ""), "ip": (0, IP_BR_ADDR, ""),
                   "ibdev2netdev": (0, IBDEV2NETDEV, ""), "show_gids": (0, SHOW_GIDS, ""), "nvidia-smi": (0, NVIDIA_SMI_Q, "")}
        if argv[0] == "cat":
            return (0, "console=ttyS0 quiet reboot=k panic=1\n", "") if argv[1] == "/proc/cmdline" else (1, "", f"cat: {argv[1]}: No such file or directory\n")
        if argv[0] == "nvidia-bug-report.sh":
            # The script gzips its log under the name given plus .gz; its process list shows the container's command line.
            pathlib.Path(argv[2] + ".gz").write_bytes(gzip.compress(
                f"*** ps ax\n 4242 ?  Sl  0:12 /opt/vllm/bin/python3 /opt/vllm/bin/vllm serve /models/tiny --api-key {keys['api']}\n".encode()))
            return 0, "nvidia-bug-report.sh will now collect information about your system\n", ""
        return answers.get(argv[0], (MISSING, "", f"{argv[0]} is not installed"))


def fetch(url, timeout):
    return (200, METRICS) if url == "http://127.0.0.1:8001/metrics" else (None, f"{url}: timed out")


def read_bundle(path):
    with tarfile.open(path) as archive:
        return {member.name.split("/", 1)[1]: archive.extractfile(member).read() for member in archive.getmembers()}


def bundle(tmp_path, config, host, **options):
    destination = str(tmp_path / "diagnostics" / "sparkfleet-diagnose-spark-1-20261204T094500Z.tar.gz")
    result = collect_bundle(destination, config, 60, host, fetch, **{"stacks_dir": str(tmp_path / "no-stacks"), **options})
    return result, read_bundle(destination)


def test_no_key_in_any_member(tmp_path, config, keys):
    result, members = bundle(tmp_path, config, Host(keys))
    assert set(members) == set(result["members"])
    for name, data in members.items():
        for key_name, key in keys.items():
            assert key.encode() not in data, f"{key_name} key in {name}"
    # The members that held keys are there, redacted, not left out.
    assert f"Bearer {REDACTED}".encode() in members["units/sparkfleet-vllm-tiny.service.journal.txt"]
    assert f"'api_key': ['{REDACTED}']".encode() in members["containers/vllm-tiny.log"]
    assert f"wandb: using the key {REDACTED}".encode() in members["containers/vllm-tiny.log"]
    assert f"--api-key {REDACTED}".encode() in members["units/sparkfleet-vllm-tiny.service.show.txt"]
    assert f"--api-key {REDACTED}".encode() in members["nvidia/nvidia-bug-report.log"]


def no_value_in_any_member(members, values):
    for name, data in members.items():
        for label, value in values.items():
            assert value.encode() not in data, f"{label} in {name}"


def with_args(path, args):
    """A plan file as the vllm role writes it, its command line carrying `args` as extra arguments: in docker_run,
    serve_args and the unit file's Exec line (systemd's quoting)."""
    plan = json.loads(path.read_text())
    run = ["/usr/bin/docker", "run", "--name", plan["container"], "--env-file", plan["env_path"], "image@sha256:" + "ab" * 32,
           "/models/tiny", "--port", "8000", *args]
    path.write_text(json.dumps({**plan, "serve_args": ["/models/tiny", "--port", "8000", *args], "docker_run": run,
                                "unit_file": "[Service]\nExecStart=" + exec_line(run) + "\nRestart=on-failure\n"}, indent=2))
    return run


def container_gone(keys, run):
    """The host once the container is gone: docker inspect knows nothing, the unit's state and journal show the
    command line it ran (systemd's argv[], the readiness wait's log)."""
    return Host(keys, {
        ("/usr/bin/docker", "inspect"): (1, "[]\n", INSPECT_MISSING),
        ("/usr/bin/docker", "logs"): (1, "", "Error response from daemon: No such container: vllm-tiny\n"),
        ("systemctl", "show"): (0, SHOW_ACTIVE + f"ExecStart={{ path=/usr/bin/docker ; argv[]={' '.join(run)} }}\n", ""),
        ("journalctl", "-u"): (0, f"2026-12-04T09:00:01+0000 spark-1 docker[811]: {shlex.join(run)}\n", ""),
    })


TOKEN_SPELLINGS = {
    "two arguments": lambda token: ["--hf-token", token],
    "equals": lambda token: [f"--hf-token={token}"],
    "abbreviated": lambda token: ["--hf-tok", token],
    "abbreviated equals, underscore": lambda token: [f"--hf_t={token}"],
    "api key": lambda token: ["--api-key", token],
    "api key abbreviated equals": lambda token: [f"--api-ke={token}"],
    "two api keys": lambda token: ["--api_key", token, token[::-1]],
    "shortest prefix": lambda token: ["--ap", token],
    "odd characters": lambda token: ["--hf-token", f"{token}%$\"'"],
}


@pytest.mark.parametrize("spelling", TOKEN_SPELLINGS.values(), ids=TOKEN_SPELLINGS.keys())
def test_a_token_in_a_plans_extra_arguments_leaves_no_member_once_the_container_is_gone(tmp_path, config, keys, spelling):
    # Without a trailing dash: reversed ("two api keys"), a value starting with one is an option to argparse, never a key
    # vLLM reads, and the scrub reads the arguments as argparse does.
    token = "hf_" + secrets.token_urlsafe(24).rstrip("-")
    args = spelling(token)
    vllm = tmp_path / "etc" / "vllm"
    run = with_args(vllm / "tiny.json", args)
    with_args(vllm / "last-good" / "tiny.json", args)
    _result, members = bundle(tmp_path, config, container_gone(keys, run))
    values = {f"argument {index}": arg for index, arg in enumerate(args) if len(arg) >= 8 and not arg.startswith("--")}
    no_value_in_any_member(members, {**keys, "token": token, **values})
    assert REDACTED.encode() in members["plans/vllm/tiny.json"] and REDACTED.encode() in members["plans/vllm/last-good/tiny.json"]
    # The rest of the plan stays readable.
    assert json.loads(members["plans/vllm/tiny.json"])["container"] == "vllm-tiny"


def test_a_token_only_in_a_last_good_copy_is_scrubbed_from_every_member(tmp_path, config, keys):
    token = "hf_" + secrets.token_urlsafe(24)
    run = with_args(tmp_path / "etc" / "vllm" / "last-good" / "tiny.json", ["--hf-token", token])
    _result, members = bundle(tmp_path, config, container_gone(keys, run))
    no_value_in_any_member(members, {**keys, "token": token})
    assert b"--hf-token" in members["units/sparkfleet-vllm-tiny.service.journal.txt"]


def test_a_host_configured_outside_the_defaults_gets_its_plans_and_its_keys_scrubbed(tmp_path, keys):
    folder = tmp_path / "srv" / "models-a"
    (folder / "last-good").mkdir(parents=True)
    plan = {"schema_version": 1, "name": "alpha", "unit": "sparkfleet-vllm-alpha.service", "container": "vllm-alpha",
            "url": "http://127.0.0.1:8003", "cluster": None}
    (folder / "alpha.json").write_text(json.dumps(plan))
    found = {name: secrets.token_urlsafe(24) for name in ("api", "operator", "old_api")}
    (folder / "alpha.env").write_text(f"VLLM_API_KEY={found['api']}\nGITHUB_PAT={found['operator']}\nNCCL_SOCKET_IFNAME=enp1s0f0np0\n")
    (folder / "last-good" / "alpha.env").write_text(f"VLLM_API_KEY={found['old_api']}\n")
    printed = " ".join(found.values())
    host = Host(keys, {("journalctl", "-u"): (0, f"2026-12-04T09:00:01+0000 spark-1 python3[812]: keys {printed}\n", ""),
                       ("/usr/bin/docker", "logs"): (0, f"INFO using {found['operator']}\n", "")})

    def metrics(url, timeout):
        return (200, f'vllm:build_info{{token="{found["api"]}"}} 1.0\n') if url == "http://127.0.0.1:8003/metrics" else (None, "no")

    destination = tmp_path / "out" / "b.tar.gz"
    result = collect_bundle(str(destination), [str(folder)], 60, host, metrics)
    members = read_bundle(destination)
    assert "plans/models-a/alpha.json" in members and "metrics/models-a-alpha.txt" in members
    assert {argv[2] for argv, _timeout in host.calls if argv[1:2] == ["inspect"]} == {"vllm-alpha"}
    no_value_in_any_member(members, found)
    assert members["metrics/models-a-alpha.txt"] == f'vllm:build_info{{token="{REDACTED}"}} 1.0\n'.encode()
    assert json.loads(members["MANIFEST.json"])["config_dirs"] == [str(folder)] and not result["problems"]


def test_public_knobs_stay_readable_while_every_key_goes(tmp_path, config, keys):
    cluster = tmp_path / "etc" / "cluster" / "big.env"
    cluster.write_text(cluster.read_text() + "NCCL_SOCKET_IFNAME=enp1s0f0np0\nVLLM_HOST_IP=192.168.100.10\n")
    _result, members = bundle(tmp_path, config, Host(keys))
    no_value_in_any_member(members, keys)
    assert b"rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)" in members["fabric.txt"]


def test_a_key_that_contains_another_goes_whole(tmp_path, config, keys):
    longer = keys["api"] + "-rotated"
    gateway = tmp_path / "etc" / "gateway" / "gateway.env"
    gateway.write_text(gateway.read_text() + f"SPARKFLEET_BACKEND_KEY_2={longer}\n")
    host = Host(keys, {("journalctl", "-u"): (0, f"key {longer} end\n", "")})
    _result, members = bundle(tmp_path, config, host)
    no_value_in_any_member(members, {**keys, "longer": longer})
    assert members["units/sparkfleet-gateway.service.journal.txt"] == f"key {REDACTED} end\n".encode()


def test_env_files_never_enter_the_bundle(tmp_path, config, keys):
    result, members = bundle(tmp_path, config, Host(keys))
    assert not [name for name in members if name.endswith(".env")]
    assert {"plans/vllm/tiny.json", "plans/vllm/last-good/tiny.json", "plans/cluster/big.json", "plans/gateway/plan.json",
            "plans/gateway/unit-plan.json", "plans/gateway/litellm/config.yaml"} <= set(members)


def test_bundle_is_private_and_written_whole(tmp_path, config, keys):
    result, _members = bundle(tmp_path, config, Host(keys))
    folder = tmp_path / "diagnostics"
    assert stat.S_IMODE(pathlib.Path(result["path"]).stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    # No temporary file or bug-report folder is left beside it.
    assert [entry.name for entry in folder.iterdir()] == [pathlib.Path(result["path"]).name]
    assert result["size"] == pathlib.Path(result["path"]).stat().st_size


def test_docker_inspect_keeps_names_and_redacts_every_value(tmp_path, config, keys):
    _result, members = bundle(tmp_path, config, Host(keys))
    container = json.loads(members["containers/vllm-tiny.inspect.json"])[0]
    env = container["Config"]["Env"]
    assert [entry.partition("=")[0] for entry in env] == ["VLLM_API_KEY", "PYTHONPATH", "VLLM_ENABLE_V1_MULTIPROCESSING", "PATH",
                                                          "VLLM_CACHE_ROOT", "HF_HUB_OFFLINE", "HF_TOKEN", "WANDB_API_KEY"]
    assert all(entry.partition("=")[2] == REDACTED for entry in env)
    assert container["Args"][-2:] == ["--api-key", REDACTED]
    assert container["Config"]["Cmd"][-1] == f"--api-key={REDACTED}"
    # The rest of the command line stays readable.
    assert container["Args"][:4] == ["serve", "/models/tiny-llama", "--host", "0.0.0.0"]
    assert container["State"]["Status"] == "running"


def test_a_command_timing_out_is_recorded_and_the_rest_collected(tmp_path, config, keys):
    host = Host(keys, {("/usr/bin/docker", "inspect", "vllm-cluster-big"): (None, "", "timed out after 60 s")})
    result, members = bundle(tmp_path, config, host)
    manifest = json.loads(members["MANIFEST.json"])
    timed_out = [entry for entry in manifest["commands"] if entry.get("timed_out")]
    assert [entry["command"] for entry in timed_out] == [["/usr/bin/docker", "inspect", "vllm-cluster-big"]]
    assert timed_out[0]["rc"] is None
    assert "/usr/bin/docker inspect vllm-cluster-big: timed out after 60 s" in result["problems"]
    assert manifest["complete"] is True
    for later in ("containers/vllm-cluster-big.log", "images.txt", "versions.txt", "fabric.txt", "nvidia/nvidia-smi-q.txt",
                  "units/docker.service.journal.txt"):
        assert later in members
    # Every command got the per-command limit.
    assert {timeout for _argv, timeout in host.calls} == {60}


def test_the_total_limit_skips_the_rest_and_says_so(tmp_path, config, keys):
    now = [0.0]

    def slow(argv, timeout):
        now[0] += 20
        return 0, "", ""

    host = Host(keys, {("journalctl",): slow})
    result = collect_bundle(str(tmp_path / "b.tar.gz"), config, 60, host, fetch, total_limit=90, clock=lambda: now[0])
    members = read_bundle(result["path"])
    manifest = json.loads(members["MANIFEST.json"])
    assert manifest["complete"] is False
    skipped = [entry for entry in manifest["commands"] if entry["skipped"]]
    assert skipped and any(entry["member"] == "images.txt" for entry in skipped)
    assert any("total time limit (90 s) was reached" in problem for problem in result["problems"])
    # What came before the deadline, and the plans, are in; no command ran past it.
    assert "plans/vllm/tiny.json" in members and "kernel.txt" in members and "images.txt" not in members
    assert all(timeout <= 60 for _argv, timeout in host.calls)
    assert b"(skipped: the bundle's time limit was reached)" in members["versions.txt"]


@pytest.mark.parametrize("status, body", [(401, '{"error": "Unauthorized"}'), (404, "Not Found"), (500, "Internal Server Error")])
def test_an_error_page_is_no_metrics(tmp_path, config, keys, status, body):
    """Seen: a bundle member that was only a 401's text, which the scrub then redacted into nonsense."""
    destination = str(tmp_path / "diagnostics" / "sparkfleet-diagnose-spark-1-20261204T094500Z.tar.gz")
    result = collect_bundle(destination, config, 60, Host(keys), lambda url, timeout: (status, body))
    members = read_bundle(destination)
    assert members["metrics/vllm-tiny.txt"].decode().startswith(f"(HTTP {status}, no metrics: ")
    assert f"http://127.0.0.1:8001/metrics: HTTP {status}, no metrics" in result["problems"]


def test_missing_tools_add_no_member_and_are_marked(tmp_path, config, keys):
    gone = (MISSING, "", "not installed")
    host = Host(keys, {("nvidia-smi",): gone, ("nvidia-bug-report.sh",): gone, ("ibdev2netdev",): gone, ("show_gids",): gone})
    _result, members = bundle(tmp_path, config, host)
    assert not [name for name in members if name.startswith("nvidia/")]
    manifest = json.loads(members["MANIFEST.json"])
    missing = {entry["command"][0] for entry in manifest["commands"] if entry.get("missing")}
    # py-spy too: this host's recordings have no binary at its path.
    assert missing == {"nvidia-smi", "nvidia-bug-report.sh", "ibdev2netdev", "show_gids", PY_SPY}
    assert b"$ ibdev2netdev\n(not installed)" in members["fabric.txt"]


def test_kernel_messages_are_filtered_and_the_ring_buffer_replaces_a_missing_journal(tmp_path, config, keys):
    _result, members = bundle(tmp_path, config, Host(keys))
    kernel = members["kernel.txt"].decode()
    assert "invoked oom-killer" in kernel and "Killed process 48213" in kernel and "NVRM: Xid" in kernel
    assert "Link is Up" not in kernel and "entered disabled state" not in kernel
    assert "no persistent journal was found" in kernel

    host = Host(keys, {("journalctl", "-k", "-b", "0"): JOURNAL_NO_KERNEL, ("dmesg",): (0, KERNEL_JOURNAL, "")})
    _result, members = bundle(tmp_path, config, host)
    assert "$ dmesg -T\n" in members["kernel.txt"].decode() and "NVRM: Xid" in members["kernel.txt"].decode()


def test_units_containers_metrics_and_fabric_come_from_the_plans(tmp_path, config, keys):
    host = Host(keys)
    result, members = bundle(tmp_path, config, host)
    units = {argv[2] for argv, _timeout in host.calls if argv[:2] == ["systemctl", "show"]}
    # Planned, listed by systemd (the watchdog) and the two the collection relies on.
    assert units == {"sparkfleet-vllm-tiny.service", "sparkfleet-cluster-big.service", "sparkfleet-gateway.service",
                     "sparkfleet-watchdog.service", "earlyoom.service", "docker.service"}
    inspected = {argv[2] for argv, _timeout in host.calls if argv[1:2] == ["inspect"]}
    assert inspected == {"vllm-tiny", "vllm-cluster-big", "sparkfleet-gateway"}
    assert members["metrics/vllm-tiny.txt"].decode() == METRICS
    # The cluster's head answered nothing; the gateway's plans are no engine's.
    assert members["metrics/cluster-big.txt"].startswith(b"(no answer:")
    assert not [name for name in members if name.startswith("metrics/gateway")]
    assert "show_gids" in members["fabric.txt"].decode() and "rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)" in members["fabric.txt"].decode()
    assert members["images.txt"].decode() == IMAGES
    assert members["containers/sparkfleet-gateway.inspect.json"].decode() == (
        "[]\n--- stderr ---\nError: No such container: vllm-nothere\n(exit status 1)\n")


def test_a_host_without_cluster_plans_reads_no_fabric(tmp_path, config, keys):
    host = Host(keys)
    _result, members = bundle(tmp_path, config[:1] + config[2:], host)
    assert "fabric.txt" not in members
    assert not [argv for argv, _timeout in host.calls if argv[0] in ("ibdev2netdev", "show_gids")]


def test_docker_inspect_that_is_no_json_is_left_out(tmp_path, config, keys):
    host = Host(keys, {("/usr/bin/docker", "inspect", "vllm-tiny"): (0, f"Env: VLLM_API_KEY {keys['api']} (garbled)", "")})
    _result, members = bundle(tmp_path, config, host)
    member = members["containers/vllm-tiny.inspect.json"]
    assert member.startswith(b"(docker inspect gave no JSON") and b"garbled" not in member


def test_docker_inspect_json_of_another_shape_is_left_out(tmp_path, config, keys):
    host = Host(keys, {("/usr/bin/docker", "inspect", "vllm-tiny"): (0, json.dumps([f"VLLM_API_KEY={keys['api']}"]), "")})
    _result, members = bundle(tmp_path, config, host)
    assert members["containers/vllm-tiny.inspect.json"].startswith(b"(docker inspect gave no JSON")


@pytest.mark.parametrize("container", ["--format={{json .Config.Env}}", "../../escape"])
def test_a_plan_naming_no_container_the_collection_writes_reaches_no_command_and_no_member(tmp_path, config, keys, container):
    path = tmp_path / "etc" / "vllm" / "tiny.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "container": container}))
    host = Host(keys)
    result, members = bundle(tmp_path, config, host)
    assert not [argv for argv, _timeout in host.calls if container in argv]
    assert not [name for name in members if container in name]
    assert any(problem.startswith("plan vllm-tiny: its container") for problem in result["problems"])


def test_an_env_file_that_cannot_be_read_refuses_the_bundle(tmp_path, config, keys, monkeypatch):
    real_open = builtins.open

    def guarded(path, *args, **kwargs):
        if str(path).endswith("gateway.env"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    with pytest.raises(DiagnoseError, match=r"gateway\.env: cannot be read \(Permission denied\), so its keys could not be kept out "
                                            r"of the bundle; run it as root"):
        bundle(tmp_path, config, Host(keys))
    assert not (tmp_path / "diagnostics").exists()


def test_every_env_value_but_the_public_knobs_is_a_secret():
    text = ("# VLLM_API_KEY=commented-out-key\nVLLM_API_KEY=abcdefgh12345678\nHF_TOKEN='hf_0123456789'\nGITHUB_PAT=ghp_0123456789\n"
            "HUGGING_FACE_HUB_TOKEN=hf_abcdefghij\nSHORT_KEY=true\nNCCL_SOCKET_IFNAME=enp1s0f0np0\nVLLM_HOST_IP=192.168.100.10\n"
            "PYTHONPATH=/opt/sparkfleet\nVLLM_ATTENTION_BACKEND=FLASHINFER\nPYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
            "SPARKFLEET_BACKEND_KEY_1=backend-key-1\nLITELLM_MASTER_KEY=sk-master-key\nlowercase_setting=lowercase-value\n")
    assert env_secrets(text) == {"abcdefgh12345678", "'hf_0123456789'", "hf_0123456789", "ghp_0123456789", "hf_abcdefghij",
                                 "backend-key-1", "sk-master-key", "lowercase-value"}


def test_redact_args_takes_every_spelling_argparse_takes():
    key, other, token = "k" * 20, "o" * 20, "t" * 20
    assert redact_args(["serve", "--api-key", key, other, "--port", "8000", "--hf-token=" + token]) == (
        ["serve", "--api-key", REDACTED, REDACTED, "--port", "8000", f"--hf-token={REDACTED}"], {key, other, token})
    # --hf-token takes one value at most: the model after it stays; without a value it takes none.
    assert redact_args(["--hf-token", token, "/models/tiny-llama"]) == (["--hf-token", REDACTED, "/models/tiny-llama"], {token})
    assert redact_args(["--hf-token", "--port", "8000"]) == (["--hf-token", "--port", "8000"], set())
    for spelling in ("--hf-tok", "--hf_token", "--hf", "--api-k", "--api_key", "--ap", "--api-key.x"):
        assert redact_args([spelling, key]) == ([spelling, REDACTED], {key}), spelling
        assert redact_args([f"{spelling}={key}"]) == ([f"{spelling}={REDACTED}"], {key}), spelling
    # A key may start with a dash; the next option ends a list of keys.
    assert redact_args(["--api-key", "-" + key, "-tp", "2"]) == (["--api-key", REDACTED, "-tp", "2"], {"-" + key})
    # Not a secret flag: one letter is ambiguous to argparse, the others are other flags.
    for other_flag in ("--h", "--a", "--host", "--hf-overrides", "--api-server-count", "--hf-config-path"):
        assert redact_args([other_flag, key]) == ([other_flag, key], set()), other_flag
    # docker run --env settings: a secret's value goes, a public knob's stays.
    assert redact_args(["--env", f"GITHUB_PAT={key}", "--env", "NCCL_SOCKET_IFNAME=enp1s0f0np0"]) == (
        ["--env", f"GITHUB_PAT={REDACTED}", "--env", "NCCL_SOCKET_IFNAME=enp1s0f0np0"], {key})


@pytest.mark.parametrize("text", [
    "vllm serve --api-key short", "vllm serve --api-key=short", "vllm serve --api_key short", "vllm serve --hf-tok short",
    "vllm serve --hf_token=short", "vllm serve --ap short", 'argv: ["--hf-token", "short"]', "args: ['--api-ke', 'short']",
    "Environment=HF_TOKEN=short", "Authorization: Bearer short",
])
def test_the_shape_of_a_short_secret_is_redacted(text):
    assert b"short" not in scrub(text.encode(), set())
    assert REDACTED.encode() in scrub(text.encode(), set())


def test_a_key_inside_another_goes_whole_in_every_spelling():
    assert scrub(b"key abcdefgh12345678", {"abcdefgh", "abcdefgh12345678"}) == f"key {REDACTED}".encode()
    odd = 'hf_%odd$key"quote\\back'
    for spelling in (odd, json.dumps(odd)[1:-1], repr(odd)[1:-1], exec_line([odd]), exec_line(["--hf-token=" + odd])):
        assert b"odd" not in scrub(f"x {spelling} y".encode(), {odd}), spelling


def test_a_real_plan_holds_no_secret_but_its_extra_arguments():
    """The vllm role's plan of an instance holds its key only in its env file: nothing of the plan is scrubbed, so
    paths, addresses and names stay readable."""
    from plan_options import ROLE_DEFAULTS, plan_options

    from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import build_plan

    instance = {"name": "llm", "model": "/models/tiny-llama", "served_model_names": ["tiny"], "port": 8001, "api_key": "k" * 32,
                "env": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}}
    built = build_plan([instance], ROLE_DEFAULTS["vllm_instance_defaults"],
                       **plan_options(image="registry.local:5000/vllm-cpu:0.32.0@sha256:" + "ab" * 32, hardware_class="dgx_spark"))
    assert not built["errors"] and built["instances"]
    assert plan_secrets(json.dumps(built["instances"][0], indent=2).encode()) == set()
    assert env_secrets(built["env_files"]["llm"]) == {"k" * 32}


def test_plan_secrets_reads_fields_and_the_gateway_config_but_not_references():
    plan = {"deployments": [{"key_env": "SPARKFLEET_BACKEND_KEY_1", "api_key": "os.environ/SPARKFLEET_BACKEND_KEY_1"}],
            "settings": {"master_key": "sk-inline-master-key", "hf_token": "hf_inline_token_value"},
            "env": {"GITHUB_PAT": "ghp_inline_value", "NCCL_SOCKET_IFNAME": "enp1s0f0np0"}}
    assert plan_secrets(json.dumps(plan).encode()) == {"sk-inline-master-key", "hf_inline_token_value", "ghp_inline_value"}
    litellm = "# Managed by Ansible\n" + json.dumps({"general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
                                                     "model_list": [{"litellm_params": {"api_key": "sk-backend-inline"}}]}, indent=2)
    assert plan_secrets(litellm.encode()) == {"sk-backend-inline"}
    yaml_text = ("model_list:\n  - litellm_params:\n      api_key: 'sk-yaml-inline'\n      master_key: os.environ/X\n"
                 "command:\n  - --hf-token\n  - hf_yaml_token\n")
    assert plan_secrets(yaml_text.encode()) == {"sk-yaml-inline", "'sk-yaml-inline'", "hf_yaml_token"}


@pytest.mark.parametrize("configured, problem", [
    ([], "config_dirs is empty, so no plan and no key would be read"),
    (["etc/sparkfleet/vllm"], "config_dirs[0]: 'etc/sparkfleet/vllm' is not an absolute folder"),
    (["/etc/sparkfleet/vllm", ""], "config_dirs[1]: '' is not an absolute folder"),
    (["/etc/sparkfleet/vllm", 5], "config_dirs[1]: 5 is not an absolute folder"),
])
def test_config_dirs_must_be_absolute_folders(configured, problem):
    problems = config_dir_problems(configured)
    assert len(problems) == 1 and problems[0].startswith(problem)
    assert "vllm_config_dir, cluster_config_dir, gateway_config_dir and watchdog_plan_dirs" in problems[0]


def test_the_default_folders_are_read_after_the_configured_ones():
    assert config_folders(["/srv/sf/vllm", "/etc/sparkfleet/cluster", "/srv/sf/vllm"]) == [
        "/srv/sf/vllm", "/etc/sparkfleet/cluster", "/etc/sparkfleet/vllm", "/etc/sparkfleet/gateway"]
    assert config_dir_problems(["/srv/sf/vllm"]) == []
    assert config_folders(["/srv/sf/vllm/", "//srv/sf//vllm", "/etc/sparkfleet/vllm/"]) == [
        "/srv/sf/vllm", "/etc/sparkfleet/vllm", "/etc/sparkfleet/cluster", "/etc/sparkfleet/gateway"], "each folder once, in one spelling"


def test_bundle_path_names_the_host_and_the_time():
    assert bundle_path("/var/lib/sparkfleet/diagnostics", "spark 1", 1796377500) == (
        "/var/lib/sparkfleet/diagnostics/sparkfleet-diagnose-spark_1-20261204T094500Z.tar.gz")


def test_run_command_kills_the_whole_group_on_timeout():
    # The shell's child keeps stdout open: without the group kill, reading it would wait the full 30 s.
    start = time.monotonic()
    rc, _out, err = run_command(["sh", "-c", "echo started; sleep 30 & wait"], 0.5)
    assert rc is None and "timed out" in err
    assert time.monotonic() - start < 10
    assert run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], 10) == (3, "out\n", "err\n")
    assert run_command(["no-such-tool-here"], 10)[0] == MISSING


class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body, code = (b"vllm:num_requests_running 0.0\n", 200) if self.path == "/metrics" else (b"no", 404)
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args):
        pass


def test_http_get_reads_a_real_server_past_any_proxy(monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert http_get(url + "/metrics", 5) == (200, "vllm:num_requests_running 0.0\n")
        assert http_get(url + "/other", 5) == (404, "no")
    status, why = http_get(url + "/metrics", 5)
    assert status is None and url in why


def stacks_host(keys, dumps=None, top=DOCKER_TOP):
    """The host with its engine's processes listed and each read by py-spy (the recordings unless `dumps` is given), the API
    server's command line carrying a key given as an extra argument (py-spy prints a process's whole command line)."""
    def dump(argv, timeout):
        rc, out, err = (dumps or DUMPS)[argv[-1]]
        return rc, out.replace("--disable-fastapi-docs", f"--disable-fastapi-docs --api-key {keys['api']}"), err

    return Host(keys, {("/usr/bin/docker", "top", "vllm-tiny"): (0, top, ""), (PY_SPY,): dump})


def test_a_bundle_holds_each_engine_process_stack_read_without_pausing_it(tmp_path, config, keys):
    host = stacks_host(keys)
    _result, members = bundle(tmp_path, config, host)
    stacks = members["stacks/vllm-tiny.txt"].decode()
    assert "EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1551)" in stacks and "Thread 1 (active): \"MainThread\"" in stacks
    assert "Failed to find python version from target process" in stacks and "(exit status 1)" in stacks
    reads = [argv for argv, _timeout in host.calls if argv[0] == PY_SPY]
    assert reads == [[PY_SPY, "dump", "--nonblocking", "--pid", pid] for pid in ("2317", "2583", "2584")]
    # Read after the container's own inspect and log: a bundle cut short by its time limit still holds those.
    order = [" ".join(argv[:3]) for argv, _timeout in host.calls if argv[0] in ("/usr/bin/docker", PY_SPY)]
    assert order.index("/usr/bin/docker logs --tail") < order.index("/usr/bin/docker top vllm-tiny") < order.index(f"{PY_SPY} dump --nonblocking")
    assert f"--api-key {REDACTED}".encode() in members["stacks/vllm-tiny.txt"]
    no_value_in_any_member(members, keys)


def test_without_py_spy_the_bundle_says_so_once_per_container(tmp_path, config, keys):
    host = Host(keys)
    _result, members = bundle(tmp_path, config, host)
    assert f"(py-spy is not installed at {PY_SPY}".encode() in members["stacks/vllm-tiny.txt"]
    assert [argv[-1] for argv, _timeout in host.calls if argv[0] == PY_SPY] == ["2317"]


def test_an_engine_of_many_processes_has_only_its_first_ones_read(tmp_path, config, keys):
    pids = [str(1000 + index) for index in range(STACK_PROCESSES + 5)]
    top = "PID                 COMMAND\n" + "".join(f"{pid}                VLLM::Worker_TP\n" for pid in pids)
    host = stacks_host(keys, dumps={pid: DUMPS["2584"] for pid in pids}, top=top)
    _result, members = bundle(tmp_path, config, host)
    assert [argv[-1] for argv, _timeout in host.calls if argv[0] == PY_SPY] == pids[:STACK_PROCESSES]
    assert b"(5 more processes not read" in members["stacks/vllm-tiny.txt"]


def test_the_watchdogs_stacks_are_scrubbed_kept_newest_first_and_taken_into_the_next_bundle(tmp_path, config, keys):
    folder = tmp_path / "stacks"
    folder.mkdir()
    for index in range(STACK_FILES_KEPT + 2):
        old = folder / f"sparkfleet-vllm-tiny.service-20261201T0000{index:02d}Z.txt"
        old.write_text(f"old {index}\n")
        os.utime(old, (1_700_000_000 + index, 1_700_000_000 + index))
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not the watchdog's\n")
    (folder / "zz-link.txt").symlink_to(outside)
    path = save_engine_stacks("vllm-tiny", "sparkfleet-vllm-tiny.service", config, 1_796_380_000, str(folder), stacks_host(keys))
    assert pathlib.Path(path).name == "sparkfleet-vllm-tiny.service-20261204T102640Z.txt"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    saved = pathlib.Path(path).read_text()
    assert "EngineCoreProc.run_busy_loop" in saved and keys["api"] not in saved and f"--api-key {REDACTED}" in saved
    kept = sorted(entry.name for entry in folder.iterdir() if not entry.is_symlink())
    # The oldest went, the link stayed untouched, and its target was never read.
    assert len(kept) == STACK_FILES_KEPT and "sparkfleet-vllm-tiny.service-20261201T000000Z.txt" not in kept
    assert outside.exists()
    _result, members = bundle(tmp_path, config, Host(keys), stacks_dir=str(folder))
    taken = sorted(name for name in members if name.startswith("watchdog-stacks/"))
    assert f"watchdog-stacks/{pathlib.Path(path).name}" in taken and len(taken) == STACK_FILES_KEPT
    assert b"not the watchdog's" not in b"".join(members.values())


@pytest.mark.parametrize("container, unit", [("../../etc/x", "sparkfleet-vllm-tiny.service"), ("vllm-tiny", "a b"), ("", "u")])
def test_a_stacks_record_for_a_name_the_collection_never_writes_is_refused(tmp_path, config, keys, container, unit):
    with pytest.raises(DiagnoseError, match="is no name the collection writes"):
        save_engine_stacks(container, unit, config, 1_796_380_000, str(tmp_path / "stacks"), stacks_host(keys))
    assert not (tmp_path / "stacks").exists()
