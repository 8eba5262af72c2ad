"""API front-ends on another host (broker/api/frontend.py, broker/api/store_bus.py).

Real hosts as network namespaces (tests/fixtures/netns.py, names ``cbfe-<pid>-..``):
host ``core`` runs redis-server, the leader, a standby replica and a region agent; host
``fe`` runs ``brokerctl serve --frontend`` over the same Redis. The test process (the
root namespace) calls the front-end only, over TLS with a bearer token:

* an anonymous call is refused as on the leader; calls the front-end does not serve
  are sent on to the leader on the other host, and its answer comes back;
* a submit through the front-end is scheduled by the leader promptly (its wake-up
  crosses hosts on the store's pub/sub; without it the leader would only find the job
  at its 30 s full read) and runs to the end, watched through the front-end;
* a retried request id resolves to the first job, through the front-end and the leader;
* the leader is SIGKILLed: the standby takes over, and the next submit through the
  same front-end (which was told nothing) is again scheduled promptly.

Skipped, saying why, only without root or ``ip netns``; the namespaces are removed in
a ``finally`` whatever happens.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import grpc
import pytest
import redis

from brokersdk.client import BrokerClient
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import jobs_pb2_grpc
from tests.e2e.test_foundation import spec
from tests.fixtures import netns
from tests.fixtures.chaos import launch
from tests.fixtures.cluster import Cluster, Proc, _kill_leftover_trainers, wait_until
from tests.fixtures.redis_server import REDIS_SERVER

pytestmark = pytest.mark.slow

LEASE_S = 3.0
# A front-end's submit must be scheduled well inside the leader's 30 s full read: the
# wake-up is a pub/sub message (milliseconds); the rest is the box's load.
WAKE_BOUND_S = 8.0


def req_of(name: str, client_request_id: str = "", **kw: int) -> jpb.SubmitJobRequest:
    return jpb.SubmitJobRequest(spec=spec(name, **kw), client_request_id=client_request_id)


def _probe(address: str, sec: launch.Security) -> bool:
    try:
        with launch.channel(address, sec) as ch:
            grpc.channel_ready_future(ch).result(timeout=2)
        return True
    except grpc.FutureTimeoutError:
        return False


def _scheduled_after(stub: jobs_pb2_grpc.JobServiceStub, meta: tuple, job_id: str,
                     acked: float, bound: float) -> float:
    """Seconds from the submit's answer to the job leaving PENDING (read on the
    front-end every 20 ms), failing past ``bound``."""
    while time.monotonic() - acked < bound:
        job = stub.GetJob(jpb.GetJobRequest(job_id=job_id), metadata=meta, timeout=5)
        if job.phase != pb.JOB_PHASE_PENDING:
            return time.monotonic() - acked
        time.sleep(0.02)
    raise AssertionError(f"{job_id} still pending {bound} s after the front-end acknowledged it")


def test_frontend_on_another_host_submits_wake_the_leader_across_failover(tmp_path: Path) -> None:
    why = netns.available()
    if why:
        pytest.skip(f"API front-ends on another host need network namespaces: {why}")
    net = netns.Network(prefix=f"cbfe-{os.getpid()}-{secrets.token_hex(1)}")
    procs: list[Proc] = []
    try:
        core, fe = net.add_host("core"), net.add_host("fe")
        sec = launch.Security.create(tmp_path / "pki", [core.ip, fe.ip])
        env = launch.base_env()
        (tmp_path / "redis").mkdir()
        rproc = Proc("redis", net.wrap("core", [
            REDIS_SERVER, "--port", "6379", "--bind", core.ip, "--save", "", "--appendonly", "no",
            "--dir", str(tmp_path / "redis"), "--protected-mode", "no"]), tmp_path / "logs" / "redis.log")
        rproc.start(env)
        procs.append(rproc)
        rc = redis.Redis(host=core.ip, port=6379, socket_connect_timeout=1)
        wait_until(lambda: rc.ping(), timeout=30, interval=0.1, what="redis-server in host core")
        store = f"redis://{core.ip}:6379/0?prefix=fe{secrets.token_hex(4)}"
        leader_addr, standby_addr = f"{core.ip}:50051", f"{core.ip}:50061"
        fe_addr = f"{fe.ip}:50051"

        def broker(name: str, listen: str, *extra: str) -> Proc:
            argv = launch.broker_argv(listen, store, tmp_path / "ckpt",
                                      {"broker_id": name, "leader_lease_s": str(LEASE_S)}, sec)
            p = launch.start(name, [*argv, *extra], tmp_path / "logs" / f"{name}.log", env,
                             net.wrap("core" if name != "frontend" else "fe", []))
            procs.append(p)
            wait_until(lambda: not p.alive() or _probe(listen, sec), timeout=90,
                       what=f"{name} on {listen}\n{p.tail()}")
            assert p.alive(), p.tail()
            return p

        def logs() -> str:
            return "\n".join(f"--- {p.name}\n{p.tail(30)}" for p in procs)

        leader = broker("fe-leader", leader_addr)
        broker("fe-standby", standby_addr)
        frontend = broker("frontend", fe_addr, "--frontend", "--frontend-id", "3")
        inv = Cluster(root=tmp_path).write_inventory("us-east-2", nodes=1, gpus=1)
        agent = launch.start("agent", launch.agent_argv([leader_addr, standby_addr], "us-east-2", inv,
                                                        tmp_path / "agent", sec),
                             tmp_path / "logs" / "agent.log", env, net.wrap("core", []))
        procs.append(agent)

        with BrokerClient(leader_addr, timeout=5, credentials=sec.credentials()) as admin:
            admin.set_team_quota(team="ml", guaranteed_gpus=8)
            wait_until(lambda: any(r.connected for r in admin.regions()), timeout=90,
                       what=f"agent connected\n{logs()}")

        meta = (("authorization", f"Bearer {sec.token}"),)
        with launch.channel(fe_addr, sec) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            # Anonymous: refused as on the leader, before anything is read or written.
            tls_only = grpc.ssl_channel_credentials(sec.ca.ca_cert_path.read_bytes())
            with grpc.secure_channel(fe_addr, tls_only) as bare, pytest.raises(grpc.RpcError) as anon:
                jobs_pb2_grpc.JobServiceStub(bare).SubmitJob(req_of("fe-anon"), timeout=5)
            assert anon.value.code() is grpc.StatusCode.UNAUTHENTICATED, anon.value.details()
            # What lives in the leader's memory is the leader's: sent on to it across
            # hosts, as the caller, and its answer relayed.
            with pytest.raises(grpc.RpcError) as cancel:
                stub.CancelJob(jpb.CancelJobRequest(job_id="j-none"), metadata=meta, timeout=10)
            assert cancel.value.code() is grpc.StatusCode.NOT_FOUND, cancel.value.details()

            # A submit through the front-end, scheduled by the leader on another host.
            req = req_of("fe-one", steps=6, every=3, client_request_id="fe-once")
            first = stub.SubmitJob(req, metadata=meta, timeout=10)
            acked = time.monotonic()
            assert first.created
            wake = _scheduled_after(stub, meta, first.job.id, acked, WAKE_BOUND_S)
            # The id comes from the front-end's own stream (64 + its frontend_id).
            assert first.job.id[15:17] == f"{64 + 3:02x}", first.job.id
            # Idempotent whoever answers: the front-end and the leader name the first job.
            again = stub.SubmitJob(req, metadata=meta, timeout=10)
            assert not again.created and again.job.id == first.job.id
            with launch.channel(leader_addr, sec) as lch:
                via_leader = jobs_pb2_grpc.JobServiceStub(lch).SubmitJob(req, metadata=meta, timeout=10)
            assert not via_leader.created and via_leader.job.id == first.job.id

            # Watched through the front-end to the end (the leader's writes reach it).
            phases = [ev.to_phase for ev in stub.WatchJob(
                jpb.WatchJobRequest(job_id=first.job.id), metadata=meta, timeout=180) if ev.to_phase]
            assert phases[-1] == pb.JOB_PHASE_SUCCEEDED, f"{phases}\n{logs()}"
            for want in (pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_RUNNING):
                assert want in phases, phases

            # The leader dies; the standby takes over; the front-end is told nothing.
            leader.kill(signal.SIGKILL)
            wait_until(lambda: "is now the LEADER" in (tmp_path / "logs" / "fe-standby.log").read_text(),
                       timeout=90, what=f"the standby leads\n{logs()}")
            with BrokerClient(standby_addr, timeout=5, credentials=sec.credentials()) as admin:
                wait_until(lambda: any(r.connected for r in admin.regions()), timeout=120,
                           what=f"agent moved to the standby\n{logs()}")
            second = stub.SubmitJob(req_of("fe-two", steps=3, every=3), metadata=meta, timeout=10)
            acked = time.monotonic()
            wake2 = _scheduled_after(stub, meta, second.job.id, acked, WAKE_BOUND_S)
            print(f"front-end submit -> leader scheduled: {wake:.2f} s; after failover {wake2:.2f} s")
        assert frontend.alive(), frontend.tail()
        assert "is now the LEADER" not in frontend.log.read_text()  # never leads
    finally:
        for p in reversed(procs):
            p.kill(signal.SIGTERM)
        _kill_leftover_trainers(tmp_path)
        net.close()

