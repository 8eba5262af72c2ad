"""The live broker with many *running* jobs: agent streams carrying progress,
heartbeats and logs for thousands of attempts at once, plus submits and launches.

Why: the other benchmarks load the API (submits, lists) or the scheduler alone; a
leader's steady work in production is its agents' streams. This drives a real broker
process (``brokerctl serve``: TLS, the dev PKI's tokens, SQLite in a temp dir at
WAL + synchronous=FULL) with a fleet of fake region agents that speak the real
AgentService stream over mutual TLS, each with its own agent certificate:

* ``--agents`` agents (default 20) in ``--agent-procs`` processes (grpc.aio, one
  stream per agent), ``--nodes`` nodes (8 GPUs each) split between them;
* every Launch is acked and answered as a real agent does: STARTING with the ranks,
  then RUNNING; then each attempt reports progress every ``--report-s`` (10 s,
  +50 steps: one "progress" event per report at the broker's default of one every 50
  steps) and ships its log lines (``--log-lines`` per report, batched per attempt as
  the agent's log shipper does); heartbeats at the broker's interval list every
  running attempt with its progress, as the real agent's do;
* ``--submit-rate`` submits/s (default 20) by a member's token, and as many attempts
  a second finish (their last log lines, then SUCCEEDED), so the running count stays
  level while launches and ends flow.

Per size in ``--running`` (default ``1000,10000``; the smallest is the calibration,
each with a fresh broker, in the same run) the jobs are submitted and launched, then
a ``--seconds`` steady window measures:

* the broker's CPU (cores: user + system of all its threads from ``/proc``) and RSS,
  and the same over an idle window with the agents connected but no jobs (the floor);
* **progress-to-visible**: for every JobUpdate, send -> the broker's JobUpdateAck
  (sent after the write committed: from then on GetJob and WatchJob serve it); for
  ``--watched`` jobs, send -> the "progress" event arriving at each of ``--watchers``
  WatchJob streams per job (the fan-out), and send -> a GetJob poller seeing the step;
* **nothing dropped**: after the window the agents stop reporting (heartbeats go on)
  until every update is acked (at most two minutes), then the broker is stopped and
  its store read: each job's stored step against the last step its agent sent, and
  the log lines stored against the lines sent (per job, all jobs).

``--store`` picks the broker's state store: ``sqlite`` (the default above), ``redis``
(one redis-server, no replica) or ``redis-sentinel`` (the documented HA deployment on
loopback: a primary, two replicas and three Sentinels, ``min_replicas=all``, so every
acknowledged write waits for both replicas); the store check reads the same counts
from Redis.

``BENCH_BROKER_ROOT`` runs the broker from another tree (a before/after comparison);
``BENCH_BROKER_PREFIX`` puts a wrapper (e.g. a profiler) before ``-m brokerctl``.

    .venv/bin/python benchmarks/bench_running.py [--running 1000,10000] [--seconds 60]
        [--out benchmarks/results/running.json]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import multiprocessing as mp
import os
import platform
import random
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

import grpc  # noqa: E402

from benchmarks.procstats import pct, proc_cpu_s, rss_kb  # noqa: E402
from broker.auth.devca import create_dev_pki  # noqa: E402
from broker.auth.identity import Role  # noqa: E402
from computebroker.v1 import agent_pb2 as apb  # noqa: E402
from computebroker.v1 import agent_pb2_grpc, jobs_pb2_grpc  # noqa: E402
from computebroker.v1 import common_pb2 as pb  # noqa: E402
from computebroker.v1 import jobs_pb2 as jpb  # noqa: E402
from computebroker.v1 import logs_pb2 as lpb  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "running.json"
TEAM = "ml"
REGIONS = ("us-east-2", "us-west-2", "eu-west-1", "ap-south-1")
GPUS_PER_NODE = 8
STEPS_PER_REPORT = 50
TOTAL_STEPS = 10_000_000
PREFIX: list[str] = os.environ.get("BENCH_BROKER_PREFIX", "").split()  # e.g. a profiler
PROGRESS_WRITE_S = 2.0  # the broker's progress_write_interval_s (default)
POLLED = 5  # watched jobs also polled by GetJob (10 calls/s each)
GOAL_CPU_CORES, GOAL_P99_VISIBLE_S = 1.0, 1.0
AS = apb


def lat_summary(xs: list[float]) -> dict:
    return {"n": len(xs), "p50_ms": round(pct(xs, 50) * 1000, 1), "p99_ms": round(pct(xs, 99) * 1000, 1),
            "max_ms": round(max(xs, default=0.0) * 1000, 1)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_ids(n: int) -> list[tuple[str, str]]:
    """(region, agent id) of ``n`` agents, spread over the regions."""
    return [(REGIONS[i % len(REGIONS)], f"bench-agent-{i:02d}") for i in range(n)]


def job_spec(i: int) -> pb.JobSpec:
    """A 1-GPU training job (a few env vars and labels, like a real spec)."""
    s = pb.JobSpec(name=f"run-{i:06d}", team=TEAM, priority_class="training",
                   command=["python", "-m", "train", "--config", "configs/ft.yaml"],
                   allowed_regions=list(REGIONS), expected_duration_s=3600.0)
    s.resources.nodes = 1
    s.resources.gpus_per_node = 1
    s.trainer.total_steps = TOTAL_STEPS
    s.trainer.checkpoint_every = 1000
    for k in range(8):
        s.env[f"SETTING_{k}"] = f"value-{k}"
    return s


# ---- the fake agents (one process runs several) ------------------------------------------
@dataclass
class Attempt:
    job_id: str
    attempt: int
    step: int = 0
    offset: int = 0  # bytes of log output shipped
    lines: int = 0  # log lines shipped
    started: float = 0.0
    ending: bool = False


@dataclass
class AgentStats:
    """What one agent process sent and heard (merged by the orchestrator)."""

    updates_sent: int = 0
    acks: int = 0
    ack_lat: list[float] = field(default_factory=list)  # send -> JobUpdateAck, steady window
    chunks_sent: int = 0
    heartbeats: int = 0
    hb_acks: int = 0
    launches: int = 0
    finished: int = 0
    lines: dict[str, int] = field(default_factory=dict)  # job -> log lines sent
    last_step: dict[str, int] = field(default_factory=dict)  # job -> last step sent
    sent_at: dict[str, float] = field(default_factory=dict)  # "job:step" -> first send time
    unacked: int = 0
    errors: list[str] = field(default_factory=list)


class FakeAgent:
    """One region agent's stream: Register, heartbeats, acks, launches answered, attempts
    reporting progress and logs on a schedule. Nothing is simulated inside the broker."""

    def __init__(self, address: str, creds: grpc.ChannelCredentials, region: str, agent_id: str,
                 nodes: int, stats: AgentStats, cfg: dict) -> None:
        self.address, self.creds, self.region, self.agent_id = address, creds, region, agent_id
        self.nodes = [pb.Node(id=f"{agent_id}-n{i:03d}", region=region, zone=f"{region}-az1",
                              instance_type="p5.48xlarge", accelerator="h100", gpus=GPUS_PER_NODE,
                              healthy=True, capacity_type=pb.CAPACITY_TYPE_ON_DEMAND,
                              network_layer_3=f"{agent_id}-l3") for i in range(nodes)]
        self.stats, self.cfg = stats, cfg
        self.running: dict[str, Attempt] = {}
        self.queue: list[tuple[float, str, int]] = []  # (due, job, attempt) reports
        self.pending_acks: dict[tuple[str, int, int], list[float]] = {}  # (job, att, state) -> sends
        self.hb_interval = 2.0
        self.measuring = False
        self.call = None
        self.outq: asyncio.Queue[apb.AgentMessage] = asyncio.Queue()
        self.rng = random.Random(agent_id)

    async def send(self, msg: apb.AgentMessage) -> None:
        """Queue for the stream's one writer (grpc.aio allows one write in flight)."""
        self.outq.put_nowait(msg)

    async def writer(self) -> None:
        try:
            while True:
                await self.call.write(await self.outq.get())
        except asyncio.CancelledError:
            raise
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            self.stats.errors.append(f"{self.agent_id}: write failed: {e!r}"[:300])

    async def run(self, stop: asyncio.Event) -> None:
        channel = grpc.aio.secure_channel(self.address, self.creds, options=[
            ("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)])
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        self.call = stub.Connect()
        await self.send(apb.AgentMessage(register=apb.Register(
            agent_id=self.agent_id, region=self.region, nodes=self.nodes, executor="fake",
            checkpoint_bucket=f"/tmp/bench-ckpt-{self.region}", version="bench")))
        tasks = [asyncio.create_task(self.writer()), asyncio.create_task(self.read()), asyncio.create_task(self.beat(stop)),
                 asyncio.create_task(self.report_loop(stop))]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.call.cancel()
        await channel.close()

    async def read(self) -> None:
        try:
            while True:
                msg = await self.call.read()
                if msg is grpc.aio.EOF:
                    self.stats.errors.append(f"{self.agent_id}: stream ended")
                    return
                kind = msg.WhichOneof("cmd")
                if kind == "registered":
                    self.hb_interval = msg.registered.heartbeat_interval_s or 2.0
                elif kind == "heartbeat_ack":
                    self.stats.hb_acks += 1
                elif kind == "update_ack":
                    a = msg.update_ack
                    waiting = self.pending_acks.get((a.job_id, a.attempt, a.state))
                    if waiting:  # updates of one attempt are acked in order: the oldest
                        t0 = waiting.pop(0)
                        if not waiting:
                            del self.pending_acks[(a.job_id, a.attempt, a.state)]
                        self.stats.acks += 1
                        if self.measuring:
                            self.stats.ack_lat.append(time.time() - t0)
                elif kind == "launch":
                    await self.send(apb.AgentMessage(ack=apb.CommandAck(command_id=msg.command_id,
                                                                        accepted=True)))
                    asyncio.create_task(self.start(msg.launch))
                elif kind in ("stop", "checkpoint", "go", "drain"):
                    await self.send(apb.AgentMessage(ack=apb.CommandAck(command_id=msg.command_id,
                                                                        accepted=True)))
                    if kind == "stop":
                        a = self.running.pop(msg.stop.job_id, None)
                        if a is not None:
                            await self.update(a, AS.ATTEMPT_STATE_STOPPED)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as e:
            self.stats.errors.append(f"{self.agent_id}: {e.code().name} {e.details()}")

    async def update(self, a: Attempt, state: int) -> None:
        now = time.time()
        u = apb.JobUpdate(job_id=a.job_id, attempt=a.attempt, state=state, time=now, ranks=1)
        u.progress.CopyFrom(self.progress(a, now))
        self.pending_acks.setdefault((a.job_id, a.attempt, state), []).append(now)
        self.stats.updates_sent += 1
        self.stats.last_step[a.job_id] = a.step
        if state == AS.ATTEMPT_STATE_RUNNING:
            self.stats.sent_at.setdefault(f"{a.job_id}:{a.step}", now)
        await self.send(apb.AgentMessage(job_update=u))

    @staticmethod
    def progress(a: Attempt, now: float) -> pb.Progress:
        return pb.Progress(step=a.step, total_steps=TOTAL_STEPS, loss=2.0 / (1 + a.step / 1e4),
                           tokens_per_s=51234.5, samples_seen=a.step * 256, updated_time=now)

    async def start(self, launch: apb.Launch) -> None:
        self.stats.launches += 1
        a = Attempt(launch.job_id, launch.attempt, started=time.time())
        self.running[a.job_id] = a
        await self.update(a, AS.ATTEMPT_STATE_STARTING)
        await asyncio.sleep(0.2)
        if self.running.get(a.job_id) is not a:
            return
        await self.update(a, AS.ATTEMPT_STATE_RUNNING)
        # Spread the first reports over the interval: a fleet is never in phase.
        due = time.monotonic() + self.rng.uniform(0.5, self.cfg["report_s"])
        heapq.heappush(self.queue, (due, a.job_id, a.attempt))

    async def log_chunk(self, a: Attempt, n: int) -> None:
        lines = [f"step {a.step + k}: loss {2.0 / (1 + a.step / 1e4):.4f} lr 3.0e-05 "
                 f"tokens/s 51234.5 grad_norm 0.{self.rng.randrange(10**6):06d}" for k in range(n)]
        sizes = [len(x.encode()) + 1 for x in lines]
        chunk = lpb.LogChunk(job_id=a.job_id, attempt=a.attempt, rank=0, stream="stdout",
                             offset=a.offset, lines=lines, sizes=sizes, time=time.time())
        a.offset += sum(sizes)
        a.lines += n
        self.stats.lines[a.job_id] = self.stats.lines.get(a.job_id, 0) + n
        self.stats.chunks_sent += 1
        await self.send(apb.AgentMessage(log_chunk=chunk))

    async def report_loop(self, stop: asyncio.Event) -> None:
        """Progress + log chunk of every attempt whose report is due; and the churn: the
        oldest attempts finish at this agent's share of the submit rate."""
        finish_rate = self.cfg["finish_rate"]
        finish_credit = 0.0
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.05)
            now = time.monotonic()
            if self.cfg["quiet"].is_set():
                last = now
                continue
            if self.cfg["churn"].is_set():
                finish_credit += (now - last) * finish_rate
            last = now
            while self.queue and self.queue[0][0] <= now:
                _, job_id, attempt = heapq.heappop(self.queue)
                a = self.running.get(job_id)
                if a is None or a.attempt != attempt or a.ending:
                    continue
                a.step += STEPS_PER_REPORT
                if self.cfg["log_lines"]:
                    await self.log_chunk(a, self.cfg["log_lines"])
                await self.update(a, AS.ATTEMPT_STATE_RUNNING)
                heapq.heappush(self.queue, (now + self.cfg["report_s"], job_id, attempt))
            while finish_credit >= 1.0 and self.running:
                finish_credit -= 1.0
                a = min(self.running.values(), key=lambda x: x.started)
                a.ending = True
                del self.running[a.job_id]
                await self.log_chunk(a, 2)  # its last lines go before the end (as the agent's flush)
                await self.update(a, AS.ATTEMPT_STATE_SUCCEEDED)
                self.stats.finished += 1

    async def beat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.hb_interval)
            now = time.time()
            hb = apb.Heartbeat(time=now, running=[
                apb.RunningAttempt(job_id=a.job_id, attempt=a.attempt, state=AS.ATTEMPT_STATE_RUNNING,
                                   progress=self.progress(a, now))
                for a in self.running.values()])
            self.stats.heartbeats += 1
            await self.send(apb.AgentMessage(heartbeat=hb))


def agent_proc(address: str, ca: bytes, agents: list[tuple[str, str, bytes, bytes, int]], cfg: dict,
               ctl: mp.Queue, out: mp.Queue) -> None:
    """One process running several agents; ``ctl`` says when to measure, churn and stop."""
    async def main() -> None:
        stop = asyncio.Event()
        churn = asyncio.Event()
        cfg["churn"] = churn
        cfg["quiet"] = quiet = asyncio.Event()
        stats = AgentStats()
        fleet = [FakeAgent(address, grpc.ssl_channel_credentials(ca, key, cert), region, aid, nodes,
                           stats, cfg) for region, aid, cert, key, nodes in agents]
        tasks = [asyncio.create_task(a.run(stop)) for a in fleet]
        loop = asyncio.get_running_loop()
        while True:
            cmd = await loop.run_in_executor(None, ctl.get)
            if cmd == "churn":
                churn.set()
            elif cmd == "quiet":  # no new reports (heartbeats go on): the acks drain
                quiet.set()
            elif cmd == "measure":
                for a in fleet:
                    a.measuring = True
            elif cmd == "unmeasure":
                for a in fleet:
                    a.measuring = False
            elif cmd == "count":
                out.put(("count", sum(len(a.running) for a in fleet)))
            elif cmd == "unacked":
                out.put(("count", sum(len(v) for a in fleet for v in a.pending_acks.values())))
            elif cmd == "stop":
                break
        stats.unacked = sum(len(v) for a in fleet for v in a.pending_acks.values())
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        out.put(("stats", stats.__dict__))

    asyncio.run(main())


# ---- the broker ---------------------------------------------------------------------------
class Broker:
    """``brokerctl serve`` with TLS, the dev PKI's tokens and a mutual-TLS agent port."""

    def __init__(self, workdir: Path, store_url: str, settings: dict[str, str]) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.agent_address = f"127.0.0.1:{free_port()}"
        code = Path(os.environ.get("BENCH_BROKER_ROOT") or ROOT)  # another build's tree: before/after
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=f"{code}{os.pathsep}{code / 'proto'}")
        self.log = open(workdir / "broker.log", "ab")  # noqa: SIM115 - closed in stop()
        sets = [x for k, v in settings.items() for x in ("--set", f"{k}={v}")]
        self.proc = subprocess.Popen(
            [sys.executable, *PREFIX, "-m", "brokerctl", "serve", "--listen", self.address, "--store", store_url,
             "--checkpoint-root", str(workdir / "ckpt"), "--set", f"agent_listen={self.agent_address}",
             *sets], env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ---- the orchestrator ---------------------------------------------------------------------
class Readers:
    """WatchJob watchers (``watchers`` streams per watched job: the fan-out) and GetJob
    pollers on ``POLLED`` of the same jobs: when each progress step became visible."""

    def __init__(self, stub: jobs_pb2_grpc.JobServiceStub, meta: tuple, jobs: list[str],
                 watchers: int) -> None:
        self.stub, self.meta, self.jobs, self.watchers = stub, meta, jobs, watchers
        self.watch_seen: list[tuple[str, int, float]] = []  # (job, step, time) per watcher event
        self.poll_seen: dict[tuple[str, int], float] = {}
        self.tasks: list[asyncio.Task] = []
        self.watch_errors: list[str] = []

    def start(self) -> None:
        for j in self.jobs:
            for _ in range(self.watchers):
                self.tasks.append(asyncio.create_task(self.watch(j)))
        for j in self.jobs[:POLLED]:
            self.tasks.append(asyncio.create_task(self.poll(j)))

    async def watch(self, job_id: str) -> None:
        try:
            last = (await self.stub.GetJobEvents(jpb.GetJobEventsRequest(job_id=job_id),
                                                 metadata=self.meta)).events
            after = last[-1].seq if last else 0
            async for ev in self.stub.WatchJob(jpb.WatchJobRequest(
                    job_id=job_id, after_seq=after, include_progress=True), metadata=self.meta):
                if ev.type == "progress" and "step" in ev.details:
                    self.watch_seen.append((job_id, int(ev.details["step"]), time.time()))
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.watch_errors.append(f"{job_id}: {e.code().name} {e.details()}")

    async def poll(self, job_id: str) -> None:
        """GetJob of one job every 100 ms: each new step's first sighting (+-50 ms)."""
        last = -1
        while True:
            try:
                job = await self.stub.GetJob(jpb.GetJobRequest(job_id=job_id), metadata=self.meta)
                if job.progress.step != last:
                    if last >= 0:  # the first sighting is of a step sent before we looked
                        self.poll_seen.setdefault((job_id, job.progress.step), time.time())
                    last = job.progress.step
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def submit_many(stubs: list, meta: tuple, start: int, n: int, tag: str) -> list[str]:
    ids: list[str] = []
    it = iter(range(start, start + n))

    async def client(stub) -> None:  # noqa: ANN001
        for i in it:
            r = await stub.SubmitJob(jpb.SubmitJobRequest(spec=job_spec(i), client_request_id=f"{tag}-{i}"),
                                     metadata=meta)
            ids.append(r.job.id)

    await asyncio.gather(*(client(s) for s in stubs))
    return ids


async def drive(broker: Broker, pki, n_running: int, args, procs: list, ctl: list, out: mp.Queue,  # noqa: ANN001
                say, store_calls=None) -> dict:  # noqa: ANN001
    """Ramp to ``n_running`` running attempts, then the steady window."""
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.ca_pem)
    channels = [grpc.aio.secure_channel(broker.address, creds, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(8)]
    meta = (("authorization", f"Bearer {pki.tokens['bench']}"),)
    stubs = [jobs_pb2_grpc.JobServiceStub(ch) for ch in channels]
    loop = asyncio.get_running_loop()
    pid = broker.proc.pid
    res: dict = {"running_target": n_running}

    def count(what: str = "count") -> int:
        for q in ctl:
            q.put(what)
        total = 0
        for _ in ctl:
            kind, v = out.get(timeout=60)
            assert kind == "count"
            total += v
        return total

    def broadcast(cmd: str) -> None:
        for q in ctl:
            q.put(cmd)

    try:
        # idle floor: agents connected and heartbeating, no jobs
        await asyncio.sleep(3)
        c0, t0 = proc_cpu_s(pid), time.monotonic()
        await asyncio.sleep(args.idle_seconds)
        res["idle"] = {"cpu_cores": round((proc_cpu_s(pid) - c0) / (time.monotonic() - t0), 3),
                       "rss_mb": round(rss_kb(pid) / 1024, 1)}
        say(f"  idle (agents connected, no jobs): {res['idle']['cpu_cores']:.3f} cores, "
            f"RSS {res['idle']['rss_mb']:.0f} MB")
        # ramp
        tag = uuid.uuid4().hex[:6]
        t0 = time.monotonic()
        ids = await submit_many(stubs, meta, 0, n_running, tag)
        ramp_submit_s = time.monotonic() - t0
        while True:
            running = await loop.run_in_executor(None, count)
            if running >= n_running:
                break
            if time.monotonic() - t0 > args.ramp_timeout:
                raise RuntimeError(f"only {running}/{n_running} running after {args.ramp_timeout:.0f}s")
            await asyncio.sleep(1)
        res["ramp"] = {"submit_s": round(ramp_submit_s, 1), "to_running_s": round(time.monotonic() - t0, 1)}
        say(f"  ramp: {n_running} submitted in {ramp_submit_s:.1f}s, all running after "
            f"{res['ramp']['to_running_s']:.1f}s; settling {args.report_s:.0f}s")
        broadcast("churn")
        await asyncio.sleep(args.report_s + 2)  # every attempt has reported once at its pace
        # steady window
        rng = random.Random(7)
        # From the newest half: the agents finish the oldest attempts first (churn).
        young = ids[len(ids) // 2:]
        readers = Readers(stubs[0], meta, rng.sample(young, min(args.watched, len(young))), args.watchers)
        readers.start()
        await asyncio.sleep(2)
        broadcast("measure")
        submitted: list[str] = []
        sub_lat: list[float] = []
        stop_at = time.monotonic() + args.seconds
        c0, w0, load0 = proc_cpu_s(pid), time.monotonic(), os.getloadavg()
        cmd0 = store_calls() if store_calls else {}
        rss_samples: list[int] = []
        i = n_running

        async def submitter() -> None:
            nonlocal i
            nxt = time.monotonic()
            while time.monotonic() < stop_at:
                nxt += 1.0 / submit_rate(args, n_running)
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))
                s0 = time.perf_counter()
                r = await stubs[1 + i % 7].SubmitJob(jpb.SubmitJobRequest(
                    spec=job_spec(i), client_request_id=f"{tag}-{i}"), metadata=meta)
                sub_lat.append(time.perf_counter() - s0)
                submitted.append(r.job.id)
                i += 1

        async def sampler() -> None:
            while time.monotonic() < stop_at:
                rss_samples.append(rss_kb(pid))
                await asyncio.sleep(2)

        await asyncio.gather(submitter(), sampler())
        wall = time.monotonic() - w0
        cpu = proc_cpu_s(pid) - c0
        if store_calls:  # the store's own count of what the window sent it, per second
            cmd1 = store_calls()
            res["store_calls_per_s"] = {k: round((cmd1.get(k, 0) - cmd0.get(k, 0)) / wall, 1)
                                        for k in sorted(cmd1) if cmd1.get(k, 0) > cmd0.get(k, 0)}
        broadcast("unmeasure")
        # Every update acked before the store is read: the agents stop reporting (their
        # heartbeats go on) and the acks of what is in flight arrive.
        broadcast("quiet")
        t_drain = time.monotonic()
        await asyncio.sleep(1)
        while (left := await loop.run_in_executor(None, count, "unacked")) and time.monotonic() - t_drain < 120:
            await asyncio.sleep(1)
        # A step acked inside the progress throttle is stored by a later heartbeat (it lists
        # every attempt's progress): give them two throttle + heartbeat intervals.
        await asyncio.sleep(2 * (PROGRESS_WRITE_S + 2.0))
        res["drain"] = {"seconds": round(time.monotonic() - t_drain, 1), "unacked_left": left}
        await readers.stop()
        running_end = await loop.run_in_executor(None, count)
        res["steady"] = {"submit_rate": submit_rate(args, n_running),
            "seconds": round(wall, 1), "cpu_cores": round(cpu / wall, 3),
            "rss_mb_max": round(max(rss_samples) / 1024, 1), "rss_mb_end": round(rss_kb(pid) / 1024, 1),
            "loadavg_start": list(load0), "loadavg_end": list(os.getloadavg()),
            "submits": len(submitted), "submit_p99_ms": round(pct(sub_lat, 99) * 1000, 1),
            "running_end": running_end,
        }
        res["_readers"] = readers
        return res
    finally:
        for ch in channels:
            await ch.close()


def redis_store_check(url: str, stats: dict) -> dict:
    """:func:`store_check` for a Redis store: the same counts, read from its keys."""
    from broker.store.redis import RedisStore

    store = RedisStore(url)
    r, p = store._r, store.prefix
    try:
        stored: dict[str, int] = {}
        for key in r.scan_iter(match=f"{p}:loglines:*", count=1000):
            job_id = key.decode().split(":")[2]
            stored[job_id] = stored.get(job_id, 0) + int(r.llen(key))
        dropped = sum(int(r.hget(k, "dropped") or 0) for k in r.scan_iter(match=f"{p}:logmeta:*", count=1000))
        ids = list(stats["last_step"])
        pipe = r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(store._k("job", job_id), "d")
        behind = checked = 0
        for job_id, data in zip(ids, pipe.execute(), strict=True):
            if data is None:
                continue
            checked += 1
            if pb.Job.FromString(data).progress.step < stats["last_step"][job_id]:
                behind += 1
    finally:
        store.close()
    sent = stats["lines"]
    missing = {j: n - stored.get(j, 0) for j, n in sent.items() if stored.get(j, 0) != n}
    return {"log_lines_sent": sum(sent.values()), "log_lines_stored": sum(stored.values()),
            "log_lines_dropped_by_bound": dropped, "jobs_with_missing_lines": len(missing),
            "jobs_checked": checked, "jobs_behind_last_sent_step": behind}


class StoreUnderTest:
    """The broker's store for one size: its URL, the servers behind it, the check."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        self.db = workdir / "broker.sqlite"
        self.servers: list = []
        self.cluster = None
        if kind == "sqlite":
            self.url = f"sqlite:///{self.db}"
        elif kind == "redis":
            from tests.fixtures.redis_server import start_redis

            server = start_redis(workdir / "redis")
            self.servers.append(server)
            self.url = f"{server.url}?prefix=bench"
        elif kind == "redis-sentinel":
            from tests.fixtures.redis_sentinel import start_sentinel_cluster

            self.cluster = start_sentinel_cluster(workdir / "redis")
            self.url = self.cluster.url(prefix="bench")
        else:
            raise ValueError(f"unknown store {kind!r}")

    def calls(self) -> dict[str, int] | None:
        """Redis: commands the primary ran so far, by name (``INFO commandstats``); the
        WAITs among them are the replica confirmations."""
        if self.kind == "sqlite":
            return None
        import redis

        port = self.cluster.primary_port() if self.cluster is not None else self.servers[0].port
        with redis.Redis(port=port) as r:
            stats = r.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}

    def check(self, stats: dict) -> dict:
        return store_check(self.db, stats) if self.kind == "sqlite" else redis_store_check(self.url, stats)

    def stop(self) -> None:
        from tests.fixtures.redis_server import stop_redis

        for server in self.servers:
            stop_redis(server)
        if self.cluster is not None:
            self.cluster.stop()


STORE_NAMES = {"sqlite": "sqlite (WAL, synchronous=FULL)",
               "redis": "redis (one server, no replica, no persistence)",
               "redis-sentinel": "redis+sentinel (primary, 2 replicas, 3 Sentinels; min_replicas=all: "
                                 "every acknowledged write waits for both replicas; no persistence)"}


def store_check(db: Path, stats: dict) -> dict:
    """Read the stopped broker's store: log lines stored vs sent, and each job's stored
    step vs the last step its agent sent (every acked update is in the store)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    stored = dict(conn.execute("SELECT job_id, COUNT(*) FROM log_lines GROUP BY job_id").fetchall())
    dropped = conn.execute("SELECT COALESCE(SUM(dropped), 0) FROM log_attempts").fetchone()[0]
    sent = stats["lines"]
    missing = {j: n - stored.get(j, 0) for j, n in sent.items() if stored.get(j, 0) != n}
    behind = 0
    checked = 0
    for job_id, data in conn.execute("SELECT id, data FROM jobs"):
        if job_id not in stats["last_step"]:
            continue
        job = pb.Job.FromString(data)
        checked += 1
        if job.progress.step < stats["last_step"][job_id]:
            behind += 1
    conn.close()
    return {"log_lines_sent": sum(sent.values()), "log_lines_stored": sum(stored.values()),
            "log_lines_dropped_by_bound": dropped, "jobs_with_missing_lines": len(missing),
            "jobs_checked": checked, "jobs_behind_last_sent_step": behind}


def merge(stats: list[dict]) -> dict:
    m: dict = {"ack_lat": [], "lines": {}, "last_step": {}, "sent_at": {}, "errors": []}
    for s in stats:
        for k, v in s.items():
            if isinstance(v, list):
                m[k] = m.get(k, []) + v
            elif isinstance(v, dict):
                m[k].update(v)
            else:
                m[k] = m.get(k, 0) + v
    return m


def submit_rate(args, n_running: int) -> float:  # noqa: ANN001
    """Submits (and finishing attempts) per second at this size: ``--submit-rate`` is the
    rate at 10,000 running; other sizes keep the same mean job length (500 s at 20/s)."""
    return args.submit_rate * n_running / 10_000


def run_size(n_running: int, args, say) -> dict:  # noqa: ANN001
    rate = submit_rate(args, n_running)
    with tempfile.TemporaryDirectory(prefix="bench-running-") as tmp:
        tmpd = Path(tmp)
        fleet = agent_ids(args.agents)
        pki = create_dev_pki(tmpd / "pki", agents=fleet,
                             users=[("op", Role.OPERATOR, ""), ("bench", Role.MEMBER, TEAM)])
        store = StoreUnderTest(args.store, tmpd)
        settings = dict(pki.broker_settings)
        settings.update({"max_agent_streams": str(args.agents + 8)})
        settings.update(kv.split("=", 1) for kv in args.set)
        try:
            broker = Broker(tmpd, store.url, settings)
        except BaseException:
            store.stop()
            raise
        ctx = mp.get_context("spawn")
        out: mp.Queue = ctx.Queue()
        ctl: list[mp.Queue] = []
        procs = []
        try:
            wait_ready(broker, pki)
            set_quota(broker, pki, args.nodes * GPUS_PER_NODE)
            per_agent = args.nodes // args.agents
            cfg = {"report_s": args.report_s, "log_lines": args.log_lines,
                   "finish_rate": rate / args.agents}
            for p in range(args.agent_procs):
                mine = fleet[p::args.agent_procs]
                creds = []
                for region, aid in mine:
                    d = tmpd / "pki" / "agents"
                    creds.append((region, aid, (d / f"{aid}.pem").read_bytes(), (d / f"{aid}.key").read_bytes(),
                                  per_agent))
                q = ctx.Queue()
                ctl.append(q)
                pr = ctx.Process(target=agent_proc, args=(broker.agent_address, pki.ca.ca_pem, creds, cfg, q, out),
                                 daemon=True)
                pr.start()
                procs.append(pr)
            res = asyncio.run(drive(broker, pki, n_running, args, procs, ctl, out, say,
                                    store.calls if args.store != "sqlite" else None))
            readers: Readers = res.pop("_readers")
            for q in ctl:
                q.put("stop")
            stats = merge([out.get(timeout=120)[1] for _ in procs])
            for pr in procs:
                pr.join(30)
        except BaseException:
            store.stop()
            raise
        finally:
            broker.stop()
            shutil_copy_log(tmpd, args, n_running)
            writes = store_writes(tmpd / "broker.log")
        # progress-to-visible
        watch_lat = [t - stats["sent_at"][f"{j}:{s}"] for j, s, t in readers.watch_seen
                     if f"{j}:{s}" in stats["sent_at"]]
        poll_lat = [t - stats["sent_at"][f"{j}:{s}"] for (j, s), t in readers.poll_seen.items()
                    if f"{j}:{s}" in stats["sent_at"]]
        res["visible"] = {"update_ack": lat_summary(stats["ack_lat"]),
                          "watch_event": lat_summary(watch_lat), "getjob_poll": lat_summary(poll_lat),
                          "watched_jobs": len(readers.jobs), "watchers_per_job": readers.watchers,
                          "watch_errors": readers.watch_errors[:5]}
        res["sent"] = {k: stats[k] for k in ("updates_sent", "acks", "chunks_sent", "heartbeats", "hb_acks",
                                             "launches", "finished", "unacked")}
        res["sent"]["agent_errors"] = stats["errors"][:10]
        try:
            res["store"] = store.check(stats)
        finally:
            store.stop()
        if writes:
            res["store_writes"] = writes
        return res


def store_writes(log_path: Path) -> dict:
    """The SQLite store's own count, logged when it closes: writes and the transactions
    (fsyncs) they shared, over the broker's whole life (ramp and window)."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    m = re.search(r"(\d+) writes in (\d+) transactions", text)
    if not m:
        return {}
    w, t = int(m.group(1)), int(m.group(2))
    return {"writes": w, "transactions": t, "per_commit": round(w / t, 1) if t else 0.0}


def shutil_copy_log(tmpd: Path, args, n: int) -> None:  # noqa: ANN001
    if args.keep_logs:
        import shutil
        shutil.copy(tmpd / "broker.log", Path(args.keep_logs) / f"broker-{n}.log")


def wait_ready(broker: Broker, pki) -> None:  # noqa: ANN001
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.ca_pem)
    with grpc.secure_channel(broker.address, creds) as ch:
        grpc.channel_ready_future(ch).result(timeout=180)


def set_quota(broker: Broker, pki, gpus: int) -> None:  # noqa: ANN001
    from computebroker.v1 import capacity_pb2 as cpb
    from computebroker.v1 import capacity_pb2_grpc

    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca.ca_pem)
    with grpc.secure_channel(broker.address, creds) as ch:
        capacity_pb2_grpc.CapacityServiceStub(ch).SetTeamQuota(cpb.SetTeamQuotaRequest(
            quota=cpb.TeamQuota(team=TEAM, quotas=[cpb.QuotaEntry(guaranteed_gpus=gpus)])),
            metadata=(("authorization", f"Bearer {pki.tokens['op']}"),))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--running", default="1000,10000", help="sizes, each with a fresh broker")
    p.add_argument("--seconds", type=float, default=60.0, help="steady window per size")
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--agent-procs", type=int, default=2)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--report-s", type=float, default=10.0)
    p.add_argument("--log-lines", type=int, default=3, help="log lines per attempt per report")
    p.add_argument("--submit-rate", type=float, default=20.0)
    p.add_argument("--watched", type=int, default=20)
    p.add_argument("--watchers", type=int, default=3, help="WatchJob streams per watched job")
    p.add_argument("--ramp-timeout", type=float, default=600.0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra broker settings")
    p.add_argument("--label", default="")
    p.add_argument("--note", default="", help="what this build changed (shown under the table)")
    p.add_argument("--keep-logs", default="", help="copy each broker.log into this directory")
    p.add_argument("--store", choices=sorted(STORE_NAMES), default="sqlite", help="the broker's state store")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, flush=True)

    result: dict = {
        "benchmark": "running", "label": args.label, "note": args.note,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start": list(os.getloadavg())},
        "setup": {"agents": args.agents, "agent_procs": args.agent_procs, "nodes": args.nodes,
                  "gpus": args.nodes * GPUS_PER_NODE, "report_s": args.report_s,
                  "log_lines_per_report": args.log_lines, "submit_rate": args.submit_rate,
                  "steady_seconds": args.seconds, "watched_jobs": args.watched,
                  "watchers_per_job": args.watchers, "store": STORE_NAMES[args.store],
                  "transport": "agents: mutual TLS, agent certificates; users: TLS + bearer token",
                  "broker_settings": dict(kv.split("=", 1) for kv in args.set)},
        "goals": {"cpu_cores": GOAL_CPU_CORES, "p99_visible_s": GOAL_P99_VISIBLE_S},
        "sizes": {},
    }
    for n in [int(x) for x in args.running.split(",")]:
        say(f"{n} running attempts:")
        r = run_size(n, args, say)
        result["sizes"][str(n)] = r
        v, s, st = r["visible"], r["steady"], r["store"]
        say(f"  steady {s['seconds']:.0f}s: broker {s['cpu_cores']:.2f} cores, RSS {s['rss_mb_max']:.0f} MB, "
            f"load {s['loadavg_end'][0]:.1f}; update->ack p50 {v['update_ack']['p50_ms']} / p99 "
            f"{v['update_ack']['p99_ms']} ms; watch p99 {v['watch_event']['p99_ms']} ms "
            f"({v['watch_event']['n']} events); GetJob p99 {v['getjob_poll']['p99_ms']} ms")
        say(f"  sent {r['sent']['updates_sent']} updates ({r['sent']['unacked']} unacked), "
            f"{st['log_lines_sent']} log lines, stored {st['log_lines_stored']}; "
            f"{st['jobs_behind_last_sent_step']} jobs behind their last step")
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
