"""Progress is monotone in what users see (broker/jobs/shown_progress.py), over every
path that starts a new attempt: a failure, a lost agent, a checkpointed move, a store
outage, an attempt that could not start, a make-before-break go, and a broker restart
(the agent re-reports its attempt with empty progress).

Each path: a job at step 45 with a durable checkpoint at 37 (or 45 when the stop saved),
relaunched; the new attempt then reports step 0 before it has loaded its checkpoint
(as the trainer does) and then its first step. The step shown must start at the resume
step and never drop below the durable checkpoint. Before the rule, ``apply_progress``
copied the new attempt's step 0 over the job's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

import placement
from broker.jobs import standby, store_wait, updates
from broker.jobs import transitions as t
from broker.jobs.recovery import RecoveryPolicy, Signal, Trigger
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import AGENT, CFG, admission, must, running, stop, update

MBB = CFG.model_copy(update={"make_before_break": True})
NOW = 200.0


def at_45() -> pb.Job:
    """Running attempt 1: step 45, durable checkpoint at 37."""
    j = running(NOW - 50)
    return must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=45, ckpt=37),
                                 NOW - 40, CFG))


def _place(j: pb.Job, now: float) -> pb.Job:
    return must(t.admit(j, admission(), now, CFG))


def failure() -> pb.Job:
    j = at_45()
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, step=45, ckpt=37,
                                             exit_code=1), NOW - 30, CFG))
    return _place(j, NOW - 20)


def agent_lost() -> pb.Job:
    j = at_45()
    plan = RecoveryPolicy().plan(Signal(Trigger.AGENT_LOST), j, CFG, NOW - 30)
    assert plan is not None
    j = must(t.attempt_lost(j, t.AttemptLost(agent_id=AGENT, plan=plan, message="lost"),
                            NOW - 30, CFG))
    return _place(j, NOW - 20)


def checkpointed_move() -> pb.Job:
    j = at_45()
    j = must(t.request_stop(j, stop(Trigger.SPOT_NOTICE, j, NOW - 35), NOW - 35, CFG))
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=45, ckpt=45),
                                   NOW - 30, CFG))
    return _place(j, NOW - 20)


def store_outage() -> pb.Job:
    j = at_45()
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, step=45, ckpt=37,
                                             exit_code=81), NOW - 30, CFG))
    return _place(j, NOW - 20)


def could_not_start() -> pb.Job:
    j = failure()  # attempt 2 launching
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=-1),
                                   NOW - 15, CFG))
    return must(t.admit(j, admission(agent="us-east-2-b"), NOW - 10, CFG))


def standby_go() -> pb.Job:
    j = at_45()
    j = must(t.request_stop(j, stop(Trigger.REGION_DRAIN, j, NOW - 35), NOW - 35, MBB))
    adm = placement.Admission(job_id=j.id, agent_id="eu-west-1-a", region="eu-west-1",
                              assignments=(("e0", 8),))
    j = must(standby.reserve(j, standby.ReserveStandby(adm, {}, "s3://cb-eu-west-1"), NOW - 34, MBB))
    # the source's final save failed: the standby goes from the durable step 37
    return must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, step=45, ckpt=37,
                                                exit_code=76), NOW - 30, MBB))


@dataclass(frozen=True)
class Path:
    name: str
    build: Callable[[], pb.Job]
    resume_step: int


PATHS = [
    Path("failure", failure, 37),
    Path("agent lost", agent_lost, 37),
    Path("checkpointed move", checkpointed_move, 45),
    Path("store outage", store_outage, 37),
    Path("could not start", could_not_start, 37),
    Path("make-before-break go", standby_go, 37),
]


def _agent_of(j: pb.Job) -> str:
    return j.placement.agent_id


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_new_attempt_starts_at_its_resume_step(path: Path) -> None:
    j = path.build()
    assert j.attempt >= 2 and j.phase == pb.JOB_PHASE_LAUNCHING
    assert j.progress.step == path.resume_step
    assert j.progress.last_checkpoint_step == path.resume_step
    assert j.progress.total_steps == 100
    # the trainer's first reports, before it loaded its checkpoint: step 0
    u = update(j, apb.ATTEMPT_STATE_STARTING, agent=_agent_of(j))
    u.update.progress.CopyFrom(pb.Progress(step=0, total_steps=0))
    out = updates.progress(j, u, NOW, MBB)
    if out is not None:
        j = out.job
    assert j.progress.step == path.resume_step, j.progress
    assert j.progress.last_checkpoint_step == path.resume_step
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=path.resume_step + 1,
                                        agent=_agent_of(j)), NOW + 1, MBB))
    assert j.progress.step == path.resume_step + 1
    assert j.progress.last_checkpoint_step == path.resume_step


def test_broker_restart_keeps_the_last_reported_step() -> None:
    """After a broker restart the agent re-reports its running attempt; an empty progress
    in that report (the rank's progress file not read yet) does not lower the step."""
    j = at_45()
    u = update(j, apb.ATTEMPT_STATE_RUNNING)
    u.update.progress.CopyFrom(pb.Progress(step=0, last_checkpoint_step=0))
    out = updates.progress(j, u, NOW, CFG)
    j = out.job if out is not None else j
    assert (j.progress.step, j.progress.last_checkpoint_step) == (45, 37)


def test_every_relaunch_path_is_covered() -> None:
    """The paths here are the transitions that raise ``Job.attempt`` (admit, promote)
    reached from every way an attempt ends; a new way to start an attempt must add one."""
    import inspect

    from broker.jobs import standby as sb
    from broker.jobs import transitions as tr

    starters = [f for mod in (tr, sb) for n, f in inspect.getmembers(mod, inspect.isfunction)
                if f.__module__ == mod.__name__ and "j.attempt += 1" in inspect.getsource(f)
                or (f.__module__ == mod.__name__ and "j.attempt = sb.attempt" in inspect.getsource(f))]
    assert sorted(f.__name__ for f in starters) == ["admit", "promote"]


def _waiting(j: pb.Job, state: int, since: float, step: int = 0) -> updates.AgentUpdate:
    """The agent's report while the ranks wait for their store (trainer/outage_wait.py):
    the progress file's step (0 before the load) and the ranks' wait."""
    u = update(j, state, agent=_agent_of(j))
    u.update.progress.CopyFrom(pb.Progress(step=step))
    u.update.store_wait.since = since
    u.update.store_wait.message = "Could not connect to the endpoint URL"
    return u


def _apply(j: pb.Job, u: updates.AgentUpdate, now: float) -> pb.Job:
    out = updates.progress(j, u, now, MBB)
    return out.job if out is not None else j


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_ranks_waiting_for_the_store_show_the_resume_step_and_why(path: Path) -> None:
    """The new attempt's ranks wait for their store before they resume: the job says so
    (pending reason: since when, the step it resumes from, no restart counted) and shows
    the resume step, not 0; a heartbeat's listing keeps the reason; the reason goes when
    the ranks report without a wait, and the step shown never went backwards."""
    j = path.build()
    shown = [j.progress.step]
    j = _apply(j, _waiting(j, apb.ATTEMPT_STATE_STARTING, NOW - 5), NOW)
    shown.append(j.progress.step)
    assert j.phase == pb.JOB_PHASE_LAUNCHING
    assert j.store_wait.ranks_since == NOW - 5
    # an outage that already ended attempts dates from the first of them
    began = j.store_wait.since if j.store_wait.count else NOW - 5
    assert f"unreachable since {store_wait.clock(began)}" in j.pending_reason, j.pending_reason
    assert f"wait for it to resume from step {path.resume_step}" in j.pending_reason, \
        j.pending_reason
    assert "no restart counted" in j.pending_reason and "Could not connect" in j.pending_reason
    # a heartbeat lists the attempt with its progress only: the reason stays
    listing = apb.RunningAttempt(job_id=j.id, attempt=j.attempt, state=apb.ATTEMPT_STATE_STARTING,
                                 progress=pb.Progress(step=0))
    lu = updates.listed(j, listing)
    assert lu.store_wait.since == NOW - 5
    j = _apply(j, updates.AgentUpdate(agent_id=_agent_of(j), update=lu), NOW + 1)
    assert j.store_wait.ranks_since == NOW - 5 and j.pending_reason
    shown.append(j.progress.step)
    # the store answered: the ranks load and run
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=path.resume_step + 1,
                                        agent=_agent_of(j)), NOW + 2, MBB))
    shown.append(j.progress.step)
    assert j.phase == pb.JOB_PHASE_RUNNING and not j.pending_reason
    assert not j.HasField("store_wait"), j.store_wait
    assert shown == sorted(shown) and min(shown) >= path.resume_step, shown


def test_a_save_waiting_for_the_store_is_shown_on_the_running_job() -> None:
    """A running attempt's ranks hold a save for the store (or train on without one): the
    job stays RUNNING at its step and says why; the reason goes once a save is durable."""
    j = at_45()
    j = _apply(j, _waiting(j, apb.ATTEMPT_STATE_RUNNING, NOW - 3, step=46), NOW)
    assert j.phase == pb.JOB_PHASE_RUNNING and j.progress.step == 46
    assert "wait for it to save" in j.pending_reason and "step 37" in j.pending_reason, \
        j.pending_reason
    u = update(j, apb.ATTEMPT_STATE_RUNNING, step=48, ckpt=48, agent=_agent_of(j))
    assert not updates.tells_nothing_new(j, u.update)
    j = must(updates.progress(j, u, NOW + 1, MBB))
    assert not j.pending_reason and not j.HasField("store_wait")
    assert (j.progress.step, j.progress.last_checkpoint_step) == (48, 48)


def test_an_attempt_that_waited_then_exited_81_dates_the_outage_from_the_wait() -> None:
    """Past CB_STORE_WAIT_S the ranks exit 81: the broker's own wait takes over and counts
    the outage from when the ranks first found the store down, not from the exit."""
    j = failure()
    j = _apply(j, _waiting(j, apb.ATTEMPT_STATE_STARTING, NOW - 100), NOW)
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=81,
                                             agent=_agent_of(j)), NOW + 20, CFG))
    assert j.phase == pb.JOB_PHASE_PENDING and j.restarts == 1  # the earlier failure's only
    assert j.store_wait.count == 1 and j.store_wait.since == NOW - 100
    assert j.store_wait.ranks_since == 0 and "unreachable since" in j.pending_reason
    assert j.progress.step == 37
