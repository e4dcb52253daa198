"""Parsers of the driver guard, on outputs recorded from real tools.

The dpkg-query and apt-get outputs were recorded from the molecule spark host, where the
lab's driver-like packages are installed through real dpkg and apt. No GPU exists here, so
the nvidia-smi line is the one seed 000 recorded on a DGX Spark (580.178.04).
"""

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._nvidia_driver import (
    judge,
    package_branch,
    parse_apt_simulation,
    parse_dpkg_query,
    parse_nvidia_smi,
)

DPKG_QUERY = (
    "adduser\t3.134\tinstalled\n"
    "dgx-gpu-stack\t1.0\tinstalled\n"
    "libnvidia-compute-580\t580.95.05-0ubuntu1\tinstalled\n"
    "libnvidia-compute-590\t590.44.01-0ubuntu1\tconfig-files\n"
    "nvidia-driver-580-open\t580.95.05-0ubuntu1\tinstalled\n"
    "nvidia-utils-580\t580.95.05-0ubuntu1\tinstalled\n"
    "python3\t3.11.2-1+b1\tinstalled\n"
)

APT_SIMULATION_590 = """\
NOTE: This is only a simulation!
      apt-get needs root privileges for real execution.
      Keep also in mind that locking is deactivated,
      so don't depend on the relevance to the real current situation!
Reading package lists...
Building dependency tree...
Reading state information...
Calculating upgrade...
The following NEW packages will be installed:
  libnvidia-compute-590 nvidia-driver-590-open nvidia-utils-590
The following packages will be upgraded:
  dgx-gpu-stack
1 upgraded, 3 newly installed, 0 to remove and 0 not upgraded.
Inst libnvidia-compute-590 (590.44.01-0ubuntu1 localhost [all])
Inst nvidia-utils-590 (590.44.01-0ubuntu1 localhost [all])
Inst nvidia-driver-590-open (590.44.01-0ubuntu1 localhost [all])
Inst dgx-gpu-stack [1.0] (2.0 localhost [all])
Conf libnvidia-compute-590 (590.44.01-0ubuntu1 localhost [all])
Conf nvidia-utils-590 (590.44.01-0ubuntu1 localhost [all])
Conf nvidia-driver-590-open (590.44.01-0ubuntu1 localhost [all])
Conf dgx-gpu-stack (2.0 localhost [all])
"""

APT_SIMULATION_POINT_RELEASE = """\
Inst nvidia-driver-580-open [580.95.05-0ubuntu1] (580.105.08-0ubuntu1 Ubuntu:24.04/noble-updates [arm64])
Inst linux-modules-nvidia-580-open-6.17.0-1021-nvidia (6.17.0-1021.21 Ubuntu:24.04/noble-updates [arm64])
"""


@pytest.mark.parametrize(
    ("name", "branch"),
    [
        ("nvidia-driver-580", "580"),
        ("nvidia-driver-580-open", "580"),
        ("nvidia-driver-590-server-open", "590"),
        ("libnvidia-compute-580", "580"),
        ("nvidia-utils-580", "580"),
        ("linux-modules-nvidia-580-open-6.17.0-1021-nvidia", "580"),
        ("nvidia-container-toolkit", None),
        ("nvidia-persistenced", None),
        ("dgx-gpu-stack", None),
        ("python3", None),
    ],
)
def test_package_branch(name, branch):
    assert package_branch(name) == branch


def test_dpkg_query_keeps_installed_driver_packages_only():
    assert parse_dpkg_query(DPKG_QUERY) == [
        {"name": "libnvidia-compute-580", "version": "580.95.05-0ubuntu1", "branch": "580"},
        {"name": "nvidia-driver-580-open", "version": "580.95.05-0ubuntu1", "branch": "580"},
        {"name": "nvidia-utils-580", "version": "580.95.05-0ubuntu1", "branch": "580"},
    ]


def test_nvidia_smi_one_line_per_gpu():
    assert parse_nvidia_smi("580.178.04\n") == ["580.178.04"]
    assert parse_nvidia_smi("580.178.04\n580.178.04\n") == ["580.178.04", "580.178.04"]
    assert parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n") == []


def test_apt_simulation_lists_incoming_driver_packages():
    changes = parse_apt_simulation(APT_SIMULATION_590)
    assert [(c["name"], c["version"], c["branch"]) for c in changes] == [
        ("libnvidia-compute-590", "590.44.01-0ubuntu1", "590"),
        ("nvidia-utils-590", "590.44.01-0ubuntu1", "590"),
        ("nvidia-driver-590-open", "590.44.01-0ubuntu1", "590"),
    ]


def test_point_release_within_the_branch_is_allowed():
    changes = parse_apt_simulation(APT_SIMULATION_POINT_RELEASE)
    assert changes[0]["old_version"] == "580.95.05-0ubuntu1"
    assert judge("580", parse_dpkg_query(DPKG_QUERY), ["580.178.04"], changes) == []


def test_judge_names_each_broken_rule():
    packages = parse_dpkg_query(DPKG_QUERY.replace("config-files", "installed"))
    reasons = judge("580", packages, ["590.44.01"], parse_apt_simulation(APT_SIMULATION_590))
    assert len(reasons) == 3
    assert "libnvidia-compute-590 590.44.01-0ubuntu1" in reasons[0]
    assert "nvidia-smi reports driver 590.44.01" in reasons[1]
    assert reasons[2].startswith("the upgrade would bring")
