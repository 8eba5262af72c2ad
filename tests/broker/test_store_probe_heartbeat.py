"""A store that goes down after its agent registered: the agent's running probe
(Heartbeat.store_probe) takes the region out of new placements, says so in the pending
reason, and brings it back when the store answers (real broker over gRPC, scripted agent)."""

from __future__ import annotations

import time

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, spec, wait_until


def _probe(agent, error: str, since: float = 0.0, outage: bool = True) -> None:  # noqa: ANN001
    agent.send(apb.AgentMessage(heartbeat=apb.Heartbeat(
        time=time.time(), store_probe=apb.StoreProbe(error=error, since=since, time=time.time(),
                                                     outage=outage))))


def test_store_probe_in_heartbeats_gates_placements(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    agent = make_agent("us-east-2")
    down = "cannot write s3://cb-us-east-2/.cb-probe-x: Could not connect to the endpoint URL"
    _probe(agent, down, since=time.time())
    registry = broker.server.ops.agents
    wait_until(lambda: registry.get(agent.agent_id).record.checkpoint_store_error == down, 10,
               "the probe recorded")
    assert registry.get(agent.agent_id).record.checkpoint_store_error_since > 0
    # submits are still taken, even needing the region's own store (an outage is not the
    # job's fault: it waits)...
    job = broker.submit(spec())
    # ...but nothing is placed in a region whose store is down, and the reason says why
    j = wait_until(lambda: "checkpoint store" in (g := broker.get(job.id)).pending_reason and g,
                   20, "pending reason")
    assert j.phase == pb.JOB_PHASE_PENDING
    assert "region us-east-2 gets no jobs: its checkpoint store is unreachable since" in j.pending_reason
    assert "Could not connect" in j.pending_reason
    time.sleep(1.0)
    assert broker.get(job.id).phase == pb.JOB_PHASE_PENDING
    # the store answers again: the next probe brings the region back
    _probe(agent, "")
    wait_until(lambda: registry.get(agent.agent_id).record.checkpoint_store_error == "", 10, "cleared")
    rec = registry.get(agent.agent_id).record
    assert rec.checkpoint_store_ok_since > 0 and rec.checkpoint_store_error_since == 0
    j = broker.wait_phase(job.id, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
    assert j.placement.region == "us-east-2"


def test_a_misconfigured_store_still_refuses_submits(broker: Broker, make_agent) -> None:  # noqa: ANN001
    """Not an outage (e.g. AccessDenied): a job needing the region's store is refused."""
    import grpc
    import pytest

    broker.team()
    agent = make_agent("us-east-2")
    _probe(agent, "cannot write s3://cb-us-east-2/x: AccessDenied", time.time(), outage=False)
    registry = broker.server.ops.agents
    wait_until(lambda: registry.get(agent.agent_id).record.checkpoint_store_error, 10, "recorded")
    with pytest.raises(grpc.RpcError) as err:
        broker.submit(spec())
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "AccessDenied" in err.value.details()
