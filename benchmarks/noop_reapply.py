"""No-op re-apply of site.yml on the built-in lab: wall time and tasks per host on one and on two
lab hosts, and the ratio two hosts / one host (issue 19's goals: at most 30 s for the two hosts,
a ratio of at most 1.3).

The lab must be up and converged (scripts/lab). Run it through the lab's environment:
  bash -c 'source scripts/lib/common.sh; ensure_all; ensure_serving_lab; python3 benchmarks/noop_reapply.py'
One host is lab-gx10-1 without the cluster both hosts serve together (a cluster is only ever
applied with all of its nodes). Prints a Markdown table; each figure is the median of the runs.
"""

import argparse
import pathlib
import re
import statistics
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHAPES = {"one host": ["-l", "lab-gx10-1", "--skip-tags", "cluster"], "two hosts": []}
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.MULTILINE)


def reapply(arguments):
    started = time.monotonic()
    result = subprocess.run(["ansible-playbook", "-i", "inventories/lab", "site.yml", *arguments], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"site.yml {' '.join(arguments)} exited {result.returncode}:\n{result.stdout[-3000:]}")
    recap = result.stdout.rsplit("PLAY RECAP", 1)[1]
    hosts = {name: (int(ok) + int(skipped), int(changed)) for name, ok, changed, _unreachable, _failed, skipped in RECAP.findall(recap)}
    return seconds, hosts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per shape (default 3)")
    runs = parser.parse_args().runs
    rows = {}
    for shape, arguments in SHAPES.items():
        measured = [reapply(arguments) for _run in range(runs)]
        seconds = statistics.median(wall for wall, _hosts in measured)
        hosts = measured[-1][1]
        changed = max(sum(count for _tasks, count in found.values()) for _wall, found in measured)
        rows[shape] = (seconds, hosts, changed)
    print(f"| lab hosts | wall time s (median of {runs}) | tasks per host | changed |")
    print("|---|---:|---|---:|")
    for shape, (seconds, hosts, changed) in rows.items():
        tasks = ", ".join(f"{name} {count}" for name, (count, _changed) in sorted(hosts.items()))
        print(f"| {shape} | {seconds:.1f} | {tasks} | {changed} |")
    ratio = rows["two hosts"][0] / rows["one host"][0]
    print(f"\nratio two hosts / one host: {ratio:.2f} (goal at most 1.3); two hosts {rows['two hosts'][0]:.1f} s (goal at most 30 s)")


if __name__ == "__main__":
    main()
