"""Read latency with 1,000 idle long-lived streams open vs none (issue 12), over TLS
with real credentials (tests/broker/harness.py: operator reads, member watches, agent
certificate streams).

Why: on the old server every idle WatchJob/Connect stream held one of 256 shared
threads and reads hung beyond that. With the stream budget (broker/api/streams.py)
streams have their own threads and unary RPCs keep theirs; this shows what 1,000 open
idle streams (900 agent streams that never register + 100 watches) cost a GetJob:
p50/p99 latency over the same calls, ratio against the run without streams.

    .venv/bin/python benchmarks/bench_streams.py [--calls 500] [--out benchmarks/results/streams.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from computebroker.v1 import agent_pb2_grpc  # noqa: E402
from computebroker.v1 import jobs_pb2 as jpb  # noqa: E402
from tests.broker.harness import Broker, fast_config, spec, wait_until  # noqa: E402


def latencies(b: Broker, job_id: str, calls: int) -> dict[str, float]:
    req = jpb.GetJobRequest(job_id=job_id)
    for _ in range(20):  # warm-up
        b.jobs.GetJob(req, timeout=30)
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        b.jobs.GetJob(req, timeout=30)
        out.append((time.perf_counter() - t) * 1000)
    out.sort()
    return {"p50_ms": round(statistics.median(out), 3),
            "p99_ms": round(out[min(len(out) - 1, int(len(out) * 0.99))], 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "streams.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    # Agents' Connect streams draw from their own pool (broker/api/streams.py): size both.
    b = Broker(fast_config(tmp, max_streams=args.streams + 10, max_agent_streams=args.streams + 10,
                           max_streams_per_identity=args.streams, max_streams_per_team=args.streams,
                           max_streams_per_peer=args.streams + 10, max_workers=16,
                           stream_idle_timeout_s=600))
    try:
        b.team()
        job = b.submit(spec("watched"))
        base = latencies(b, job.id, args.calls)
        print(f"no streams:   {base}", flush=True)
        watches = max(1, args.streams // 10)
        stub = agent_pb2_grpc.AgentServiceStub(b.agent_channel("us-east-2", "idle"))
        watchers = [b.stubs_as(f"w{i}") for i in range(5)]
        silent: list[queue.Queue] = [queue.Queue() for _ in range(args.streams - watches)]
        calls = [stub.Connect(iter(q.get, None), timeout=600) for q in silent]
        for i in range(watches):
            w = watchers[i % 5].jobs.WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=600)
            next(w)
            calls.append(w)
        print(f"opening {args.streams} idle streams...", flush=True)
        wait_until(lambda: b.server.streams.open == args.streams, 120, "streams open")
        loaded = latencies(b, job.id, args.calls)
        print(f"{args.streams} streams: {loaded}", flush=True)
        for c in calls:
            c.cancel()
        for q in silent:
            q.put(None)
    finally:
        b.stop()
    results = {
        "machine": platform.platform(), "calls": args.calls, "idle_streams": args.streams,
        "no_streams": base, "with_idle_streams": loaded,
        "p50_ratio": round(loaded["p50_ms"] / base["p50_ms"], 2),
        "p99_ratio": round(loaded["p99_ms"] / base["p99_ms"], 2),
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
