"""An API front-end: the public job API on another host, over the shared Redis store.

Why (docs/architecture.md "API front-ends", docs/operator/frontends.md): API worker
processes spread a broker's API over the cores of *one* host; past that, submits need
more hosts. As Armada splits its submit API server from its scheduler, a front-end is a
broker process that never leads and never schedules: it serves SubmitJob, the job reads
and WatchJob (plus workdir transfers and probes) straight from the shared store, and
wakes whichever replica leads over the store's pub/sub (broker/api/store_bus.py).

What a submit keeps on a front-end, by construction (the same code as the leader's):
the same authentication (the store's tokens, the static tokens file, TLS with the same
certificate and CA) and policy table, so anonymous calls are refused as on the leader;
the same limits check, validation, team and quota checks (``submit_checks``, the
request-id lookup), and the same store write: the job, its events and its audit record
in one atomic Redis script per job, group-committed, acknowledged only once written
(and confirmed by replicas when the store URL asks for them). Idempotency is the
store's: ``(team, client_request_id)`` is unique inside the create script, whichever
front-end or replica a retry lands on.

What a front-end does not do: lead, schedule, hold agent streams, or serve calls whose
effects live in the leader's memory (cancels and other transitions, quotas, tokens,
log follows): those it sends on to the leader of the moment *as the caller*, with the
caller's own token, and relays the answer (broker/api/leader_proxy.py), so ``brokerctl``
pointed at a front-end just works. Agents dialling it are refused UNAVAILABLE naming the
leader. It needs no lease and no fencing: a creation conflicts with nobody, and every
replica hears it on the bus (a standby promoted later reads every live job from the
store anyway).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import struct_pb2

from broker.agents.registry import AgentRegistry
from broker.api.edge import EdgeGate, IdleWatch
from broker.api.errors import BrokerError
from broker.api.frontend_metrics import FrontendCounters, Refusal
from broker.api.health import add_probes
from broker.api.jobs_service import JobService, submit_checks
from broker.api.leader_proxy import LeaderChannel, LeaderProxy
from broker.api.pipeline import LayeredServer
from broker.api.store_bus import FrontendBus
from broker.api.streams import StreamBudget, StreamLimits
from broker.api.worker_process import LOCAL_JOB_METHODS, WorkerJobOps
from broker.auth.audit import AuditLog
from broker.auth.identity import Principal
from broker.auth.interceptor import Authenticator, AuthInterceptor
from broker.auth.revocation import CertRevocations
from broker.auth.tls import server_credentials
from broker.auth.tokens import TokenManager
from broker.config import BrokerConfig
from broker.ids import set_stream
from broker.jobs.applier import Applier
from broker.jobs.hub import EventHub
from broker.jobs.views import JobsView
from broker.leadership import KIND_LEADER, LEASE_NAME, StandbyGate
from broker.server import server_options
from broker.store import open_store
from broker.store.redis import RedisStore
from broker.telemetry import BrokerTelemetry
from broker.workdirs.blobstore import default_store_url, open_blob_store
from broker.workdirs.service import WorkdirService
from computebroker.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    auth_pb2,
    auth_pb2_grpc,
    capacity_pb2,
    capacity_pb2_grpc,
    jobs_pb2,
    jobs_pb2_grpc,
    workdir_pb2_grpc,
)

log = logging.getLogger(__name__)

# Job id streams (broker/ids.py): 0 = a broker's core, 1..32 = its API workers; a
# front-end mints from FRONTEND_STREAM_BASE + frontend_id, so front-ends given distinct
# ids never make the same job id in one microsecond, on any host.
FRONTEND_STREAM_BASE = 64
LEADER_INFO_TTL_S = 2.0


class LeaderPointer:
    """Who leads, as the store's leader record says (read at most every 2 s): where a
    call for the leader is sent (broker/api/leader_proxy.py), and what a caller is told
    when it cannot be."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._at = -LEADER_INFO_TTL_S
        self._text = "the leader"
        self._address = ""

    def _read(self) -> None:
        now = time.monotonic()
        if now - self._at < LEADER_INFO_TTL_S:
            return
        self._at = now
        try:
            rec = self.store.get_record(KIND_LEADER, LEASE_NAME, struct_pb2.Struct)
            info = dict(rec.items()) if isinstance(rec, struct_pb2.Struct) else {}
            self._address = str(info.get("address") or "")
            self._text = (f"the leader {info.get('holder') or 'unknown'}"
                          f" ({self._address or 'address unknown'})")
        except Exception:  # noqa: BLE001 - keep the last address: the store may be failing over
            self._text = "the leader (unknown: the store did not answer)"

    def describe(self) -> str:
        self._read()
        return self._text

    def address(self) -> str:
        """The leader's advertised ``host:port`` ("" = none on record)."""
        self._read()
        return self._address

    def forget(self) -> None:
        """The leader did not answer: read the record again at the next ask."""
        self._at = -LEADER_INFO_TTL_S


class FrontendRole:
    """The front-end's StandbyGate ``leadership``: it serves while its store bus is
    subscribed (the store answers and the leader can hear it), and refuses otherwise,
    naming why, so a load balancer's next try lands on another front-end."""

    def __init__(self, bus: FrontendBus, counters: FrontendCounters | None = None) -> None:
        self.bus, self.counters = bus, counters

    @property
    def is_leader(self) -> bool:
        return self.bus.connected

    def standby_message(self) -> str:
        if self.counters is not None:  # asked once per refused call
            self.counters.refused(Refusal.STORE_UNREACHABLE)
        return ("this API front-end cannot reach the state store; retry (another front-end"
                " or the leader may answer)")


def refusing_servicer(service: Any, names: list[str], message: Callable[[str], str],
                      base: Any = None) -> Any:
    """``base`` (or an empty object) with ``names`` (methods of the service descriptor
    ``service``) answering UNAVAILABLE with ``message(full method name)``."""
    target = base if base is not None else type(f"Refused{service.name}", (), {})()

    def unary(full: str) -> Callable[[Any, Any], Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAVAILABLE, message(full))
        return call

    def stream(full: str) -> Callable[[Any, Any], Iterator[Any]]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            context.abort(grpc.StatusCode.UNAVAILABLE, message(full))
            yield from ()  # unreachable: makes this a generator
        return call

    for m in service.methods:
        if m.name in names:
            full = f"{service.name}.{m.name}"
            setattr(target, m.name, stream(full) if m.server_streaming else unary(full))
    return target


def count_submits(job_service: JobService, counters: FrontendCounters) -> None:
    """Count each SubmitJob ``job_service`` answers (created or a retry's first job)."""
    submit = job_service.SubmitJob

    def counted(request: Any, context: grpc.ServicerContext) -> Any:
        resp = submit(request, context)
        counters.submitted(resp.created)
        return resp

    job_service.SubmitJob = counted  # type: ignore[method-assign]


def leader_methods() -> list[str]:
    """``Service.Method`` of every call a front-end sends on to the leader: all of the
    job, capacity and auth services except what it serves itself (LOCAL_JOB_METHODS)."""
    out = []
    for module, service in ((jobs_pb2, "JobService"), (capacity_pb2, "CapacityService"),
                            (auth_pb2, "AuthService")):
        desc = module.DESCRIPTOR.services_by_name[service]
        out += [f"{desc.full_name}/{m.name}" for m in desc.methods
                if not (service == "JobService" and m.name in LOCAL_JOB_METHODS)]
    return out


class FrontendServer:
    """``brokerctl serve --frontend``: ``start()`` binds ``listen`` and returns the port;
    ``stop()``; the ``role`` the ready file reports is "frontend"."""

    role = "frontend"

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.port = 0
        self.agent_port = 0
        self.metrics_port = 0
        self.leadership = None  # never leads (the ready file reads this)
        self.name = config.broker_id or f"{socket.gethostname()}-{os.getpid()}"
        self._server: grpc.Server | None = None
        self._stopped = threading.Event()

    def start(self) -> int:
        cfg = self.config
        problem = cfg.tls_problem() or cfg.frontend_problem()
        if problem:
            raise RuntimeError(problem)
        set_stream(FRONTEND_STREAM_BASE + cfg.frontend_id)
        store = open_store(cfg.store)
        assert isinstance(store, RedisStore)  # frontend_problem() said so
        self.store = store
        hub = self.hub = EventHub()
        self.bus = FrontendBus(store, self.name, cfg.frontend_id, hub)
        self.bus.start()
        agents = AgentRegistry(store)
        telemetry = self.telemetry = BrokerTelemetry()
        counters = self.counters = FrontendCounters(
            lambda: {"changed": self.bus.listener.reconnects}, lambda: self.bus.connected)
        self.metrics_port = telemetry.start_metrics(
            cfg.metrics_listen, None if cfg.insecure_dev else (cfg.tls_cert, cfg.tls_key),
            scheduler=False, extra=counters.register)
        applier = Applier(store, hub, agents, telemetry, cfg)
        applier.add_listener(self.bus.add)
        ops = self.ops = WorkerJobOps(applier)
        jobs = JobsView(store, hub)
        tokens = TokenManager.for_config(store, cfg)
        proxied = leader_methods()
        auth = AuthInterceptor(Authenticator(tokens, cfg.insecure_dev, CertRevocations(
            cfg.tls_crl, cfg.cert_deny_list, cfg.tls_ca)), AuditLog(store),
            unaudited=frozenset(f"/{full}" for full in proxied))  # the leader audits those
        self._idle = IdleWatch(cfg.stream_idle_timeout_s)
        budget = StreamBudget(StreamLimits.from_config(cfg))
        grpc_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=budget.limits.threads() + cfg.max_workers,
                                       thread_name_prefix="rpc"),
            options=server_options(cfg))
        server = LayeredServer(grpc_server, [
            auth, EdgeGate(budget, self._idle), StandbyGate(FrontendRole(self.bus, counters))])  # type: ignore[arg-type]
        blobs = open_blob_store(cfg.workdir_store or default_store_url(cfg.store))
        submit_check = submit_checks(cfg, agents, blobs, jobs)

        def checked(spec: Any, who: Principal | None = None) -> None:
            try:
                submit_check(spec, who)
            except BrokerError:
                if not ops.refresh():  # a region added a moment ago: one fresh read
                    raise
                submit_check(spec, who)

        leader = LeaderPointer(store)

        def unknown(method: str) -> str:
            counters.refused(Refusal.LEADER_UNKNOWN)
            return (f"this is an API front-end: it sends {method} on to the leader, and no"
                    f" leader is on record yet ({leader.describe()}); retry shortly")

        self._leader = LeaderChannel(cfg, leader.address)
        proxy = LeaderProxy(self._leader, unknown, counters.forwarded, leader.forget)

        def agents_elsewhere(method: str) -> str:
            return (f"agents connect to the leader's agent port, not to an API front-end:"
                    f" {leader.describe()}")

        def every(module: Any, service: str) -> tuple[Any, list[str]]:
            desc = module.DESCRIPTOR.services_by_name[service]
            return desc, [m.name for m in desc.methods]

        job_service = JobService(ops, jobs, cfg, checked)
        count_submits(job_service, counters)
        desc, names = every(jobs_pb2, "JobService")
        proxy.servicer(desc, [n for n in names if n not in LOCAL_JOB_METHODS],
                       jobs_pb2_grpc.JobServiceStub, base=job_service)
        jobs_pb2_grpc.add_JobServiceServicer_to_server(job_service, server)
        capacity_pb2_grpc.add_CapacityServiceServicer_to_server(proxy.servicer(
            *every(capacity_pb2, "CapacityService"), capacity_pb2_grpc.CapacityServiceStub), server)
        auth_pb2_grpc.add_AuthServiceServicer_to_server(proxy.servicer(
            *every(auth_pb2, "AuthService"), auth_pb2_grpc.AuthServiceStub), server)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(
            refusing_servicer(*every(agent_pb2, "AgentService"),
                              agents_elsewhere), server)
        workdir_pb2_grpc.add_WorkdirServiceServicer_to_server(
            WorkdirService(blobs, cfg.workdir_max_bytes), server)
        self.health = add_probes(server, reflection=cfg.reflection)
        if cfg.insecure_dev:
            port = grpc_server.add_insecure_port(cfg.listen)
        else:
            port = grpc_server.add_secure_port(cfg.listen, server_credentials(cfg, mutual=False))
        if port == 0:
            raise RuntimeError(f"could not bind {cfg.listen}")
        if not self.bus.listener.connected.wait(30):
            log.warning("front-end %s: the store bus is not subscribed yet; calls are refused"
                        " UNAVAILABLE until it is", self.name)
        grpc_server.start()
        self._server = grpc_server
        self.port = port
        threading.Thread(target=self._refresh_loop, name="refresh", daemon=True).start()
        log.info("API front-end %s serving %s (port %d, %s), store %s; never leads", self.name,
                 cfg.listen, port, "INSECURE" if cfg.insecure_dev else "TLS", cfg.store)
        return port

    def _refresh_loop(self) -> None:
        """Every second: the health status a load balancer probes follows the store bus
        (NOT_SERVING while calls would be refused, so it sends them elsewhere); every
        5 s, agents' inventories are read from the store (a submit naming an unknown
        region is checked against them), as in an API worker."""
        from grpc_health.v1 import health_pb2

        serving, ticks = True, 0
        while not self._stopped.wait(1.0):
            if self.bus.connected != serving:
                serving = self.bus.connected
                status = (health_pb2.HealthCheckResponse.SERVING if serving
                          else health_pb2.HealthCheckResponse.NOT_SERVING)
                self.health.set("", status)  # type: ignore[attr-defined]
                log.warning("front-end %s: %s", self.name, "the store bus is back: serving" if serving
                            else "lost the store bus: NOT_SERVING until it is back")
            ticks += 1
            if ticks % 5:
                continue
            try:
                self.ops.agents.reload()
            except Exception as e:  # noqa: BLE001 - keep the last view; the next try may work
                log.warning("front-end: agent view refresh failed: %s", e)

    def stop(self, grace: float = 2.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.hub.close()  # every watcher's stream ends now
        if self._server is not None:
            self.health.enter_graceful_shutdown()  # type: ignore[attr-defined]
            self._server.stop(grace).wait(grace + 5)
        self.bus.close()  # after the server: the last creations are still announced
        self._leader.close()
        self._idle.close()
        self.telemetry.close()
        self.store.close()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)
