"""Store throughput: job CAS updates/s and event appends/s, SQLite and Redis.

Why: SQLite runs with synchronous=FULL (every commit fsynced) so a killed broker loses
nothing; this measures what that costs against synchronous=NORMAL, and what a local
Redis gives. Each figure is ops completed in a fixed time window on this machine.

    .venv/bin/python benchmarks/bench_store.py [--seconds 2] [--out benchmarks/results/store.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

import redis  # noqa: E402

from broker.store import Store, VersionConflict  # noqa: E402
from broker.store.redis import RedisStore  # noqa: E402
from broker.store.sqlite import SQLiteStore  # noqa: E402
from computebroker.v1 import common_pb2 as pb  # noqa: E402


def rate(fn: Callable[[], None], seconds: float, threads: int = 1) -> float:
    """Operations per second of ``fn`` run in a loop by ``threads`` threads."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            fn()
            counts[i] += 1

    start = time.monotonic()
    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def measure(store: Store, seconds: float) -> dict[str, float]:
    jid = f"bench-{uuid.uuid4().hex[:8]}"
    store.create_job(pb.Job(id=jid, spec=pb.JobSpec(team="bench", name="x" * 200)),
                     [pb.JobEvent(type="submitted")])
    ev = pb.JobEvent(type="progress", message="step 1234 loss 0.123")

    def cas() -> None:
        while True:
            job = store.get_job(jid)
            job.restarts += 1
            try:
                store.update_job(job, job.version, [ev])
                return
            except VersionConflict:
                continue

    return {
        "cas_updates_per_s": round(rate(cas, seconds), 1),
        "cas_updates_per_s_4_threads": round(rate(cas, seconds, threads=4), 1),
        "event_appends_per_s": round(rate(lambda: store.append_events(jid, [ev]), seconds), 1),
    }


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()
    return proc, port


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "store.json"))
    args = ap.parse_args()
    results: dict[str, object] = {"machine": platform.platform(), "seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        s = SQLiteStore(str(Path(tmp) / "full.sqlite"))
        results["sqlite_synchronous_full"] = measure(s, args.seconds)
        s.close()
        s = SQLiteStore(str(Path(tmp) / "normal.sqlite"))
        s._conn.execute("PRAGMA synchronous=NORMAL")  # comparison only, never the default
        results["sqlite_synchronous_normal"] = measure(s, args.seconds)
        s.close()
        proc, port = start_redis(tmp)
        try:
            r = RedisStore(f"redis://127.0.0.1:{port}/0?prefix=bench")
            results["redis_local_no_persistence"] = measure(r, args.seconds)
            r.close()
        finally:
            proc.terminate()
            proc.wait()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
