"""Test harness: a real broker on 127.0.0.1:0 (SQLite in tmp_path) and a scripted
fake region agent that speaks the real AgentService stream over a real channel.

Everything runs over real TLS with real credentials from the process's dev CA
(tests/fixtures/pki.py): ``Broker(config).jobs/.capacity/.auth`` act as the bootstrap
operator; :meth:`Broker.stubs_as` gives stubs for a user/role (a real token made through
the broker's token store) and :meth:`Broker.agent_channel` an agent's mutual-TLS channel.
A :class:`FakeAgent` given the broker's ``address`` connects to its mutual-TLS agent port
with a certificate naming its own region and agent id."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from broker.auth.identity import Role
from broker.config import BrokerConfig
from broker.server import BrokerServer
from brokersdk.credentials import ClientCredentials, make_channel
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import (
    agent_pb2_grpc,
    auth_pb2_grpc,
    capacity_pb2_grpc,
    jobs_pb2_grpc,
    workdir_pb2_grpc,
)
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.fixtures.pki import session_pki

# A broker's main address -> its mutual-TLS agent address (FakeAgent looks it up).
AGENT_ADDRESSES: dict[str, str] = {}

TERMINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}


def wait_until(pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition",
               interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


def fast_config(tmp_path: Path, **kw: Any) -> BrokerConfig:
    base: dict[str, Any] = dict(
        listen="127.0.0.1:0", store=f"sqlite:///{tmp_path / 'broker.sqlite'}",
        scheduler_interval_s=0.1, heartbeat_interval_s=0.2, agent_timeout_s=2.0,
        startup_grace_s=1.0, checkpoint_root=str(tmp_path / "ckpt"),
        progress_write_interval_s=0.0, progress_event_every_steps=10, max_workers=32,
        cancel_timeout_s=5.0, stop_timeout_s=2.0, preempt_grace_s=2.0,
        agent_listen="127.0.0.1:0", **session_pki().broker_settings(),
    )
    base.update(kw)
    return BrokerConfig(**base)


@dataclass
class Stubs:
    """Client stubs of every user-facing service over one channel."""

    channel: grpc.Channel
    jobs: jobs_pb2_grpc.JobServiceStub
    capacity: capacity_pb2_grpc.CapacityServiceStub
    auth: auth_pb2_grpc.AuthServiceStub
    workdir: workdir_pb2_grpc.WorkdirServiceStub
    agent: agent_pb2_grpc.AgentServiceStub

    @classmethod
    def over(cls, channel: grpc.Channel) -> Stubs:
        return cls(channel, jobs_pb2_grpc.JobServiceStub(channel),
                   capacity_pb2_grpc.CapacityServiceStub(channel),
                   auth_pb2_grpc.AuthServiceStub(channel), workdir_pb2_grpc.WorkdirServiceStub(channel),
                   agent_pb2_grpc.AgentServiceStub(channel))


class Broker:
    """A running broker plus client stubs acting as the bootstrap operator."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.server = BrokerServer(config)
        self.port = self.server.start()
        self.address = f"127.0.0.1:{self.port}"
        self.agent_address = f"127.0.0.1:{self.server.agent_port}" if self.server.agent_port else self.address
        AGENT_ADDRESSES[self.address] = self.agent_address
        self.pki = session_pki()
        self._channels: list[grpc.Channel] = []
        self.channel = self.open_channel(None if config.insecure_dev else self.pki.operator())
        self.jobs = jobs_pb2_grpc.JobServiceStub(self.channel)
        self.capacity = capacity_pb2_grpc.CapacityServiceStub(self.channel)
        self.auth = auth_pb2_grpc.AuthServiceStub(self.channel)

    # ---- identities ----------------------------------------------------------------
    def open_channel(self, creds: ClientCredentials | None, *, mtls: bool = False) -> grpc.Channel:
        """A channel with ``creds`` (None: plaintext, for insecure_dev brokers) to the main
        port, or with ``mtls`` to the mutual-TLS agent port; closed by :meth:`stop`."""
        address = self.agent_address if mtls else self.address
        ch = make_channel(address, creds or ClientCredentials(insecure=True))
        self._channels.append(ch)
        return ch

    def token_for(self, user: str, role: Role = Role.MEMBER, team: str = "ml") -> str:
        """A real bearer token for ``user`` (made in the broker's token store)."""
        assert self.server.tokens is not None
        return self.server.tokens.create(user, team, role, "test").secret

    def stubs_as(self, user: str = "alice", role: Role = Role.MEMBER, team: str = "ml", *,
                 cert: bool = False) -> Stubs:
        """Stubs acting as ``user`` with ``role`` in ``team``: by token on the main port,
        or (``cert=True``) by a user certificate on the mutual-TLS port."""
        if cert:
            return Stubs.over(self.open_channel(self.pki.cert_credentials(user, role, team), mtls=True))
        return Stubs.over(self.open_channel(self.pki.token_credentials(self.token_for(user, role, team))))

    def agent_channel(self, region: str, agent_id: str) -> grpc.Channel:
        """A mutual-TLS channel whose certificate names ``region``/``agent_id``."""
        return self.open_channel(self.pki.agent_credentials(region, agent_id), mtls=True)

    def anonymous(self) -> Stubs:
        """TLS, no credential at all."""
        return Stubs.over(self.open_channel(ClientCredentials(ca=self.pki.ca_file)))

    @property
    def ops(self):  # noqa: ANN201
        return self.server.ops

    @property
    def store(self):  # noqa: ANN201
        return self.server.store

    def stop(self) -> None:
        for ch in self._channels:
            ch.close()
        AGENT_ADDRESSES.pop(self.address, None)
        self.server.stop(0.5)

    # conveniences
    def team(self, team: str = "ml", gpus: int = 64, **kw: Any) -> cpb.TeamQuota:
        return self.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=cpb.TeamQuota(
            team=team, quotas=[cpb.QuotaEntry(guaranteed_gpus=gpus)], **kw)))

    def submit(self, spec: pb.JobSpec, crid: str = "") -> pb.Job:
        return self.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec, client_request_id=crid)).job

    def get(self, job_id: str) -> pb.Job:
        return self.jobs.GetJob(jpb.GetJobRequest(job_id=job_id))

    def events(self, job_id: str) -> list[pb.JobEvent]:
        return list(self.jobs.GetJobEvents(jpb.GetJobEventsRequest(job_id=job_id)).events)

    def wait_phase(self, job_id: str, *phases: int, timeout: float = 20.0) -> pb.Job:
        return wait_until(lambda: (j := self.get(job_id)).phase in phases and j, timeout,
                          f"job {job_id} in {[pb.JobPhase.Name(p) for p in phases]}"
                          f" (now {pb.JobPhase.Name(self.get(job_id).phase)})")


def spec(name: str = "job", *, team: str = "ml", nodes: int = 1, gpus: int = 1, **kw: Any) -> pb.JobSpec:
    s = pb.JobSpec(name=name, team=team, priority_class="training",
                   resources=pb.Resources(nodes=nodes, gpus_per_node=gpus),
                   trainer=pb.TrainerSpec(total_steps=100, checkpoint_every=10, global_batch_size=8))
    for k, v in kw.items():
        if isinstance(v, list):
            getattr(s, k).extend(v)
        elif isinstance(v, dict):
            getattr(s, k).update(v)
        elif hasattr(v, "CopyFrom"):
            getattr(s, k).CopyFrom(v)
        else:
            setattr(s, k, v)
    return s


def nodes_for(region: str, prefix: str, count: int, gpus: int, **kw: Any) -> list[pb.Node]:
    return [pb.Node(id=f"{prefix}-n{i}", region=region, zone=f"{region}-az1", instance_type="p5.48xlarge",
                    accelerator=kw.get("accelerator", "h100"), gpus=gpus, healthy=True,
                    capacity_type=kw.get("capacity_type", pb.CAPACITY_TYPE_ON_DEMAND),
                    pool=kw.get("pool", ""), network_layer_3=f"{prefix}-l3")
            for i in range(count)]


def agent_channel(address: str, region: str, agent_id: str,
                  identity: tuple[str, str] | None = None) -> grpc.Channel:
    """A mutual-TLS channel to the agent port of the broker at ``address`` (its main
    address is fine: :data:`AGENT_ADDRESSES` maps it), with a certificate for
    ``identity`` (default: this region and agent id)."""
    cert_region, cert_agent = identity or (region, agent_id)
    pki = session_pki()
    target = AGENT_ADDRESSES.get(address, address)
    return make_channel(target, pki.agent_credentials(cert_region, cert_agent))


@dataclass
class FakeAgent:
    """Scripted region agent: registers, heartbeats, records and acks commands.

    Attempts are not run: the test drives them with :meth:`update`.
    """

    address: str
    agent_id: str
    region: str
    nodes: list[pb.Node]
    bucket: str = ""
    store_error: str = ""  # Register.checkpoint_store_error (the agent's store probe)
    roots: list[str] = field(default_factory=list)  # Register.checkpoint_roots
    auto_ack: bool = True
    heartbeat: bool = True
    refuse_launch: bool = False
    running: dict[str, int] = field(default_factory=dict)  # job_id -> attempt
    states: dict[str, int] = field(default_factory=dict)  # job_id -> state in Register (RUNNING)
    received: list[apb.BrokerMessage] = field(default_factory=list)
    ack: apb.RegisterAck | None = None
    # (region, agent id) its certificate names; None = its own region and agent id.
    identity: tuple[str, str] | None = None
    error: grpc.RpcError | None = None  # how the broker ended the stream, if it did
    ended: bool = False  # the broker closed the stream (e.g. it stopped leading): dial again
    update_acks: list[apb.JobUpdateAck] = field(default_factory=list)  # committed updates
    spares: dict[str, int] = field(default_factory=dict)  # Register.pool_spares: pool -> N
    # Terminal updates sent and not acknowledged yet, by (job, attempt). As the real agent
    # (region_agents/agent.py) does, a reconnect lists these attempts in its Register with
    # their end state and re-sends them after the RegisterAck. Without that, a Register
    # sent while an end was unacknowledged omitted the attempt, the broker (rightly)
    # relaunched it as missing, and the re-sent end was acked as a superseded attempt's:
    # a scripted-agent artifact that read as "lost acknowledged terminal updates".
    unacked: dict[tuple[str, int], apb.JobUpdate] = field(default_factory=dict)
    # False: Register omits them as this class once did (benchmarks/store_failover.py
    # runs that as its baseline, to show what the omission produced).
    list_unacked_ends: bool = True

    def __post_init__(self) -> None:
        self._out: queue.Queue[apb.AgentMessage | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.channel: grpc.Channel | None = None
        self._threads: list[threading.Thread] = []

    # ---- stream ---------------------------------------------------------------------
    def _requests(self) -> Iterator[apb.AgentMessage]:
        while True:
            msg = self._out.get()
            if msg is None:
                return
            yield msg

    def connect(self) -> FakeAgent:
        self._gen = gen = object()  # this stream; an old reader's end is not our error
        self._stop.clear()
        self._out = queue.Queue()
        self.ack = None
        self.error = None
        self.ended = False
        self.channel = agent_channel(self.address, self.region, self.agent_id, self.identity)
        stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        running = [apb.RunningAttempt(job_id=j, attempt=a,
                                      state=self.states.get(j, apb.ATTEMPT_STATE_RUNNING))
                   for j, a in self.running.items()]
        with self._lock:
            ended = [u for (j, a), u in self.unacked.items()
                     if self.list_unacked_ends and j not in self.running and a >= max(
                         (b for (k, b) in self.unacked if k == j), default=0)]
        running += [apb.RunningAttempt(job_id=u.job_id, attempt=u.attempt, state=u.state,
                                       progress=u.progress) for u in ended]
        self._out.put(apb.AgentMessage(register=apb.Register(
            agent_id=self.agent_id, region=self.region, nodes=self.nodes, running=running,
            executor="fake", checkpoint_bucket=self.bucket,
            checkpoint_store_error=self.store_error, checkpoint_roots=self.roots,
            pool_spares=self.spares)))
        responses = stub.Connect(self._requests())
        t = threading.Thread(target=self._read, args=(responses, gen), daemon=True)
        t.start()
        self._threads = [t]
        if self.heartbeat:
            h = threading.Thread(target=self._beat, daemon=True)
            h.start()
            self._threads.append(h)
        wait_until(lambda: self.ack is not None or self.error is not None, 10,
                   f"RegisterAck for {self.agent_id}")
        if self.ack is None and self.error is not None:
            raise self.error  # refused (e.g. PERMISSION_DENIED for another identity)
        self.resend_unacked()  # ends the broker has not acknowledged (contracts §9)
        return self

    def resend_unacked(self) -> int:
        """Send again every terminal update not acknowledged yet (the real agent does on
        each reconnect and every few heartbeats); returns how many."""
        with self._lock:
            pending = list(self.unacked.values())
        for u in pending:
            self.send(apb.AgentMessage(job_update=u))
        return len(pending)

    def _read(self, responses: Iterator[apb.BrokerMessage], gen: object = None) -> None:
        try:
            for msg in responses:
                kind = msg.WhichOneof("cmd")
                if kind == "registered":
                    self.ack = msg.registered
                    for j in msg.registered.stale_job_ids:
                        with self._lock:
                            self.running.pop(j, None)
                    continue
                if kind == "update_ack":  # the broker committed a JobUpdate to the store
                    a = msg.update_ack
                    with self._lock:
                        self.update_acks.append(a)
                        u = self.unacked.get((a.job_id, a.attempt))
                        if u is not None and u.state == a.state:
                            del self.unacked[(a.job_id, a.attempt)]
                    continue
                if kind == "heartbeat_ack":  # liveness, not a command
                    continue
                with self._lock:
                    self.received.append(msg)
                accepted, why = True, ""
                if kind == "launch":
                    if self.refuse_launch:
                        accepted, why = False, "refused by test"
                    else:
                        with self._lock:
                            self.running[msg.launch.job_id] = msg.launch.attempt
                elif kind == "stop" and msg.stop.reason == apb.STOP_REASON_STALE_ATTEMPT:
                    with self._lock:
                        if self.running.get(msg.stop.job_id) == msg.stop.attempt:
                            self.running.pop(msg.stop.job_id, None)
                if self.auto_ack:
                    self.send(apb.AgentMessage(ack=apb.CommandAck(
                        command_id=msg.command_id, accepted=accepted, message=why)))
        except grpc.RpcError as e:
            if getattr(self, "_gen", None) is gen:
                self.error = e
            return
        if getattr(self, "_gen", None) is gen:
            self.ended = True

    def _beat(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                running = [apb.RunningAttempt(job_id=j, attempt=a, state=apb.ATTEMPT_STATE_RUNNING)
                           for j, a in self.running.items()]
            self.send(apb.AgentMessage(heartbeat=apb.Heartbeat(time=time.time(), running=running)))

    def send(self, msg: apb.AgentMessage) -> None:
        if not self._stop.is_set():
            self._out.put(msg)

    def close(self) -> None:
        """End the stream (like a crash or a network cut: no goodbye)."""
        self._stop.set()
        self._out.put(None)
        if self.channel is not None:
            self.channel.close()

    # ---- test helpers ------------------------------------------------------------------
    def acked(self, job_id: str, state: int, attempt: int | None = None) -> bool:
        """Did the broker acknowledge this job's update to ``state`` (of ``attempt``, or
        any)? An ack means committed, or ignored as a superseded attempt's (contracts §9)."""
        with self._lock:
            return any(a.job_id == job_id and a.state == state
                       and (attempt is None or a.attempt == attempt) for a in self.update_acks)

    def commands(self, kind: str, job_id: str | None = None) -> list[Any]:
        with self._lock:
            out = [getattr(m, kind) for m in self.received if m.WhichOneof("cmd") == kind]
        return [c for c in out if job_id is None or c.job_id == job_id]

    def wait_launch(self, job_id: str, attempt: int | None = None, timeout: float = 20.0) -> apb.Launch:
        def find() -> apb.Launch | None:
            ls = [c for c in self.commands("launch", job_id) if attempt is None or c.attempt == attempt]
            return ls[-1] if ls else None
        return wait_until(find, timeout, f"Launch of {job_id} on {self.agent_id}")

    def wait_stop(self, job_id: str, reason: int | None = None, timeout: float = 20.0) -> apb.Stop:
        def find() -> apb.Stop | None:
            ss = [c for c in self.commands("stop", job_id) if reason is None or c.reason == reason]
            return ss[-1] if ss else None
        return wait_until(find, timeout, f"Stop of {job_id} on {self.agent_id}")

    def update(self, job_id: str, attempt: int, state: int, *, step: int = 0, ckpt_step: int = 0,
               ckpt_uri: str = "", exit_code: int = 0, message: str = "",
               failed_nodes: list[str] | None = None, ranks: int = 0) -> None:
        prog = pb.Progress(step=step, total_steps=100, last_checkpoint_step=ckpt_step,
                           last_checkpoint_uri=ckpt_uri)
        upd = apb.JobUpdate(
            job_id=job_id, attempt=attempt, state=state, progress=prog, exit_code=exit_code,
            message=message, failed_nodes=failed_nodes or [], time=time.time(), ranks=ranks)
        if state in (apb.ATTEMPT_STATE_SUCCEEDED, apb.ATTEMPT_STATE_FAILED,
                     apb.ATTEMPT_STATE_CHECKPOINTED, apb.ATTEMPT_STATE_STOPPED):
            with self._lock:
                self.unacked[(job_id, attempt)] = upd  # before sending: the ack may be quick
                if self.running.get(job_id) == attempt:
                    self.running.pop(job_id, None)
        self.send(apb.AgentMessage(job_update=upd))
