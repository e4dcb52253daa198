import pathlib
import re

import pytest
import yaml

from ansible_collections.sparkfleet.vllm.plugins.module_utils._earlyoom import (
    earlyoom_config,
    extra_args_problems,
    name_to_regex,
    names_to_regex,
)

# The role's own defaults, read from the file operators see, so this test follows any change there.
ROLE_DEFAULTS = yaml.safe_load((pathlib.Path(__file__).resolve().parents[4] / "roles" / "earlyoom" / "defaults" / "main.yml").read_text())
DEFAULT_AVOID = ROLE_DEFAULTS["earlyoom_avoid_names"]
MODEL_SERVER = ROLE_DEFAULTS["earlyoom_model_server_names"]


def config(**overrides):
    settings = dict(
        memory_percent=ROLE_DEFAULTS["earlyoom_memory_percent"],
        memory_kill_percent=ROLE_DEFAULTS["earlyoom_memory_kill_percent"],
        report_interval=ROLE_DEFAULTS["earlyoom_report_interval"],
        prefer_lists={"earlyoom_prefer_names": ROLE_DEFAULTS["earlyoom_prefer_names"]},
        avoid_lists={"earlyoom_avoid_names": DEFAULT_AVOID, "earlyoom_avoid_extra_names": ROLE_DEFAULTS["earlyoom_avoid_extra_names"]},
        model_server_names=MODEL_SERVER,
    )
    settings.update(overrides)
    return earlyoom_config(**settings)


def test_defaults_reproduce_seed_000_arguments():
    result = config()
    assert result["errors"] == []
    assert result["args"] == [
        "-m", "4", "-r", "3600",
        "--prefer", "^(VLLM::EngineCor|vllm)$",
        "--avoid", "^(sshd|systemd.*|[(]systemd[)]|NetworkManager|dbus-daemon|dbus-broker|dockerd|containerd.*|runc.*"
        "|[(]udev-worker[)]|polkitd|nginx|node_exporter|prometheus-node|dcgm-exporter|java|postgres|earlyoom)$",
    ]


@pytest.mark.parametrize(
    ("name", "regex"),
    [("(systemd)", "[(]systemd[)]"), ("containerd*", "containerd.*"), ("a.b+c", "a[.]b[+]c"), ("VLLM::EngineCor", "VLLM::EngineCor")],
)
def test_name_to_regex_writes_metacharacters_without_backslashes(name, regex):
    assert name_to_regex(name) == regex
    assert "\\" not in name_to_regex(name)


def test_built_avoid_regex_matches_what_it_should_and_spares_vllm():
    avoid = re.compile(names_to_regex(DEFAULT_AVOID))
    for process in ["sshd", "systemd-journal", "(systemd)", "containerd-shim", "(udev-worker)", "earlyoom"]:
        assert avoid.search(process), process
    for process in ["VLLM::EngineCor", "vllm", "python3", "xsshd"]:
        assert not avoid.search(process), process


def test_kill_percent_is_joined_to_the_threshold():
    assert config(memory_kill_percent=2)["args"][:2] == ["-m", "4,2"]


@pytest.mark.parametrize("bad", ["vllm", "vll*", "VLLM*", "*"])
def test_avoid_entry_that_shields_the_model_server_is_refused(bad):
    result = config(avoid_lists={"earlyoom_avoid_names": DEFAULT_AVOID, "earlyoom_avoid_extra_names": [bad]})
    assert result["args"] == []
    assert any(e.startswith(f"earlyoom_avoid_extra_names: entry {bad!r} matches") for e in result["errors"]), result["errors"]


def test_avoid_regex_override_that_matches_vllm_is_refused():
    errors = config(avoid_regex="^(sshd|.*vllm.*)$")["errors"]
    assert len(errors) == 1 and errors[0].startswith("earlyoom_avoid_regex:") and "vllm" in errors[0]


def test_regex_that_does_not_compile_is_refused():
    errors = config(avoid_regex="^(sshd|systemd.*")["errors"]
    assert any("earlyoom_avoid_regex" in e and "does not compile" in e for e in errors)


@pytest.mark.parametrize("percent", [0, 51, 90, -1, "4", True])
def test_threshold_out_of_range_is_refused(percent):
    errors = config(memory_percent=percent)["errors"]
    assert any(e.startswith("earlyoom_memory_percent:") for e in errors)


def test_kill_percent_above_threshold_is_refused():
    assert any(e.startswith("earlyoom_memory_kill_percent:") for e in config(memory_kill_percent=5)["errors"])


def test_name_longer_than_comm_is_refused_with_the_truncated_spelling():
    errors = config(prefer_lists={"earlyoom_prefer_names": ["VLLM::EngineCore"]}, model_server_names=["VLLM::EngineCor"])["errors"]
    assert any("'VLLM::EngineCor'" in e and "15 characters" in e for e in errors)


@pytest.mark.parametrize("bad", ["node exporter", "back\\slash", "dollar$", "[x]"])
def test_names_that_cannot_be_written_safely_are_refused(bad):
    errors = config(avoid_lists={"earlyoom_avoid_extra_names": [bad]})["errors"]
    assert any(e.startswith("earlyoom_avoid_extra_names:") for e in errors)


def test_prefer_pattern_must_cover_the_model_server():
    errors = config(prefer_lists={"earlyoom_prefer_names": ["python3"]})["errors"]
    assert any("matches none of earlyoom_model_server_names" in e for e in errors)


def test_every_problem_is_reported_at_once():
    errors = config(memory_percent=0, report_interval=-1, avoid_regex="(")["errors"]
    assert {e.split(":", maxsplit=1)[0] for e in errors} >= {"earlyoom_memory_percent", "earlyoom_report_interval", "earlyoom_avoid_regex"}


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [(["--dryrun"], "never kill"), (["-m", "90"], "earlyoom_memory_percent"), (["-m90"], "earlyoom_memory_percent"),
     (["--prefer=sshd"], "earlyoom_prefer_names"), (["--avoid", "vllm"], "earlyoom_avoid_names"), (["-i"], "oom_score_adj"),
     (["-N", "/tmp/x"], "script"), (["-g"], "process group"), (["--ignore=.*"], "exempt"), (["-s"], "needs a value"),
     (["-s", "x"], "not a threshold"), (["-s 10"], "whitespace"), (["--frobnicate"], "not an argument the role passes through")],
)
def test_extra_args_are_checked_like_the_structured_settings(extra, fragment):
    problems = extra_args_problems(extra)
    assert problems and fragment in problems[0]


def test_harmless_extra_args_pass_through():
    assert extra_args_problems(["-s", "10,5", "-S5", "-n", "--sort-by-rss", "-p"]) == []


@pytest.mark.parametrize(("extra", "fragment"), [
    pytest.param(["-s", "0"], "'-s 0' is out of range; give swap percents from 1 to 100 (0 would never be reached)", id="swap-off"),
    pytest.param(["-s0,0"], "'-s0,0' is out of range; give swap percents from 1 to 100", id="swap-off-joined"),
    pytest.param(["-s", "150"], "'-s 150' is out of range", id="above-100"),
    pytest.param(["-s", "10,20"], "'-s 10,20' puts the kill threshold above the warning one", id="kill-above-warning"),
    pytest.param(["-S", "0"], "'-S 0' is out of range; give swap sizes of at least 1 KiB", id="swap-size-off"),
])
def test_swap_thresholds_that_switch_the_guard_off_are_refused(extra, fragment):
    problems = extra_args_problems(extra)
    assert len(problems) == 1 and problems[0].startswith(f"earlyoom_extra_args: {fragment}")


@pytest.mark.parametrize("interval", [-1, 86401, 10**9, "3600", True])
def test_report_interval_out_of_range_is_refused(interval):
    errors = config(report_interval=interval)["errors"]
    assert errors and errors[0].startswith(f"earlyoom_report_interval: {interval!r} is out of range; give whole seconds from 0")
    assert config(report_interval=86400)["errors"] == [] and config(report_interval=0)["errors"] == []
