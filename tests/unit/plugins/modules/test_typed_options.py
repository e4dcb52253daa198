"""Dict options with typed suboptions, run as Ansible runs the modules (their arguments on stdin): a value of another
shape is refused naming the option and the fix, never a traceback; what the roles pass still validates. And every
module's documentation states its attributes (idempotent among them) and its membership of the collection's action
group, which meta/runtime.yml lists."""

import pathlib

import pytest
import yaml
from test_modules_as_ansible_runs_them import MODULES, ROOT, refused, run

STAMP = "a" * 16
IMAGE_KEY = "c" * 16


@pytest.mark.parametrize(
    ("peer", "fragment"),
    [({"name": "spark-2", "address": ["192.168.100.12"]}, "peers[0]: address \"['192.168.100.12']\" of spark-2 is not an IP address"),
     ({"name": "spark-2", "address": {"ipv4": "192.168.100.12"}}, "peers[0]: address \"{'ipv4': '192.168.100.12'}\" of spark-2 is not an IP address"),
     ({"name": "spark-2", "address": 12}, "peers[0]: address '12' of spark-2 is not an IP address"),
     ({"name": "spark-2", "address": "spark-2.fast"}, "peers[0]: address 'spark-2.fast' of spark-2 is not an IP address"),
     ({"name": " ", "address": "192.168.100.12"}, "peers[0]: name is empty; give the other node's inventory name"),
     ({"name": "spark-2"}, "missing required arguments: address found in peers"),
     ({"address": "192.168.100.12"}, "missing required arguments: name found in peers"),
     ({"name": "spark-2", "address": "192.168.100.12", "host": "spark-2"}, "peers.host. Supported parameters include: address, name"),
     ("spark-2", "dictionary requested")],
    ids=["list", "mapping", "number", "hostname", "blank-name", "no-address", "no-name", "extra-key", "not-a-mapping"],
)
def test_cluster_fabric_names_a_peer_of_another_shape_before_any_ping(peer, fragment):
    refused("cluster_fabric", {"source": "spark-1", "peers": [{"name": "spark-3", "address": "192.168.100.13"}, peer]},
            fragment.replace("peers[0]", "peers[1]"))


def test_cluster_fabric_takes_the_peers_the_cluster_role_plans(tmp_path):
    """The cluster plans each peer as {name, address} (_cluster: "peer"); a ping on PATH that answers stands in for iputils."""
    ping = tmp_path / "bin" / "ping"
    ping.parent.mkdir()
    ping.write_text("#!/bin/sh\nprintf '3 packets transmitted, 3 received, 0%% packet loss, time 402ms\\n"
                    "rtt min/avg/max/mdev = 0.1/0.2/0.3/0.0 ms\\n'\n")
    ping.chmod(0o755)
    result = run("cluster_fabric", {"source": "spark-1", "peers": [{"name": "spark-2", "address": "192.168.100.12"}]}, path=ping.parent)
    assert result.get("failed") is not True and result["ok"], result
    assert [(p["target"], p["address"], p["ok"]) for p in result["pings"]] == [("spark-2", "192.168.100.12", True)]


def caches_of(tmp_path):
    jit = tmp_path / "cache" / "jit" / IMAGE_KEY
    (jit / "warm").mkdir(parents=True)
    (jit / "warm" / STAMP).write_text("1\n")
    return jit, [{"jit_dir": str(jit), "stamps": [STAMP], "backup": str(tmp_path / "controller" / "spark-1" / f"{IMAGE_KEY}.tar")}]


@pytest.mark.parametrize(("action", "suffix"), [("archived", ".backup.tar"), ("unpack", ".restore.tar"), ("archive", ".backup.tar")])
def test_compile_caches_names_a_folder_where_its_archive_goes(tmp_path, action, suffix):
    jit, caches = caches_of(tmp_path)
    folder = pathlib.Path(f"{jit}{suffix}")
    folder.mkdir()
    result = refused("compile_caches", {"action": action, "caches": caches, "archived_stamps": {str(jit): [STAMP]}},
                     str(folder), "(Is a directory)")
    assert result["done"] == [] and folder.is_dir()


def test_compile_caches_names_a_folder_where_its_record_of_the_archive_goes(tmp_path):
    """The record of what the controller's archive holds is read through the collection's file reader, whose refusal
    is a FileProblem, not the caches' own: a folder in its place is named, never a traceback."""
    jit, caches = caches_of(tmp_path)
    folder = pathlib.Path(f"{jit}.backed-up")
    folder.mkdir()
    result = refused("compile_caches", {"action": "archive", "caches": caches}, str(folder), "cannot be read")
    assert result["done"] == [] and folder.is_dir() and not pathlib.Path(f"{jit}.backup.tar").exists()


@pytest.mark.parametrize(
    ("change", "fragment"),
    [({"stamps": None}, "missing required arguments: stamps found in caches"),
     ({"backup": None}, "missing required arguments: backup found in caches"),
     ({"jit_dir": None}, "missing required arguments: jit_dir found in caches"),
     ({"image": "vllm"}, "caches.image. Supported parameters include: backup, jit_dir, stamps"),
     ({"stamps": {"warm": STAMP}}, "argument 'stamps' is of type dict found in 'caches'. and we were unable to convert to list")],
    ids=["no-stamps", "no-backup", "no-jit-dir", "extra-key", "stamps-mapping"],
)
def test_compile_caches_refuses_entries_of_another_shape_before_anything_is_touched(tmp_path, change, fragment):
    jit, caches = caches_of(tmp_path)
    entry = {key: value for key, value in {**caches[0], **change}.items() if value is not None}
    refused("compile_caches", {"action": "archive", "caches": [entry]}, fragment)
    assert not pathlib.Path(f"{jit}.backup.tar").exists()


def sweep_report(tmp_path, objective):
    record = {"label": "k0", "draft_count": 0, "runs": []}
    return {"dest": str(tmp_path / "report"), "title": "t", "results": [record], "objective": objective, "concurrencies": [1, 8], "plot": False}


@pytest.mark.parametrize(
    ("objective", "fragment"),
    [({"noise_floor_pct": 0}, "missing required arguments: target_concurrency found in objective"),
     ({"target_concurrency": 8, "ttft_budget": 500}, "objective.ttft_budget. Supported parameters include: noise_floor_pct, single_stream"),
     ({"target_concurrency": 8, "noise_floor_pct": "5%"}, "objective.noise_floor_pct: '5%' is not a number")],
    ids=["no-target", "misspelt-key", "percent-sign"],
)
def test_sweep_report_names_an_objective_of_another_shape(tmp_path, objective, fragment):
    refused("vllm_sweep_report", sweep_report(tmp_path, objective), fragment)
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    ("case", "fragment"),
    [({"id": "a", "prompt": "q"}, "missing required arguments: check found in cases"),
     ({"id": "a", "check": {"exact": "x"}}, "missing required arguments: prompt found in cases"),
     ({"id": "a", "prompt": "q", "check": {"exact": "x"}, "code": "print(1)"}, "cases.code. Supported parameters include: check, id, prompt"),
     ({"id": "a", "prompt": "q", "check": "exact x"}, "argument 'check' is of type str found in 'cases'. and we were unable to convert to dict"),
     ({"id": "a", "prompt": "q", "check": {"exact": "x", "regex": "x"}}, "cases[0] (a).check: must be exactly one of has_number")],
    ids=["no-check", "no-prompt", "extra-key", "check-text", "two-checks"],
)
def test_correctness_names_a_case_of_another_shape_before_sending_anything(tmp_path, case, fragment):
    # Refused before any request: nothing listens on the discard port.
    refused("vllm_correctness", {"url": "http://127.0.0.1:9", "model": "m", "label": "x", "results_dir": str(tmp_path / "results"), "cases": [case]},
            fragment)
    assert not (tmp_path / "results").exists()


def documentation(module):
    text = (MODULES / f"{module}.py").read_text()
    return yaml.safe_load(text.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])


MODULE_NAMES = sorted(path.stem for path in MODULES.glob("*.py"))


@pytest.mark.parametrize("module", MODULE_NAMES)
def test_every_module_states_its_attributes_from_the_collections_fragment(module):
    doc = documentation(module)
    assert "sparkfleet.vllm.attributes" in doc["extends_documentation_fragment"]
    assert set(doc["attributes"]) >= {"check_mode", "diff_mode", "idempotent"}
    for name in ("check_mode", "diff_mode", "idempotent"):
        assert doc["attributes"][name]["support"] in ("full", "partial", "none"), (module, name)
        assert doc["attributes"][name]["support"] == "full" or doc["attributes"][name].get("details"), f"{module}: say what {name} lacks"


def test_the_action_group_lists_every_module_once():
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    assert runtime["action_groups"]["sparkfleet_vllm"] == MODULE_NAMES
