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
* only when the outage outlasts ``store_outage_max_s`` (hours by default) does the job
  fail, saying how long it waited.

The wait ends when an attempt reaches RUNNING (:meth:`broker.jobs.lifecycle.Tx.move`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.jobs.backoff import backoff_delay, seconds

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from computebroker.v1 import common_pb2 as pb


@dataclass(frozen=True)
class WaitDecision:
    give_up: bool  # waited longer than store_outage_max_s
    count: int  # attempts in a row that hit the outage, this one included
    since: float
    until: float  # the region is left out for the job until then


def decide(job: pb.Job, now: float, config: BrokerConfig) -> WaitDecision:
    """What one more attempt ended by a store outage does to ``job``."""
    w = job.store_wait
    since = w.since if w.since else now
    n = w.count + 1
    until = now + backoff_delay(n, config.store_outage_backoff_base_s,
                                config.store_outage_backoff_max_s)
    give_up = bool(config.store_outage_max_s) and now - since > config.store_outage_max_s
    return WaitDecision(give_up=give_up, count=n, since=since, until=until)


def record(job: pb.Job, region: str, message: str, d: WaitDecision) -> None:
    """Write ``d`` into ``job`` (a transaction's private copy)."""
    w = job.store_wait
    w.region = region or w.region
    w.since, w.until, w.count = d.since, d.until, d.count
    w.message = message[:500]


def reset(job: pb.Job) -> None:
    """An attempt runs: the store answered, the outage is over for this job."""
    if job.HasField("store_wait"):
        job.ClearField("store_wait")


def avoided_region(job: pb.Job, now: float) -> str:
    """The region the scheduler must not place ``job`` in now ("" = none)."""
    w = job.store_wait
    return w.region if w.count and w.until > now else ""


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def pending_note(job: pb.Job, now: float) -> str:
    """The pending reason while the job waits for a store ("" = not waiting)."""
    w = job.store_wait
    if not w.count:
        return ""
    where = f"checkpoint store of {w.region}" if w.region else "checkpoint store"
    when = (f"next try after {_clock(w.until)}" if w.until > now else "next try when it answers")
    return (f"{where} unreachable since {_clock(w.since)}; retrying ({when}; {w.count} attempt(s)"
            f" hit the outage, no restart counted): {w.message or 'unreachable'}")


def give_up_message(job: pb.Job, now: float, config: BrokerConfig) -> str:
    w = job.store_wait
    return (f"checkpoint store of {w.region or 'the job'} unreachable since {_clock(w.since)}"
            f" ({seconds(now - w.since)}), longer than store_outage_max_s"
            f" ({seconds(config.store_outage_max_s)}): giving up: {w.message}")
