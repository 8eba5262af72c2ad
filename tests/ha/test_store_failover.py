"""A broker on a ``redis+sentinel://`` store through a SIGKILL of the Redis primary.

Real redis-server primary + 2 replicas + 3 redis-sentinels, a real broker (gRPC over TLS)
and a scripted region agent (tests/broker/harness.py): clients submit in a burst, the
agent reports running jobs SUCCEEDED before and across the kill. After the failover every
submit the clients got an answer for and every terminal update the broker acknowledged
(JobUpdateAck) is in the store, also when the agent's stream was cut mid-failover and it
reconnected, and a job submitted after the kill is launched (the scheduler resumed). How long that took is measured by benchmarks/store_failover.py
(``--broker-reps``), not asserted here.
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from broker.jobs import updates
from broker.store.base import StoreUnavailable
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until
from tests.fixtures.redis_sentinel import SentinelCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import store_failover  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("reconnect", [False, True], ids=["same-stream", "agent-reconnects"])
def test_broker_keeps_every_acknowledged_write_and_schedules_after_primary_sigkill(
        tmp_path: Path, reconnect: bool) -> None:
    """``agent-reconnects``: the agent's stream is cut mid-failover with ends in flight and
    it dials again as soon as the new primary is up: every end it was acked is in the
    store, for the attempt it ended (none relaunched as missing)."""
    o = store_failover.run_broker_once(tmp_path, reconnect=reconnect)
    assert o.acked_submits > 0 and o.acked_terminal == 6, o
    assert (o.submits_lost, o.terminal_lost, o.relaunched) == (0, 0, 0), o
    assert o.schedule_resume_s > 0, o
    assert o.reconnects >= (1 if reconnect else 0), o


def _replicas(cluster: SentinelCluster) -> list[int]:
    primary = cluster.primary_port()
    return [p for p in cluster.servers if p != primary]


def test_an_end_already_in_the_store_is_acked_only_once_a_replica_has_it(
        tmp_path: Path, sentinel_cluster: SentinelCluster) -> None:
    """A terminal update whose write reached the primary but no replica (WAIT timed out:
    UNAVAILABLE, not acked) is re-sent by the agent; the broker then reads the job as
    already ended and writes nothing. It acked that re-send at once, so an end no replica
    held was acknowledged, and a failover right then would have lost it (this test failed
    so). Now an ack that rests on a read waits for a replica too: none while the replicas
    are frozen, one as soon as they are back."""
    b = Broker(fast_config(tmp_path, store=sentinel_cluster.url(prefix=f"a{uuid.uuid4().hex[:8]}"),
                           leader_lease_s=60.0))
    agent = FakeAgent(b.address, "a1", "us-east-2", nodes_for("us-east-2", "a1", 1, 1))
    frozen: list[int] = []
    try:
        b.team(gpus=10)
        agent.connect()
        job = b.submit(spec("end-on-primary-only"))
        launch = agent.wait_launch(job.id, timeout=30)
        agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=1)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING, timeout=30)
        for port in _replicas(sentinel_cluster):  # no replica confirms anything now
            sentinel_cluster.servers[port].proc.send_signal(signal.SIGSTOP)
            frozen.append(port)
        agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        # The broker's handling of that end, as it was when the replicas stopped answering
        # between its read and its write: written on the primary, WAIT timed out.
        end = updates.AgentUpdate(agent_id="a1", update=agent.unacked[(job.id, launch.attempt)])
        with pytest.raises(StoreUnavailable, match="replica did not confirm"):
            b.ops.applier.apply(job.id, lambda j, now: updates.attempt_ended(
                j, end, now, b.ops.config))
        assert b.store.get_job(job.id).phase == pb.JOB_PHASE_SUCCEEDED  # on the primary only
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:  # re-sent, as the agent does; never acked
            agent.resend_unacked()
            time.sleep(0.5)
        assert not agent.acked(job.id, apb.ATTEMPT_STATE_SUCCEEDED), agent.update_acks
        for port in frozen:
            sentinel_cluster.servers[port].proc.send_signal(signal.SIGCONT)
        frozen.clear()
        wait_until(lambda: agent.resend_unacked() == 0, 30, "the end acked once a replica has it",
                   interval=0.5)
        assert agent.acked(job.id, apb.ATTEMPT_STATE_SUCCEEDED, launch.attempt)
    finally:
        for port in frozen:
            sentinel_cluster.servers[port].proc.send_signal(signal.SIGCONT)
        agent.close()
        b.stop()
