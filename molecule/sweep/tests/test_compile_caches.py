"""The compile caches on the sweep's serving host, before the sweep (the files' order): backed up after a good start
and restored by the next converge of a reinstalled host, so its first boot is warm (seed 002), to a folder on the host
and to the controller. A reinstall here is the image's cache folder wiped under a stopped instance. Leaves the instance
serving the scenario's settings, as converged."""

import json
import re
import tarfile

import pytest
from site_runner import ROOT, docker_host, site

SERVE = "sparkfleet-molecule-sweep"
UNIT = "sparkfleet-vllm-second.service"
SCENARIO = f"@{ROOT / 'molecule' / 'sweep' / 'vars' / 'instances.yml'}"
BACKUP = "/srv/sparkfleet-cache-backup"


@pytest.fixture(scope="module")
def serve():
    return docker_host(SERVE)


def cold_start(host):
    return json.loads(host.file("/etc/sparkfleet/vllm/second.json").content_string)["cold_start"]


def converge(*extra):
    result = site("--tags", "vllm", "-e", SCENARIO, *[arg for more in extra for arg in ("-e", json.dumps(more))], limit=SERVE)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


def test_a_reinstalled_host_gets_its_compile_caches_back_from_its_backup_folder_and_boots_warm(serve):
    jit, stamp = cold_start(serve)["jit_dir"], cold_start(serve)["stamp"].rsplit("/", 1)[1]
    folder = f"{BACKUP}/{SERVE}/{jit.rsplit('/', 1)[1]}"
    serve.check_output(f"mkdir {BACKUP}")
    try:
        converge({"vllm_cache_backup_dir": BACKUP})
        assert serve.check_output(f"ls {folder}/warm").split() == [stamp], "the stamp of the start that served is in the backup"
        serve.check_output(f"systemctl stop {UNIT}")
        serve.check_output(f"rm -rf {jit}")
        reinstalled = converge({"vllm_cache_backup_dir": BACKUP})
    finally:
        serve.run(f"rm -rf {BACKUP}")
    print(f"\ncompile caches: restored from {folder} before the relaunch")
    assert serve.check_output(f"ls {jit}/warm").split() == [stamp]
    assert "second is relaunched behind the health gate: its unit is inactive" in reinstalled
    assert re.search(r"second serves \S+ at \S+ after [0-9.]+ s \(warm start\)", reinstalled), reinstalled[-3000:]


def test_the_controller_keeps_an_archive_and_brings_back_only_what_the_host_lacks(serve, tmp_path):
    jit, stamp = cold_start(serve)["jit_dir"], cold_start(serve)["stamp"].rsplit("/", 1)[1]
    to_controller = {"vllm_cache_backup_dir": str(tmp_path), "vllm_cache_backup_location": "controller"}
    converge(to_controller)
    archive = tmp_path / SERVE / f"{jit.rsplit('/', 1)[1]}.tar"
    with tarfile.open(archive) as tar:
        assert [name for name in tar.getnames() if name.startswith("warm/")] == [f"warm/{stamp}"]
    assert (tmp_path / SERVE / f"{archive.name}.stamps").read_text().split() == [stamp]
    assert not serve.file(f"{jit}.backup.tar").exists, "the host's archive is removed once fetched"
    serve.check_output(f"rm -rf {jit}/warm {jit}.backed-up")
    restored = converge(to_controller)
    assert serve.check_output(f"ls {jit}/warm").split() == [stamp] and not serve.file(f"{jit}.restore.tar").exists
    assert "is relaunched" not in restored, "an instance running its plan is left alone"
    assert "Fetch the archives to the controller" in restored and "changed: [" not in restored.split(
        "Fetch the archives to the controller")[1].split("TASK")[0], "what came from the controller is not sent back"
