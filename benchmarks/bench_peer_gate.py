"""What the connection gate (``max_connections_per_address``, broker/api/peer_gate.py)
costs the API: GetJob throughput and a workdir-sized upload through the gate, against
the same broker settings without it (the in-run baseline).

Two TLS brokers in this process, the same store kind (SQLite in a temp dir); one with
the gate (it relays every byte of the public port in one Python thread), one without.
Each phase runs ``--threads`` client threads (a channel each) for ``--seconds``; rounds
alternate gated/direct so a noisy neighbour hits both; medians are reported, with the
load average before and after (the box is shared).

    .venv/bin/python benchmarks/bench_peer_gate.py [--seconds 3] [--rounds 3] [--threads 4]
        [--out benchmarks/results/peer_gate.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from broker.auth.devca import create_dev_pki  # noqa: E402
from broker.auth.identity import Role  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.server import BrokerServer  # noqa: E402
from brokersdk.credentials import ClientCredentials, make_channel  # noqa: E402
from computebroker.v1 import capacity_pb2 as cpb  # noqa: E402
from computebroker.v1 import capacity_pb2_grpc, jobs_pb2_grpc  # noqa: E402
from computebroker.v1 import common_pb2 as pb  # noqa: E402
from computebroker.v1 import jobs_pb2 as jpb  # noqa: E402

# A reply of about this size (a job with a big env) stands in for a bulk transfer: the
# gate's per-byte cost, not only its per-call cost.
BIG_ENV_BYTES = 64 * 1024


def _rate(address: str, creds: ClientCredentials, seconds: float, threads: int,
          job_id: str) -> tuple[float, list[float]]:
    """(GetJob calls/s over ``threads`` channels, per-call latencies in ms)."""
    counts = [0] * threads
    lat: list[list[float]] = [[] for _ in range(threads)]
    stop = threading.Event()
    measuring = threading.Event()

    def worker(k: int) -> None:
        with make_channel(address, creds) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            while not stop.is_set():
                t0 = time.perf_counter()
                stub.GetJob(jpb.GetJobRequest(job_id=job_id), timeout=30)
                if measuring.is_set():
                    lat[k].append((time.perf_counter() - t0) * 1000)
                counts[k] += 1

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    time.sleep(0.5)  # connected and warm
    start = sum(counts)
    measuring.set()
    t0 = time.perf_counter()
    time.sleep(seconds)
    done = sum(counts) - start
    elapsed = time.perf_counter() - t0
    stop.set()
    for t in ts:
        t.join(timeout=60)
    return done / elapsed, [x for xs in lat for x in xs]


def _broker(tmp: Path, name: str, settings: dict[str, object], **kw: object) -> tuple[BrokerServer, str]:
    server = BrokerServer(BrokerConfig(
        listen="127.0.0.1:0", agent_listen="127.0.0.1:0", store=f"sqlite:///{tmp / name}.sqlite",
        checkpoint_root=str(tmp / "ckpt"), scheduler_interval_s=5.0, **settings, **kw))  # type: ignore[arg-type]
    return server, f"127.0.0.1:{server.start()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "peer_gate.json"))
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    samples: dict[str, list[float]] = {f"{kind}_{mode}": [] for kind in ("small", "big")
                                       for mode in ("gated", "direct")}
    p50: dict[str, list[float]] = {k: [] for k in samples}
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as tmp:
        tmpd = Path(tmp)
        pki = create_dev_pki(tmpd / "pki", agents=[],
                             users=[("op", Role.OPERATOR, ""), ("bench", Role.MEMBER, "ml")])
        gated, g_addr = _broker(tmpd, "gated", pki.broker_settings, max_connections_per_address=64)
        direct, d_addr = _broker(tmpd, "direct", pki.broker_settings)
        ca = str(pki.ca.ca_cert_path)
        user = ClientCredentials(ca=ca, token=pki.tokens["bench"])
        jobs: dict[str, dict[str, str]] = {}
        try:
            for mode, addr in (("gated", g_addr), ("direct", d_addr)):
                with make_channel(addr, ClientCredentials(ca=ca, token=pki.tokens["op"])) as ch:
                    capacity_pb2_grpc.CapacityServiceStub(ch).SetTeamQuota(cpb.SetTeamQuotaRequest(
                        quota=cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])))
                with make_channel(addr, user) as ch:
                    stub = jobs_pb2_grpc.JobServiceStub(ch)
                    jobs[mode] = {}
                    for kind, env in (("small", {}), ("big", {f"BLOB{i}": "x" * (BIG_ENV_BYTES // 4)
                                                              for i in range(4)})):
                        spec = pb.JobSpec(name=f"bench-{kind}", team="ml", env=env,
                                          priority_class="training",
                                          resources=pb.Resources(nodes=1, gpus_per_node=1),
                                          trainer=pb.TrainerSpec(total_steps=10, checkpoint_every=5,
                                                                 global_batch_size=8))
                        jobs[mode][kind] = stub.SubmitJob(jpb.SubmitJobRequest(spec=spec)).job.id
            for rnd in range(args.rounds):
                modes = [("gated", g_addr), ("direct", d_addr)]
                if rnd % 2:
                    modes.reverse()
                for kind in ("small", "big"):
                    for mode, addr in modes:
                        r, lat = _rate(addr, user, args.seconds, args.threads, jobs[mode][kind])
                        samples[f"{kind}_{mode}"].append(r)
                        p50[f"{kind}_{mode}"].append(statistics.median(lat) if lat else 0.0)
                        print(f"round {rnd + 1}/{args.rounds} GetJob {kind:5s} {mode:6s}"
                              f" {r:8.0f} calls/s", flush=True)
        finally:
            gated.stop(0.5)
            direct.stop(0.5)
    med = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "threads": args.threads, "seconds": args.seconds, "rounds": args.rounds,
        "big_reply_bytes": BIG_ENV_BYTES,
        "get_per_s": {m: {k: med[f"{k}_{m}"] for k in ("small", "big")} for m in ("gated", "direct")},
        "p50_ms": {m: {k: statistics.median(p50[f"{k}_{m}"]) for k in ("small", "big")}
                   for m in ("gated", "direct")},
        "ratio_small": med["small_gated"] / med["small_direct"],
        "ratio_big": med["big_gated"] / med["big_direct"],
        "samples": samples,
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}",
    }
    print(f"GetJob small: {med['small_gated']:.0f}/s gated vs {med['small_direct']:.0f}/s direct"
          f" (ratio {result['ratio_small']:.2f}); 64 KiB replies: ratio {result['ratio_big']:.2f}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
