"""What a transition returns: the new job, its events, and commands as data.

Why commands are data: a transition must be testable without an agent, a socket or
a clock, and it may be re-run when its compare-and-set write loses a race. So it
only *says* "send this Launch" or "wake the scheduler"; :mod:`broker.jobs.applier`
executes the commands once, after the write has committed (an agent never runs
something the store does not know about).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.jobs.causes import MoveState, StopKind
from broker.jobs.lifecycle import FAILED, SUCCEEDED, TERMINAL, Tx, phase_name
from broker.jobs.standby import SendGo, settle
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb


@dataclass(frozen=True)
class SendLaunch:
    """Start attempt ``launch.attempt`` of ``launch.job_id`` on ``agent_id``."""

    agent_id: str
    launch: apb.Launch


@dataclass(frozen=True)
class SendStop:
    """Stop ``attempt`` on ``agent_id``; ``kind`` None = fencing (STALE_ATTEMPT, rate-limited)."""

    agent_id: str
    job_id: str
    attempt: int
    kind: StopKind | None
    checkpoint_first: bool = False
    grace_s: float = 0.0


@dataclass(frozen=True)
class WakeScheduler:
    """Something placement cares about changed (a job queued, GPUs freed).

    ``new_job``: only a new job was queued (a submit). It can change nothing while the
    fleet has no usable node, so the scheduler takes such wake-ups only when its last
    pass had one (broker/scheduling/loop.py ``job_queued``); its interval pass, and
    the wake-up of an agent connecting, see the job anyway."""

    new_job: bool = False


# Watchers of the job (WatchJob) are woken by the applier whenever events were written.
Command = SendLaunch | SendStop | WakeScheduler | SendGo


@dataclass(frozen=True)
class Outcome:
    """The job as it must be written, the events written with it, and what to do after."""

    job: pb.Job
    events: tuple[pb.JobEvent, ...]
    commands: tuple[Command, ...] = ()


def seal(tx: Tx, *commands: Command) -> Outcome:
    """Finish a transition: derived fields, a move closed by a terminal phase."""
    job = tx.job
    if job.phase in TERMINAL:
        from broker.jobs import migration  # migration imports nothing from here; keeps it light

        state = {SUCCEEDED: MoveState.DONE, FAILED: MoveState.FAILED}.get(job.phase, MoveState.CANCELLED)
        migration.finish(job, tx.now, 0.0, state=state, message=f"job ended {phase_name(job.phase)}")
    # a make-before-break standby that lost its reason to exist is dropped and fenced
    commands = (*commands, *settle(job))  # type: ignore[assignment]
    job.updated_time = tx.now
    end = job.finished_time or tx.now
    job.goodput.wall_s = max(0.0, end - job.created_time)
    return Outcome(job=job, events=tuple(tx.events), commands=tuple(commands))


def begin(job: pb.Job, now: float) -> Tx:
    """A transaction on a private copy of ``job`` (the input is never edited)."""
    copy = pb.Job()
    copy.CopyFrom(job)
    return Tx(job=copy, now=now)
