#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: diagnose_bundle
short_description: Collect a serving host's diagnostics into one tarball, with every key redacted
version_added: 0.9.0
description:
  - Writes one C(.tar.gz) on the host (mode 0600) holding what a person needs to understand a serving host that
    misbehaves, read from the plan files the collection deployed and from the host itself.
  - The plan files of O(config_dirs) and their last good copies (C(*.json), and the gateway's LiteLLM config); never an
    env file.
  - The state (C(systemctl show)) and the last 1000 journal lines of each of the collection's units (those the plans name
    and every C(sparkfleet-*) unit systemd lists), of earlyoom and of Docker, and C(systemctl list-units 'sparkfleet-*').
  - C(docker inspect) of each planned container, every environment value and every C(--api-key) or C(--hf-token)
    argument redacted, and the last 500 lines of its logs; C(/metrics) of each planned engine (it answers without a key);
    the image digests (C(docker image ls --digests)).
  - The kernel's OOM, C(NVRM) and C(Xid) messages of this boot and the one before (journal, or C(dmesg) without one);
    the kernel and driver versions, the kernel command line, the NVIDIA, CUDA and kernel packages and the apt holds.
  - On a host serving a cluster's rank, the fabric (C(ip -br addr), C(ip -o link), C(ibdev2netdev), C(show_gids)); where
    the tools exist, C(nvidia-smi -q) and the log of C(nvidia-bug-report.sh).
  - A C(MANIFEST.json) lists every member and, for each command, its exit status, its seconds and whether it timed out,
    was not installed or was skipped because the bundle's time was up.
  - Each command runs under O(time_limit) and all of them under O(total_limit); what is left when the time is up is
    skipped and the manifest says so, and the bundle is written with what was collected.
  - Secrets are scrubbed by value, from every member (the plan files and last good copies too). The values are learnt from
    every source the host holds. Every env file of the folders read, and of their last good copies, gives every value
    (env files are where the collection keeps secrets, C(VLLM_API_KEY), C(HF_TOKEN), C(LITELLM_MASTER_KEY), the gateway's
    backend keys, an operator's own names) but those of the engine's and its libraries' public knobs (C(VLLM_*),
    C(NCCL_*), C(CUDA_*), C(PYTHONPATH) and the like, whose addresses and interfaces the bundle must keep readable) unless
    their name holds C(KEY), C(TOKEN), C(SECRET) or C(PASSWORD). Every plan file and last good copy gives the values of
    C(--api-key) and C(--hf-token) in any spelling vLLM's parser takes (C(--hf-token X), C(--hf-token=X), a prefix such as
    C(--hf-tok) or C(--ap), C(_) for C(-), several keys after C(--api-key)) in its command lines and unit file, its
    C(NAME=value) settings and its secret fields (C(api_key), C(master_key); not an C(os.environ/NAME) reference).
    C(docker inspect) gives its containers' environments and arguments. Each value goes as is and as JSON, Python, systemd
    and a shell spell it.
  - Then every C(--api-key VALUE) (any spelling), C(NAME=VALUE) of such a name and C(Bearer VALUE) left is replaced by its
    shape, for a value shorter than 8 characters or none of the host's files named.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  dest:
    description: The folder on the host the bundle is written to; created with mode 0700 when it is missing.
    type: path
    default: /var/lib/sparkfleet/diagnostics
  config_dirs:
    description:
      - The configuration folders of the vllm, cluster and gateway roles (plan files, env files, last good copies), absolute
        paths, as the inventory sets them (C(playbooks/diagnose.yml) passes C(vllm_config_dir), C(cluster_config_dir),
        C(gateway_config_dir) and C(watchdog_plan_dirs)).
      - The default folders are read after them when they exist; an inventory that moved a folder may have left keys in
        the old one, which old journal lines printed.
    type: list
    elements: path
    default: [/etc/sparkfleet/vllm, /etc/sparkfleet/cluster, /etc/sparkfleet/gateway]
  time_limit:
    description: Seconds each command and each C(/metrics) read may take, more than 0 and at most 600.
    type: float
    default: 60
  total_limit:
    description: Seconds the whole collection may take, more than 0 and at most 3600; the commands left are skipped.
    type: float
    default: 300
  keep:
    description:
      - How many of this host's bundles O(dest) keeps, the new one among them, from 1 to 1000; the oldest beyond them are
        removed once the new one is written (only files named C(sparkfleet-diagnose-<this host>-*.tar.gz), never through a
        link), so repeated runs never fill the host's disk.
    type: int
    default: 10
attributes:
  check_mode:
    support: full
    details: Writes nothing and reports what it would collect (plan files, units, containers, C(/metrics) URLs, fabric).
  diff_mode:
    support: none
    details: Writes a new bundle; nothing to compare.
  idempotent:
    support: none
    details: Every run collects a new bundle.
notes:
  - Runs as root, the owner of the env files; an env file it cannot read fails the task, because its keys could not be kept
    out of the bundle.
  - A value shorter than 8 characters is not searched for in free text (it would match ordinary words); the collection's
    keys are 16 characters or more.
  - C(playbooks/diagnose.yml) runs it on every host and fetches each bundle to the controller (docs/diagnose.md).
"""

EXAMPLES = r"""
- name: Collect the host's diagnostics bundle
  sparkfleet.vllm.diagnose_bundle:
    time_limit: 30
  register: bundle

- name: Fetch it to the controller
  ansible.builtin.fetch:
    src: "{{ bundle.path }}"
    dest: "diagnostics/{{ inventory_hostname }}/"
    flat: true
"""

RETURN = r"""
path:
  description: The bundle on the host (in check mode, where it would be written).
  returned: always
  type: str
  sample: /var/lib/sparkfleet/diagnostics/sparkfleet-diagnose-spark-1-20261204T101500Z.tar.gz
members:
  description: The bundle's members, under one folder named after the bundle; empty in check mode.
  returned: always
  type: list
  elements: str
  sample: [plans/vllm/llm.json, kernel.txt, containers/vllm-llm.inspect.json, MANIFEST.json]
problems:
  description: What could not be collected (a command that timed out, a /metrics that did not answer, the total limit reached).
  returned: always
  type: list
  elements: str
size:
  description: The bundle's size in bytes; 0 in check mode.
  returned: always
  type: int
removed:
  description: The older bundles removed from O(dest) by O(keep) (in check mode, those a run would remove).
  returned: always
  type: list
  elements: str
would_collect:
  description: What the plans name, C(plan_files), C(units), C(containers), C(metrics) (name to URL) and C(cluster) (whether
    the fabric is read); the systemd units listed, earlyoom and docker, and the host's own commands come on top.
  returned: in check mode
  type: dict
"""

import socket
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._diagnose import (
    CONFIG_DIRS,
    DiagnoseError,
    bundle_path,
    bundle_prefix,
    collect_host_bundle,
    config_dir_problems,
    config_folders,
    survey,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import prune_oldest


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", default="/var/lib/sparkfleet/diagnostics"),
            config_dirs=dict(type="list", elements="path", default=list(CONFIG_DIRS)),
            time_limit=dict(type="float", default=60),
            total_limit=dict(type="float", default=300),
            keep=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not 0 < params["time_limit"] <= 600 or not 0 < params["total_limit"] <= 3600:
        module.fail_json(msg=f"time_limit ({params['time_limit']}) must be more than 0 and at most 600 seconds, and total_limit "
                             f"({params['total_limit']}) more than 0 and at most 3600 (diagnose_time_limit, diagnose_total_limit)")
    if not 1 <= params["keep"] <= 1000:
        module.fail_json(msg=f"keep ({params['keep']}) must be from 1 to 1000 bundles (diagnose_keep)")
    problems = config_dir_problems(params["config_dirs"])
    if problems:
        module.fail_json(msg="; ".join(problems))
    folders = config_folders(params["config_dirs"])
    host = socket.gethostname()
    path = bundle_path(params["dest"], host, time.time())
    try:
        if module.check_mode:
            found = survey(folders)
            would_collect = {"plan_files": sorted(found["files"]), "units": found["units"], "containers": found["containers"],
                             "metrics": found["metrics"], "cluster": found["cluster"]}
            # The new bundle counts among those kept.
            would_remove = prune_oldest(params["dest"], bundle_prefix(host), ".tar.gz", params["keep"] - 1, dry_run=True)
            module.exit_json(changed=True, path=path, members=[], problems=found["problems"], size=0, removed=would_remove,
                             would_collect=would_collect)
        result = collect_host_bundle(path, folders, params["time_limit"], params["total_limit"])
    except (DiagnoseError, OSError) as error:
        module.fail_json(msg=f"the diagnostics bundle could not be made: {error}", path=path)
    module.exit_json(changed=True, removed=prune_oldest(params["dest"], bundle_prefix(host), ".tar.gz", params["keep"]), **result)


if __name__ == "__main__":
    main()
