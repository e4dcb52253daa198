"""The real result of site.yml's host preparation on the lab hosts."""

import json

import pytest

# /etc/default/earlyoom as seed 000 wrote it by hand, plus Debian's node exporter name.
EXPECTED_EARLYOOM_ARGS = [
    "/usr/bin/earlyoom",
    "-m",
    "4",
    "-r",
    "3600",
    "--prefer",
    "^(VLLM::EngineCor|vllm)$",
    "--avoid",
    "^(sshd|systemd.*|[(]systemd[)]|NetworkManager|dbus-daemon|dbus-broker|dockerd|containerd.*|runc.*"
    "|[(]udev-worker[)]|polkitd|nginx|node_exporter|prometheus-node|dcgm-exporter|java|postgres|earlyoom)$",
]


def hostname(host):
    return host.backend.get_hostname().removeprefix("sparkfleet-")


def test_fstab_swap_entries_are_commented_and_backed_up(host):
    fstab = host.file("/etc/fstab").content_string
    assert "# /swap.img none swap sw 0 0" in fstab
    assert "# UUID=4b1c5c6e-0000-4000-8000-000000000001 none swap sw 0 0" in fstab
    assert not [line for line in fstab.splitlines() if line.startswith("/swap.img")]
    backups = host.run("ls /etc/fstab.*~").stdout.split()
    assert backups, "the swap role keeps a backup of fstab"
    assert "/swap.img none swap sw 0 0\n" in host.file(backups[0]).content_string


def test_swappiness_file(host):
    assert "vm.swappiness=1" in host.file("/etc/sysctl.d/99-sparkfleet-swap.conf").content_string


@pytest.mark.parametrize("unit", ["swap.target", "dev-zram0.swap"])
def test_swap_units_masked(host, unit):
    assert host.run(f"systemctl is-enabled {unit}").stdout.strip() == "masked"


def test_earlyoom_runs_with_exactly_the_expected_arguments(host):
    pid = host.run("systemctl show --property=MainPID --value earlyoom.service").stdout.strip()
    assert pid not in ("", "0"), "earlyoom is not running"
    cmdline = host.file(f"/proc/{pid}/cmdline").content.split(b"\0")
    assert [arg.decode() for arg in cmdline if arg] == EXPECTED_EARLYOOM_ARGS


def test_earlyoom_package_is_the_pinned_version(host):
    assert host.package("earlyoom").version == "1.7-1+b1"


def test_exporter_dropin_is_effective(host):
    show = host.run(
        "systemctl show --property=Restart --property=RestartUSec --property=OOMScoreAdjust prometheus-node-exporter"
    ).stdout.split()
    assert "Restart=always" in show
    assert "RestartUSec=5s" in show
    # systemd applies this at start; lab containers cannot lower oom_score_adj (no
    # CAP_SYS_RESOURCE, which this sandbox refuses), so the unit property is what is checked.
    assert "OOMScoreAdjust=-900" in show


def test_exporter_came_back_after_sigterm(host):
    # The molecule run sets exporter_dropins_self_test, which SIGTERMs the exporter at every
    # converge; systemd restarted it each time (a plain restart does not count in NRestarts).
    restarts = int(host.run("systemctl show --property=NRestarts --value prometheus-node-exporter").stdout)
    assert restarts >= 1
    assert host.service("prometheus-node-exporter").is_running


def test_wait_online_enabled_for_the_host_network_stack(host):
    unit = {
        "molecule-spark": "NetworkManager-wait-online.service",
        "molecule-gx10": "systemd-networkd-wait-online.service",
    }[hostname(host)]
    assert host.run(f"systemctl is-enabled {unit}").stdout.strip() == "enabled"


def test_docker_ordering_dropin(host):
    dropin = host.file("/etc/systemd/system/docker.service.d/10-wait-online.conf")
    assert dropin.mode == 0o644
    lines = dropin.content_string.splitlines()
    assert "After=network-online.target" in lines
    assert "Wants=network-online.target" in lines
    # Docker is installed on the lab hosts, so systemd shows the ordering in effect.
    after = host.run("systemctl show --property=After --value docker.service").stdout.split()
    assert "network-online.target" in after


def test_headless_target_and_masked_services(host):
    assert host.run("systemctl get-default").stdout.strip() == "multi-user.target"
    assert host.run("systemctl is-enabled rsyslog.service").stdout.strip() == "masked"
    assert not host.service("rsyslog").is_running


def test_memory_sysctl_file(host):
    settings = dict(
        line.replace(" ", "").split("=", 1)
        for line in host.file("/etc/sysctl.d/90-sparkfleet-memory.conf").content_string.splitlines()
        if "=" in line
    )
    assert settings["vm.min_free_kbytes"] == "5242880"
    assert settings["vm.max_map_count"] == "2097152"
    assert settings["vm.overcommit_memory"] == "1"
    assert "vm.swappiness" not in settings


def test_driver_guard_record_follows_hardware_class(host):
    record = json.loads(host.file("/etc/sparkfleet/driver_guard.json").content_string)
    if hostname(host) == "molecule-spark":
        assert record["hardware_class"] == "cpu_lab"
        assert record["status"] == "guarded"
        assert record["nvidia_smi_versions"] == ["580.95.05"]
    else:
        assert record["hardware_class"] == "cpu_lab"
        assert record["status"] == "skipped: no NVIDIA driver"
        assert record["held_packages"] == []


def test_driver_packages_held(host):
    if hostname(host) != "molecule-spark":
        pytest.skip("only the spark host has a driver")
    held = host.run("apt-mark showhold").stdout.split()
    assert sorted(held) == ["libnvidia-compute-580", "nvidia-driver-580-open", "nvidia-utils-580"]
