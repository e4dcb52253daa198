"""Who drained what (issue 37): each drained name records its owners, and an undrain by a hook's run or a
backend's watchdog releases only its own drain, in several spellings; the watchdog's route budget; one
key line per role set for a peer that is both a cluster node and a gateway backend; a partial play
keeping the gateways outside it as they were."""

import json

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway import backend_reports, gateway_plan
from ansible_collections.sparkfleet.vllm.plugins.module_utils._gateway_routes import (
    apply_request,
    drain_problems,
    held_by_others,
    owner_problem,
    watchdog_route,
)
from ansible_collections.sparkfleet.vllm.plugins.module_utils._watchdog import kept_gateways, peer_access, route_budget

KEY = "k" * 40
BUDGET = {"route_budget": 3, "route_budget_window": 600}


def endpoint(name, port):
    return {"name": name, "port": port, "bind_addresses": ["0.0.0.0"], "served_names": ["qwen"], "api_key": KEY, "head": True}


@pytest.fixture
def plan():
    hostvars = {host: {"ansible_host": f"192.0.2.{index}", "vllm_endpoints": [endpoint("chat", 8000)]}
                for index, host in enumerate(("spark-1", "spark-2", "spark-3"), start=1)}
    settings = {"image": "ghcr.io/berriai/litellm:v1.110.2@sha256:" + "ab" * 32, "master_key": "sk-" + "m" * 40,
                "backends": ["spark-1", "spark-2", "spark-3"], "model_groups": {"fast": ["qwen"]}}
    return gateway_plan(settings, backend_reports(settings["backends"], hostvars), "spark-1")


@pytest.mark.parametrize(("record", "name"), [
    ({"spark-2/chat": ["operator"]}, "spark-2/chat"),
    ({"spark-2": ["operator"]}, "spark-2/chat"),
    ({"spark-2/chat": ["bench@r1"]}, "spark-2/chat"),
    ({"spark-2/chat": ["rollout@b2"], "spark-2": ["operator"]}, "spark-2/chat"),
])
def test_a_watchdog_never_undoes_a_drain_it_did_not_make(plan, record, name):
    after, reply = watchdog_route(plan, record, "undrain", name)
    assert after is None and reply["result"] == "kept", reply
    assert "which undoes only its own drains" in reply["why"]


def test_the_watchdog_of_one_host_cannot_release_another_hosts_watchdog_drain(plan):
    record = {"spark-2/chat": ["watchdog@spark-2"]}
    assert apply_request(record, [], ["spark-2/chat"], "watchdog@spark-3") == record
    assert held_by_others(record, ["spark-2/chat"]) == {"spark-2/chat": ["watchdog@spark-2"]}
    assert watchdog_route(plan, record, "undrain", "spark-2/chat") == ({}, {"result": "undrained", "why": "spark-2/chat back in rotation"})


@pytest.mark.parametrize(("record", "undrain", "owner", "after", "held"), [
    # A hook's run releases its own drain; the operator's stays, and the run says who holds it.
    ({"spark-2": ["operator"]}, ["spark-2"], "bench@r1", {"spark-2": ["operator"]}, {"spark-2": ["operator"]}),
    ({"spark-2": ["bench@r1", "operator"]}, ["spark-2"], "bench@r1", {"spark-2": ["operator"]}, {"spark-2": ["operator"]}),
    ({"spark-2": ["bench@r1"]}, ["spark-2"], "bench@r1", {}, {}),
    # Another run of the same hook (one left behind, or one running at once) is another owner.
    ({"spark-2": ["bench@r0"]}, ["spark-2"], "bench@r1", {"spark-2": ["bench@r0"]}, {"spark-2": ["bench@r0"]}),
    ({"spark-2/chat": ["rollout@b1"], "spark-2": ["operator"]}, ["spark-2/chat"], "rollout@b1", {"spark-2": ["operator"]},
     {"spark-2/chat": ["operator"]}),
    ({"spark-3/chat": ["watchdog@spark-3"]}, ["spark-3"], "sweep@s1", {"spark-3/chat": ["watchdog@spark-3"]}, {}),
    # The operator's undrain puts a name back whoever drained it.
    ({"spark-2": ["bench@r0", "operator", "watchdog@spark-2"]}, ["spark-2"], "operator", {}, {}),
])
def test_an_undrain_releases_only_its_owners_drain(record, undrain, owner, after, held):
    result = apply_request(record, [], undrain, owner)
    assert result == after and held_by_others(result, undrain) == held


def test_a_drain_adds_its_owner_and_an_operators_drain_during_a_run_outlives_the_run():
    during = apply_request({"spark-2": ["bench@r1"]}, ["spark-2"], [], "operator")
    assert during == {"spark-2": ["bench@r1", "operator"]}
    assert apply_request(during, [], ["spark-2"], "bench@r1") == {"spark-2": ["operator"]}


def test_a_hooks_undrain_of_an_instance_whose_host_the_operator_drained_is_no_refusal(plan):
    record = {"spark-2": ["operator"], "spark-2/chat": ["rollout@b1"]}
    assert drain_problems(plan, record, [], ["spark-2/chat"], False, "rollout@b1") == []
    assert drain_problems(plan, record, [], ["spark-2/chat"], False, "operator")[0].startswith("gateway undrain: spark-2/chat would stay out")


@pytest.mark.parametrize("owner", ["watchdog@spark-2", "bench", "Bench@r1", "bench@", "bench@r 1", "@r1", "", None, 7, "x" * 40 + "@r1"])
def test_an_owner_that_is_neither_the_operator_nor_a_hooks_run_is_refused(owner):
    assert owner_problem(owner).startswith(f"gateway drain: owner {str(owner)[:120]!r} is neither 'operator' nor a hook's run")
    assert "set gateway_drain_owner" in owner_problem(owner)


@pytest.mark.parametrize("owner", ["operator", "bench@20250101T120000Z-1a2b", "sweep@x", "rollout@b.1:2", "my_hook@run-7"])
def test_the_operator_and_a_hooks_run_may_drain(owner):
    assert owner_problem(owner) is None


def test_a_watchdogs_changes_within_the_budget_pass_and_the_next_is_refused_or_deferred():
    changes, refusal = route_budget([], "drain", "spark-2/chat", BUDGET, 1000.0)
    assert (changes, refusal) == ([1000.0], None)
    changes, refusal = route_budget([900.0, 950.0], "undrain", "spark-2/chat", BUDGET, 1000.0)
    assert (changes, refusal) == ([900.0, 950.0, 1000.0], None)
    full = [900.0, 950.0, 990.0]
    kept, refused = route_budget(full, "drain", "spark-2/chat", BUDGET, 1000.0)
    assert kept == full and refused["result"] == "refused"
    assert refused["why"] == ("spark-2's watchdog changed this gateway's routing 3 times in the last 600 s, its budget (watchdog_route_budget 3); "
                              "each change restarts LiteLLM: spark-2/chat is not drained, the watchdog acts on it in rotation")
    kept, deferred = route_budget(full, "undrain", "spark-2/chat", BUDGET, 1000.0)
    assert kept == full and deferred["result"] == "deferred" and "spark-2/chat stays out, undrained on a later sample, in about 501 s" in deferred["why"]


@pytest.mark.parametrize("history", [[300.0, 350.0, 399.9], [100.0] * 5, None, "garbage", [True, "x", None]])
def test_changes_out_of_the_window_or_unreadable_do_not_count(history):
    changes, refusal = route_budget(history, "drain", "spark-2/chat", BUDGET, 1000.0)
    assert refusal is None and changes[-1] == 1000.0 and len(changes) == 1


def test_changes_stamped_after_now_count_a_clock_set_back_does_not_reset_the_budget():
    assert route_budget([1000.05, 2000.0, 2001.0], "drain", "spark-2/chat", BUDGET, 1000.0)[1]["result"] == "refused"


USER = "ssh-ed25519 " + "A" * 68
HOST = "ssh-ed25519 " + "B" * 68


def dual_role_reports(worker_addresses):
    """spark-1 runs a gateway and a cluster's head; spark-2 is the cluster's worker and a backend of the gateway."""
    nodes = [{"rank": 0, "address": "10.0.0.1"}, {"rank": 1, "address": "10.0.0.2"}]
    rank = {"unit": "sparkfleet-cluster-tp.service", "nodes": nodes}
    return {
        "spark-1": {"ranks": [{**rank, "host_ip": "10.0.0.1"}], "gateway": {"spark-1": ["127.0.0.1"], "spark-2": ["192.168.1.2"]},
                    "addresses": [{"address": "192.168.1.1", "prefix": 24}, {"address": "10.0.0.1", "prefix": 24}],
                    "user_key": USER + "1", "host_key": HOST + "1"},
        "spark-2": {"ranks": [{**rank, "host_ip": "10.0.0.2"}], "gateway": None, "addresses": worker_addresses,
                    "user_key": USER + "2", "host_key": HOST + "2"},
    }


@pytest.mark.parametrize(("addresses", "expected"), [
    # The fast link and the LAN: cluster steps only from the link, drains from both.
    ([{"address": "192.168.1.2", "prefix": 24}, {"address": "10.0.0.2", "prefix": 24}],
     {"spark-2:backend": ("192.168.1.2", " --backend"), "spark-2:backend+cluster": ("10.0.0.2", " --backend --cluster")}),
    # Two LAN addresses beside the link.
    ([{"address": "192.168.1.2", "prefix": 24}, {"address": "192.168.2.2", "prefix": 24}, {"address": "10.0.0.2", "prefix": 24}],
     {"spark-2:backend": ("192.168.1.2,192.168.2.2", " --backend"), "spark-2:backend+cluster": ("10.0.0.2", " --backend --cluster")}),
    # The link's address missing from the facts: the cluster's line alone carries it.
    ([{"address": "192.168.1.2", "prefix": 24}],
     {"spark-2:backend": ("192.168.1.2", " --backend"), "spark-2:cluster": ("10.0.0.2", " --cluster")}),
    # One address for everything (the lab's): one line, both roles, from it only.
    ([{"address": "10.0.0.2", "prefix": 24}], {"spark-2:backend+cluster": ("10.0.0.2", " --backend --cluster")}),
])
def test_a_cluster_peer_that_is_also_a_backend_gets_one_line_per_role_set(addresses, expected):
    access = peer_access("spark-1", dual_role_reports(addresses))
    assert access["errors"] == [] and access["peers"] == ["spark-2"]
    assert access["key_ids"] == sorted(expected)
    for entry in access["authorized_keys"]:
        sources, flags = expected[entry["key_id"]]
        assert entry["line"] == (f'restrict,from="{sources}",command="/usr/bin/python3 -I /usr/local/libexec/sparkfleet/sparkfleet_watchdog.py peer '
                                 f'--from spark-2{flags}" {USER}2 sparkfleet-watchdog@{entry["key_id"]}')
    cluster_sources = {expected[key][0] for key in expected if "cluster" in key}
    assert cluster_sources == {"10.0.0.2"}, "cluster steps only from the cluster's link"


GATEWAYS = {"gateways": [{"name": "gw-1", "address": "192.168.1.1"}, {"name": "spark-2", "address": "local"}]}
KNOWN = f"10.0.0.3 {HOST}3\n192.168.1.1 {HOST}9\n"


def previous(record=None, known=KNOWN):
    record = GATEWAYS if record is None else record
    return {"record": json.dumps(record) if isinstance(record, dict) else record, "known_hosts": known}


@pytest.mark.parametrize(("play", "inventory", "kept"), [
    (["spark-2"], ["gw-1", "spark-2"], [{"name": "gw-1", "address": "192.168.1.1"}]),
    (["spark-2", "spark-3"], ["gw-1", "spark-2", "spark-3"], [{"name": "gw-1", "address": "192.168.1.1"}]),
    # The gateway in the play: its own report decides, nothing is kept.
    (["gw-1", "spark-2"], ["gw-1", "spark-2"], []),
    # The gateway gone from the inventory: dropped.
    (["spark-2"], ["spark-2"], []),
])
def test_a_partial_play_keeps_the_gateways_outside_it_as_they_were(play, inventory, kept):
    assert kept_gateways("spark-2", previous(), play, inventory) == kept


@pytest.mark.parametrize("record", ["", "{damaged", "[]", json.dumps({"gateways": "gw-1"}), json.dumps({"gateways": [{"name": "gw 1", "address": "x"}]})])
def test_a_missing_or_damaged_record_keeps_nothing(record):
    assert kept_gateways("spark-2", previous(record), ["spark-2"], ["gw-1", "spark-2"]) == []


def test_site_limited_to_a_backend_leaves_its_watchdogs_gateways_record_and_host_keys_as_they_were():
    """site.yml --limit spark-2: the gateway gw-1 is not in the play; the record and gw-1's host key stay."""
    reports = {"spark-2": {"ranks": [], "gateway": None, "addresses": [{"address": "192.168.1.2", "prefix": 24}], "user_key": USER + "2",
                           "host_key": HOST + "2"}}
    access = peer_access("spark-2", reports, previous(), ["gw-1", "spark-2"])
    assert access["errors"] == [] and access["authorized_keys"] == []
    assert access["gateways"] == [{"name": "gw-1", "address": "192.168.1.1"}]
    assert access["known_hosts"] == f"192.168.1.1 {HOST}9\n", "gw-1's host key kept, no other"
    assert peer_access("spark-2", reports, previous(), ["spark-2"])["gateways"] == [], "a gateway gone from the inventory is dropped"
    assert peer_access("spark-2", reports)["gateways"] == [], "without a record, nothing to keep"
