"""CapacityService: training plans, teams/quotas, cordon, errors; preemption path."""

from __future__ import annotations

import time

import grpc
import pytest

from broker.jobs.causes import Cause
from broker.jobs.recovery import Signal, Trigger
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, spec, wait_until


def err(fn, req):  # noqa: ANN001, ANN201
    with pytest.raises(grpc.RpcError) as e:
        fn(req)
    return e.value.code(), e.value.details()


def test_training_plan_crud(broker: Broker) -> None:
    now = time.time()
    plan = broker.capacity.CreateTrainingPlan(cpb.CreateTrainingPlanRequest(plan=cpb.TrainingPlan(
        name="big-run", region="us-east-2", instance_type="p5.48xlarge", instance_count=4,
        gpus_per_instance=8, start_time=now + 3600, end_time=now + 7200)))
    assert plan.id.startswith("tp-") and plan.state == cpb.PLAN_STATE_SCHEDULED
    active = broker.capacity.CreateTrainingPlan(cpb.CreateTrainingPlanRequest(plan=cpb.TrainingPlan(
        id="tp-now", region="us-east-2", instance_type="p5.48xlarge", instance_count=2,
        start_time=now - 10, end_time=now + 100)))
    assert active.state == cpb.PLAN_STATE_ACTIVE
    code, _ = err(broker.capacity.CreateTrainingPlan, cpb.CreateTrainingPlanRequest(plan=active))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    listed = broker.capacity.ListTrainingPlans(cpb.ListTrainingPlansRequest()).plans
    assert {p.id for p in listed} == {plan.id, "tp-now"}
    cancelled = broker.capacity.CancelTrainingPlan(cpb.CancelTrainingPlanRequest(plan_id=plan.id))
    assert cancelled.state == cpb.PLAN_STATE_CANCELLED
    assert {p.id for p in broker.capacity.ListTrainingPlans(cpb.ListTrainingPlansRequest()).plans} == {"tp-now"}
    assert len(broker.capacity.ListTrainingPlans(cpb.ListTrainingPlansRequest(include_ended=True)).plans) == 2
    code, _ = err(broker.capacity.CancelTrainingPlan, cpb.CancelTrainingPlanRequest(plan_id=plan.id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code, _ = err(broker.capacity.CancelTrainingPlan, cpb.CancelTrainingPlanRequest(plan_id="tp-x"))
    assert code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(("plan", "needle"), [
    (dict(region="", instance_type="p5", instance_count=1, start_time=1, end_time=2), "region"),
    (dict(region="r", instance_type="p5", instance_count=0, start_time=1, end_time=2), "instance_count"),
    (dict(region="r", instance_type="p5", instance_count=1, start_time=5, end_time=2), "before"),
    (dict(region="r", instance_type="p5", instance_count=1), "required"),
    (dict(region="r", instance_count=1, start_time=1, end_time=2), "instance_type"),
])
def test_training_plan_validation(broker: Broker, plan: dict, needle: str) -> None:
    code, msg = err(broker.capacity.CreateTrainingPlan,
                    cpb.CreateTrainingPlanRequest(plan=cpb.TrainingPlan(**plan)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and needle in msg


def test_teams_set_get_list(broker: Broker) -> None:
    q = broker.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=cpb.TeamQuota(
        team="ml", cohort="research", strategy=cpb.LENDING_STRATEGY_LEND,
        quotas=[cpb.QuotaEntry(accelerator="h100", guaranteed_gpus=16, borrow_limit_gpus=4)])))
    assert q.team == "ml" and q.used_gpus == 0
    broker.team("cv", gpus=8)
    got = broker.capacity.GetTeamQuota(cpb.GetTeamQuotaRequest(team="ml"))
    assert got.cohort == "research" and got.quotas[0].guaranteed_gpus == 16
    assert got.quotas[0].borrow_limit_gpus == 4
    names = [t.team for t in broker.capacity.ListTeams(cpb.ListTeamsRequest()).teams]
    assert names == ["cv", "ml"]
    broker.submit(spec("p", team="cv"))
    cv = broker.capacity.GetTeamQuota(cpb.GetTeamQuotaRequest(team="cv"))
    assert cv.pending_jobs == 1
    code, msg = err(broker.capacity.GetTeamQuota, cpb.GetTeamQuotaRequest(team="nobody"))
    assert code == grpc.StatusCode.NOT_FOUND and "brokerctl teams set nobody" in msg
    code, _ = err(broker.capacity.SetTeamQuota, cpb.SetTeamQuotaRequest(quota=cpb.TeamQuota(
        team="x", quotas=[cpb.QuotaEntry(guaranteed_gpus=-1)])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = err(broker.capacity.SetTeamQuota, cpb.SetTeamQuotaRequest(quota=cpb.TeamQuota(team="")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_drain_and_cordon_errors(broker: Broker) -> None:
    code, _ = err(broker.capacity.DrainRegion, cpb.DrainRegionRequest(region="mars-1"))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = err(broker.capacity.DrainRegion, cpb.DrainRegionRequest())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = err(broker.capacity.CordonNode, cpb.CordonNodeRequest(node_id="n-x"))
    assert code == grpc.StatusCode.NOT_FOUND


def test_cordoned_node_gets_no_work(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    agent = make_agent(nodes=1, gpus=8)
    node = agent.nodes[0].id
    broker.capacity.CordonNode(cpb.CordonNodeRequest(node_id=node))
    job = broker.submit(spec("c"))
    wait_until(lambda: broker.get(job.id).pending_reason, 10, "pending reason")
    assert not agent.commands("launch", job.id)
    # Cordons survive the agent re-registering.
    agent.close()
    agent.connect()
    assert broker.capacity.GetCapacity(cpb.GetCapacityRequest(include_nodes=True)).nodes[0].node.cordoned
    broker.capacity.CordonNode(cpb.CordonNodeRequest(node_id=node, uncordon=True))
    agent.wait_launch(job.id)


def test_preemption_checkpoints_suspends_and_requeues(broker: Broker, make_agent) -> None:  # noqa: ANN001
    """The apply path of a placement Preemption: Stop{PREEMPT, checkpoint_first} ->
    CHECKPOINTING -> SUSPENDED -> PENDING, then resumed from the checkpoint."""
    broker.team()
    agent = make_agent(nodes=1, gpus=8)
    job = broker.submit(spec("victim", gpus=8))
    l1 = agent.wait_launch(job.id)
    agent.update(job.id, 1, apb.ATTEMPT_STATE_RUNNING, step=3)
    broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    out = broker.ops.trigger(job.id, Signal(Trigger.PREEMPTED, cause=Cause.HIGHER_PRIORITY),
                             actor="scheduler", message="preempted for j-other (team x)")
    assert out is not None and out.phase == pb.JOB_PHASE_CHECKPOINTING
    stop = agent.wait_stop(job.id, apb.STOP_REASON_PREEMPT)
    assert stop.checkpoint_first and stop.grace_s > 0 and stop.attempt == l1.attempt
    ck = f"s3://cb-us-east-2/jobs/{job.id}/step-000000005"
    agent.update(job.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, step=5, ckpt_step=5, ckpt_uri=ck)
    l2 = agent.wait_launch(job.id, attempt=2)
    assert l2.resume_from == ck
    phases = [e.to_phase for e in broker.events(job.id) if e.to_phase != e.from_phase]
    i = phases.index(pb.JOB_PHASE_CHECKPOINTING)
    assert phases[i:i + 5] == [pb.JOB_PHASE_CHECKPOINTING, pb.JOB_PHASE_SUSPENDED, pb.JOB_PHASE_PENDING,
                               pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_LAUNCHING]
    ev = next(e for e in broker.events(job.id) if e.type == "preempted")
    assert "j-other" in ev.message


def test_illegal_transition_raises(broker: Broker) -> None:
    from broker.api.errors import IllegalTransition

    broker.team()
    job = broker.submit(spec("x"))

    from broker.jobs.outcome import begin

    def bad(job, now):  # noqa: ANN001, ANN202
        begin(job, now).move(pb.JOB_PHASE_RUNNING, "running")

    with pytest.raises(IllegalTransition):
        broker.ops.applier.apply(job.id, bad)
    assert broker.get(job.id).phase == pb.JOB_PHASE_PENDING
