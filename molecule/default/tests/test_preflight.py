"""The hardware facts and the preflight on the converged lab hosts: their facts, a healthy host
passing playbooks/preflight.yml, and one made unhealthy (swap configured, a process holding a
device-node stand-in, a full disk stand-in) failing with every reason named and nothing changed."""

import json

import pytest
from site_runner import docker_host, module, playbook, state_digest

SPARK = "sparkfleet-molecule-spark"
GX10 = "sparkfleet-molecule-gx10"
HOLDER_UNIT = "sparkfleet-test-device-holder"
STANDIN_DIR = "/run/sparkfleet-test"
FULL_DISK = "/srv/models-full"


def test_lab_hosts_report_their_facts():
    for name in (SPARK, GX10):
        result = module(name, "spark_facts", {"models_dir": "/srv/models"})
        assert result["ok"] and not result.get("changed"), result
        facts = result["facts"]
        print(f"\nfacts of {name}: {json.dumps(facts, indent=1, sort_keys=True)}")
        assert facts["gpu"]["present"] is False and facts["gpu"]["detail"].startswith("no GPU: nvidia-smi")
        assert facts["memory"]["source"] == "/proc/meminfo" and facts["memory"]["pool_bytes"] > 0
        assert facts["docker"]["present"] and facts["docker"]["nvidia_runtime"] is False
        assert facts["swap"]["fstab"] == [], "the swap role commented the installer's entries out"
        assert set(facts["sleep_targets"].values()) == {"masked"}, "the headless role masked them"
        assert facts["device_holders"] == [] and facts["power"]["wedge_suspected"] is False
        assert facts["disk"]["free_bytes"] > 0 and facts["os"]["id"] == "debian"


def test_preflight_passes_on_a_healthy_host():
    result = playbook("preflight.yml", "-e", '{"vllm_instances": []}', limit=GX10)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "PASS swap off" in result.stdout and "FAIL" not in result.stdout
    # What fills the disks, read for real: /var/tmp walked, Docker's own figure of what a prune would free.
    assert "PASS /var/tmp: " in result.stdout and " GiB in /var/tmp, " in result.stdout
    assert "docker reclaimable: " in result.stdout and " GiB of images, containers, volumes and build cache no container uses" in result.stdout


def host_state(host):
    return state_digest(host, ["/etc/fstab"], ["systemctl list-unit-files --no-legend", "ls -la /srv", "findmnt -n -o TARGET"])


@pytest.fixture
def unhealthy_spark():
    host = docker_host(SPARK)
    fstab = host.file("/etc/fstab").content_string
    host.check_output(f"mkdir -p {STANDIN_DIR} && cp -p /etc/fstab {STANDIN_DIR}/fstab.before")
    host.check_output("echo '/swap-standin.img none swap sw 0 0' >> /etc/fstab")
    host.check_output(f"mkdir -p {FULL_DISK} && touch {STANDIN_DIR}/nvidia0")
    host.check_output(f"systemd-run --unit {HOLDER_UNIT} sh -c 'exec 3<{STANDIN_DIR}/nvidia0; exec sleep infinity'")
    host.check_output(f"mount -t tmpfs -o size=64m tmpfs {FULL_DISK}")
    yield host
    host.run(f"systemctl stop {HOLDER_UNIT}")
    host.run(f"umount {FULL_DISK}")
    host.check_output(f"cp -p {STANDIN_DIR}/fstab.before /etc/fstab && rm -rf {STANDIN_DIR} {FULL_DISK}")
    assert host.file("/etc/fstab").content_string == fstab


def test_preflight_on_an_unhealthy_host_names_every_reason_and_changes_nothing(unhealthy_spark):
    holder_pid = unhealthy_spark.check_output(f"systemctl show -p MainPID --value {HOLDER_UNIT}")
    before = host_state(unhealthy_spark)
    settings = {"vllm_instances": [], "vllm_models_dir": FULL_DISK, "preflight_device_nodes": [f"{STANDIN_DIR}/nvidia*"]}
    result = playbook("preflight.yml", "-e", json.dumps(settings), limit=SPARK)
    output = result.stdout + result.stderr
    print(output[output.find("TASK [sparkfleet.vllm.preflight : Report"):][:2500])
    assert result.returncode != 0, output[-3000:]
    assert "Preflight failed on sparkfleet-molecule-spark, nothing was changed" in output
    for fragment in ("swap off: in /etc/fstab: /swap-standin.img (returns at boot)",
                     f"device holders: pid {holder_pid} (sleep) holds {STANDIN_DIR}/nvidia0",
                     f"free disk: 0.06 GiB free at {FULL_DISK}, need 1.00 GiB"):
        assert fragment in output, fragment
    assert host_state(unhealthy_spark) == before
