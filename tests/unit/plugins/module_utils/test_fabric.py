"""The fast link's tools, read from recorded outputs (tests/unit/fixtures/fabric/README.md says
which were recorded here and which are public recordings: this machine has no RDMA and no GPU)."""

from pathlib import Path

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._fabric import (
    GIB,
    interface_on,
    mtu_problem,
    nccl_buffer_problem,
    nccl_max_bytes,
    nccl_verdict,
    parse_ibdev2netdev,
    parse_nccl_tests,
    parse_ping,
    parse_show_gids,
    parse_size,
    ping_arguments,
    ping_verdict,
    read_rdma,
    rocev2_gid_index,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "fabric"


def fixture(name):
    return (FIXTURES / name).read_text()


def test_a_full_frame_crosses_the_link():
    result = parse_ping(fixture("ping_full_frame.txt"))
    assert result == {"sent": 3, "received": 3, "loss_pct": 0.0, "rtt_avg_ms": 0.563, "local_mtu": None, "parsed": True}
    assert ping_verdict("a", "b", "172.18.0.3", 1500, result) is None


def test_a_peer_with_a_smaller_mtu_drops_the_frame_silently():
    result = parse_ping(fixture("ping_peer_mtu_1400.txt"))
    assert (result["received"], result["loss_pct"], result["local_mtu"]) == (0, 100.0, None)
    verdict = ping_verdict("spark-1", "spark-2", "172.18.0.3", 1500, result)
    assert verdict.startswith("spark-1 -> spark-2 (172.18.0.3) at MTU 1500: no reply")
    assert "1472 bytes" in verdict


def test_the_host_with_the_smaller_mtu_says_so():
    result = parse_ping(fixture("ping_local_mtu_1400.txt"))
    assert result["local_mtu"] == 1400
    verdict = ping_verdict("spark-2", "spark-1", "172.18.0.2", 1500, result)
    assert "spark-2 -> spark-1" in verdict and "carries only 1400 bytes; set its MTU to 1500" in verdict


def test_a_smaller_mtu_on_the_path_is_named_too():
    result = parse_ping(fixture("ping_path_mtu_1400.txt"))
    assert result["local_mtu"] == 1400 and result["received"] == 0


def test_no_ping_output_is_not_a_pass():
    result = parse_ping("ping: connect: Network is unreachable\n")
    assert not result["parsed"]
    assert "gave no summary" in ping_verdict("a", "b", "10.0.0.2", 9000, result)


def test_partial_loss_is_reported_as_a_share():
    result = parse_ping("4 packets transmitted, 3 received, 25% packet loss, time 3004ms\n")
    assert "25.0 % lost" in ping_verdict("a", "b", "10.0.0.2", 9000, result)


def test_one_cable_shows_as_two_rdma_devices_up():
    links = parse_ibdev2netdev(fixture("ibdev2netdev_two_sparks.txt"))
    assert [link["device"] for link in links if link["up"]] == ["rocep1s0f0", "roceP2p1s0f0"]
    assert links[0] == {"device": "rocep1s0f0", "port": 1, "netdev": "enp1s0f0np0", "up": True}
    assert len(links) == 4


def test_the_rocev2_gid_index_of_the_fast_address():
    gids = parse_show_gids(fixture("show_gids_roce.txt"))
    assert len(gids) == 4
    assert gids[3] == {"device": "mlx5_0", "port": 1, "index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0a6e:0021",
                       "ipv4": "10.110.0.33", "version": "v2", "netdev": "eth05"}
    assert gids[0]["ipv4"] is None
    assert rocev2_gid_index(gids, ["mlx5_0"], "10.110.0.33") == 3
    assert rocev2_gid_index(gids, ["mlx5_0"], "10.110.0.34") is None
    assert rocev2_gid_index(gids, ["mlx5_1"], "10.110.0.33") is None


def test_the_rdma_read_runs_both_tools_and_says_which_the_host_lacks():
    outputs = {"ibdev2netdev": (0, fixture("ibdev2netdev_two_sparks.txt"), ""), "show_gids": (127, "", "not installed")}
    asked = []

    def run(argv):
        asked.append(argv)
        return outputs[argv[0]]

    found = read_rdma(run)
    assert asked == [["ibdev2netdev"], ["show_gids"]]
    assert len(found["rdma_links"]) == 4 and found["gids"] == []
    assert found["tools"] == {"ibdev2netdev": True, "show_gids": False}


def test_a_failing_rdma_tool_reads_as_present_with_nothing_found():
    found = read_rdma(lambda argv: (1, "garbage", "driver not loaded"))
    assert found == {"rdma_links": [], "gids": [], "tools": {"ibdev2netdev": True, "show_gids": True}}


def test_the_nccl_figures_of_two_sparks():
    result = parse_nccl_tests(fixture("nccl_all_gather_two_sparks_16g.txt"))
    assert result["rows"] == [{"bytes": 17179869184, "algbw_gbs": 44.32, "busbw_gbs": 22.16}]
    assert result["avg_busbw_gbs"] == 21.9736
    # The author's trimmed excerpt has no validation line: a full run prints it.
    assert nccl_verdict(result, 18.0) == ["the NCCL test reported wrong data (out-of-bounds values)"]


def test_nccl_on_one_slow_path_is_refused_below_the_floor():
    result = parse_nccl_tests(fixture("nccl_all_reduce_roce_two_ranks.txt"))
    assert len(result["rows"]) == 11 and result["rows"][0]["bytes"] == 2097152
    assert result["peak_busbw_gbs"] == 2.84 and result["out_of_bounds_ok"]
    reasons = nccl_verdict(result, 18.0)
    assert len(reasons) == 1 and "peaked at 2.84 GB/s, below the floor of 18.0 GB/s" in reasons[0]
    assert nccl_verdict(result, 2.5) == []


def test_an_nccl_run_without_rows_fails():
    assert "no bandwidth rows" in nccl_verdict(parse_nccl_tests("mpirun: connection refused\n"), 1.0)[0]


@pytest.mark.parametrize(
    ("text", "size"),
    [("4G", 4 * GIB), ("512M", 512 * 1024 ** 2), ("8", 8), ("16g", 16 * GIB), ("1.5G", 3 * GIB // 2), ("8 G", 8 * GIB),
     ("8GB", 8 * GIB), ("64k", 64 * 1024), (" 2M", 2 * 1024 ** 2), ("4T", None), ("x", None), ("-1G", None), ("0x10", None),
     ("", None), (8, None), (None, None)],
)
def test_buffer_sizes_as_nccl_tests_parsesize_reads_them(text, size):
    assert parse_size(text) == size


POOL = 127600748 * 1024


def test_the_buffer_that_froze_sparks_is_refused():
    problem = nccl_buffer_problem(["all_gather_perf", "-b", "512M", "-e", "16G", "-f", "2"], POOL)
    assert problem.startswith("cluster_nccl_test_command: 16.0 GiB buffers") and "32.0 GiB per node" in problem and "froze" in problem
    assert nccl_buffer_problem(["all_gather_perf", "-b", "512M", "-e", "4G", "-f", "2"], POOL) is None


MPIRUN = ["mpirun", "-np", "2", "-H", "spark-1,spark-2", "-x", "NCCL_IB_HCA", "--mca", "pml", "ucx"]


@pytest.mark.parametrize(
    ("arguments", "largest"),
    [
        pytest.param(["-b", "8M", "-e", "8G"], 8 * GIB, id="separate"),
        pytest.param(["-b8M", "-e8G"], 8 * GIB, id="glued"),
        pytest.param(["--minbytes=8M", "--maxbytes=8G"], 8 * GIB, id="long-equals"),
        pytest.param(["--minbytes", "8M", "--maxbytes", "8G"], 8 * GIB, id="long-separate"),
        pytest.param(["--maxb", "8G"], 8 * GIB, id="long-prefix"),
        pytest.param(["--maxb=8G"], 8 * GIB, id="long-prefix-equals"),
        pytest.param(["-e", "1G", "-e", "8G"], 8 * GIB, id="repeated-last-wins"),
        pytest.param(["-e", "8G", "--maxbytes=1G"], GIB, id="repeated-mixed-last-wins"),
        pytest.param(["-e", "8G", "-e1G"], GIB, id="repeated-glued-last-wins"),
        pytest.param(["-f", "2", "-g", "1"], 32 * 1024 ** 2, id="default-32M"),
        pytest.param(["-b", "512M"], None, id="min-above-default-max"),
        pytest.param(["-F", "out.csv", "-J", "out.json", "-e", "2G"], 2 * GIB, id="options-with-values"),
        pytest.param(["-e", "-b"], None, id="value-that-looks-like-an-option"),
    ],
)
def test_the_largest_buffer_is_read_as_getopt_reads_it(arguments, largest):
    found, problem = nccl_max_bytes([*MPIRUN, "/opt/nccl-tests/build/all_gather_perf", *arguments])
    if largest is None:
        assert found is None and problem.startswith("all_gather_perf: ")
    else:
        assert (found, problem) == (largest, None)


def test_a_glued_cluster_ends_at_the_first_option_taking_a_value():
    """getopt reads -c0e8G as -c with the value 0e8G: no -e at all, and a 32M buffer."""
    assert nccl_max_bytes(["all_gather_perf", "-c0e8G"]) == (32 * 1024 ** 2, None)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["sh", "-c", "all_gather_perf -e 16G"], id="sh-c"),
        pytest.param(["bash", "-c", "all_gather_perf -e 4G"], id="bash-c"),
        pytest.param(["/bin/bash", "-lc", "exec all_gather_perf \"$@\"", "all_gather_perf", "-e", "1G"], id="bash-with-argv"),
        pytest.param([*MPIRUN, "sh", "-c", "all_gather_perf -e 16G"], id="mpirun-sh"),
        pytest.param(["env", "-S", "all_gather_perf -e 16G"], id="env-S-string"),
        pytest.param(["mpirun -np 2 all_gather_perf -e 16G"], id="one-string"),
        pytest.param([*MPIRUN, "./run_nccl.sh"], id="script"),
        pytest.param(["all_gather_perf", "--m", "16G"], id="ambiguous-prefix"),
        pytest.param(["all_gather_perf", "--maxbites=16G"], id="unknown-long"),
        pytest.param(["all_gather_perf", "-q", "1"], id="unknown-short"),
        pytest.param(["all_gather_perf", "-e"], id="missing-value"),
        pytest.param(["all_gather_perf", "--maxbytes"], id="missing-long-value"),
        pytest.param(["all_gather_perf", "-e", "lots"], id="unreadable-size"),
        pytest.param(["all_gather_perf", "-e", "16T"], id="unknown-unit"),
        pytest.param(["all_gather_perf", "--", "-e", "16G"], id="double-dash"),
        pytest.param(["all_gather_perf", "extra", "-e", "16G"], id="positional"),
        pytest.param(["all_gather_perf", "--help=1"], id="help-with-value"),
        pytest.param("all_gather_perf -e 16G", id="a-string"),
        pytest.param(["all_gather_perf", 16], id="not-text"),
    ],
)
def test_a_command_whose_buffer_cannot_be_read_is_refused(command):
    problem = nccl_buffer_problem(command, POOL)
    assert problem and problem.startswith("cluster_nccl_test_command: ")
    assert nccl_buffer_problem(command, None) == problem


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["env", "NCCL_DEBUG=INFO", "all_gather_perf", "-e", "16G"], id="env"),
        pytest.param(["/usr/bin/env", "NCCL_DEBUG=INFO", "/opt/nccl-tests/build/all_reduce_perf_mpi", "-e16G"], id="env-path-mpi"),
        pytest.param(["timeout", "600", "all_gather_perf", "--maxbytes=16G"], id="timeout"),
        pytest.param([*MPIRUN, "all_gather_perf", "-e", "1G", ":", "-np", "1", "all_gather_perf", "-e", "16G"], id="mpmd-second"),
        pytest.param([*MPIRUN, "all_gather_perf", "-e", "16G", ":", "-np", "1", "all_gather_perf", "-e", "1G"], id="mpmd-first"),
        pytest.param(["all_gather_perf", "-b", "8M", "-e", "1G", "-e", "16G"], id="repeated"),
    ],
)
def test_wrappers_that_hand_the_binary_its_options_are_read_through(command):
    assert "16.0 GiB buffers" in nccl_buffer_problem(command, POOL)


def test_the_interface_on_the_fast_network_from_facts():
    facts = {
        "interfaces": ["lo", "enP7s7", "enp1s0f0np0"],
        "lo": {"ipv4": {"address": "127.0.0.1"}, "mtu": 65536},
        "enP7s7": {"ipv4": {"address": "10.0.0.21"}, "mtu": 1500},
        "enp1s0f0np0": {"ipv4": {"address": "192.168.100.11"}, "mtu": 9000},
    }
    assert interface_on(facts, "192.168.100.0/24") == {"interface": "enp1s0f0np0", "address": "192.168.100.11", "mtu": 9000}
    assert interface_on(facts, "172.16.0.0/12") is None


@pytest.mark.parametrize("mtu", [67, 28, 0, 9217, 65536, True, "9000", None])
def test_an_mtu_the_gates_ping_cannot_fill_a_frame_of_is_refused(mtu):
    assert mtu_problem(mtu) == (f"{mtu!r} must be a whole number from 68 to 9216; the fabric gate's don't-fragment ping fills a "
                                "frame with MTU - 28 bytes, so the MTU must be one IPv4 carries (68 at least) and an Ethernet "
                                "link can (jumbo frames stop at 9216; seed 002's link runs 9000)")


def test_the_smallest_and_largest_mtu_give_pings_that_fill_their_frame():
    assert mtu_problem(68) is None and mtu_problem(9216) is None
    assert ping_arguments("10.0.0.2", 68, 1, None)[:3] == ["-M", "do", "-s"] and ping_arguments("10.0.0.2", 68, 1, None)[3] == "40"
    assert ping_arguments("10.0.0.2", 9216, 1, "eth0")[3] == "9188"
