"""No-op re-apply of site.yml on the built-in lab: wall time and tasks per host on one and on two
lab hosts, and the ratio two hosts / one host (issue 19's goals: at most 30 s for the two hosts,
a ratio of at most 1.3).

The lab must be up and converged (scripts/lab). Run it through the lab's environment:
  bash -c 'source scripts/lib/common.sh; ensure_all; ensure_serving_lab; python3 benchmarks/noop_reapply.py'
One host is lab-gx10-1 without the cluster both hosts serve together (a cluster is only ever
applied with all of its nodes). Prints a Markdown table; each figure is the median of the runs.
Beside the wall time, the CPU each run took: the controller's (ansible-playbook and what it ran,
the docker exec clients among them) and the containers' (the lab hosts and what they serve, from
Docker's cgroups), and what that work allows at best on this machine's cores: on a machine whose
cores the controller shares with the lab hosts, the ratio cannot fall below the two-host run's CPU
over the cores, against the one-host run's wall time.
"""

import argparse
import glob
import os
import pathlib
import re
import resource
import statistics
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHAPES = {"one host": ["-l", "lab-gx10-1", "--skip-tags", "cluster"], "two hosts": []}
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.MULTILINE)


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


def reapply(arguments):
    controller, containers = children_cpu_seconds(), containers_cpu_seconds()
    started = time.monotonic()
    result = subprocess.run(["ansible-playbook", "-i", "inventories/lab", "site.yml", *arguments], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    controller = children_cpu_seconds() - controller
    after = containers_cpu_seconds()
    containers = after - containers if after is not None and containers is not None else None
    if result.returncode != 0:
        raise SystemExit(f"site.yml {' '.join(arguments)} exited {result.returncode}:\n{result.stdout[-3000:]}")
    recap = result.stdout.rsplit("PLAY RECAP", 1)[1]
    hosts = {name: (int(ok) + int(skipped), int(changed)) for name, ok, changed, _unreachable, _failed, skipped in RECAP.findall(recap)}
    return seconds, hosts, controller, containers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per shape (default 3)")
    runs = parser.parse_args().runs
    rows = {}
    for shape, arguments in SHAPES.items():
        measured = [reapply(arguments) for _run in range(runs)]
        seconds = statistics.median(run[0] for run in measured)
        controller = statistics.median(run[2] for run in measured)
        containers = statistics.median(run[3] for run in measured) if all(run[3] is not None for run in measured) else None
        changed = max(sum(count for _tasks, count in run[1].values()) for run in measured)
        rows[shape] = (seconds, measured[-1][1], changed, controller, containers)
    print(f"| lab hosts | wall time s (median of {runs}) | tasks per host | changed | controller CPU s | containers' CPU s |")
    print("|---|---:|---|---:|---:|---:|")
    for shape, (seconds, hosts, changed, controller, containers) in rows.items():
        tasks = ", ".join(f"{name} {count}" for name, (count, _changed) in sorted(hosts.items()))
        shown = f"{containers:.1f}" if containers is not None else "n/a"
        print(f"| {shape} | {seconds:.1f} | {tasks} | {changed} | {controller:.1f} | {shown} |")
    two, one = rows["two hosts"], rows["one host"]
    print(f"\nratio two hosts / one host: {two[0] / one[0]:.2f} (goal at most 1.3); two hosts {two[0]:.1f} s (goal at most 30 s)")
    if two[4] is not None:
        cores = os.cpu_count() or 1
        floor = (two[3] + two[4]) / cores
        print(f"two hosts' CPU over this machine's {cores} cores: {floor:.1f} s at best, a ratio of {floor / one[0]:.2f} at best; "
              f"the run kept {(two[3] + two[4]) / two[0]:.2f} of them busy")


if __name__ == "__main__":
    main()
