"""The ranks' fabric wait, laid out as the cluster role installs it beside the host runtime and run as systemd runs it.
This machine has no ping, so a stand-in ping on PATH replays outputs recorded in the lab
(tests/unit/fixtures/fabric): the real iputils text goes through the real parser."""

import os
import pathlib
import subprocess

import pytest
from runtime_layout import install_runtime

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_runtime import RUNTIME_DIR
from ansible_collections.sparkfleet.vllm.plugins.module_utils._vllm_plan import CLUSTER_HELPERS

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "fabric"


@pytest.fixture
def installed(tmp_path):
    return install_runtime(tmp_path, [{"path": f"{RUNTIME_DIR}/{name}", "source": source} for name, source in CLUSTER_HELPERS])


def run(installed, recording, *args):
    bin_dir = installed / "bin"
    bin_dir.mkdir(exist_ok=True)
    ping = bin_dir / "ping"
    ping.write_text(f"#!/bin/sh\necho \"$@\" >> {installed}/calls\ncat {FIXTURES / recording}\n")
    ping.chmod(0o755)
    # As on the host: nothing of the collection or Ansible importable but the runtime beside the wait.
    env = {**{name: value for name, value in os.environ.items() if name != "PYTHONPATH"}, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    command = ["/usr/bin/python3", "-I", str(installed / "cluster_fabric_wait.py"), "--source", "node-2", "--interface", "eth0", "--mtu", "1500",
               "--peer=node-1=172.18.0.2", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def test_a_rank_starts_once_its_peers_answer_full_frames(installed):
    result = run(installed, "ping_full_frame.txt")
    assert result.returncode == 0, result.stderr
    assert (installed / "calls").read_text().split() == ["-M", "do", "-s", "1472", "-c", "2", "-i", "0.2", "-W", "2", "-I", "eth0", "172.18.0.2"]


def test_a_rank_whose_link_carries_less_does_not_start(installed):
    result = run(installed, "ping_local_mtu_1400.txt", "--timeout", "0")
    assert result.returncode == 1
    assert "node-2 -> node-1 (172.18.0.2) at MTU 1500: the local interface carries only 1400 bytes" in result.stderr
