"""An API worker process: serves the public port beside its siblings (broker/api/workers.py).

Started by the core as ``python -m broker.api.worker_process SLOT`` with its config, the
link socket and the link key in the environment. It binds ``listen`` (SO_REUSEPORT),
serves SubmitJob, job reads, workdir transfers and probes itself, forwards the rest to
the core, follows the core's role, and stops when the core's link closes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures
from typing import Any

import grpc

from broker.agents.registry import AgentRegistry
from broker.api.aio_server import SUBMIT_METHOD, AsyncSubmit, LoopServer
from broker.api.batched_reports import BatchedReports
from broker.api.edge import EdgeGate, IdleWatch
from broker.api.errors import BrokerError
from broker.api.forwarding import Forwarder, link_metadata
from broker.api.health import add_probes
from broker.api.jobs_service import JobService, submit_checks
from broker.api.pipeline import LayeredServer
from broker.api.streams import StreamBudget, StreamLimits
from broker.api.workers import WORKER_BEAT_S
from broker.auth.audit import AuditLog
from broker.auth.identity import Principal
from broker.auth.interceptor import Authenticator, AuthInterceptor
from broker.auth.revocation import CertRevocations
from broker.auth.tls import server_credentials
from broker.auth.tokens import TokenManager
from broker.config import ApiWorkerServer, BrokerConfig
from broker.ids import set_stream
from broker.jobs.applier import Applier
from broker.jobs.hub import EventHub
from broker.jobs.ops import JobOps
from broker.jobs.views import JobsView
from broker.leadership import LEASE_NAME, StandbyGate
from broker.server import server_options
from broker.stop_signals import StopSignals
from broker.store import open_store
from broker.store.base import Store
from broker.telemetry import BrokerTelemetry, setup_tracing
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
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import worker_link_pb2 as wpb
from computebroker.v1 import worker_link_pb2_grpc as wgrpc

log = logging.getLogger("broker.api.worker")

# JobService methods a worker serves itself; every other one goes to the core.
LOCAL_JOB_METHODS = ("SubmitJob", "GetJob", "ListJobs", "GetJobEvents", "WatchJob")


class CoreFollower:
    """The core's role as the worker last heard it (the StandbyGate's ``leadership``)."""

    def __init__(self, stub: wgrpc.WorkerLinkStub, key: str, slot: int, store: Store,
                 hub: EventHub, lease_s: float) -> None:
        self.stub, self.key, self.slot, self.store, self.hub = stub, key, slot, store, hub
        self.lease_s = lease_s
        self.state = wpb.CoreState(leading=False, standby_message="the broker core is starting")
        self.heard = 0.0  # monotonic time of the core's last message
        self.first = threading.Event()
        self.gone = threading.Event()

    @property
    def is_leader(self) -> bool:
        """As the core said, while it keeps saying it (heartbeats every second): a core
        silent for a lease may be frozen past its lease, and a standby may lead now."""
        return (self.state.leading and not self.gone.is_set()
                and time.monotonic() - self.heard < self.lease_s)

    def standby_message(self) -> str:
        if self.gone.is_set():
            return "this broker is stopping; retry (another replica or its restart answers)"
        if self.state.leading:
            return (f"this broker's core has not answered its API workers for"
                    f" {time.monotonic() - self.heard:.0f} s; retry (another replica may lead)")
        return self.state.standby_message

    def run(self) -> None:
        try:
            for state in self.stub.Follow(wpb.FollowRequest(worker=self.slot, pid=os.getpid()),
                                          metadata=link_metadata(self.key)):
                if state.leading and state.fence_epoch > 0:
                    self.store.fence_writes(LEASE_NAME, state.fence_epoch)
                for job_id in state.changed_jobs:  # wake this worker's watchers of those jobs
                    self.hub.notify(job_id)
                self.heard = time.monotonic()
                self.state = state
                self.first.set()
        except grpc.RpcError as e:
            log.warning("worker %d: the core's link closed: %s", self.slot, e.code())
        finally:
            self.gone.set()
            self.first.set()


class CreationReports(BatchedReports):
    """Jobs this worker created, sent to the core in batches (one call per batch)."""

    retryable = (grpc.RpcError,)

    def __init__(self, stub: wgrpc.WorkerLinkStub, key: str, slot: int) -> None:
        super().__init__(WORKER_BEAT_S)
        self.stub, self.key, self.slot = stub, key, slot

    @property
    def calls(self) -> int:
        return self.messages

    def send(self, batch: list[pb.Job]) -> None:
        self.stub.JobsCreated(wpb.JobsCreatedRequest(worker=self.slot, jobs=batch),
                              metadata=link_metadata(self.key), timeout=5)

    def dropped(self, batch: list[pb.Job], error: BaseException) -> None:
        # Stopping (the core is gone or stopping): a core starting up reads every live
        # job from the store on its first pass.
        code = error.code() if isinstance(error, grpc.RpcError) else error
        log.warning("worker %d: %d creation report(s) not delivered: %s",
                    self.slot, len(batch), code)


class WorkerJobOps(JobOps):
    """JobOps for job creation in a worker. Its view of agents and priority classes is
    the store's, refreshed every few seconds, so a submit refused on a view that may be
    stale (a region or class added a moment ago through the core) is tried once more on
    a fresh read before the caller hears the refusal."""

    _refreshed = 0.0

    def refresh(self) -> bool:
        """Re-read agents and classes; False (nothing re-read) if that was done within
        the last second: a stream of bad submits must not become a stream of reads."""
        now = time.monotonic()
        if now - self._refreshed < 1.0:
            return False
        self._refreshed = now
        self.agents.reload()
        self.priorities.invalidate()
        return True

    def submit(self, spec: pb.JobSpec, client_request_id: str, actor: str) -> tuple[pb.Job, bool]:
        try:
            return super().submit(spec, client_request_id, actor)
        except BrokerError:
            if not self.refresh():
                raise
            return super().submit(spec, client_request_id, actor)


class ApiWorker:
    def __init__(self, config: BrokerConfig, slot: int, link_path: str, key: str) -> None:
        self.config, self.slot, self.key = config, slot, key
        self.channel = grpc.insecure_channel(f"unix:{link_path}", options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes)])
        self.link = wgrpc.WorkerLinkStub(self.channel)
        self.stopped = threading.Event()
        self.server: Any = None  # grpc.Server or LoopServer (api_worker_server)

    def start(self) -> None:
        cfg = self.config
        store = open_store(cfg.store)
        self.store = store
        hub = self.hub = EventHub()
        self.core = CoreFollower(self.link, self.key, self.slot, store, hub, cfg.leader_lease_s)
        threading.Thread(target=self._follow, name="follow", daemon=True).start()
        agents = AgentRegistry(store)
        applier = Applier(store, hub, agents, BrokerTelemetry(), cfg)
        self.reports = CreationReports(self.link, self.key, self.slot)
        applier.add_listener(self.reports.add)
        threading.Thread(target=self.reports.run, name="reports", daemon=True).start()
        ops = WorkerJobOps(applier)
        self.ops = ops
        threading.Thread(target=self._refresh_loop, name="refresh", daemon=True).start()
        jobs = JobsView(store, applier.hub)
        tokens = TokenManager.for_config(store, cfg)
        authn = Authenticator(tokens, cfg.insecure_dev, CertRevocations(
            cfg.tls_crl, cfg.cert_deny_list, cfg.tls_ca))
        audit = AuditLog(store)
        auth = AuthInterceptor(authn, audit)
        idle = IdleWatch(cfg.stream_idle_timeout_s)
        budget = StreamBudget(StreamLimits.from_config(cfg))
        pool = futures.ThreadPoolExecutor(max_workers=budget.limits.threads() + cfg.max_workers,
                                          thread_name_prefix="rpc")
        options = [*server_options(cfg), ("grpc.so_reuseport", 1)]
        aio = cfg.api_worker_server is ApiWorkerServer.AIO
        # grpc.aio (broker/api/aio_server.py): SubmitJob on the event loop, every other
        # method's code on the pool; else gRPC's sync server on the same pool.
        grpc_server: Any = LoopServer(options, pool) if aio else grpc.server(pool, options=options)
        self.pool = pool
        server = LayeredServer(grpc_server, [
            auth, EdgeGate(budget, idle),
            StandbyGate(self.core)])  # type: ignore[arg-type]
        blobs = open_blob_store(cfg.workdir_store or default_store_url(cfg.store))

        submit_check = submit_checks(cfg, agents, blobs, jobs)  # the core's checks

        def checked(spec: pb.JobSpec, who: Principal | None = None) -> None:
            try:
                submit_check(spec, who)
            except BrokerError:
                if not ops.refresh():
                    raise
                submit_check(spec, who)

        if aio:
            grpc_server.on_loop[SUBMIT_METHOD] = AsyncSubmit(
                authn=authn, audit=audit, leadership=self.core, applier=applier, ops=ops,
                check=submit_check, checked=checked, pool=pool).handler
        fwd = Forwarder(self.key)
        job_service = JobService(ops, jobs, cfg, checked)
        jobs_desc = jobs_pb2.DESCRIPTOR.services_by_name["JobService"]
        fwd.servicer(jobs_desc, jobs_pb2_grpc.JobServiceStub(self.channel),
                     names=[m.name for m in jobs_desc.methods if m.name not in LOCAL_JOB_METHODS],
                     base=job_service)
        jobs_pb2_grpc.add_JobServiceServicer_to_server(job_service, server)
        capacity_pb2_grpc.add_CapacityServiceServicer_to_server(fwd.servicer(
            capacity_pb2.DESCRIPTOR.services_by_name["CapacityService"],
            capacity_pb2_grpc.CapacityServiceStub(self.channel)), server)
        auth_pb2_grpc.add_AuthServiceServicer_to_server(fwd.servicer(
            auth_pb2.DESCRIPTOR.services_by_name["AuthService"],
            auth_pb2_grpc.AuthServiceStub(self.channel)), server)
        workdir_pb2_grpc.add_WorkdirServiceServicer_to_server(
            WorkdirService(blobs, cfg.workdir_max_bytes), server)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(_AgentsElsewhere(cfg.agent_listen), server)
        self.health = add_probes(server, reflection=cfg.reflection)
        if cfg.insecure_dev:
            port = grpc_server.add_insecure_port(cfg.listen)
        else:
            port = grpc_server.add_secure_port(cfg.listen, server_credentials(cfg, mutual=False))
        if port == 0:
            raise RuntimeError(f"api worker {self.slot} could not bind {cfg.listen}")
        if not self.core.first.wait(30):
            raise RuntimeError(f"api worker {self.slot}: the core did not answer on its link")
        grpc_server.start()
        self.server = grpc_server
        self.link.Ready(wpb.FollowRequest(worker=self.slot, pid=os.getpid()),
                        metadata=link_metadata(self.key), timeout=30)
        log.info("api worker %d (pid %d) serving %s", self.slot, os.getpid(), cfg.listen)

    def _follow(self) -> None:
        self.core.run()
        self.stopped.set()  # the core is gone or stopping: so is this worker

    def _refresh_loop(self) -> None:
        while not self.stopped.wait(5.0):
            try:
                self.ops.agents.reload()
            except Exception as e:  # noqa: BLE001 - keep the last view; the next try may work
                log.warning("worker %d: agent view refresh failed: %s", self.slot, e)

    def stop(self, grace: float = 2.0) -> None:
        self.hub.close()  # every watcher's stream ends now
        if self.server is not None:
            self.health.enter_graceful_shutdown()  # type: ignore[attr-defined]
            self.server.stop(grace).wait(grace + 5)
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.reports.close()
        self.channel.close()
        self.store.close()


class _AgentsElsewhere(agent_pb2_grpc.AgentServiceServicer):
    """Agents connect to the core (agent_listen); a worker tells one that found it."""

    def __init__(self, agent_listen: str) -> None:
        self.agent_listen = agent_listen

    def Connect(self, request_iterator, context):  # noqa: ANN001, N802
        context.abort(grpc.StatusCode.UNAVAILABLE,
                      f"agents connect to the broker's agent port ({self.agent_listen}), not to"
                      " its public API port")
        yield agent_pb2.BrokerMessage()  # unreachable: makes this a generator


def _die_with_parent(core_pid: int) -> None:
    """SIGTERM when the core dies (Linux), and exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != core_pid:
        sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    slot = int(args[0])
    _die_with_parent(int(os.environ["CB_CORE_PID"]))
    set_stream(slot + 1)  # job ids of this process never collide with a sibling's
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format=f"%(asctime)s %(levelname)s worker{slot} %(name)s: %(message)s")
    setup_tracing(f"compute-broker-worker-{slot}")
    config = BrokerConfig.model_validate_json(os.environ["CB_WORKER_CONFIG"])
    worker = ApiWorker(config, slot, os.environ["CB_LINK_SOCKET"], os.environ["CB_LINK_KEY"])
    stops = StopSignals().install()  # no lock in a handler: broker/stop_signals.py
    worker.start()
    stops.wait(until=worker.stopped.is_set)
    worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
