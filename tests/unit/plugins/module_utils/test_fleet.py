"""The fleet check's cross-role and cross-host refusals, and the fleets it accepts."""

import pathlib
import types

import pytest
import yaml
from ansible.playbook.taggable import Taggable

from ansible_collections.sparkfleet.vllm.plugins.module_utils._fleet import ROLE_DEFAULT_FOLDERS, ROLE_DEFAULT_PORTS, fleet_problems
from ansible_collections.sparkfleet.vllm.plugins.module_utils._run_tags import tag_in_run

ROLES = pathlib.Path(__file__).resolve().parents[4] / "roles"


def endpoint(name, port):
    return {"name": name, "port": port, "bind_addresses": ["127.0.0.1"], "served_names": [name], "api_key": "k" * 32, "head": True}


def cluster(name="tp2", nodes=("spark-1", "spark-2"), port=8010, **changes):
    return {"cluster_name": name, "cluster_nodes": list(nodes), "cluster_master_port": 29501, "cluster_backend": "native",
            "cluster_instance": {"port": port}, **changes}


def lab_fleet():
    """The lab's shape: both hosts serve an instance and form a cluster, the first runs the gateway."""
    return {
        "spark-1": {"ansible_host": "10.0.0.1", "vllm_endpoints": [endpoint("tiny", 8001)], **cluster(),
                    "gateway_backends": ["spark-1", "spark-2"], "gateway_port": 4000},
        "spark-2": {"ansible_host": "10.0.0.2", "vllm_endpoints": [endpoint("tiny", 8001)], **cluster()},
    }


def test_a_fleet_whose_listeners_each_have_a_port_passes():
    assert fleet_problems(lab_fleet()) == []


def test_a_cluster_api_on_an_instance_port_of_its_head_is_refused_naming_both():
    fleet = lab_fleet()
    for host in fleet.values():
        host["cluster_instance"] = {"port": 8001}
    (problem,) = fleet_problems(fleet)
    assert problem.startswith("spark-1: port 8001 is claimed by vllm_instances (tiny).port and by cluster_instance.port")
    # Only the head serves the cluster's API: the worker's instance on 8001 is no conflict.
    assert "spark-2" not in problem


def test_the_rendezvous_ray_gateway_rsync_and_reserved_ports_are_counted():
    fleet = lab_fleet()
    fleet["spark-1"]["vllm_endpoints"] = [endpoint("a", 29501), endpoint("b", 6379), endpoint("c", 4000), endpoint("d", 8873),
                                          endpoint("e", 9100)]
    fleet["spark-1"].update(cluster_backend="ray", vllm_models_source="spark-1")
    problems = fleet_problems(fleet)
    assert [p.split(" is claimed")[0] for p in problems] == [
        "spark-1: port 4000", "spark-1: port 6379", "spark-1: port 8873", "spark-1: port 9100", "spark-1: port 29501"]
    assert "cluster_master_port" in problems[-1] and "Ray head" in problems[1] and "gateway_port" in problems[0]
    assert "vllm_models_rsync_port" in problems[2] and "node exporter" in problems[3]


def test_the_operator_names_the_ports_a_host_already_uses():
    fleet = lab_fleet()
    fleet["spark-2"]["sparkfleet_reserved_ports"] = {8001: "an older vLLM by hand"}
    (problem,) = fleet_problems(fleet)
    assert problem.startswith("spark-2: port 8001 is claimed by sparkfleet_reserved_ports (an older vLLM by hand)")
    fleet["spark-2"]["sparkfleet_reserved_ports"] = {"9100": ""}
    (problem,) = fleet_problems(fleet)
    assert "sparkfleet_reserved_ports" in problem and "must map port numbers" in problem


def test_one_box_under_two_inventory_names_is_refused():
    fleet = lab_fleet()
    fleet["spark-2"]["ansible_host"] = "10.0.0.1"
    (problem,) = fleet_problems(fleet)
    assert problem.startswith("spark-1, spark-2: one box (10.0.0.1) under 2 inventory names")
    fleet["spark-2"]["ansible_port"] = 2222
    assert fleet_problems(fleet) == [], "one address, two SSH ports: two boxes behind one forwarder"
    fleet["spark-1"]["ansible_host"] = fleet["spark-2"]["ansible_host"] = "localhost"
    del fleet["spark-2"]["ansible_port"]
    assert fleet_problems(fleet) == []


def test_a_host_in_two_clusters_is_refused():
    fleet = lab_fleet()
    fleet["gx10-1"] = {**cluster(name="other", nodes=("gx10-1", "spark-2"), port=8020), "ansible_host": "10.0.0.3"}
    problems = fleet_problems(fleet)
    assert any(p.startswith("spark-2: listed in the cluster_nodes of clusters other, tp2") for p in problems)


def test_a_node_listed_by_a_cluster_it_does_not_belong_to_is_refused():
    fleet = lab_fleet()
    fleet["spark-2"]["cluster_name"] = ""
    assert any(p.startswith("spark-2: listed in cluster tp2's cluster_nodes, but its own cluster_name is empty")
               for p in fleet_problems(fleet))


def test_ports_given_as_text_by_extra_vars_are_counted():
    fleet = lab_fleet()
    fleet["spark-1"]["gateway_port"] = "8001"
    (problem,) = fleet_problems(fleet)
    assert problem.startswith("spark-1: port 8001 is claimed by vllm_instances (tiny).port and by gateway_port")


def test_a_limited_run_still_sees_a_cluster_of_hosts_outside_the_limit():
    fleet = lab_fleet()
    outside = {"gx10-1": {**cluster(name="other", nodes=("gx10-1", "spark-2"), port=8020), "ansible_host": "10.0.0.3"}}
    limited = {"spark-2": fleet["spark-2"]}
    assert any(p.startswith("spark-2: listed in the cluster_nodes of clusters other, tp2") for p in fleet_problems(limited, {**fleet, **outside}))
    assert fleet_problems(limited, fleet) == []


def test_a_model_source_must_name_itself_for_the_nodes_copying_from_it():
    fleet = lab_fleet()
    fleet["spark-2"]["vllm_models_source"] = "spark-1"
    (problem,) = fleet_problems(fleet)
    assert problem.startswith("spark-2: vllm_models_source names spark-1, whose own vllm_models_source is ''")
    assert "Set vllm_models_source: spark-1 on spark-1 too" in problem
    fleet["spark-1"]["vllm_models_source"] = "spark-1"
    assert fleet_problems(fleet) == []
    # Under --limit the source outside the limit is still read from the inventory.
    assert fleet_problems({"spark-2": fleet["spark-2"]}, fleet) == []
    fleet["spark-1"]["vllm_models_source"] = ""
    assert len(fleet_problems({"spark-2": fleet["spark-2"]}, fleet)) == 1


def test_the_ports_and_folders_assumed_for_unset_variables_are_the_roles_defaults():
    defaults = {}
    for role in ("cluster", "gateway", "vllm"):
        defaults.update(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()))
    assert {name: defaults[name] for name in ROLE_DEFAULT_PORTS} == ROLE_DEFAULT_PORTS
    assert {name: defaults[name] for name in ROLE_DEFAULT_FOLDERS} == ROLE_DEFAULT_FOLDERS


@pytest.mark.parametrize(("changes", "pair"), [
    ({"gateway_config_dir": "/etc/sparkfleet/vllm"}, "gateway_config_dir (/etc/sparkfleet/vllm) and vllm_config_dir (/etc/sparkfleet/vllm)"),
    ({"cluster_config_dir": "/etc/sparkfleet/vllm/tp2"}, "cluster_config_dir (/etc/sparkfleet/vllm/tp2) and vllm_config_dir (/etc/sparkfleet/vllm)"),
    ({"vllm_config_dir": "/etc/sparkfleet/gateway/vllm"}, "gateway_config_dir (/etc/sparkfleet/gateway) and vllm_config_dir (/etc/sparkfleet/gateway/vllm)"),
])
def test_two_roles_sharing_a_configuration_folder_are_refused(changes, pair):
    """The vllm role removes every plan file in its folder that it no longer plans: the gateway's
    plan.json and drained.json, or a cluster's files, would go."""
    fleet = lab_fleet()
    fleet["spark-1"].update(changes)
    problems = fleet_problems(fleet)
    expected = (f"spark-1: {pair} share a folder; each role removes the files it no longer plans from its own folder, and would "
                "remove the other's. Give each role a folder of its own, such as /etc/sparkfleet/ROLE")
    assert [problem for problem in problems if "share a folder" in problem] == [expected], problems


def test_folders_of_roles_a_host_does_not_run_are_not_compared():
    fleet = {"spark-1": {"vllm_config_dir": "/etc/sparkfleet/x", "cluster_config_dir": "/etc/sparkfleet/x", "gateway_config_dir": "/etc/sparkfleet/x"}}
    assert fleet_problems(fleet) == []


def ansible_runs(tag, run_tags, skip_tags):
    """Ansible's own judgement of a task carrying this one tag (its Taggable.evaluate_tags)."""
    task = types.SimpleNamespace(tags=[tag], untagged=Taggable.untagged, _loader=None, _get_all_taggable_objects=lambda: [])
    return Taggable.evaluate_tags(task, run_tags, skip_tags, {})


@pytest.mark.parametrize("skip_tags", [[], ["swap"], ["vllm"], ["tagged"], ["all"], ["swap", "vllm"]])
@pytest.mark.parametrize("run_tags", [["all"], ["swap"], ["vllm"], ["tagged"], ["vllm", "swap"], ["untagged"]])
def test_a_role_is_in_the_run_exactly_when_ansible_would_run_its_tasks(run_tags, skip_tags):
    assert tag_in_run("swap", run_tags, skip_tags) == ansible_runs("swap", run_tags, skip_tags)


SITE_TAGS = ["driver_guard", "headless", "swap", "earlyoom", "wait_online", "exporter_dropins", "vllm", "cluster", "gateway", "watchdog", "always"]


@pytest.mark.parametrize(("run_tags", "skip_tags", "checked"), [
    (["vllm"], [], False),
    (["vllm", "cluster"], [], False),
    (["swap"], [], True),
    (["fleet"], [], True),
    (["fleet"], ["swap"], False),
    (["all"], ["vllm"], True),
])
def test_the_fleet_check_skips_a_role_only_when_the_run_surely_leaves_it_out(run_tags, skip_tags, checked):
    """A tag site.yml does not give (a play importing it under its own tag) may carry every role."""
    assert tag_in_run("swap", run_tags, skip_tags, SITE_TAGS) is checked


def test_the_fleet_check_knows_every_tag_site_yml_gives():
    site = yaml.safe_load((ROLES.parent / "playbooks" / "site.yml").read_text())
    given = {tag for play in site for entry in [play, *play.get("roles", []), *play.get("tasks", [])] for tag in entry.get("tags", [])}
    fleet_check = yaml.safe_load((ROLES.parent / "playbooks" / "tasks" / "fleet_check.yml").read_text())
    known = next(task["vars"]["__sparkfleet_site_tags"] for task in fleet_check if "vars" in task and "__sparkfleet_site_tags" in task["vars"])
    assert given == set(known) == set(SITE_TAGS)
