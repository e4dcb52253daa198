"""A cluster's nodes must be of one hardware class: refused at plan time by the cluster role's
cross-host check and by site.yml's fleet check, each node named with its class."""

import pytest

from ansible_collections.sparkfleet.vllm.plugins.filter.cluster import cluster_fleet_problems
from ansible_collections.sparkfleet.vllm.plugins.filter.fleet import fleet_problems_filter
from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import fleet_cluster_problems


def fleet(classes, nodes=None):
    nodes = nodes or list(classes)
    hosts = {}
    for host, hardware_class in classes.items():
        hosts[host] = {"cluster_name": "tp", "cluster_nodes": nodes}
        if hardware_class is not ...:
            hosts[host]["sparkfleet_hardware_class"] = hardware_class
    return hosts


@pytest.mark.parametrize(
    ("classes", "seen"),
    [
        pytest.param({"spark-1": "dgx_spark", "gx10-1": "asus_gx10"}, "spark-1: dgx_spark, gx10-1: asus_gx10", id="two-classes"),
        pytest.param({"spark-1": "dgx_spark", "spark-2": ...}, "spark-1: dgx_spark, spark-2: none set", id="one-unset"),
        pytest.param({"spark-1": "dgx_spark", "spark-2": ""}, "spark-1: dgx_spark, spark-2: none set", id="one-empty"),
        pytest.param({"spark-1": "dgx_spark", "spark-2": None}, "spark-1: dgx_spark, spark-2: none set", id="one-null"),
        pytest.param({"spark-1": "dgx_spark", "spark-2": "dgx_spark", "gx10-1": "asus_gx10"},
                     "spark-1: dgx_spark, spark-2: dgx_spark, gx10-1: asus_gx10", id="three-nodes-one-odd"),
        pytest.param({"spark-1": "dgx_spark", "spark-2": ["dgx_spark"]}, "spark-1: dgx_spark, spark-2: ['dgx_spark']", id="a-list"),
        pytest.param({"spark-1": "dgx_spark", "spark-2": "DGX_Spark"}, "spark-1: dgx_spark, spark-2: DGX_Spark", id="spelled-otherwise"),
    ],
)
def test_nodes_of_different_hardware_classes_are_refused_each_named(classes, seen):
    problems = fleet_cluster_problems(fleet(classes))
    assert len(problems) == 1
    assert problems[0].startswith(f"cluster tp: its nodes are of different hardware classes ({seen}); ")
    assert "Build a cluster of one hardware class" in problems[0]
    assert fleet_cluster_problems(fleet(classes), "tp") == problems and fleet_cluster_problems(fleet(classes), "other") == []


@pytest.mark.parametrize("classes", [{"spark-1": "dgx_spark", "spark-2": "dgx_spark"}, {"spark-1": ..., "spark-2": ...},
                                     {"gx10-1": "asus_gx10", "gx10-2": "asus_gx10", "gx10-3": "asus_gx10"}])
def test_nodes_of_one_class_pass(classes):
    assert fleet_cluster_problems(fleet(classes)) == []


def test_a_node_outside_the_hosts_given_is_not_judged():
    """A run limited to part of the inventory: the node whose variables are not given is the role's own check's."""
    hosts = fleet({"spark-1": "dgx_spark", "gx10-1": "asus_gx10"})
    del hosts["gx10-1"]
    assert fleet_cluster_problems(hosts) == []


def test_the_cluster_role_and_the_fleet_check_read_the_class_from_hostvars():
    hostvars = fleet({"spark-1": "dgx_spark", "gx10-1": "asus_gx10"})
    for host, values in hostvars.items():
        values["ansible_host"] = f"10.0.0.{len(host)}{host[-1]}"
    role = cluster_fleet_problems(list(hostvars), hostvars, "tp")
    check = fleet_problems_filter(list(hostvars), hostvars, list(hostvars))
    assert role == [problem for problem in check if "hardware classes" in problem]
    assert len(role) == 1 and "spark-1: dgx_spark, gx10-1: asus_gx10" in role[0]
