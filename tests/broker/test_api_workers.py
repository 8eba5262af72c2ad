"""API worker processes (``api_workers``, broker/api/workers.py) end to end.

Real brokers with real worker processes serving the public port over real TLS with
real tokens; fake agents on the core's mutual-TLS agent port. What must hold: a job
submitted through a worker is scheduled by the core and runs; forwarded calls keep the
caller's identity, its permissions and its status codes; every call is audited once;
a worker that dies is started again and nothing it created is lost; a standby core's
workers refuse, naming the leader; the link refuses anyone without its key."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.api.forwarding import LINK_KEY, PRINCIPAL_KEY, decode_principal, encode_principal
from broker.auth.audit import KIND_AUDIT
from broker.auth.identity import CredentialKind, Principal, Role
from broker.config import BrokerConfig
from broker.server import BrokerServer
from brokersdk.client import BrokerClient
from brokersdk.credentials import make_channel
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import auth_pb2 as aupb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import jobs_pb2_grpc
from computebroker.v1 import worker_link_pb2 as wpb
from computebroker.v1 import worker_link_pb2_grpc as wgrpc
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until
from tests.broker.test_agent_flow import (
    test_launch_run_succeed_with_watch as launch_run_succeed_with_watch,
)


@pytest.fixture(params=["threads", "aio"])
def wbroker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """Two workers, on either server (``api_worker_server``): every behaviour holds on both."""
    b = Broker(fast_config(tmp_path, api_workers=2, api_worker_server=request.param))
    yield b
    b.stop()


@pytest.fixture
def wagent(wbroker: Broker) -> Iterator[Callable[..., FakeAgent]]:
    agents: list[FakeAgent] = []

    def make(region: str = "us-east-2", *, nodes: int = 2, gpus: int = 8) -> FakeAgent:
        aid = f"{region}-a"
        a = FakeAgent(wbroker.address, aid, region, nodes_for(region, aid, nodes, gpus),
                      bucket=f"s3://cb-{region}")
        agents.append(a)
        return a.connect()

    yield make
    for a in agents:
        a.close()


def test_workers_serve_the_public_port_and_the_core_does_not(wbroker: Broker) -> None:
    server = wbroker.server
    assert server._pool is not None and len(server._pool.pids()) == 2
    assert set(server._link_service.following) == {0, 1}  # both follow the core
    assert set(server._link_service.ready) == {0, 1}  # and serve the port
    assert server.agent_port and server.agent_port != server.port
    me = os.getpid()
    assert all(pid != me for pid in server._pool.pids().values())


def test_a_job_submitted_through_a_worker_is_scheduled_run_and_watched(
        wbroker: Broker, wagent: Callable[..., FakeAgent]) -> None:
    # The same flow as tests/broker/test_agent_flow.py, with the submit, reads and
    # WatchJob (forwarded) going through workers, the launch and updates through the core.
    launch_run_succeed_with_watch(wbroker, wagent)


def test_submits_over_many_connections_reach_the_scheduler(wbroker: Broker,
                                                           wagent: Callable[..., FakeAgent]) -> None:
    """Connections spread over both workers (the kernel picks per connection); every
    job they create is scheduled by the core."""
    wbroker.team(gpus=1000)
    agent = wagent(nodes=8, gpus=8)
    channels = [wbroker.open_channel(wbroker.pki.operator()) for _ in range(8)]
    ids: list[str] = []
    for i, ch in enumerate(channels * 3):
        r = jobs_pb2_grpc.JobServiceStub(ch).SubmitJob(jpb.SubmitJobRequest(
            spec=spec(f"s{i}", gpus=1), client_request_id=f"r{i}"))
        assert r.created
        ids.append(r.job.id)
    for job_id in ids:
        agent.wait_launch(job_id)
    # A retried request id answers the first job, through whichever worker it lands on.
    again = jobs_pb2_grpc.JobServiceStub(channels[5]).SubmitJob(
        jpb.SubmitJobRequest(spec=spec("s0", gpus=1), client_request_id="r0"))
    assert not again.created and again.job.id == ids[0]


def test_forwarded_calls_keep_identity_permissions_and_status(wbroker: Broker) -> None:
    wbroker.team("ml")
    wbroker.team("vision")
    alice = wbroker.stubs_as("alice", Role.MEMBER, "ml")
    bob = wbroker.stubs_as("bob", Role.MEMBER, "vision")
    job = alice.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("mine", team="ml"))).job
    # WhoAmI is forwarded: the core answers with the principal the worker vouched for.
    who = bob.auth.WhoAmI(aupb.WhoAmIRequest())
    assert who.name == "bob" and who.team == "vision"
    with pytest.raises(grpc.RpcError) as e:  # CancelJob is forwarded; the core refuses,
        bob.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id))  # as if there were no such job
    assert e.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        alice.jobs.CancelJob(jpb.CancelJobRequest(job_id="j-0000000000000000"))
    assert e.value.code() is grpc.StatusCode.NOT_FOUND and "not found" in (e.value.details() or "")
    with pytest.raises(grpc.RpcError) as e:  # a member may not set quotas (forwarded)
        alice.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=cpb.TeamQuota(team="ml")))
    assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:  # validated in the worker itself
        alice.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("bad", team="ml", nodes=0)))
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    done = alice.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id, reason="mine"))
    assert done.phase == pb.JOB_PHASE_CANCELLED
    # Each call is audited once, by the worker, with its real result.
    records = [r for r in wbroker.store.list_records(KIND_AUDIT, aupb.AuditRecord)
               if r.method.endswith("/CancelJob") and r.target == job.id]
    assert sorted((r.actor, r.result) for r in records) == [
        ("user:alice", "OK"), ("user:bob", "NOT_FOUND")]


def test_a_killed_worker_is_started_again_and_loses_nothing(wbroker: Broker,
                                                            wagent: Callable[..., FakeAgent]) -> None:
    wbroker.team(gpus=1000)
    agent = wagent(nodes=8, gpus=8)
    pool, link = wbroker.server._pool, wbroker.server._link_service
    assert pool is not None and link is not None
    before = pool.pids()
    # The SDK, as a user submits: a connection the kill resets answers UNAVAILABLE
    # once, and the SDK retries the submit (idempotent on its request id).
    client = BrokerClient(wbroker.address, timeout=10, credentials=wbroker.pki.operator())
    client.submit(spec("warm", gpus=1))
    os.kill(before[0], signal.SIGKILL)
    # Until it is back, new connections land on the other worker (the kernel drops the
    # dead socket from the port's group): submits keep working throughout.
    ids = []
    for i in range(10):
        handle = client.submit(spec(f"k{i}", gpus=1), client_request_id=f"k{i}")
        assert handle.created
        ids.append(handle.id)
    wait_until(lambda: pool.restarts >= 1 and len(pool.pids()) == 2
               and pool.pids()[0] != before[0] and len(link.ready) == 2, 30,
               "the killed worker started again and following the core")
    ids.append(client.submit(spec("after", gpus=1)).id)
    client.close()
    for job_id in ids:
        agent.wait_launch(job_id)
    assert len(set(ids)) == 11


def test_creations_a_dead_worker_never_reported_are_scheduled(wbroker: Broker,
                                                             wagent: Callable[..., FakeAgent]) -> None:
    """A worker can die between a job's commit and its report to the core. The core
    then re-reads the live jobs, so the job is scheduled all the same."""
    wbroker.team(gpus=1000)
    agent = wagent(nodes=2, gpus=8)
    sched = wbroker.server.scheduler
    assert sched is not None
    # A job written into the store as only a worker would, never reported to the core:
    job = wbroker.ops.applier.creates.store.create_job(_pending_job(wbroker, "unreported"))
    pool = wbroker.server._pool
    assert pool is not None
    os.kill(pool.pids()[1], signal.SIGKILL)
    # Within 15 s: the periodic full read (30 s) is not what finds it.
    assert agent.wait_launch(job.id, timeout=15).job_id == job.id


def test_creations_a_frozen_worker_never_reported_are_scheduled(wbroker: Broker,
                                                               wagent: Callable[..., FakeAgent]) -> None:
    """A worker frozen (SIGSTOP) between a job's commit and its report keeps its link
    open, so the core cannot see it die. Its beat stops instead: after a few silent
    seconds the core re-reads the live jobs, and the job is scheduled long before the
    30 s periodic full read; continued, the worker reports again and serves."""
    wbroker.team(gpus=1000)
    agent = wagent(nodes=2, gpus=8)
    pool, link = wbroker.server._pool, wbroker.server._link_service
    assert pool is not None and link is not None
    frozen = pool.pids()[1]
    os.kill(frozen, signal.SIGSTOP)
    try:
        job = wbroker.ops.applier.creates.store.create_job(_pending_job(wbroker, "unreported"))
        assert agent.wait_launch(job.id, timeout=15).job_id == job.id
        assert 1 in link.silent
    finally:
        os.kill(frozen, signal.SIGCONT)
    wait_until(lambda: 1 not in link.silent, 10, "the continued worker reports again")
    assert pool.pids()[1] == frozen  # not restarted: only re-read around


def test_an_idle_worker_beats_and_is_not_taken_for_frozen(wbroker: Broker) -> None:
    link = wbroker.server._link_service
    assert link is not None
    first = dict(link.heard)
    wait_until(lambda: all(link.heard.get(s, 0) > first.get(s, 0) for s in (0, 1)), 10,
               "both idle workers' beats")
    assert not link.silent


def _pending_job(b: Broker, name: str) -> pb.Job:
    from broker.ids import new_job_id
    from broker.jobs import transitions

    out = transitions.submit(transitions.Submit(job_id=new_job_id(), spec=spec(name, gpus=1),
                                                client_request_id="", actor="test",
                                                regions_known=True),
                             b.ops.clock(), b.config)
    return out.job


def test_a_standby_cores_workers_refuse_naming_the_leader(tmp_path: Path, wbroker: Broker) -> None:
    standby = BrokerServer(fast_config(tmp_path, api_workers=1, broker_id="second"))
    port = standby.start()
    channel = make_channel(f"127.0.0.1:{port}", wbroker.pki.operator())
    try:
        assert standby.leadership is not None and not standby.leadership.is_leader
        with pytest.raises(grpc.RpcError) as e:
            jobs_pb2_grpc.JobServiceStub(channel).GetJob(jpb.GetJobRequest(job_id="j-1"), timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "standby broker second" in (e.value.details() or "")
        assert wbroker.server.holder in (e.value.details() or "")
    finally:
        channel.close()
        standby.stop(0.5)


def test_the_link_refuses_calls_without_its_key(wbroker: Broker) -> None:
    link = wbroker.server._link
    assert link is not None
    assert oct(os.stat(link.dir).st_mode & 0o777) == "0o700"  # this user only
    channel = grpc.insecure_channel(link.address)
    try:
        jobs = jobs_pb2_grpc.JobServiceStub(channel)
        forged = encode_principal(Principal("mallory", Role.OPERATOR, credential=CredentialKind.TOKEN))
        with pytest.raises(grpc.RpcError) as e:
            jobs.GetJob(jpb.GetJobRequest(job_id="j-1"), metadata=[(PRINCIPAL_KEY, forged)], timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            jobs.GetJob(jpb.GetJobRequest(job_id="j-1"), timeout=10,
                        metadata=[(PRINCIPAL_KEY, forged), (LINK_KEY, "guess")])
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        stub = wgrpc.WorkerLinkStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.JobsCreated(wpb.JobsCreatedRequest(jobs=[pb.Job(id="j-x")]), timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            next(iter(stub.Follow(wpb.FollowRequest(worker=9), timeout=10)))
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()


def test_principal_round_trips_through_the_link_header() -> None:
    p = Principal("carol", Role.TEAM_ADMIN, team="nlp", credential=CredentialKind.TOKEN, token_id="t-1")
    assert decode_principal(encode_principal(p)) == p


@pytest.mark.parametrize(("settings", "needle"), [
    ({"store": "sqlite:///:memory:"}, "sqlite:///:memory: lives in one process"),
    ({"agent_listen": ""}, "api_workers needs agent_listen"),
])
def test_workers_refuse_configs_they_cannot_serve(tmp_path: Path, settings: dict[str, Any],
                                                  needle: str) -> None:
    config = fast_config(tmp_path, api_workers=2, **settings)
    with pytest.raises(RuntimeError, match=needle):
        BrokerServer(config).start()


def test_workers_follow_a_redis_core_and_fence_with_its_epoch(tmp_path: Path, redis_server: Any) -> None:
    """With Redis the lease has an epoch; a worker's writes carry it (a wrong one would
    be refused Fenced), so submits through workers prove it arrived."""
    import uuid

    b = Broker(fast_config(tmp_path, api_workers=2,
                           store=f"{redis_server.url}?prefix=w{uuid.uuid4().hex[:10]}"))
    try:
        assert b.server.leadership is not None and b.server.leadership.epoch > 0
        b.team()
        channels = [b.open_channel(b.pki.operator()) for _ in range(4)]
        for i, ch in enumerate(channels):
            r = jobs_pb2_grpc.JobServiceStub(ch).SubmitJob(jpb.SubmitJobRequest(spec=spec(f"r{i}")))
            assert r.created and r.job.phase == pb.JOB_PHASE_PENDING
        got = b.jobs.ListJobs(jpb.ListJobsRequest(team="ml"))
        assert len(got.jobs) == 4
    finally:
        b.stop()


def test_update_of_a_worker_job_goes_through_the_core_applier(wbroker: Broker,
                                                              wagent: Callable[..., FakeAgent]) -> None:
    """After its creation a job is the core's: its next writes (launch, updates) are
    made by the core, with version checks, as for any job."""
    wbroker.team()
    agent = wagent()
    job = wbroker.submit(spec("v"))
    launch = agent.wait_launch(job.id)
    agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=3)
    running = wbroker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    assert running.version > job.version
    got: list[pb.JobEvent] = []
    stop = threading.Event()

    def watch() -> None:
        for ev in wbroker.jobs.WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=30):
            got.append(ev)
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    wbroker.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id, reason="done"))
    agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_STOPPED)
    assert stop.wait(20)
    assert got[-1].to_phase == pb.JOB_PHASE_CANCELLED


def test_config_default_is_one_process(tmp_path: Path) -> None:
    assert BrokerConfig(store=f"sqlite:///{tmp_path}/x.sqlite").api_workers == 0


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(tmp_path: Path, port: int, *settings: str) -> subprocess.Popen[bytes]:
    """`brokerctl serve` with two API workers, plaintext loopback, in a process of its own."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{root / 'proto'}")
    return subprocess.Popen(
        [sys.executable, "-m", "brokerctl", "serve", "--listen", f"127.0.0.1:{port}",
         "--agent-listen", f"127.0.0.1:{_free_port()}", "--store", f"sqlite:///{tmp_path}/b.sqlite",
         "--checkpoint-root", str(tmp_path / "ckpt"), "--insecure-dev", "--set", "api_workers=2",
         *(a for kv in settings for a in ("--set", kv))],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_workers_die_with_a_killed_core(tmp_path: Path) -> None:
    """SIGKILL of the `brokerctl serve` process leaves no worker holding the port."""
    import socket

    port = _free_port()
    core = _serve(tmp_path, port)
    try:
        pids = wait_until(lambda: len(_children(core.pid)) == 2 and _children(core.pid), 60,
                          "two api workers")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        jobs_pb2_grpc.JobServiceStub(channel).ListJobs(jpb.ListJobsRequest(), timeout=30,
                                                       wait_for_ready=True)
        channel.close()
        core.kill()
        core.wait(10)
        wait_until(lambda: not any(_alive(p) for p in pids), 30, "the workers to exit")
        with socket.socket() as s:  # nobody serves the port any more
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        if core.poll() is None:
            core.kill()
            core.wait()


def test_workers_of_a_frozen_core_stop_answering_as_the_leader(tmp_path: Path) -> None:
    """A core frozen (SIGSTOP) past its lease may have lost it to a standby: its workers,
    hearing no heartbeat for a lease, refuse UNAVAILABLE (clients move to another
    replica) instead of answering for a leader that may not be one; once the core is
    continued they serve again."""
    port = _free_port()
    core = _serve(tmp_path, port, "leader_lease_s=2")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    jobs = jobs_pb2_grpc.JobServiceStub(channel)
    try:
        jobs.ListJobs(jpb.ListJobsRequest(), timeout=30, wait_for_ready=True)
        os.kill(core.pid, signal.SIGSTOP)

        def refused() -> str:
            try:
                jobs.ListJobs(jpb.ListJobsRequest(), timeout=5)
            except grpc.RpcError as e:
                return e.details() or "" if e.code() is grpc.StatusCode.UNAVAILABLE else ""
            return ""

        message = wait_until(refused, 20, "workers refusing for a frozen core")
        assert "has not answered its API workers" in message
        os.kill(core.pid, signal.SIGCONT)
        wait_until(lambda: jobs.ListJobs(jpb.ListJobsRequest(), timeout=5) is not None, 20,
                   "workers serving again after SIGCONT")
    finally:
        channel.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(core.pid, signal.SIGCONT)
        core.kill()
        core.wait()


def test_job_ids_of_two_processes_never_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers creating a job in the same microsecond get different ids: each
    process has its own id stream (broker/ids.py), not just a random byte's luck."""
    from broker import ids

    monkeypatch.setattr(ids.time, "time", lambda: 1_800_000_000.123456)
    made = []
    for stream in (1, 2):
        monkeypatch.setattr(ids, "_last", 0)  # a fresh process
        ids.set_stream(stream)
        made.append(ids.new_job_id())
    ids.set_stream(0)
    a, b = made
    assert a != b and len(a) == len(b) == 19 and a[:15] == b[:15]  # same microsecond
    assert (a[15:17], b[15:17]) == ("01", "02")
    with pytest.raises(ValueError):
        ids.set_stream(256)


def test_one_request_id_sent_through_every_worker_at_once_makes_one_job(wbroker: Broker) -> None:
    """The same request id arriving on many connections at once (a client retrying
    over a new connection while the first try is in flight) lands on both workers; each
    worker's create races the other's in the store, and exactly one job comes out."""
    from concurrent.futures import ThreadPoolExecutor

    wbroker.team()
    channels = [wbroker.open_channel(wbroker.pki.operator()) for _ in range(12)]
    for round_ in range(5):
        crid = f"dup-{round_}"
        start = threading.Barrier(len(channels))

        def submit(ch: grpc.Channel, crid: str = crid, start: threading.Barrier = start) -> jpb.SubmitJobResponse:
            start.wait()
            return jobs_pb2_grpc.JobServiceStub(ch).SubmitJob(
                jpb.SubmitJobRequest(spec=spec("dup"), client_request_id=crid), timeout=30)

        with ThreadPoolExecutor(len(channels)) as pool:
            answers = list(pool.map(submit, channels))
        assert sum(a.created for a in answers) == 1
        assert len({a.job.id for a in answers}) == 1
    jobs = wbroker.jobs.ListJobs(jpb.ListJobsRequest(team="ml")).jobs
    assert len(jobs) == 5


def test_a_workers_tap_is_removed_when_its_stream_ends() -> None:
    """Each Follow stream taps the hub with its mailbox's bound method and untaps with a
    new bound-method object of the same mailbox: only that tap goes, the others stay."""
    from broker.api.workers import _Mailbox
    from broker.jobs.hub import EventHub

    hub, first, second = EventHub(), _Mailbox(), _Mailbox()
    hub.tap(first.add)
    hub.tap(second.add)
    hub.untap(first.add)
    hub.notify("j-1")
    assert second.take(0) == ["j-1"] and first.take(0) == []
    hub.notify("j-2", tap=False)  # a worker's own creation is not echoed
    assert second.take(0) == []
    hub.untap(second.add)
    hub.notify("j-3")
    assert second.take(0) == []


def test_checkpoint_rules_hold_through_workers(wbroker: Broker, wagent: Callable[..., FakeAgent]) -> None:
    """The submit checks (own prefix, resume_from only with a share) run in the workers,
    which serve SubmitJob themselves; ShareCheckpoints/RevokeCheckpointShare are
    forwarded to the core with the caller's identity (the owner check sees alice)."""
    from tests.broker.test_checkpoint_shares import (
        test_same_team_resume_needs_a_share_and_a_revoked_share_refuses_again as share_flow,
    )

    share_flow(wbroker, lambda bucket="": wagent())
