"""What an attempt's first report tells the job: the ranks it runs, and where the time
before it went (broker/jobs/updates.py, lifecycle.Tx.ranks_started_at).

Pure transitions on a job in LAUNCHING at t=100 whose agent spawned the ranks at t=110:
* a trainer that reports RUNNING at t=140: queued 10 s, starting 30 s (torch start-up is
  not queueing), and the placement and the "running" event carry its 2 ranks;
* a ``-- CMD`` job that never reports running and succeeds at t=104 after a spawn at 100:
  its 4 s were productive, not 0 s.
"""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.jobs import updates
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

AGENT = "use2-agent"


def launching(created: float = 90.0, phase_time: float = 100.0) -> pb.Job:
    return pb.Job(id="j-1", phase=pb.JOB_PHASE_LAUNCHING, attempt=1, created_time=created,
                  phase_time=phase_time,
                  spec=pb.JobSpec(name="r", team="ml", resources=pb.Resources(nodes=1, gpus_per_node=4)),
                  placement=pb.Placement(region="us-east-2", agent_id=AGENT, world_size=4))


def report(state: int, spawn: float, ranks: int = 2, step: int = 0) -> updates.AgentUpdate:
    u = apb.JobUpdate(job_id="j-1", attempt=1, state=state, ranks=ranks,
                      timings=apb.AttemptTimings(spawn_time=spawn))
    if step:
        u.progress.CopyFrom(pb.Progress(step=step, total_steps=10))
    return updates.AgentUpdate(agent_id=AGENT, update=u)


def test_running_splits_queue_from_startup_and_records_the_ranks() -> None:
    out = updates.progress(launching(), report(apb.ATTEMPT_STATE_RUNNING, spawn=110.0, step=1),
                           140.0, BrokerConfig())
    assert out is not None
    job = out.job
    assert job.phase == pb.JOB_PHASE_RUNNING
    assert job.goodput.queued_s == pytest.approx(10.0)
    assert job.goodput.starting_s == pytest.approx(30.0)
    assert (job.placement.world_size, job.placement.ranks) == (4, 2)
    running = [e for e in out.events if e.type == "running"]
    assert running and running[0].details["ranks"] == "2" and "2 rank(s)" in running[0].message


def test_a_command_that_finishes_before_reporting_running_was_productive() -> None:
    job = launching(phase_time=99.0)
    out = updates.attempt_ended(job, report(apb.ATTEMPT_STATE_SUCCEEDED, spawn=100.0, ranks=1),
                                104.0, BrokerConfig())
    assert out is not None and out.job.phase == pb.JOB_PHASE_SUCCEEDED
    assert out.job.goodput.productive_s == pytest.approx(4.0)
    assert out.job.goodput.queued_s == pytest.approx(1.0)
    assert out.job.placement.ranks == 1


def test_an_agent_clock_ahead_or_behind_is_clamped() -> None:
    """A spawn time outside [phase_time, now] cannot make time negative or invent it."""
    for spawn, queued, starting in ((50.0, 0.0, 40.0), (500.0, 40.0, 0.0)):
        out = updates.progress(launching(), report(apb.ATTEMPT_STATE_RUNNING, spawn=spawn, step=1),
                               140.0, BrokerConfig())
        assert out is not None
        assert out.job.goodput.queued_s == pytest.approx(queued), spawn
        assert out.job.goodput.starting_s == pytest.approx(starting), spawn
