#!/usr/bin/python
# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cluster_fabric
short_description: Read a cluster node's RDMA devices and check its fast link to every other node
version_added: 0.4.0
description:
  - Reads the RDMA devices (C(ibdev2netdev)) and the GID table (C(show_gids)) when those tools are installed; a host
    without them reports none, with the reason.
  - With I(peers), the fabric gate of one node - every other node is pinged on the fast link with don't-fragment
    packets that fill a frame of I(mtu) bytes, from the fast interface. A peer whose MTU is smaller drops the frame
    (no reply); a local interface whose MTU is smaller refuses to send it (ping's "message too long"). Each failing
    pair is named.
  - With I(rdma_devices), each device NCCL is configured to use must be present and up.
  - With I(nccl_command), runs an nccl-tests command (for example C(mpirun ... all_gather_perf -b 512M -e 4G -f 2))
    and refuses a peak bus bandwidth below I(nccl_min_busbw_gbs). The role bounds its buffer first; NVIDIA's 16G
    example takes ~32 GB per node and has frozen Sparks.
  - All parsing is in the collection's private module_utils C(_fabric), tested on recorded outputs.
author: sparkfleet.vllm contributors (@sparkfleet)
extends_documentation_fragment:
  - sparkfleet.vllm.attributes
options:
  source:
    description: This node's name in messages (its inventory name).
    type: str
    required: true
  interface:
    description: The fast interface the pings leave from.
    type: str
  peers:
    description: The other nodes on the fast link.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The node's inventory name, in messages.
        type: str
        required: true
      address:
        description: The node's IP address on the fast link.
        type: str
        required: true
  mtu:
    description: The MTU the fast link must carry end to end, from 68 (IPv4's least) to 9216 (the largest jumbo frame).
    type: int
    default: 9000
  count:
    description: Pings per peer, from 1 to 100.
    type: int
    default: 3
  rdma_devices:
    description: RDMA devices NCCL is configured to use (NCCL_IB_HCA); each must be present and up.
    type: list
    elements: str
    default: []
  nccl_command:
    description: An nccl-tests command as a list of arguments; not run when empty.
    type: list
    elements: str
    default: []
  nccl_min_busbw_gbs:
    description: The lowest acceptable peak bus bandwidth of I(nccl_command), in GB/s.
    type: float
    default: 18.0
attributes:
  check_mode:
    support: full
    details: Reads and pings only; the same checks run in check mode.
  diff_mode:
    support: none
    details: Changes nothing, so there is nothing to diff.
  idempotent:
    support: full
    details: Reads and pings only; it never changes the host.
"""

EXAMPLES = r"""
- name: Check the fast link from this node to the others
  sparkfleet.vllm.cluster_fabric:
    source: "{{ inventory_hostname }}"
    interface: enp1s0f0np0
    mtu: 9000
    peers:
      - {name: spark-2, address: 192.168.100.12}
    rdma_devices: [rocep1s0f0, roceP2p1s0f0]
  register: fabric
"""

RETURN = r"""
ok:
  description: True when every peer answered full frames, every expected RDMA device is up and the NCCL test (if run) passed.
  returned: always
  type: bool
reasons:
  description: Each failure, naming the pair or the device.
  returned: always
  type: list
  elements: str
rdma_links:
  description: C(ibdev2netdev)'s devices (device, port, netdev, up); empty without the tool.
  returned: always
  type: list
  elements: dict
gids:
  description: C(show_gids)'s entries (device, port, index, gid, ipv4, version, netdev); empty without the tool.
  returned: always
  type: list
  elements: dict
tools:
  description: Which of ibdev2netdev and show_gids are installed.
  returned: always
  type: dict
pings:
  description: Per peer the target, address, packets sent and received, loss, mean round trip, local MTU refusal and verdict.
  returned: always
  type: list
  elements: dict
nccl:
  description: The NCCL test's rows, average and peak bus bandwidth, when it ran.
  returned: when nccl_command is given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import (
    mtu_problem,
    nccl_verdict,
    parse_nccl_tests,
    parse_ping,
    peer_problem,
    ping_arguments,
    ping_verdict,
    rdma_reasons,
    read_rdma,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._tools import tool_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            source=dict(type="str", required=True),
            interface=dict(type="str"),
            peers=dict(type="list", elements="dict", default=[], options=dict(name=dict(type="str", required=True), address=dict(type="str", required=True))),
            mtu=dict(type="int", default=9000),
            count=dict(type="int", default=3),
            rdma_devices=dict(type="list", elements="str", default=[]),
            nccl_command=dict(type="list", elements="str", default=[]),
            nccl_min_busbw_gbs=dict(type="float", default=18.0),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["peers"]:
        problems = [f"mtu: {problem}" for problem in [mtu_problem(params["mtu"])] if problem]
        if not 1 <= params["count"] <= 100:
            problems.append(f"count: {params['count']} must be from 1 to 100 pings per peer; each takes 0.2 s, and the gate "
                            "must answer before the start it guards")
        problems += [f"peers[{index}]: {problem}" for index, peer in enumerate(params["peers"]) for problem in [peer_problem(peer)] if problem]
        if problems:
            module.fail_json(msg=" | ".join(problems), ok=False, reasons=problems)
    result = {"changed": False, **read_rdma(tool_runner(module)), "pings": []}
    reasons = rdma_reasons(params["source"], params["rdma_devices"], result["rdma_links"])
    ping = module.get_bin_path("ping", required=bool(params["peers"]))
    for peer in params["peers"]:
        _rc, out, err = module.run_command([ping, *ping_arguments(peer["address"], params["mtu"], params["count"], params["interface"])])
        parsed = parse_ping(out + err)
        verdict = ping_verdict(params["source"], peer["name"], peer["address"], params["mtu"], parsed)
        result["pings"].append({"target": peer["name"], "address": peer["address"], **parsed, "ok": verdict is None, "reason": verdict})
        reasons += [verdict] if verdict else []
    if params["nccl_command"]:
        rc, out, err = module.run_command(params["nccl_command"], check_rc=False)
        result["nccl"] = parse_nccl_tests(out)
        result["nccl"]["rc"] = rc
        reasons += nccl_verdict(result["nccl"], params["nccl_min_busbw_gbs"])
        if rc != 0:
            reasons.append(f"the NCCL test exited {rc}: {(err or out).strip()[-300:]}")
    module.exit_json(ok=not reasons, reasons=reasons, **result)


if __name__ == "__main__":
    main()
