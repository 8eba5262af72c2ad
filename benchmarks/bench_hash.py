"""Checkpoint file digests: xxh3-128 (what manifests carry since version 3) vs sha256
(version 2), on one core, over the same warm buffer in the same process.

Why it exists: the trainer hashes every byte it saves and loads, on the rank's own
cores; this is the figure behind choosing xxh3-128 (trainer/checkpoint.py docstring).
Prints GB/s for each and the ratio, and writes benchmarks/results/hash.json.

    .venv/bin/python benchmarks/bench_hash.py [--mb 512] [--reps 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import xxhash

RESULTS = Path(__file__).resolve().parent / "results" / "hash.json"


def best_gbps(new_hasher, data: memoryview, reps: int) -> float:  # noqa: ANN001
    best = float("inf")
    for _ in range(reps):
        h = new_hasher()
        t0 = time.perf_counter()
        for i in range(0, len(data), 8 << 20):  # the trainer's 8 MiB chunks
            h.update(data[i : i + (8 << 20)])
        h.hexdigest()
        best = min(best, time.perf_counter() - t0)
    return len(data) / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    data = memoryview(os.urandom(args.mb << 20))  # touched once: no page faults timed
    xxh3 = best_gbps(xxhash.xxh3_128, data, args.reps)
    sha = best_gbps(hashlib.sha256, data, args.reps)
    res = {
        "machine": f"{os.cpu_count()} CPU cores, one thread",
        "buffer_MiB": args.mb,
        "reps": args.reps,
        "xxh3_128_GBps": xxh3,
        "sha256_GBps": sha,
        "xxh3_vs_sha256": xxh3 / sha,
        "loadavg_1_5_15": os.getloadavg(),
    }
    RESULTS.write_text(json.dumps(res, indent=2))
    print(f"xxh3_128 {xxh3:.2f} GB/s, sha256 {sha:.2f} GB/s, ratio {xxh3 / sha:.1f}x "
          f"(best of {args.reps} over {args.mb} MiB); wrote {RESULTS}")


if __name__ == "__main__":
    main()
