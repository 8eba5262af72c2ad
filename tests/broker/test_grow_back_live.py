"""A shrunk job grows back through a real broker's scheduler passes (scripted agent).

A real broker (TLS gRPC, SQLite store, its scheduler loop) and a scripted agent with 3
one-GPU nodes and no spare. An elastic job (3 nodes, at least 2, memory tier on) loses
its middle node and the policy shrinks it onto the two survivors; the agent then reports
that node unhealthy. Then, in order:

* while the lost node is unhealthy the job stays shrunk, saying it waits for capacity;
* the node is healthy again but the operator lowered the team's guarantee to 2 GPUs:
  it stays shrunk with the quota reason (no stop is sent);
* the guarantee goes back to 3: the broker stops attempt 2 checkpoint first (a planned
  move, cause grow_back), and once the agent reports the checkpoint the job is
  admitted at once on the survivors plus the returned node, 3 ranks, resuming from that
  checkpoint; its first RUNNING report closes the record with "grew back to 3 nodes:
  capacity returned", and ``brokerctl job``'s line for it is gone.

What the trainer does with the 3 ranks (resharding the 2-rank checkpoint, same per-step
samples and losses) is tests/e2e/test_shrink_in_place.py's part.
"""

from __future__ import annotations

import time
from pathlib import Path

from brokerctl.render import shrunk_text
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until


def health(agent: FakeAgent, node_id: str, healthy: bool) -> None:
    agent.send(apb.AgentMessage(heartbeat=apb.Heartbeat(
        time=time.time(), node_health=[apb.NodeHealth(node_id=node_id, healthy=healthy)])))


def test_a_shrunk_job_grows_back_when_its_node_returns_and_quota_allows(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, grow_back_settle_s=0.5, grow_back_min_interval_s=0.5))
    a = None
    try:
        b.team("ml", gpus=3)
        a = FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 3, 1, pool="p")).connect()
        j = b.submit(spec("grow", nodes=3, gpus=1, elasticity=pb.Elasticity(min_nodes=2, max_nodes=3),
                          trainer=pb.TrainerSpec(total_steps=100, checkpoint_every=10,
                                                 global_batch_size=8, options={"memory_every": "1"})))
        first = a.wait_launch(j.id, 1)
        placed = [n.node_id for n in first.placement.nodes]
        a.update(j.id, 1, apb.ATTEMPT_STATE_RUNNING, step=12, ckpt_step=10)
        b.wait_phase(j.id, pb.JOB_PHASE_RUNNING)
        lost = placed[1]
        a.update(j.id, 1, apb.ATTEMPT_STATE_FAILED, exit_code=-9, message="rank killed",
                 failed_nodes=[lost])
        second = a.wait_launch(j.id, 2, timeout=30)
        assert [n.node_id for n in second.placement.nodes] == [placed[0], placed[2]]
        assert b.get(j.id).node_recovery.plan == "shrink_in_place"
        # the lost node is reported broken before attempt 2 runs (same stream, in order)
        health(a, lost, False)
        a.update(j.id, 2, apb.ATTEMPT_STATE_RUNNING, step=13, ckpt_step=10)
        b.wait_phase(j.id, pb.JOB_PHASE_RUNNING)
        job = wait_until(lambda: (g := b.get(j.id)).shrunk.waiting.startswith("waiting for capacity:")
                         and g, 10, f"the shrunk job's reason: {b.get(j.id)}")
        assert (job.shrunk.requested_nodes, job.shrunk.running_nodes, list(job.shrunk.lost_nodes)) == (
            3, 2, [lost])
        assert shrunk_text(job) == (f"running shrunk: 2 of 3 nodes since losing {lost}; waiting for"
                                    " capacity: 1 more node(s) needed in pool p, 0 free")

        # the node is back, but the team's guarantee no longer covers a third GPU
        b.team("ml", gpus=2)
        health(a, lost, True)
        job = wait_until(lambda: "quota" in (g := b.get(j.id)).shrunk.waiting and g, 10, "the quota reason")
        assert job.shrunk.waiting.startswith("capacity returned but the team's quota has no room for"
                                             " the extra nodes: team ml over quota")
        time.sleep(1.5)  # past the settle time and the rate limit: still no stop
        assert not a.commands("stop", j.id)
        assert b.get(j.id).phase == pb.JOB_PHASE_RUNNING

        # quota back: checkpoint first, then at once on the survivors plus the returned node
        b.team("ml", gpus=3)
        stop = a.wait_stop(j.id, apb.STOP_REASON_MIGRATE, timeout=20)
        assert stop.checkpoint_first and stop.attempt == 2
        job = b.get(j.id)
        assert job.phase == pb.JOB_PHASE_CHECKPOINTING
        assert list(job.shrunk.grow_nodes) == [placed[0], placed[2], lost]
        assert lost not in job.excluded_nodes
        assert job.migrations[-1].cause == "grow_back"
        ck = f"s3://cb-r1/jobs/{j.id}/attempt-2/step-000000015"
        a.update(j.id, 2, apb.ATTEMPT_STATE_CHECKPOINTED, step=15, ckpt_step=15, ckpt_uri=ck)
        third = a.wait_launch(j.id, 3, timeout=30)
        assert [n.node_id for n in third.placement.nodes] == [placed[0], placed[2], lost]
        assert third.resume_from == ck
        a.update(j.id, 3, apb.ATTEMPT_STATE_RUNNING, step=16, ckpt_step=15, ranks=3)
        job = wait_until(lambda: not (g := b.get(j.id)).HasField("shrunk") and g, 10, "the grow back's end")
        assert job.phase == pb.JOB_PHASE_RUNNING and shrunk_text(job) == ""
        events = b.events(j.id)
        grew = [e for e in events if e.type == "grew_back"]
        assert len(grew) == 1, [(e.type, e.message) for e in events]
        assert grew[0].message.startswith("grew back to 3 nodes: capacity returned (ran at 2 of 3 for")
        moving = [e for e in events if e.reason == "grow_back" and e.to_phase == pb.JOB_PHASE_CHECKPOINTING]
        assert moving and moving[0].message.startswith(
            f"growing back to 3 nodes: capacity returned: {lost} free in pool p")
    finally:
        if a is not None:
            a.close()
        b.stop()
