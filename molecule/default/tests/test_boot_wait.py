"""The lab's boot wait on a host that is still booting, as scripts/lab and the scenarios' prepare
steps meet it: a fresh lab host whose boot is held for a while by a unit that keeps clearing /tmp
(where a module's payload would be unpacked), waited on from the moment its container starts."""

import os
import subprocess
import time
import uuid

import pytest
from site_runner import ROOT

HOLD_SECONDS = 12
SLOW_BOOT_UNIT = f"""[Unit]
Description=Holds the boot and clears /tmp meanwhile, as a booting host's systemd can
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'end=$(( $(date +%%s) + {HOLD_SECONDS} )); while [ $(date +%%s) -lt $end ]; do rm -rf /tmp/* /tmp/.[!.]* 2>/dev/null; sleep 0.1; done'
"""


@pytest.fixture
def booting_host(tmp_path):
    unit = tmp_path / "sparkfleet-slow-boot.service"
    unit.write_text(SLOW_BOOT_UNIT)
    name = f"sparkfleet-boot-wait-{uuid.uuid4().hex[:8]}"
    started = subprocess.run(
        ["docker", "run", "--detach", "--name", name, "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN",
         "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined", "--cgroupns=host",
         "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock", "--stop-signal", "SIGRTMIN+3",
         "--volume", f"{unit}:/etc/systemd/system/{unit.name}:ro", "--label", "sparkfleet.lab=true",
         os.environ["SPARKFLEET_LAB_IMAGE"], "/lib/systemd/systemd", f"systemd.wants={unit.name}"],
        capture_output=True, text=True, check=True)
    container_id = started.stdout.strip()
    try:
        yield name, time.monotonic()
    finally:
        subprocess.run(["docker", "rm", "--force", container_id], capture_output=True, check=False)


def test_the_boot_wait_outlasts_a_boot_that_clears_tmp(booting_host, tmp_path):
    name, started = booting_host
    playbook = tmp_path / "wait.yml"
    playbook.write_text(f"- hosts: all\n  gather_facts: false\n  tasks:\n"
                        f"    - ansible.builtin.import_tasks: {ROOT / 'lab' / 'tasks' / 'boot_wait.yml'}\n")
    result = subprocess.run(["ansible-playbook", "-i", f"{name},", "-c", "community.docker.docker", str(playbook)],
                            capture_output=True, text=True, cwd=ROOT, check=False)
    waited = time.monotonic() - started
    print(f"\nboot wait on a booting lab host: returned {waited:.1f} s after its container started (boot held {HOLD_SECONDS} s)")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    # The unit counts whole seconds (date +%s), so it holds the boot between HOLD_SECONDS - 1 and HOLD_SECONDS.
    assert waited >= HOLD_SECONDS - 1, "the wait returned before the boot finished"
    state = subprocess.run(["docker", "exec", name, "systemctl", "is-system-running"], capture_output=True, text=True, check=False)
    assert state.stdout.strip() in ("running", "degraded")
