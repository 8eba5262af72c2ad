"""Table-driven tests of the pure transitions: (phase x input) -> phase, events, commands.

No broker, no sockets, no threads, no clock: each row builds a job in a phase with
the transitions themselves, applies one input at a fixed ``now`` and compares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from broker.api.errors import FailedPrecondition
from broker.jobs import transitions as t
from broker.jobs import updates
from broker.jobs.causes import MoveState, StopKind
from broker.jobs.outcome import Outcome, SendLaunch, SendStop, WakeScheduler
from broker.jobs.recovery import Signal, Trigger, policy_for
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import (
    AGENT,
    CFG,
    admission,
    checkpointing,
    launching,
    migrating,
    running,
    stop,
    submitted,
    update,
)

P = pb
NOW = 200.0


def lost(trigger: Trigger) -> Callable[[pb.Job], Outcome | None]:
    def apply(job: pb.Job) -> Outcome | None:
        plan = policy_for(job, CFG).plan(Signal(trigger), job, CFG, NOW)
        assert plan is not None
        return t.attempt_lost(job, t.AttemptLost(agent_id=AGENT, plan=plan, message="gone"), NOW, CFG)
    return apply


def ended(state: int, **kw: object) -> Callable[[pb.Job], Outcome | None]:
    return lambda job: updates.attempt_ended(job, update(job, state, **kw), NOW, CFG)  # type: ignore[arg-type]


def stop_for(trigger: Trigger, **kw: object) -> Callable[[pb.Job], Outcome | None]:
    return lambda job: t.request_stop(job, stop(trigger, job, NOW, **kw), NOW, CFG)  # type: ignore[arg-type]


def cancel(connected: bool) -> Callable[[pb.Job], Outcome | None]:
    return lambda job: t.cancel(job, t.Cancel(actor="user", reason="", agent_connected=connected), NOW, CFG)


@dataclass(frozen=True)
class Row:
    name: str
    build: Callable[[], pb.Job]
    apply: Callable[[pb.Job], Outcome | None]
    phase: int | None  # None = nothing written
    events: tuple[str, ...] = ()
    commands: tuple[type, ...] = ()
    check: Callable[[pb.Job], bool] = field(default=lambda j: True)


ROWS = [
    Row("admit pending", submitted, lambda j: t.admit(j, admission(), NOW, CFG), P.JOB_PHASE_LAUNCHING,
        ("admitted", "launched"), (SendLaunch,), lambda j: j.attempt == 1),
    Row("admit migrating", migrating, lambda j: t.admit(j, admission(), NOW, CFG), P.JOB_PHASE_LAUNCHING,
        ("launched",), (SendLaunch,),
        lambda j: j.attempt == 2 and j.relaunches == 1 and j.migrations[-1].state == MoveState.LAUNCHING),
    Row("admit running (stale decision)", running, lambda j: t.admit(j, admission(), NOW, CFG), None),
    Row("running report", launching, lambda j: updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=1),
                                                                 NOW, CFG),
        P.JOB_PHASE_RUNNING, ("running",), (), lambda j: j.attempt_started_time == NOW),
    Row("checkpoint report", running,
        lambda j: updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=9, ckpt=8), NOW, CFG),
        P.JOB_PHASE_RUNNING, ("checkpoint",), (), lambda j: j.last_checkpoint_time == NOW),
    Row("update from an old attempt", running,
        lambda j: updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=9, attempt=0), NOW, CFG), None),
    Row("update from another agent", running,
        lambda j: updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=9, agent="x"), NOW, CFG), None),
    Row("succeeded", running, ended(apb.ATTEMPT_STATE_SUCCEEDED), P.JOB_PHASE_SUCCEEDED, ("succeeded",),
        (WakeScheduler,)),
    Row("succeeded while launching", launching, ended(apb.ATTEMPT_STATE_SUCCEEDED), P.JOB_PHASE_SUCCEEDED,
        ("running", "succeeded"), (WakeScheduler,)),
    Row("failed exit 1 retries", running, ended(apb.ATTEMPT_STATE_FAILED, exit_code=1, failed=("n0",)),
        P.JOB_PHASE_PENDING, ("requeued",), (WakeScheduler,),
        lambda j: j.restarts == 1 and list(j.excluded_nodes) == ["n0"] and j.requeue_cause == "failure"),
    Row("failed exit 2 is final", running, ended(apb.ATTEMPT_STATE_FAILED, exit_code=2), P.JOB_PHASE_FAILED,
        ("failed",), (WakeScheduler,)),
    Row("stopped by the agent", running, ended(apb.ATTEMPT_STATE_STOPPED), P.JOB_PHASE_PENDING,
        ("requeued",), (WakeScheduler,), lambda j: j.restarts == 0),
    Row("spot notice", running, stop_for(Trigger.SPOT_NOTICE, nodes=("n0",), deadline=NOW + 120),
        P.JOB_PHASE_CHECKPOINTING, ("migrating_out",), (SendStop,),
        lambda j: j.stop_reason == StopKind.MIGRATE and j.migrations[-1].cause == "spot_interruption"
        and j.migrations[-1].emergency),
    Row("region drain", running, stop_for(Trigger.REGION_DRAIN), P.JOB_PHASE_CHECKPOINTING, ("draining",),
        (SendStop,), lambda j: j.stop_reason == "drain"),
    Row("preempted", running, stop_for(Trigger.PREEMPTED), P.JOB_PHASE_CHECKPOINTING, ("preempted",),
        (SendStop,), lambda j: j.stop_reason == "preempt"),
    Row("plan ending excludes its nodes", running, stop_for(Trigger.PLAN_ENDING, nodes=("n0",), seconds_left=30),
        P.JOB_PHASE_CHECKPOINTING, ("migrating_out",), (SendStop,), lambda j: list(j.excluded_nodes) == ["n0"]),
    Row("stop while launching requeues", launching, stop_for(Trigger.REGION_DRAIN), P.JOB_PHASE_PENDING,
        ("requeued",), (SendStop, WakeScheduler), lambda j: j.requeue_cause == "migration"),
    Row("stop while stopping", checkpointing, stop_for(Trigger.PREEMPTED), None),
    Row("stop a queued job", submitted, stop_for(Trigger.REGION_DRAIN), None),
    Row("checkpointed after spot", checkpointing, ended(apb.ATTEMPT_STATE_CHECKPOINTED, step=5, ckpt=5),
        P.JOB_PHASE_MIGRATING, ("checkpoint", "migrating"), (WakeScheduler,),
        lambda j: j.migrations[-1].state == MoveState.QUEUED),
    Row("checkpointed after preemption", lambda: checkpointing(trigger=Trigger.PREEMPTED),
        ended(apb.ATTEMPT_STATE_CHECKPOINTED, step=5, ckpt=5), P.JOB_PHASE_PENDING,
        ("checkpoint", "suspended", "requeued"), (WakeScheduler,), lambda j: j.requeue_cause == "preemption"),
    Row("killed during a stop", checkpointing, ended(apb.ATTEMPT_STATE_STOPPED), P.JOB_PHASE_MIGRATING,
        ("migrating",), (WakeScheduler,)),
    Row("agent lost while running", running, lost(Trigger.AGENT_LOST), P.JOB_PHASE_PENDING, ("requeued",),
        (WakeScheduler,), lambda j: j.requeue_cause == "failure" and j.migrations[-1].cause == "agent_lost"),
    Row("agent lost while preempting", lambda: checkpointing(trigger=Trigger.PREEMPTED),
        lost(Trigger.AGENT_LOST), P.JOB_PHASE_PENDING, ("requeued",), (WakeScheduler,),
        lambda j: j.requeue_cause == "preemption"),
    Row("attempt missing", running, lost(Trigger.ATTEMPT_MISSING), P.JOB_PHASE_PENDING, ("requeued",),
        (WakeScheduler,)),
    Row("loss of a queued job", submitted, lost(Trigger.AGENT_LOST), None),
    Row("cancel pending", submitted, cancel(False), P.JOB_PHASE_CANCELLED, ("cancelled",), (WakeScheduler,)),
    Row("cancel running, agent there", running, cancel(True), P.JOB_PHASE_RUNNING, ("cancel_requested",),
        (SendStop,), lambda j: j.stop_reason == "cancel"),
    Row("cancel running, agent gone", running, cancel(False), P.JOB_PHASE_CANCELLED, ("cancelled",),
        (WakeScheduler,)),
    Row("stop timeout", checkpointing, lambda j: t.stop_timed_out(j, t.StopTimeout(j.attempt), NOW, CFG),
        P.JOB_PHASE_MIGRATING, ("migrating",), (SendStop, WakeScheduler)),
    Row("stop timeout for an old attempt", checkpointing,
        lambda j: t.stop_timed_out(j, t.StopTimeout(j.attempt - 1), NOW, CFG), None),
    Row("pending reason", submitted, lambda j: t.set_pending_reason(j, "no room", NOW, CFG),
        P.JOB_PHASE_PENDING, (), (), lambda j: j.pending_reason == "no room"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_transition_table(row: Row) -> None:
    job = row.build()
    before = job.SerializeToString()
    out = row.apply(job)
    assert job.SerializeToString() == before, "a transition must not edit its input"
    if row.phase is None:
        assert out is None
        return
    assert out is not None
    assert out.job.phase == row.phase, pb.JobPhase.Name(out.job.phase)
    assert tuple(e.type for e in out.events) == row.events
    assert tuple(type(c) for c in out.commands) == row.commands
    assert all(e.time == NOW for e in out.events) and out.job.updated_time == NOW
    assert row.check(out.job)


def test_send_stop_carries_the_plan() -> None:
    job = running()
    out = t.request_stop(job, stop(Trigger.SPOT_NOTICE, job, NOW, deadline=NOW + 100), NOW, CFG)
    assert out is not None
    (cmd,) = out.commands
    assert isinstance(cmd, SendStop)
    assert (cmd.kind, cmd.checkpoint_first, cmd.grace_s, cmd.attempt) == (StopKind.MIGRATE, True, 90.0, 1)


def test_launch_is_attempt_fenced_and_resumes_from_the_durable_checkpoint() -> None:
    job = migrating()
    out = t.admit(job, admission(), NOW, CFG)
    assert out is not None
    (cmd,) = out.commands
    assert isinstance(cmd, SendLaunch)
    assert cmd.launch.checkpoint_uri == "s3://cb-us-east-2/jobs/j-1/attempt-2"
    assert cmd.launch.resume_from == job.progress.last_checkpoint_uri != ""


def test_restarts_exhausted_fail_the_job() -> None:
    job = running()
    job.restarts = CFG.max_restarts
    out = updates.attempt_ended(job, update(job, apb.ATTEMPT_STATE_FAILED, exit_code=1), NOW, CFG)
    assert out is not None and out.job.phase == P.JOB_PHASE_FAILED
    assert out.events[-1].reason == "max_restarts"


def test_cancel_of_a_finished_job_is_refused() -> None:
    job = running()
    done = updates.attempt_ended(job, update(job, apb.ATTEMPT_STATE_SUCCEEDED), NOW, CFG)
    assert done is not None
    with pytest.raises(FailedPrecondition):
        t.cancel(done.job, t.Cancel(actor="u", reason="", agent_connected=True), NOW + 1, CFG)


# ---- issue 15 defect 3 (core half): a superseded attempt's late end ------------------------
def relaunched_after_loss() -> pb.Job:
    """Attempt 1 ran, checkpointed step 10, its agent was declared lost; attempt 2 launching."""
    j = running()
    j = updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=10, ckpt=10), NOW - 5, CFG).job
    j = lost(Trigger.AGENT_LOST)(j).job
    return t.admit(j, admission(agent="us-east-2-b"), NOW - 2, CFG).job


def requeued_after_loss() -> pb.Job:
    """Attempt 1's agent was declared lost; the job waits in PENDING for attempt 2."""
    j = running()
    j = updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=10, ckpt=10), NOW - 5, CFG).job
    return lost(Trigger.AGENT_LOST)(j).job


def running_long_after_loss() -> pb.Job:
    """As relaunched_after_loss, but attempt 2 has been RUNNING (step 12) for longer than
    newer_checkpoint_restart_s: its own work is worth keeping."""
    j = relaunched_after_loss()
    started = NOW - CFG.newer_checkpoint_restart_s - 10
    j = updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=12, agent="us-east-2-b"),
                         started, CFG).job
    return j


def late(state: int, *, step: int, ckpt: int, attempt: int = 1, total: int = 100,
         own_dir: bool = True) -> Callable[[pb.Job], Outcome | None]:
    def apply(job: pb.Job) -> Outcome | None:
        u = apb.JobUpdate(job_id=job.id, attempt=attempt, state=state)
        u.progress.step, u.progress.total_steps, u.progress.loss = step, total, 0.5
        if ckpt:
            u.progress.last_checkpoint_step = ckpt
            where = attempt if own_dir else attempt + 1
            u.progress.last_checkpoint_uri = f"s3://cb/jobs/{job.id}/attempt-{where}/step-{ckpt}"
        return updates.attempt_ended(job, updates.AgentUpdate(agent_id=AGENT, update=u), NOW, CFG)
    return apply


def _stops_attempt_2(out: Outcome) -> bool:
    stops = [c for c in out.commands if isinstance(c, SendStop)]
    return [(s.agent_id, s.attempt, s.kind) for s in stops] == [("us-east-2-b", 2, None)]


SUPERSEDED = [
    # The defect: attempt 1 finished all 100 steps while the broker had given up on it;
    # today its success is dropped as stale and attempt 2 runs from the (pruned) step 10.
    Row("late success, newer attempt launching", relaunched_after_loss,
        late(apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt=100), P.JOB_PHASE_SUCCEEDED,
        ("succeeded",), (SendStop, WakeScheduler),
        lambda j: j.progress.last_checkpoint_step == 100 and j.progress.step == 100
        and j.attempt == 2),
    Row("late success, job requeued", requeued_after_loss,
        late(apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt=100), P.JOB_PHASE_SUCCEEDED,
        ("succeeded",), (WakeScheduler,), lambda j: j.progress.last_checkpoint_step == 100),
    Row("late success, job migrating", migrating,
        late(apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt=100), P.JOB_PHASE_SUCCEEDED,
        ("succeeded",), (WakeScheduler,)),
    # Not a finished attempt: its later checkpoint becomes the resume point, nothing else.
    Row("late failure with a newer checkpoint, requeued", requeued_after_loss,
        late(apb.ATTEMPT_STATE_FAILED, step=42, ckpt=40), P.JOB_PHASE_PENDING, ("checkpoint",), (),
        lambda j: j.progress.last_checkpoint_step == 40
        and j.progress.last_checkpoint_uri.endswith("/attempt-1/step-40")),
    # A newer durable checkpoint wins: a newer attempt that has barely started (still
    # launching) is stopped and the job relaunches from the newer checkpoint...
    Row("late stop with a newer checkpoint, newer attempt launching: restart from it",
        relaunched_after_loss, late(apb.ATTEMPT_STATE_STOPPED, step=30, ckpt=30), P.JOB_PHASE_PENDING,
        ("checkpoint", "requeued"), (SendStop, WakeScheduler),
        lambda j: j.progress.last_checkpoint_step == 30 and j.attempt == 2 and j.restarts == 0),
    # ...one running for a while keeps running (the event says it redoes steps)
    Row("late stop with a newer checkpoint, newer attempt running long: said, kept",
        running_long_after_loss, late(apb.ATTEMPT_STATE_STOPPED, step=30, ckpt=30),
        P.JOB_PHASE_RUNNING, ("checkpoint",), (),
        lambda j: j.progress.last_checkpoint_step == 30 and j.attempt == 2),
    Row("late success without the final checkpoint: only its checkpoint counts", requeued_after_loss,
        late(apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt=90), P.JOB_PHASE_PENDING, ("checkpoint",), (),
        lambda j: j.progress.last_checkpoint_step == 90),
    Row("late end with an older checkpoint: progress never goes back", requeued_after_loss,
        late(apb.ATTEMPT_STATE_FAILED, step=8, ckpt=5), None),
    Row("late end with no checkpoint", requeued_after_loss,
        late(apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt=0), None),
    Row("late checkpoint outside the attempt's own directory", requeued_after_loss,
        late(apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt=100, own_dir=False), None),
    Row("late success of a future attempt number", requeued_after_loss,
        late(apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt=100, attempt=5), None),
    Row("late success after the job already ended", lambda: must_end(requeued_after_loss()),
        late(apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt=100), None),
]


def must_end(job: pb.Job) -> pb.Job:
    return t.cancel(job, t.Cancel(actor="user", reason="", agent_connected=False), NOW - 1, CFG).job


@pytest.mark.parametrize("row", SUPERSEDED, ids=lambda r: r.name)
def test_superseded_attempt_end(row: Row) -> None:
    """Issue 15 defect 3 (core half): a superseded attempt's SUCCEEDED update with a
    durable final checkpoint was discarded as stale (``is_current`` requires a running
    phase), so the job relaunched from a pruned step and FAILED. Its durable work counts:
    it completes the job (stopping a newer attempt), or moves the resume point forward."""
    job = row.build()
    out = row.apply(job)
    if row.phase is None:
        assert out is None
        return
    assert out is not None
    assert out.job.phase == row.phase
    assert tuple(e.type for e in out.events) == row.events
    assert tuple(type(c) for c in out.commands) == row.commands
    assert row.check(out.job)
    if "newer attempt" in row.name and "newer checkpoint" in row.name:
        (ev,) = [e for e in out.events if e.type == "checkpoint"]
        assert ev.reason == "newer_checkpoint_superseded"
        assert "newer than step 10 that attempt 2 resumed from" in ev.message, ev.message
        restart = row.phase == P.JOB_PHASE_PENDING
        assert ("restarting it from the newer checkpoint" in ev.message) is restart
        if restart:
            (stop_cmd,) = [c for c in out.commands if isinstance(c, SendStop)]
            assert (stop_cmd.attempt, stop_cmd.agent_id) == (2, "us-east-2-b")
            assert out.job.progress.step == 30  # shown: the resume step, not 0
    if row.name == "late success, newer attempt launching":
        assert _stops_attempt_2(out)
        assert out.events[0].reason == "completed_by_superseded_attempt"


def test_newer_attempt_reporting_an_older_checkpoint_keeps_the_later_one() -> None:
    """After a superseded attempt's step-30 checkpoint became the resume point, the newer
    attempt (resumed from step 10) reporting its step-15 checkpoint does not move it back."""
    job = late(apb.ATTEMPT_STATE_STOPPED, step=30, ckpt=30)(running_long_after_loss()).job
    out = updates.progress(job, update(job, apb.ATTEMPT_STATE_RUNNING, step=15, ckpt=15,
                                       agent="us-east-2-b"), NOW + 1, CFG)
    assert out is not None and out.job.phase == P.JOB_PHASE_RUNNING
    assert out.job.progress.last_checkpoint_step == 30
    assert out.job.progress.last_checkpoint_uri.endswith("/attempt-1/step-30")
    # what users see never goes below durable work: the newer attempt re-does 10..30
    assert out.job.progress.step == 30
    assert "checkpoint" not in [e.type for e in out.events]
