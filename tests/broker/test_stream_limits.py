"""Issue 12: idle long-lived streams must never starve reads and submits.

Regression: on main, 270 idle ``Connect`` or ``WatchJob`` streams took all 256 worker
threads and every RPC hung. Here 1,000 idle streams are held open (900 agent streams
that never register, 100 watches) and reads, submits and capacity calls still answer
within a generous gRPC deadline (a hang fails the test; no latency is asserted).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import agent_pb2_grpc
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, fast_config, spec, wait_until

DEADLINE_S = 10  # generous: under load a read takes milliseconds; a starved one never returns


class Silent:
    """A request iterator that sends nothing until released (an idle agent stream)."""

    def __init__(self) -> None:
        self.q: queue.Queue[apb.AgentMessage | None] = queue.Queue()

    def __iter__(self) -> Iterator[apb.AgentMessage]:
        while (m := self.q.get()) is not None:
            yield m

    def close(self) -> None:
        self.q.put(None)


def reads_answer(b: Broker, job_id: str) -> None:
    assert b.jobs.GetJob(jpb.GetJobRequest(job_id=job_id), timeout=DEADLINE_S).id == job_id
    assert b.jobs.ListJobs(jpb.ListJobsRequest(), timeout=DEADLINE_S).jobs
    b.capacity.ListRegions(cpb.ListRegionsRequest(), timeout=DEADLINE_S)
    b.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("during")), timeout=DEADLINE_S)


USERS: dict[tuple[int, str], object] = {}


def watch(b: Broker, job_id: str, user: str) -> grpc.Call:
    """A WatchJob as ``user`` (a member of team ml, by a real token; one channel per user)."""
    stubs = USERS.get((id(b), user))
    if stubs is None:
        stubs = USERS[(id(b), user)] = b.stubs_as(user)
    return stubs.jobs.WatchJob(jpb.WatchJobRequest(job_id=job_id), timeout=300)  # type: ignore[attr-defined]


@pytest.fixture
def crowded(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(fast_config(tmp_path, max_streams=100, max_agent_streams=900,
                           max_streams_per_identity=900, max_workers=16, stream_idle_timeout_s=300))
    yield b
    b.stop()


def test_1000_idle_streams_do_not_starve_reads(crowded: Broker) -> None:
    b = crowded
    b.team()
    job = b.submit(spec("watched"))
    agents = agent_pb2_grpc.AgentServiceStub(b.agent_channel("us-east-2", "idle"))
    silent = [Silent() for _ in range(900)]
    calls = [agents.Connect(iter(s), timeout=300) for s in silent]
    watches = []
    try:
        for i in range(100):
            w = watch(b, job.id, f"watcher-{i % 5}")
            assert next(w).type == "submitted"  # admitted: history first, then it idles
            watches.append(w)
        wait_until(lambda: b.server.streams.open == 1000, 60, "1000 streams open")
        reads_answer(b, job.id)
        # Beyond the users' pool: a clear RESOURCE_EXHAUSTED, not a hang.
        with pytest.raises(grpc.RpcError) as e:
            next(watch(b, job.id, "late"))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at most 100 open user streams" in e.value.details()
        reads_answer(b, job.id)
        health = health_pb2_grpc.HealthStub(b.channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S).status == \
            health_pb2.HealthCheckResponse.SERVING
    finally:
        for c in calls + watches:
            c.cancel()
        for s in silent:
            s.close()
    wait_until(lambda: b.server.streams.open == 0, 60, "stream slots released")
    w = watch(b, job.id, "after")
    assert next(w).type == "submitted"
    w.cancel()


def test_per_identity_cap_and_release(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, max_streams=5, max_streams_per_identity=3))
    try:
        b.team()
        job = b.submit(spec("w"))
        mine = [watch(b, job.id, "alice") for _ in range(3)]
        for w in mine:
            assert next(w).type == "submitted"
        with pytest.raises(grpc.RpcError) as e:
            next(watch(b, job.id, "alice"))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "member:alice already has 3 open streams" in e.value.details()
        theirs = [watch(b, job.id, "bob") for _ in range(2)]
        for w in theirs:
            assert next(w).type == "submitted"
        with pytest.raises(grpc.RpcError) as e:
            next(watch(b, job.id, "carol"))
        assert "at most 5 open user streams" in e.value.details()
        reads_answer(b, job.id)
        mine[0].cancel()
        wait_until(lambda: b.server.streams.open == 4, 30, "alice's slot released")
        w = watch(b, job.id, "carol")
        assert next(w).type == "submitted"
        for c in [*mine, *theirs, w]:
            c.cancel()
    finally:
        b.stop()


def test_silent_agent_stream_is_cancelled_after_the_idle_timeout(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, stream_idle_timeout_s=1.0))
    try:
        s = Silent()
        call = agent_pb2_grpc.AgentServiceStub(b.agent_channel("us-east-2", "quiet")).Connect(
            iter(s), timeout=60)
        done = threading.Event()
        codes: list[grpc.StatusCode] = []

        def read() -> None:
            try:
                for _ in call:
                    pass
            except grpc.RpcError as e:
                codes.append(e.code())
            done.set()

        threading.Thread(target=read, daemon=True).start()
        assert done.wait(30), "an idle stream was never cancelled"
        assert codes == [grpc.StatusCode.CANCELLED]
        wait_until(lambda: b.server.streams.open == 0, 30, "slot released")
        s.close()
    finally:
        b.stop()
