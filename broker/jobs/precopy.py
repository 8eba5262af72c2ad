"""Pre-copy for planned make-before-break moves: hold the source's Stop until the
destination region holds the last periodic checkpoint (docs/contracts.md section 5a).

Why: with make-before-break the destination reads the final checkpoint straight from
the source region's store, and its agent copies it into its own region afterwards for
durability. When the move is *planned* (a drain, a plan about to end, better capacity,
defragmentation) there is time before the stop: the destination's agent copies the last
periodic checkpoint into its own region first, while the source still trains, so the
destination region already holds a durable resume point (the fallback if the final save
fails: a local read, not a cross-region one) and only the final checkpoint is left to
cross regions on the critical path. A spot notice never waits (two minutes are for the
final save), and a job without a durable checkpoint has nothing to pre-copy.

The hold is data in the move's record (``Migration.stop_held_until`` etc.), so a broker
restart keeps it; the Stop is released by whichever comes first:
* the destination's agent reports the pre-copy ended (done or failed): ``reported``;
* the hold runs out (``precopy_wait_s``; for a plan end at most half the time left):
  ``release_expired`` from the broker's housekeeping;
* the standby dies or is refused (``standby.standby_ended``): ``release``;
* another stop request comes (e.g. a spot notice during the hold): ``urgent``;
* a proactive move's standby found no place in the next scheduler pass: ``release_unplaced``.
Nothing here does I/O; the functions edit a transaction like the rest of broker/jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.jobs import migration
from broker.jobs.causes import Cause, StopKind
from broker.jobs.lifecycle import CHECKPOINTING, RUNNING, Tx

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.jobs.outcome import Outcome, SendStop
    from broker.jobs.recovery import StopPlan
    from computebroker.v1 import agent_pb2 as apb
    from computebroker.v1 import common_pb2 as pb

# Planned moves: there is time to copy before the stop. Not SPOT_INTERRUPTION (the notice
# is for the final save), not preemptions (the capacity is wanted now), not losses.
PRECOPY_CAUSES = frozenset({Cause.REGION_DRAIN, Cause.PLAN_ENDING, Cause.BETTER_CAPACITY,
                            Cause.DEFRAGMENT})
MIN_GRACE_S = 5.0


def wanted(job: pb.Job, plan: StopPlan, config: BrokerConfig) -> bool:
    """Should this stop be held for a pre-copy?"""
    return (config.make_before_break and config.precopy_wait_s > 0 and plan.checkpoint_first
            and plan.cause in PRECOPY_CAUSES and job.phase == RUNNING
            and bool(job.progress.last_checkpoint_uri))


def hold(j: pb.Job, plan: StopPlan, now: float, config: BrokerConfig) -> None:
    """Record the held Stop on the move just begun (``migration.begin``)."""
    m = migration.open_migration(j)
    assert m is not None, "hold() runs right after begin_move"
    wait = config.precopy_wait_s
    if plan.cause is Cause.PLAN_ENDING:  # the plan's end is a deadline: keep half for the save
        wait = min(wait, plan.grace_s / 2)
    m.stop_held_until = now + wait
    m.held_stop_grace_s = plan.grace_s
    m.precopy_from = j.progress.last_checkpoint_uri


def held(job: pb.Job) -> pb.Migration | None:
    """The move whose Stop is held for a pre-copy (not sent yet), or None."""
    m = migration.open_migration(job)
    if (m is None or not m.stop_held_until or m.stop_sent_time or job.phase != CHECKPOINTING
            or StopKind.parse(job.stop_reason) not in (StopKind.DRAIN, StopKind.MIGRATE)):
        return None
    return m


def precopy_from(job: pb.Job) -> str:
    """What a standby's Launch should pre-copy ("" = nothing: the Stop is not held)."""
    m = held(job)
    return m.precopy_from if m is not None else ""


def release(tx: Tx, *, why: str, actor: str, grace_s: float | None = None) -> SendStop | None:
    """Send the held Stop now (None when nothing is held). A plan end keeps its absolute
    deadline (the hold used part of it); ``grace_s`` may only shorten the grace."""
    from broker.jobs.transitions import stop_of

    j = tx.job
    m = held(j)
    if m is None:
        return None
    grace = m.held_stop_grace_s
    if m.cause == Cause.PLAN_ENDING.value:
        grace = m.started_time + grace - tx.now
    if grace_s is not None:
        grace = min(grace, grace_s)
    grace = max(MIN_GRACE_S, grace)
    m.stop_sent_time = tx.now
    j.stop_requested_time = tx.now
    # the source trained during the hold: productive time, not the move's (goodput); the
    # CHECKPOINTING phase is charged from the Stop on
    if j.phase_time:
        j.goodput.productive_s += max(0.0, tx.now - j.phase_time)
        j.phase_time = tx.now
    tx.note("stop_sent", reason="precopy", actor=actor,
            message=f"attempt {j.attempt} is asked to stop and save its final checkpoint: {why}",
            details={"grace_s": f"{grace:.1f}", "held_s": f"{tx.now - m.started_time:.1f}"})
    return stop_of(j, StopKind.parse(j.stop_reason), True, grace)


def reported(job: pb.Job, inp: apb.JobUpdate, now: float, config: BrokerConfig) -> Outcome | None:
    """The standby's agent reported its pre-copy ended (``transfer.done`` or ``.error``):
    record it on the move and release the held Stop."""
    from broker.jobs.outcome import begin, seal

    t = inp.transfer
    m = migration.open_migration(job)
    if (m is None or not m.precopy_from or m.precopy_done_time or not (t.done or t.error)
            or not job.HasField("standby") or job.standby.attempt != inp.attempt):
        return None
    tx = begin(job, now)
    m = migration.open_migration(tx.job)
    assert m is not None
    m.precopy.CopyFrom(t)
    m.precopy_done_time = now
    if t.error:
        tx.note("precopy_failed", reason="precopy", actor="agent",
                message=f"pre-copy of {m.precopy_from} failed: {t.error[-300:]}")
        why = "the pre-copy failed (the final checkpoint is read from the source region as usual)"
    else:
        m.precopy_uri = t.dst_uri
        tx.note("precopied", reason="precopy", actor="agent",
                message=f"{m.precopy_from} copied to {t.dst_uri} ({t.bytes_done / 1e6:.1f} MB in"
                        f" {t.seconds:.1f}s, {t.method}) before the stop",
                details={"bytes": str(t.bytes_done), "seconds": f"{t.seconds:.3f}", "method": t.method})
        why = f"the destination region holds {m.precopy_from.rstrip('/').rpartition('/')[2]} now"
    stop = release(tx, why=why, actor="broker")
    return seal(tx, stop) if stop is not None else seal(tx)


def expired(job: pb.Job, now: float) -> bool:
    m = held(job)
    return m is not None and now >= m.stop_held_until


def release_expired(job: pb.Job, _inp: object, now: float, config: BrokerConfig) -> Outcome | None:
    """Housekeeping: the hold ran out (no standby placed, or the copy is slow)."""
    from broker.jobs.outcome import begin, seal

    if not expired(job, now):
        return None
    tx = begin(job, now)
    stop = release(tx, why="the pre-copy did not end in time; stopping anyway", actor="broker")
    return seal(tx, stop) if stop is not None else None


# Moves nobody forced (broker/scheduling/proactive_watch.py) were decided on capacity free
# *now*: when the scheduler's next pass finds no place for their standby, none is coming
# (a plan in the source's own cluster, where a standby would fence the source, is the
# usual case), so the Stop goes at once and the move is made break-before-make, instead
# of holding it for ``precopy_wait_s``. A drain or a plan end keeps waiting: capacity
# elsewhere may free up, and the job trains meanwhile.
RELEASE_UNPLACED = frozenset({Cause.BETTER_CAPACITY, Cause.DEFRAGMENT})


def unplaced_releasable(job: pb.Job) -> bool:
    """A held Stop of a move in RELEASE_UNPLACED whose standby is not placed yet."""
    m = held(job)
    return m is not None and m.cause in {c.value for c in RELEASE_UNPLACED} and not job.HasField("standby")


def release_unplaced(job: pb.Job, _inp: object, now: float, config: BrokerConfig) -> Outcome | None:
    """The scheduler found no place for this move's standby: send the held Stop now."""
    from broker.jobs.outcome import begin, seal

    if not unplaced_releasable(job):
        return None
    tx = begin(job, now)
    stop = release(tx, why="no destination can start before the stop (moving break-before-make)",
                   actor="scheduler")
    return seal(tx, stop) if stop is not None else None


def urgent(job: pb.Job, plan: StopPlan, now: float) -> Outcome | None:
    """Another stop request while the Stop is held (e.g. a spot notice): send it now,
    with the shorter of the two graces."""
    from broker.jobs.outcome import begin, seal

    if held(job) is None:
        return None
    tx = begin(job, now)
    stop = release(tx, why=f"{plan.cause.text} during the pre-copy", actor="broker",
                   grace_s=plan.grace_s if plan.checkpoint_first else MIN_GRACE_S)
    return seal(tx, stop) if stop is not None else None


def local_resume(job: pb.Job, resume_from: str) -> str:
    """The go's checkpoint, read in the destination's own region when it is the one
    pre-copied there (a failed final save falls back to the periodic checkpoint)."""
    m = migration.open_migration(job)
    if m is not None and resume_from and resume_from == m.precopy_from and m.precopy_uri:
        return m.precopy_uri
    return resume_from
