import shlex

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._memory import admission_problem, parse_meminfo
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


def test_admission():
    info = parse_meminfo(MEMINFO)
    assert admission_problem("llm", 0.5, info) is None
    problem = admission_problem("llm", 0.95, info)
    assert "22.28 GiB of the 23.46 GiB pool" in problem and "21.09 GiB is available" in problem
