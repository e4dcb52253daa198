import pathlib
import shlex

import pytest
import yaml

from ansible_collections.sparkfleet.vllm.plugins.filter.hardware import host_settings_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._memory import parse_meminfo
from ansible_collections.sparkfleet.vllm.plugins.module_utils._systemd import exec_line, quote_exec_argument

# Recorded from this lab machine's /proc/meminfo (first lines).
MEMINFO = """MemTotal:       24594912 kB
MemFree:        19011420 kB
MemAvailable:   22110784 kB
Buffers:          180904 kB
HugePages_Total:       0
"""


@pytest.mark.parametrize(
    ("argument", "quoted"),
    [
        ("--port", "--port"),
        ("127.0.0.1:8001:8000", "127.0.0.1:8001:8000"),
        ('{"method":"ngram","num_speculative_tokens":3}', '"{\\"method\\":\\"ngram\\",\\"num_speculative_tokens\\":3}"'),
        ("50%", "50%%"),
        ("$HOME", '"$$HOME"'),
        ("a b", '"a b"'),
        ("x\n", '"x\\n"'),
    ],
)
def test_quote_exec_argument(argument, quoted):
    assert quote_exec_argument(argument) == quoted


def test_exec_line_reads_back_as_the_same_arguments():
    arguments = ["/usr/bin/docker", "run", "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}', "a b"]
    # systemd's parser and the shell agree on double quotes with backslash escapes.
    assert shlex.split(exec_line(arguments)) == arguments


def test_parse_meminfo_in_bytes():
    info = parse_meminfo(MEMINFO)
    assert info["MemTotal"] == 24594912 * 1024
    assert info["HugePages_Total"] == 0


ROLES = pathlib.Path(__file__).resolve().parents[4] / "roles"


def test_the_roles_defaults_are_in_range():
    for role in ("swap", "headless", "exporter_dropins", "wait_online", "preflight"):
        defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
        assert host_settings_problems(defaults) == [], role


@pytest.mark.parametrize(("settings", "expected"), [
    pytest.param({"swap_swappiness": 60}, "swap_swappiness: 60 is out of range; give a whole number from 0 to 10 (seed 000 uses 1",
                 id="swappiness"),
    pytest.param({"swap_swappiness": "1%"}, "swap_swappiness: '1%' is not a whole number", id="swappiness-text"),
    pytest.param({"headless_sysctl": {"vm.panic_on_oom": 1}}, "headless_sysctl['vm.panic_on_oom']: 1 is out of range; give 0 (1 or 2 "
                 "reboot the whole host", id="panic-on-oom"),
    pytest.param({"headless_sysctl": {"vm.overcommit_memory": 2}}, "headless_sysctl['vm.overcommit_memory']: 2 is out of range; give a "
                 "whole number from 0 to 1 (2 (strict accounting)", id="strict-overcommit"),
    pytest.param({"headless_sysctl": {"vm.min_free_kbytes": 64 * 1024 * 1024}}, "headless_sysctl['vm.min_free_kbytes']: 67108864 is "
                 "out of range; give a whole number from 1 to 16777216 KiB", id="reserve-in-the-tens-of-gib"),
    pytest.param({"headless_sysctl": {"vm.vfs_cache_pressure": 0}}, "headless_sysctl['vm.vfs_cache_pressure']: 0 is out of range",
                 id="never-reclaim"),
    pytest.param({"headless_sysctl": {"vm.dirty_ratio": 500}}, "headless_sysctl['vm.dirty_ratio']: 500 is out of range", id="dirty"),
    pytest.param({"headless_sysctl": {"vm.dirty_background_ratio": 20, "vm.dirty_ratio": 5}},
                 "headless_sysctl['vm.dirty_background_ratio']: 20 is above vm.dirty_ratio (5)", id="background-above-ratio"),
    pytest.param({"headless_sysctl": {"vm.max_map_count": 1000}}, "headless_sysctl['vm.max_map_count']: 1000 is out of range",
                 id="map-count"),
    pytest.param({"headless_sysctl": ["vm.dirty_ratio=5"]}, "headless_sysctl: ['vm.dirty_ratio=5'] is not a mapping", id="not-a-dict"),
    pytest.param({"exporter_dropins_restart_sec": 0}, "exporter_dropins_restart_sec: 0 is out of range; give a whole number from 2 to "
                 "300 s (below 2 s five quick restarts hit systemd's start limit", id="restart-limit"),
    pytest.param({"exporter_dropins_oom_score_adjust": 500}, "exporter_dropins_oom_score_adjust: 500 is out of range; give a whole "
                 "number from -1000 to -1", id="exporter-killed-first"),
    pytest.param({"exporter_dropins_restart_sec": 30, "exporter_dropins_self_test_timeout": 30},
                 "exporter_dropins_self_test_timeout: 30 is not above exporter_dropins_restart_sec (30)", id="self-test-too-short"),
    pytest.param({"exporter_dropins_self_test_timeout": 10**6}, "exporter_dropins_self_test_timeout: 1000000 is out of range",
                 id="self-test-forever"),
    pytest.param({"exporter_dropins_file_name": "../../docker.service.d/override.conf"}, "exporter_dropins_file_name: "
                 "'../../docker.service.d/override.conf' must be a file name ending in .conf", id="exporter-dropin-leaves-its-folder"),
    pytest.param({"exporter_dropins_file_name": "10-resilience"}, "exporter_dropins_file_name: '10-resilience' must be a file name "
                 "ending in .conf", id="exporter-dropin-systemd-ignores"),
    pytest.param({"wait_online_docker_dropin_path": "/etc/systemd/system/../../passwd"}, "wait_online_docker_dropin_path: "
                 "'/etc/systemd/system/../../passwd' must not step through", id="docker-dropin-leaves-its-folder"),
    pytest.param({"wait_online_docker_dropin_path": "/etc/systemd/system/docker.service"}, "wait_online_docker_dropin_path: "
                 "/etc/systemd/system/docker.service is not a file its reader reads: drop-ins end in .conf in "
                 "/etc/systemd/system/docker.service.d or ", id="docker-unit-itself"),
    pytest.param({"wait_online_docker_dropin_path": "/srv/docker.service.d/10-wait-online.conf"}, "wait_online_docker_dropin_path: "
                 "/srv/docker.service.d/10-wait-online.conf is not a file its reader reads", id="docker-dropin-where-systemd-never-looks"),
    pytest.param({"wait_online_docker_dropin_path": "/docker.service.d/x.conf"}, "wait_online_docker_dropin_path: "
                 "'/docker.service.d/x.conf' is too close to /", id="docker-dropin-at-the-root"),
    pytest.param({"preflight_device_nodes": ["nvidia*"]}, "preflight_device_nodes: ['nvidia*'] must list the GPU's device nodes",
                 id="device-nodes-relative"),
    # The roles rewrite their sysctl files whole: /etc/sysctl.conf would lose the operator's own lines.
    pytest.param({"headless_sysctl_file": "/etc/sysctl.conf"}, "headless_sysctl_file: /etc/sysctl.conf is not a file its reader reads: "
                 "drop-ins end in .conf in /etc/sysctl.d", id="sysctl-file-the-operators-own"),
    pytest.param({"swap_sysctl_file": "/etc/sysctl.d/../sysctl.conf"}, "swap_sysctl_file: '/etc/sysctl.d/../sysctl.conf' must not step through",
                 id="sysctl-file-stepping-out"),
    pytest.param({"headless_sysctl": {"kernel.core_pattern": "|/tmp/x %p"}}, "headless_sysctl: kernel.core_pattern: '|/tmp/x %p' is not a value",
                 id="sysctl-value-a-file-line-would-not-carry"),
    pytest.param({"headless_sysctl": {"kernel.numa_balancing": None}}, "headless_sysctl: kernel.numa_balancing: None is not a value",
                 id="sysctl-value-empty"),
    # The unit names reach systemctl on every host: the fleet check refuses them before the first change.
    pytest.param({"headless_default_target": "graphical"}, "headless_default_target: 'graphical' is not a target's unit name",
                 id="default-target-not-a-target"),
    pytest.param({"headless_default_target": "multi-user.target", "headless_mask_services": ["cups", "--now"]},
                 "headless_mask_services[1]: '--now' is not a systemd unit name", id="unit-name-an-option"),
    pytest.param({"headless_default_target": "multi-user.target", "headless_disable_services": ["apt-daily.timer"]},
                 "headless_disable_services[0]: 'apt-daily.timer' is a timer, and this list takes service or socket or target",
                 id="unit-type-the-role-never-reads"),
    pytest.param({"headless_default_target": "multi-user.target", "headless_mask_sleep_targets": ["suspend"]},
                 "headless_mask_sleep_targets[0]: 'suspend' is a service, and this list takes target units only", id="sleep-target-a-service"),
])
def test_host_settings_that_switch_a_protection_off_are_refused(settings, expected):
    problems = host_settings_problems(settings)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_unknown_sysctls_are_the_operators_own():
    assert host_settings_problems({"headless_sysctl": {"kernel.numa_balancing": 0, "vm.dirty_ratio": "5"}}) == []
