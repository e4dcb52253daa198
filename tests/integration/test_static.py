"""Static layers: ruff, yamllint, ansible-lint (production profile), ansible-test sanity."""

import hashlib
import os
import pathlib
import shutil
import subprocess

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


def test_hardware_class_values_reach_the_roles():
    """group_vars per class set the role variables themselves: a gx10 host gets its own cap."""
    import json

    caps = {}
    for host in ("lab-spark-1", "lab-gx10-1"):
        output = run_logged(f"inventory-{host}", ["ansible-inventory", "-i", "inventories/lab", "--host", host])
        caps[host] = json.loads(output)["vllm_gmu_cap"]
    assert caps == {"lab-spark-1": 0.85, "lab-gx10-1": 0.87}
