"""Proactive moves in the live broker (broker/scheduling/proactive_watch.py): a running
job whose recovery policy is ``better-capacity`` moves onto prepaid plan capacity that
came free, through the real broker (gRPC, SQLite) and scripted fake agents; jobs that did
not ask, cannot show a saving, or could not run there stay put."""

from __future__ import annotations

import time

import pytest

import placement
from broker.jobs.causes import Cause
from broker.jobs.recovery import POLICIES, POLICY_LABEL, Trigger
from broker.scheduling import snapshot as snapmod
from broker.scheduling.proactive_watch import expected_remaining_s
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

BETTER = {POLICY_LABEL: "better-capacity"}


def _config(tmp_path, **kw):  # noqa: ANN001, ANN202
    base = dict(proactive_interval_s=0.2, proactive_min_dwell_s=0.0, plan_move_floor_s=30.0,
                preempt_grace_s=60.0)
    base.update(kw)
    return fast_config(tmp_path, **base)


def _on_demand(b: Broker, price: float = 4.0) -> FakeAgent:
    nodes = nodes_for("us-east-1", "od", 1, 8)
    for n in nodes:
        n.price_per_gpu_hour = price
    return FakeAgent(b.address, "us-east-1-a", "us-east-1", nodes, bucket="s3://cb-us-east-1").connect()


def _plan_agent(b: Broker, *, hours: float = 24.0) -> FakeAgent:
    now = time.time()
    b.store.put_record("plan", "tp-1", cpb.TrainingPlan(
        id="tp-1", region="us-west-2", instance_type="p5.48xlarge", instance_count=1,
        gpus_per_instance=8, start_time=now - 60, end_time=now + hours * 3600))
    nodes = nodes_for("us-west-2", "plan", 1, 8, capacity_type=pb.CAPACITY_TYPE_TRAINING_PLAN, pool="tp-1")
    return FakeAgent(b.address, "us-west-2-a", "us-west-2", nodes, bucket="s3://cb-us-west-2").connect()


def _report(a: FakeAgent, job_id: str, attempt: int, state: int, step: int, ckpt_uri: str = "") -> None:
    """Like FakeAgent.update, but the trainer names no total: the job's length is its
    spec's expected_duration_s (the step-based estimate has its own unit test)."""
    a.send(apb.AgentMessage(job_update=apb.JobUpdate(
        job_id=job_id, attempt=attempt, state=state, time=time.time(),
        progress=pb.Progress(step=step, last_checkpoint_step=step if ckpt_uri else 0,
                             last_checkpoint_uri=ckpt_uri))))


def _spec(name: str, **kw) -> pb.JobSpec:  # noqa: ANN003
    """A job running its own program (no trainer step count)."""
    return spec(name, gpus=8, trainer=pb.TrainerSpec(), command=["python", "train.py"], **kw)


def _running(b: Broker, a: FakeAgent, s: pb.JobSpec) -> pb.Job:
    job = b.submit(s)
    a.wait_launch(job.id)
    _report(a, job.id, 1, apb.ATTEMPT_STATE_RUNNING, 10)
    return b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)


@pytest.mark.parametrize("mbb", [False, True], ids=["break-before-make", "make-before-break"])
def test_a_job_moves_onto_free_plan_capacity(tmp_path, mbb: bool) -> None:  # noqa: ANN001
    b = Broker(_config(tmp_path, make_before_break=mbb, precopy_wait_s=0.0))
    try:
        b.team()
        od = _on_demand(b)
        job = _running(b, od, _spec("saver", expected_duration_s=36_000.0, labels=BETTER))
        assert job.placement.capacity_type == pb.CAPACITY_TYPE_ON_DEMAND
        plan = _plan_agent(b)  # prepaid capacity comes free
        stop = od.wait_stop(job.id, apb.STOP_REASON_MIGRATE)
        assert stop.checkpoint_first
        j = b.get(job.id)
        m = j.migrations[-1]
        assert (m.cause, m.emergency) == ("better_capacity", False)
        ev = next(e for e in b.events(job.id) if e.reason == "better_capacity")
        assert "free prepaid plan capacity" in ev.message
        assert float(ev.details["gain"]) > float(ev.details["cost"]) > 0
        ck = f"s3://cb-us-east-1/jobs/{job.id}/attempt-1/step-000000012"
        if mbb:  # the destination starts while the source saves: on the plan's node
            sb = plan.wait_launch(job.id, attempt=2)
            assert sb.standby and [n.node_id for n in sb.placement.nodes] == ["plan-n0"]
        _report(od, job.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, 12, ck)
        if not mbb:
            launch = plan.wait_launch(job.id, attempt=2)
            assert launch.resume_from == ck
        else:
            wait_until(lambda: any(c.job_id == job.id for c in plan.commands("go")), 10, "go")
        j = b.get(job.id)
        assert j.attempt == 2 and j.placement.capacity_type == pb.CAPACITY_TYPE_TRAINING_PLAN
        _report(plan, job.id, 2, apb.ATTEMPT_STATE_RUNNING, 13, ck)
        done = wait_until(lambda: (x := b.get(job.id).migrations[-1]).state == "done" and x, 10, "done")
        assert done.to_region == "us-west-2" and done.cause == "better_capacity"
        time.sleep(0.6)  # several more checks: on prepaid capacity there is nothing better
        assert len(b.get(job.id).migrations) == 1
    finally:
        b.stop()


def test_jobs_that_did_not_ask_or_show_no_saving_stay(tmp_path) -> None:  # noqa: ANN001
    b = Broker(_config(tmp_path))
    try:
        b.team()
        nodes = nodes_for("us-east-1", "od", 4, 8)
        for n in nodes:
            n.price_per_gpu_hour = 4.0
        od = FakeAgent(b.address, "us-east-1-a", "us-east-1", nodes, bucket="s3://cb-us-east-1").connect()
        plain = _running(b, od, _spec("plain", expected_duration_s=36_000.0))
        unknown = _running(b, od, _spec("unknown", labels=BETTER))
        # 20 s left is less than the 30 s move floor: the move would cost more than it saves
        short = _running(b, od, _spec("short", expected_duration_s=20.0, labels=BETTER))
        elsewhere = _running(b, od, _spec("east-only", expected_duration_s=36_000.0,
                                          labels=BETTER, allowed_regions=["us-east-1"]))
        _plan_agent(b)
        time.sleep(1.0)  # five checks' worth
        for j in (plain, unknown, short, elsewhere):
            got = b.get(j.id)
            assert got.phase == pb.JOB_PHASE_RUNNING and not got.migrations, got.spec.name
    finally:
        b.stop()


def test_a_job_is_left_alone_in_its_first_dwell_seconds(tmp_path) -> None:  # noqa: ANN001
    b = Broker(_config(tmp_path, proactive_min_dwell_s=3600.0))
    try:
        b.team()
        od = _on_demand(b)
        job = _running(b, od, _spec("new", expected_duration_s=36_000.0, labels=BETTER))
        _plan_agent(b)
        time.sleep(1.0)
        assert not b.get(job.id).migrations
    finally:
        b.stop()


def test_expected_remaining_from_steps_then_duration() -> None:
    j = pb.Job(phase=pb.JOB_PHASE_SUCCEEDED)
    assert expected_remaining_s(j, 0.0) == 0.0  # says nothing: never moved for a saving
    j.spec.expected_duration_s = 1000.0
    j.goodput.productive_s = 400.0
    assert expected_remaining_s(j, 0.0) == 600.0
    j.spec.trainer.total_steps = 100
    j.progress.step = 20  # 20 s per step so far, 80 steps left
    assert expected_remaining_s(j, 0.0) == 1600.0
    j.phase, j.phase_time = pb.JOB_PHASE_RUNNING, 100.0  # 100 s more running since
    assert expected_remaining_s(j, 200.0) == 80 * 500.0 / 20
    j.progress.step = 100  # the last step: nothing left to save on
    assert expected_remaining_s(j, 200.0) == 0.0


def test_policies_name_the_moves_they_consent_to() -> None:
    assert POLICIES["better-capacity"].proactive == {Trigger.BETTER_CAPACITY}
    assert POLICIES["defragment"].proactive == {Trigger.DEFRAGMENT}
    assert not POLICIES["move-anywhere"].proactive and not POLICIES["stay-in-place"].proactive


def test_a_better_capacity_standby_asks_for_prepaid_capacity_only() -> None:
    job = pb.Job(id="j1", phase=pb.JOB_PHASE_CHECKPOINTING, stop_reason="migrate",
                 spec=spec("s", gpus=8))
    job.placement.agent_id = "a"
    job.placement.nodes.add(node_id="od-n0", gpus=8)
    m = job.migrations.add(cause=Cause.BETTER_CAPACITY.value, state="checkpointing")
    snap = snapmod.build(now=time.time(), agents=[], jobs=[job], teams=[], plans=[], draining=[],
                         priority_of=lambda s: 0, make_before_break=True)
    (req,) = snap.pending
    assert req.id == "j1~standby" and req.capacity_types == {placement.CapacityType.TRAINING_PLAN}
    m.cause = Cause.REGION_DRAIN.value  # other moves take any capacity the spec allows
    snap = snapmod.build(now=time.time(), agents=[], jobs=[job], teams=[], plans=[], draining=[],
                         priority_of=lambda s: 0, make_before_break=True)
    assert snap.pending[0].capacity_types == frozenset()


def test_defragment_moves_a_small_job_out_of_the_block_a_gang_needs(tmp_path) -> None:  # noqa: ANN001
    """Two 8-GPU jobs (policy ``defragment``) sit one in each layer-3 block; a 2-node gang
    that must stay inside one block waits. The broker moves one small job into the other
    block, and the gang gets the block it frees."""
    b = Broker(_config(tmp_path))
    try:
        b.team()
        a_nodes, b_nodes = nodes_for("us-east-1", "a", 2, 8), nodes_for("us-east-1", "b", 2, 8)
        agent = FakeAgent(b.address, "us-east-1-a", "us-east-1", [a_nodes[0], b_nodes[0]],
                          bucket="s3://cb-us-east-1").connect()
        small = [_running(b, agent, _spec(f"small-{i}", expected_duration_s=36_000.0,
                                          labels={POLICY_LABEL: "defragment"})) for i in range(2)]
        assert {j.placement.nodes[0].node_id for j in small} == {"a-n0", "b-n0"}
        agent.close()  # the cluster grows: one more node in each block
        agent.nodes = [*a_nodes, *b_nodes]
        agent.connect()
        gang = b.submit(spec("gang", nodes=2, gpus=8, topology=pb.TopologyConstraint(
            required=pb.TOPOLOGY_LEVEL_LAYER_3)))
        moved = wait_until(lambda: [j for j in small if b.get(j.id).migrations], 10, "a defragment move")
        assert len(moved) == 1
        m = b.get(moved[0].id).migrations[-1]
        assert m.cause == "defragment"
        ev = next(e for e in b.events(moved[0].id) if e.reason == "defragment")
        assert gang.id in ev.message
        stop = agent.wait_stop(moved[0].id, apb.STOP_REASON_MIGRATE)
        assert stop.checkpoint_first
        _report(agent, moved[0].id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, 12,
                f"s3://cb-us-east-1/jobs/{moved[0].id}/attempt-1/step-000000012")
        launch = agent.wait_launch(moved[0].id, attempt=2)
        block = moved[0].placement.nodes[0].node_id[0]  # "a" or "b": the block it left
        assert launch.placement.nodes[0].node_id[0] != block
        gl = agent.wait_launch(gang.id)
        assert {n.node_id[0] for n in gl.placement.nodes} == {block}
    finally:
        b.stop()


def test_a_move_within_one_cluster_is_not_held_for_a_standby_that_cannot_start(tmp_path) -> None:  # noqa: ANN001
    """Make-before-break with pre-copy: the plan's nodes are in the job's own cluster, where
    a standby would fence the source, so no standby can start. The scheduler's next pass
    finds no place for it and the Stop goes at once (not after precopy_wait_s = 600 s);
    the job moves break-before-make onto the plan's node of the same agent."""
    b = Broker(_config(tmp_path, make_before_break=True, precopy_wait_s=600.0))
    try:
        b.team()
        now = time.time()
        od = nodes_for("us-east-1", "od", 1, 8)
        od[0].price_per_gpu_hour = 4.0
        plan = nodes_for("us-east-1", "plan", 1, 8, capacity_type=pb.CAPACITY_TYPE_TRAINING_PLAN,
                         pool="tp-1")
        a = FakeAgent(b.address, "us-east-1-a", "us-east-1", od, bucket="s3://cb-us-east-1").connect()
        job = _running(b, a, _spec("same-cluster", expected_duration_s=36_000.0, labels=BETTER))
        ck = f"s3://cb-us-east-1/jobs/{job.id}/attempt-1/step-000000010"
        _report(a, job.id, 1, apb.ATTEMPT_STATE_RUNNING, 10, ck)  # durable: pre-copy wanted
        wait_until(lambda: b.get(job.id).progress.last_checkpoint_uri == ck, 10, "the checkpoint")
        b.store.put_record("plan", "tp-1", cpb.TrainingPlan(
            id="tp-1", region="us-east-1", instance_type="p5.48xlarge", instance_count=1,
            gpus_per_instance=8, start_time=now - 60, end_time=now + 86400))
        a.close()  # the cluster's plan node group comes up
        a.nodes = [*od, *plan]
        a.running[job.id] = 1
        a.connect()
        stop = a.wait_stop(job.id, apb.STOP_REASON_MIGRATE, timeout=15)
        assert stop.checkpoint_first
        ev = [e.type for e in b.events(job.id)]
        assert "stop_sent" in ev and "standby_launched" not in ev
        sent = next(e for e in b.events(job.id) if e.type == "stop_sent")
        assert "no destination can start" in sent.message and float(sent.details["held_s"]) < 15
        _report(a, job.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, 12,
                f"s3://cb-us-east-1/jobs/{job.id}/attempt-1/step-000000012")
        launch = a.wait_launch(job.id, attempt=2)
        assert [n.node_id for n in launch.placement.nodes] == ["plan-n0"] and not launch.standby
    finally:
        b.stop()


@pytest.mark.parametrize("max_moves", [1, 2])
def test_a_block_is_freed_whole_or_not_at_all(tmp_path, max_moves: int) -> None:  # noqa: ANN001
    """Freeing a block for the gang takes two moves (two 4-GPU jobs share a node). With
    room for one move in flight none is made: half a block helps nobody."""
    b = Broker(_config(tmp_path, proactive_max_moves=max_moves))
    try:
        b.team()
        a_nodes, b_nodes = nodes_for("us-east-1", "a", 2, 8), nodes_for("us-east-1", "b", 2, 8)
        agent = FakeAgent(b.address, "us-east-1-a", "us-east-1", [a_nodes[0], b_nodes[0]],
                          bucket="s3://cb-us-east-1").connect()
        small = [_running(b, agent, spec(f"small-{i}", gpus=4, trainer=pb.TrainerSpec(),
                                         command=["python", "train.py"], expected_duration_s=36_000.0,
                                         labels={POLICY_LABEL: "defragment"})) for i in range(4)]
        assert sorted(j.placement.nodes[0].node_id for j in small) == ["a-n0", "a-n0", "b-n0", "b-n0"]
        agent.close()
        agent.nodes = [*a_nodes, *b_nodes]
        agent.connect()
        b.submit(spec("gang", nodes=2, gpus=8, topology=pb.TopologyConstraint(
            required=pb.TOPOLOGY_LEVEL_LAYER_3)))
        if max_moves == 1:
            time.sleep(1.0)  # five checks' worth
            assert not [j for j in small if b.get(j.id).migrations]
        else:
            moved = wait_until(lambda: len(m := [j for j in small if b.get(j.id).migrations]) == 2 and m,
                               10, "two defragment moves")
            assert {j.placement.nodes[0].node_id for j in moved} in ({"a-n0"}, {"b-n0"})
    finally:
        b.stop()
