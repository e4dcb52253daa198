"""Wait until every other node of a cluster answers full frames on the fast link; run by each
cluster node's unit before its container starts (ExecStartPre), so at every boot and at every
start a rank starts only over a link that carries the cluster's MTU.

The verdicts are sparkfleet.vllm's plugins/module_utils/_fabric.py, from the host runtime installed
beside this file: the boot path and the role's fabric gate judge alike. Peers still
booting get until --timeout. Exits 0 once every peer answers, 1 with the failing pairs otherwise.
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import (  # noqa: E402
    mtu_problem,
    parse_ping,
    ping_arguments,
    ping_verdict,
)


def failing_pairs(source, interface, mtu, peers):
    reasons = []
    for name, address in peers:
        completed = subprocess.run(["ping", *ping_arguments(address, mtu, 2, interface)], capture_output=True, text=True, check=False)
        verdict = ping_verdict(source, name, address, mtu, parse_ping(completed.stdout + completed.stderr))
        reasons += [verdict] if verdict else []
    return reasons


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--interface", required=True)
    parser.add_argument("--mtu", type=int, required=True)
    parser.add_argument("--peer", action="append", default=[], help="NAME=ADDRESS of another node")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args(argv)
    problem = mtu_problem(args.mtu)
    if problem:
        parser.error(f"--mtu {problem}")
    peers = [tuple(peer.split("=", 1)) for peer in args.peer]
    deadline = time.monotonic() + args.timeout
    while True:
        reasons = failing_pairs(args.source, args.interface, args.mtu, peers)
        if not reasons or time.monotonic() >= deadline:
            break
        time.sleep(5)
    for reason in reasons:
        print(reason, file=sys.stderr)
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
