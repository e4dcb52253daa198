"""Parsers of the driver guard, on outputs recorded from real tools.

The dpkg-query and apt-get outputs were recorded from the molecule spark host, where the
lab's driver-like packages are installed through real dpkg and apt. No GPU exists here, so
the nvidia-smi line is the one seed 000 recorded on a DGX Spark (580.178.04), and the one recorded
on an H100 with driver 580.159.04 (/work/shared/recorded/nvidia-h100-driver-580.159.04).

DPKG_INTERRUPTED was recorded from real dpkg 1.21 (dpkg-query -W -f DPKG_QUERY_FORMAT --admindir)
in a scratch root holding stand-in packages of the driver's names at 580.159.04 (the H100's
driver) and 590.44.01: one install whose postinst failed (iF), one only unpacked (iU), a file
trigger left awaited and pending (iW, it, dpkg --no-triggers), and another branch removed with
its conffile left (rc). dpkg -l printed those abbreviations for the same database. A half-installed
package needing a reinstall (iHR) could not be provoked there (dpkg rolled the failed upgrade
back); its line is written by hand in dpkg's format.
"""

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._nvidia_driver import (
    DPKG_QUERY_FORMAT,
    installed,
    judge,
    kernel_line,
    kernel_reasons,
    package_branch,
    package_flavour,
    parse_apt_simulation,
    parse_dpkg_query,
    parse_incoming_kernels,
    parse_kernel_packages,
    parse_nvidia_smi,
    unfinished,
)

DPKG_QUERY = (
    "adduser\t3.134\tinstalled\tok\n"
    "dgx-gpu-stack\t1.0\tinstalled\tok\n"
    "libnvidia-compute-580\t580.95.05-0ubuntu1\tinstalled\tok\n"
    "libnvidia-compute-575\t575.57.08-0ubuntu1\tnot-installed\tok\n"
    "libnvidia-gl-580\t580.82.07-0ubuntu1\tconfig-files\tok\n"
    "nvidia-driver-580-open\t580.95.05-0ubuntu1\tinstalled\tok\n"
    "nvidia-utils-580\t580.95.05-0ubuntu1\tinstalled\tok\n"
    "python3\t3.11.2-1+b1\tinstalled\tok\n"
)

DPKG_INTERRUPTED = """\
libnvidia-compute-580\t580.159.04-0ubuntu1\tinstalled\tok
libnvidia-gl-580\t580.159.04-0ubuntu1\tinstalled\tok
nvidia-dkms-580\t580.159.04-0ubuntu1\ttriggers-awaited\tok
nvidia-driver-580-open\t580.159.04-0ubuntu1\tinstalled\tok
nvidia-driver-590-open\t590.44.01-0ubuntu1\tunpacked\tok
nvidia-kernel-common-590\t590.44.01-0ubuntu1\tconfig-files\tok
nvidia-kernel-source-580\t580.159.04-0ubuntu1\ttriggers-pending\tok
nvidia-utils-580\t580.159.04-0ubuntu1\thalf-configured\tok
"""
HALF_INSTALLED_REINSTREQ = "libnvidia-gl-580\t580.159.05-0ubuntu1\thalf-installed\treinstreq\n"
H100_SMI = "580.159.04\n"

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


def test_dpkg_query_format_asks_for_the_state_and_the_error_flag():
    assert DPKG_QUERY_FORMAT.split("\\t")[2:] == ["${db:Status-Status}", "${db:Status-Eflag}\\n"]


def test_dpkg_query_keeps_installed_driver_packages_only():
    assert installed(parse_dpkg_query(DPKG_QUERY)) == [
        {"name": "libnvidia-compute-580", "version": "580.95.05-0ubuntu1", "branch": "580"},
        {"name": "nvidia-driver-580-open", "version": "580.95.05-0ubuntu1", "branch": "580"},
        {"name": "nvidia-utils-580", "version": "580.95.05-0ubuntu1", "branch": "580"},
    ]


def test_nvidia_smi_one_line_per_gpu():
    assert parse_nvidia_smi("580.178.04\n") == ["580.178.04"]
    assert parse_nvidia_smi(H100_SMI) == ["580.159.04"]
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
    packages = parse_dpkg_query(DPKG_QUERY.replace("libnvidia-compute-575", "libnvidia-compute-590").replace("not-installed", "installed"))
    reasons = judge("580", packages, ["590.44.01"], parse_apt_simulation(APT_SIMULATION_590))
    assert len(reasons) == 3
    assert "libnvidia-compute-590 575.57.08-0ubuntu1" in reasons[0]
    assert "nvidia-smi reports driver 590.44.01" in reasons[1]
    assert reasons[2].startswith("the upgrade would bring")


def test_removed_packages_leave_harmless_config_files_of_any_branch():
    """rc of the allowed branch (an older libnvidia-gl-580 removed), of another branch (what apt remove leaves after a
    570 to 580 change; a review found a healthy host refused for it) and dpkg's not-installed entries are no install."""
    packages = parse_dpkg_query(DPKG_QUERY)
    assert unfinished("580", packages) == []
    assert judge("580", packages, parse_nvidia_smi(H100_SMI), []) == []
    left = parse_dpkg_query(only(DPKG_INTERRUPTED, "nvidia-kernel-common-590"))
    assert unfinished("580", left) == [] and judge("580", left, [], None) == []


def test_recorded_interrupted_installs_are_named_with_their_state():
    packages = parse_dpkg_query(DPKG_INTERRUPTED)
    assert [p["name"] for p in installed(packages)] == ["libnvidia-compute-580", "libnvidia-gl-580", "nvidia-driver-580-open"]
    assert [(p["name"], p["status"]) for p in unfinished("580", packages)] == [
        ("nvidia-dkms-580", "triggers-awaited"),
        ("nvidia-driver-590-open", "unpacked"),
        ("nvidia-kernel-source-580", "triggers-pending"),
        ("nvidia-utils-580", "half-configured"),
    ]
    own, other = judge("580", packages, parse_nvidia_smi(H100_SMI), [])
    assert own.startswith("dpkg did not finish installing driver packages of branch 580: nvidia-dkms-580 580.159.04-0ubuntu1 (iW")
    assert "nvidia-utils-580 580.159.04-0ubuntu1 (iF, half-configured" in own and "(it, triggers pending)" in own
    assert "sudo dpkg --configure -a" in own and "apt-get -f install" in own
    assert "branch 590, not 580" in other and "nvidia-driver-590-open 590.44.01-0ubuntu1 (iU, unpacked" in other
    assert "nvidia-kernel-common-590" not in other, "rc: what apt remove leaves after a branch change, no half install"
    assert other.endswith("sudo apt-get purge nvidia-driver-590-open) and run the guard again")


def only(lines, *names):
    return "".join(line + "\n" for line in lines.splitlines() if line.split("\t")[0] in names)


@pytest.mark.parametrize(
    ("dpkg", "allowed", "fragments"),
    [
        pytest.param(only(DPKG_INTERRUPTED, "nvidia-utils-580"), "580", ["branch 580: nvidia-utils-580", "(iF"], id="iF-own-branch"),
        pytest.param(only(DPKG_INTERRUPTED, "nvidia-driver-590-open"), "580", ["branch 590, not 580", "(iU", "purge nvidia-driver-590-open"],
                     id="iU-other-branch"),
        pytest.param(only(DPKG_INTERRUPTED, "nvidia-dkms-580"), "580", ["(iW, awaiting"], id="iW"),
        pytest.param(only(DPKG_INTERRUPTED, "nvidia-kernel-source-580"), "580", ["(it, triggers pending"], id="it"),
        pytest.param(HALF_INSTALLED_REINSTREQ, "580", ["libnvidia-gl-580 580.159.05-0ubuntu1 (iH, half-installed", "reinstall required"],
                     id="iHR"),
        pytest.param(HALF_INSTALLED_REINSTREQ.replace("half-installed", "installed"), "580", ["(installed, reinstall required)"],
                     id="installed-but-reinstreq"),
        pytest.param(only(DPKG_INTERRUPTED, "nvidia-driver-590-open", "nvidia-utils-580"), "580",
                     ["branch 580: nvidia-utils-580", "branch 590, not 580"], id="mix-of-branches"),
        pytest.param(only(DPKG_INTERRUPTED, "nvidia-utils-580").replace("580", "575"), "580", ["branch 575, not 580", "purge nvidia-utils-575"],
                     id="iF-other-branch"),
    ],
)
def test_each_unfinished_state_is_refused_with_its_fix(dpkg, allowed, fragments):
    reasons = judge(allowed, parse_dpkg_query(dpkg), [], None)
    assert reasons, dpkg
    joined = "; ".join(reasons)
    for fragment in fragments:
        assert fragment in joined


def test_the_allowed_branch_keeps_its_own_config_files_whichever_it_is():
    dpkg = only(DPKG_INTERRUPTED, "nvidia-driver-590-open", "nvidia-kernel-common-590")
    reasons = judge("590", parse_dpkg_query(dpkg), [], None)
    assert len(reasons) == 1 and "branch 590: nvidia-driver-590-open 590.44.01-0ubuntu1 (iU" in reasons[0]
    assert "nvidia-kernel-common-590" not in reasons[0]


@pytest.mark.parametrize("line", ["garbled", "a\tb\tc", "nvidia-driver-580\t1\tinstalled\tok\textra", ""])
def test_dpkg_lines_of_another_shape_are_skipped(line):
    assert parse_dpkg_query(line) == []


# Written by hand in dpkg-query's format (DPKG_QUERY_FORMAT), with the package names DGX OS and
# Ubuntu give the proprietary and the open kernel modules and the kernels; no GB10 is here.
DPKG_PROPRIETARY_ON_617 = """\
libnvidia-compute-580\t580.173.02-0ubuntu1\tinstalled\tok
nvidia-driver-580\t580.173.02-0ubuntu1\tinstalled\tok
nvidia-dkms-580\t580.173.02-0ubuntu1\tinstalled\tok
linux-modules-nvidia-580-6.17.0-1021-nvidia\t6.17.0-1021.21\tinstalled\tok
linux-image-6.17.0-1021-nvidia\t6.17.0-1021.21\tinstalled\tok
linux-image-6.14.0-1015-nvidia\t6.14.0-1015.15\tconfig-files\tok
linux-nvidia-hwe-24.04\t6.17.0-1021.21\tinstalled\tok
linux-image-nvidia-hwe-24.04\t6.17.0-1021.21\tinstalled\tok
linux-headers-6.17.0-1021-nvidia\t6.17.0-1021.21\tinstalled\tok
linux-nvidia-6.17-tools-6.17.0-1021\t6.17.0-1021.21\tinstalled\tok
linux-firmware\t20240318.git3b128b60-0ubuntu2\tinstalled\tok
linux-libc-dev\t6.8.0-51.52\tinstalled\tok
linux-nvidia-tools-common\t6.17.0-1021.21\tinstalled\tok
"""
APT_SIMULATION_KERNEL_7 = """\
Inst linux-image-7.0.0-1004-nvidia (7.0.0-1004.4 Ubuntu:24.04/noble-updates [arm64])
Inst linux-modules-nvidia-580-open-7.0.0-1004-nvidia (7.0.0-1004.4 Ubuntu:24.04/noble-updates [arm64])
Inst linux-nvidia-hwe-24.04 [6.17.0-1021.21] (7.0.0-1004.4 Ubuntu:24.04/noble-updates [arm64])
Inst nvidia-driver-580 [580.95.05-0ubuntu1] (580.173.02-0ubuntu1 Ubuntu:24.04/noble-updates [arm64])
"""


@pytest.mark.parametrize(
    ("name", "flavour"),
    [
        ("nvidia-driver-580-open", "open"),
        ("nvidia-driver-580-server-open", "open"),
        ("nvidia-dkms-580-open", "open"),
        ("linux-modules-nvidia-580-open-6.17.0-1021-nvidia", "open"),
        ("linux-signatures-nvidia-580-open-6.17.0-1021-nvidia", "open"),
        ("nvidia-driver-580", "proprietary"),
        ("nvidia-driver-580-server", "proprietary"),
        ("nvidia-kernel-source-580", "proprietary"),
        ("linux-modules-nvidia-580-6.17.0-1021-nvidia", "proprietary"),
        ("libnvidia-compute-580", None),
        ("nvidia-utils-580", None),
        ("nvidia-kernel-common-580", None),
        ("linux-image-6.17.0-1021-nvidia", None),
    ],
)
def test_package_flavour(name, flavour):
    assert package_flavour(name) == flavour


def test_open_flavour_refuses_the_proprietary_modules_installed_and_incoming():
    packages = parse_dpkg_query(DPKG_PROPRIETARY_ON_617)
    reasons = judge("580", packages, ["580.173.02"], parse_apt_simulation(APT_SIMULATION_KERNEL_7), "open")
    assert len(reasons) == 2, reasons
    installed_reason, incoming_reason = reasons
    assert "proprietary kernel-module flavour are installed: nvidia-driver-580 580.173.02-0ubuntu1, nvidia-dkms-580" in installed_reason
    assert "linux-modules-nvidia-580-6.17.0-1021-nvidia 6.17.0-1021.21" in installed_reason
    assert "libnvidia-compute-580" not in installed_reason, "userspace libraries are the same in both flavours"
    assert "Xid 169" in installed_reason and "install nvidia-driver-580-open" in installed_reason
    assert "sparkfleet_hardware_overrides.driver_flavour" in installed_reason
    assert incoming_reason.startswith("the upgrade would bring driver packages of the proprietary kernel-module flavour: nvidia-driver-580 ")
    assert "linux-modules-nvidia-580-open-7.0.0" not in incoming_reason


def test_either_flavour_passes_where_the_board_names_none():
    packages = parse_dpkg_query(DPKG_PROPRIETARY_ON_617)
    assert judge("580", packages, ["580.173.02"], [], None) == []
    assert judge("580", parse_dpkg_query(DPKG_QUERY), ["580.178.04"], [], "open") == [], "the open flavour passes"


def test_kernel_packages_installed_releases_and_metapackages():
    kernels = parse_kernel_packages(DPKG_PROPRIETARY_ON_617)
    assert kernels == {"releases": ["6.17.0-1021-nvidia"], "metapackages": ["linux-nvidia-hwe-24.04", "linux-image-nvidia-hwe-24.04"]}
    assert parse_kernel_packages(DPKG_QUERY) == {"releases": [], "metapackages": []}


@pytest.mark.parametrize(
    ("release", "line"),
    [("6.17.0-1021-nvidia", "6.17"), ("7.0.0-1004-nvidia", "7.0"), ("6.18.44-fc-v1272", "6.18"), ("6.8", "6.8"), ("garbled", None)],
)
def test_kernel_line(release, line):
    assert kernel_line(release) == line


def test_kernel_off_the_validated_line_is_refused_running_and_incoming():
    incoming = parse_incoming_kernels(APT_SIMULATION_KERNEL_7)
    assert incoming == [{"name": "linux-image-7.0.0-1004-nvidia", "version": "7.0.0-1004.4", "release": "7.0.0-1004-nvidia"}]
    metas = parse_kernel_packages(DPKG_PROPRIETARY_ON_617)["metapackages"]
    assert kernel_reasons("6.17", "6.17.0-1021-nvidia", [], metas) == []
    assert kernel_reasons(None, "7.0.0-1004-nvidia", incoming, metas) == [], "no line: any kernel passes"
    (upgrade,) = kernel_reasons("6.17", "6.17.0-1021-nvidia", incoming, metas)
    assert "would bring a kernel off the 6.17 line" in upgrade and "linux-image-7.0.0-1004-nvidia 7.0.0-1004.4" in upgrade
    assert "RoCE regression" in upgrade and "sudo apt-mark hold linux-nvidia-hwe-24.04 linux-image-nvidia-hwe-24.04" in upgrade
    running = kernel_reasons("6.17", "7.0.0-1004-nvidia", incoming, [])[0]
    assert running.startswith("the running kernel 7.0.0-1004-nvidia is not on the 6.17 line")
    assert "sparkfleet_hardware_overrides.kernel_line" in running
    assert "hold the kernel metapackage" in kernel_reasons("6.17", "6.17.0-1", incoming, [])[0]


def test_a_newer_kernel_off_the_line_waiting_for_the_next_boot_is_refused():
    """GRUB boots the newest installed kernel: a 7.x one installed beside the running 6.17 takes over at the reboot the
    guard is run before; an older one off the line (a previous install's 6.14) stays unused."""
    installed = ["6.14.0-1015-nvidia", "6.17.0-1021-nvidia", "7.0.0-1004-nvidia"]
    (waiting,) = kernel_reasons("6.17", "6.17.0-1021-nvidia", [], ["linux-nvidia-hwe-24.04"], installed)
    assert waiting.startswith("a kernel off the 6.17 line is installed and newer than the running one, so GRUB boots it at the next "
                              "reboot: 7.0.0-1004-nvidia")
    assert "sudo apt-get purge linux-image-7.0.0-1004-nvidia" in waiting and "apt-mark hold linux-nvidia-hwe-24.04" in waiting
    assert kernel_reasons("6.17", "6.17.0-1021-nvidia", [], [], installed[:2]) == []


def test_half_installed_proprietary_modules_are_purged_not_finished_on_a_gb10():
    """Finishing them (dpkg --configure -a) would install modules a GB10 cannot run."""
    packages = parse_dpkg_query("nvidia-driver-580-open\t580.159.04-0ubuntu1\tinstalled\tok\n"
                                "nvidia-dkms-580\t580.159.04-0ubuntu1\thalf-configured\tok\n")
    (reason,) = judge("580", packages, [], None, "open")
    assert "proprietary kernel-module flavour are installed: nvidia-dkms-580" in reason and "sudo apt-get purge nvidia-dkms-580" in reason
    assert "dpkg --configure -a" not in reason
    either = judge("580", packages, [], None, None)
    assert len(either) == 1 and "sudo dpkg --configure -a" in either[0], "without the flavour rule: finish it, as before"
