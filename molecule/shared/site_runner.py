"""Running site.yml from a scenario's verifier, and watching that a refused run changed nothing."""

import hashlib
import os
import pathlib
import subprocess

import testinfra

ROOT = pathlib.Path(__file__).resolve().parents[2]
INVENTORY = pathlib.Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent


def docker_host(name):
    return testinfra.get_host(f"docker://{name}")


def site(*args, limit=None):
    command = ["ansible-playbook", "-i", str(INVENTORY), str(ROOT / "site.yml"), *args]
    if limit:
        command += ["--limit", limit]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)


def assert_refused(result, *fragments):
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in the error:\n{output[-3000:]}"


def state_digest(host, paths, commands):
    """One digest over files and command outputs on a host."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.encode() + b"\0" + host.file(path).content)
    for command in commands:
        digest.update(host.run(command).stdout.encode())
    return digest.hexdigest()
