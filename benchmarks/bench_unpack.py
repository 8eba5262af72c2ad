"""Unpacking a workdir into an attempt directory: our fd-relative extractor in the agent's
process, the same extractor in a child that has dropped to the job's uid (what a root
agent with job identities does), and, as the baseline in the same run, a plain
``shutil.copytree`` of the unpacked tree (no checks, no tar parsing).

Why: the extractor no longer relies on tarfile's filter and runs as the job's user; the
price is a process start per attempt plus an ``openat`` per path component. Runs
alternate so a noisy neighbour hits all three; medians, with the load average (the box
is shared).

    sudo .venv/bin/python benchmarks/bench_unpack.py [--mb 50] [--runs 5]
        [--out benchmarks/results/unpack.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from brokersdk.workdir import pack  # noqa: E402
from region_agents.executors.job_user import JobUser  # noqa: E402
from region_agents.workdir import unpack  # noqa: E402

BENCH_UID = 61990  # a uid with no passwd entry, as a job identity from a range would be


def make_tree(root: Path, total_mb: int, seed: int) -> int:
    """Source-like files (9 of 4 kB for each 1 MB one) in nested packages."""
    rnd = __import__("random").Random(seed)
    total, i, target = 0, 0, total_mb * 1_000_000
    while total < target:
        size = min(4_000 if i % 10 else 1_000_000, target - total)
        d = root / f"pkg{i % 20}" / f"sub{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(rnd.randbytes(size))
        total += size
        i += 1
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=50)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "unpack.json"))
    args = p.parse_args(argv)
    as_user = os.geteuid() == 0
    load_start = os.getloadavg()
    times: dict[str, list[float]] = {"in_process": [], "as_job_user": [], "copytree": []}
    with tempfile.TemporaryDirectory(prefix="bench-unpack-", dir="/tmp") as tmp:
        tmpd = Path(tmp)
        tmpd.chmod(0o755)
        src = tmpd / "src"
        nbytes = make_tree(src, args.mb, seed=1)
        packed = pack(src, max_bytes=10 * args.mb * 1_000_000)
        tar = tmpd / "w.tar"
        packed.write_to(tar)
        files = len(packed.files)
        user = JobUser("bench", BENCH_UID, BENCH_UID)
        kinds = [k for k in times if as_user or k != "as_job_user"]
        for run in range(args.runs):
            for kind in kinds[run % len(kinds):] + kinds[:run % len(kinds)]:
                dest = tmpd / f"{kind}{run}"
                dest.mkdir()
                t0 = time.perf_counter()
                if kind == "copytree":
                    shutil.copytree(src, dest / "workdir")
                else:
                    unpack(tar, dest / "workdir", user if kind == "as_job_user" else None)
                times[kind].append(time.perf_counter() - t0)
                shutil.rmtree(dest)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    result = {
        "bytes": nbytes, "files": files, "runs": args.runs,
        "median_s": med, "samples_s": {k: v for k, v in times.items() if v},
        "as_job_user_over_in_process": (med["as_job_user"] / med["in_process"]
                                        if "as_job_user" in med else None),
        "in_process_over_copytree": med["in_process"] / med["copytree"],
        "note": "" if as_user else "not root: the as-the-job's-user path was not measured",
        "load_avg_1m": {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs,"
                   f" Python {platform.python_version()} (a shared machine)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
