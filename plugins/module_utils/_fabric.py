# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fast link between cluster nodes: what the tools say about it, and whether it is fit.

Private to the collection. Pure functions over the text of ``ping`` (iputils), ``ibdev2netdev``,
``show_gids`` and nccl-tests, and over Ansible's interface facts; ``read_rdma`` runs the two RDMA
tools through the runner its module hands it. Standard library only: part of the host runtime
(_host_runtime.RUNTIME_MODULES) the ranks' fabric wait (roles/cluster/files/cluster_fabric_wait.py) imports. Seed 002's fast link carries
NCCL between two GB10 boxes; one QSFP cable shows as two RDMA devices and both belong in
NCCL_IB_HCA; full bandwidth needs MTU 9000; NVIDIA's 16G all_gather buffer takes ~32 GB per node
and has frozen Sparks, so the bandwidth test's buffer is bounded.
"""

from __future__ import annotations

import ipaddress
import re
import typing as t

GIB = 1024 ** 3
# IPv4 and ICMP headers: a don't-fragment ping of MTU - 28 bytes of payload fills one frame.
PING_HEADERS = 28
# The MTUs that ping can fill a frame of: from IPv4's least (RFC 791) to the largest jumbo frame
# Ethernet NICs and switches carry.
MTU_MIN, MTU_MAX = 68, 9216
MTU_WHY = (f"the fabric gate's don't-fragment ping fills a frame with MTU - {PING_HEADERS} bytes, so the MTU must be one "
           f"IPv4 carries ({MTU_MIN} at least) and an Ethernet link can (jumbo frames stop at {MTU_MAX}; seed 002's link runs 9000)")
PING_SUMMARY = re.compile(r"(?P<sent>\d+) packets transmitted, (?P<received>\d+) (?:packets )?received"
                          r"(?:, \+(?P<errors>\d+) errors)?")
PING_RTT = re.compile(r"rtt min/avg/max/mdev = [\d.]+/(?P<avg>[\d.]+)/")
PING_TOO_LONG = re.compile(r"message too long, mtu=(?P<mtu>\d+)")
IBDEV2NETDEV = re.compile(r"(?P<device>\S+) port (?P<port>\d+) ==> (?P<netdev>\S+) \((?P<state>\w+)\)")
# nccl-tests' parsesize (src/common.cu): sscanf("%lf %1s"), a number, then a K, M or G (either case) whose
# following characters it ignores (8G, 8 GB, 1.5g, 512M). A hexadecimal, negative or infinite number is refused here.
SIZE = re.compile(r"\s*(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(?:(?P<unit>[KMGkmg])\S*)?\s*")
UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": GIB}
# nccl-tests' getopt_long table (src/common.cu), over its releases: every option takes a value but --help; a
# long option may be shortened to any prefix no other option shares, and a short one glued to its value.
NCCL_LONG_OPTIONS = {
    "nthreads": "t", "ngpus": "g", "minbytes": "b", "maxbytes": "e", "stepbytes": "i", "stepfactor": "f", "iters": "n",
    "agg_iters": "m", "warmup_iters": "w", "run_cycles": "N", "parallel_init": "p", "check": "c", "op": "o", "datatype": "d",
    "root": "r", "blocking": "z", "stream_null": "y", "timeout": "T", "cudagraph": "G", "report_cputime": "C",
    "report_timestamps": "S", "output_file": "J", "average": "a", "local_register": "R", "cta_policy": "x",
    "device_implementation": "D", "device_cta_count": "V", "memory": "M", "unalign": "u", "per_iter_timing": "I",
    "per_iter_skip": "K", "help": "h",
}
# -F was --output_file before -J took it over.
NCCL_SHORT_OPTIONS = frozenset(NCCL_LONG_OPTIONS.values()) | {"F"}
NCCL_DEFAULT_BYTES = 32 * 1024 ** 2
# all_gather_perf, all_reduce_perf, sendrecv_perf ... and the _mpi builds some packages name apart.
NCCL_TESTS_BINARY = re.compile(r"[a-z0-9_]+_perf(?:_mpi)?")
NCCL_TESTS_NAMED = re.compile(r"\b[a-z0-9_]+_perf(?:_mpi)?\b")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "busybox", "fish", "csh", "tcsh"})
NCCL_VARIABLE = "cluster_nccl_test_command"
NCCL_ROW = re.compile(r"^\s*(?P<size>\d+)\s+(?P<count>\d+)?\s*(?:\S+\s+){0,4}?(?P<time>[\d.]+)\s+(?P<algbw>[\d.]+)\s+(?P<busbw>[\d.]+)")
NCCL_AVERAGE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(?P<busbw>[\d.]+)")


def mtu_problem(mtu: t.Any) -> str | None:
    """Why ``mtu`` is not one the gate's ping can fill a frame of (None: it is)."""
    if isinstance(mtu, int) and not isinstance(mtu, bool) and MTU_MIN <= mtu <= MTU_MAX:
        return None
    return f"{mtu!r} must be a whole number from {MTU_MIN} to {MTU_MAX}; {MTU_WHY}"


def ping_arguments(address: str, mtu: int, count: int, interface: str | None) -> list[str]:
    """ping's arguments for don't-fragment packets that fill one frame of ``mtu`` bytes, from ``interface``."""
    arguments = ["-M", "do", "-s", str(mtu - PING_HEADERS), "-c", str(count), "-i", "0.2", "-W", "2"]
    return arguments + (["-I", interface] if interface else []) + [address]


def parse_ping(text: str) -> dict[str, t.Any]:
    """iputils ping's summary: packets sent and received, loss, mean round trip, and the local
    MTU when the kernel refused a don't-fragment packet larger than the interface carries."""
    summary = PING_SUMMARY.search(text or "")
    rtt = PING_RTT.search(text or "")
    too_long = PING_TOO_LONG.search(text or "")
    sent = int(summary["sent"]) if summary else 0
    received = int(summary["received"]) if summary else 0
    return {
        "sent": sent,
        "received": received,
        "loss_pct": round(100.0 * (sent - received) / sent, 1) if sent else 100.0,
        "rtt_avg_ms": float(rtt["avg"]) if rtt else None,
        "local_mtu": int(too_long["mtu"]) if too_long else None,
        "parsed": bool(summary),
    }


def ping_verdict(source: str, target: str, address: str, mtu: int, result: t.Mapping[str, t.Any]) -> str | None:
    """Why a don't-fragment ping of a full ``mtu`` frame from ``source`` to ``target`` shows the
    link unfit (None: fit). A frame the peer's smaller MTU drops shows as loss, not as an error."""
    where = f"{source} -> {target} ({address}) at MTU {mtu}"
    if not result["parsed"]:
        return f"{where}: ping gave no summary (is {address} an address, is iputils ping installed?)"
    if result["local_mtu"] is not None:
        return f"{where}: the local interface carries only {result['local_mtu']} bytes; set its MTU to {mtu} (seed 002: full bandwidth needs 9000)"
    if result["received"] < result["sent"]:
        lost = "no reply" if result["received"] == 0 else f"{result['loss_pct']} % lost"
        return (f"{where}: {lost} to don't-fragment pings of {mtu - PING_HEADERS} bytes; check that both ends and any switch "
                f"carry MTU {mtu}, and that the link is up")
    return None


def parse_ibdev2netdev(text: str) -> list[dict[str, t.Any]]:
    """``ibdev2netdev``: each RDMA device port, the network interface it belongs to, and whether it is up."""
    return [
        {"device": match["device"], "port": int(match["port"]), "netdev": match["netdev"], "up": match["state"] == "Up"}
        for match in IBDEV2NETDEV.finditer(text or "")
    ]


def parse_show_gids(text: str) -> list[dict[str, t.Any]]:
    """``show_gids``: per GID table entry the device, port, index, IPv4 address (if any), RoCE version and interface."""
    entries = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[1].isdigit() or not fields[2].isdigit():
            continue
        ipv4 = fields[4] if len(fields) == 7 else None
        entries.append({"device": fields[0], "port": int(fields[1]), "index": int(fields[2]), "gid": fields[3],
                        "ipv4": ipv4, "version": fields[-2], "netdev": fields[-1]})
    return entries


# _tools.Runner's shape, spelled here: the cluster role installs this file on the host beside the
# fabric wait, where nothing of the collection can be imported.
def read_rdma(run: t.Callable[[list[str]], tuple[int, str, str]]) -> dict[str, t.Any]:
    """The node's RDMA device ports (``rdma_links``) and GID table (``gids``), and which of the two
    tools the host has (``tools``): a host without them reports none, a tool that fails reports empty."""
    outputs = {}
    for tool in ("ibdev2netdev", "show_gids"):
        rc, out, _err = run([tool])
        outputs[tool] = None if rc == 127 else (out if rc == 0 else "")
    return {"rdma_links": parse_ibdev2netdev(outputs["ibdev2netdev"] or ""), "gids": parse_show_gids(outputs["show_gids"] or ""),
            "tools": {tool: output is not None for tool, output in outputs.items()}}


def rocev2_gid_index(gids: t.Sequence[t.Mapping[str, t.Any]], devices: t.Sequence[str], address: str) -> int | None:
    """The GID index NCCL_IB_GID_INDEX needs: the RoCE v2 entry carrying the node's fast address.
    None when the devices have no such entry (or disagree: then the index cannot be one value)."""
    indexes = {entry["index"] for entry in gids
               if entry["device"] in devices and entry["version"] == "v2" and entry["ipv4"] == address}
    return indexes.pop() if len(indexes) == 1 else None


def interface_on(facts: t.Mapping[str, t.Any], network: str) -> dict[str, t.Any] | None:
    """The interface whose IPv4 address lies in ``network``, from Ansible's facts: name, address, MTU."""
    subnet = ipaddress.ip_network(network, strict=False)
    for name in facts.get("interfaces") or []:
        interface = facts.get(name.replace("-", "_")) or {}
        addresses = [interface.get("ipv4") or {}] + list(interface.get("ipv4_secondaries") or [])
        for entry in addresses:
            if entry.get("address") and ipaddress.ip_address(entry["address"]) in subnet:
                return {"interface": name, "address": entry["address"], "mtu": interface.get("mtu")}
    return None


def interface_named(facts: t.Mapping[str, t.Any], name: str) -> dict[str, t.Any] | None:
    interface = facts.get(name.replace("-", "_")) or {}
    address = (interface.get("ipv4") or {}).get("address")
    return {"interface": name, "address": address, "mtu": interface.get("mtu")} if address else None


def parse_size(text: t.Any) -> int | None:
    """nccl-tests' size argument (``512M``, ``4G``, ``1.5g``, ``8 GB``, bytes) in bytes, as its parsesize reads it."""
    match = SIZE.fullmatch(text) if isinstance(text, str) else None
    if not match:
        return None
    return int(float(match["number"]) * UNITS[(match["unit"] or "").upper()])


def parse_nccl_tests(text: str) -> dict[str, t.Any]:
    """An nccl-tests run (all_gather_perf and friends): each size's out-of-place bus bandwidth
    in GB/s, the reported average, and whether the data came back right."""
    rows = []
    for line in (text or "").splitlines():
        if line.lstrip().startswith("#"):
            continue
        match = NCCL_ROW.match(line)
        if match:
            rows.append({"bytes": int(match["size"]), "algbw_gbs": float(match["algbw"]), "busbw_gbs": float(match["busbw"])})
    average = NCCL_AVERAGE.search(text or "")
    return {
        "rows": rows,
        "avg_busbw_gbs": float(average["busbw"]) if average else None,
        "peak_busbw_gbs": max((row["busbw_gbs"] for row in rows), default=None),
        "out_of_bounds_ok": "Out of bounds values : 0 OK" in (text or ""),
    }


def nccl_verdict(result: t.Mapping[str, t.Any], floor_gbs: float) -> list[str]:
    """Why an NCCL bandwidth run does not pass: no figures, wrong data, or a peak below the floor."""
    if result["peak_busbw_gbs"] is None:
        return ["the NCCL test printed no bandwidth rows (did mpirun reach every node?)"]
    reasons = [] if result["out_of_bounds_ok"] else ["the NCCL test reported wrong data (out-of-bounds values)"]
    if result["peak_busbw_gbs"] < floor_gbs:
        reasons.append(f"NCCL bus bandwidth peaked at {result['peak_busbw_gbs']} GB/s, below the floor of {floor_gbs} GB/s "
                       "(about 3 GB/s means NCCL fell back to TCP sockets: check NCCL_IB_HCA and the RoCE GID index)")
    return reasons


def nccl_buffer_problem(command: t.Any, pool_bytes: int | None, share: float = 0.1) -> str | None:
    """The largest all_gather buffer must stay a small share of a node's memory: nccl-tests holds a
    send and a receive buffer per rank, and NVIDIA's 16G example (~32 GB per node) froze Sparks.
    A command whose buffer cannot be read is refused, never passed."""
    max_bytes, problem = nccl_max_bytes(command)
    if problem:
        return f"{NCCL_VARIABLE}: {problem}"
    if pool_bytes and 2 * max_bytes > share * pool_bytes:
        return (f"{NCCL_VARIABLE}: {max_bytes / GIB:.1f} GiB buffers (-e/--maxbytes) take {2 * max_bytes / GIB:.1f} GiB per node, "
                f"more than {int(share * 100)} % of its {pool_bytes / GIB:.1f} GiB; NVIDIA's 16G example froze unified-memory "
                "Sparks. A sweep to 4G saturates the link as well")
    return None


def rdma_reasons(source: str, expected: t.Sequence[str], links: t.Sequence[t.Mapping[str, t.Any]]) -> list[str]:
    """Why the RDMA devices NCCL is configured to use are not usable now: missing or down."""
    state = {link["device"]: link["up"] for link in links}
    reasons = []
    for device in expected:
        if device not in state:
            reasons.append(f"{source}: RDMA device {device} (NCCL_IB_HCA) is not present; ibdev2netdev lists "
                           f"{', '.join(state) or 'none'}")
        elif not state[device]:
            reasons.append(f"{source}: RDMA device {device} (NCCL_IB_HCA) is down; check its cable and link")
    return reasons


def nccl_max_bytes(command: t.Any) -> tuple[int, None] | tuple[None, str]:
    """The largest buffer an nccl-tests command line asks for, as getopt_long reads it (``-e 8G``,
    ``-e8G``, ``--maxbytes=8G``, ``--maxbytes 8G``, ``--maxb 8G``; the last one given wins; 32M when none
    is), over every nccl-tests binary the line runs (mpirun's ``:`` separates them), or why it cannot be
    read: the line must name the binary and hand it its options itself, not through a shell or a string."""
    if not isinstance(command, list) or not command or not all(isinstance(argument, str) for argument in command):
        return None, f"{command!r} must be the command as a list of its arguments, such as [mpirun, ..., all_gather_perf, -e, 4G]"
    binaries = [index for index, argument in enumerate(command) if NCCL_TESTS_BINARY.fullmatch(argument.rsplit("/", 1)[-1])]
    shells = [argument for argument in command if argument.rsplit("/", 1)[-1] in SHELLS]
    hidden = [argument for argument in command if any(space in argument for space in " \t\n") and NCCL_TESTS_NAMED.search(argument)]
    if shells or hidden or not binaries:
        if shells:
            how = f"runs through a shell ({shells[0]}), whose command line the guard does not read"
        elif hidden:
            how = f"hands nccl-tests its options inside one string ({hidden[0]!r})"
        else:
            how = "names no nccl-tests binary (all_gather_perf, all_reduce_perf...): a script would hide its options"
        return None, (f"{' '.join(command)!r} {how}; the buffer bound reads the binary's own options, so give the binary and its "
                      "options as separate arguments, such as [mpirun, -np, '2', all_gather_perf, -b, 512M, -e, 4G] "
                      "(env VAR=value before it is fine)")
    largest = 0
    for start in binaries:
        end = next((index for index in range(start + 1, len(command)) if command[index] == ":"), len(command))
        sizes, problem = nccl_sizes(command[start + 1:end])
        if problem:
            return None, f"{command[start].rsplit('/', 1)[-1]}: {problem}"
        largest = max(largest, sizes["e"])
    return largest, None


def nccl_option(arguments: t.Sequence[str], index: int) -> tuple[str, str | None, int, str | None]:
    """One option of nccl-tests' argument list at ``index``: its short name, its value, the index
    after it, or the problem (getopt_long's own refusals, which would make the binary print its usage
    and run no test)."""
    argument = arguments[index]
    if argument.startswith("--"):
        given, glued, value = argument[2:].partition("=")
        names = [given] if given in NCCL_LONG_OPTIONS else [name for name in NCCL_LONG_OPTIONS if name.startswith(given)]
        if len(names) != 1:
            return "", None, index + 1, (f"{argument} is {'ambiguous' if names else 'not an option'} of nccl-tests "
                                         f"(it prints its usage and runs no test); spell the option out, such as --maxbytes")
        short = NCCL_LONG_OPTIONS[names[0]]
        if short == "h":
            return short, None, index + 1, None if not glued else f"{argument}: --help takes no value"
        if glued:
            return short, value, index + 1, None
    else:
        short = argument[1]
        if short not in NCCL_SHORT_OPTIONS:
            return "", None, index + 1, f"-{short} (in {argument}) is not an option of nccl-tests (it prints its usage and runs no test)"
        if short == "h":
            return short, None, index + 1, None if len(argument) == 2 else f"{argument}: give -h alone"
        if len(argument) > 2:
            return short, argument[2:], index + 1, None
    if index + 1 >= len(arguments):
        return short, None, index + 1, f"{argument} is missing its value"
    return short, arguments[index + 1], index + 2, None


def nccl_sizes(arguments: t.Sequence[str]) -> tuple[dict[str, int], str | None]:
    """The minimum and maximum buffer (``b``, ``e``) of one nccl-tests binary's arguments, or the problem."""
    sizes = {"b": NCCL_DEFAULT_BYTES, "e": NCCL_DEFAULT_BYTES}
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument == "--" or not argument.startswith("-") or argument == "-":
            return sizes, (f"{argument!r} is no option; nccl-tests takes options only, and getopt reads none after a "
                           "positional argument or '--' when POSIXLY_CORRECT is set, so the buffer size would be unknown")
        short, value, index, problem = nccl_option(arguments, index)
        if problem:
            return sizes, problem
        if short in sizes:
            size = parse_size(value)
            if size is None:
                return sizes, f"-{short} {value}: give the buffer as bytes or with K/M/G, such as 4G"
            sizes[short] = size
    if sizes["b"] > sizes["e"]:
        return sizes, (f"the smallest buffer (-b/--minbytes, {sizes['b']} bytes) exceeds the largest (-e/--maxbytes, {sizes['e']} "
                       "bytes; 32M unless given), which nccl-tests refuses; give -e as well")
    return sizes, None


def peer_problem(peer: t.Mapping[str, str]) -> str | None:
    """Why a peer cannot be pinged (None: it can). Ansible gives a list or mapping as its text, so the address is checked as an address."""
    if not peer["name"].strip():
        return "name is empty; give the other node's inventory name"
    try:
        ipaddress.ip_address(peer["address"])
    except ValueError:
        return f"address {peer['address'][:80]!r} of {peer['name']} is not an IP address; give the node's address on the fast link"
    return None
