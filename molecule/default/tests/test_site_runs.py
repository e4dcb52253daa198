"""site.yml runs against the converged lab hosts: check mode, and bad input refused.

Each bad input must fail with an error naming the variable, before anything on the host
changes. These tests run ansible-playbook from the controller, once per session.
"""

import re

import pytest
from site_runner import assert_refused, docker_host, site, state_digest

SPARK = "sparkfleet-molecule-spark"
GX10 = "sparkfleet-molecule-gx10"
# What the host-preparation roles own; a refused run must leave all of it as it was.
WATCHED_FILES = [
    "/etc/default/earlyoom",
    "/etc/fstab",
    "/etc/sysctl.d/99-sparkfleet-swap.conf",
    "/etc/sysctl.d/90-sparkfleet-memory.conf",
    "/etc/systemd/system/docker.service.d/10-wait-online.conf",
    "/etc/systemd/system/prometheus-node-exporter.service.d/10-resilience.conf",
    "/etc/sparkfleet/driver_guard.json",
]


# Serving has its own scenario; these hosts are only prepared.
NO_SERVING = '{"vllm_instances": []}'


def host_state(name):
    return state_digest(
        docker_host(name), WATCHED_FILES, ["apt-mark showhold; dpkg-query -W; systemctl list-unit-files --no-legend"]
    )


def test_check_mode_on_converged_hosts_reports_no_change():
    result = site("--check", "--diff", "-e", NO_SERVING)
    assert result.returncode == 0, result.stdout[-3000:]
    recap = result.stdout.split("PLAY RECAP")[1]
    assert recap.count("changed=0") == 2, recap


def test_bad_settings_refused_without_change():
    """The strict exporter check needs the host's units: the GX10 host lacks them, and its refusal in
    the fleet check stops both hosts. The refusals that need no host are the static layer's
    (tests/integration/test_static.py)."""
    before = host_state(SPARK), host_state(GX10)
    result = site("-e", NO_SERVING, "-e", '{"exporter_dropins_strict": true}')
    assert_refused(result, "exporter_dropins_units", "node_exporter.service, dcgm-exporter.service not found", "exporter_dropins_strict")
    assert not re.search(r"changed=[1-9]", result.stdout)
    assert (host_state(SPARK), host_state(GX10)) == before


@pytest.fixture
def spark_apt():
    host = docker_host(SPARK)
    yield host
    host.check_output(
        "apt-get purge -y -q nvidia-driver-590-open libnvidia-compute-590 nvidia-utils-590"
        " linux-modules-nvidia-590-open-6.17.0-1021-nvidia nvidia-dkms-580"
    )
    host.check_output("rm -f /srv/fake-nvidia/dgx-gpu-stack_2.0_all.deb")
    host.check_output("cd /srv/fake-nvidia && apt-ftparchive packages . > Packages && apt-get update -q")
    host.check_output("apt-get install -y -q dgx-gpu-stack=1.0 && apt-mark hold libnvidia-compute-580 nvidia-driver-580-open nvidia-utils-580")


def test_driver_branch_590_installed_is_refused(spark_apt):
    """The 590 driver replaces the 580 one, as an operator working around the holds would leave it, beside
    the proprietary flavour's modules; with a GB10 board's rules (the open flavour, a kernel line this
    machine's kernel is not on) every broken rule is named in the one refusal."""
    spark_apt.check_output(
        "apt-mark unhold libnvidia-compute-580 nvidia-driver-580-open nvidia-utils-580"
        " && apt-get install -y -q nvidia-driver-590-open nvidia-dkms-580"
    )
    before = host_state(SPARK)
    gb10_rules = '{"sparkfleet_hardware_overrides": {"driver_flavour": "open", "kernel_line": "1.0"}}'
    result = site("-e", NO_SERVING, "-e", gb10_rules, limit=SPARK)
    assert_refused(
        result,
        "driver_guard_allowed_branch is 580",
        "nvidia-driver-590-open 590.44.01-0ubuntu1",
        "nvidia-smi reports driver 590.44.01",
        "proprietary kernel-module flavour are installed: nvidia-dkms-580 580.95.05-0ubuntu1",
        "is not on the 1.0 line",
        "Nothing was changed",
    )
    assert host_state(SPARK) == before


def test_upgrade_that_would_bring_590_is_refused(spark_apt):
    # The meta package's next version pulls in the 590 kernel modules, as a DGX OS kernel update
    # might; they conflict with no held package, so only the simulation catches them.
    spark_apt.check_output(
        "cd /srv/fake-nvidia && cp dgx-gpu-stack_1.0_all.deb /tmp/next.deb"
        " && mkdir -p /tmp/next && dpkg-deb -R /tmp/next.deb /tmp/next"
        " && sed -i 's/^Version: .*/Version: 2.0/;"
        " s/^Depends: .*/Depends: nvidia-driver-580-open, linux-modules-nvidia-590-open-6.17.0-1021-nvidia/'"
        " /tmp/next/DEBIAN/control"
        " && dpkg-deb --root-owner-group --build /tmp/next dgx-gpu-stack_2.0_all.deb >/dev/null"
        " && rm -rf /tmp/next /tmp/next.deb && apt-ftparchive packages . > Packages"
    )
    before = host_state(SPARK)
    result = site("-e", NO_SERVING, limit=SPARK)
    assert_refused(
        result,
        "driver_guard_allowed_branch is 580",
        "the upgrade would bring",
        "linux-modules-nvidia-590-open-6.17.0-1021-nvidia 6.17.0-1021.21",
    )
    assert host_state(SPARK) == before
