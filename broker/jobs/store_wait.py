"""A checkpoint store outage is weather: the job waits it out, it does not fail.

Why: an attempt that cannot reach its checkpoint store (refused, reset, DNS, 5xx,
throttling: checkpoint_layout/faults.py) exits ``EXIT_STORE_UNAVAILABLE``. Treated as a
failure, three relaunches in one second used up ``max_restarts`` and the job FAILED
although nothing was wrong with it. Now the decision is these pure functions:

* no restart is spent; the job goes back to PENDING and its region is left out *for this
  job* for ``base x 2^(n-1)`` seconds (``n`` = attempts in a row that hit the outage,
  capped at ``store_outage_backoff_max_s``); meanwhile the region's agent re-probes its
  store and, while that fails, the region gets no placements at all
  (broker/scheduling/snapshot.py);
* the job's pending reason says so, with absolute times (stable between passes):
  "checkpoint store of us-east-2 unreachable since 12:03:10 UTC; retrying ...";
* a job with a durable checkpoint stays with the region holding it (placed elsewhere it
  would have to copy from the store that is down); once the outage outlasts
  ``store_outage_move_after_s`` it may resume in another region from a durable checkpoint
  it made there earlier (``Job.region_checkpoints``): a move whose event says why
  (:func:`move_source`, applied by :func:`broker.jobs.transitions.admit`);
* only when the outage outlasts ``store_outage_max_s`` (hours by default) does the job
  fail, saying how long it waited.

The wait ends when an attempt reaches RUNNING (:meth:`broker.jobs.lifecycle.Tx.move`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.jobs.backoff import backoff_delay, seconds
from computebroker.v1 import common_pb2

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from computebroker.v1 import agent_pb2 as apb
    from computebroker.v1 import common_pb2 as pb


@dataclass(frozen=True)
class WaitDecision:
    give_up: bool  # waited longer than store_outage_max_s
    count: int  # attempts in a row that hit the outage, this one included
    since: float
    until: float  # the region is left out for the job until then
    move_time: float  # from then on it may resume elsewhere (0 = never)
    at: float  # when this attempt's outage was reported


def decide(job: pb.Job, now: float, config: BrokerConfig) -> WaitDecision:
    """What one more attempt ended by a store outage does to ``job``."""
    w = job.store_wait
    # the outage began when the ranks first found the store down, if they waited in
    # the attempt (ranks_since) before it ended
    since = w.since or w.ranks_since or now
    n = w.count + 1
    until = now + backoff_delay(n, config.store_outage_backoff_base_s,
                                config.store_outage_backoff_max_s)
    give_up = bool(config.store_outage_max_s) and now - since > config.store_outage_max_s
    move = since + config.store_outage_move_after_s if config.store_outage_move_after_s else 0.0
    return WaitDecision(give_up=give_up, count=n, since=since, until=until, move_time=move, at=now)


def record(job: pb.Job, region: str, message: str, d: WaitDecision) -> None:
    """Write ``d`` into ``job`` (a transaction's private copy)."""
    w = job.store_wait
    # The outage is the store holding the job's checkpoint: a job that has one stays
    # with that region (placements), so the first region named stays the one waited for.
    w.region = w.region if w.count and w.region else region
    w.since, w.until, w.count, w.move_time, w.last_time = d.since, d.until, d.count, d.move_time, d.at
    w.message = message[:500]
    w.ranks_since, w.ranks_message = 0.0, ""  # the attempt ended: its ranks wait no longer


def remember_checkpoint(job: pb.Job, region: str, step: int, uri: str) -> None:
    """The job's newest durable checkpoint in ``region`` (one entry per region)."""
    if not region or not uri:
        return
    for rc in job.region_checkpoints:
        if rc.region == region:
            if step >= rc.step:
                rc.step, rc.uri = step, uri
            return
    job.region_checkpoints.add(region=region, step=step, uri=uri)


def reset(job: pb.Job) -> None:
    """An attempt runs: the store answered, the outage is over for this job."""
    if job.HasField("store_wait"):
        job.ClearField("store_wait")


def avoided_region(job: pb.Job, now: float, store_ok_since: float = 0.0) -> str:
    """The region the scheduler must not place ``job`` in now ("" = none): during the
    backoff, unless the region's store probe turned healthy after the job's last failed
    attempt (``store_ok_since``, Register.checkpoint_store_ok_since): then the outage is
    over and waiting longer only delays recovery."""
    w = job.store_wait
    if not w.count or w.until <= now or (store_ok_since and store_ok_since > w.last_time):
        return ""
    return w.region


def allowed_regions(job: pb.Job, now: float) -> frozenset[str] | None:
    """Regions the job may be placed in while it waits (None = any but the avoided one).

    A job with a durable checkpoint stays with the region waited for (its checkpoint is
    in that store); past ``move_time`` also regions where it made a durable checkpoint."""
    w = job.store_wait
    if not w.count or not job.progress.last_checkpoint_uri or not w.region:
        return None
    regions = {w.region}
    if w.move_time and now >= w.move_time:
        regions.update(rc.region for rc in job.region_checkpoints if rc.region != w.region)
    return frozenset(regions)


def move_source(job: pb.Job, region: str, now: float) -> pb.RegionCheckpoint | None:
    """The checkpoint to resume from when a waiting job is placed in ``region``, another
    region than the one whose store is down, past its move time; else None."""
    w = job.store_wait
    if not w.count or region == w.region or not w.move_time or now < w.move_time:
        return None
    return next((rc for rc in job.region_checkpoints if rc.region == region), None)


STORE_WAIT_ENV = "CB_STORE_WAIT_S"


def attempt_wait_s(job: pb.Job, now: float, config: BrokerConfig) -> float:
    """How long a launched attempt's ranks may wait for a store that is down while they
    resume (the trainer's ``CB_STORE_WAIT_S``): ``store_outage_attempt_wait_s``, but no
    longer than what is left of the job's ``store_outage_max_s`` budget, so waiting in
    the attempt never outlasts the wait the broker would allow."""
    wait = config.store_outage_attempt_wait_s
    if config.store_outage_max_s:
        waited = now - job.store_wait.since if job.store_wait.count and job.store_wait.since else 0.0
        wait = min(wait, max(0.0, config.store_outage_max_s - waited))
    return wait


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def pending_note(job: pb.Job, now: float, store_ok_since: float = 0.0) -> str:
    """The pending reason while the job waits for a store ("" = not waiting).

    ``store_ok_since`` is when the region's store probe last turned healthy
    (Register.checkpoint_store_ok_since, 0 = unknown). Once that is after the job's last
    failed attempt the outage is over: the note says the store answers again, so what
    follows it (the placement's own reason, e.g. no free capacity in the region that
    holds the checkpoint) reads as the cause of the wait, not a store that is back."""
    w = job.store_wait
    if not w.count:
        return ""
    where = f"checkpoint store of {w.region}" if w.region else "checkpoint store"
    if store_ok_since and store_ok_since > w.last_time:
        return (f"{where} answers again since {clock(store_ok_since)} (unreachable from"
                f" {clock(w.since)}; {w.count} attempt(s) hit the outage, no restart counted);"
                " placing again")
    when = (f"next try after {clock(w.until)}" if w.until > now else "next try when it answers")
    return (f"{where} unreachable since {clock(w.since)}; retrying ({when}; {w.count} attempt(s)"
            f" hit the outage, no restart counted): {w.message or 'unreachable'}")


def ranks_waiting(job: pb.Job, wait: apb.RanksStoreWait | None, now: float) -> bool:
    """Apply an attempt's report of its ranks' own wait for the store (``wait``, from
    JobUpdate.store_wait; None = they do not wait); True if what the job shows changed.

    Why: ranks that wait for their store while they start or resume used to show as
    LAUNCHING with no reason, and ranks that hold a save as nothing at all. While they
    wait the job's pending reason says so, with the step it resumes from (the step shown
    stays there: broker/jobs/shown_progress.py); the reason goes when the report does."""
    w = job.store_wait
    if wait is not None:
        since = wait.since or now
        if w.ranks_since == since and w.ranks_message == wait.message[:500]:
            return False
        w.ranks_since, w.ranks_message = since, wait.message[:500]
        job.pending_reason = ranks_note(job)
        return True
    if not w.ranks_since:
        return False
    w.ranks_since, w.ranks_message = 0.0, ""
    if not w.count:
        job.ClearField("store_wait")
    job.pending_reason = ""
    return True


def ranks_note(job: pb.Job) -> str:
    """The pending reason while the current attempt's ranks wait for their store."""
    w = job.store_wait
    region = job.placement.region
    where = f"checkpoint store of {region}" if region else "checkpoint store"
    durable = job.progress.last_checkpoint_step if job.progress.last_checkpoint_uri else 0
    if job.phase == common_pb2.JOB_PHASE_RUNNING:
        doing = (f"the ranks wait for it to save, in the attempt (newest durable checkpoint:"
                 f" step {durable})")
    elif durable:
        doing = f"the ranks wait for it to resume from step {durable}"
    else:
        doing = "the ranks wait for it to start"
    since = w.since if w.count and w.since else w.ranks_since  # attempts it ended came first
    return (f"{where} unreachable since {clock(since)}; {doing}, no restart counted:"
            f" {w.ranks_message or 'unreachable'}")


def give_up_message(job: pb.Job, now: float, config: BrokerConfig) -> str:
    w = job.store_wait
    return (f"checkpoint store of {w.region or 'the job'} unreachable since {clock(w.since)}"
            f" ({seconds(now - w.since)}), longer than store_outage_max_s"
            f" ({seconds(config.store_outage_max_s)}): giving up: {w.message}")
