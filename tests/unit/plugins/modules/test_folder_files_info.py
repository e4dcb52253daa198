"""folder_files_info on real folders, run as Ansible runs a module: matching regular files listed, read
only where asked, a missing folder reported, links and subfolders left out, and bad paths, patterns
and oversized files refused before anything is returned."""

import os

import pytest
from test_modules_as_ansible_runs_them import refused, run


@pytest.fixture
def deployed(tmp_path):
    units, plans = tmp_path / "system", tmp_path / "vllm"
    units.mkdir()
    plans.mkdir()
    (units / "sparkfleet-vllm-tiny.service").write_text("[Unit]\n")
    (units / "ssh.service").write_text("[Unit]\n")
    (plans / "tiny.json").write_text('{"name": "tiny"}')
    (plans / "tiny.env").write_text("VLLM_API_KEY=secret\n")
    (plans / "last-good").mkdir()
    (plans / "last-good" / "tiny.json").write_text("{}")
    os.symlink(plans / "tiny.json", plans / "linked.json")
    return units, plans


def test_matching_files_are_listed_and_read_only_where_asked(deployed, tmp_path):
    units, plans = deployed
    result = run("folder_files_info", {"folders": [
        {"path": str(units), "patterns": ["sparkfleet-vllm-*.service"]},
        {"path": str(plans), "patterns": ["*.json"], "read": True},
        {"path": str(tmp_path / "cluster"), "patterns": ["*.json"], "read": True},
    ]})
    assert result["changed"] is False
    assert result["files"] == {f"{units}/sparkfleet-vllm-tiny.service": None, f"{plans}/tiny.json": '{"name": "tiny"}'}
    assert result["missing"] == [str(tmp_path / "cluster")]


@pytest.mark.parametrize(("folder", "fragment"), [
    ({"path": "etc/sparkfleet", "patterns": ["*.json"]}, "folders[0].path: 'etc/sparkfleet' must be an absolute path"),
    ({"path": "/etc/sparkfleet/../shadow", "patterns": ["*"]}, "must not step through"),
    ({"path": "/etc/sparkfleet", "patterns": ["../*.json"]}, "folders[0].patterns: '../*.json' must be a file name pattern"),
    ({"path": "/etc/sparkfleet", "patterns": []}, "folders[0].patterns: must list at least one file name pattern"),
])
def test_a_bad_path_or_pattern_is_refused_before_anything_is_read(folder, fragment):
    refused("folder_files_info", {"folders": [folder]}, fragment)


def test_a_file_no_plan_could_be_is_refused(deployed):
    _units, plans = deployed
    (plans / "huge.json").write_bytes(b"x" * ((1 << 20) + 1))
    refused("folder_files_info", {"folders": [{"path": str(plans), "patterns": ["*.json"], "read": True}]},
            f"{plans}/huge.json: larger than 1048576 bytes")
    listed = run("folder_files_info", {"folders": [{"path": str(plans), "patterns": ["*.json"]}]})
    assert listed["files"] == {f"{plans}/huge.json": None, f"{plans}/tiny.json": None}


def test_a_file_where_the_folder_belongs_is_named(deployed):
    units, _plans = deployed
    refused("folder_files_info", {"folders": [{"path": f"{units}/ssh.service", "patterns": ["*"]}]},
            f"{units}/ssh.service: cannot be listed (Not a directory)")


def test_a_folder_given_with_a_trailing_slash_is_listed_as_find_lists_it(deployed):
    _units, plans = deployed
    listed = run("folder_files_info", {"folders": [{"path": f"{plans}/", "patterns": ["*.json"]}]})
    assert listed["files"] == {f"{plans}/tiny.json": None} and listed["missing"] == []
