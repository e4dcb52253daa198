"""Running site.yml from a scenario's verifier, and watching that a refused run changed nothing."""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import tarfile

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


def playbook(name, *args, limit=None):
    """Run one of the collection's playbooks (playbooks/NAME) against the scenario's inventory."""
    command = ["ansible-playbook", "-i", str(INVENTORY), str(ROOT / "playbooks" / name), *args]
    if limit:
        command += ["--limit", limit]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)


def module(host, name, args, *options):
    """Run one of the collection's modules on a host; its result as a dict (the key 'failed' when it failed)."""
    environment = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    command = ["ansible", "-i", str(INVENTORY), host, "-m", f"sparkfleet.vllm.{name}", "-a", json.dumps(args), *options]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment, check=False)
    try:
        return json.loads(completed.stdout)["plays"][0]["tasks"][0]["hosts"][host]
    except (ValueError, KeyError, IndexError) as error:
        raise AssertionError(f"no result from {name}: {completed.stdout[-2000:]} {completed.stderr[-2000:]}") from error


def deployed_secrets(host):
    """Every key and token the host holds: the values of its env files' secret settings (the instances' API keys, a
    gateway's master and backend keys, an operator's tokens), last good copies too, labelled by file and name."""
    found = {}
    for path in host.check_output("find /etc/sparkfleet -name '*.env' -type f").split():
        for line in host.file(path).content_string.splitlines():
            name, separator, value = line.partition("=")
            if separator and not name.startswith("#") and re.search(r"KEY|TOKEN|SECRET|PASSWORD", name) and len(value) >= 8:
                found[value] = f"{path}:{name}"
    return {label: value for value, label in found.items()}


def bundle_leaks(bundle, secrets):
    """The members of a diagnostics bundle (a tarball on the controller) and (member, label) of each secret found in one."""
    with tarfile.open(bundle) as archive:
        members = {member.name: archive.extractfile(member).read() for member in archive.getmembers() if member.isfile()}
    return members, [(name, label) for name, data in members.items() for label, value in secrets.items() if value.encode() in data]
