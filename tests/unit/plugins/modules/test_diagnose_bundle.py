"""The diagnose_bundle module as Ansible runs it (arguments on stdin, a fresh interpreter), and playbooks/diagnose.yml
in check mode against this machine over a local connection: a host whose inventory puts its configuration folders
outside the defaults gets their plans read (the module then learns their env files' keys). Check mode writes nothing
and runs no command on the host."""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[4]
COLLECTIONS = ROOT / ".cache" / "collections"
MODULE = COLLECTIONS / "ansible_collections" / "sparkfleet" / "vllm" / "plugins" / "modules" / "diagnose_bundle.py"
FOLDER_VARIABLES = {"vllm": "vllm_config_dir", "cluster": "cluster_config_dir", "gateway": "gateway_config_dir"}


def run(args):
    payload = {"ANSIBLE_MODULE_ARGS": args}
    done = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(payload), capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(COLLECTIONS)}, timeout=60)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return json.loads(done.stdout)


def deployed(folder, name):
    """A configuration folder holding one instance's plan and its 0600 env file."""
    folder.mkdir(parents=True)
    plan = {"schema_version": 1, "name": name, "unit": f"sparkfleet-vllm-{name}.service", "container": f"vllm-{name}",
            "url": "http://127.0.0.1:8009", "cluster": None}
    (folder / f"{name}.json").write_text(json.dumps(plan))
    (folder / f"{name}.env").write_text(f"VLLM_API_KEY={'k' * 32}\n")
    (folder / f"{name}.env").chmod(0o600)
    return str(folder)


@pytest.mark.parametrize("config_dirs, problem", [
    (["srv/sparkfleet/vllm"], "config_dirs[0]: 'srv/sparkfleet/vllm' is not an absolute folder"),
    (["/etc/sparkfleet/vllm", ""], "config_dirs[1]: '' is not an absolute folder"),
    ([], "config_dirs is empty, so no plan and no key would be read"),
])
def test_config_dirs_that_are_no_absolute_folders_are_refused_naming_the_variables(tmp_path, config_dirs, problem):
    result = run({"config_dirs": config_dirs, "dest": str(tmp_path / "out"), "_ansible_check_mode": True})
    assert result.get("failed") is True, result
    assert result["msg"].startswith(problem), result["msg"]
    assert "set vllm_config_dir, cluster_config_dir, gateway_config_dir and watchdog_plan_dirs to absolute folders" in result["msg"]
    assert not (tmp_path / "out").exists()


def test_check_mode_reports_the_plans_of_a_folder_outside_the_defaults(tmp_path):
    folder = deployed(tmp_path / "srv" / "models-a", "alpha")
    result = run({"config_dirs": [folder], "dest": str(tmp_path / "out"), "_ansible_check_mode": True})
    assert result["changed"] is True and result["size"] == 0, result
    # The default folders are read too: on a controller that serves, they may add their own plans.
    assert "plans/models-a/alpha.json" in result["would_collect"]["plan_files"]
    assert "vllm-alpha" in result["would_collect"]["containers"]
    assert not (tmp_path / "out").exists()


def test_the_playbook_reads_the_folders_the_inventory_configures(tmp_path):
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    for role, variable in FOLDER_VARIABLES.items():
        host[variable] = deployed(tmp_path / "srv" / f"{role}-conf", role)
    host["watchdog_plan_dirs"] = [deployed(tmp_path / "srv" / "watched", "extra")]
    (tmp_path / "inventory.json").write_text(json.dumps({"all": {"hosts": {"spark-9": host}}}))
    done = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "inventory.json"), "--check", str(ROOT / "playbooks" / "diagnose.yml"),
                           "-e", json.dumps({"diagnose_dir": str(tmp_path / "controller")})],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    collected = next(task["hosts"]["spark-9"] for task in tasks if task["task"]["name"] == "Collect the bundle on the host")
    assert {"plans/cluster-conf/cluster.json", "plans/gateway-conf/gateway.json", "plans/vllm-conf/vllm.json",
            "plans/watched/extra.json"} <= set(collected["would_collect"]["plan_files"])


def test_the_playbooks_default_folders_are_the_roles():
    text = (ROOT / "playbooks" / "diagnose.yml").read_text()
    defaults = dict(re.findall(r"(\w+_config_dir) \| default\('([^']+)'\)", text))
    assert set(defaults) == set(FOLDER_VARIABLES.values())
    for role, variable in FOLDER_VARIABLES.items():
        role_defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
        assert defaults[variable] == role_defaults[variable], variable


@pytest.mark.parametrize("keep", [0, -1, 1001])
def test_a_keep_out_of_bounds_is_refused_before_anything_is_written(tmp_path, keep):
    result = run({"config_dirs": [deployed(tmp_path / "etc", "alpha")], "dest": str(tmp_path / "out"), "keep": keep})
    assert result.get("failed") is True and result["msg"] == f"keep ({keep}) must be from 1 to 1000 bundles (diagnose_keep)", result
    assert not (tmp_path / "out").exists()


def test_a_real_bundle_prunes_only_its_own_oldest_bundles(tmp_path):
    """Run for real on this machine (its commands answer or are missing here): the folder keeps this host's newest
    bundles, another host's bundle and whatever else an operator put there; check mode names what a run would remove."""
    out = tmp_path / "out"
    out.mkdir()
    prefix = f"sparkfleet-diagnose-{socket.gethostname()}-"
    for index in range(3):
        old = out / f"{prefix}2026010{index}T000000Z.tar.gz"
        old.write_bytes(b"old")
        os.utime(old, (1_700_000_000 + index, 1_700_000_000 + index))
    (out / "notes.tar.gz").write_bytes(b"an operator's")
    (out / "sparkfleet-diagnose-another-host-20260101T000000Z.tar.gz").write_bytes(b"a shared folder")
    folders = [deployed(tmp_path / "etc", "alpha")]
    checked = run({"config_dirs": folders, "dest": str(out), "keep": 2, "_ansible_check_mode": True})
    oldest = [str(out / f"{prefix}2026010{index}T000000Z.tar.gz") for index in range(2)]
    assert sorted(checked["removed"]) == oldest and len(list(out.iterdir())) == 5, checked
    result = run({"config_dirs": folders, "dest": str(out), "keep": 2, "time_limit": 10, "total_limit": 60})
    assert result["changed"] is True and not result.get("failed"), result
    assert sorted(result["removed"]) == oldest
    assert sorted(path.name for path in out.iterdir()) == sorted(["notes.tar.gz", f"{prefix}20260102T000000Z.tar.gz", pathlib.Path(result["path"]).name,
                                                                  "sparkfleet-diagnose-another-host-20260101T000000Z.tar.gz"])
