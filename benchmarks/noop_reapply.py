"""No-op re-apply of site.yml on the built-in lab's two hosts: per host the tasks it ran (skipped ones included), the
wall time and the controller's CPU seconds (issue 40's goals: at most 60 tasks per host, under 15 s on a quiet machine).

The lab must be up and converged (scripts/lab). Run it through the lab's environment:
  bash -c 'source scripts/lib/common.sh; ensure_all; ensure_serving_lab; python3 benchmarks/noop_reapply.py'
With --print-commands it prints the ansible-playbook command it runs and runs nothing.

Why both hosts in one run, and no one-host run: both lab hosts are nodes of one cluster (inventories/lab, lab_cluster)
and the gateway on lab-spark-1 fronts lab-gx10-1's instance. A cluster is only ever applied with all its nodes, and the
watchdog's peer exchange (roles/watchdog/tasks/peers.yml) refuses a play that leaves out a node of a cluster the host
serves ("keep every node of the cluster in the play"), even with --skip-tags cluster, since the peers come from the
ranks deployed on the hosts; the lab has no host outside the cluster. A one-host run would measure a refused run or a
site.yml with roles skipped, neither of which an operator runs. So one shape: the whole site.yml on the whole lab,
reported per host from Ansible's recap.

Tasks per host are ok + skipped from the recap (Ansible's ok already counts the changed ones, so adding changed would
count them twice). Both hosts run in one play under the linear strategy, each task on both before the next, so each
host's wall time and the controller's CPU are the run's own, shown on each host's row. Each figure is the median of the
runs; tasks are the last run's, changed the most any run changed. Beside them, the CPU of the lab hosts' containers
(from Docker's cgroups) and what the run's CPU allows at best on this machine's cores, since the controller shares
them with the lab hosts.
"""

import glob
import os
import pathlib
import re
import resource
import shlex
import statistics
import subprocess
import time

from lab_vllm import command_line

ROOT = pathlib.Path(__file__).resolve().parents[1]
INVENTORY = "inventories/lab"
PLAYBOOK = "site.yml"
LAB_HOSTS = ("lab-spark-1", "lab-gx10-1")
GOAL_TASKS = 60
GOAL_SECONDS = 15
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.MULTILINE)


def reapply_command():
    """The run measured, from the repository's root: every play of site.yml on every lab host."""
    return ["ansible-playbook", "-i", INVENTORY, PLAYBOOK]


def recap_counts(output):
    """{host: (tasks, skipped, changed)} from the PLAY RECAP of ansible-playbook's output."""
    if "PLAY RECAP" not in output:
        raise SystemExit(f"{PLAYBOOK} printed no PLAY RECAP:\n{output[-3000:]}")
    recap = output.rsplit("PLAY RECAP", 1)[1]
    return {name: (int(ok) + int(skipped), int(skipped), int(changed)) for name, ok, changed, _unreachable, _failed, skipped in RECAP.findall(recap)}


def containers_cpu_seconds():
    """CPU time of every Docker container so far (cgroup v1, or v2's scopes), None where neither is found."""
    try:
        return int(pathlib.Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        pass
    scopes = glob.glob("/sys/fs/cgroup/system.slice/docker-*.scope/cpu.stat")
    usage = [line.split()[1] for scope in scopes for line in pathlib.Path(scope).read_text().splitlines() if line.startswith("usage_usec ")]
    return sum(int(value) for value in usage) / 1e6 if usage else None


def children_cpu_seconds():
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def reapply():
    """One run: (wall seconds, {host: (tasks, skipped, changed)}, controller CPU seconds, containers' CPU seconds or None)."""
    controller, containers = children_cpu_seconds(), containers_cpu_seconds()
    started = time.monotonic()
    result = subprocess.run(reapply_command(), cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    controller = children_cpu_seconds() - controller
    after = containers_cpu_seconds()
    containers = after - containers if after is not None and containers is not None else None
    if result.returncode != 0:
        raise SystemExit(f"{shlex.join(reapply_command())} exited {result.returncode}:\n{result.stdout[-3000:]}")
    hosts = recap_counts(result.stdout)
    missing = sorted(set(LAB_HOSTS) - set(hosts))
    if missing:
        raise SystemExit(f"the recap of {PLAYBOOK} names no {', '.join(missing)}: is {INVENTORY} the two-host lab?")
    return seconds, hosts, controller, containers


def main(argv=None):
    arguments = command_line(__doc__, argv, "runs of the re-apply", print_help="print the command each run runs, and run none")
    runs = arguments.runs
    if arguments.print_commands:
        for _run in range(runs):
            print(f"cd {shlex.quote(str(ROOT))} && {shlex.join(reapply_command())}")
        return
    measured = [reapply() for _run in range(runs)]
    seconds = statistics.median(run[0] for run in measured)
    controller = statistics.median(run[2] for run in measured)
    containers = statistics.median(run[3] for run in measured) if all(run[3] is not None for run in measured) else None
    hosts = measured[-1][1]
    changed = {name: max(run[1][name][2] for run in measured) for name in hosts}
    print(f"| lab host | tasks (ok + skipped) | skipped | changed | wall s (median of {runs}) | controller CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (tasks, skipped, _changed) in sorted(hosts.items()):
        print(f"| {name} | {tasks} | {skipped} | {changed[name]} | {seconds:.1f} | {controller:.1f} |")
    print("\nBoth hosts in one run (a cluster is applied whole): the wall time and the controller's CPU are the run's, on each row.")
    most = max(tasks for tasks, _skipped, _changed in hosts.values())
    print(f"goals: at most {GOAL_TASKS} tasks per host ({'met' if most <= GOAL_TASKS else 'missed'}, at most {most}); "
          f"under {GOAL_SECONDS} s ({'met' if seconds < GOAL_SECONDS else 'missed'}, {seconds:.1f} s)")
    if containers is not None:
        cores = os.cpu_count() or 1
        floor = (controller + containers) / cores
        print(f"the lab hosts' containers: {containers:.1f} CPU s; the run's CPU over this machine's {cores} cores: {floor:.1f} s at best; "
              f"the run kept {(controller + containers) / seconds:.2f} of them busy")


if __name__ == "__main__":
    main()
