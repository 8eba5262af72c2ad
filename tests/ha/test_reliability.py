"""Issue 15, whole system: real brokers (`brokerctl serve`), real agents, real trainer
ranks, real redis-server. One test per defect fixed here (2, 3 + 7, 6); each says in
its docstring what failed on the old main.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import grpc
import pytest
import redis

from brokersdk.client import BrokerClient, BrokerUnavailable
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.test_foundation import events_of, setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster, live_attempts, wait_until
from tests.fixtures.pki import session_pki
from tests.fixtures.redis_server import start_redis, stop_redis
from tests.ha.helpers import probe, start_pair

pytestmark = pytest.mark.slow


class AttemptSampler:
    """Samples the job's live attempts until stopped; remembers every overlap."""

    def __init__(self, root: Path, job_id: str) -> None:
        self.root, self.job_id = root, job_id
        self.overlaps: list[set[int]] = []
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            live = live_attempts(self.root, self.job_id)
            self.seen |= live
            if len(live) > 1:
                self.overlaps.append(live)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_agent_daemon_killed_and_restarted_never_double_runs(cluster: Cluster) -> None:
    """Defect 2: SIGKILL of the agent daemon left its ranks training; the restarted agent
    registered `running 0`, the broker launched attempt 2 and both trained at once. Now
    the restarted agent re-adopts attempt 1 from its durable record: one attempt alive at
    any instant, and the job finishes once, on attempt 1."""
    c = cluster
    # The ranks outlive their agent for 3/4 of the agent timeout (their lease, contracts
    # §9): generous here, so a restart slowed by a loaded machine still finds them.
    c.broker_args = ["--set", "agent_timeout_s=60"]
    c.start_broker()
    c.start_agent("us-east-2", nodes=1, gpus=1)
    with c.client() as client:
        setup_team(client)
        wait_regions(c, client, 1)
        job = client.submit(spec("restart-survivor", steps=60, every=10, sleep=0.2))
        c.wait_progressing(job)
        sampler = AttemptSampler(c.root, job.id)
        try:
            assert live_attempts(c.root, job.id) == {1}
            c.agents["us-east-2"].kill(signal.SIGKILL)  # the daemon only, not its ranks
            assert live_attempts(c.root, job.id) == {1}, "ranks died with the daemon"
            c.start_agent("us-east-2", nodes=1, gpus=1)
            done = job.wait(timeout=300)
        finally:
            sampler.stop()
        assert done.phase == pb.JOB_PHASE_SUCCEEDED, f"{done}\n{c.logs()}"
        assert not sampler.overlaps, f"two attempts alive at once: {sampler.overlaps}"
        assert done.attempt == 1, f"relaunched instead of re-adopted: {done}\n{c.logs()}"
        events = events_of(client, job.id)
    succeeded = [e for e in events if e.to_phase == pb.JOB_PHASE_SUCCEEDED]
    assert len(succeeded) == 1, events
    assert "re-adopted" in (c.root / "logs" / "agent-us-east-2.log").read_text()


def test_frozen_leader_agents_move_to_the_standby_and_the_old_leader_is_fenced(
        ha_cluster: Cluster) -> None:
    """Defects 3 and 7: SIGSTOP of the leader. Agents used to stay on the frozen leader's
    open socket forever (no keepalive, no liveness deadline), so jobs went PENDING "no
    region agent is connected" on the standby; and after SIGCONT the old leader kept
    writing. Now the agent rotates to the new leader, the job keeps running on its first
    attempt, and the resumed old leader steps down with its writes fenced."""
    c = ha_cluster
    a, b = start_pair(c, "rl")
    wait_until(lambda: probe(a)[0], timeout=60, what=f"a leads\n{c.logs()}")
    c.start_agent("us-east-2", broker=f"{a},{b}", nodes=1, gpus=1)
    with BrokerClient(f"{a},{b}", timeout=5) as client:
        setup_team(client)
        wait_regions(c, client, 1)
        job = client.submit(spec("frozen-leader", steps=150, every=10, sleep=0.2))
        c.wait_progressing(job)
    assert c.broker is not None and c.broker.popen is not None
    frozen = c.broker.popen
    frozen.send_signal(signal.SIGSTOP)  # hung, not dead: its sockets stay open
    try:
        wait_until(lambda: probe(b)[0], timeout=90, what=f"b takes over\n{c.logs()}")
        with BrokerClient(f"{b}", timeout=5) as client:
            wait_until(lambda: any(r.connected for r in client.regions()), timeout=120,
                       what=f"agent moved to b\n{c.logs()}")
            step = client.job(job.id).status().progress.step
            wait_until(lambda: client.job(job.id).status().progress.step > step + 2,
                       timeout=120, what=f"progress reported to b\n{c.logs()}")
            st = client.job(job.id).status()
            assert st.phase == pb.JOB_PHASE_RUNNING and st.attempt == 1, st
    finally:
        frozen.send_signal(signal.SIGCONT)
    log_a = c.root / "logs" / "broker.log"
    wait_until(lambda: "steps down to standby" in log_a.read_text(), timeout=120,
               what=f"the old leader steps down\n{c.logs()}")
    ok, details = probe(a)
    assert not ok and "standby broker rl-a" in details, details
    with BrokerClient(f"{b},{a}", timeout=5) as client:
        done = client.job(job.id).wait(timeout=400)
        assert done.phase == pb.JOB_PHASE_SUCCEEDED and done.attempt == 1, f"{done}\n{c.logs()}"
        events = events_of(client, job.id)
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert not [e for e in events if e.reason in ("agent_lost", "attempt_missing")], events


def test_redis_restart_is_unavailable_and_the_terminal_update_arrives(tmp_path: Path) -> None:
    """Defect 6: with Redis down, calls answered INTERNAL (a raw redis.ConnectionError)
    and an agent update that failed to apply was dropped. Now the API answers
    UNAVAILABLE with a retry hint, and the terminal update the agent sent while Redis was
    down is re-sent until the broker commits it."""
    rdir = tmp_path / "redis"
    rdir.mkdir()
    server = start_redis(rdir)
    c = Cluster(root=tmp_path / "c", store_url=f"{server.url}?prefix=blip",
                broker_args=["--set", "leader_lease_s=120"])
    try:
        c.start_broker()
        c.start_agent("us-east-2", nodes=1, gpus=1)
        with c.client() as client:
            setup_team(client)
            wait_regions(c, client, 1)
            job = client.submit(spec("redis-blip", steps=25, every=5, sleep=0.2))
            c.wait_progressing(job)
        # Redis goes away (saving its data, as a persistent Redis would have it).
        redis.Redis.from_url(server.url).shutdown(save=True)
        server.proc.wait(timeout=30)
        with session_pki().channel(c.address) as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.GetJob(jobs_pb2.GetJobRequest(job_id=job.id), timeout=120)
        err = info.value
        assert err.code() is grpc.StatusCode.UNAVAILABLE, f"{err.code()}: {err.details()}"
        assert "retry" in (err.details() or "")
        pushback = dict(err.trailing_metadata() or ())
        assert "grpc-retry-pushback-ms" in pushback, pushback
        # The SDK surfaces it as BrokerUnavailable (UNAVAILABLE), with the store's reason.
        with (BrokerClient(c.address, timeout=120, retries=0) as client,
              pytest.raises(BrokerUnavailable) as sdk_err):
            client.job(job.id).status()
        assert sdk_err.value.code is grpc.StatusCode.UNAVAILABLE
        # The trainer finishes while the store is down: its SUCCEEDED cannot be committed.
        wait_until(lambda: not live_attempts(c.root, job.id), timeout=300,
                   what=f"trainer finished\n{c.logs()}")
        server = start_redis(rdir, server.port)
        with c.client() as client:
            done = client.job(job.id).wait(timeout=300)
        assert done.phase == pb.JOB_PHASE_SUCCEEDED, f"{done}\n{c.logs()}"
        assert done.attempt == 1, f"{done}\n{c.logs()}"
        broker_log = (c.root / "logs" / "broker.log").read_text()
        assert "internal error" not in broker_log
    finally:
        c.stop()
        stop_redis(server)
