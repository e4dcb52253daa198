#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_info
short_description: Report the installed NVIDIA driver branch and the branch an upgrade would bring
version_added: 0.1.0
description:
  - Reads the installed NVIDIA driver packages with C(dpkg-query), the running driver with
    C(nvidia-smi --query-gpu=driver_version) where that command exists, and optionally what an
    C(apt-get --simulate) upgrade would install.
  - Judges the result against an allowed driver branch and returns C(ok) with the reasons. An install dpkg did not
    finish (a driver package unpacked, half-configured, half-installed, awaiting or holding triggers, or needing a
    reinstall) breaks the rule, and so do the configuration files a removal of another branch left behind.
    It never fails because of the judgement; the caller decides (see the C(driver_guard) role).
  - Seed 000 keeps DGX Spark hosts on the 580 branch because 590 had a CUDA-graph deadlock on GB10.
  - Where O(flavour=open), installed or incoming packages of the proprietary kernel-module flavour break the rule (a GB10
    initialises only with the open modules); where O(kernel_line) is set, so do a running kernel and a kernel the simulated
    upgrade would install off that line (the hardware class's C(driver_flavour) and C(kernel_line)).
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  allowed_branch:
    description: The driver branch the host must stay on, as its three-digit major version.
    type: str
    default: "580"
  simulate_upgrade:
    description:
      - Also simulate an upgrade with C(apt-get --simulate) and report the driver packages it would bring.
      - The simulation changes nothing; refresh the package lists beforehand for a meaningful answer.
    type: bool
    default: false
  upgrade_command:
    description: The apt-get command to simulate.
    type: str
    choices: [dist-upgrade, upgrade]
    default: dist-upgrade
  flavour:
    description:
      - The kernel-module flavour the driver must have; C(open) refuses the proprietary modules. Unset, either passes.
    type: str
    choices: [open]
  kernel_line:
    description:
      - The kernel line (major.minor, such as C(6.17)) the host must run and an upgrade must keep. Unset, any passes.
    type: str
attributes:
  check_mode:
    support: full
    details: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    details: Changes nothing, so there is nothing to diff.
  idempotent:
    support: full
    details: Reads only; a simulated upgrade changes nothing.
notes:
  - Driver packages are recognised by name, for example C(nvidia-driver-580-open), C(libnvidia-compute-580)
    and C(linux-modules-nvidia-580-open-6.17.0-1021-nvidia).
"""

EXAMPLES = r"""
- name: Read the driver branch and what a dist-upgrade would bring
  sparkfleet.vllm.nvidia_driver_info:
    allowed_branch: "580"
    simulate_upgrade: true
  register: driver

- name: Refuse to go on when the branch rule is broken
  ansible.builtin.assert:
    that: driver.ok
    fail_msg: "{{ driver.reasons | join('; ') }}"
"""

RETURN = r"""
ok:
  description: Whether the host keeps the allowed branch, now and after the simulated upgrade.
  returned: always
  type: bool
reasons:
  description: Why the host breaks the rule; empty when RV(ok) is true.
  returned: always
  type: list
  elements: str
packages:
  description: Installed driver packages (dpkg finished installing them).
  returned: always
  type: list
  elements: dict
  sample: [{"name": "nvidia-driver-580-open", "version": "580.95.05-0ubuntu1", "branch": "580"}]
unfinished:
  description: Driver packages an interrupted install or removal left in another state than installed.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "nvidia-driver-590-open", "version": "590.44.01-0ubuntu1", "branch": "590", "status": "unpacked",
            "error_flag": "ok"}]
branches:
  description: The distinct branches of the installed driver packages.
  returned: always
  type: list
  elements: str
  sample: ["580"]
nvidia_smi_versions:
  description: Driver versions reported by nvidia-smi, one per GPU; empty when nvidia-smi is absent.
  returned: always
  type: list
  elements: str
flavour:
  description: The kernel-module flavour the host was judged against (O(flavour)); null for either.
  returned: always
  type: str
kernel:
  description:
    - The validated line it was judged against (O(kernel_line), null for any), the running kernel release, the installed
      kernel releases, the installed kernel metapackages (what moves a host to newer kernels, held by the C(driver_guard)
      role where O(kernel_line) is set), and the kernels the simulated upgrade would install (when O(simulate_upgrade) is
      true).
  returned: always
  type: dict
  sample: {"line": "6.17", "running": "6.17.0-1021-nvidia", "releases": ["6.17.0-1021-nvidia"], "metapackages": ["linux-nvidia-hwe-24.04"],
           "incoming": []}
upgrade_changes:
  description: Driver packages the simulated upgrade would install or upgrade.
  returned: when O(simulate_upgrade) is true
  type: list
  elements: dict
  sample: [{"name": "nvidia-driver-590", "version": "590.44.01-0ubuntu1", "old_version": null, "branch": "590"}]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._nvidia_driver import (
    DPKG_QUERY_FORMAT,
    KERNEL_LINE_FORMAT,
    NVIDIA_SMI_ARGS,
    installed,
    judge,
    kernel_reasons,
    parse_apt_simulation,
    parse_dpkg_query,
    parse_incoming_kernels,
    parse_kernel_packages,
    parse_nvidia_smi,
    unfinished,
)


def run_checked(module, args, what):
    rc, out, err = module.run_command(args, environ_update={"LC_ALL": "C"})
    if rc != 0:
        reason = f"{what} failed (rc={rc}): {err.strip() or out.strip()}"
        module.fail_json(msg=reason, ok=False, reasons=[reason], rc=rc, stdout=out, stderr=err)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            allowed_branch=dict(type="str", default="580"),
            simulate_upgrade=dict(type="bool", default=False),
            upgrade_command=dict(type="str", default="dist-upgrade", choices=["dist-upgrade", "upgrade"]),
            flavour=dict(type="str", choices=["open"]),
            kernel_line=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    line = module.params["kernel_line"]
    if line is not None and not KERNEL_LINE_FORMAT.fullmatch(line):
        module.fail_json(msg=f"kernel_line: {line!r} is not a kernel line; give its major.minor such as '6.17', or leave it unset for any")
    dpkg_query = module.get_bin_path("dpkg-query", required=True)
    listing = run_checked(module, [dpkg_query, "-W", "-f", DPKG_QUERY_FORMAT], "dpkg-query")
    known = parse_dpkg_query(listing)
    packages = installed(known)
    kernel = {"running": os.uname().release, "line": line, **parse_kernel_packages(listing), "incoming": []}

    smi_versions = []
    nvidia_smi = module.get_bin_path("nvidia-smi")
    if nvidia_smi:
        smi_versions = parse_nvidia_smi(run_checked(module, [nvidia_smi, *NVIDIA_SMI_ARGS], "nvidia-smi"))

    result = dict(changed=False, packages=packages, nvidia_smi_versions=smi_versions, flavour=module.params["flavour"],
                  unfinished=unfinished(module.params["allowed_branch"], known))
    result["branches"] = sorted({p["branch"] for p in packages})
    upgrade_changes = None
    if module.params["simulate_upgrade"]:
        apt_get = module.get_bin_path("apt-get", required=True)
        simulation = run_checked(
            module,
            [apt_get, "--simulate", "-o", "Debug::NoLocking=1", module.params["upgrade_command"]],
            "apt-get --simulate " + module.params["upgrade_command"],
        )
        upgrade_changes = parse_apt_simulation(simulation)
        result["upgrade_changes"] = upgrade_changes
        kernel["incoming"] = parse_incoming_kernels(simulation)
    result["kernel"] = kernel

    result["reasons"] = judge(module.params["allowed_branch"], known, smi_versions, upgrade_changes, module.params["flavour"])
    result["reasons"] += kernel_reasons(module.params["kernel_line"], kernel["running"], kernel["incoming"], kernel["metapackages"],
                                        kernel["releases"])
    result["ok"] = not result["reasons"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
