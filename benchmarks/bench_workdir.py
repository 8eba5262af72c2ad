"""Workdir path: a 50 MB working directory from the user's disk to an attempt's cwd.

Measured (a real broker in this process on loopback gRPC, the SDK, the agent's fetch
code): pack + upload (SDK), fetch + verify (agent cache), unpack (attempt dir).
Baseline: a raw copy of the same bytes along the same route, with plain file copies
(``shutil.copytree``, no fsync, although our broker store fsyncs its blob):
user dir -> broker store -> agent cache -> attempt dir.
The ratio is baseline time / our time (1.0 = as fast as copying; goal >= 0.8), for the
whole route and for upload + fetch alone against the first two copies.
Runs alternate ours/raw so a noisy neighbour hits both; medians are reported.

    .venv/bin/python benchmarks/bench_workdir.py [--mb 50] [--runs 5]
        [--out benchmarks/results/workdir.json]
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

from broker.auth.devca import create_dev_pki  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.server import BrokerServer  # noqa: E402
from brokersdk.client import BrokerClient  # noqa: E402
from brokersdk.credentials import ClientCredentials  # noqa: E402
from region_agents.workdir import WorkdirCache, unpack  # noqa: E402


def make_tree(root: Path, total_mb: int, seed: int) -> int:
    """Source-like files (many small) plus a few larger data files; random bytes, so
    no layer can win by compressing. ``seed`` makes each run's bytes new (no dedup)."""
    rnd = __import__("random").Random(seed)
    total = 0
    target = total_mb * 1_000_000
    i = 0
    while total < target:
        size = 4_000 if i % 10 else 1_000_000  # 9 small files for each 1 MB one
        d = root / f"pkg{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(rnd.randbytes(min(size, target - total)))
        total += min(size, target - total)
        i += 1
    return total


def run_ours(client: BrokerClient, address: str, src: Path, work: Path,
             agent_creds: ClientCredentials) -> dict[str, float]:
    t0 = time.perf_counter()
    ref = client.upload_workdir(str(src))
    t1 = time.perf_counter()
    cache = WorkdirCache(work / "agent", lambda: address, agent_creds)  # mTLS, as agents do
    tar = cache.get(ref.digest)
    t2 = time.perf_counter()
    unpack(tar, work / "attempt" / "workdir")
    t3 = time.perf_counter()
    return {"upload_s": t1 - t0, "fetch_s": t2 - t1, "unpack_s": t3 - t2, "total_s": t3 - t0,
            "tar_bytes": ref.size_bytes}


def run_raw(src: Path, work: Path) -> tuple[float, float]:
    """(first two hops = what upload + fetch do, all three hops)."""
    t0 = time.perf_counter()
    shutil.copytree(src, work / "store")
    shutil.copytree(work / "store", work / "cache")
    t1 = time.perf_counter()
    shutil.copytree(work / "cache", work / "attempt")
    return t1 - t0, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=50)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "workdir.json"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-workdir-") as tmp:
        tmpd = Path(tmp)
        pki = create_dev_pki(tmpd / "pki", agents=[("bench", "bench-agent")])  # TLS + auth
        server = BrokerServer(BrokerConfig(listen="127.0.0.1:0", agent_listen="127.0.0.1:0",
                                           store=f"sqlite:///{tmpd / 'broker.sqlite'}",
                                           checkpoint_root=str(tmpd / "ckpt"), **pki.broker_settings))
        port = server.start()
        address = f"127.0.0.1:{port}"
        agent_address = f"127.0.0.1:{server.agent_port}"
        ca = str(pki.ca.ca_cert_path)
        agent_creds = ClientCredentials(ca=ca, client_cert=str(pki.ca.root / "agents" / "bench-agent.pem"),
                                        client_key=str(pki.ca.root / "agents" / "bench-agent.key"))
        ours: list[dict[str, float]] = []
        raw: list[float] = []
        raw2: list[float] = []
        nbytes = 0
        try:
            with BrokerClient(address, timeout=60, credentials=ClientCredentials(
                    ca=ca, token=pki.tokens["admin"])) as client:
                for run in range(args.runs):
                    src = tmpd / f"src{run}"
                    nbytes = make_tree(src, args.mb, seed=run)
                    order = ("ours", "raw") if run % 2 == 0 else ("raw", "ours")
                    for kind in order:
                        work = tmpd / f"{kind}{run}"
                        work.mkdir()
                        if kind == "ours":
                            ours.append(run_ours(client, agent_address, src, work, agent_creds))
                        else:
                            two, three = run_raw(src, work)
                            raw2.append(two)
                            raw.append(three)
                        shutil.rmtree(work)
                    shutil.rmtree(src)
        finally:
            server.stop(0.5)
    med = {k: statistics.median(r[k] for r in ours) for k in ("upload_s", "fetch_s", "unpack_s",
                                                              "total_s")}
    raw_s = statistics.median(raw)
    raw2_s = statistics.median(raw2)
    up_fetch = statistics.median(r["upload_s"] + r["fetch_s"] for r in ours)
    result = {
        "bytes": nbytes,
        "tar_bytes": int(ours[-1]["tar_bytes"]),
        "runs": args.runs,
        "ours": med,
        "ours_samples": [r["total_s"] for r in ours],
        "raw_copy_s": raw_s,
        "raw_samples": raw,
        "ratio": raw_s / med["total_s"],
        # The literal measure: upload + fetch against the same two copies.
        "upload_fetch_s": up_fetch,
        "raw_two_hops_s": raw2_s,
        "upload_fetch_ratio": raw2_s / up_fetch,
        "ours_mb_per_s": nbytes / 1e6 / med["total_s"],
        "raw_mb_per_s": nbytes / 1e6 / raw_s,
        "goal_ratio": 0.8,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs,"
                   f" Python {platform.python_version()}",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
