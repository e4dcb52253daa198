"""The preflight verdict from host facts (recorded real outputs, see fixtures/hardware/README.md),
the hardware class and the plan: each check passing, failing with its reason, or remedied."""

import json
import pathlib

import pytest
from test_host_facts import shown

from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import resolve_class
from ansible_collections.sparkfleet.vllm.plugins.module_utils._host_facts import summarise
from ansible_collections.sparkfleet.vllm.plugins.module_utils._preflight import host_python_problem, image_checks, preflight

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hardware"
GIB = 2**30
ALL_MASKED = "\n\n".join(f"Id={unit}\nLoadState=masked\nUnitFileState=masked"
                         for unit in ("sleep.target", "suspend.target", "hibernate.target", "hybrid-sleep.target"))
NVIDIA_DOCKER = (FIXTURES / "docker-info-lab-machine.json").read_text().replace('"runc": {', '"nvidia": {"path": "nvidia-container-runtime"}, "runc": {')


def gb10(**overrides):
    given = dict(dmi={"sys_vendor": "NVIDIA", "product_name": "DGX Spark"}, os_release="", architecture="aarch64",
                 gpu_text=(FIXTURES / "gb10-nvidia-smi-idle.csv").read_text(), gpu_error=None,
                 meminfo_text=(FIXTURES / "gb10-meminfo.txt").read_text(), swaps_text="Filename\tType\tSize\tUsed\tPriority\n",
                 fstab_text="", holders=[], docker_text=NVIDIA_DOCKER,
                 disk={"path": "/srv/models", "free_bytes": 800 * GIB, "total_bytes": 3600 * GIB}, units=shown(ALL_MASKED),
                 lists={"indexes": 4, "age_seconds": 600}, packages={})
    given.update(overrides)
    facts = summarise(**given)
    facts["docker"]["instance_containers"] = []
    return facts


def verdict(facts, hardware_class="dgx_spark", instances=({"gpu_memory_utilization": 0.85},), **options):
    return preflight(facts, hardware_class, resolve_class(hardware_class)["values"], list(instances), **options)


def status(result, name):
    return next(check for check in result["checks"] if check["name"] == name)


def test_a_healthy_spark_passes():
    result = verdict(gb10())
    assert result["ok"], result["reasons"]
    expected = {"board", "gpu", "driver branch", "swap off", "memory for the plan", "device holders", "free disk", "docker",
                "nvidia container runtime", "sleep targets masked"}
    assert {c["name"] for c in result["checks"]} >= expected


def test_an_unhealthy_spark_fails_with_every_reason_at_once():
    sick = gb10(swaps_text="Filename\tType\tSize\tUsed\tPriority\n/swap.img file 16777212 0 -2\n",
                fstab_text="/swap.img none swap sw 0 0\n",
                holders=[{"pid": 4242, "command": "python3", "paths": ["/dev/nvidia0"], "container": None}],
                disk={"path": "/srv/models", "free_bytes": 10 * GIB, "total_bytes": 100 * GIB},
                units=shown(ALL_MASKED.replace("Id=suspend.target\nLoadState=masked\nUnitFileState=masked",
                                               "Id=suspend.target\nLoadState=loaded\nUnitFileState=static")))
    result = verdict(sick, instances=[{"gpu_memory_utilization": 0.99}])
    reasons = " | ".join(result["reasons"])
    assert not result["ok"]
    for fragment in ("swap off: active: /swap.img; in /etc/fstab: /swap.img (returns at boot)",
                     "memory for the plan: 113.07 GiB available of 121.69 GiB", "pid 4242 (python3) holds /dev/nvidia0",
                     "free disk: 10.00 GiB free at /srv/models, need 170.00 GiB", "suspend.target is static"):
        assert fragment in reasons, reasons


def test_what_a_later_role_fixes_is_remedied_in_site_yml():
    sick = gb10(fstab_text="/swap.img none swap sw 0 0\n", units={"sleep.target": {"LoadState": "loaded", "UnitFileState": "static"}})
    alone = verdict(sick)
    assert [c["name"] for c in alone["checks"] if c["status"] == "fail"] == ["swap off", "sleep targets masked"]
    in_site = verdict(sick, remedies=["swap", "headless"])
    assert in_site["ok"] and status(in_site, "swap off")["status"] == "remedied"
    assert "the swap role fixes it in this run" in status(in_site, "swap off")["detail"]


def test_sleep_targets_systemd_did_not_answer_for_are_never_taken_as_masked():
    why = "systemctl show sleep.target exited 1: System has not been booted with systemd; is systemd running on the host?"
    unread = verdict({**gb10(units={}), "sleep_targets_error": why})
    assert status(unread, "sleep targets masked") == {**status(unread, "sleep targets masked"), "status": "fail",
                                                      "detail": f"systemd did not answer for the sleep targets ({why}), so none is "
                                                                "known to be masked; check that systemd runs on the host "
                                                                "(systemctl is-system-running)"}
    assert status(verdict(gb10(units={}), remedies=["headless"]), "sleep targets masked")["status"] == "remedied"


def test_the_wrong_board_the_wrong_driver_and_no_gpu():
    gx10_board = gb10(dmi={"sys_vendor": "ASUSTeK COMPUTER INC.", "product_name": "Ascent GX10"})
    assert "which is a dgx_spark board" in status(verdict(gx10_board), "board")["detail"]
    assert verdict(gx10_board, hardware_class="asus_gx10")["ok"]
    new_driver = gb10(gpu_text=(FIXTURES / "gb10-nvidia-smi-idle.csv").read_text().replace("580.173.02", "590.44.01"))
    assert status(verdict(new_driver), "driver branch")["status"] == "fail"
    no_gpu = gb10(gpu_text=None, gpu_error="is not installed")
    assert "gpu: no GPU: nvidia-smi is not installed; the dgx_spark class serves on a GPU" in verdict(no_gpu)["reasons"]


def test_a_lab_host_reports_no_gpu_cleanly_and_passes():
    lab = gb10(dmi={}, gpu_text=None, gpu_error="is not installed", docker_text=(FIXTURES / "docker-info-lab-machine.json").read_text(),
               units=shown((FIXTURES / "lab-host-unit-states.txt").read_text()), architecture="x86_64")
    result = verdict(lab, hardware_class="cpu_lab", instances=[{"gpu_memory_utilization": 0.1}])
    assert result["ok"], result["reasons"]
    assert status(result, "gpu")["detail"] == "no GPU expected (the CPU build); no GPU: nvidia-smi is not installed"


def test_memory_is_judged_only_before_the_instances_run_and_the_baseline_warns():
    busy = gb10(meminfo_text="MemTotal: 127600748 kB\nMemAvailable: 20000000 kB\n")
    assert status(verdict(busy), "memory for the plan")["status"] == "fail"
    busy["docker"]["instance_containers"] = ["vllm-chat"]
    assert verdict(busy)["ok"]
    residue = gb10(meminfo_text="MemTotal: 127600748 kB\nMemAvailable: 100000000 kB\n")
    result = verdict(residue, instances=[{"gpu_memory_utilization": 0.5}])
    assert result["ok"] and result["warnings"] == [
        "clean-boot baseline: 95.37 GiB MemAvailable, the free figure vLLM reads on this kind of GPU; a clean boot of this class "
        "leaves about 117.0 GiB, 21.63 GiB more. Stop what holds memory (the desktop, which the headless role masks; an exporter; "
        "a stale container), then reboot; if the figure is still below 117.0 GiB after the reboot, cut the AC power: a reboot "
        "keeps the GB10's allocator state on standby power (seed 002, residue of failed launches)"]


@pytest.mark.parametrize(("hardware_class", "available_kib", "status_seen"), [
    ("dgx_spark", 122683392, "pass"),
    ("dgx_spark", 117 * 1024**2, "pass"),
    ("dgx_spark", 117 * 1024**2 - 1, "warn"),
    ("dgx_spark", 103 * 1024**2, "warn"),
    ("asus_gx10", 106 * 1024**2, "pass"),
    ("asus_gx10", 105 * 1024**2, "warn"),
    ("asus_gx10", 99 * 1024**2, "warn"),
])
def test_the_residue_check_compares_memavailable_with_the_clean_boot_figure_vllm_reads(hardware_class, available_kib, status_seen):
    """The older 99 and 103 GiB (CUDA's view) let up to 18 GiB of residue pass: the baselines are MemAvailable's now."""
    facts = gb10(meminfo_text=f"MemTotal: 127600748 kB\nMemAvailable: {available_kib} kB\n")
    seen = status(verdict(facts, hardware_class=hardware_class, instances=[{"gpu_memory_utilization": 0.5}]), "clean-boot baseline")
    assert seen["status"] == status_seen and "GiB MemAvailable, the free figure vLLM reads" in seen["detail"]
    assert ("then reboot; if the figure is still below" in seen["detail"] and "cut the AC power" in seen["detail"]) == (status_seen == "warn")


def test_a_class_without_a_baseline_has_no_residue_check():
    lab = gb10(dmi={}, gpu_text=None, gpu_error="is not installed", architecture="x86_64",
               meminfo_text="MemTotal: 24000000 kB\nMemAvailable: 1000000 kB\n")
    names = {check["name"] for check in verdict(lab, hardware_class="cpu_lab", instances=[{"gpu_memory_utilization": 0.01}])["checks"]}
    assert "clean-boot baseline" not in names and "memory for the plan" in names


def test_the_wedge_and_our_own_engines_holding_the_device():
    wedged = gb10(dmi={"sys_vendor": "ASUSTeK COMPUTER INC.", "product_name": "Ascent GX10"},
                  gpu_text=(FIXTURES / "gb10-nvidia-smi-wedged.csv").read_text())
    assert "the power-delivery wedge (seed 002)" in status(verdict(wedged, hardware_class="asus_gx10"), "power delivery")["detail"]
    ours = gb10(holders=[{"pid": 9, "command": "VLLM::EngineCor", "paths": ["/dev/nvidia0"], "container": "vllm-chat"}])
    assert status(verdict(ours), "device holders")["status"] == "pass"


def test_images_arch_and_cuda_against_the_driver():
    facts = gb10()
    cuda131 = {"Architecture": "arm64", "Config": {"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=13.1 brand=tesla,driver>=590"]}}
    cuda130 = {"Architecture": "arm64", "Config": {"Env": ["CUDA_VERSION=13.0.1"]}}
    amd64 = {"Architecture": "amd64", "Config": {}}
    checks = image_checks([{"ref": "new", "inspect": cuda131}, {"ref": "ok", "inspect": cuda130},
                           {"ref": "intel", "inspect": amd64}, {"ref": "later", "inspect": None}], facts)
    assert [c["status"] for c in checks] == ["fail", "pass", "fail", "pass"]
    assert "needs CUDA 13.1 (driver branch 590 or later); the host runs 580.173.02" in checks[0]["detail"]
    assert "Pin an image built for CUDA 13.0" in checks[0]["detail"]
    assert "built for amd64, the host is aarch64" in checks[2]["detail"] and "after the pull" in checks[3]["detail"]
    unknown = image_checks([{"ref": "future", "inspect": {"Architecture": "arm64", "Config": {"Labels": {"com.nvidia.cuda.version": "13.4.0"}}}}], facts)
    assert unknown[0]["status"] == "fail", "a CUDA newer than the table needs a driver newer than the newest known"


def test_the_filter_reads_looped_inspect_results():
    from ansible_collections.sparkfleet.vllm.plugins.filter.hardware import spark_preflight

    # docker image inspect --format '{{json .}}' prints the object itself; plain inspect prints a list.
    inspect = {"Architecture": "arm64", "Config": {"Env": ["CUDA_VERSION=13.1.0"]}}
    results = [{"item": "img@sha256:1", "rc": 0, "stdout": json.dumps(inspect)}, {"item": "img@sha256:2", "rc": 1, "stdout": "[]"},
               {"item": "img@sha256:3", "rc": 0, "stdout": json.dumps([inspect])}, {"skipped": True}]
    verdict_ = spark_preflight(gb10(), "dgx_spark", {}, [{"gpu_memory_utilization": 0.5}], results)
    assert [c["status"] for c in verdict_["checks"] if c["name"].startswith("image")] == ["fail", "pass", "fail"]
    assert spark_preflight(gb10(), "gb10")["reasons"][0].startswith("sparkfleet_hardware_class: 'gb10'")


def test_a_pulled_image_is_judged_before_any_launch():
    from ansible_collections.sparkfleet.vllm.plugins.filter.hardware import vllm_image_problems

    newer = {"Architecture": "arm64", "Config": {"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=13.1"]}}
    assert "needs CUDA 13.1 (driver branch 590 or later)" in vllm_image_problems(newer, "vllm@sha256:1", gb10())[0]
    assert vllm_image_problems(newer, "vllm@sha256:1", None) == [], "no facts, nothing to judge"
    assert vllm_image_problems({"Architecture": "arm64", "Config": {}}, "vllm@sha256:1", gb10()) == []


def test_an_image_below_the_classs_cuda_floor_fails_and_one_declaring_none_is_reported():
    from ansible_collections.sparkfleet.vllm.plugins.filter.hardware import vllm_image_problems

    cu128 = {"Architecture": "arm64", "Config": {"Env": ["CUDA_VERSION=12.8.1"]}}
    silent = {"Architecture": "arm64", "Config": {"Env": ["PATH=/usr/bin"]}}
    cu130 = {"Architecture": "arm64", "Config": {"Env": ["CUDA_VERSION=13.0.1"]}}
    checks = image_checks([{"ref": "old", "inspect": cu128}, {"ref": "silent", "inspect": silent}, {"ref": "new", "inspect": cu130}],
                          gb10(), "12.9")
    assert [(c["name"], c["status"]) for c in checks] == [
        ("image old CUDA", "fail"), ("image silent CUDA", "warn"), ("image silent", "pass"), ("image new", "pass")]
    assert "built for CUDA 12.8; this class needs CUDA 12.9 or newer (seed 004" in checks[0]["detail"]
    assert "declares no CUDA release" in checks[1]["detail"]
    assert vllm_image_problems(cu128, "vllm@sha256:1", gb10(), "dgx_spark")[0].startswith("image vllm@sha256:1 CUDA: built for CUDA 12.8")
    assert vllm_image_problems(cu128, "vllm@sha256:1", gb10(), "rtx_pro_6000") == [], "no floor in the notes for sm_120"
    assert vllm_image_problems(silent, "vllm@sha256:1", gb10(), "asus_gx10") == []
    assert "declares no CUDA release" in vllm_image_problems(silent, "vllm@sha256:1", gb10(), "asus_gx10", None, "warn")[0]
    assert vllm_image_problems(cu128, "vllm@sha256:1", gb10(), "dgx_spark", {"min_image_cuda": "12.8"}) == []


@pytest.mark.parametrize(("floor", "refused"), [("13", True), ("12.9.1", True), (None, False), ("13.0", False)])
def test_the_cuda_floor_override_is_a_cuda_release(floor, refused):
    from ansible_collections.sparkfleet.vllm.plugins.module_utils._hardware_classes import resolve_class

    errors = resolve_class("dgx_spark", {"min_image_cuda": floor})["errors"]
    assert bool(errors) == refused and (not refused or errors[0].startswith("sparkfleet_hardware_overrides.min_image_cuda:"))


@pytest.mark.parametrize(("min_free_disk_gib", "device_nodes", "expected"), [
    pytest.param(-5, None, "preflight_min_free_disk_gib: -5 is out of range; give a number above 0 and at most 65536 GiB (0 or less "
                 "would pass a full disk); or null for the hardware class's figure", id="disk-check-off"),
    pytest.param(0, None, "preflight_min_free_disk_gib: 0 is out of range", id="zero-disk"),
    pytest.param("5%", None, "preflight_min_free_disk_gib: '5%' is not a number", id="not-a-number"),
    pytest.param(10**9, None, "preflight_min_free_disk_gib: 1000000000 is out of range", id="absurd"),
    pytest.param(None, [], "preflight_device_nodes: [] must list the GPU's device nodes", id="no-device-nodes"),
    pytest.param(None, ["nvidia*"], "preflight_device_nodes: ['nvidia*'] must list the GPU's device nodes, absolute globs",
                 id="not-under-dev"),
])
def test_preflight_settings_out_of_range_are_refused_before_any_check(min_free_disk_gib, device_nodes, expected):
    result = verdict(gb10(), min_free_disk_gib=min_free_disk_gib, device_nodes=device_nodes)
    assert not result["ok"] and result["checks"] == [] and len(result["reasons"]) == 1
    assert result["reasons"][0].startswith(expected)


def test_the_filter_passes_the_role_settings_through():
    from ansible_collections.sparkfleet.vllm.plugins.filter.hardware import spark_preflight

    # Before, a text value reached float() and "5%" raised; now it is a reason that names the variable.
    assert spark_preflight(gb10(), "dgx_spark", {}, [], [], 0, "5%")["reasons"][0].startswith("preflight_min_free_disk_gib: '5%'")
    text = spark_preflight(gb10(), "dgx_spark", {}, [], [], 0, "900", [], ["/dev/nvidia*"])
    assert "need 900.00 GiB" in next(c["detail"] for c in text["checks"] if c["name"] == "free disk")
    assert spark_preflight(gb10(), "dgx_spark", {}, [], [], 0, None, [], [])["reasons"][0].startswith("preflight_device_nodes: []")


@pytest.mark.parametrize(("printed", "problem"), [
    ("3.12\n", ""), ("3.10", ""), ("4.0\r\n", ""),
    ("3.9\n", "the host's Python is 3.9; the collection's modules need 3.10 or later (DGX OS ships 3.12): install a newer python3, "
              "or set ansible_python_interpreter to one"),
    ("/bin/sh: 1: python3: not found\n", "the host's Python version could not be read ('/bin/sh: 1: python3: not found\\n')"),
    (None, "the host's Python version could not be read (None)"),
])
def test_a_host_python_older_than_the_modules_need_is_named_with_the_fix(printed, problem):
    assert host_python_problem(printed).startswith(problem) and bool(host_python_problem(printed)) == bool(problem)


def with_storage(facts, var_tmp_gib=0.0, reclaimable_gib=None, hf_cache_gib=None, complete=True):
    def usage(path, gib):
        return {"path": path, "exists": gib is not None, "used_bytes": int((gib or 0) * GIB), "complete": complete,
                "free_bytes": 40 * GIB, "total_bytes": 900 * GIB}

    facts["storage"] = {"var_tmp": usage("/var/tmp", var_tmp_gib), "hf_cache": usage("/var/cache/sparkfleet/vllm/huggingface", hf_cache_gib),
                        "docker_reclaimable_bytes": None if reclaimable_gib is None else int(reclaimable_gib * GIB)}
    return facts


def test_what_fills_the_disks_is_reported_and_warned_of_past_its_bound_without_failing_the_host():
    quiet = verdict(with_storage(gb10(), var_tmp_gib=0.5, reclaimable_gib=1.25, hf_cache_gib=3.0))
    assert quiet["ok"] and [check["status"] for check in quiet["checks"] if check["name"] in ("/var/tmp", "docker reclaimable", "hf cache")] == ["pass"] * 3
    assert "PASS /var/tmp: 0.50 GiB in /var/tmp, 40.00 GiB free on its filesystem" in quiet["lines"]
    assert "PASS docker reclaimable: 1.25 GiB of images, containers, volumes and build cache no container uses" in quiet["lines"]
    assert "PASS hf cache: 3.00 GiB in /var/cache/sparkfleet/vllm/huggingface, which every engine of this host mounts" in quiet["lines"]
    # A GX10's /var/tmp grew to 303 GB (epappas/gx10-cluster); a walk that stopped at its bound says "at least".
    full = verdict(with_storage(gb10(), var_tmp_gib=282.2, reclaimable_gib=120.0, complete=False))
    assert full["ok"], full["reasons"]
    assert status(full, "/var/tmp")["status"] == "warn" and "at least 282.20 GiB in /var/tmp" in status(full, "/var/tmp")["detail"]
    assert "docker image prune and docker builder prune free it" in status(full, "docker reclaimable")["detail"]
    assert [check["name"] for check in full["checks"] if check["name"] == "hf cache"] == [], "a cache folder not there is no line"


def test_a_full_weights_disk_names_what_could_be_reclaimed():
    facts = with_storage(gb10(disk={"path": "/srv/models", "free_bytes": 10 * GIB, "total_bytes": 100 * GIB}), var_tmp_gib=60.0, reclaimable_gib=35.5)
    detail = status(verdict(facts), "free disk")["detail"]
    assert detail == ("10.00 GiB free at /srv/models, need 170.00 GiB; docker system df says 35.50 GiB is reclaimable, /var/tmp holds "
                      "60.00 GiB (on that disk only if it is the same filesystem)")
