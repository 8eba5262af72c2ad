"""The NODE_UNHEALTHY trigger end to end through the agent stream: the servicer only
translates the heartbeat's node health into the trigger; the recovery policy moves an
elastic job (checkpoint first, the sick node excluded) and leaves a fixed gang alone."""

from __future__ import annotations

import time

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, spec


def sick(agent, node_id: str) -> None:  # noqa: ANN001
    agent.send(apb.AgentMessage(heartbeat=apb.Heartbeat(
        time=time.time(), node_health=[apb.NodeHealth(node_id=node_id, healthy=False)])))


def test_unhealthy_node_moves_an_elastic_job_off_it(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    a = make_agent("us-east-2", nodes=2, gpus=8)
    job = broker.submit(spec("elastic", nodes=2, gpus=8,
                             elasticity=pb.Elasticity(min_nodes=1, max_nodes=2)))
    launch = a.wait_launch(job.id)
    a.update(job.id, 1, apb.ATTEMPT_STATE_RUNNING, step=3)
    broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    bad = launch.placement.nodes[0].node_id
    sick(a, bad)
    stop = a.wait_stop(job.id, apb.STOP_REASON_MIGRATE)
    assert stop.checkpoint_first and stop.attempt == 1
    j = broker.get(job.id)
    assert j.phase == pb.JOB_PHASE_CHECKPOINTING and bad in j.excluded_nodes
    assert (j.migrations[-1].cause, j.migrations[-1].cause_code) == (
        "node_unhealthy", pb.MIGRATION_CAUSE_NODE_UNHEALTHY)
    ck = f"s3://cb-us-east-2/jobs/{job.id}/attempt-1/step-000000005"
    a.update(job.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, step=5, ckpt_step=5, ckpt_uri=ck)
    l2 = a.wait_launch(job.id, attempt=2)
    assert l2.resume_from == ck
    assert [n.node_id for n in l2.placement.nodes] != [] and bad not in {n.node_id for n in l2.placement.nodes}


def test_unhealthy_node_leaves_a_fixed_size_gang_running(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    a = make_agent("us-east-2", nodes=2, gpus=8)
    job = broker.submit(spec("gang", nodes=2, gpus=8))
    launch = a.wait_launch(job.id)
    a.update(job.id, 1, apb.ATTEMPT_STATE_RUNNING, step=3)
    broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    sick(a, launch.placement.nodes[0].node_id)
    time.sleep(1.0)  # several scheduler passes and heartbeats
    assert broker.get(job.id).phase == pb.JOB_PHASE_RUNNING
    assert not a.commands("stop", job.id)
