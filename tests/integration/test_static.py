"""Static layers: ruff, yamllint, ansible-lint (production profile), ansible-test sanity."""

import hashlib
import json
import os
import pathlib
import secrets
import shutil
import subprocess

import pytest
import yaml
from tool_runner import ROOT, run_logged

# A stable copy per checkout, so ansible-test's venvs under tests/output are reused between runs.
SANITY_TREE = (
    pathlib.Path(os.environ.get("SPARKFLEET_CACHE", pathlib.Path.home() / ".cache" / "sparkfleet"))
    / "sanity"
    / hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
)


def test_ruff():
    run_logged("ruff", ["ruff", "check", "."])


def test_yamllint():
    run_logged("yamllint", ["yamllint", "--strict", "."])


def test_ansible_lint_production_profile():
    run_logged("ansible-lint", ["ansible-lint", "--profile", "production"])


def test_the_changelog_lints_its_page_is_generated_and_galaxy_yml_is_its_latest_release(tmp_path):
    run_logged("antsibull-changelog-lint", ["antsibull-changelog", "lint"])
    releases = yaml.safe_load((ROOT / "changelogs" / "changelog.yaml").read_text())["releases"]
    latest = max(releases, key=lambda version: tuple(int(part) for part in version.split(".")))
    assert yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"] == latest, "galaxy.yml's version is the changelog's latest release"
    # Generated from the release data alone, the page must be the one committed: a hand edit or a forgotten generate fails.
    for name in ("galaxy.yml", "changelogs/config.yaml", "changelogs/changelog.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "changelogs" / "fragments").mkdir()
    run_logged("antsibull-changelog-generate", ["antsibull-changelog", "generate"], cwd=tmp_path)
    assert (tmp_path / "CHANGELOG.rst").read_text() == (ROOT / "CHANGELOG.rst").read_text(), "CHANGELOG.rst is stale: run antsibull-changelog generate"


def test_an_execution_environment_gets_the_collections_requirements_and_its_build_context_renders(tmp_path):
    """ansible-builder reads the collection's meta/execution-environment.yml as it does in a build (introspect), and
    renders the build context of the AWX definition in docs/awx/ (create); nothing is built or pulled here."""
    introspected = yaml.safe_load(run_logged("ansible-builder-introspect", ["ansible-builder", "introspect", str(ROOT / ".cache" / "collections")]))
    wanted = [line.split("#")[0].strip() for line in (ROOT / "meta" / "ee-requirements.txt").read_text().splitlines() if line.split("#")[0].strip()]
    assert [line.split("#")[0].strip() for line in introspected["python"]] == wanted
    assert "openssh-client [platform:dpkg]  # from collection sparkfleet.vllm" in introspected["system"]
    definition = ROOT / "docs" / "awx" / "execution-environment.yml"
    run_logged("ansible-builder-create", ["ansible-builder", "create", "-f", str(definition), "-c", str(tmp_path), "--output-filename", "Containerfile"])
    containerfile = (tmp_path / "Containerfile").read_text()
    base = yaml.safe_load(definition.read_text())["images"]["base_image"]["name"]
    # The definition carries a visible placeholder in the digest's place (no base image digest can be checked from here):
    # a build fails on it until it is replaced, and a tag never slips in.
    assert "@sha256:" in base and ":" not in base.split("@")[0].rsplit("/", 1)[-1], "the base image is pinned by digest, not a tag"
    assert f'ARG EE_BASE_IMAGE="{base}"' in containerfile
    assert yaml.safe_load((tmp_path / "_build" / "requirements.yml").read_text()) == {
        "collections": [{"name": "sparkfleet.vllm", "version": yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]}]}
    assert "introspect.py introspect" in containerfile, "the build gathers the collections' requirements"


def sync_tracked_files(target):
    """Make target hold exactly the files git holds (tracked or new), keeping tests/output."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    wanted = {name for name in listed if name and (ROOT / name).is_file()}
    if target.exists():
        for path in target.rglob("*"):
            relative = path.relative_to(target).as_posix()
            if path.is_file() and not relative.startswith("tests/output/") and relative not in wanted:
                path.unlink()
    for name in wanted:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target / name)


def test_ansible_test_sanity():
    # ansible-test wants a tree ending in ansible_collections/<ns>/<name>.
    target = SANITY_TREE / "ansible_collections" / "sparkfleet" / "vllm"
    sync_tracked_files(target)
    run_logged("ansible-test-sanity", ["ansible-test", "sanity", "--venv", "--python", "3.11", "--color", "no"], cwd=target)


# Every example inventory but the lab's, which reads the lab's environment and its hosts' facts (the
# molecule scenarios and scripts/lab run it on real lab hosts).
EXAMPLE_INVENTORIES = sorted(path.name for path in (ROOT / "inventories").iterdir() if path.is_dir() and path.name != "lab")


def check_inventory(inventory, *extra):
    """playbooks/check_inventory.yml in check mode: it runs on the controller only, so example
    inventories whose hosts do not exist are checked for real."""
    key = secrets.token_hex(20)
    command = ["ansible-playbook", "--check", "-i", f"inventories/{inventory}", "playbooks/check_inventory.yml",
               "-e", f"vault_vllm_api_key={key}", "-e", f"vault_gateway_master_key=sk-{key}", *extra]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "NO_COLOR": "1", "ANSIBLE_NOCOLOR": "1"}), key


@pytest.mark.parametrize("inventory", EXAMPLE_INVENTORIES)
def test_example_inventories_pass_validation(inventory):
    result, key = check_inventory(inventory)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "failed=0" in result.stdout and "unreachable=0" in result.stdout and key not in result.stdout


def test_hardware_class_values_reach_the_plan():
    """The class is data selected by a group variable: the GX10's ceiling holds a GX10 host, and a
    cap above it or an unknown class is refused naming the variable."""
    result, _key = check_inventory("two_nodes", "-e", '{"vllm_gmu_cap": 0.86}')
    assert result.returncode != 0
    assert "vllm_gmu_cap: 0.86 is above the dgx_spark class's ceiling of 0.85" in result.stdout
    assert "vllm_gmu_cap: 0.86 is above the asus_gx10 class's ceiling of 0.85" in result.stdout
    assert "fatal: [spark-1]" in result.stdout and "fatal: [gx10-1]" in result.stdout, "each class's own ceiling refuses it"
    result, _key = check_inventory("local", "-e", "sparkfleet_hardware_class=gb10")
    assert result.returncode != 0 and "sparkfleet_hardware_class: 'gb10' is not a hardware class" in result.stdout


def test_the_gateway_is_planned_from_the_inventory_and_refuses_what_it_cannot_route():
    """The pair's gateway reads both nodes' instance plans; a group naming a model nobody serves and a
    node bound where the gateway cannot reach it are refused, naming the variable."""
    bad = {"gateway_model_groups": {"vision": ["qwen-vl"]}, "gateway_port": 0}
    result, key = check_inventory("two_nodes", "-e", json.dumps(bad))
    assert result.returncode != 0 and "fatal: [spark-1]" in result.stdout and key not in result.stdout
    assert "gateway_port: 0 must be a port number between 1 and 65535" in result.stdout
    result, _key = check_inventory("two_nodes", "-e", json.dumps({"gateway_model_groups": {"vision": ["qwen-vl"]}}))
    assert "gateway_model_groups.vision: no backend serves qwen-vl (served: gemma-4-26b-a4b)" in result.stdout
    loopback = {"vllm_instance_defaults": {"bind_addresses": ["127.0.0.1"], "gpu_memory_utilization": 0.8}}
    result, _key = check_inventory("two_nodes", "-e", json.dumps(loopback))
    assert "instance chat on gx10-1 binds only 127.0.0.1, which the gateway on spark-1 cannot reach" in result.stdout


@pytest.mark.parametrize(
    ("inventory", "extra_vars", "fragments"),
    [
        pytest.param("tp2", {"gateway_port": 8000}, ["spark-1: port 8000 is claimed by cluster_instance.port (cluster gemma-31b-tp2's API on its head) "
                                                     "and by gateway_port", "The fleet check refused the inventory"], id="gateway-on-the-cluster-api-port"),
        pytest.param("two_nodes", {"vllm_instances": []}, ["gateway_model_groups.fast: no backend serves gemma-4-26b-a4b (served: nothing)"],
                     id="backends-instances-dropped"),
        pytest.param("single_spark", {"earlyoom_avoid_extra_names": ["vllm*"]}, ["earlyoom_avoid_extra_names", "entry 'vllm*' matches vllm"],
                     id="avoid-list-catches-vllm"),
        pytest.param("single_spark", {"earlyoom_avoid_regex": "^(sshd|systemd.*"}, ["earlyoom_avoid_regex", "does not compile"], id="invalid-regex"),
        pytest.param("single_spark", {"earlyoom_memory_percent": 90}, ["earlyoom_memory_percent: 90 is out of range"], id="threshold-out-of-range"),
        pytest.param("single_spark", {"vllm_models": [{"repo": "no-owner", "revision": "main"}]},
                     ["vllm_models[0] (no-owner).repo: 'no-owner' must be a Hugging Face repo id",
                      "vllm_models[0] (no-owner).revision: 'main' is not a commit hash", "allow_branch"], id="repo-id-and-branch"),
        # The settings of the roles whose other checks read the host, and the vllm role's that need the inventory only.
        pytest.param("single_spark", {"driver_guard_allowed_branch": "58"}, ["driver_guard_allowed_branch: 58 is not a driver branch"],
                     id="driver-branch"),
        pytest.param("single_spark", {"exporter_dropins_restart_sec": 1}, ["exporter_dropins_restart_sec: 1"], id="exporter-restart"),
        pytest.param("single_spark", {"vllm_models_source": "spark-1"}, ["vllm_models_source spark-1: give vllm_models_source_address"],
                     id="models-source-address"),
        pytest.param("single_spark", {"exporter_dropins_file_name": "../../docker.service.d/x.conf"},
                     ["exporter_dropins_file_name: '../../docker.service.d/x.conf' must be a file name ending in .conf"], id="exporter-dropin-name"),
        pytest.param("single_spark", {"wait_online_docker_dropin_path": "/etc/systemd/system/docker.service"},
                     ["wait_online_docker_dropin_path: /etc/systemd/system/docker.service is not a file its reader reads"], id="docker-dropin-path"),
        pytest.param("two_nodes", {"gateway_config_dir": "/etc/sparkfleet/vllm"},
                     ["gateway_config_dir (/etc/sparkfleet/vllm) and vllm_config_dir (/etc/sparkfleet/vllm) share a folder"],
                     id="shared-config-folder"),
        pytest.param("single_spark", {"preflight_min_free_disk_gib": -5, "preflight_device_nodes": []},
                     ["preflight_min_free_disk_gib: -5", "preflight_device_nodes: [] must list the GPU's device nodes"], id="preflight-checks-off"),
        pytest.param("single_spark", {"vllm_config_dir": "/etc"}, ["vllm_config_dir: '/etc' is too close to /"], id="config-folder-at-etc"),
        pytest.param("tp2", {"vllm_models_rsync_port": 70000}, ["a vllm_models_rsync_port from 1 to 65535 (the daemon's port; it is 70000)"],
                     id="models-rsync-port"),
        pytest.param("single_spark", {"watchdog_probe_timeout": 1, "vllm_config_dir": "/srv/sparkfleet/vllm"},
                     ["watchdog_probe_timeout is 1: give a whole number from 10 to 300",
                      "watchdog_plan_dirs ['/etc/sparkfleet/vllm', '/etc/sparkfleet/cluster'] leaves out /srv/sparkfleet/vllm"],
                     id="watchdog-probe-and-plan-folders"),
        pytest.param("tp2", {"cluster_nccl_test_command": ["all_gather_perf", "-e", "lots"]},
                     ["cluster_nccl_test_command: all_gather_perf: -e lots: give the buffer as bytes or with K/M/G"], id="nccl-buffer-size"),
    ],
)
def test_settings_refused_before_any_host_is_contacted(inventory, extra_vars, fragments):
    """Refusals that need no host are proven here, on the controller; each lab scenario keeps one
    refused run that changes nothing on its real hosts."""
    result, key = check_inventory(inventory, "-e", json.dumps(extra_vars))
    assert result.returncode != 0 and "no host was contacted" in result.stdout and key not in result.stdout
    for fragment in fragments:
        assert fragment in result.stdout, result.stdout[-3000:]


def test_a_master_address_in_the_fast_network_passes_without_the_nodes():
    """Found when tried: check_inventory.yml refused a correct cluster_master_addr."""
    result, _key = check_inventory("tp2", "-e", "cluster_master_addr=192.168.100.10")
    assert result.returncode == 0 and "failed=0" in result.stdout, result.stdout[-3000:]


def test_cluster_nodes_that_would_run_different_images_are_refused_before_any_host(tmp_path):
    """The image needs no host: the fleet check compares it (the checkpoints wait for the staging)."""
    other = "vllm/vllm-openai:v0.31.0@sha256:" + "1" * 64
    (tmp_path / "spark-2.yml").write_text(json.dumps({"all": {"hosts": {"spark-2": {"vllm_image": other}}}}))
    result, _key = check_inventory("tp2", "-i", str(tmp_path / "spark-2.yml"))
    assert result.returncode != 0 and "no host was contacted" in result.stdout, result.stdout[-3000:]
    assert "cluster image: the nodes would run different images" in result.stdout, result.stdout[-3000:]
    assert "spark-2: vllm/vllm-openai@sha256:" + "1" * 64 in result.stdout


@pytest.mark.parametrize(("extra_vars", "fragment"), [
    ({"wait_online_stack": "netplan"}, "value of wait_online_stack must be one of"),
    ({"preflight_min_free_disk_gib": "lots"}, "preflight_min_free_disk_gib"),
])
def test_arguments_of_roles_that_read_the_host_are_checked_without_it(extra_vars, fragment):
    """The argument specs of the roles whose other checks read the host (Ansible's own message)."""
    result, _key = check_inventory("single_spark", "-e", json.dumps(extra_vars))
    assert result.returncode != 0 and "Validation of arguments failed" in result.stdout and fragment in result.stdout, result.stdout[-3000:]
