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
