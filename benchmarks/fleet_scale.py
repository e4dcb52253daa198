"""The host-preparation roles at fleet scale, on throwaway lab hosts: a fresh converge of one host
split by role, then the no-op re-apply on 1, 2, 4 and 8 hosts (wall time, tasks per host, the
ratio 8 hosts / 1 host: issue 21's goal is at most 2), and the 8-host re-apply with the
recommended docs/ansible.cfg against it with one setting reverted at a time.

Needs the lab's environment (Docker, the venv, the lab host image):
  bash -c 'source scripts/lib/common.sh; ensure_all; python3 benchmarks/fleet_scale.py'
Starts its own lab hosts (sparkfleet-bench-1..8, no vLLM: the host-preparation roles only) and
removes them, by the names it gave them, when it ends. Prints Markdown tables; each figure is the
median of the runs. Ratios, not seconds, are what holds from one machine to another. With --print-commands
it prints the commands a run starts, in order (each boot wait once; the inventory it writes in a folder of
its own), and starts none.
"""

import os
import pathlib
import re
import shlex
import statistics
import subprocess
import tempfile
import time

import yaml
from lab_vllm import command_line

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCKER = "/usr/bin/docker"
HOSTS = [f"bench-{number}" for number in range(1, 9)]
SCALES = (1, 2, 4, 8)
ROLES = ["driver_guard", "headless", "swap", "earlyoom", "wait_online", "exporter_dropins"]
# The lab's settings for a container standing in for a host (inventories/lab), without its serving.
HOST_SETTINGS = ("sparkfleet_hardware_class", "swap_apply_sysctl", "headless_apply_sysctl", "driver_guard_missing_driver", "earlyoom_version")
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.MULTILINE)
ROLE_TIME = re.compile(r"^(\S+) -+ (\d+\.\d+)s$", re.MULTILINE)
# docs/ansible.cfg with one setting reverted to Ansible's default, by the environment variable that overrides it.
REVERTED = {"pipelining off": {"ANSIBLE_PIPELINING": "False"}, "forks 5 (Ansible's default)": {"ANSIBLE_FORKS": "5"}}
# The fresh converge's time per role.
PROFILE_ENV = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_roles"}
CONFIG = ROOT / "docs" / "ansible.cfg"


def container(name):
    return f"sparkfleet-{name}"


def remove_command():
    """The benchmark's own lab hosts, by the names it gives them (also those a failed earlier run left)."""
    return [DOCKER, "rm", "-f", "-v", *(container(host) for host in HOSTS)]


def remove_hosts():
    subprocess.run(remove_command(), capture_output=True, check=False)


def host_command(image, host):
    """A throwaway lab host, started as lab/hosts.yml starts the lab's (without their named Docker volume)."""
    return [DOCKER, "run", "-d", "--name", container(host), "--hostname", host, "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN",
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined", "--cgroupns", "host",
            "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "-v", "/var/lib/docker", "--tmpfs", "/run", "--tmpfs", "/run/lock",
            "--stop-signal", "SIGRTMIN+3", image, "/lib/systemd/systemd"]


def boot_wait_command(host):
    return [DOCKER, "exec", container(host), "timeout", "120", "systemctl", "is-system-running", "--wait"]


def start_hosts(image):
    """Start the throwaway lab hosts and wait until each has booted."""
    remove_hosts()
    for host in HOSTS:
        subprocess.run(host_command(image, host), check=True, capture_output=True)
    for host in HOSTS:
        name = container(host)
        for _attempt in range(60):
            state = subprocess.run(boot_wait_command(host), capture_output=True, text=True, check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(2)
        else:
            raise SystemExit(f"{name} did not finish booting: {state}")


def write_inventory(folder):
    lab = yaml.safe_load((ROOT / "inventories" / "lab" / "group_vars" / "lab.yml").read_text())
    inventory = {"all": {"children": {"bench": {
        "hosts": {host: {"ansible_host": container(host)} for host in HOSTS},
        "vars": {"ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3",
                 **{key: lab[key] for key in HOST_SETTINGS}}}}}}
    path = pathlib.Path(folder) / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def site_command(inventory, hosts):
    """site.yml's host-preparation roles on ``hosts``, from the repository's root."""
    return ["ansible-playbook", "-i", str(inventory), "site.yml", "--tags", ",".join(ROLES), "--limit", ",".join(hosts)]


def environment_changes(config=None, extra_env=None):
    """(variables set, variables unset) for a run: ``extra_env``, and with ``config`` the file's settings, plus the one
    reverted: the lab's environment exports ANSIBLE_PIPELINING, which would override the file."""
    changes = dict(extra_env or {})
    if not config:
        return changes, ()
    changes["ANSIBLE_CONFIG"] = str(config)
    return changes, tuple(key for key in ("ANSIBLE_PIPELINING", "ANSIBLE_FORKS") if key not in changes)


def site(inventory, hosts, config=None, extra_env=None):
    """One site.yml run of the host-preparation roles on ``hosts``: seconds, {host: (tasks, changed)}, output."""
    changes, unset = environment_changes(config, extra_env)
    env = {key: value for key, value in {**os.environ, **changes}.items() if key not in unset}
    started = time.monotonic()
    result = subprocess.run(site_command(inventory, hosts), cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"site.yml on {', '.join(hosts)} exited {result.returncode}:\n{result.stdout[-3000:]}")
    recap = result.stdout.rsplit("PLAY RECAP", 1)[1]
    counts = {name: (int(ok) + int(skipped), int(changed)) for name, ok, changed, _unreachable, _failed, skipped in RECAP.findall(recap)}
    return seconds, counts, result.stdout


def fresh_converge(inventory):
    """The first converge of one fresh host, with the time each role took."""
    seconds, counts, output = site(inventory, HOSTS[:1], extra_env=PROFILE_ENV)
    roles = {}
    for name, taken in ROLE_TIME.findall(output.rsplit("PLAY RECAP", 1)[1]):
        roles[name] = roles.get(name, 0.0) + float(taken)
    return seconds, counts[HOSTS[0]], roles


def table(rows, header):
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for row in rows:
        print(row)


def planned_commands(image, inventory, runs):
    """Every command a run starts, in order, each boot wait once: (variables set, variables unset, argv)."""
    plain = ({}, ())

    def site_run(hosts, config=None, extra_env=None):
        return (*environment_changes(config, extra_env), site_command(inventory, hosts))

    commands = [(*plain, remove_command()), *((*plain, host_command(image, host)) for host in HOSTS), *((*plain, boot_wait_command(host)) for host in HOSTS),
                site_run(HOSTS[:1], extra_env=PROFILE_ENV), site_run(HOSTS[1:], CONFIG)]
    commands += [site_run(HOSTS[:count], CONFIG) for count in SCALES for _run in range(runs)]
    commands += [site_run(HOSTS, CONFIG, env) for env in REVERTED.values() for _run in range(runs)]
    return [*commands, (*plain, remove_command())]


def shell_line(changes, unset, argv):
    prefix = [part for key in unset for part in ("-u", key)] + [f"{key}={value}" for key, value in changes.items()]
    return shlex.join(["env", *prefix, *argv] if prefix else argv)


def main(argv=None):
    arguments = command_line(__doc__, argv, "runs per shape")
    runs = arguments.runs
    image = os.environ.get("SPARKFLEET_LAB_IMAGE")
    if not image:
        raise SystemExit("SPARKFLEET_LAB_IMAGE is empty; run through scripts/lib/common.sh's ensure_all (see the docstring)")
    if arguments.print_commands:
        with tempfile.TemporaryDirectory() as folder:
            print(f"cd {shlex.quote(str(ROOT))}")
            for command in planned_commands(image, write_inventory(folder), runs):
                print(shell_line(*command))
        return
    try:
        with tempfile.TemporaryDirectory() as folder:
            start_hosts(image)
            inventory = write_inventory(folder)
            seconds, (tasks, changed), roles = fresh_converge(inventory)
            print(f"Fresh converge of one lab host: {seconds:.1f} s, {tasks} tasks, {changed} changed; by role (profile_roles):\n")
            table([f"| {name} | {taken:.1f} |" for name, taken in sorted(roles.items(), key=lambda item: -item[1])], "| role | s |")
            site(inventory, HOSTS[1:], CONFIG)
            scale = {}
            for count in SCALES:
                measured = [site(inventory, HOSTS[:count], CONFIG) for _run in range(runs)]
                scale[count] = (statistics.median(run[0] for run in measured), measured[-1][1],
                                max(sum(changed for _tasks, changed in run[1].values()) for run in measured))
            print(f"\nNo-op re-apply of the host-preparation roles with docs/ansible.cfg (median of {runs}):\n")
            table([f"| {count} | {seconds:.1f} | {min(t for t, _c in hosts.values())}-{max(t for t, _c in hosts.values())} | {changed} |"
                   for count, (seconds, hosts, changed) in scale.items()], "| hosts | wall s | tasks per host | changed |")
            print(f"\nratio 8 hosts / 1 host: {scale[8][0] / scale[1][0]:.2f} (goal at most 2)")
            settings = {"docs/ansible.cfg": scale[8][0]}
            for name, env in REVERTED.items():
                settings[name] = statistics.median(site(inventory, HOSTS, CONFIG, env)[0] for _run in range(runs))
            print(f"\nThe 8-host no-op re-apply, docs/ansible.cfg against one setting reverted (median of {runs}):\n")
            table([f"| {name} | {seconds:.1f} | {seconds / settings['docs/ansible.cfg']:.2f} |" for name, seconds in settings.items()],
                  "| configuration | wall s | against docs/ansible.cfg |")
    finally:
        remove_hosts()


if __name__ == "__main__":
    main()
