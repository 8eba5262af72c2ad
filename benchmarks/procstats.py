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


def peak_rss_kb(pid: int) -> int:
    """Peak resident set size (VmHWM) of ``pid`` in KiB (0 if /proc does not say): what a
    process needed at its worst, read before it exits."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def cgroup_memory_peak() -> dict[str, object] | None:
    """The memory cgroup this process runs in and its peak usage in bytes (cgroup v2
    ``memory.peak``, else v1 ``memory.max_usage_in_bytes``) and limit; None when the
    process is in the root cgroup or the files are not there. Why: a benchmark run in its
    own cgroup (the shared machine's rule for big runs) reports what the whole run took,
    page cache included, not only the processes it could name."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hier, controllers, path = line.split(":", 2)
        if path in ("", "/"):
            continue
        if hier == "0" and controllers == "":
            base = Path("/sys/fs/cgroup/unified" if Path("/sys/fs/cgroup/unified").is_dir()
                        else "/sys/fs/cgroup") / path.lstrip("/")
            peak, limit = base / "memory.peak", base / "memory.max"
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            peak, limit = base / "memory.max_usage_in_bytes", base / "memory.limit_in_bytes"
        else:
            continue
        if peak.exists():
            lim = limit.read_text().strip() if limit.exists() else ""
            return {"cgroup": path, "peak_bytes": int(peak.read_text()),
                    "limit_bytes": int(lim) if lim.isdigit() else None}
    return None
