"""Jobs below their size grow back through a real broker's scheduler passes (scripted agents).

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

A second job shows the other routes take the same way back: an elastic move that found
room for 1 of its 2 nodes in another region grows back there once a node frees up, and
not by moving back to the region it left, even when that region has room again.

What the trainer does with the 3 ranks (resharding the 2-rank checkpoint, same per-step
samples and losses) is tests/e2e/test_shrink_in_place.py's part.
"""

from __future__ import annotations

import time
from pathlib import Path

from brokerctl.render import shrunk_text
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
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
        assert shrunk_text(job).startswith("running at 2 of 3 nodes since ")
        assert shrunk_text(job).endswith(f"(shrunk in place after losing {lost}); waiting for"
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


def test_a_job_an_elastic_move_left_small_grows_back_in_its_new_region(tmp_path: Path) -> None:
    """A 2-node elastic job (1 at least) runs in r1; r1 is drained and the only room is
    r2, where another job holds one of the two nodes: it moves there on 1 node (route
    ``elastic_move``, the console's and ``brokerctl job``'s line says so). r1 is undrained
    (2 free nodes): the job stays, waiting for room in r2 (growing back never changes
    region). The other job ends: after the settle time and the rate limit it grows back
    in r2, checkpoint first, onto its node plus the freed one."""
    b = Broker(fast_config(tmp_path, grow_back_settle_s=0.5, grow_back_min_interval_s=1.0))
    agents: list[FakeAgent] = []
    try:
        b.team("ml", gpus=8)
        r1 = FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 2, 1, pool="p")).connect()
        r2 = FakeAgent(b.address, "b1", "r2", nodes_for("r2", "b1", 2, 1, pool="q")).connect()
        agents += [r1, r2]
        filler = b.submit(spec("filler", allowed_regions=["r2"]))
        r2.wait_launch(filler.id, 1)
        r2.update(filler.id, 1, apb.ATTEMPT_STATE_RUNNING, step=1)
        b.wait_phase(filler.id, pb.JOB_PHASE_RUNNING)
        j = b.submit(spec("mover", nodes=2, elasticity=pb.Elasticity(min_nodes=1, max_nodes=2)))
        first = r1.wait_launch(j.id, 1)
        assert len(first.placement.nodes) == 2
        r1.update(j.id, 1, apb.ATTEMPT_STATE_RUNNING, step=12, ckpt_step=10, ranks=4)
        b.wait_phase(j.id, pb.JOB_PHASE_RUNNING)
        assert not b.get(j.id).HasField("shrunk")  # placed at full size: nothing to grow back

        b.capacity.DrainRegion(cpb.DrainRegionRequest(region="r1", reason="maintenance"))
        r1.wait_stop(j.id, timeout=20)
        ck = f"s3://cb-r1/jobs/{j.id}/attempt-1/step-000000014"
        r1.update(j.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, step=14, ckpt_step=14, ckpt_uri=ck)
        second = r2.wait_launch(j.id, 2, timeout=30)
        kept = second.placement.nodes[0].node_id
        assert len(second.placement.nodes) == 1 and second.resume_from == ck
        r2.update(j.id, 2, apb.ATTEMPT_STATE_RUNNING, step=15, ckpt_step=14, ranks=2)
        job = wait_until(lambda: (g := b.get(j.id)).shrunk.waiting.startswith("waiting for capacity:")
                         and g, 10, f"the small job's reason: {b.get(j.id)}")
        rec = job.shrunk
        assert (rec.route, rec.requested_nodes, rec.running_nodes) == ("elastic_move", 2, 1)
        assert rec.why == "a move (region drain) found room for 1 of 2 nodes in r2"
        assert shrunk_text(job).startswith("running at 2 of 4 ranks since ")
        assert shrunk_text(job).endswith("(a move (region drain) found room for 1 of 2 nodes in r2);"
                                         " waiting for capacity: 1 more node(s) needed in pool q, 0 free")

        # r1 has room for the whole job again: growing back does not move it there
        b.capacity.DrainRegion(cpb.DrainRegionRequest(region="r1", undrain=True))
        time.sleep(2.0)  # past the settle time and the rate limit
        assert not r2.commands("stop", j.id)
        assert b.get(j.id).shrunk.waiting.startswith("waiting for capacity: 1 more node(s) needed in pool q")

        # the other job ends: the freed r2 node takes the missing rank, checkpoint first
        r2.update(filler.id, 1, apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        stop = r2.wait_stop(j.id, apb.STOP_REASON_MIGRATE, timeout=20)
        assert stop.checkpoint_first and stop.attempt == 2
        job = b.get(j.id)
        assert job.migrations[-1].cause == "grow_back" and job.shrunk.grow_nodes[0] == kept
        ck2 = f"s3://cb-r2/jobs/{j.id}/attempt-2/step-000000020"
        r2.update(j.id, 2, apb.ATTEMPT_STATE_CHECKPOINTED, step=20, ckpt_step=20, ckpt_uri=ck2)
        third = r2.wait_launch(j.id, 3, timeout=30)
        assert [n.node_id for n in third.placement.nodes][0] == kept and len(third.placement.nodes) == 2
        assert third.placement.region == "r2" and third.resume_from == ck2
        r2.update(j.id, 3, apb.ATTEMPT_STATE_RUNNING, step=21, ckpt_step=20, ranks=4)
        job = wait_until(lambda: not (g := b.get(j.id)).HasField("shrunk") and g, 10, "the grow back's end")
        events = b.events(j.id)
        moving = [e for e in events if e.reason == "grow_back" and e.to_phase == pb.JOB_PHASE_CHECKPOINTING]
        assert moving and moving[0].details["route"] == "elastic_move"
        assert moving[0].message.endswith("(ran at 1 of 2: a move (region drain) found room for 1 of 2"
                                          " nodes in r2)")
        grew = [e for e in events if e.type == "grew_back"]
        assert len(grew) == 1 and grew[0].details["route"] == "elastic_move"
        assert grew[0].message.startswith("grew back to 2 nodes: capacity returned (ran at 1 of 2 for")
    finally:
        for a in agents:
            a.close()
        b.stop()
