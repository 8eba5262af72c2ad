"""SubmitJob rate with 1, 2, 3 API front-ends on other hosts over one shared Redis store.

What it measures (docs/operator/frontends.md): whether the submit rate grows with API
front-ends (``brokerctl serve --frontend``, broker/api/frontend.py), and which part runs
out first. Real hosts as network namespaces (tests/fixtures/netns.py, names
``cbfe-<pid>-..``): host ``core`` runs redis-server (``appendonly yes``,
``appendfsync`` as given, default ``always``: durable before the ack) and the leader
(``brokerctl serve``); each front-end runs in a host of its own (``fe1``..). The clients
run in the root namespace, in ``--procs`` processes of ``--clients-per-proc`` grpc.aio
callers each (one TLS connection per caller, a bearer token the leader issued into the
store, a ~3.5 KB spec, a fresh client request id per call), spread evenly over the
front-ends of the configuration. The same client load for every configuration;
1 front-end is the baseline, measured in the same run.

One leader and as many front-ends as the largest count, over an empty store (no agent:
the jobs stay pending; the leader still hears every creation on the bus and keeps them
in its live set). Each of ``--runs`` rounds measures every count in turn (1, 2, 3, 1, 2,
3, ...: a shared machine's load drifting meanwhile weighs on each alike), each phase
``--seconds`` after a 1 s warm-up on fresh connections; the median phase is reported
with every run. Then Redis alone: ``--procs`` processes write the same submits straight
through the store's group-commit path (no gRPC, TLS or auth), which shows Redis's own
CPU per submit when nothing else is in the way. Each phase reads from /proc: the CPU of redis-server, the
leader, each front-end and the client processes, and the whole box's busy time
(/proc/stat), so the JSON says where the limit is: Redis's one thread (its CPU near
1 core), the front-ends (near 1 core each), or the box (busy near ``cpus``). The load
average is recorded before and after every phase: the box may be shared.

Needs root (network namespaces); without it, it says so and exits 2.

    sudo .venv/bin/python benchmarks/bench_frontends.py [--frontends 1,2,3] [--seconds 6]
        [--runs 3] [--procs 4] [--clients-per-proc 8] [--appendfsync always]
        [--out benchmarks/results/frontends.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

import grpc  # noqa: E402

from benchmarks.bench_submit_cpu import TEAM, spec  # noqa: E402
from benchmarks.procstats import pct, proc_cpu_s  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "frontends.json"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
BROKER_PORT = 50051


# ---- the client processes -----------------------------------------------------------------
def _client_main(conn: Connection, ca: bytes, token: str, n: int, seed: int) -> None:
    """A client process: ``("connect", addresses)`` opens ``n`` TLS channels spread over
    ``addresses``; ``("phase", seconds)`` submits back to back on all of them and answers
    the latencies, errors and this process's CPU; ``None`` ends it."""
    sys.path[:0] = [str(ROOT), str(ROOT / "proto")]
    from computebroker.v1 import jobs_pb2 as jpb
    from computebroker.v1 import jobs_pb2_grpc

    loop = asyncio.new_event_loop()
    channels: list[grpc.aio.Channel] = []
    stubs: list[jobs_pb2_grpc.JobServiceStub] = []
    meta = (("authorization", f"Bearer {token}"),)
    tag = f"{seed}-{uuid.uuid4().hex[:6]}"
    counter = [0]
    rng = random.Random(seed)
    specs = [spec(i, rng) for i in range(64)]

    async def connect(addresses: list[str]) -> None:
        for ch in channels:
            await ch.close()
        channels.clear()
        stubs.clear()
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
        for c in range(n):
            ch = grpc.aio.secure_channel(addresses[(seed * n + c) % len(addresses)], creds,
                                         options=[("grpc.use_local_subchannel_pool", 1)])
            await asyncio.wait_for(ch.channel_ready(), timeout=60)
            channels.append(ch)
            stubs.append(jobs_pb2_grpc.JobServiceStub(ch))

    async def phase(seconds: float) -> dict:
        lat: list[float] = []
        errors: dict[str, int] = {}
        stop = time.monotonic() + seconds

        async def caller(stub: jobs_pb2_grpc.JobServiceStub) -> None:
            while time.monotonic() < stop:
                counter[0] += 1
                req = jpb.SubmitJobRequest(spec=specs[counter[0] % len(specs)],
                                           client_request_id=f"{tag}-{counter[0]}")
                t0 = time.perf_counter()
                try:
                    r = await stub.SubmitJob(req, metadata=meta, timeout=30)
                    if not r.created:
                        raise RuntimeError("a fresh request id was not new")
                    lat.append(time.perf_counter() - t0)
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1

        cpu0 = time.process_time()
        await asyncio.gather(*(caller(s) for s in stubs))
        return {"lat": lat, "errors": errors, "cpu_s": time.process_time() - cpu0}

    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        try:
            if cmd[0] == "connect":
                loop.run_until_complete(connect(cmd[1]))
                conn.send({"ok": True})
            else:
                conn.send(loop.run_until_complete(phase(cmd[1])))
        except Exception as e:  # noqa: BLE001 - reported to the driver, which stops
            conn.send({"error": f"{type(e).__name__}: {e}"})
    for ch in channels:
        loop.run_until_complete(ch.close())


class Clients:
    def __init__(self, procs: int, per_proc: int, ca: bytes, token: str) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for i in range(procs):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_client_main, args=(b, ca, token, per_proc, i), daemon=True)
            p.start()
            self.conns.append(a)
            self.procs.append(p)

    def ask(self, cmd: tuple) -> list[dict]:
        for c in self.conns:
            c.send(cmd)
        out = [c.recv() for c in self.conns]
        bad = [o["error"] for o in out if "error" in o]
        if bad:
            raise RuntimeError(f"client process failed: {bad[0]}")
        return out

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


# ---- the store's own ceiling -------------------------------------------------------------------
def _store_main(url: str, seconds: float, threads: int, batch: int, seed: int, q: object,
                go: object) -> None:
    """A store driver: ``threads`` threads writing submits straight into Redis through
    ``RedisStore.create_jobs`` (the front-ends' group-commit path: job, events, audit
    rider, request id; ``batch`` per pipeline), no gRPC, no TLS, no auth: what Redis does
    per submit when nothing else is in the way. Puts (jobs written, CPU seconds) on ``q``."""
    import threading

    sys.path[:0] = [str(ROOT), str(ROOT / "proto")]
    from broker.auth.audit import KIND_AUDIT, _build
    from broker.config import BrokerConfig
    from broker.ids import new_job_id, set_stream
    from broker.jobs import transitions
    from broker.store import open_store

    set_stream(200 + seed)
    store = open_store(url)
    config = BrokerConfig()
    rng = random.Random(seed)
    specs = [spec(i, rng) for i in range(64)]
    written = [0]
    lock = threading.Lock()
    q.put(("ready", 0, 0.0))  # type: ignore[attr-defined]
    go.wait()  # type: ignore[attr-defined]  # every driver imported and connected
    stop = time.monotonic() + seconds

    def run(t: int) -> None:
        i = 0
        while time.monotonic() < stop:
            items = []
            for _ in range(batch):
                i += 1
                out = transitions.submit(transitions.Submit(
                    job_id=new_job_id(), spec=specs[i % 64], client_request_id=f"s{seed}-{t}-{i}",
                    actor="user:bench", regions_known=False), time.time(), config)
                rec = _build(None, "/computebroker.v1.JobService/SubmitJob", out.job.id, "bench", "OK")
                items.append((out.job, list(out.events), [(KIND_AUDIT, rec.id, rec)]))
            done = [r for r in store.create_jobs(items) if not isinstance(r, Exception)]
            with lock:
                written[0] += len(done)

    cpu0 = time.process_time()
    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put(("done", written[0], time.process_time() - cpu0))  # type: ignore[attr-defined]
    store.close()


def store_ceiling(world: World, args: argparse.Namespace, say) -> dict:  # noqa: ANN001
    """Redis alone, driven by ``--procs`` processes from the root namespace: the rate at
    which its one thread runs out (its CPU near 1 core) or the box does first."""
    world.redis_client.flushall()
    url = f"redis://{world.core.ip}:6379/0?prefix=ceil{secrets.token_hex(3)}"
    ctx = mp.get_context("spawn")
    runs = []
    for r in range(args.runs):
        q, go = ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_store_main, args=(url, args.seconds, 4, 16, i, q, go), daemon=True)
                 for i in range(args.procs)]
        for p in procs:
            p.start()
        for _ in procs:
            q.get(timeout=300)  # "ready"
        assert world.redis is not None
        cpu0 = proc_cpu_s(world.redis.pid)
        busy0, total0 = box_busy_s()
        t0 = time.monotonic()
        go.set()
        got = [q.get(timeout=args.seconds + 120)[1:] for _ in procs]
        wall = time.monotonic() - t0
        for p in procs:
            p.join(10)
        busy1, total1 = box_busy_s()
        redis_s = proc_cpu_s(world.redis.pid) - cpu0
        n = sum(g[0] for g in got)
        run = {"jobs": n, "rate_per_s": round(n / wall, 1),
               "redis_cores": round(redis_s / wall, 3),
               "redis_cpu_ms_per_submit": round(redis_s * 1000 / max(1, n), 3),
               "driver_cores": round(sum(g[1] for g in got) / wall, 3),
               "box_busy_cores": round((busy1 - busy0) / ((total1 - total0) / (os.cpu_count() or 1)), 3),
               "loadavg_1m_after": round(os.getloadavg()[0], 2)}
        runs.append(run)
        say(f"  store alone, run {r + 1}: {run['rate_per_s']:.0f} submits/s written, redis "
            f"{run['redis_cores']:.2f} cores ({run['redis_cpu_ms_per_submit']:.3f} ms/submit), "
            f"drivers {run['driver_cores']:.2f}, box {run['box_busy_cores']:.2f}; load "
            f"{run['loadavg_1m_after']:.1f}")
    keys = ("rate_per_s", "redis_cores", "redis_cpu_ms_per_submit", "driver_cores", "box_busy_cores")
    med = {k: statistics.median(x[k] for x in runs) for k in keys}
    # One Redis thread at a full core would write 1000 / ms-per-submit submits a second.
    med["redis_one_core_rate_per_s"] = round(1000 / med["redis_cpu_ms_per_submit"], 0) \
        if med["redis_cpu_ms_per_submit"] else 0.0
    return {"runs": runs, "median": med,
            "driver": f"{args.procs} processes x 4 threads, create_jobs batches of 16"}


# ---- the hosts ------------------------------------------------------------------------------
def box_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(f[:8]) - idle) / tick, sum(f[:8]) / tick


class World:
    """Redis and the leader in host ``core``; front-ends in ``fe1``..``feN``."""

    def __init__(self, root: Path, max_frontends: int) -> None:
        from broker.auth.devca import DevCA, write_static_tokens
        from broker.auth.identity import Role
        from tests.fixtures import netns

        self.root = root
        self.net = netns.Network(prefix=f"cbfe-{os.getpid()}-{secrets.token_hex(1)}")
        self.core = self.net.add_host("core")
        self.fes = [self.net.add_host(f"fe{i + 1}") for i in range(max_frontends)]
        ca = DevCA(root / "pki")
        self.ca_pem = ca.ca_pem
        cert = ca.broker(hosts=("localhost", "127.0.0.1", self.core.ip, *(h.ip for h in self.fes)))
        self.op_token = write_static_tokens(root / "pki" / "tokens.yaml",
                                            [("op", Role.OPERATOR, "")])["op"]
        self.settings = {"tls_cert": str(cert.cert), "tls_key": str(cert.key),
                         "tls_ca": str(ca.ca_cert_path),
                         "static_tokens_file": str(root / "pki" / "tokens.yaml")}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.redis: subprocess.Popen[bytes] | None = None

    def _start(self, host: str, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'proto'}")
        fh = open(self.root / log, "ab")  # noqa: SIM115 - handed to the child
        p = subprocess.Popen(self.net.wrap(host, argv), env=env, stdout=fh,
                             stderr=subprocess.STDOUT, cwd=self.root)
        fh.close()
        self.procs.append(p)
        return p

    def start_redis(self, appendfsync: str) -> None:
        import redis

        (self.root / "redis").mkdir(exist_ok=True)
        self.redis = self._start("core", [
            REDIS_SERVER, "--port", "6379", "--bind", self.core.ip, "--save", "",
            "--appendonly", "yes" if appendfsync != "off" else "no",
            *(["--appendfsync", appendfsync] if appendfsync != "off" else []),
            "--dir", str(self.root / "redis"), "--protected-mode", "no"], "redis.log")
        client = redis.Redis(host=self.core.ip, port=6379, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.redis_client = client

    def broker(self, host: str, store: str, *extra: str) -> subprocess.Popen[bytes]:
        ip = self.net.hosts[host].ip
        sets = [x for k, v in self.settings.items() for x in ("--set", f"{k}={v}")]
        return self._start(host, [
            sys.executable, "-m", "brokerctl", "serve", "--listen", f"{ip}:{BROKER_PORT}",
            "--store", store, "--checkpoint-root", str(self.root / "ckpt"),
            "--set", f"agent_listen={ip}:{BROKER_PORT + 1}", *sets, *extra], f"{host}.log")

    def wait_serving(self, address: str, proc: subprocess.Popen[bytes]) -> None:
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca_pem)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{address} exited (see its log in {self.root})")
            with grpc.secure_channel(address, creds) as ch:
                try:
                    grpc.channel_ready_future(ch).result(timeout=2)
                    return
                except grpc.FutureTimeoutError:
                    pass
        raise RuntimeError(f"{address} did not serve within 120 s")

    def stop(self, procs: list[subprocess.Popen[bytes]]) -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        self.stop(list(reversed(self.procs)))
        self.net.close()


def member_token(world: World, address: str) -> str:
    """A member token issued by the leader into the store (front-ends authenticate it
    from the shared store, as they would a real user's), and the team's quota."""
    from computebroker.v1 import auth_pb2, auth_pb2_grpc, capacity_pb2, capacity_pb2_grpc

    creds = grpc.ssl_channel_credentials(root_certificates=world.ca_pem)
    meta = (("authorization", f"Bearer {world.op_token}"),)
    with grpc.secure_channel(address, creds) as ch:
        capacity_pb2_grpc.CapacityServiceStub(ch).SetTeamQuota(capacity_pb2.SetTeamQuotaRequest(
            quota=capacity_pb2.TeamQuota(team=TEAM, quotas=[capacity_pb2.QuotaEntry(guaranteed_gpus=8)])),
            metadata=meta, timeout=30)
        issued = auth_pb2_grpc.AuthServiceStub(ch).CreateToken(auth_pb2.CreateTokenRequest(
            user="bench", team=TEAM, role="member"), metadata=meta, timeout=30)
    return issued.secret


# ---- the configurations, interleaved --------------------------------------------------------
def one_phase(world: World, clients: Clients, leader: subprocess.Popen[bytes],
              fes: list[subprocess.Popen[bytes]], seconds: float) -> dict:
    """One measured phase on the front-ends ``fes`` the clients are connected to."""
    assert world.redis is not None
    pids = {"redis": world.redis.pid, "leader": leader.pid,
            **{f"frontend{i + 1}": p.pid for i, p in enumerate(fes)}}
    cpu0 = {k: proc_cpu_s(v) for k, v in pids.items()}
    busy0, total0 = box_busy_s()
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    out = clients.ask(("phase", seconds))
    wall = time.monotonic() - t0
    busy1, total1 = box_busy_s()
    cpu = {k: proc_cpu_s(v) - cpu0[k] for k, v in pids.items()}
    lat = [x for o in out for x in o["lat"]]
    errors: dict[str, int] = {}
    for o in out:
        for k, v in o["errors"].items():
            errors[k] = errors.get(k, 0) + v
    calls = max(1, len(lat))
    fe_cpu = [cpu[k] for k in cpu if k.startswith("frontend")]
    return {
        "calls": len(lat), "errors": errors,
        "rate_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(pct(lat, 50) * 1000, 1), "p99_ms": round(pct(lat, 99) * 1000, 1),
        "redis_cores": round(cpu["redis"] / wall, 3),
        "redis_cpu_ms_per_submit": round(cpu["redis"] * 1000 / calls, 3),
        "leader_cores": round(cpu["leader"] / wall, 3),
        "leader_cpu_ms_per_submit": round(cpu["leader"] * 1000 / calls, 3),
        "frontend_cores": [round(c / wall, 3) for c in fe_cpu],
        "frontend_cpu_ms_per_submit": round(sum(fe_cpu) * 1000 / calls, 3),
        "client_cores": round(sum(o["cpu_s"] for o in out) / wall, 3),
        "box_busy_cores": round((busy1 - busy0) / ((total1 - total0) / (os.cpu_count() or 1)), 3),
        "loadavg_1m_before": round(load0, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }


def measure(world: World, counts: list[int], args: argparse.Namespace, say) -> list[dict]:  # noqa: ANN001
    """One leader and max(counts) front-ends; each run measures every count in turn
    (1, 2, 3, 1, 2, 3, ...), so a shared machine's load drifting during the benchmark
    weighs on every count alike. The pending jobs of the earlier phases stay (no agent):
    the leader keeps them in its live set."""
    world.redis_client.flushall()
    store = f"redis://{world.core.ip}:6379/0?prefix=fe{secrets.token_hex(3)}"
    leader = world.broker("core", store, "--set", "broker_id=bench-leader")
    leader_addr = f"{world.core.ip}:{BROKER_PORT}"
    started = [leader]
    try:
        world.wait_serving(leader_addr, leader)
        n_max = max(counts)
        fes = [world.broker(h.name, store, "--frontend", "--frontend-id", str(i),
                            "--set", f"broker_id=bench-{h.name}")
               for i, h in enumerate(world.fes[:n_max])]
        started += fes
        addrs = [f"{h.ip}:{BROKER_PORT}" for h in world.fes[:n_max]]
        for a, p in zip(addrs, fes, strict=True):
            world.wait_serving(a, p)
        token = member_token(world, leader_addr)
        clients = Clients(args.procs, args.clients_per_proc, world.ca_pem, token)
        runs: dict[int, list[dict]] = {n: [] for n in counts}
        try:
            for r in range(args.runs):
                for n in counts:
                    clients.ask(("connect", addrs[:n]))
                    clients.ask(("phase", 1.0))  # warm-up: fresh connections, token caches
                    run = one_phase(world, clients, leader, fes[:n], args.seconds)
                    runs[n].append(run)
                    say(f"  {n} front-end(s), run {r + 1}: {run['rate_per_s']:.0f}/s, p99 "
                        f"{run['p99_ms']:.0f} ms; cores: redis {run['redis_cores']:.2f}, front-ends "
                        f"{'+'.join(f'{c:.2f}' for c in run['frontend_cores'])}, leader "
                        f"{run['leader_cores']:.2f}, clients {run['client_cores']:.2f}, box "
                        f"{run['box_busy_cores']:.2f}; load {run['loadavg_1m_after']:.1f}")
        finally:
            clients.close()
    finally:
        world.stop(list(reversed(started)))
        world.procs = [p for p in world.procs if p not in started]
    keys = ("rate_per_s", "p50_ms", "p99_ms", "redis_cores", "redis_cpu_ms_per_submit",
            "leader_cores", "leader_cpu_ms_per_submit", "frontend_cpu_ms_per_submit",
            "client_cores", "box_busy_cores")
    out = []
    for n in counts:
        med = {k: statistics.median(r[k] for r in runs[n]) for k in keys}
        med["frontend_cores_each"] = round(statistics.median(
            statistics.mean(r["frontend_cores"]) for r in runs[n]), 3)
        out.append({"frontends": n, "runs": runs[n], "median": med})
    return out


def capacity(result: dict) -> dict:
    """What the measured CPU per submit implies when each process has a core of its own
    (derived from this run's figures, labelled as such; the rate columns are what was
    measured): a front-end's rate is 1000 / its ms per submit, Redis's one thread stops at
    1000 / its ms per submit, so past ``frontends_to_redis_limit`` front-ends the rate
    stops growing. CPU per call moves much less with a shared machine's load than the
    rate does (bench_submit_cpu.py says why)."""
    fe_ms = statistics.median(c["median"]["frontend_cpu_ms_per_submit"] for c in result["configs"])
    redis_ms = statistics.median(c["median"]["redis_cpu_ms_per_submit"] for c in result["configs"])
    per_fe = 1000 / fe_ms if fe_ms else 0.0
    redis_limit = 1000 / redis_ms if redis_ms else 0.0
    return {"derived_not_measured": True,
            "frontend_cpu_ms_per_submit": round(fe_ms, 3), "redis_cpu_ms_per_submit": round(redis_ms, 3),
            "rate_per_frontend_core": round(per_fe, 0), "redis_one_core_rate": round(redis_limit, 0),
            "frontends_to_redis_limit": round(redis_limit / per_fe, 1) if per_fe else 0.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frontends", default="1,2,3", help="front-end counts (1 = the baseline)")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--procs", type=int, default=4, help="client processes")
    p.add_argument("--clients-per-proc", type=int, default=8)
    p.add_argument("--appendfsync", default="always", choices=["always", "everysec", "off"])
    p.add_argument("--no-store-ceiling", action="store_true",
                   help="skip the store-alone phase (Redis driven without the API)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, flush=True)

    from tests.fixtures import netns

    why = netns.available()
    if why:
        say(f"bench_frontends needs network namespaces: {why}")
        return 2
    counts = [int(x) for x in args.frontends.split(",")]
    result: dict = {
        "benchmark": "frontends",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start": list(os.getloadavg())},
        "setup": {"clients": args.procs * args.clients_per_proc, "client_processes": args.procs,
                  "seconds_per_phase": args.seconds, "runs": args.runs,
                  "spec_bytes": len(spec(0, random.Random(1)).SerializeToString()),
                  "transport": "TLS + bearer token issued into the store (team member)",
                  "store": f"redis-server, appendonly {'no' if args.appendfsync == 'off' else 'yes'}"
                           + ("" if args.appendfsync == "off" else f", appendfsync {args.appendfsync}"),
                  "hosts": "network namespaces on one bridge: redis + leader in one, each"
                           " front-end in its own, clients in the root namespace"},
        "configs": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-frontends-") as tmp:
        world = World(Path(tmp), max(counts))
        try:
            world.start_redis(args.appendfsync)
            result["configs"] = measure(world, counts, args, say)
            if not args.no_store_ceiling:
                result["store_alone"] = store_ceiling(world, args, say)
        finally:
            world.close()
    result["capacity"] = capacity(result)
    base = next((c for c in result["configs"] if c["frontends"] == 1), None)
    if base:
        for c in result["configs"]:
            c["rate_vs_one"] = round(c["median"]["rate_per_s"] / base["median"]["rate_per_s"], 3)
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for c in result["configs"]:
        m = c["median"]
        say(f"{c['frontends']} front-end(s): {m['rate_per_s']:.0f} submits/s "
            f"(x{c.get('rate_vs_one', 1):.2f}), p99 {m['p99_ms']:.0f} ms, redis "
            f"{m['redis_cores']:.2f} cores ({m['redis_cpu_ms_per_submit']:.3f} ms/submit), "
            f"front-ends {m['frontend_cores_each']:.2f} cores each, box {m['box_busy_cores']:.2f}")
    if "store_alone" in result:
        m = result["store_alone"]["median"]
        say(f"store alone: {m['rate_per_s']:.0f} submits/s written, redis {m['redis_cores']:.2f}"
            f" cores, {m['redis_cpu_ms_per_submit']:.3f} ms per submit (one full Redis core:"
            f" ~{m['redis_one_core_rate_per_s']:.0f}/s)")
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
