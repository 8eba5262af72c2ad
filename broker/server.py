"""The broker process: gRPC server + scheduler loop over one store.

Concurrency model (issue 12): a synchronous gRPC server, one thread per running RPC.
Every WatchJob, log follow and agent stream holds its thread for its whole life, so the
pool is every stream pool plus ``max_workers`` and the edge (broker/api/edge.py) admits
streams only within their pools and caps (broker/api/streams.py): unary RPCs always
keep ``max_workers`` threads, however many idle streams are open. Why not grpc.aio: the
servicers, store and scheduler are synchronous and thread-safe; an event loop would put
every store call behind an executor hop for no gain at this scale (benchmarks/bench_streams.py).

Where a SubmitJob's CPU goes (issue 16; py-spy and per-thread /proc times with
benchmarks/bench_api.py's load at 16 clients, SQLite; ~0.9-1.1 ms of broker CPU per
submit against ~0.12 ms for a health check): about 55% in the RPC worker threads (the
servicer and its validation, the group-committed write that carries the job, its event
and its audit record in one transaction, the response; a third of this is system time:
futex wake-ups of thread hand-offs and GIL switches, WAL writes, fdatasync), about 20% in
gRPC's polling thread (receive, decode + the limits check (~30 us), hand-off to the
pool), the scheduler's share (below) and ~6% in gRPC's C event engine. Submits per store
write at 16 clients are ~3: the store is not the bottleneck, the one GIL is (p50 latency
is 16 clients queueing for it).

Scheduler passes during a storm: each submit wakes the loop and passes pace themselves
to ``scheduler_busy_share`` of the time, so in a storm they take that share whatever a
pass costs (the pause is proportional to the pass). Making passes cheaper (now 12-13 ms
of CPU at 5,000 pending and no agent, 18-22 ms before; still O(queue)) shortens
admission delays; what the API gets back is set by the share. 0.25 -> 0.1 (locked
interleaved pairs against the code before): p99 at 16 clients 48-59 -> 40-44 ms, 1
client +10-15%, but the 16-client rate and the broker CPU per submit (~0.85-1.0 ms) did
not move: at these queue sizes the passes were not what bounds the rate. What is left is
per-call Python and thread hand-offs in gRPC's sync server and our interceptors +
servicer + group commit.

A decomposition (2026-11-24, 16 clients in another process, 2 KB specs, CPU per call
of the server process): a bare grpc server echoing the spec 0.17-0.18 ms; the same
behind our three layers 0.33 ms (0.42 before the audit target stopped probing absent
fields); ``JobOps.submit`` called from 16 threads in-process, no gRPC, 0.26 ms
(~4,000/s); with the scheduler held off, the full SubmitJob 0.99 ms against 1.08. The
parts sum to ~0.7 ms of the ~1.0 measured: the rest is their interaction on one GIL
(hand-offs between gRPC's poller, the workers and the group commit's leader). The
process tops out at about one core, so ~1,000 submits/s is where one process stands;
1,500 needs either the per-call Python halved or more than one serving process: the
latter is ``api_workers`` (broker/api/workers.py; docs/architecture.md "API worker
processes"), where this process keeps the lease, the scheduler and agent streams and
N worker processes serve the public port.

Why not grpc.aio for the hot path (measured, not assumed): a prototype served SubmitJob
on a grpc.aio server in the same process as this one, same servicer and audit rider,
no interceptors (so favoured), clients in another process, 16 clients, alternating 4 s
runs under the bench lock (load 3.5-5): servicer via an executor of 16 threads 879 and
814/s against 994 and 993/s here (0.82-0.88x); 4 threads 603 and 723/s against 1,001
and 910/s (0.60-0.79x); called directly on the event loop 625 and 675/s against 972 and
944/s (0.64-0.71x: the loop serializes the blocking store write, so group commit has
almost nobody to group with, 1.8 jobs per write). The servicers, the store and the group
commit are synchronous, so an event loop only adds a hop; the sync server stays.

Measured again (2026-11-27, benchmarks/bench_submit_cpu.py's load: TLS, a token, 3.5 KB
specs, 16 clients; ``perf record`` and per-thread /proc counters on the broker): about
half of the broker's CPU per submit was the kernel switching threads (futex waits and
wake-ups: ~20-30 context switches per SubmitJob, ~9 per no-op), the Python
interpreter ~25%, protobuf and gRPC's core ~7% each. Every release of the GIL under 16
callers is a switch or two: gRPC's poller handing each call to a worker and the request
back to it, group-commit waits, and each SQLite statement (the module releases the GIL
per step) and os.urandom call. What was removed: a job batch is three multi-row INSERTs
without savepoints or reads (~25 statements per group of 5 before), ids and audit ids
draw random bytes a block at a time, a token's cache entry is renewed without argon2
(every 10 s all 16 callers hashed at once: under load that stall was most of the
measured 1.6 ms and the p99 of seconds), and a spec's env is checked in one pass.
A bare servicer echoing the spec (no auth, no store) costs
0.40-0.50 ms per call on this sync server and 0.31-0.40 ms on grpc.aio, so the 0.5 ms
goal is at the floor of either framework in Python on these cores; an aio server (its
submit path never blocking: the group commit on its own thread, answers resolved per
group) would save the hand-offs, not the floor, and every servicer, stream and layer
would have to move with it.

That aio server exists for the API workers (``api_worker_server: aio``,
broker/api/aio_server.py) and was measured against the sync one in the same tree, same
minutes (bench_submit_cpu.py, one worker, benchmarks/results/submit_cpu_workers_*.json):
context switches per submit in the worker fell from ~28 to ~15-19, its CPU per submit
did not (a cProfile of the loop: ~17 of gRPC aio's callbacks and ~6 loop wake-ups per
SubmitJob), and every method left on the pool pays a loop -> pool -> loop crossing
(the calibration no-op ~0.25 -> ~0.45 ms). So the sync server stays the default.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from concurrent import futures
from typing import Any

import grpc

from broker import ready_file as ready_file_mod
from broker.agents.registry import AgentRegistry
from broker.api.agent_service import AgentService
from broker.api.auth_service import AuthService
from broker.api.capacity_service import CapacityService
from broker.api.edge import EdgeGate, IdleWatch
from broker.api.forwarding import ForwardedAuthenticator
from broker.api.health import add_probes
from broker.api.jobs_service import JobService, submit_checks
from broker.api.peer_gate import PeerGate
from broker.api.pipeline import LayeredServer
from broker.api.streams import StreamBudget, StreamLimits
from broker.api.workers import LinkService, WorkerLink, WorkerPool, reserve_port, split_host_port
from broker.auth.audit import AuditLog
from broker.auth.interceptor import Authenticator, AuthInterceptor
from broker.auth.revocation import CertRevocations
from broker.auth.tls import server_credentials
from broker.auth.tokens import TokenManager
from broker.config import BrokerConfig
from broker.jobs.applier import Applier
from broker.jobs.hub import EventHub
from broker.jobs.ops import JobOps
from broker.jobs.views import JobsView, RecordsView
from broker.leadership import Leadership, StandbyGate, advertised_address
from broker.malloc_arenas import FreedMemoryReturner, cap_malloc_arenas
from broker.scheduling.loop import SchedulerLoop
from broker.stop_signals import StopSignals
from broker.store import Store, open_store
from broker.telemetry import BrokerTelemetry, setup_tracing
from broker.workdirs.blobstore import default_store_url, open_blob_store
from broker.workdirs.service import WorkdirService
from computebroker.v1 import (
    agent_pb2_grpc,
    auth_pb2_grpc,
    capacity_pb2_grpc,
    jobs_pb2_grpc,
    workdir_pb2_grpc,
    worker_link_pb2_grpc,
)

log = logging.getLogger(__name__)


def server_options(config: BrokerConfig) -> list[tuple[str, int]]:
    """The public servers' gRPC options (this process's, and each API worker's)."""
    return [
        # Keepalive: a dead client's connection (and its streams' slots) is found
        # within ~30 s; idle connections (no RPC) are closed after 10 min.
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_connection_idle_ms", 600_000),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_concurrent_streams", config.max_streams_per_connection),
        # A connection must finish its TLS handshake within 10 s (gRPC's default is 120 s):
        # a peer that opens connections and never completes them holds each only briefly.
        ("grpc.server_handshake_timeout_ms", 10_000),
    ]


class BrokerServer:
    """``start()`` binds and returns the port; ``stop()``; ``wait()`` until stopped."""

    def __init__(self, config: BrokerConfig, store: Store | None = None) -> None:
        self.config = config
        self._store = store
        self._owns_store = store is None
        self.ops: JobOps | None = None
        self.leadership: Leadership | None = None
        self._server: grpc.Server | None = None
        self._stopped = threading.Event()
        self.port = 0
        self.agent_port = 0  # the mutual-TLS port (agents, certificate users); 0 = none
        self.metrics_port = 0  # bound port of the Prometheus endpoint (0 = off)
        self.blobs: object | None = None  # workdir blob store (broker/workdirs/), once started
        self.streams = StreamBudget(StreamLimits.from_config(config))
        self._idle: IdleWatch | None = None
        self.health: object | None = None  # grpc_health.v1 servicer, once started
        # API worker processes (config.api_workers > 0; broker/api/workers.py)
        self._pool: WorkerPool | None = None
        self._link: WorkerLink | None = None
        self._link_service: LinkService | None = None
        self._link_server: grpc.Server | None = None
        self._reserved: socket.socket | None = None
        self._gate: PeerGate | None = None  # per-address connection cap (peer_gate.py)
        self._bus: Any = None  # LeaderBus: API front-ends' wake-ups (Redis; store_bus.py)

    @property
    def scheduler(self) -> SchedulerLoop | None:
        """The running scheduler loop (None while this replica is a standby)."""
        return self.leadership.scheduler if self.leadership is not None else None

    @property
    def store(self) -> Store | None:
        return self._store

    @property
    def holder(self) -> str:
        return self.config.broker_id or f"{socket.gethostname()}-{os.getpid()}"

    def start(self) -> int:
        problem = self.config.tls_problem()
        if problem:
            raise RuntimeError(problem)
        problem = self.config.workers_problem()
        if problem:
            raise RuntimeError(problem)
        if self.config.insecure_dev:
            log.warning("INSECURE DEV MODE: no TLS, no authentication; every caller on this"
                        " loopback port is the local operator. Never use this beyond a laptop.")
        store = self._store or open_store(self.config.store)
        self._store = store
        # The wiring: one registry, one applier (the only job write path), one set of
        # job operations; servicers get those plus read-only views, never the store.
        telemetry = BrokerTelemetry()  # spans always (no-op unless tracing); metrics once started
        agents = AgentRegistry(store)
        applier = Applier(store, EventHub(), agents, telemetry, self.config)
        ops = JobOps(applier)
        self.ops = ops
        jobs, records = JobsView(store, applier.hub, applier.hot), RecordsView(store)
        self.metrics_port = telemetry.start_metrics(
            self.config.metrics_listen,
            None if self.config.insecure_dev else (self.config.tls_cert, self.config.tls_key))
        # Leader lease is taken only after binding (the advertised address needs the port).
        self.leadership = Leadership(ops, store, self.holder, "", self.config.leader_lease_s)
        tokens = TokenManager.for_config(store, self.config)
        audit = AuditLog(store)
        self.tokens, self.audit = tokens, audit
        revocations = CertRevocations(self.config.tls_crl, self.config.cert_deny_list,
                                      self.config.tls_ca)
        auth = AuthInterceptor(Authenticator(tokens, self.config.insecure_dev, revocations), audit)
        self._idle = IdleWatch(self.config.stream_idle_timeout_s)
        threads = self.streams.limits.threads() + self.config.max_workers
        grpc_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc"),
            options=server_options(self.config))
        # Every service registers through the call pipeline (broker/api/pipeline.py):
        # who first (an unauthenticated caller takes no stream slot), then the edge
        # (decode, limits, stream budget), then the standby gate.
        server = LayeredServer(grpc_server, [auth, EdgeGate(self.streams, self._idle),
                                             StandbyGate(self.leadership)])
        blobs = open_blob_store(self.config.workdir_store or default_store_url(self.config.store))
        self.blobs = blobs

        config = self.config

        submit_check = submit_checks(config, agents, blobs, jobs)

        leadership = self.leadership
        servicers = (
            (jobs_pb2_grpc.add_JobServiceServicer_to_server, JobService(ops, jobs, config, submit_check)),
            (workdir_pb2_grpc.add_WorkdirServiceServicer_to_server,
             WorkdirService(blobs, config.workdir_max_bytes)),
            (capacity_pb2_grpc.add_CapacityServiceServicer_to_server,
             CapacityService(ops, jobs, records, agents, config)),
            (agent_pb2_grpc.add_AgentServiceServicer_to_server,
             AgentService(ops, jobs, agents, config, leading=lambda: leadership.is_leader,
                          broker_id=self.holder)),
            (auth_pb2_grpc.add_AuthServiceServicer_to_server, AuthService(tokens, audit)),
        )
        for add, servicer in servicers:
            add(servicer, server)
        self.health = add_probes(server, reflection=self.config.reflection)
        if config.api_workers:
            port = self._start_workers(servicers, threads)
            self._bind(grpc_server)  # the agent port only: workers serve the public one
            grpc_server.start()
        else:
            port = self._bind(grpc_server)
            grpc_server.start()
        self._server = grpc_server
        self.port = port
        self.leadership.address = advertised_address(self.config.listen, port,
                                                     self.config.advertise_address)
        redis_mod = sys.modules.get("broker.store.redis")  # loaded iff a Redis store exists
        if redis_mod is not None and isinstance(store, redis_mod.RedisStore):
            from broker.api.store_bus import LeaderBus  # API front-ends wake us here

            self._bus = LeaderBus(store, ops.applier.hub, lambda: leadership.is_leader,
                                  ops.applier.created_elsewhere, self._reread)
            self._bus.start()
        self.leadership.start()  # leader now, or a standby that keeps polling the lease
        if self._pool is not None:
            self._pool.start()
            try:
                self._wait_workers()
            except RuntimeError:
                self.stop(0)  # no half-started broker: workers, link and lease go too
                raise
        log.info("broker %s listening on %s (port %d, %s; agents/mTLS port %d), store %s, %s",
                 self.holder, self.config.listen, port,
                 "INSECURE" if self.config.insecure_dev else "TLS", self.agent_port, self.config.store,
                 "leader" if self.leadership.is_leader else "standby")
        return port

    def _start_workers(self, servicers: tuple, threads: int) -> int:
        """API worker processes (broker/api/workers.py): reserve the public port, serve
        the private link they forward to, and prepare the pool (started once the lease
        was tried, so the workers' first word from the core is its real role)."""
        cfg = self.config
        self._reserved, port = reserve_port(cfg.listen)
        host, _ = split_host_port(cfg.listen)
        link = self._link = WorkerLink()
        ops = self.ops
        assert ops is not None and self.leadership is not None
        def reread(slot: int, rc: int = 0) -> None:
            # A worker gone or frozen may have committed jobs it never reported.
            self._reread()

        self._link_service = LinkService(link.key, self.leadership, ops.applier.created_elsewhere,
                                         ops.applier.hub, on_silent=reread)
        threading.Thread(target=self._link_service.watch_silence, name="worker-silence",
                         daemon=True).start()
        link_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="link"),
            options=[("grpc.max_receive_message_length", cfg.max_message_bytes)])
        # Forwarded calls: the principal the worker vouches for (it authenticated, authorized
        # and audits the call), then the same edge and standby gate as on the public port.
        layered = LayeredServer(link_server, [
            AuthInterceptor(ForwardedAuthenticator(link.key), None),
            EdgeGate(self.streams, self._idle, peer_known=False), StandbyGate(self.leadership)])
        for add, servicer in servicers:
            if not isinstance(servicer, AgentService):  # agents never come through a worker
                add(servicer, layered)
        worker_link_pb2_grpc.add_WorkerLinkServicer_to_server(self._link_service, link_server)
        if link_server.add_insecure_port(link.address) == 0:
            raise RuntimeError(f"could not bind the worker link {link.address}")
        link_server.start()
        self._link_server = link_server
        public = cfg.model_copy(update={"listen": f"[{host}]:{port}" if ":" in host else f"{host}:{port}"})

        self._pool = WorkerPool(public, link.path, link.key, reread)
        return port

    def _reread(self) -> None:
        """The next scheduler pass reads every live job from the store: creations made
        elsewhere (an API worker, a front-end) may have gone unreported."""
        sched = self.scheduler
        if sched is not None:
            sched.live.forget()
            sched.poke()

    def _wait_workers(self) -> None:
        """Until every worker serves (or 60 s): start() returning means the port answers."""
        assert self._pool is not None and self._link_service is not None
        n = self.config.api_workers
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._link_service.wait_ready(n, 1.0):
                log.info("%d api workers serving port %d", n, self.port)
                return
            log.info("waiting for api workers: %d of %d serving",
                     len(self._link_service.ready), n)
        raise RuntimeError(f"api workers did not start within 60 s ({len(self._link_service.ready)}"
                           f" of {n} serving); see their log lines above")

    def _bind(self, server: grpc.Server) -> int:
        """TLS on ``listen``; mutual TLS on ``agent_listen`` (broker/auth/tls.py says why
        two ports). Insecure dev mode: one plain loopback port for everyone, or with API
        workers, a plain loopback ``agent_listen`` for the agents."""
        cfg = self.config
        if cfg.api_workers:  # the workers bind ``listen``; this process the agents' port
            self.agent_port = (server.add_insecure_port(cfg.agent_listen) if cfg.insecure_dev else
                               server.add_secure_port(cfg.agent_listen,
                                                      server_credentials(cfg, mutual=True)))
            if self.agent_port == 0:
                raise RuntimeError(f"could not bind agent_listen {cfg.agent_listen}")
            return self.agent_port
        listen = cfg.listen
        if cfg.max_connections_per_address:  # the gate owns listen; gRPC a loopback port
            host, _ = split_host_port(cfg.listen)
            listen = "[::1]:0" if ":" in host and host not in ("", "::") else "127.0.0.1:0"
        if cfg.insecure_dev:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, server_credentials(cfg, mutual=False))
            if cfg.agent_listen:
                self.agent_port = server.add_secure_port(cfg.agent_listen,
                                                         server_credentials(cfg, mutual=True))
                if self.agent_port == 0:
                    raise RuntimeError(f"could not bind agent_listen {cfg.agent_listen}")
        if port == 0:
            raise RuntimeError(f"could not bind {listen}")
        if cfg.max_connections_per_address:
            host, want = split_host_port(cfg.listen)
            self._gate = PeerGate((host, want), (split_host_port(listen)[0], port),
                                  cfg.max_connections_per_address)
            port = self._gate.start()
        return port

    def stop(self, grace: float = 2.0) -> None:
        if self._stopped.is_set():
            return
        if self._link_service is not None:
            self._link_service.stopping.set()  # workers hear the link close and stop
        if self._pool is not None:
            self._pool.stop()
        if self._link_server is not None:
            self._link_server.stop(grace).wait(grace + 5)
        if self._link is not None:
            self._link.close()
        if self._reserved is not None:
            self._reserved.close()
        if self._bus is not None:
            self._bus.stop()
        if self.leadership is not None:
            self.leadership.stop()  # stops the scheduler, closes agent streams, frees the lease
        if self.ops is not None:
            self.ops.applier.hub.close()
        if self.health is not None:
            self.health.enter_graceful_shutdown()  # type: ignore[attr-defined]
        if self._server is not None:
            self._server.stop(grace).wait(grace + 5)
        if self._gate is not None:
            self._gate.stop()
        if self._idle is not None:
            self._idle.close()
        if self.ops is not None:
            self.ops.telemetry.close()
            gc = self.ops.applier.creates
            if gc.groups:  # how many submits shared each store write (group commit)
                log.info("group commit: %d job creations in %d store writes (%.1f per write)",
                         gc.members, gc.groups, gc.members / gc.groups)
        if self._owns_store and self._store is not None:
            self._store.close()
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


def serve(config: BrokerConfig, ready_file: str = "") -> None:
    """Run a broker until SIGINT/SIGTERM (``brokerctl serve``). ``ready_file``: written
    once the broker takes calls, removed when it stops (broker/ready_file.py)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    setup_tracing("compute-broker")  # CB_TRACE_FILE / OTEL_EXPORTER_OTLP_ENDPOINT, else off
    cap_malloc_arenas()  # before the server's threads: broker/malloc_arenas.py
    trimmer = FreedMemoryReturner()
    trimmer.start()
    ready_file_mod.clear(ready_file)  # an earlier run's file must not say "ready" now
    if config.frontend:  # never leads: broker/api/frontend.py
        from broker.api.frontend import FrontendServer

        server: BrokerServer | FrontendServer = FrontendServer(config)
    else:
        server = BrokerServer(config)
    stops = StopSignals().install()  # no lock in a handler: broker/stop_signals.py
    server.start()
    try:
        if ready_file:
            try:
                ready_file_mod.write(ready_file, ready_file_mod.info_of(server))
            except OSError as e:
                raise RuntimeError(f"cannot write the ready file {ready_file}: {e}") from None
            log.info("ready: wrote %s", ready_file)
        signum = stops.wait()
        log.info("signal %d: stopping", signum)
    finally:
        ready_file_mod.clear(ready_file)  # not ready any more, from the first moment of stopping
        server.stop()
        trimmer.stop()
