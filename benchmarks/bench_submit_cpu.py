"""Broker CPU per SubmitJob, from /proc: TLS, a bearer token, ~3 KB specs, 16 clients.

Why CPU time and not the rate: the benchmark machine is shared (load average often
15-30 on 2 cores); the broker's rate moves with the neighbours' load, the CPU time
its process spends per answered call much less. Each figure is read from
``/proc/<broker>/stat`` (user + system, all threads) around a phase.

One broker process (``brokerctl serve``, SQLite in a temp dir, TLS on its port, tokens
from a dev PKI's ``tokens.yaml``) per backlog size. Per run, in the same broker:

* a **calibration no-op**: ``GetJob(job_id="")`` by the same clients, over TLS with the
  token (authenticated, refused INVALID_ARGUMENT before any store read): what gRPC,
  TLS and the auth layer cost a call, so the submit's own share is the difference;
* **SubmitJob** of a ~3.5 KB spec (env, labels, command, regions, trainer settings), each
  with its own client request id, by 16 clients (grpc.aio coroutines, one TLS
  connection each) in this process.

``--runs`` runs (default 3); the median is reported with every run. ``--pending``
lists backlog sizes (default ``0,50000``): that many pending jobs are written through
the store's batched create before the broker starts (no agents: they stay pending,
in the scheduler's live set), and the broker's RSS is read after it has loaded them
and after the runs, next to the empty store's: ``rss_per_pending_kb``.

    .venv/bin/python benchmarks/bench_submit_cpu.py [--seconds 4] [--runs 3]
        [--pending 0,50000] [--out benchmarks/results/submit_cpu.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

import grpc  # noqa: E402

from benchmarks.procstats import pct, proc_cpu_s, rss_kb, tree_cpu_s  # noqa: E402
from broker.auth.devca import create_dev_pki  # noqa: E402
from broker.auth.identity import Role  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.ids import new_job_id  # noqa: E402
from broker.jobs import transitions  # noqa: E402
from broker.malloc_arenas import TRIM_INTERVAL_S  # noqa: E402
from broker.store import open_store  # noqa: E402
from computebroker.v1 import common_pb2 as pb  # noqa: E402
from computebroker.v1 import jobs_pb2 as jpb  # noqa: E402
from computebroker.v1 import jobs_pb2_grpc  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "submit_cpu.json"
TEAM = "ml"
CLIENTS = 16
GOAL_CPU_MS, GOAL_BACKLOG_RATIO, GOAL_RSS_KB_PER_PENDING = 0.5, 1.2, 4.0
GOAL_P99_MS, GOAL_P99_MS_BACKLOG, GOAL_RSS_MB_BACKLOG = 50.0, 100.0, 300.0


def spec(i: int, rng: random.Random) -> pb.JobSpec:
    """A ~3.5 KB spec, shaped like a real training job's."""
    s = pb.JobSpec(
        name=f"llama-ft-{i:07d}", team=TEAM, priority_class="training",
        command=["python", "-m", "train", "--config", "configs/llama3_8b_ft.yaml",
                 "--data", "s3://datasets/corpus/v7/shards/", "--lr", "3e-5", "--warmup", "2000"],
        allowed_regions=["us-east-2", "us-west-2", "eu-west-1"], preferred_regions=["us-east-2"],
        dataset_uri="s3://datasets/corpus/v7/", dataset_region="us-east-2",
        expected_duration_s=7200.0,
    )
    s.resources.nodes = rng.choice([1, 1, 2, 4])
    s.resources.gpus_per_node = 8
    s.resources.accelerator = "h100"
    s.trainer.checkpoint_every = 500
    for k in range(40):
        s.env[f"TRAIN_SETTING_{k:02d}"] = f"value-{k}-" + "x" * 40
    for k in range(12):
        s.labels[f"example.com/label-{k}"] = f"v{k}-{rng.randrange(1000)}"
    return s


def populate_pending(url: str, n: int) -> None:
    """``n`` pending jobs of team ``ml`` through the store's batched create, each made by
    the submit transition (``broker.jobs.transitions.submit``) as a SubmitJob with no
    agent registered makes it: the same fields, event and pending reason, so the first
    scheduler pass has nothing to rewrite in them (a hand-made job without a pending
    reason got one written by that pass: 50,000 writes during the measurement)."""
    if n <= 0:
        return
    store = open_store(url)
    rng = random.Random(3)
    batch: list[tuple[pb.Job, list[pb.JobEvent]]] = []
    config = BrokerConfig()
    for i in range(n):
        s = spec(i, rng)
        s.name = f"backlog-{i:07d}"
        out = transitions.submit(transitions.Submit(
            job_id=new_job_id(), spec=s, client_request_id="", actor="user:bench",
            regions_known=False), time.time(), config)
        batch.append((out.job, list(out.events)))
        if len(batch) == 1000 or i == n - 1:
            for r in store.create_jobs(batch):
                if isinstance(r, Exception):
                    raise r
            batch = []
    store.close()


class Broker:
    """``brokerctl serve`` with TLS and the dev PKI's tokens, as an operator runs it."""

    def __init__(self, workdir: Path, store_url: str, settings: dict[str, str]) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'proto'}")
        self.log = open(workdir / "broker.log", "ab")  # noqa: SIM115 - closed in stop()
        sets = [x for k, v in settings.items() for x in ("--set", f"{k}={v}")]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "brokerctl", "serve", "--listen", self.address, "--store", store_url,
             "--checkpoint-root", str(workdir / "ckpt"), "--set", "agent_listen=127.0.0.1:0", *sets],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def phase(stubs: list[jobs_pb2_grpc.JobServiceStub], meta: tuple, seconds: float,
                call_of, pid: int) -> dict:  # noqa: ANN001
    """``len(stubs)`` clients back to back for ``seconds``: latency, and the broker's CPU per call."""
    lat: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    b0, c0 = tree_cpu_s(pid), proc_cpu_s(pid)

    async def client(c: int) -> None:
        nonlocal errors
        rng = random.Random(c)
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                await call_of(stubs[c], rng)
                lat.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                errors += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(c) for c in range(len(stubs))))
    wall = time.monotonic() - t0
    n = max(1, len(lat) + errors)
    return {"calls": len(lat), "errors": errors, "rate_per_s": round(len(lat) / wall, 1),
            "p50_ms": round(pct(lat, 50) * 1000, 2), "p99_ms": round(pct(lat, 99) * 1000, 2),
            "broker_cpu_ms_per_call": round((tree_cpu_s(pid) - b0) * 1000 / n, 3),
            "core_cpu_ms_per_call": round((proc_cpu_s(pid) - c0) * 1000 / n, 3)}


async def measure(broker: Broker, ca: bytes, token: str, op_token: str, seconds: float,
                  runs: int, say) -> dict:  # noqa: ANN001
    creds = grpc.ssl_channel_credentials(root_certificates=ca)
    channels = [grpc.aio.secure_channel(broker.address, creds,
                                        options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(CLIENTS)]
    meta = (("authorization", f"Bearer {token}"),)
    try:
        deadline = time.monotonic() + 120
        while True:  # the broker may still be loading its backlog
            try:
                await asyncio.wait_for(channels[0].channel_ready(), timeout=5)
                break
            except TimeoutError:
                if time.monotonic() > deadline or broker.proc.poll() is not None:
                    raise RuntimeError("broker did not come up (see broker.log)") from None
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), timeout=60)
        stubs = [jobs_pb2_grpc.JobServiceStub(ch) for ch in channels]
        from computebroker.v1 import capacity_pb2 as cpb
        from computebroker.v1 import capacity_pb2_grpc

        await capacity_pb2_grpc.CapacityServiceStub(channels[0]).SetTeamQuota(cpb.SetTeamQuotaRequest(
            quota=cpb.TeamQuota(team=TEAM, quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])),
            metadata=(("authorization", f"Bearer {op_token}"),))
        tag = uuid.uuid4().hex[:6]
        seq = itertools.count()

        async def noop(stub, rng):  # noqa: ANN001, ARG001
            try:
                await stub.GetJob(jpb.GetJobRequest(job_id=""), metadata=meta)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    raise

        async def submit(stub, rng):  # noqa: ANN001
            rid = f"{tag}-{next(seq)}"
            r = await stub.SubmitJob(jpb.SubmitJobRequest(spec=spec(next(seq), rng),
                                                          client_request_id=rid), metadata=meta)
            if not r.created:
                raise RuntimeError(f"request id {rid} was not new")

        await phase(stubs, meta, 1.0, submit, broker.proc.pid)  # warm-up (caches, token)
        out: dict = {"runs": []}
        if not runs:
            return out
        for r in range(runs):
            n = await phase(stubs, meta, seconds, noop, broker.proc.pid)
            s = await phase(stubs, meta, seconds, submit, broker.proc.pid)
            s["minus_noop_ms"] = round(s["broker_cpu_ms_per_call"] - n["broker_cpu_ms_per_call"], 3)
            out["runs"].append({"noop": n, "submit": s, "loadavg_1m": os.getloadavg()[0]})
            say(f"    run {r + 1}: submit {s['broker_cpu_ms_per_call']:.3f} ms CPU/call "
                f"(core {s['core_cpu_ms_per_call']:.3f}) "
                f"({s['rate_per_s']:.0f}/s, p99 {s['p99_ms']:.0f} ms), no-op "
                f"{n['broker_cpu_ms_per_call']:.3f} ms, load {os.getloadavg()[0]:.1f}")
        med = {k: statistics.median(x["submit"][k] for x in out["runs"])
               for k in ("broker_cpu_ms_per_call", "minus_noop_ms", "rate_per_s", "p50_ms", "p99_ms")}
        med["noop_cpu_ms_per_call"] = statistics.median(x["noop"]["broker_cpu_ms_per_call"]
                                                        for x in out["runs"])
        out["median"] = med
        return out
    finally:
        for ch in channels:
            await ch.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--pending", default="0,50000")
    p.add_argument("--label", default="", help="a name for this build in the JSON (e.g. before/after)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra broker settings")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, flush=True)

    result: dict = {
        "benchmark": "submit_cpu", "label": args.label,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start": list(os.getloadavg())},
        "setup": {"clients": CLIENTS, "seconds_per_phase": args.seconds, "runs": args.runs,
                  "spec_bytes": len(spec(0, random.Random(1)).SerializeToString()),
                  "transport": "TLS + bearer token (member of the team)", "store": "sqlite",
                  "broker_settings": dict(kv.split("=", 1) for kv in args.set),
                  "cpu_of": "the broker process and its children (API worker processes)"},
        "goals": {"broker_cpu_ms_per_submit": GOAL_CPU_MS, "backlog_ratio": GOAL_BACKLOG_RATIO,
                  "rss_kb_per_pending": GOAL_RSS_KB_PER_PENDING, "p99_ms": GOAL_P99_MS,
                  "p99_ms_backlog": GOAL_P99_MS_BACKLOG, "rss_mb_backlog": GOAL_RSS_MB_BACKLOG},
        "backlogs": {},
    }
    empty_rss = 0
    for n in [int(x) for x in args.pending.split(",")]:
        with tempfile.TemporaryDirectory(prefix="bench-submit-cpu-") as tmp:
            tmpd = Path(tmp)
            pki = create_dev_pki(tmpd / "pki", agents=[],
                                 users=[("op", Role.OPERATOR, ""), ("bench", Role.MEMBER, TEAM)])
            url = f"sqlite:///{tmpd / 'broker.sqlite'}"
            say(f"backlog {n} pending: populating ...")
            populate_pending(url, n)
            settings = dict(pki.broker_settings)
            settings.update(kv.split("=", 1) for kv in args.set)
            broker = Broker(tmpd, url, settings)
            try:
                out = asyncio.run(measure(broker, pki.ca.ca_pem, pki.tokens["bench"],
                                          pki.tokens["op"], 2.0, 0, say))
                # a scheduler pass over the backlog has run, and the broker's periodic
                # return of freed memory (broker/malloc_arenas.py) after the warm-up
                time.sleep(TRIM_INTERVAL_S + 1)
                rss_loaded = rss_kb(broker.proc.pid)
                out = asyncio.run(measure(broker, pki.ca.ca_pem, pki.tokens["bench"],
                                          pki.tokens["op"], args.seconds, args.runs, say))
                out["pending_at_start"] = n
                out["rss_kb_loaded"] = rss_loaded
                out["rss_kb_end"] = rss_kb(broker.proc.pid)
                if n == 0:
                    empty_rss = rss_loaded
                elif empty_rss:
                    out["rss_per_pending_kb"] = round((rss_loaded - empty_rss) / n, 2)
                result["backlogs"][str(n)] = out
            finally:
                broker.stop()
    b = result["backlogs"]
    if "0" in b:
        base = b["0"]["median"]["broker_cpu_ms_per_call"]
        for v in b.values():
            v["cpu_ratio_vs_empty"] = round(v["median"]["broker_cpu_ms_per_call"] / base, 3) if base else 0.0
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for k, v in b.items():
        say(f"pending {k}: {v['median']['broker_cpu_ms_per_call']:.3f} ms CPU per submit "
            f"(no-op {v['median']['noop_cpu_ms_per_call']:.3f}), p99 {v['median']['p99_ms']} ms, "
            f"RSS {v['rss_kb_loaded'] / 1024:.0f} MB" +
            (f", {v['rss_per_pending_kb']} KB per pending job" if "rss_per_pending_kb" in v else ""))
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
