# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory admission on a unified pool. Private to the collection.

On a GB10 the GPU, the CPU and the page cache share one pool, and vLLM compares
gpu_memory_utilization x total with the memory free at startup (seeds 002 and 004):
"Free memory on device ... less than desired GPU memory utilization".
"""

from __future__ import annotations

import typing as t

GIB = 1024**3


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes."""
    values = {}
    for line in text.splitlines():
        name, _separator, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[name] = int(fields[0]) * (1024 if len(fields) > 1 and fields[1] == "kB" else 1)
    return values


def admission_problem(name: str, gpu_memory_utilization: float, meminfo: t.Mapping[str, int]) -> str | None:
    """Why starting instance ``name`` now would not fit the memory available, or None."""
    total, available = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if not total or available is None:
        return f"{name}: /proc/meminfo has no MemTotal/MemAvailable"
    wanted = gpu_memory_utilization * total
    if wanted > available:
        return (
            f"{name}: gpu_memory_utilization {gpu_memory_utilization} wants {wanted / GIB:.2f} GiB of the "
            f"{total / GIB:.2f} GiB pool, but only {available / GIB:.2f} GiB is available now; lower it, or free "
            "memory first (stop what holds it, drop caches)"
        )
    return None
