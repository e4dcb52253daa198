"""Paths are compared in one spelling: a doubled slash, a trailing slash or a leading // must not pass
a check the plain spelling fails, nor fail one it passes."""

import pytest
from test_cluster import declaration, planned

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import LOGIND_DROPIN_FOLDERS
from ansible_collections.sparkfleet.vllm.plugins.module_utils._fleet import folder_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import dropin_problem, normal_path

SPELLINGS = ["{}", "/{}", "{}/", "{}//", "//{}"]


def spelled(path, how):
    return how.format(path).replace("/sparkfleet/", "//sparkfleet/") if how == "{}" else how.format(path)


@pytest.mark.parametrize(("path", "normal"), [("/etc/sparkfleet", "/etc/sparkfleet"), ("//etc/sparkfleet", "/etc/sparkfleet"),
                                              ("/etc//sparkfleet/", "/etc/sparkfleet"), ("/etc/sparkfleet///", "/etc/sparkfleet"),
                                              ("/", "/"), ("///", "/")])
def test_one_spelling(path, normal):
    assert normal_path(path) == normal


@pytest.mark.parametrize("how", SPELLINGS)
@pytest.mark.parametrize(("first", "second"), [("/etc/sparkfleet/vllm", "/etc/sparkfleet/vllm"), ("/etc/sparkfleet", "/etc/sparkfleet/cluster")])
def test_roles_sharing_a_folder_are_refused_in_any_spelling(how, first, second):
    variables = {"vllm_config_dir": spelled(first, how), "cluster_name": "tp", "cluster_config_dir": second}
    found = folder_problems("spark-1", variables)
    assert len(found) == 1 and "share a folder" in found[0], variables


@pytest.mark.parametrize("how", SPELLINGS)
def test_folders_apart_pass_in_any_spelling(how):
    variables = {"vllm_config_dir": spelled("/etc/sparkfleet/vllm", how), "cluster_name": "tp", "cluster_config_dir": "/etc/sparkfleet/cluster"}
    assert folder_problems("spark-1", variables) == []


@pytest.mark.parametrize("path", ["/etc/systemd/logind.conf.d/10-x.conf", "/etc/systemd//logind.conf.d/10-x.conf",
                                  "/etc/systemd/logind.conf.d//10-x.conf", "//etc/systemd/logind.conf.d/10-x.conf",
                                  "/run/systemd/logind.conf.d/10-x.conf"])
def test_a_dropin_in_its_folder_passes_in_any_spelling(path):
    assert dropin_problem("v", path, LOGIND_DROPIN_FOLDERS, "it would not apply") is None
    assert planned(declaration(logind_remove_ipc_dropin=path))["errors"] == []


@pytest.mark.parametrize("path", ["/etc/systemd/logind.conf.d/sub/10-x.conf", "/etc/systemd/logind.conf.d.bak/10-x.conf",
                                  "/etc/systemd//logind.conf.d/10-x.txt", "/etc/systemd/10-x.conf", "/etc/systemd/logind.conf.d/../10-x.conf"])
def test_a_dropin_elsewhere_is_refused_in_any_spelling(path):
    found = planned(declaration(logind_remove_ipc_dropin=path))["errors"]
    assert len(found) == 1 and found[0].startswith("cluster_logind_remove_ipc_dropin: "), found
