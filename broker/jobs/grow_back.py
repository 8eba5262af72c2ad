"""A job running below its requested size, and its way back to that size.

Why a record on the job (``Job.shrunk``, broker/jobs/below_size.py): an elastic job can
come to run on fewer nodes than it asked for by three routes (``SizeRoute``): a shrink
in place after a node loss (``Relaunch.SHRINK_IN_PLACE``, broker/jobs/node_recovery.py),
a move that found room for only part of it (a spot notice moving it 2 -> 1 nodes into
another region), or a placement that started it small because only part fitted. The
user asked for more nodes. The way back is the same for every route, happens over
several scheduler passes and survives a broker restart: each pass the recovery policy
looks at the job's pool in its current region
(:meth:`broker.jobs.recovery.RecoveryPolicy.grow`, rules ``GROW_RULES``); capacity must
stay free for a settle time (hysteresis) and resizes are rate-limited; then the job is
stopped checkpoint first like any planned move (Trigger.GROW_BACK), and once stopped it
is admitted at once on its current nodes plus the returned ones (broker/scheduling/
grow_watch.py). The record says all along why the job still runs small and which route
made it so (``brokerctl job``, the console), and is cleared with a "grew back to N
nodes" event once an attempt runs at the requested size.

All functions here are pure transitions (job in, :class:`Outcome` out), applied by
``JobOps`` live and callable by the simulator alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.jobs import below_size, transitions
from broker.jobs.causes import Cause, Family
from broker.jobs.lifecycle import QUEUED, RUNNING
from broker.jobs.outcome import Outcome, WakeScheduler, begin, seal
from broker.jobs.recovery import ROUTE_TEXT, Grow, GrowPlan, Signal, SizeRoute, Trigger, plan_stop

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.jobs.lifecycle import Tx
    from computebroker.v1 import common_pb2 as pb


# The record itself (and a shrink's, node_recovery.py) is broker/jobs/below_size.py's.
shrank = below_size.shrank
is_shrunk = below_size.is_shrunk


def last_change(job: pb.Job) -> float:
    """The shrink or the latest grow back, whichever is newer (the rate limit's start)."""
    return max(job.shrunk.since, job.shrunk.grow_time)


@dataclass(frozen=True)
class Observed:
    """One pass's look at a shrunk running job: the policy's plan, with the capacity
    hysteresis start it was computed with (0 = no capacity for the full size now)."""

    plan: GrowPlan
    capacity_since: float
    full_nodes: tuple[str, ...] = ()  # GROW_BACK: survivors then the returned nodes


def observe(job: pb.Job, inp: Observed, now: float, config: BrokerConfig) -> Outcome | None:
    """Write what the pass saw: STAY updates the reason shown and the hysteresis start
    (no write when neither changed); GROW_BACK stops the attempt checkpoint first
    (Trigger.GROW_BACK through the job's policy, like any planned move) and records the
    full-size placement its relaunch takes."""
    if job.phase != RUNNING or job.stop_reason or not is_shrunk(job):
        return None
    rec = job.shrunk
    if inp.plan.kind is Grow.STAY:
        if (rec.waiting, rec.capacity_since) == (inp.plan.why, inp.capacity_since):
            return None
        tx = begin(job, now)
        tx.job.shrunk.waiting = inp.plan.why
        tx.job.shrunk.capacity_since = inp.capacity_since
        return seal(tx)
    requested = rec.requested_nodes
    route = below_size.route_of(job)
    sig = Signal(Trigger.GROW_BACK, nodes=inp.full_nodes)
    stop = plan_stop(sig, job, config, now)
    if stop is None:
        return None
    out = transitions.request_stop(
        job, transitions.StopRequest(
            plan=stop, actor="scheduler",
            message=f"growing back to {requested} nodes: {inp.plan.why}; checkpoint first,"
                    f" then relaunched on {', '.join(inp.full_nodes)} (ran at"
                    f" {rec.running_nodes} of {requested}: {_how(job)})",
            details={"rule": Trigger.GROW_BACK.value, "blocker": inp.plan.blocker.value,
                     "nodes": ",".join(inp.full_nodes), "requested_nodes": str(requested),
                     "route": route.value}),
        now, config)
    if out is None:
        return None
    j = out.job
    s = j.shrunk
    s.grow_time = now
    s.grow_backs += 1
    s.capacity_since = inp.capacity_since
    s.waiting = f"growing back: {inp.plan.why}"
    del s.grow_nodes[:]
    s.grow_nodes.extend(inp.full_nodes)
    # a lost node that came back is trusted again for this job (the relaunch takes it)
    keep = [n for n in j.excluded_nodes if n not in inp.full_nodes]
    del j.excluded_nodes[:]
    j.excluded_nodes.extend(keep)
    return out


def _how(job: pb.Job) -> str:
    """How the job came to run small, for people (the route's own words)."""
    rec = job.shrunk
    if below_size.route_of(job) is SizeRoute.SHRINK_IN_PLACE:
        return f"shrunk in place after losing {', '.join(rec.lost_nodes) or 'a node'}"
    return rec.why or ROUTE_TEXT[below_size.route_of(job)].format(region=job.placement.region)


def relaunch_due(job: pb.Job) -> bool:
    """A queued job whose current attempt was stopped to grow back: the scheduler admits
    it on ``Shrunk.grow_nodes`` (a stop that failed instead of checkpointing still is the
    move, from the last durable checkpoint). Not after a node loss (the attempt's agent
    blamed nodes: the NODE_LOST relaunch decides) nor after a requeue of another cause."""
    if job.phase not in QUEUED or not is_shrunk(job) or not job.shrunk.grow_nodes:
        return False
    if job.node_recovery.failed_attempt == job.attempt:
        return False
    if job.requeue_cause != Family.MIGRATION.value or not job.migrations:
        return False
    m = job.migrations[-1]
    return m.cause == Cause.GROW_BACK.value and m.from_attempt == job.attempt


def relaunch_missed(job: pb.Job, why: str, now: float, config: BrokerConfig) -> Outcome | None:
    """The full-size nodes were taken (or are unusable) by the time the stopped job was
    queued: forget them; ordinary placement places it (elastic: the full size first)."""
    if job.phase not in QUEUED or not job.shrunk.grow_nodes:
        return None
    tx = begin(job, now)
    del tx.job.shrunk.grow_nodes[:]
    tx.job.shrunk.waiting = f"the grow back's nodes were not free at the relaunch ({why})"
    tx.note("grow_back", reason="nodes_taken", actor="scheduler",
            message=f"grow back: {why}; placed by the scheduler like any queued job instead")
    return seal(tx, WakeScheduler())


def note_grown(tx: Tx, actor: str = "scheduler") -> None:
    """On a transaction: when the job runs at its requested size again, say so and
    forget the shrink (called as the attempt reports RUNNING, broker/jobs/updates.py)."""
    job = tx.job
    if job.phase != RUNNING or not is_shrunk(job):
        return
    size = len(job.placement.nodes)
    rec = job.shrunk
    if size < rec.requested_nodes:
        return
    now = tx.now
    why = "capacity returned" if rec.grow_backs else "placed at full size again"
    tx.note("grew_back", reason="capacity_returned" if rec.grow_backs else "relaunched", actor=actor,
            message=f"grew back to {size} nodes: {why} (ran at {rec.running_nodes} of"
                    f" {rec.requested_nodes} for {now - rec.since:.0f} s: {_how(job)})",
            details={"nodes": ",".join(a.node_id for a in job.placement.nodes),
                     "requested_nodes": str(rec.requested_nodes),
                     "shrunk_s": f"{now - rec.since:.1f}",
                     "route": below_size.route_of(job).value})
    job.ClearField("shrunk")


def grown(job: pb.Job, inp: None, now: float, config: BrokerConfig) -> Outcome | None:
    """The scheduler's fallback of :func:`note_grown` (a record an older broker left):
    a running job at its requested size has its shrink closed (``inp``: nothing)."""
    if job.phase != RUNNING or not is_shrunk(job) or len(job.placement.nodes) < job.shrunk.requested_nodes:
        return None
    tx = begin(job, now)
    note_grown(tx)
    return seal(tx)
