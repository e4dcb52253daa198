"""Every ansible-playbook command README.md and docs/ give for the lab, read from the files as an operator copies it
(so a changed command is a changed test): its playbook, inventory and --limit hosts exist, every -e variable is one
the playbook or a role it runs takes, and ansible-playbook accepts it (--syntax-check, --list-hosts: no host is
contacted). Running them on the lab is not part of this file; each one's last run is in the closing notes."""

import pathlib
import re
import shlex

import pytest
import test_benchmarks as checks

ROOT = pathlib.Path(__file__).resolve().parents[2]
FENCE = re.compile(r"```(?:sh|bash)?\n(.*?)```", re.DOTALL)
DOCUMENTED = {
    "README.md": ["ansible-playbook -i inventories/lab site.yml --check --diff",
                  "ansible-playbook -i inventories/lab playbooks/bench.yml --limit lab-spark-1 -e bench_instance=tiny",
                  "ansible-playbook -i inventories/lab playbooks/soak.yml --limit lab-spark-1 -e soak_instance=tiny"],
    "docs/reboot_test.md": ["ansible-playbook -i inventories/lab playbooks/reboot_test.yml -l lab-spark-1,lab-gx10-1 -e reboot_test_serial=2"],
    "docs/rollout.md": ["ansible-playbook -i inventories/lab playbooks/rollout.yml -e rollout_label=seqs-8 "
                        "-e '{\"vllm_instance_overrides\": {\"tiny\": {\"max_num_seqs\": 8}}}'"],
}


def lab_commands(text):
    """The lab's ansible-playbook commands of a Markdown text's code blocks, each joined across its continuations."""
    found = []
    for block in FENCE.findall(text):
        for command in re.sub(r"\\\n\s*", "", block).splitlines():
            if command.startswith("ansible-playbook -i inventories/lab "):
                found.append(command.split("  #")[0].strip())
    return found


def test_the_documented_lab_commands_are_these():
    """A command added to or changed in the docs is added here, where it is checked (and to the lab runs it needs)."""
    found = {path.relative_to(ROOT).as_posix(): lab_commands(path.read_text())
             for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
    assert {name: commands for name, commands in found.items() if commands} == DOCUMENTED


@pytest.mark.parametrize("command", [command for commands in DOCUMENTED.values() for command in commands])
def test_a_documented_lab_command_is_one_ansible_playbook_accepts(command):
    argv = shlex.split(command)
    lab_hosts = set(checks.lab_inventory_hosts()["lab"]["hosts"])
    checks.check_playbook_command(argv, lab_hosts, runs_roles=False)
    checks.ansible_playbook(argv, "--syntax-check")
    listed = checks.listed_hosts(argv)
    limit = checks.option(argv, "-l", "--limit")
    assert listed and all(set(hosts) <= lab_hosts | {"localhost"} for hosts in listed.values()), listed
    assert set(limit.split(",") if limit else lab_hosts) <= {host for hosts in listed.values() for host in hosts}
