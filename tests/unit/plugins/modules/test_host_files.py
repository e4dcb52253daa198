"""host_files on real folders and files, run as Ansible runs a module (its JSON on stdin): created with
their modes, a second call changes nothing, drifted modes and content are fixed, check mode reports the
same and touches nothing, and a bad path or mode fails before anything is written."""

import json
import os
import stat

import pytest
from test_modules_as_ansible_runs_them import refused, run


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def listing(tmp_path):
    return sorted((str(path.relative_to(tmp_path)), mode(path), path.read_text() if path.is_file() else None) for path in tmp_path.rglob("*"))


def wanted(tmp_path):
    folder = tmp_path / "etc" / "sparkfleet"
    return {
        "folders": [{"path": str(folder), "mode": "0700"}, {"path": str(tmp_path / "libexec"), "mode": "0755"}],
        "files": [{"path": str(tmp_path / "libexec" / "wait.py"), "mode": "0644", "content": "print('ready')\n"},
                  {"path": str(folder / "settings.conf"), "mode": "0600", "content": "a=1\n"}],
    }


def test_a_first_call_creates_everything_and_a_second_changes_nothing(tmp_path):
    args = wanted(tmp_path)
    first = run("host_files", {**args, "_ansible_diff": True})
    assert first["changed"] is True
    assert first["folders_created"] == [entry["path"] for entry in args["folders"]]
    assert first["files_written"] == [entry["path"] for entry in args["files"]]
    assert mode(tmp_path / "etc" / "sparkfleet") == 0o700 and mode(tmp_path / "etc") == 0o755
    assert (tmp_path / "libexec" / "wait.py").read_text() == "print('ready')\n" and mode(tmp_path / "libexec" / "wait.py") == 0o644
    assert mode(tmp_path / "etc" / "sparkfleet" / "settings.conf") == 0o600
    assert first["diff"][0]["after"] == "print('ready')\n" and first["diff"][0]["before"] == ""
    second = run("host_files", args)
    assert second["changed"] is False and not any(second[key] for key in ("folders_created", "folders_fixed", "files_written", "files_fixed"))


def test_drift_is_fixed_and_check_mode_reports_it_without_a_change(tmp_path):
    args = wanted(tmp_path)
    run("host_files", args)
    os.chmod(tmp_path / "etc" / "sparkfleet", 0o755)
    os.chmod(tmp_path / "libexec" / "wait.py", 0o666)
    (tmp_path / "etc" / "sparkfleet" / "settings.conf").write_text("a=2\n")
    before = listing(tmp_path)
    check = run("host_files", {**args, "_ansible_check_mode": True, "_ansible_diff": True})
    assert check["changed"] is True and listing(tmp_path) == before
    expected = {"folders_created": [], "folders_fixed": [str(tmp_path / "etc" / "sparkfleet")],
                "files_written": [str(tmp_path / "etc" / "sparkfleet" / "settings.conf")], "files_fixed": [str(tmp_path / "libexec" / "wait.py")]}
    assert {key: check[key] for key in expected} == expected
    assert check["diff"] == [{"before_header": expected["files_written"][0], "after_header": expected["files_written"][0],
                              "before": "a=2\n", "after": "a=1\n"}]
    fixed = run("host_files", args)
    assert {key: fixed[key] for key in expected} == expected
    assert mode(tmp_path / "etc" / "sparkfleet") == 0o700 and mode(tmp_path / "libexec" / "wait.py") == 0o644
    assert (tmp_path / "etc" / "sparkfleet" / "settings.conf").read_text() == "a=1\n"


def test_check_mode_on_a_fresh_host_reports_files_in_folders_it_would_create(tmp_path):
    check = run("host_files", {**wanted(tmp_path), "_ansible_check_mode": True})
    assert check["changed"] is True and len(check["files_written"]) == 2 and listing(tmp_path) == []


@pytest.mark.parametrize(("entry", "fragments"), [
    ({"path": "relative/x", "mode": "0644"}, ["files[2].path: 'relative/x' must be an absolute path"]),
    ({"path": "/{}/../etc/x", "mode": "0644"}, ["files[2].path:", "must not step through '.' or '..'"]),
    ({"path": "/{}/x y", "mode": "0644"}, ["files[2].path:", "letters, digits and _.@+-"]),
    ({"path": "/{}/x", "mode": "4755"}, ["files[2].mode: '4755' must be an octal string", "no setuid"]),
    ({"path": "/{}/x", "mode": "644 "}, ["files[2].mode: '644 '"]),
    ({"path": "/{}/x", "mode": 420}, ["files[2].mode: 420 must be an octal string"]),
    ({"path": "/{}/x/", "mode": "0644"}, ["files[2].path:", "no doubled or trailing '/'"]),
])
def test_a_bad_path_or_mode_fails_before_anything_is_written(tmp_path, entry, fragments):
    args = wanted(tmp_path)
    args["files"].append({**entry, "path": entry["path"].format(str(tmp_path).strip("/")), "content": "x"})
    refused("host_files", args, *fragments)
    assert listing(tmp_path) == []


def test_a_file_where_a_folder_belongs_is_named(tmp_path):
    (tmp_path / "libexec").write_text("not a folder")
    refused("host_files", wanted(tmp_path), f"{tmp_path / 'libexec'}: exists and is not a folder")


def test_missing_parents_are_created_0755_whatever_the_umask(tmp_path):
    previous = os.umask(0o077)
    try:
        result = run("host_files", {"folders": [{"path": str(tmp_path / "a" / "b" / "c"), "mode": "0700"}]})
    finally:
        os.umask(previous)
    assert result["folders_created"] == [str(tmp_path / "a" / "b" / "c")]
    assert (mode(tmp_path / "a"), mode(tmp_path / "a" / "b"), mode(tmp_path / "a" / "b" / "c")) == (0o755, 0o755, 0o700)


def test_a_secret_file_is_written_closed_and_never_shown(tmp_path):
    secret = "sk-" + "k" * 40
    path = tmp_path / "gateway" / "gateway.env"
    args = {"folders": [{"path": str(tmp_path / "gateway"), "mode": "0700"}],
            "secret_files": [{"path": str(path), "mode": "0600", "content": f"LITELLM_MASTER_KEY={secret}\n"}]}
    first = run("host_files", {**args, "_ansible_diff": True})
    assert first["files_written"] == [str(path)] and mode(path) == 0o600 and path.read_text() == f"LITELLM_MASTER_KEY={secret}\n"
    assert first["diff"][0] == {"before_header": str(path), "after_header": str(path), "before": "",
                                "after": "(a secret: its content is not shown) (after)\n"}
    path.write_text("LITELLM_MASTER_KEY=old\n")
    again = run("host_files", {**args, "_ansible_diff": True, "_ansible_check_mode": True})
    assert again["files_written"] == [str(path)] and path.read_text() == "LITELLM_MASTER_KEY=old\n"
    assert again["diff"][0]["before"] == "(a secret: its content is not shown) (before)\n"
    assert secret not in json.dumps(first) + json.dumps(again) and "old" not in json.dumps(again["diff"])


def test_a_secret_file_open_to_others_is_refused_before_anything_is_written(tmp_path):
    args = {"files": [{"path": str(tmp_path / "unit.service"), "mode": "0644", "content": "[Unit]\n"}],
            "secret_files": [{"path": str(tmp_path / "gateway.env"), "mode": "0640", "content": "KEY=x\n"}]}
    refused("host_files", args, "secret_files[0].mode: '0640' gives group or others access to a secret; use \"0600\"")
    assert list(tmp_path.iterdir()) == []
