"""What the API benchmarks read about a process they started (its CPU and memory from
/proc) and their one percentile rule, shared so every figure is taken the same way."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """:func:`proc_cpu_s` of ``pid`` plus its live children's (a broker with API worker
    processes is the core and its workers: the broker's CPU is all of theirs)."""
    total = proc_cpu_s(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            with contextlib.suppress(OSError):  # it exited meanwhile
                total += proc_cpu_s(int(kid))
    return total


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (0 if /proc does not say)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def pct(xs: list[float], p: float) -> float:
    """The ``p``-th percentile by nearest rank (0.0 for no samples)."""
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
