"""Migration records through the real broker (gRPC, SQLite) with scripted fake agents:
governance preemption uses the same checkpoint-first path and is recorded as a move;
plan ends trigger planned moves; transfer reports become events; ListMigrations."""

from __future__ import annotations

import time

from broker.jobs import migration
from broker.jobs.causes import Cause
from broker.jobs.recovery import Signal, Trigger
from brokersdk.client import BrokerClient
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, fast_config, spec, wait_until


def test_preemption_is_a_recorded_move_resumed_from_its_checkpoint(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    a = make_agent("us-east-2", nodes=1, gpus=8)
    job = broker.submit(spec("victim", gpus=8))
    a.wait_launch(job.id)
    a.update(job.id, 1, apb.ATTEMPT_STATE_RUNNING, step=3)
    broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    broker.ops.trigger(job.id, Signal(Trigger.PREEMPTED, cause=Cause.HIGHER_PRIORITY),
                       actor="scheduler", message="preempted for j-other")
    stop = a.wait_stop(job.id, apb.STOP_REASON_PREEMPT)
    assert stop.checkpoint_first
    ck = f"s3://cb-us-east-2/jobs/{job.id}/attempt-1/step-000000005"
    a.update(job.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, step=5, ckpt_step=5, ckpt_uri=ck)
    l2 = a.wait_launch(job.id, attempt=2)
    assert l2.resume_from == ck and l2.checkpoint_uri.endswith(f"/jobs/{job.id}/attempt-2")
    m = broker.get(job.id).migrations[-1]
    assert (m.cause, m.state, m.emergency, m.checkpoint_step) == ("higher_priority", "launching", False, 5)
    a.update(job.id, 2, apb.ATTEMPT_STATE_RUNNING, step=5, ckpt_step=5, ckpt_uri=ck)
    a.update(job.id, 2, apb.ATTEMPT_STATE_RUNNING, step=6, ckpt_step=5, ckpt_uri=ck)
    done = wait_until(lambda: (x := broker.get(job.id).migrations[-1]).state == "done" and x, 10, "done")
    assert done.total_s >= done.checkpoint_s >= 0 and done.to_attempt == 2
    assert any(e.type == "migration_completed" for e in broker.events(job.id))
    with BrokerClient(broker.address) as c:
        assert [x.job_id for x in c.migrations()] == [job.id]
        assert c.migrations(job_id=job.id)[0].cause == "higher_priority"


def test_plan_end_triggers_a_planned_move_and_excludes_the_plan_nodes(tmp_path) -> None:  # noqa: ANN001
    from tests.broker.harness import FakeAgent, nodes_for

    b = Broker(fast_config(tmp_path, plan_move_floor_s=30.0, preempt_grace_s=60.0))
    try:
        b.team()
        plan_nodes = nodes_for("us-west-2", "plan", 1, 8, capacity_type=pb.CAPACITY_TYPE_TRAINING_PLAN,
                               pool="tp-1")
        a = FakeAgent(b.address, "us-west-2-a", "us-west-2", plan_nodes, bucket="s3://cb-us-west-2").connect()
        other = FakeAgent(b.address, "eu-a", "eu-west-1", nodes_for("eu-west-1", "eu", 1, 8),
                          bucket="s3://cb-eu-west-1").connect()
        now = time.time()
        b.store.put_record("plan", "tp-1", cpb.TrainingPlan(
            id="tp-1", region="us-west-2", instance_type="p5.48xlarge", instance_count=1,
            gpus_per_instance=8, start_time=now - 60, end_time=now + 3600))
        s = spec("on-plan", gpus=8, expected_duration_s=600.0)
        s.capacity_types.extend([pb.CAPACITY_TYPE_TRAINING_PLAN, pb.CAPACITY_TYPE_ON_DEMAND])
        job = b.submit(s)
        a.wait_launch(job.id)
        a.update(job.id, 1, apb.ATTEMPT_STATE_RUNNING, step=2)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        time.sleep(0.5)
        assert b.get(job.id).phase == pb.JOB_PHASE_RUNNING  # an hour left: nothing to do
        # The plan is shortened: 20 s left < the 30 s floor -> planned move now.
        b.store.put_record("plan", "tp-1", cpb.TrainingPlan(
            id="tp-1", region="us-west-2", instance_type="p5.48xlarge", instance_count=1,
            gpus_per_instance=8, start_time=now - 60, end_time=time.time() + 20))
        b.ops.poke()
        stop = a.wait_stop(job.id, apb.STOP_REASON_MIGRATE)
        assert stop.checkpoint_first and 5 <= stop.grace_s <= 20
        j = b.get(job.id)
        assert "plan-n0" in j.excluded_nodes and j.migrations[-1].cause == "plan_ending"
        assert not j.migrations[-1].emergency
        ck = f"s3://cb-us-west-2/jobs/{job.id}/attempt-1/step-000000004"
        a.update(job.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, step=4, ckpt_step=4, ckpt_uri=ck)
        l2 = other.wait_launch(job.id, attempt=2)
        assert l2.resume_from == ck and l2.placement.region == "eu-west-1"
        # The destination agent reports its copy; the broker keeps it and makes events.
        t = pb.TransferStats(src_uri=ck, dst_uri=f"s3://cb-eu-west-1/jobs/{job.id}/attempt-2/step-000000004",
                             bytes_total=1000, bytes_done=1000, seconds=0.5, mb_per_s=0.002,
                             method="server-side-copy", done=True, start_time=time.time() - 0.5,
                             end_time=time.time())
        other.send(apb.AgentMessage(job_update=apb.JobUpdate(
            job_id=job.id, attempt=2, state=apb.ATTEMPT_STATE_STARTING, transfer=t)))
        wait_until(lambda: any(e.type == "transfer_done" for e in b.events(job.id)), 10, "transfer event")
        m = b.get(job.id).migrations[-1]
        assert m.transfer.bytes_total == 1000 and m.resume_from == t.dst_uri
        other.update(job.id, 2, apb.ATTEMPT_STATE_RUNNING, step=5, ckpt_step=4, ckpt_uri=t.dst_uri)
        done = wait_until(lambda: (x := b.get(job.id).migrations[-1]).state == "done" and x, 10, "done")
        assert done.transfer_s == 0.5 and done.to_region == "eu-west-1"
        # Learned lead time: this job's last move's bytes / MB/s now count.
        assert migration.estimate_move_s(b.get(job.id), floor_s=1.0, margin=2.0) >= 1.0
    finally:
        b.stop()


def test_estimate_move_uses_history_and_floor() -> None:
    job = pb.Job()
    assert migration.estimate_move_s(job, floor_s=60, margin=1.5) == 60
    m = job.migrations.add(state="done", stop_signal_time=100.0, exit_time=140.0)
    m.transfer.bytes_total, m.transfer.mb_per_s = 3_000_000_000, 100.0
    assert migration.estimate_move_s(job, floor_s=60, margin=1.5) == 1.5 * (40 + 30)


def test_a_second_move_before_the_first_steps_is_its_own_record(broker: Broker, make_agent) -> None:  # noqa: ANN001
    """Found by tests/e2e/test_byo.py: attempt 2 was moved again (a second spot notice)
    before it reported a step past its resume. The first move must be closed (done, with
    its event) and the second get its own record from attempt 2 to 3; before the fix the
    second move reused the first record and attempt 2's next step closed it."""
    broker.team()
    a = make_agent("us-east-2", nodes=1, gpus=8)
    job = broker.submit(spec("twice", gpus=8))
    def uri(attempt: int, step: int) -> str:
        return f"s3://cb-us-east-2/jobs/{job.id}/attempt-{attempt}/step-{step:09d}"

    for attempt in (1, 2):  # attempt 2 resumes at step 5 and is preempted at once
        a.wait_launch(job.id, attempt=attempt)
        prev = 5 * (attempt - 1)
        a.update(job.id, attempt, apb.ATTEMPT_STATE_RUNNING, step=prev, ckpt_step=prev,
                 ckpt_uri=uri(attempt, prev) if prev else "")
        wait_until(lambda at=attempt: (j := broker.get(job.id)).phase == pb.JOB_PHASE_RUNNING
                   and j.attempt == at, 10, f"attempt {attempt} running")
        broker.ops.trigger(job.id, Signal(Trigger.PREEMPTED, cause=Cause.HIGHER_PRIORITY),
                           actor="scheduler", message="preempted")
        wait_until(lambda at=attempt: [s for s in a.commands("stop", job.id) if s.attempt == at],
                   10, f"stop of attempt {attempt}")
        a.update(job.id, attempt, apb.ATTEMPT_STATE_CHECKPOINTED, step=prev + 5,
                 ckpt_step=prev + 5, ckpt_uri=uri(attempt, prev + 5))
    a.wait_launch(job.id, attempt=3)
    a.update(job.id, 2, apb.ATTEMPT_STATE_RUNNING, step=7, ckpt_step=5)  # stale: ignored
    a.update(job.id, 3, apb.ATTEMPT_STATE_RUNNING, step=11, ckpt_step=10, ckpt_uri=uri(3, 10))
    migs = wait_until(lambda: len(ms := broker.get(job.id).migrations) == 2
                      and ms[-1].state == "done" and ms, 10, "two closed moves")
    assert [(m.from_attempt, m.to_attempt, m.checkpoint_step, m.state) for m in migs] == [
        (1, 2, 5, "done"), (2, 3, 10, "done")]
    assert "moved again before its first step" in migs[0].message
    done = [e for e in broker.events(job.id) if e.type == "migration_completed"]
    assert len(done) == 2, [e.message for e in done]
