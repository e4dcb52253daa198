"""Role settings given as text by -e (extra variables are text) are read as the role's argument spec
reads its int, float and bool types: accepted, converted for the plan, and still refused out of range."""

import pytest
from test_cluster import declaration, planned

from ansible_collections.sparkfleet.vllm.plugins.module_utils._cluster import CLUSTER_SETTINGS, DEFAULTS
from ansible_collections.sparkfleet.vllm.plugins.module_utils._settings import as_bool, as_float, as_int, coerced, setting_problems


@pytest.mark.parametrize(("value", "number"), [(30, 30), ("30", 30), (" 30 ", 30), ("30.0", 30), (30.0, 30), ("+30", 30), ("-3", -3),
                                               ("3e1", 30), ("30.5", None), (30.5, None), ("thirty", None), ("", None),
                                               ("nan", None), ("inf", None), (True, None), (None, None), ([30], None)])
def test_whole_numbers_as_the_int_type_reads_them(value, number):
    assert as_int(value) == number


@pytest.mark.parametrize(("value", "number"), [(18, 18.0), ("18", 18.0), ("18.5", 18.5), (" 0.5", 0.5), (18.5, 18.5), ("1e1", 10.0),
                                               ("inf", None), ("nan", None), ("fast", None), (False, None), (None, None)])
def test_numbers_as_the_float_type_reads_them(value, number):
    assert as_float(value) == number


@pytest.mark.parametrize(("value", "switch"), [(True, True), ("true", True), ("True", True), ("yes", True), ("on", True), ("y", True),
                                               ("t", True), ("1", True), (1, True), (1.0, True), (False, False), ("false", False),
                                               ("No", False), ("off", False), ("0", False), (0, False), (" n ", False),
                                               ("maybe", None), ("", None), (2, None), (None, None), ([], None)])
def test_switches_as_the_bool_type_reads_them(value, switch):
    assert as_bool(value) is switch


TEXT = {"ping_count": "5", "mtu": "9000", "master_port": "29600", "gpus_per_node": "1", "nccl_min_busbw_gbs": "18",
        "require_rdma": "false", "fabric_gate": "yes"}


@pytest.mark.parametrize(("name", "text"), sorted(TEXT.items()))
def test_each_cluster_setting_given_as_text_by_e_is_accepted_and_converted(name, text):
    cluster = declaration(**{name: text})
    plan = planned(cluster)
    assert plan["errors"] == [], plan["errors"]
    converted = coerced(CLUSTER_SETTINGS, cluster)[name]
    words = {"false": False, "yes": True}
    assert converted is words[text] if text in words else (not isinstance(converted, str) and converted == float(text))


@pytest.mark.parametrize(("value", "kept"), [(1, 1), (0, 0), (True, True), ("maybe", "maybe"), (None, None)])
def test_only_text_is_converted_the_rest_is_left_to_be_named(value, kept):
    """An int for a switch or a bool for a count was written so in YAML: setting_problems names it."""
    assert coerced(CLUSTER_SETTINGS, {"fabric_gate": value})["fabric_gate"] is kept


def test_text_numbers_reach_the_plan_as_numbers():
    plan = planned(declaration(master_port="29600", gpus_per_node="1", mtu="9000"))
    option = plan["nodes"]["spark-1"]["option"]
    assert option["master_port"] == 29600 and option["gpus_per_node"] == 1
    assert option["fabric"]["mtu"] == 9000


@pytest.mark.parametrize(("name", "text", "message"), [
    ("ping_count", "500", "cluster_ping_count: 500 must be a whole number from 1 to 100"),
    ("ping_count", "2.5", "cluster_ping_count: '2.5' must be a whole number from 1 to 100"),
    ("master_port", "70000", "cluster_master_port: 70000 must be a port number between 1 and 65535"),
    ("nccl_min_busbw_gbs", "0", "cluster_nccl_min_busbw_gbs: 0.0 must be a number above 0 and at most 100"),
    ("nccl_min_busbw_gbs", "fast", "cluster_nccl_min_busbw_gbs: 'fast' must be a number above 0 and at most 100"),
    ("require_rdma", "maybe", "cluster_require_rdma: 'maybe' must be true or false"),
    ("fabric_gate", "2", "cluster_fabric_gate: '2' must be true or false"),
    ("gpus_per_node", True, "cluster_gpus_per_node: True must be a whole number from 1 to 8"),
])
def test_text_out_of_range_is_still_refused_naming_the_variable(name, text, message):
    found = setting_problems("cluster_", CLUSTER_SETTINGS, coerced(CLUSTER_SETTINGS, {**DEFAULTS, **declaration(), name: text}))
    assert len(found) == 1 and found[0].startswith(message)
    assert any(error.startswith(message) for error in planned(declaration(**{name: text}))["errors"])
