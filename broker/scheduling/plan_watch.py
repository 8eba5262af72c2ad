"""Planned moves ahead of a training plan's end.

Why a separate step from ``placement.schedule``: the pure placement pass decides
where queued work goes; *when* a running job must leave capacity that is about to
disappear is a deadline rule that depends on the job's own history (how long its
checkpoints and transfers took), which only the broker has. SageMaker HyperPod and
Kueue both treat a capacity end as a reason to evict gracefully before it, not at it.

Rule: a RUNNING job holding nodes of plan P gets the recovery trigger PLAN_ENDING
(by default: Stop{MIGRATE, checkpoint_first}, cause ``plan_ending``) once
``now >= P.end - lead``, where ``lead = max(plan_move_floor_s, plan_move_margin x
(last checkpoint time + last checkpoint bytes / last transfer MB/s))``
(:func:`broker.jobs.migration.estimate_move_s`). The grace given to the trainer is the
time left until the plan ends, so this is a planned checkpoint, not an emergency
one. The plan's nodes are added to the job's ``excluded_nodes`` so the scheduler
does not place it straight back on capacity that is about to end (the placement
window check alone would allow that for a job with a short safe point).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from broker.agents.registry import AgentRegistry
from broker.jobs import migration
from broker.jobs.lifecycle import RUNNING
from broker.jobs.ops import JobOps
from broker.jobs.recovery import Signal, Trigger
from broker.scheduling import plan_binding
from broker.scheduling.snapshot import plan_state
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

log = logging.getLogger(__name__)


def plan_of_job(agents: AgentRegistry, job: pb.Job,
                plans: dict[str, cpb.TrainingPlan],
                bound: dict[str, tuple[cpb.TrainingPlan, object]] | None = None) -> cpb.TrainingPlan | None:
    """The plan (earliest ending) whose nodes the job's current placement uses, if any
    (``bound``: plan_binding.bind's node -> plan; default: computed now)."""
    if bound is None:
        import time

        bound = plan_binding.bind_agents(agents.all(), plans.values(), time.time())
    found = [bound[a.node_id][0] for a in job.placement.nodes if a.node_id in bound]
    return min(found, key=lambda p: p.end_time) if found else None


def check(ops: JobOps, live: Iterable[pb.Job], plans: Iterable[cpb.TrainingPlan],
          now: float) -> list[pb.Job]:
    """Trigger PLAN_ENDING for every job whose plan ends within its move lead time;
    returns the jobs as written (the scheduler pass goes on with them)."""
    plan_map = {p.id: p for p in plans}
    if not plan_map:
        return []
    cfg, agents = ops.config, ops.agents
    bound = plan_binding.bind_agents(agents.all(), plan_map.values(), now)
    moved: list[pb.Job] = []
    for job in live:
        if job.phase != RUNNING or job.stop_reason:
            continue
        plan = plan_of_job(agents, job, plan_map, bound)
        if plan is None or plan_state(plan, now) == cpb.PLAN_STATE_SCHEDULED:
            continue
        end = plan.start_time if plan.state == cpb.PLAN_STATE_CANCELLED else plan.end_time
        lead = migration.estimate_move_s(job, floor_s=cfg.plan_move_floor_s, margin=cfg.plan_move_margin)
        if now < end - lead:
            continue
        left = end - now
        plan_nodes = tuple(a.node_id for a in job.placement.nodes
                           if a.node_id in bound and bound[a.node_id][0].id == plan.id)
        stored = ops.trigger(
            job.id, Signal(Trigger.PLAN_ENDING, nodes=plan_nodes, seconds_left=left), actor="broker",
            message=f"training plan {plan.id} ends in {max(0.0, left):.0f}s (move lead {lead:.0f}s):"
                    " checkpointing and moving to other capacity",
            details={"plan": plan.id, "plan_end": f"{end:.0f}", "lead_s": f"{lead:.1f}",
                     "seconds_left": f"{left:.1f}", "emergency": "false"},
        )
        if stored is not None:
            log.info("job %s: plan %s ends in %.0fs (lead %.0fs): planned move", job.id, plan.id, left, lead)
            moved.append(stored)
    return moved
