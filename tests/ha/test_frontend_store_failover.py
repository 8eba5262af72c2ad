"""The store bus (broker/api/store_bus.py) through a Sentinel failover of the Redis primary.

Real redis-server primary + 2 replicas + 3 redis-sentinels (tests/fixtures/redis_sentinel.py),
a real leader (gRPC over TLS, in this process: tests/broker/harness.py) and a real API
front-end (broker/api/frontend.py) on the same ``redis+sentinel://`` URL, a scripted
region agent on the leader. Clients submit through the front-end while the primary is
SIGKILLed. Afterwards:

* both ends of the bus are subscribed again, on the primary the Sentinels promoted (found
  through them: neither process is told anything);
* a job submitted through the front-end after the failover is launched by the leader
  promptly, i.e. on the bus's wake-up, not at the leader's 30 s full read of the store,
  and the leader's writes wake the front-end's watchers again;
* every submit the front-end acknowledged, before, during or after the failover, is in
  the store.

And the store bus alone when the primary is frozen instead (SIGSTOP): its sockets stay
open, and only the bus's own check against the Sentinels moves it (without that check
both ends were still on the frozen primary 20 s after the promotion).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest

from broker.api.frontend import FrontendServer
from broker.store.redis import RedisStore
from brokersdk.credentials import make_channel
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import jobs_pb2_grpc
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until
from tests.fixtures.pki import session_pki
from tests.fixtures.redis_sentinel import SentinelCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from store_failover import _AgentKeeper  # noqa: E402  (dials again as a real agent does)

pytestmark = pytest.mark.slow

LEASE_S = 5.0
# From the submit's answer to the Launch: a pub/sub message and one scheduler pass
# (milliseconds); the bound is the loaded box, and stays far below the 30 s full read.
WAKE_BOUND_S = 8.0


def test_frontend_bus_follows_the_promoted_primary_and_loses_no_acknowledged_submit(
        tmp_path: Path, sentinel_cluster: SentinelCluster) -> None:
    c = sentinel_cluster
    url = c.url(prefix=f"fb{uuid.uuid4().hex[:8]}")
    shared = dict(store=url, workdir_store=str(tmp_path / "workdirs"))
    leader = Broker(fast_config(tmp_path / "leader", leader_lease_s=LEASE_S,
                                broker_id="bus-leader", **shared))
    fe = FrontendServer(fast_config(tmp_path / "fe", frontend=True, frontend_id=5,
                                    broker_id="bus-fe", agent_listen="", **shared))
    agent = FakeAgent(leader.address, "a1", "us-east-2", nodes_for("us-east-2", "a1", 4, 1))
    channel: grpc.Channel | None = None
    keeper: _AgentKeeper | None = None
    stop = threading.Event()
    burst: threading.Thread | None = None
    try:
        fe.start()
        channel = make_channel(f"127.0.0.1:{fe.port}", session_pki().operator())
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        leader.team(gpus=100)
        agent.connect()
        keeper = _AgentKeeper(agent)  # if the leader loses its lease in the failover
        wait_until(lambda: fe.bus.connected and leader.server._bus.listener.connected.is_set(),
                   timeout=30, what="both ends of the bus subscribed")
        first = stub.SubmitJob(jpb.SubmitJobRequest(spec=spec("before")), timeout=30).job
        agent.wait_launch(first.id, timeout=WAKE_BOUND_S)

        acked: list[str] = []
        refused = [0]

        def submitter() -> None:  # parked jobs: no region places them, they take no node
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    job = stub.SubmitJob(jpb.SubmitJobRequest(
                        spec=spec(f"burst-{n}", allowed_regions=["parked-nowhere"]),
                        client_request_id=f"burst-{n}"), timeout=30).job
                except grpc.RpcError:
                    refused[0] += 1  # UNAVAILABLE while the store fails over: not acknowledged
                    time.sleep(0.05)
                    continue
                acked.append(job.id)

        burst = threading.Thread(target=submitter, daemon=True)
        burst.start()
        wait_until(lambda: len(acked) >= 5, timeout=30, what="submits acknowledged before the kill")
        fe_subs = fe.bus.listener.subscriptions
        leader_listener = leader.server._bus.listener
        leader_subs = leader_listener.subscriptions
        old = c.kill_primary()
        new = c.wait_promoted(old)
        promoted = f"127.0.0.1:{new}"
        # Both ends subscribe again, on the promoted primary, which only the Sentinels named.
        wait_until(lambda: fe.bus.listener.subscriptions > fe_subs and fe.bus.connected
                   and fe.bus.listener.address == promoted, timeout=60,
                   what=f"the front-end's bus on {promoted} (now {fe.bus.listener.address!r})")
        wait_until(lambda: leader_listener.subscriptions > leader_subs
                   and leader_listener.connected.is_set() and leader_listener.address == promoted,
                   timeout=60,
                   what=f"the leader's bus on {promoted} (now {leader_listener.address!r})")
        after_kill = len(acked)
        wait_until(lambda: len(acked) > after_kill + 5, timeout=60,
                   what="submits acknowledged again after the failover")

        # A submit after the failover leaves PENDING on the bus's wake-up. The leader may
        # have lost its lease while no write could be confirmed (then it takes it again
        # and its agent dials again): timed once it leads with its agent connected.
        wait_until(lambda: leader.server.leadership.is_leader and any(
            r.connected for r in leader.capacity.ListRegions(cpb.ListRegionsRequest()).regions),
            timeout=60, what="the leader leading with its agent after the failover")
        probe = wait_until(lambda: stub.SubmitJob(jpb.SubmitJobRequest(
            spec=spec("after-failover"), client_request_id="after-failover"), timeout=30).job,
            timeout=60, what="a submit through the front-end acknowledged", interval=0.2)
        answered = time.monotonic()
        launch = agent.wait_launch(probe.id, timeout=WAKE_BOUND_S + LEASE_S)
        launched_s = time.monotonic() - answered
        assert launched_s < WAKE_BOUND_S, f"launched {launched_s:.2f} s after the submit's answer"
        # The leader's next write of it wakes the front-end's watchers (bus "changed").
        time.sleep(0.5)  # the admission's own announcement has arrived by now
        watched = fe.hub.counter(probe.id)
        agent.update(probe.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=1)
        wait_until(lambda: fe.hub.counter(probe.id) != watched, timeout=WAKE_BOUND_S,
                   what="the leader's change announced to the front-end")

        stop.set()
        burst.join(timeout=60)
        check = RedisStore(c.url(prefix=url.split("prefix=")[1], min_replicas=0))
        try:
            present = {j.id for j in check.list_jobs(limit=0)}
        finally:
            check.close()
        lost = [i for i in [first.id, *acked, probe.id] if i not in present]
        assert not lost, f"{len(lost)} acknowledged submits lost: {lost[:10]}"
        print(f"bus failover: {len(acked)} acked ({refused[0]} refused), launched "
              f"{launched_s:.2f} s after the answer; re-subscriptions front-end "
              f"{fe.bus.listener.reconnects}, leader {leader_listener.reconnects}")
    finally:
        stop.set()
        if burst is not None:
            burst.join(timeout=60)
        if channel is not None:
            channel.close()
        if keeper is not None:
            keeper.stop()
        agent.close()
        fe.stop(0.5)
        leader.stop()


def test_bus_leaves_a_frozen_primary_for_the_promoted_one(sentinel_cluster: SentinelCluster) -> None:
    """A primary frozen (SIGSTOP: a host cut off rather than killed) keeps its sockets
    open, so a subscription on it sees no error, and would hear nothing published on the
    primary the Sentinels promote instead. Each end checks every 2 s that it is on the
    primary the Sentinels name, and moves: a front-end's creation announced after the
    failover reaches the leader, long before a health check would notice (30 s)."""
    from broker.api.store_bus import FrontendBus
    from broker.jobs.hub import EventHub
    from computebroker.v1 import common_pb2 as pb
    from tests.ha.test_store_bus import Leader

    c = sentinel_cluster
    url = c.url(prefix=f"fz{uuid.uuid4().hex[:8]}")
    leader_store, fe_store = RedisStore(url), RedisStore(url)
    leader = Leader(leader_store)
    fe = FrontendBus(fe_store, "fe-frozen", 6, EventHub())
    frozen: list[int] = []
    try:
        leader.bus.start()
        fe.start()
        wait_until(lambda: leader.bus.listener.connected.is_set() and fe.connected, timeout=30,
                   what="both ends subscribed")
        old = c.primary_port()
        assert old is not None
        assert leader.bus.listener.address == fe.listener.address == f"127.0.0.1:{old}"
        c.servers[old].proc.send_signal(signal.SIGSTOP)
        frozen.append(old)
        new = c.wait_promoted(old)
        moved = time.monotonic()
        promoted = f"127.0.0.1:{new}"
        wait_until(lambda: leader.bus.listener.address == promoted
                   and fe.listener.address == promoted, timeout=20,
                   what=f"both ends on {promoted} (leader {leader.bus.listener.address!r},"
                        f" front-end {fe.listener.address!r})")
        followed_s = time.monotonic() - moved
        fe.add(pb.Job(id="j-after-failover"))
        wait_until(lambda: "j-after-failover" in leader.jobs, timeout=30,
                   what="a creation announced after the failover heard by the leader")
        print(f"frozen primary: both ends on the promoted one {followed_s:.2f} s after it was named")
    finally:
        for port in frozen:
            c.servers[port].proc.send_signal(signal.SIGCONT)
        fe.close()
        leader.bus.stop()
        leader_store.close()
        fe_store.close()
