"""The one record of a job running below its requested size (``Job.shrunk``).

Why one record for every route: a job can come to run on fewer nodes than it asked for
three ways (:class:`broker.jobs.recovery.SizeRoute`): a shrink in place after a node
loss, a move that found room for only part of it elsewhere (a spot notice moving 2 nodes
onto the one node another region has), or a placement that started it small because only
part fitted. What follows is the same for all three (broker/jobs/grow_back.py: the
settle time, the rate limit, the quota, the policy), so the requested and the running
size, since when and why are kept once, here, with the route that made it small.

Written inside transactions (on the transaction's copy of the job): the admission
(:func:`admitted`, called by :func:`broker.jobs.transitions.admit`) and the shrink
(:func:`shrank`, broker/jobs/node_recovery.py). Cleared by grow_back.note_grown once an
attempt runs at the requested size again. No imports of the transitions: they call this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.jobs.lifecycle import MIGRATING
from broker.jobs.recovery import SizeRoute, is_elastic

if TYPE_CHECKING:
    from computebroker.v1 import common_pb2 as pb


def is_shrunk(job: pb.Job) -> bool:
    """The job has a record of running below its size to grow back from."""
    return job.HasField("shrunk") and job.shrunk.requested_nodes > 0


def route_of(job: pb.Job) -> SizeRoute:
    """Which route made the job small (a record without one was a shrink in place)."""
    return SizeRoute.of(job.shrunk.route)


def _start(job: pb.Job, route: SizeRoute, running: int, requested: int, why: str,
           now: float) -> pb.Shrunk:
    rec = job.shrunk
    if not rec.requested_nodes:
        rec.requested_nodes = requested
    rec.route = route.value
    rec.running_nodes = running
    rec.since = now
    rec.why = why
    rec.capacity_since = 0.0
    rec.waiting = "waiting for capacity"
    del rec.grow_nodes[:]
    return rec


def shrank(job: pb.Job, survivors: tuple[str, ...], lost: tuple[str, ...], why: str,
           now: float) -> None:
    """Record that ``job`` now runs on ``survivors`` alone after losing ``lost``. A
    second shrink keeps the requested size and adds its lost nodes."""
    rec = _start(job, SizeRoute.SHRINK_IN_PLACE, len(survivors),
                 job.spec.resources.nodes or (len(survivors) + len(lost)), why, now)
    rec.lost_nodes.extend(n for n in lost if n not in rec.lost_nodes)


def admitted(job: pb.Job, was_phase: int, now: float) -> None:
    """An admission (``job`` already carries its new placement; ``was_phase`` the phase it
    was admitted from): an elastic job placed on fewer nodes than it asked for gets its
    record, route ELASTIC_MOVE when a move queued it (MIGRATING), else ELASTIC_PLACEMENT.
    A job that already has one (placed small again after a failed grow back or another
    relaunch) keeps its route and its start, so the rate limit is not reset by it; its
    running size follows the placement. At full size nothing is written here: the first
    running report closes the record (grow_back.note_grown)."""
    requested = job.spec.resources.nodes
    running = len(job.placement.nodes)
    if running >= requested or not is_elastic(job):
        return
    if is_shrunk(job):
        job.shrunk.running_nodes = running
        return
    region = job.placement.region
    if was_phase == MIGRATING:
        cause = job.migrations[-1].cause if job.migrations else "move"
        route = SizeRoute.ELASTIC_MOVE
        why = (f"a move ({cause.replace('_', ' ')}) found room for {running} of {requested}"
               f" nodes in {region}")
    else:
        route = SizeRoute.ELASTIC_PLACEMENT
        why = f"placement found room for {running} of {requested} nodes in {region}"
    _start(job, route, running, requested, why, now)
