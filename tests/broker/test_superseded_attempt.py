"""Issue 15 defect 3 (core half) over the real AgentService stream: a superseded
attempt's late success completes the job exactly once and stops the newer attempt."""

from __future__ import annotations

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, spec, wait_until

RUNNING = apb.ATTEMPT_STATE_RUNNING


def test_late_success_of_a_superseded_attempt_completes_the_job_once(broker: Broker, make_agent) -> None:  # noqa: ANN001
    """Defect 3: attempt 1's agent was declared lost (a hung agent or leader) and the job
    was relaunched as attempt 2; attempt 1 meanwhile finished all steps with a durable
    final checkpoint. Its SUCCEEDED update used to be dropped as stale (``is_current``
    requires a running phase) and attempt 2 went on from the old, pruned step. Now the
    job ends SUCCEEDED once, from attempt 1's final checkpoint, and attempt 2 is stopped."""
    broker.team()
    east = make_agent("us-east-2", agent_id="east", nodes=1, gpus=8)
    job = broker.submit(spec("late", allowed_regions=[]))
    l1 = east.wait_launch(job.id)
    root = f"s3://cb-us-east-2/jobs/{job.id}/attempt-1"
    east.update(job.id, 1, RUNNING, step=12, ckpt_step=10, ckpt_uri=f"{root}/step-000000010")
    wait_until(lambda: broker.get(job.id).progress.last_checkpoint_step == 10, 10, "checkpoint 10")
    assert l1.attempt == 1

    west = make_agent("eu-west-1", agent_id="west", nodes=1, gpus=8)
    east.close()  # hung: no heartbeats, but attempt 1 keeps training
    l2 = west.wait_launch(job.id, attempt=2, timeout=30)
    assert l2.resume_from == f"{root}/step-000000010"
    west.update(job.id, 2, RUNNING, step=11)
    broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)

    # The old agent is back; attempt 1 finished all 100 steps, final checkpoint durable.
    east.running = {job.id: 1}
    east.connect()
    final = f"{root}/step-000000100"
    east.update(job.id, 1, apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt_step=100, ckpt_uri=final)

    done = broker.wait_phase(job.id, pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, timeout=10)
    assert done.phase == pb.JOB_PHASE_SUCCEEDED
    assert done.progress.last_checkpoint_step == 100 and done.progress.last_checkpoint_uri == final
    stop = west.wait_stop(job.id, apb.STOP_REASON_STALE_ATTEMPT)
    assert stop.attempt == 2
    assert job.id not in west.running

    # Attempt 2's own end (killed) changes nothing; the scheduler never relaunches it.
    west.update(job.id, 2, apb.ATTEMPT_STATE_STOPPED, step=13, exit_code=-9)
    other = broker.submit(spec("after"))
    wait_until(lambda: east.commands("launch", other.id) or west.commands("launch", other.id),
               20, "a later scheduling pass")
    j = broker.get(job.id)
    assert j.phase == pb.JOB_PHASE_SUCCEEDED and j.attempt == 2
    succeeded = [e for e in broker.events(job.id) if e.to_phase == pb.JOB_PHASE_SUCCEEDED]
    assert len(succeeded) == 1 and succeeded[0].reason == "completed_by_superseded_attempt"
    launches = [c.attempt for a in (east, west) for c in a.commands("launch", job.id)]
    assert sorted(launches) == [1, 2]
