"""What the usage series (broker/telemetry/series.py) costs the broker.

Why it exists: the scheduler pass samples the series and the leader saves it to the
store; both run on the scheduler's thread, so they must stay small next to the pass.
Measured on one process, the same synthetic live jobs for every figure:

* a sample (``sample_snapshot`` over the pass's snapshot + adding it to the three
  tiers) against two baselines on the same jobs: one plain walk over the live jobs
  testing their phase (what the pass's own loop does at the least), and the same sums
  read from the live jobs' protobuf fields (the design this replaced);
* counting one admission;
* the save: the full tiers (24 h of samples) to a message, its size, and one write
  of it to a real SQLite store;
* a GetUsageSeries answer for 1 h and 24 h (building the response, and its size).

Writes benchmarks/results/usage_series.json (with the load average: the box may be shared).

    .venv/bin/python benchmarks/bench_usage_series.py [--jobs 5000] [--teams 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import placement
from broker.jobs.lifecycle import HOLDING, QUEUED
from broker.store import open_store
from broker.store.base import KIND_USAGE_SERIES
from broker.telemetry.series import SERIES_KEY, UsageSeries, sample_snapshot
from computebroker.v1 import common_pb2 as pb

RESULTS = Path(__file__).resolve().parent / "results" / "usage_series.json"
PHASES = (pb.JOB_PHASE_PENDING, pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_RUNNING,
          pb.JOB_PHASE_MIGRATING, pb.JOB_PHASE_CHECKPOINTING)


def live_jobs(n: int, teams: int) -> list[pb.Job]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        j = pb.Job(id=f"j{i}", phase=rng.choice(PHASES))
        j.spec.team = f"team{i % teams:02d}"
        j.placement.world_size = rng.choice((1, 8, 16, 64))
        j.placement.price_per_gpu_hour = rng.choice((0.9, 2.5, 4.1))
        out.append(j)
    return out


def snapshot_of(jobs: list[pb.Job]) -> placement.Snapshot:
    """The pass's view of the same jobs: queued ones as requests, holding ones running
    on nodes (8 GPUs each) priced like their placement."""
    nodes, pending, running = [], [], []
    for j in jobs:
        if j.phase in QUEUED:
            pending.append(placement.JobRequest(id=j.id, team=j.spec.team, priority=0, nodes=1,
                                                gpus_per_node=8))
        elif j.phase in HOLDING:
            allocs = []
            for k in range(max(1, j.placement.world_size // 8)):
                node = f"{j.id}-n{k}"
                nodes.append(placement.NodeInfo(id=node, agent_id="a", region="r", zone="z", gpus=8,
                                                price_per_gpu_hour=j.placement.price_per_gpu_hour))
                allocs.append((node, min(8, j.placement.world_size)))
            running.append(placement.RunningJob(id=j.id, team=j.spec.team, priority=0,
                                                allocations=tuple(allocs)))
    return placement.Snapshot(now=0.0, nodes=tuple(nodes), running=tuple(running),
                              pending=tuple(pending))


def sample_protobuf(jobs: list[pb.Job]) -> dict[str, tuple[int, int, float]]:
    """The alternative: the same sums read off the live jobs' protobuf fields."""
    out: dict[str, tuple[int, int, float]] = {}
    for j in jobs:
        if j.phase in QUEUED:
            p, g, usd = out.get(j.spec.team, (0, 0, 0.0))
            out[j.spec.team] = (p + 1, g, usd)
        elif j.phase in HOLDING:
            pl = j.placement
            p, g, usd = out.get(j.spec.team, (0, 0, 0.0))
            out[j.spec.team] = (p, g + pl.world_size, usd + pl.world_size * pl.price_per_gpu_hour)
    return out


def best_us(fn, reps: int) -> float:  # noqa: ANN001
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--teams", type=int, default=20)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    jobs = live_jobs(args.jobs, args.teams)
    snap = snapshot_of(jobs)
    load_before = os.getloadavg()

    baseline = best_us(lambda: sum(1 for j in jobs if j.phase in QUEUED), args.reps)
    protobuf = best_us(lambda: sample_protobuf(jobs), args.reps)
    s = UsageSeries()
    clock = [1_800_000_000.0]

    def one_sample() -> None:
        clock[0] += 5
        s.sample(clock[0], sample_snapshot(snap))

    sample = best_us(one_sample, args.reps)
    admitted = best_us(lambda: s.admitted("team00", clock[0]), 1000)

    # A full day of samples every 5 s (what a broker up for a day holds), every team in each.
    full = UsageSeries()
    teams = sample_snapshot(snap)
    t0 = 1_800_000_000.0
    for k in range(0, 24 * 3600, 5):
        full.sample(t0 + k, teams)
        if k % 60 == 0:
            full.admitted("team00", t0 + k)
    now = t0 + 24 * 3600
    to_state = best_us(lambda: full.to_state(now), 5)
    state = full.to_state(now)
    blob = state.SerializeToString()
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"sqlite:///{d}/bench.sqlite")
        try:
            write = best_us(lambda: store.put_record(KIND_USAGE_SERIES, SERIES_KEY, state), 5)
        finally:
            store.close()
    q_hour = best_us(lambda: full.query(now, 3600), 10)
    q_day = best_us(lambda: full.query(now, 24 * 3600), 10)
    res = {
        "machine": f"{os.cpu_count()} CPU cores, one thread; shared with other test runs",
        "live_jobs": args.jobs, "teams": args.teams, "reps": args.reps,
        "nodes": len(snap.nodes),
        "baseline_walk_us": baseline,
        "baseline_protobuf_sample_us": protobuf,
        "sample_us": sample,
        "sample_vs_walk": sample / baseline,
        "sample_vs_protobuf": sample / protobuf,
        "admission_us": admitted,
        "save_to_message_ms": to_state / 1e3,
        "saved_bytes": len(blob),
        "save_sqlite_write_ms": write / 1e3,
        "query_1h_ms": q_hour / 1e3, "query_1h_bytes": len(full.query(now, 3600).SerializeToString()),
        "query_24h_ms": q_day / 1e3,
        "query_24h_bytes": len(full.query(now, 24 * 3600).SerializeToString()),
        "loadavg_1_5_15_before": load_before,
        "loadavg_1_5_15": os.getloadavg(),
    }
    RESULTS.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
