"""compile_caches run as Ansible runs a module: a backup and a check-mode restore through its JSON, and caches
that are no plan's refused with the variable to fix, nothing written."""

import os

from test_modules_as_ansible_runs_them import refused, run

STAMP = "a" * 16


def test_a_backup_then_a_check_mode_restore_say_what_they_do(tmp_path):
    jit = tmp_path / "cache" / "jit" / ("c" * 16)
    (jit / "warm").mkdir(parents=True)
    (jit / "warm" / STAMP).write_text("1\n")
    (tmp_path / "disk").mkdir()
    caches = [{"jit_dir": str(jit), "stamps": [STAMP], "backup": str(tmp_path / "disk" / "spark-1" / ("c" * 16))}]
    backed = run("compile_caches", {"action": "back_up", "caches": caches})
    assert backed["changed"] and backed["done"][0]["to"] == caches[0]["backup"]
    (jit / "warm" / STAMP).unlink()
    checked = run("compile_caches", {"action": "restore", "caches": caches, "_ansible_check_mode": True})
    assert checked["changed"] and checked["done"][0]["stamps"] == [STAMP] and not (jit / "warm" / STAMP).exists()


def test_caches_that_are_no_plans_are_refused_before_anything_is_touched(tmp_path):
    (tmp_path / "ssh").mkdir()
    caches = [{"jit_dir": str(tmp_path / "cache" / "jit" / ("c" * 16)), "stamps": [STAMP], "backup": str(tmp_path / "ssh")}]
    result = refused("compile_caches", {"action": "back_up", "caches": caches}, "is not an image's backup")
    assert result["done"] == [] and os.listdir(tmp_path) == ["ssh"]
