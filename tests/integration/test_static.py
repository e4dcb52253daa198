"""Static layers: ruff, yamllint, ansible-lint (production profile), ansible-test sanity."""

import shutil
import subprocess

from tool_runner import ROOT, run_logged


def test_ruff():
    run_logged("ruff", ["ruff", "check", "."])


def test_yamllint():
    run_logged("yamllint", ["yamllint", "--strict", "."])


def test_ansible_lint_production_profile():
    run_logged("ansible-lint", ["ansible-lint", "--profile", "production"])


def test_ansible_test_sanity(tmp_path):
    # ansible-test wants a tree ending in ansible_collections/<ns>/<name> holding what git holds.
    target = tmp_path / "ansible_collections" / "sparkfleet" / "vllm"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    run_logged("ansible-test-sanity", ["ansible-test", "sanity", "--venv", "--python", "3.11", "--color", "no"], cwd=target)
