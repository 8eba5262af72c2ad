"""Make-before-break moves as pure transitions (docs/contracts.md "Make-before-break").

Why: a move used to be break-before-make: stop the source, wait for its final
checkpoint, then place, launch, copy and start the destination, all on the critical
path. Here the destination is placed and started (a *standby* attempt, `Job.standby`)
as soon as the move is decided, while the source still saves; it is held before its
first step (trainer/standby.py) and told to go once the source is fenced.

Safety rules, each enforced here and nowhere else:
1. One writer: the standby is not the job's attempt until the go. Its attempt number is
   the source's + 1, it writes to its own attempt directory, and before the go it can
   neither step nor save. The go is only produced by `promote`, which runs when the
   source attempt's end was reported (exit after its final save, a failed save, or a
   stop the broker gave up on): the source is fenced before the destination steps.
2. What it resumes from is `broker.jobs.handoff.decide`: the final checkpoint if durable,
   else the newest durable one, else from scratch.
3. Everything is in the job record (one compare-and-set): a broker restart finds the
   standby (its capacity stays reserved, its updates are not fenced as stale) or the go
   (re-sent until the attempt reports RUNNING: `go_due`). A standby whose reason to exist
   went away (the job was cancelled, finished, lost its source, or the move became a
   plain relaunch) is dropped and its attempt fenced by `settle`, which `seal` runs on
   every transition: one place, whatever path got there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import placement
from broker.jobs import below_size, handoff, migration, precopy, shown_progress, store_wait
from broker.jobs.causes import Cause, StopKind
from broker.jobs.lifecycle import CHECKPOINTING, LAUNCHING, MIGRATING, Tx
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.jobs.outcome import Outcome

SUFFIX = "~standby"  # the scheduler's request id for a job's standby placement
MOVE_KINDS = frozenset({StopKind.DRAIN, StopKind.MIGRATE})


@dataclass(frozen=True)
class SendGo:
    """Tell ``agent_id`` that standby ``attempt`` may load ``resume_from`` and step."""

    agent_id: str
    job_id: str
    attempt: int
    resume_from: str
    reason: str = ""


@dataclass(frozen=True)
class ReserveStandby:
    """The scheduler found capacity for a moving job's destination."""

    admission: placement.Admission
    nodes: dict[str, pb.Node]
    checkpoint_bucket: str


def request_id(job_id: str) -> str:
    return job_id + SUFFIX


def job_of(request: str) -> str | None:
    """The job id of a standby request id, None for an ordinary one."""
    return request[: -len(SUFFIX)] if request.endswith(SUFFIX) else None


def waiting(job: pb.Job) -> bool:
    """A standby is reserved and has not been told to go."""
    return job.HasField("standby") and not job.standby.go_time


def wants_placement(job: pb.Job) -> bool:
    """A job moving out (drain/migrate stop in flight) with no standby yet."""
    return (job.phase == CHECKPOINTING and StopKind.parse(job.stop_reason) in MOVE_KINDS
            and not job.HasField("standby"))


# A move made *for* a kind of capacity takes only that kind for its standby: a move to
# free prepaid capacity (broker/jobs/proactive.py better_capacity) that landed on other
# on-demand nodes would pay the move for no saving. No standby found = the move goes on
# break-before-make, and the scheduler's own preference (plans first) places it.
DESTINATION_TYPES: dict[str, frozenset[placement.CapacityType]] = {
    Cause.BETTER_CAPACITY.value: frozenset({placement.CapacityType.TRAINING_PLAN}),
}


def destination_types(job: pb.Job) -> frozenset[placement.CapacityType]:
    """The capacity types the standby of ``job``'s open move is limited to (empty = any
    its spec allows)."""
    m = migration.open_migration(job)
    return DESTINATION_TYPES.get(m.cause, frozenset()) if m is not None else frozenset()


def wanted(job: pb.Job, config: BrokerConfig) -> bool:
    """Should a standby be reserved for ``job`` now?"""
    return config.make_before_break and wants_placement(job)


def is_standby(job: pb.Job, agent_id: str, attempt: int) -> bool:
    """Is (agent, attempt) the job's waiting standby? Its reports are not stale."""
    return waiting(job) and job.standby.attempt == attempt and job.standby.placement.agent_id == agent_id


def reserve(job: pb.Job, inp: ReserveStandby, now: float, config: BrokerConfig) -> Outcome | None:
    """Reserve the destination and send its Launch{standby}; the source keeps saving."""
    from broker.jobs.outcome import SendLaunch, begin, seal
    from broker.jobs.transitions import checkpoint_uri_for, placement_of

    if not wanted(job, config):
        return None
    tx = begin(job, now)
    j = tx.job
    pl = placement_of(inp.admission, inp.nodes, inp.admission.explanation)
    nxt = pb.Job()
    nxt.CopyFrom(j)
    nxt.attempt = j.attempt + 1
    ckpt = checkpoint_uri_for(nxt, inp.checkpoint_bucket, config)
    j.standby.CopyFrom(pb.Standby(attempt=j.attempt + 1, source_attempt=j.attempt, placement=pl,
                                  checkpoint_uri=ckpt, launched_time=now))
    m = migration.open_migration(j)
    if m is not None:
        m.make_before_break = True
        m.standby_launched_time = now
    tx.note("standby_launched", reason="make_before_break", actor="scheduler",
            message=f"attempt {j.attempt + 1} starting in standby on {pl.region}/{pl.agent_id}"
                    f" while attempt {j.attempt} saves its final checkpoint",
            details={"agent": pl.agent_id, "world_size": str(pl.world_size), "checkpoint_uri": ckpt})
    launch = apb.Launch(job_id=j.id, attempt=j.attempt + 1, spec=j.spec, placement=pl,
                        checkpoint_uri=ckpt, resume_from="", transfer_mode="direct", standby=True,
                        precopy_from=precopy.precopy_from(j))
    launch.env[store_wait.STORE_WAIT_ENV] = f"{store_wait.attempt_wait_s(j, now, config):g}"
    return seal(tx, SendLaunch(agent_id=pl.agent_id, launch=launch))


def promote(tx: Tx, end: handoff.SourceEnd, actor: str) -> SendGo | None:
    """The source is fenced (its end is being written in ``tx``): the standby becomes
    the job's attempt and gets its go. None (nothing done) when there is no standby."""
    j = tx.job
    if not waiting(j) or j.phase != MIGRATING or j.attempt != j.standby.source_attempt:
        return None
    sb = j.standby
    # before a checkpoint of its own: the shared one it started from (checkpoint_shares.py)
    durable = j.progress.last_checkpoint_uri or j.spec.resume_source.uri
    h = handoff.decide(end, final_uri=durable if end is handoff.SourceEnd.CHECKPOINTED else "",
                       durable_uri=durable)
    if h.action is not handoff.GoAction.GO:
        return None
    resume_from = precopy.local_resume(j, h.resume_from)  # the pre-copied one: read locally
    m = migration.open_migration(j)
    j.attempt = sb.attempt
    j.relaunches += 1
    shown_progress.start_at_resume_step(j)
    j.placement.CopyFrom(sb.placement)
    below_size.admitted(j, j.phase, tx.now)  # a move onto fewer nodes: to grow back later
    sb.go_time = tx.now
    sb.resume_from = resume_from
    migration.launched(j, tx.now, resume_from)
    if m is not None:
        m.go_time = tx.now
    j.stop_reason = ""
    j.stop_requested_time = 0.0
    tx.move(LAUNCHING, "launched", reason="make_before_break", actor=actor,
            message=f"attempt {j.attempt} (standby on {sb.placement.region}) goes: {h.reason}"
                    + (f", resuming from {resume_from}" if resume_from else ""),
            details={"checkpoint_uri": sb.checkpoint_uri, "resume_from": resume_from,
                     "agent": sb.placement.agent_id, "world_size": str(sb.placement.world_size)})
    return SendGo(agent_id=sb.placement.agent_id, job_id=j.id, attempt=j.attempt,
                  resume_from=resume_from, reason=h.reason)


def standby_missing(job: pb.Job, agent_id: str, now: float) -> Outcome | None:
    """Its agent re-registered without the standby (it died with the agent): drop it."""
    if not (waiting(job) and job.standby.placement.agent_id == agent_id):
        return None
    u = apb.JobUpdate(job_id=job.id, attempt=job.standby.attempt, state=apb.ATTEMPT_STATE_FAILED,
                      exit_code=-1, message=f"agent {agent_id} re-registered without it")
    return standby_ended(job, agent_id, u, now)


def standby_ended(job: pb.Job, agent_id: str, u: apb.JobUpdate, now: float) -> Outcome | None:
    """The standby attempt died before its go: drop it (the move goes on the usual way,
    MIGRATING -> placed again, once the source has stopped)."""
    from broker.jobs.outcome import WakeScheduler, begin, seal

    if not is_standby(job, agent_id, u.attempt):
        return None
    tx = begin(job, now)
    tx.job.ClearField("standby")
    tx.note("standby_failed", reason="standby_failed", actor=f"agent:{agent_id}",
            message=f"standby attempt {u.attempt} ended before its go (exit {u.exit_code}):"
                    f" {u.message.strip()[-300:]}; the move goes on without it")
    # a Stop held for this standby's pre-copy goes now (nothing will copy any more)
    stop = precopy.release(tx, why="the standby ended before its pre-copy did", actor="broker")
    return seal(tx, *((stop,) if stop is not None else ()), WakeScheduler())


def settle(job: pb.Job) -> tuple[object, ...]:
    """Drop a standby that has no reason to exist any more (called by ``seal`` on every
    transition); returns the fence for its attempt when it was not yet told to go."""
    from broker.jobs.outcome import SendStop

    if not job.HasField("standby"):
        return ()
    sb = job.standby
    if not sb.go_time:
        if (job.phase == CHECKPOINTING and job.attempt == sb.source_attempt
                and StopKind.parse(job.stop_reason) in MOVE_KINDS):
            return ()
        job.ClearField("standby")
        return (SendStop(agent_id=sb.placement.agent_id, job_id=job.id, attempt=sb.attempt, kind=None),)
    if job.phase == LAUNCHING and job.attempt == sb.attempt:
        return ()  # promoted, waiting for RUNNING: the Go is re-sent meanwhile (go_due)
    job.ClearField("standby")
    return ()


def go_due(job: pb.Job, agent_id: str, attempt: int) -> SendGo | None:
    """The Go to re-send to a promoted standby still waiting (a Go lost to a broker or
    stream restart); writing the same go file twice is harmless on the agent."""
    if (job.HasField("standby") and job.standby.go_time and job.phase == LAUNCHING
            and job.attempt == attempt == job.standby.attempt and job.placement.agent_id == agent_id):
        return SendGo(agent_id=agent_id, job_id=job.id, attempt=attempt,
                      resume_from=job.standby.resume_from, reason="re-sent")
    return None
