"""Host facts parsed from recorded real outputs (tests/unit/fixtures/hardware/README.md says which
and where from: no GB10, GPU or NVIDIA driver exists on the machines this suite runs on)."""

import pathlib

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_facts import (
    SLEEP_TARGETS,
    UNIT_STATE_PROPERTIES,
    board,
    folder_usage,
    fstab_swaps,
    installed_packages,
    package_lists,
    package_name_problems,
    packages_to_install,
    parse_docker_df,
    parse_docker_info,
    parse_gpu_query,
    parse_os_release,
    parse_swaps,
    power_state,
    summarise,
    unit_states,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_state import parse_show
from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import device_holders

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hardware"


def fixture(name):
    return (FIXTURES / name).read_text()


def shown(text):
    """The sleep targets' states as spark_facts reads them (_host_state's one reader) from recorded systemctl show text."""
    return parse_show(SLEEP_TARGETS, UNIT_STATE_PROPERTIES, text)


def facts(gpu_text=None, gpu_error="is not installed", **overrides):
    given = dict(dmi={}, os_release=fixture("lab-os-release.txt") if (FIXTURES / "lab-os-release.txt").exists() else "",
                 architecture="aarch64", gpu_text=gpu_text, gpu_error=gpu_error, meminfo_text=fixture("gb10-meminfo.txt"),
                 swaps_text="Filename\tType\tSize\tUsed\tPriority\n", fstab_text="", holders=[], docker_text=None,
                 disk={"path": "/srv/models", "free_bytes": 500 * 2**30, "total_bytes": 900 * 2**30},
                 units=shown(fixture("lab-host-unit-states.txt")), lists={"indexes": 1, "age_seconds": 60}, packages={})
    given.update(overrides)
    return summarise(**given)


def test_gb10_memory_is_read_from_meminfo_because_nvidia_smi_says_na():
    gb10 = facts(gpu_text=fixture("gb10-nvidia-smi-idle.csv"), gpu_error=None)
    gpu, memory = gb10["gpu"], gb10["memory"]
    assert (gpu["name"], gpu["driver_version"], gpu["driver_branch"], gpu["compute_capability"]) == ("NVIDIA GB10", "580.173.02", "580", "12.1")
    assert gpu["memory_reported"] is False and gpu["power_draw_w"] == 11.17 and gpu["utilization_percent"] == 0.0
    assert memory["source"] == "/proc/meminfo" and memory["unified"] is True
    # vLLM's total on a GB10 is 121.69 GiB, which is MemTotal.
    assert round(memory["pool_bytes"] / 2**30, 2) == 121.69 and memory["available_bytes"] == 118566368 * 1024


def test_a_discrete_card_reports_its_own_memory():
    rtx = facts(gpu_text=fixture("rtx-5090-nvidia-smi.csv"), gpu_error=None)
    assert rtx["memory"]["source"] == "nvidia-smi" and rtx["memory"]["unified"] is False
    assert rtx["memory"]["pool_bytes"] == 32607 * 2**20 and rtx["gpu"]["compute_capability"] == "12.0"


def test_a_host_without_a_gpu_is_reported_cleanly():
    lab = facts(gpu_text=None, gpu_error="is not installed")
    assert lab["gpu"]["present"] is False and lab["gpu"]["detail"] == "no GPU: nvidia-smi is not installed"
    assert lab["memory"]["source"] == "/proc/meminfo" and lab["memory"]["unified"] is False
    assert lab["power"] == {"loaded": False, "wedge_suspected": False, "reason": "no GPU"}


def test_the_power_delivery_wedge_shows_only_under_load():
    wedged = power_state(parse_gpu_query(fixture("gb10-nvidia-smi-wedged.csv")))
    assert wedged["loaded"] and wedged["wedge_suspected"] and "702.0 MHz, 10.02 W" in wedged["reason"]
    healthy = power_state(parse_gpu_query(fixture("gb10-nvidia-smi-loaded.csv")))
    assert healthy["loaded"] and not healthy["wedge_suspected"]
    idle = power_state(parse_gpu_query(fixture("gb10-nvidia-smi-idle.csv")))
    assert not idle["loaded"] and not idle["wedge_suspected"] and "not under load" in idle["reason"]


def test_boards_from_dmi():
    assert board({"sys_vendor": "NVIDIA\n", "product_name": "DGX Spark\n"})["kind"] == "dgx_spark"
    gx10 = board({"sys_vendor": "ASUSTeK COMPUTER INC.", "product_name": "Ascent GX10", "bios_version": "GX10DGX.0104.2026.0326.1657"})
    assert gx10["kind"] == "asus_gx10" and gx10["bios_version"] == "GX10DGX.0104.2026.0326.1657"
    assert board({"sys_vendor": "Dell Inc.", "product_name": "Pro Max GB10"})["kind"] == "other"
    assert board({})["kind"] == "unknown"


def test_os_release_and_unit_states():
    assert parse_os_release('ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')["version_id"] == "12"
    states = unit_states(shown(fixture("lab-host-unit-states.txt")))
    assert states == {"sleep.target": "static", "suspend.target": "static", "hibernate.target": "static", "hybrid-sleep.target": "masked"}


def test_swap_active_and_swap_that_returns_at_boot():
    active = parse_swaps("Filename\tType\tSize\tUsed\tPriority\n/swap.img  file  16777212  5242880  -2\n")
    assert active == [{"device": "/swap.img", "size_kib": 16777212, "used_kib": 5242880}]
    fstab = "UUID=abc / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n# /old.img none swap sw 0 0\n/x none swap noauto 0 0\n"
    assert fstab_swaps(fstab) == ["/swap.img"]


def test_device_holders_leave_out_nvidia_persistenced():
    processes = [(1580, "nvidia-persistenced", ["/dev/nvidia0", "/dev/nvidiactl"]),
                 (4242, "python3", ["/dev/null", "/dev/nvidia0", "/dev/nvidia-uvm"]),
                 (77, "bash", ["/dev/pts/0"])]
    assert device_holders(processes, ["/dev/nvidia*"]) == [{"pid": 4242, "command": "python3", "paths": ["/dev/nvidia-uvm", "/dev/nvidia0"]}]


def test_docker_info_from_this_machine_and_the_nvidia_runtime():
    info = parse_docker_info(fixture("docker-info-lab-machine.json"))
    assert info["present"] and info["version"] and info["nvidia_runtime"] is False and "runc" in info["runtimes"]
    with_nvidia = fixture("docker-info-lab-machine.json").replace('"runc": {', '"nvidia": {"path": "nvidia-container-runtime"}, "runc": {')
    assert parse_docker_info(with_nvidia)["nvidia_runtime"] is True
    assert parse_docker_info(None)["present"] is False and parse_docker_info("not json")["error"]


def test_garbled_swaps_and_docker_info_of_another_shape_read_as_nothing():
    assert parse_swaps("Filename\tType\tSize\tUsed\tPriority\n/swap.img file lots some -2\n") == []
    for text in ("[1]", '{"ServerVersion": "27.0", "Runtimes": ["runc"]}'):
        info = parse_docker_info(text)
        assert info["present"] is False and info["error"] == "docker info did not answer with its JSON object"


def test_package_lists_count_only_package_indexes_and_age_from_the_newest():
    lists = {"deb.debian.org_debian_dists_bookworm_main_binary-arm64_Packages.lz4": 1000.0,
             "ports.ubuntu.com_dists_noble-updates_main_binary-arm64_Packages": 4000.0,
             "deb.debian.org_debian_dists_bookworm_InRelease": 5000.0, "lock": 5000.0}
    assert package_lists(lists, now=4600.4) == {"indexes": 2, "age_seconds": 600}


# dpkg-query -W -f DPKG_QUERY_FORMAT as a lab host answers it (a removed package keeps its config files).
# dpkg-query's lines in DPKG_QUERY_FORMAT: name, version, status, error flag.
DPKG_QUERY = ("earlyoom\t1.7-1+b1\tinstalled\tok\niputils-ping\t3:20221126-1\tconfig-files\tok\n"
              "python3-requests\t2.28.1+dfsg-1\thalf-configured\tok\nrsync\t3.2.7-1\tinstalled\treinstreq\n")


def test_installed_packages_are_only_the_ones_dpkg_holds_installed():
    names = ["earlyoom", "iputils-ping", "python3-requests", "rsync", "python3-prometheus-client"]
    assert installed_packages(DPKG_QUERY, names) == {"earlyoom": "1.7-1+b1", "iputils-ping": None, "python3-requests": None,
                                                     "rsync": None, "python3-prometheus-client": None}


@pytest.mark.parametrize(("pins", "expected"), [
    ({"earlyoom": "1.7-1+b1"}, []),
    ({"earlyoom": ""}, []),
    ({"earlyoom": "1.8-1"}, ["earlyoom"]),
    ({"iputils-ping": ""}, ["iputils-ping"]),
    ({"python3-prometheus-client": "0.16.0-0.1"}, ["python3-prometheus-client"]),
    ({"curl": ""}, ["curl"]),
], ids=["at-its-pin", "any-version", "another-version", "config-files-only", "not-installed", "not-read"])
def test_an_install_is_skipped_only_when_the_facts_show_the_pinned_version(pins, expected):
    host = facts(packages=installed_packages(DPKG_QUERY, ["earlyoom", "iputils-ping", "python3-prometheus-client"]))
    assert packages_to_install(pins, host) == expected


def test_without_the_hosts_facts_every_install_runs():
    assert packages_to_install({"earlyoom": "", "iputils-ping": "3:20221126-1"}, None) == ["earlyoom", "iputils-ping"]


def test_package_names_that_could_be_read_as_options_are_refused():
    assert package_name_problems(["earlyoom", "--admindir=/tmp", "Curl", 3]) == [
        "packages[1]: '--admindir=/tmp' is not a Debian package name (lower-case letters, digits and +.-)",
        "packages[2]: 'Curl' is not a Debian package name (lower-case letters, digits and +.-)",
        "packages[3]: 3 is not a Debian package name (lower-case letters, digits and +.-)"]


def test_a_host_that_never_fetched_its_lists_has_no_index():
    # A freshly built image empties the lists folder: only apt's lock and partial folder's files are left.
    assert package_lists({"lock": 5000.0}, now=5001.0) == {"indexes": 0, "age_seconds": None}
    assert facts(lists=package_lists({}, now=1.0))["package_lists"] == {"indexes": 0, "age_seconds": None}


def test_docker_system_df_gives_the_reclaimable_bytes_of_every_kind():
    recorded = (FIXTURES / "docker-system-df-lab-host.jsonl").read_text()
    assert parse_docker_df(recorded) == 172_900_000
    more = recorded + '{"Active":"0","Reclaimable":"12.5GB","Size":"12.5GB","TotalCount":"9","Type":"Build Cache"}\n'
    assert parse_docker_df(more) == 172_900_000 + 12_500_000_000
    assert parse_docker_df("") is None and parse_docker_df("Error response from daemon: ...\n") is None


def test_a_folders_usage_counts_its_files_never_through_a_link_and_stops_at_its_bound(tmp_path):
    (tmp_path / "a").mkdir()
    for index in range(5):
        (tmp_path / "a" / f"f{index}").write_bytes(b"x" * 8192)
    (tmp_path / "link").symlink_to("/usr")
    found = folder_usage(str(tmp_path))
    assert found["exists"] and found["complete"] and found["used_bytes"] >= 5 * 8192 and found["free_bytes"] > 0
    assert found["used_bytes"] < 1024 * 1024, "the link's target was not counted"
    assert folder_usage(str(tmp_path), limit=2)["complete"] is False
    assert folder_usage(str(tmp_path / "missing")) == {"path": str(tmp_path / "missing"), "exists": False, "used_bytes": 0, "complete": True,
                                                       "free_bytes": None, "total_bytes": None}
