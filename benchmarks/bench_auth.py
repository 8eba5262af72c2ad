"""The cost of TLS + authentication on the API: SubmitJob and GetJob throughput.

Two brokers in this process over loopback gRPC, the same store kind (SQLite in a temp
dir) and settings; one with TLS + a bearer token (argon2-verified once, then cached)
and authorization + audit on every call, the other in insecure dev mode (plaintext, no
auth): the in-run baseline. Each phase runs ``--threads`` client threads (a channel
each) for ``--seconds``; rounds alternate secure/insecure so a noisy neighbour hits
both; medians are reported. Ratio = secure / insecure throughput (goal >= 0.8).

    .venv/bin/python benchmarks/bench_auth.py [--seconds 3] [--rounds 3] [--threads 4]
        [--out benchmarks/results/auth.json]
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
from concurrent import futures
from pathlib import Path

import grpc

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


def _spec(i: int) -> pb.JobSpec:
    return pb.JobSpec(name=f"bench-{i}", team="ml", priority_class="training",
                      resources=pb.Resources(nodes=1, gpus_per_node=1),
                      trainer=pb.TrainerSpec(total_steps=10, checkpoint_every=5, global_batch_size=8))


def _rate(address: str, creds: ClientCredentials, op: str, seconds: float, threads: int,
          job_id: str) -> float:
    """Calls per second of ``op`` ("submit" | "get") over ``threads`` channels."""
    counts = [0] * threads
    stop = threading.Event()

    def worker(k: int) -> None:
        with make_channel(address, creds) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            stub.GetJob(jpb.GetJobRequest(job_id=job_id), timeout=30)  # connect + warm the cache
            n = 0
            while not stop.is_set():
                if op == "submit":
                    stub.SubmitJob(jpb.SubmitJobRequest(spec=_spec(n)), timeout=30)
                else:
                    stub.GetJob(jpb.GetJobRequest(job_id=job_id), timeout=30)
                n += 1
                counts[k] = n

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    time.sleep(0.5)  # every thread connected and warm
    start = list(counts)
    t0 = time.perf_counter()
    time.sleep(seconds)
    done = sum(counts) - sum(start)
    elapsed = time.perf_counter() - t0
    stop.set()
    for t in ts:
        t.join(timeout=60)
    return done / elapsed


class _Echo(capacity_pb2_grpc.CapacityServiceServicer):
    """A servicer that does nothing: what TLS alone costs a tiny RPC."""

    def ListRegions(self, request: cpb.ListRegionsRequest, context: object) -> cpb.ListRegionsResponse:  # noqa: N802
        return cpb.ListRegionsResponse()


def _bare_rates(key: bytes, cert: bytes, ca: str, seconds: float, threads: int,
                rounds: int) -> dict[str, float]:
    """Median calls/s of an empty RPC, plaintext vs TLS, on one bare gRPC server:
    attributes the cost to the transport (gRPC's TLS) versus our auth layer."""
    server = grpc.server(futures.ThreadPoolExecutor(32))
    capacity_pb2_grpc.add_CapacityServiceServicer_to_server(_Echo(), server)
    plain_port = server.add_insecure_port("127.0.0.1:0")
    tls_port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    server.start()
    out: dict[str, list[float]] = {"plaintext": [], "tls": []}
    try:
        for _ in range(rounds):
            for mode, port, creds in (("plaintext", plain_port, ClientCredentials(insecure=True)),
                                      ("tls", tls_port, ClientCredentials(ca=ca))):
                counts = [0] * threads
                stop = threading.Event()

                def worker(k: int, port: int = port, creds: ClientCredentials = creds,
                           stop: threading.Event = stop, counts: list[int] = counts) -> None:
                    with make_channel(f"127.0.0.1:{port}", creds) as ch:
                        stub = capacity_pb2_grpc.CapacityServiceStub(ch)
                        while not stop.is_set():
                            stub.ListRegions(cpb.ListRegionsRequest(), timeout=30)
                            counts[k] += 1

                ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
                for t in ts:
                    t.start()
                time.sleep(0.5)
                a = sum(counts)
                time.sleep(seconds)
                out[mode].append((sum(counts) - a) / seconds)
                stop.set()
                for t in ts:
                    t.join(timeout=60)
    finally:
        server.stop(0)
    return {k: statistics.median(v) for k, v in out.items()}


def _broker(tmp: Path, name: str, **kw: object) -> tuple[BrokerServer, str]:
    server = BrokerServer(BrokerConfig(
        listen="127.0.0.1:0", agent_listen="127.0.0.1:0", store=f"sqlite:///{tmp / name}.sqlite",
        checkpoint_root=str(tmp / "ckpt"), scheduler_interval_s=5.0, **kw))  # type: ignore[arg-type]
    port = server.start()
    return server, f"127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "auth.json"))
    args = p.parse_args(argv)
    samples: dict[str, list[float]] = {f"{op}_{mode}": [] for op in ("submit", "get")
                                       for mode in ("tls_auth", "insecure")}
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        tmpd = Path(tmp)
        pki = create_dev_pki(tmpd / "pki", agents=[],
                             users=[("op", Role.OPERATOR, ""), ("bench", Role.MEMBER, "ml")])
        secure, s_addr = _broker(tmpd, "secure", **pki.broker_settings)
        insecure, i_addr = _broker(tmpd, "insecure", insecure_dev=True)
        ca = str(pki.ca.ca_cert_path)
        try:
            for addr, creds in ((s_addr, ClientCredentials(ca=ca, token=pki.tokens["op"])),
                                (i_addr, ClientCredentials(insecure=True))):
                with make_channel(addr, creds) as ch:
                    capacity_pb2_grpc.CapacityServiceStub(ch).SetTeamQuota(cpb.SetTeamQuotaRequest(
                        quota=cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])))
            user = ClientCredentials(ca=ca, token=pki.tokens["bench"])  # a member, by token
            plain = ClientCredentials(insecure=True)
            jobs = {}
            for mode, addr, creds in (("tls_auth", s_addr, user), ("insecure", i_addr, plain)):
                with make_channel(addr, creds) as ch:
                    jobs[mode] = jobs_pb2_grpc.JobServiceStub(ch).SubmitJob(
                        jpb.SubmitJobRequest(spec=_spec(-1))).job.id
            for rnd in range(args.rounds):
                modes = [("tls_auth", s_addr, user), ("insecure", i_addr, plain)]
                if rnd % 2:
                    modes.reverse()
                for op in ("get", "submit"):
                    for mode, addr, creds in modes:
                        r = _rate(addr, creds, op, args.seconds, args.threads, jobs[mode])
                        samples[f"{op}_{mode}"].append(r)
                        print(f"round {rnd + 1}/{args.rounds} {op:6s} {mode:8s} {r:8.0f} calls/s",
                              flush=True)
            bare = _bare_rates(Path(pki.broker.key).read_bytes(), Path(pki.broker.cert).read_bytes(),
                               ca, args.seconds, args.threads, args.rounds)
            print(f"bare gRPC empty RPC: {bare['tls']:.0f}/s TLS vs {bare['plaintext']:.0f}/s plaintext")
        finally:
            secure.stop(0.5)
            insecure.stop(0.5)
    med = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "threads": args.threads, "seconds": args.seconds, "rounds": args.rounds,
        "submit_per_s": {"tls_auth": med["submit_tls_auth"], "insecure": med["submit_insecure"]},
        "get_per_s": {"tls_auth": med["get_tls_auth"], "insecure": med["get_insecure"]},
        "submit_ratio": med["submit_tls_auth"] / med["submit_insecure"],
        "get_ratio": med["get_tls_auth"] / med["get_insecure"],
        "goal_ratio": 0.8,
        # The same for an empty RPC on a bare gRPC server (no broker, no auth): the part
        # of the cost that is gRPC's TLS transport itself.
        "bare_grpc_per_s": bare,
        "bare_tls_ratio": bare["tls"] / bare["plaintext"],
        "samples": samples,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}",
    }
    print(f"SubmitJob: {med['submit_tls_auth']:.0f}/s with TLS+auth vs {med['submit_insecure']:.0f}/s"
          f" without: ratio {result['submit_ratio']:.2f}")
    print(f"GetJob:    {med['get_tls_auth']:.0f}/s with TLS+auth vs {med['get_insecure']:.0f}/s"
          f" without: ratio {result['get_ratio']:.2f} (goal >= 0.8)")
    print(f"bare gRPC TLS vs plaintext: ratio {result['bare_tls_ratio']:.2f} (the transport's share)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
