"""Relaunching jobs that lost nodes: the scheduler pass's step before placement.

Why in the scheduler's pass: whether a lost node can be replaced in place depends on
the capacity *now* (are the survivors still free, does the pool have a ready spare in
the right block), which only the pass's snapshot knows. This module turns the snapshot
into a :class:`broker.jobs.recovery.LostNodes` view for each job waiting for that
decision, asks the job's recovery policy (:meth:`RecoveryPolicy.relaunch`), and applies
the plan through :func:`broker.jobs.node_recovery.decide`. The relaunch is an
admission like any other for the team's quota (:class:`placement.quota_check.QuotaCheck`,
one per pass, charged by each relaunch it lets through). It runs before placement so
that a job replaced in place is launched on its survivors before anything else could
take them, and a job sent to the store path is placed in the same pass.
"""

from __future__ import annotations

import logging

import placement
from broker.jobs import node_recovery
from broker.jobs.lifecycle import QUEUED
from broker.jobs.ops import JobOps
from broker.jobs.recovery import (
    Blocker,
    LostNodes,
    Relaunch,
    RelaunchPlan,
    Signal,
    SpareNode,
    Trigger,
    is_elastic,
    policy_for,
)
from broker.scheduling import warm_spares
from broker.scheduling.spares import block_of
from computebroker.v1 import common_pb2 as pb
from placement.quota_check import QuotaCheck

log = logging.getLogger(__name__)


def job_gpus(job: pb.Job) -> int:
    """The GPUs an in-place relaunch holds: the failed placement's, node for node."""
    return sum(a.gpus for a in job.placement.nodes)


def lost_view(job: pb.Job, snapshot: placement.Snapshot, by_id: dict[str, placement.NodeInfo],
              used: set[str], spares: set[str], quota: QuotaCheck | None = None) -> LostNodes:
    """What the policy needs to know about ``job``'s lost nodes and their pool now.
    ``quota``: the pass's quota check (None: one is built for this job alone)."""
    rec, pl = job.node_recovery, job.placement
    assigned = {a.node_id: a for a in pl.nodes}

    def block(node_id: str) -> str:
        info = by_id.get(node_id)
        if info is not None:
            return block_of(info)
        a = assigned.get(node_id)
        return (a.ultraserver_id or a.network_layer_3) if a is not None else ""

    pool_nodes = [n for n in snapshot.nodes if n.agent_id == pl.agent_id and n.pool == pl.pool]
    gone = tuple(n for n in rec.survivors
                 if n not in by_id or not by_id[n].healthy or n in used
                 or (by_id[n].cordoned and n not in spares))
    excluded = set(job.excluded_nodes) | set(rec.lost_nodes)
    ready = tuple(SpareNode(id=n.id, agent_id=n.agent_id, pool=n.pool, block=block_of(n))
                  for n in sorted(pool_nodes, key=lambda n: n.id)
                  if n.id in spares and n.id not in excluded and n.healthy and n.id not in used)
    return LostNodes(
        lost=tuple(rec.lost_nodes), survivors=tuple(rec.survivors), agent_id=pl.agent_id,
        pool=pl.pool, blocks={n: block(n) for n in rec.lost_nodes},
        pool_has_blocks=any(block_of(n) for n in pool_nodes), survivors_gone=gone,
        spares=ready, memory_every=node_recovery.memory_every(job), elastic=is_elastic(job),
        min_nodes=job.spec.elasticity.min_nodes,
        quota_short=(quota or QuotaCheck(snapshot)).short(
            job.spec.team, job.spec.resources.accelerator, job_gpus(job), pl.region))


def relaunch_lost(ops: JobOps, live: list[pb.Job], snapshot: placement.Snapshot) -> list[pb.Job]:
    """Decide every queued job waiting for its NODE_LOST plan; the jobs rewritten."""
    todo = [j for j in live if node_recovery.undecided(j)]
    if not todo:
        return []
    by_id = {n.id: n for n in snapshot.nodes}
    used = {node for r in snapshot.running for node, _ in r.allocations}
    spares = set(snapshot.spares)
    quota = QuotaCheck(snapshot)
    changed = []
    for job in todo:
        try:
            view = lost_view(job, snapshot, by_id, used, spares, quota)
            plan = policy_for(job, ops.config).relaunch(Signal(Trigger.NODE_LOST, nodes=view.lost), view)
        except Exception:  # noqa: BLE001 - one odd record must not stop every pass
            log.exception("node-loss plan for %s failed: relaunching it from the store", job.id)
            plan = RelaunchPlan(Relaunch.FROM_STORE, Blocker.POLICY,
                                "the in-place plan could not be computed (see the broker's log)")
        admission = None
        if plan.kind.in_place:
            # each spare in its lost node's slot; shrinking: the survivors alone, in order
            swap = dict(plan.swaps)
            pl = job.placement
            lost = set(job.node_recovery.lost_nodes) - set(swap)
            admission = placement.Admission(
                job_id=job.id, agent_id=pl.agent_id, region=pl.region,
                assignments=tuple((swap.get(a.node_id, a.node_id), a.gpus) for a in pl.nodes
                                  if a.node_id not in lost),
                capacity_type=placement.CapacityType(pl.capacity_type or pb.CAPACITY_TYPE_ON_DEMAND),
                pool=pl.pool, price_per_gpu_hour=pl.price_per_gpu_hour,
                explanation=f"in place after a node loss: {plan.why}")
        taken = {node for node, _ in admission.assignments} if admission is not None else set()
        out = ops.relaunch_after_node_loss(
            job.id, plan, admission,
            spare_nodes=warm_spares.of_pool(snapshot, job.placement.agent_id, job.placement.pool,
                                            among=spares - taken))
        if out is None:
            continue
        changed.append(out)
        if admission is not None and out.phase not in QUEUED:
            # what the relaunch holds (a shrink holds only its survivors' GPUs)
            quota.charge(job.spec.team, job.spec.resources.accelerator,
                         sum(g for _, g in admission.assignments), admission.region)
            taken = {node for node, _ in admission.assignments}
            used |= taken
            spares -= taken
    return changed
