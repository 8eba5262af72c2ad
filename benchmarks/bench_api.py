"""Broker API throughput against a real broker process (``brokerctl serve``).

What it measures, per store (SQLite file, then a local redis-server):

* the same server's **no-op RPC rate**: the ceiling of its gRPC path (interceptors,
  thread hand-off, (de)serialisation) with no store access at all. It is
  ``grpc.health.v1.Health/Check`` when the broker serves it, else ``GetJob`` with an
  empty id (rejected INVALID_ARGUMENT before any store read). Measured at 1, 16 and
  64 concurrent clients, in the same run as the figures below;
* **SubmitJob** sustained with 1, 16 and 64 concurrent clients, each request a
  realistic ~2 KB spec (env, labels, command, regions, trainer settings) with its
  own client request id;
* **GetJob** (16 clients, random ids among 100k stored jobs) and **ListJobs** pages
  (page_size 100, 16 clients, following page tokens from random starting points)
  at 100k stored jobs. The 100k are written before the broker starts, straight
  through the store's batched create (``Store.create_jobs``, the group-commit
  path) as finished jobs of 20 teams: history a busy broker keeps, that the
  scheduler's live-job read never touches;
* **WatchJob fan-out**: 1,000 watchers on one job; the job is cancelled and each
  watcher's delay from the cancel to its terminal event is recorded (a few rounds).

Each figure is p50/p99 latency and rate; the ratio of SubmitJob's rate to the
no-op rate at the same concurrency is the figure to compare across machines (the
benchmark machine is shared: absolute rates move with the load, the ratio much
less). Clients are grpc.aio coroutines in this process, one channel (and connection)
per client up to 16: they share the machine's cores with the broker, as on a 2-core
box they must.

Each store is measured once per ``--api-workers`` value (default ``0,2``): 0 is one
broker process; N runs the broker with ``api_workers=N`` (docs/architecture.md "API
worker processes"), the JSON key then being ``<store>_workers<N>``. "Broker CPU" is
the CPU time of the broker process and its worker processes together.
The broker runs ``--insecure-dev`` (loopback, plaintext, no tokens): what TLS and
token authentication add per call is measured by ``benchmarks/bench_auth.py``.

    .venv/bin/python benchmarks/bench_api.py [--seconds 3] [--jobs 100000] [--watchers 1000]
        [--stores sqlite,redis] [--api-workers 0,2] [--broker-set KEY=VALUE ...] [--out PATH]

Writes benchmarks/results/api.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

import grpc  # noqa: E402

from broker.ids import new_job_id  # noqa: E402
from broker.store import open_store  # noqa: E402
from computebroker.v1 import common_pb2 as pb  # noqa: E402
from computebroker.v1 import jobs_pb2 as jpb  # noqa: E402
from computebroker.v1 import jobs_pb2_grpc  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "api.json"
TEAMS = [f"team-{i:02d}" for i in range(20)]
CONCURRENCY = (1, 16, 64)
GOAL_RATE, GOAL_P99_MS, GOAL_RATIO = 1500.0, 50.0, 0.5  # SubmitJob at 16 clients (issue 16)


def spec(i: int, rng: random.Random) -> pb.JobSpec:
    """A ~2 KB spec, shaped like a real training job's."""
    s = pb.JobSpec(
        name=f"llama-ft-{i:07d}", team=rng.choice(TEAMS), priority_class="training",
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
    for k in range(24):
        s.env[f"TRAIN_SETTING_{k:02d}"] = f"value-{k}-" + "x" * 40
    for k in range(8):
        s.labels[f"example.com/label-{k}"] = f"v{k}-{rng.randrange(1000)}"
    return s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()
    return proc, port


def populate(url: str, n: int, progress: Callable[[str], None]) -> list[str]:
    """``n`` finished jobs written through the store's batched create (before the broker starts)."""
    store = open_store(url)
    rng = random.Random(3)
    ids: list[str] = []
    batch: list[tuple[pb.Job, list[pb.JobEvent]]] = []
    proto = spec(0, rng)
    t0 = time.monotonic()
    for i in range(n):
        jid = new_job_id()
        job = pb.Job(id=jid, phase=rng.choice([pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED,
                                               pb.JOB_PHASE_CANCELLED]),
                     created_time=time.time(), updated_time=time.time())
        job.spec.CopyFrom(proto)
        job.spec.team = TEAMS[i % len(TEAMS)]
        job.spec.name = f"history-{i:07d}"
        batch.append((job, [pb.JobEvent(type="submitted", to_phase=pb.JOB_PHASE_PENDING)]))
        ids.append(jid)
        if len(batch) == 1000 or i == n - 1:
            for r in store.create_jobs(batch):
                if isinstance(r, Exception):
                    raise r
            batch = []
            if (i + 1) % 20000 == 0 or i == n - 1:
                progress(f"  populated {i + 1}/{n} jobs ({time.monotonic() - t0:.1f}s)")
    store.close()
    return ids


class Broker:
    def __init__(self, store_url: str, workdir: str, settings: list[str] | None = None,
                 api_workers: int = 0) -> None:
        self.port = free_port()
        workers = (["--set", f"api_workers={api_workers}", "--set",
                    f"agent_listen=127.0.0.1:{free_port()}"] if api_workers else [])
        self.address = f"127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'proto'}")
        self.log = open(Path(workdir) / "broker.log", "wb")  # noqa: SIM115 - closed in stop()
        # Every WatchJob stream holds a server thread and a slot of the stream budget
        # (broker/server.py, broker/api/streams.py): the fan-out's 1,000 watchers are one
        # identity (insecure dev) from one address, above the default caps (512 user
        # streams, 128 per identity, 256 per peer address), which would refuse most of
        # them RESOURCE_EXHAUSTED.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "brokerctl", "serve", "--listen", self.address, "--store", store_url,
             "--checkpoint-root", str(Path(workdir) / "ckpt"), "--set", "max_workers=1200",
             "--set", "max_streams=1200", "--set", "max_streams_per_identity=1200",
             "--set", "max_streams_per_peer=1200",
             "--set", "auto_create_teams=true", "--insecure-dev", *workers,
             *(x for kv in settings or () for x in ("--set", kv))],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(lat: list[float], seconds: float, errors: int = 0) -> dict:
    return {"requests": len(lat), "errors": errors, "rate_per_s": round(len(lat) / seconds, 1),
            "p50_ms": round(pct(lat, 50) * 1000, 2), "p99_ms": round(pct(lat, 99) * 1000, 2)}


BROKER_PID = 0  # the broker process measured (its CPU time per request goes with each figure)


def _own_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """``pid``'s live child processes (its API workers), from /proc."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) and of its live
    children (the API workers, ``api_workers`` > 0), from /proc."""
    return _own_cpu(pid) + sum(_own_cpu(c) for c in children(pid))


async def sustained(channels: list[grpc.aio.Channel], clients: int, seconds: float,
                    call: Callable[[jobs_pb2_grpc.JobServiceStub, int, random.Random], Awaitable[object]],
                    ) -> dict:
    """``clients`` coroutines calling back to back for ``seconds``; latency of each call,
    and the CPU time the broker and this client process spent per answered call (on a
    shared machine the rate moves with the load, CPU per call much less)."""
    lat: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    b0, c0 = cpu_seconds(BROKER_PID), time.process_time()

    async def client(c: int) -> None:
        nonlocal errors
        stub = jobs_pb2_grpc.JobServiceStub(channels[c % len(channels)])
        rng = random.Random(c)
        k = 0
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                await call(stub, c * 10_000_000 + k, rng)
                lat.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                errors += 1
            k += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(c) for c in range(clients)))
    out = summary(lat, time.monotonic() - t0, errors)
    n = max(1, len(lat) + errors)
    out["broker_cpu_ms_per_call"] = round((cpu_seconds(BROKER_PID) - b0) * 1000 / n, 3)
    out["client_cpu_ms_per_call"] = round((time.process_time() - c0) * 1000 / n, 3)
    return out


def noop_call():
    """``GetJob`` with an empty id: rejected before any store access (the fallback no-op)."""
    async def call(stub, i, rng):  # noqa: ANN001, ARG001
        try:
            await stub.GetJob(jpb.GetJobRequest(job_id=""))
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
    return call


async def probe_noop(channel: grpc.aio.Channel) -> str:
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return "health"
    except (ImportError, grpc.aio.AioRpcError):
        return "getjob_invalid"


async def watch_round(channels: list[grpc.aio.Channel], job_id: str, watchers: int) -> list[float]:
    """``watchers`` streams on one job; once all have its history (or gave up), cancel
    it and return each stream's delay from the cancel to its terminal event. A stream
    told UNAVAILABLE ("retry in a second") retries, as the SDK does, up to 5 times."""
    state = {"started": 0, "failed": 0, "t_cancel": 0.0}
    ready = asyncio.Event()
    got: list[float] = []

    def settle(key: str) -> None:
        state[key] += 1
        if state["started"] + state["failed"] == watchers:
            ready.set()

    async def watch(w: int) -> None:
        s = jobs_pb2_grpc.JobServiceStub(channels[w % len(channels)])
        seen_start = False
        for _attempt in range(6):
            try:
                async for ev in s.WatchJob(jpb.WatchJobRequest(job_id=job_id)):
                    if ev.type == "submitted" and not seen_start:
                        seen_start = True
                        settle("started")
                    if ev.to_phase == pb.JOB_PHASE_CANCELLED:
                        got.append(time.perf_counter() - state["t_cancel"])
                        return
                return
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    break
                await asyncio.sleep(1.0)
        if not seen_start:
            settle("failed")

    tasks = [asyncio.create_task(watch(w)) for w in range(watchers)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ready.wait(), timeout=60)
    state["t_cancel"] = time.perf_counter()
    await jobs_pb2_grpc.JobServiceStub(channels[0]).CancelJob(
        jpb.CancelJobRequest(job_id=job_id, reason="bench"))
    _, pending = await asyncio.wait(tasks, timeout=60)
    for t in pending:
        t.cancel()
    return got


async def watch_fanout(channels: list[grpc.aio.Channel], watchers: int, rounds: int) -> dict:
    stub = jobs_pb2_grpc.JobServiceStub(channels[0])
    rng = random.Random(5)
    lat: list[float] = []
    spans: list[float] = []
    for r in range(rounds):
        job = (await stub.SubmitJob(jpb.SubmitJobRequest(spec=spec(r, rng)))).job
        got = await watch_round(channels, job.id, watchers)
        lat += got
        spans.append(max(got) if got else 0.0)
    span = sum(spans)
    return {"watchers": watchers, "rounds": rounds, "delivered": len(lat),
            "missing": watchers * rounds - len(lat),
            "p50_ms": round(pct(lat, 50) * 1000, 2), "p99_ms": round(pct(lat, 99) * 1000, 2),
            "deliveries_per_s": round(len(lat) / span, 1) if span else 0.0}


async def run_one(address: str, ids: list[str], args: argparse.Namespace, say: Callable[[str], None]) -> dict:
    # One connection per client (gRPC would otherwise share one subchannel among channels
    # to the same target): 16 clients are 16 connections, as 16 users' machines are, and
    # with API workers the kernel spreads connections, not calls, over the processes.
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(16)]
    try:
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), timeout=60)
        kind = await probe_noop(channels[0])
        noop = noop_call()
        out: dict = {"noop_rpc": "grpc.health.v1.Health/Check" if kind == "health"
                     else "GetJob(job_id='') -> INVALID_ARGUMENT (no store access)"}
        if kind == "health":
            async def noop_bound(stub, i, rng):  # noqa: ANN001
                from grpc_health.v1 import health_pb2, health_pb2_grpc
                await health_pb2_grpc.HealthStub(channels[i // 10_000_000 % 16]).Check(
                    health_pb2.HealthCheckRequest())
            noop = noop_bound
        run_tag = uuid.uuid4().hex[:6]
        seq = itertools.count()

        async def submit(stub, i, rng):  # noqa: ANN001
            rid = f"{run_tag}-{next(seq)}"  # unique: every submit must create a job
            r = await stub.SubmitJob(jpb.SubmitJobRequest(spec=spec(i, rng), client_request_id=rid))
            if not r.created:
                raise RuntimeError(f"request id {rid} was not new: the broker returned an old job")

        out["spec_bytes"] = len(spec(0, random.Random(1)).SerializeToString())
        for c in CONCURRENCY:
            say(f"  no-op RPC, {c} clients ...")
            out[f"noop_c{c}"] = await sustained(channels, c, args.seconds, noop)
            say(f"  SubmitJob, {c} clients ...")
            out[f"submit_c{c}"] = await sustained(channels, c, args.seconds, submit)
            ceiling = out[f"noop_c{c}"]["rate_per_s"]
            out[f"submit_c{c}"]["ratio_vs_noop"] = (
                round(out[f"submit_c{c}"]["rate_per_s"] / ceiling, 3) if ceiling else 0.0)

        async def get(stub, i, rng):  # noqa: ANN001
            await stub.GetJob(jpb.GetJobRequest(job_id=rng.choice(ids)))

        say("  GetJob, 16 clients ...")
        out["get_c16"] = await sustained(channels, 16, args.seconds, get)
        tokens: dict[int, str] = {}

        async def page(stub, i, rng):  # noqa: ANN001
            c = i // 10_000_000
            tok = tokens.get(c)
            if tok is None or rng.random() < 0.1:  # a new random starting point now and then
                import base64
                tok = base64.urlsafe_b64encode(rng.choice(ids).encode()).decode()
            r = await stub.ListJobs(jpb.ListJobsRequest(page_size=100, page_token=tok))
            tokens[c] = r.next_page_token

        say("  ListJobs pages of 100, 16 clients ...")
        out["list_c16"] = await sustained(channels, 16, args.seconds, page)
        say(f"  WatchJob fan-out to {args.watchers} watchers ...")
        out["watch"] = await watch_fanout(channels, args.watchers, args.watch_rounds)
        for k in ("get_c16", "list_c16"):
            ceiling = out["noop_c16"]["rate_per_s"]
            out[k]["ratio_vs_noop"] = round(out[k]["rate_per_s"] / ceiling, 3) if ceiling else 0.0
        s16 = out["submit_c16"]
        out["goal_c16"] = {  # issue 16's goal at 16 clients
            "rate_ge_1500": s16["rate_per_s"] >= GOAL_RATE, "p99_le_50ms": s16["p99_ms"] <= GOAL_P99_MS,
            "ratio_ge_0.5": s16["ratio_vs_noop"] >= GOAL_RATIO}
        return out
    finally:
        for ch in channels:
            await ch.close()


def measure(kind: str, args: argparse.Namespace, say: Callable[[str], None], api_workers: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        redis_proc = None
        if kind == "sqlite":
            url = f"sqlite:///{tmp}/broker.sqlite"
        else:
            redis_proc, port = start_redis(tmp)
            url = f"redis://127.0.0.1:{port}/0"
        try:
            say(f"{kind}: writing {args.jobs} finished jobs through the store ...")
            t0 = time.monotonic()
            ids = populate(url, args.jobs, say)
            populate_s = time.monotonic() - t0
            broker = Broker(url, tmp, args.broker_set, api_workers)
            global BROKER_PID
            BROKER_PID = broker.proc.pid
            load_start = os.getloadavg()
            try:
                out = asyncio.run(run_one(broker.address, ids, args, say))
            finally:
                broker.stop()
            out["load_avg_1m"] = {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)}
            text = (Path(tmp) / "broker.log").read_text(errors="replace")
            m = re.search(r"group commit: \d+ job creations in \d+ store writes \((\d+\.\d+) per write\)", text)
            if m:  # submits per store write (one SQLite transaction and fsync, or one Redis pipeline)
                out["jobs_per_store_write"] = float(m.group(1))
            m = re.search(r"\((\d+\.\d+) per commit\)", text)
            if m:  # SQLite: writes (a job batch, a record) per transaction, the whole run
                out["writes_per_commit"] = float(m.group(1))
            out["stored_jobs"] = args.jobs
            out["api_workers"] = api_workers
            out["populate_jobs_per_s"] = round(args.jobs / populate_s, 1)
            return out
        finally:
            if redis_proc is not None:
                redis_proc.terminate()
                redis_proc.wait(10)


def run_key(store: str, api_workers: int) -> str:
    """Where a run's figures sit in the JSON: the store's name for one process."""
    return store if not api_workers else f"{store}_workers{api_workers}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="each sustained measurement")
    ap.add_argument("--jobs", type=int, default=100_000, help="stored jobs for GetJob/ListJobs")
    ap.add_argument("--watchers", type=int, default=1000)
    ap.add_argument("--watch-rounds", type=int, default=3)
    ap.add_argument("--stores", default="sqlite,redis")
    ap.add_argument("--api-workers", default="0,2", metavar="N[,N...]",
                    help="broker api_workers settings to measure, each store with each (0 = one process)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--broker-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker setting for this run (e.g. scheduler_busy_share=0.05); recorded")
    args = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, flush=True)

    result: dict = {"machine": platform.platform(), "cpus": os.cpu_count(), "seconds": args.seconds,
                    "broker_settings": args.broker_set}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = [(kind, int(n)) for kind in args.stores.split(",") for n in args.api_workers.split(",")]
    for kind, n in runs:
        say(f"== {kind}, api_workers={n}")
        result[run_key(kind, n)] = measure(kind, args, say, n)
        out.write_text(json.dumps(result, indent=2) + "\n")  # each run's figures as soon as measured
    for kind, n in runs:
        r = result[run_key(kind, n)]
        kind = f"{kind}, api_workers={n}"
        say(f"\n{kind} ({r['stored_jobs']} stored jobs; no-op = {r['noop_rpc']};"
            f" load average {r['load_avg_1m']['start']} -> {r['load_avg_1m']['end']})")
        say(f"  {'measurement':<22}{'rate/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'vs no-op':>10}"
            f"{'broker CPU':>12}{'client CPU':>12}")
        for k in [f"noop_c{c}" for c in CONCURRENCY] + [f"submit_c{c}" for c in CONCURRENCY] + ["get_c16",
                                                                                                "list_c16"]:
            v = r[k]
            say(f"  {k:<22}{v['rate_per_s']:>10}{v['p50_ms']:>10}{v['p99_ms']:>10}"
                f"{v.get('ratio_vs_noop', ''):>10}{v['broker_cpu_ms_per_call']:>9} ms"
                f"{v['client_cpu_ms_per_call']:>9} ms")
        g = r["goal_c16"]
        say(f"  goal at 16 clients: >= {GOAL_RATE:.0f}/s {'met' if g['rate_ge_1500'] else 'NOT met'},"
            f" p99 <= {GOAL_P99_MS:.0f} ms {'met' if g['p99_le_50ms'] else 'NOT met'},"
            f" >= {GOAL_RATIO} of no-op {'met' if g['ratio_ge_0.5'] else 'NOT met'}"
            + (f"; {r['jobs_per_store_write']} submits per store write" if "jobs_per_store_write" in r else ""))
        w = r["watch"]
        say(f"  watch fan-out {w['watchers']} watchers x {w['rounds']}: p50 {w['p50_ms']} ms, p99 {w['p99_ms']}"
            f" ms, {w['deliveries_per_s']} deliveries/s, missing {w['missing']}")
    say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
