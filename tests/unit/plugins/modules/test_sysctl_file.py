"""sysctl_file's logic on real files: a temporary folder stands in for /proc/sys (the kernel's own
cannot be written in a test). The file and the running values are brought to the settings, a second
call changes nothing, check mode changes nothing, and a bad name or value changes nothing."""

import os

import pytest
from test_modules_as_ansible_runs_them import refused, run

from ansible_collections.sparkfleet.vllm.plugins.module_utils._files import FileProblem
from ansible_collections.sparkfleet.vllm.plugins.module_utils._sysctl import sync_sysctls

SETTINGS = {"vm.min_free_kbytes": 5242880, "vm.overcommit_memory": 1}


@pytest.fixture
def kernel(tmp_path):
    """A /proc/sys with the kernel's defaults for the two settings."""
    proc = tmp_path / "proc"
    (proc / "vm").mkdir(parents=True)
    (proc / "vm" / "min_free_kbytes").write_text("67584\n")
    (proc / "vm" / "overcommit_memory").write_text("0\n")
    return proc


def test_the_file_and_the_running_values_follow_the_settings_once(tmp_path, kernel):
    path = str(tmp_path / "90-memory.conf")
    check = sync_sysctls(path, SETTINGS, True, True, proc_sys=str(kernel))
    assert check["changed"] and check["file_written"] and check["set_running"] == ["vm.min_free_kbytes", "vm.overcommit_memory"]
    assert not os.path.exists(path) and (kernel / "vm" / "overcommit_memory").read_text() == "0\n", "check mode changed nothing"
    done = sync_sysctls(path, SETTINGS, True, False, proc_sys=str(kernel))
    assert {key: done[key] for key in ("changed", "file_written", "set_running")} == {key: check[key] for key in ("changed", "file_written", "set_running")}
    assert open(path).read() == ("# Managed by Ansible (sparkfleet.vllm); local edits are overwritten.\n"
                                 "vm.min_free_kbytes=5242880\nvm.overcommit_memory=1\n")
    assert (kernel / "vm" / "min_free_kbytes").read_text() == "5242880"
    again = sync_sysctls(path, SETTINGS, True, False, proc_sys=str(kernel))
    assert again == {"changed": False, "file_written": False, "set_running": [], "diff": []}
    (kernel / "vm" / "overcommit_memory").write_text("0\n")
    assert sync_sysctls(path, SETTINGS, True, False, proc_sys=str(kernel))["set_running"] == ["vm.overcommit_memory"], "a value set by hand is set again"


@pytest.mark.parametrize(("settings", "message"), [
    ({"vm.min_free_kbytes": "1\nkernel.sysrq=1"}, "vm.min_free_kbytes: '1\\nkernel.sysrq=1' is not a value a sysctl.d line carries unchanged"),
    ({"vm/../kernel.x": 1}, "'vm/../kernel.x' is not a sysctl name"),
    ({"vm.no_such_setting": 1}, "vm.no_such_setting: the running kernel has no such setting"),
])
def test_a_bad_name_or_value_changes_nothing(tmp_path, kernel, settings, message):
    path = tmp_path / "90-memory.conf"
    with pytest.raises(FileProblem) as raised:
        sync_sysctls(str(path), {**SETTINGS, **settings}, True, False, proc_sys=str(kernel))
    assert message in str(raised.value)
    assert not path.exists() and (kernel / "vm" / "min_free_kbytes").read_text() == "67584\n"


def test_the_module_writes_the_file_alone_and_names_a_bad_setting(tmp_path):
    path = tmp_path / "90-memory.conf"
    result = run("sysctl_file", {"path": str(path), "settings": SETTINGS, "apply": False, "_ansible_diff": True})
    assert result["changed"] and result["file_written"] and result["set_running"] == []
    assert result["diff"][0]["after"].endswith("vm.overcommit_memory=1\n")
    assert run("sysctl_file", {"path": str(path), "settings": SETTINGS, "apply": False})["changed"] is False
    refused("sysctl_file", {"path": str(path), "settings": {"vm.swappiness ": 10}, "apply": False}, "'vm.swappiness ' is not a sysctl name")
