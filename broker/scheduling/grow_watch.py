"""Growing jobs that run below their requested size back to it: the scheduler pass's side.

Every route that made a job small (a shrink in place, an elastic move, an elastic
placement: ``Job.shrunk.route``) is handled alike here; the policy's decision names it.
Growing back stays in the job's current region: its agent and pool (a gang never spans
agents), so the survivors keep their nodes and the checkpoint stays in the region's
store; moving elsewhere at full size is a move with a transfer, which the proactive
policies weigh (better capacity), not this step.

Why in the scheduler's pass: whether a shrunk job's pool has room for its missing nodes
again (a lost node healthy and free, another job gone, a spare free) is a fact of the
capacity *now*, which only the pass's snapshot knows. Two steps:

* :func:`check` (after placement, so the pass's own admissions are not counted as free):
  for each running shrunk job (``Job.shrunk``) it builds a
  :class:`broker.jobs.recovery.ShrunkView`, asks the job's recovery policy
  (:meth:`RecoveryPolicy.grow`) and writes its answer through
  :func:`broker.jobs.grow_back.observe` (the reason shown, the hysteresis start; or a
  checkpoint-first stop, Trigger.GROW_BACK). A job that runs at the requested size again
  has its record closed with a "grew back" event (:func:`broker.jobs.grow_back.grown`).
* :func:`relaunch_grown` (before placement, like replacements.relaunch_lost): a job
  stopped to grow back is admitted at once on its survivors plus the returned nodes, so
  nothing else takes them first; if they are no longer free, or the team's quota has no
  room for the full size any more, ordinary placement places it (elastic: the full size
  first, else the largest that fits).

Candidates for the missing ranks, best first: the shrink's lost nodes (back and healthy),
then other free nodes, then the pool's ready spares; all on the job's agent and pool, in
the survivors' block when the pool has blocks, whole nodes with the job's GPUs per node
free, never a node the job avoids for another failure.
"""

from __future__ import annotations

import logging

import placement
from broker.jobs import below_size, grow_back
from broker.jobs.grow_back import Observed
from broker.jobs.lifecycle import QUEUED, RUNNING
from broker.jobs.ops import JobOps
from broker.jobs.recovery import Grow, ShrunkView, is_elastic, policy_for
from broker.scheduling import warm_spares
from broker.scheduling.spares import block_of
from computebroker.v1 import common_pb2 as pb
from placement.quota_check import QuotaCheck

log = logging.getLogger(__name__)


def gpus_per_node(job: pb.Job) -> int:
    """The GPUs each of the job's nodes holds (its survivors', else its spec's)."""
    return max((a.gpus for a in job.placement.nodes), default=0) or job.spec.resources.gpus_per_node


def used_nodes(snapshot: placement.Snapshot, dec: placement.Decisions | None) -> dict[str, int]:
    """GPUs in use per node: running attempts plus this pass's admissions."""
    used: dict[str, int] = {}
    for r in snapshot.running:
        for n, g in r.allocations:
            used[n] = used.get(n, 0) + g
    for a in (dec.admissions if dec is not None else ()):
        for n, g in a.assignments:
            used[n] = used.get(n, 0) + g
    return used


def candidates(job: pb.Job, snapshot: placement.Snapshot, used: dict[str, int]) -> tuple[str, ...]:
    """Nodes that could take the job's missing ranks now, best first (module doc)."""
    pl = job.placement
    own = {a.node_id for a in pl.nodes}
    by_id = {n.id: n for n in snapshot.nodes}
    pool = [n for n in snapshot.nodes if n.agent_id == pl.agent_id and n.pool == pl.pool]
    blocks = {block_of(by_id[n]) for n in own if n in by_id} - {""}
    lost = list(job.shrunk.lost_nodes)
    avoid = set(job.excluded_nodes) - set(lost)
    need = gpus_per_node(job)

    def usable(n: placement.NodeInfo) -> bool:
        if n.id in own or n.id in avoid or not n.healthy or n.region in snapshot.draining_regions:
            return False
        if n.cordoned and n.id not in snapshot.spares:
            return False
        if blocks and block_of(n) not in blocks:
            return False
        return used.get(n.id, 0) == 0 and n.gpus >= need

    free = [n for n in pool if usable(n)]
    order = {n: i for i, n in enumerate(lost)}
    free.sort(key=lambda n: (n.id not in order, n.id in snapshot.spares, order.get(n.id, 0), n.id))
    return tuple(n.id for n in free)


def view_of(job: pb.Job, snapshot: placement.Snapshot, used: dict[str, int], settle_s: float,
            min_interval_s: float, quota: QuotaCheck | None = None) -> ShrunkView:
    """What the policy needs to know about a shrunk job and its pool now."""
    rec, pl = job.shrunk, job.placement
    running = len(pl.nodes)
    free = candidates(job, snapshot, used)
    enough = len(free) >= rec.requested_nodes - running
    since = (rec.capacity_since or snapshot.now) if enough else 0.0
    extra = (rec.requested_nodes - running) * gpus_per_node(job)
    short = ""
    if enough:
        short = (quota or QuotaCheck(snapshot)).short(job.spec.team, job.spec.resources.accelerator,
                                                      extra, pl.region)
    return ShrunkView(requested=rec.requested_nodes, running=running, pool=pl.pool, free=free,
                      now=snapshot.now, capacity_since=since, last_change=grow_back.last_change(job),
                      settle_s=settle_s, min_interval_s=min_interval_s, quota_short=short,
                      elastic=is_elastic(job), route=below_size.route_of(job),
                      region=pl.region)


def check(ops: JobOps, live: list[pb.Job], snapshot: placement.Snapshot,
          dec: placement.Decisions | None = None) -> list[pb.Job]:
    """Look at every running shrunk job once; returns the jobs rewritten."""
    shrunk = [j for j in live if grow_back.is_shrunk(j) and j.phase == RUNNING and not j.stop_reason]
    if not shrunk:
        return []
    cfg = ops.config
    used = used_nodes(snapshot, dec)
    quota = QuotaCheck(snapshot)
    changed = []
    for job in shrunk:
        try:
            if len(job.placement.nodes) >= job.shrunk.requested_nodes:
                out = ops.apply_grow(job.id, grow_back.grown, None)
            else:
                view = view_of(job, snapshot, used, cfg.grow_back_settle_s,
                               cfg.grow_back_min_interval_s, quota)
                plan = policy_for(job, cfg).grow(view)
                full = ()
                if plan.kind is Grow.GROW_BACK:
                    full = (*(a.node_id for a in job.placement.nodes), *plan.nodes)
                    for n in plan.nodes:  # not offered to another shrunk job this pass
                        used[n] = used.get(n, 0) + gpus_per_node(job)
                    # nor the quota room: two jobs of a team cannot both grow into it
                    quota.charge(job.spec.team, job.spec.resources.accelerator,
                                 len(plan.nodes) * gpus_per_node(job), job.placement.region)
                out = ops.apply_grow(job.id, grow_back.observe,
                                     Observed(plan=plan, capacity_since=view.capacity_since,
                                              full_nodes=full))
                if out is not None and plan.kind is Grow.GROW_BACK:
                    log.info("job %s: growing back to %d nodes (%s)", job.id,
                             job.shrunk.requested_nodes, plan.why)
        except Exception:  # noqa: BLE001 - one odd record must not stop every pass
            log.exception("grow-back check of %s failed", job.id)
            continue
        if out is not None:
            changed.append(out)
    return changed


def relaunch_grown(ops: JobOps, live: list[pb.Job], snapshot: placement.Snapshot) -> list[pb.Job]:
    """Admit each job stopped to grow back on its recorded full-size nodes, at once."""
    todo = [j for j in live if grow_back.relaunch_due(j)]
    if not todo:
        return []
    by_id = {n.id: n for n in snapshot.nodes}
    used = used_nodes(snapshot, None)
    quota = QuotaCheck(snapshot)
    changed = []
    for job in todo:
        pl = job.placement
        nodes = tuple(job.shrunk.grow_nodes)
        g = gpus_per_node(job)
        gone = [n for n in nodes if n not in by_id or not by_id[n].healthy or used.get(n, 0)
                or by_id[n].agent_id != pl.agent_id or n in job.excluded_nodes
                or (by_id[n].cordoned and n not in snapshot.spares)]
        why = f"{', '.join(gone)} no longer free" if gone else quota.short(
            job.spec.team, job.spec.resources.accelerator, g * len(nodes), pl.region)
        if why:
            out = ops.apply_grow(job.id, grow_back.relaunch_missed, why)
        else:
            admission = placement.Admission(
                job_id=job.id, agent_id=pl.agent_id, region=pl.region,
                assignments=tuple((n, g) for n in nodes),
                capacity_type=placement.CapacityType(pl.capacity_type or pb.CAPACITY_TYPE_ON_DEMAND),
                pool=pl.pool, price_per_gpu_hour=pl.price_per_gpu_hour,
                explanation=f"growing back to {len(nodes)} nodes: {job.shrunk.waiting}")
            out = ops.launch(job.id, admission, explanation=admission.explanation,
                             spare_nodes=warm_spares.of_pool(
                                 snapshot, pl.agent_id, pl.pool,
                                 among=set(snapshot.spares) - set(nodes)))
            if out is not None and out.phase not in QUEUED:
                quota.charge(job.spec.team, job.spec.resources.accelerator, g * len(nodes), pl.region)
                for n in nodes:
                    used[n] = g
        if out is not None:
            changed.append(out)
    return changed
