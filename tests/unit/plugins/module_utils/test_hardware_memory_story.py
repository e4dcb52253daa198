"""One memory story per board (issue 38 item 8): each GPU class's ceiling, asked of CUDA's total, fits the free
figure vLLM reads after a clean boot, so the plan never admits a class default the launch's memory check refuses on
a clean box; overrides that break it are refused naming the value the inventory set."""

import math

import pytest

from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import CLASSES, resolve_class
from ansible_collections.sparkfleet.vllm.plugins.module_utils._launch_checks import memory_problem

GIB = 1024**3


@pytest.mark.parametrize("name", list(CLASSES))
def test_every_class_ceiling_fits_its_clean_boot_figure(name):
    values = resolve_class(name)["values"]
    assert values, resolve_class(name)["errors"]
    if values["unified_memory"] and values["gpu"]:
        assert values["free_memory_baseline_gib"] and values["pool_gib"], "an integrated GPU class needs both figures"
    if values["free_memory_baseline_gib"] is None:
        return
    asked = math.ceil(values["gmu_ceiling"] * values["pool_gib"] * GIB)
    assert asked <= values["free_memory_baseline_gib"] * GIB
    clean_box = {"device": "cuda", "figure": "MemAvailable (integrated GPU, torch's is_integrated)",
                 "free": int(values["free_memory_baseline_gib"] * GIB), "total": int(values["pool_gib"] * GIB)}
    assert memory_problem("llm", values["gmu_ceiling"], clean_box) is None, "the launch check admits the ceiling on a clean box"


@pytest.mark.parametrize(("name", "baseline", "asked"), [("dgx_spark", 117.0, 103.44), ("asus_gx10", 106.0, 103.44)])
def test_the_gb10_figures_and_their_seed_lines(name, baseline, asked):
    values = CLASSES[name]
    assert values["pool_gib"] == 121.69 and values["free_memory_baseline_gib"] == baseline and values["gmu_ceiling"] == 0.85
    assert round(values["gmu_ceiling"] * values["pool_gib"], 2) == asked
    for key in ("pool_gib", "gmu_ceiling", "free_memory_baseline_gib"):
        assert "seed 002 line" in values["sources"][key], key
    assert "reboot, and if MemAvailable is still below it after the reboot, cut the AC power" in values["sources"]["free_memory_baseline_gib"]


@pytest.mark.parametrize(("name", "overrides", "named", "asked", "baseline"), [
    pytest.param("asus_gx10", {"gmu_ceiling": 0.9}, "gmu_ceiling", "109.52", "106.0", id="gx10-at-upstreams-0.90"),
    pytest.param("asus_gx10", {"gmu_ceiling": 0.87, "free_memory_baseline_gib": 105.5}, "gmu_ceiling", "105.87", "105.5",
                 id="gx10-node-table-0.87-on-a-box-measured-lower"),
    pytest.param("dgx_spark", {"free_memory_baseline_gib": 99}, "free_memory_baseline_gib", "103.44", "99", id="spark-old-cuda-view"),
    pytest.param("dgx_spark", {"free_memory_baseline_gib": 103.0}, "free_memory_baseline_gib", "103.44", "103.0", id="spark-just-short"),
    pytest.param("asus_gx10", {"pool_gib": 125}, "pool_gib", "106.25", "106.0", id="gx10-larger-pool"),
    pytest.param("dgx_spark", {"pool_gib": 110, "free_memory_baseline_gib": 90}, "free_memory_baseline_gib", "93.50", "90",
                 id="both-overridden-named-at-the-baseline"),
    pytest.param("dgx_spark", {"gmu_ceiling": 0.95, "free_memory_baseline_gib": 110}, "gmu_ceiling", "115.61", "110", id="both"),
])
def test_an_override_whose_ceiling_outgrows_the_clean_boot_figure_is_refused(name, overrides, named, asked, baseline):
    resolved = resolve_class(name, overrides)
    assert resolved["values"] == {} and len(resolved["errors"]) == 1, resolved["errors"]
    assert resolved["errors"][0].startswith(f"sparkfleet_hardware_overrides.{named}: gmu_ceiling ")
    assert f"asks for {asked} GiB, more than the {baseline} GiB free_memory_baseline_gib a clean boot of a {name} host leaves" \
        in resolved["errors"][0]
    assert "override free_memory_baseline_gib with the MemAvailable you measured after a clean boot" in resolved["errors"][0]


@pytest.mark.parametrize(("name", "overrides"), [
    ("asus_gx10", {"gmu_ceiling": 0.87}),
    ("asus_gx10", {"gmu_ceiling": 0.9, "free_memory_baseline_gib": 110}),
    ("dgx_spark", {"gmu_ceiling": 0.9}),
    ("dgx_spark", {"pool_gib": 110, "free_memory_baseline_gib": 95}),
    ("rtx_5090", {"gmu_ceiling": 0.95}),
    ("cpu_lab", {"gmu_ceiling": 0.99}),
])
def test_overrides_that_still_fit_pass(name, overrides):
    assert resolve_class(name, overrides)["errors"] == []


@pytest.mark.parametrize(("overrides", "named"), [({"gmu_ceiling": 1.5}, "gmu_ceiling: 1.5 is out of range"),
                                                  ({"free_memory_baseline_gib": 0}, "free_memory_baseline_gib: 0 is out of range"),
                                                  ({"pool_gib": -3}, "pool_gib: -3 is out of range")])
def test_a_value_out_of_range_is_named_once_not_again_for_the_ceiling(overrides, named):
    errors = resolve_class("dgx_spark", overrides)["errors"]
    assert any(named in error for error in errors) and not any("asks for" in error for error in errors), errors
