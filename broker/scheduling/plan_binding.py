"""Which agent nodes are a training plan's capacity: the one place that decides it.

Why: a plan registered with ``brokerctl plans create`` is a window of prepaid
capacity, but the instances are nodes an agent reports. Before this module a node
counted as a plan's only when its pool was the plan's generated id, which an operator
could not know in advance, so an active plan usually added no usable capacity.

The mapping (docs/contracts.md "Training plans and agent pools"), in order:

1. ``id``: a node whose pool (inventory ``training_plan: X`` or ``pool: X``, label
   ``computebroker.io/training-plan``) equals the plan's id;
2. ``name``: ... equals the plan's name (plan names are what operators choose);
3. ``adopt``: a node reported as capacity type ``training_plan`` whose pool names no
   plan (an unlabelled plan node group) joins a plan of the same region whose zone,
   instance type and accelerator match (empty = any), up to the plan's
   ``instance_count`` nodes, plans by start time then id, nodes by id. Cancelled and
   expired plans adopt nothing, so their nodes are free for the next plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb


class BindRule(Enum):
    """How a node was matched to its plan (shown by ``capacity --nodes`` in the pool)."""

    ID = "id"
    NAME = "name"
    ADOPT = "adopt"


def _matches(plan: cpb.TrainingPlan, node: pb.Node, region: str) -> bool:
    return (plan.region == region
            and (not plan.zone or plan.zone == node.zone)
            and (not plan.instance_type or plan.instance_type == node.instance_type)
            and (not plan.accelerator or plan.accelerator.lower() == node.accelerator.lower()))


def bind(nodes: Iterable[tuple[str, pb.Node]], plans: Iterable[cpb.TrainingPlan],
         now: float) -> dict[str, tuple[cpb.TrainingPlan, BindRule]]:
    """``node id -> (plan, rule)`` for every node that is some plan's capacity.
    ``nodes`` are ``(region, node)`` pairs from every agent."""
    from broker.scheduling.snapshot import plan_state  # snapshot imports this module

    plans = sorted(plans, key=lambda p: (p.start_time, p.id))
    by_id = {p.id: p for p in plans}
    by_name: dict[tuple[str, str], cpb.TrainingPlan] = {}
    for p in plans:  # the newest live plan of a name wins (names may be reused later)
        if p.name and plan_state(p, now) not in (cpb.PLAN_STATE_CANCELLED, cpb.PLAN_STATE_EXPIRED):
            by_name[(p.region, p.name)] = p
    out: dict[str, tuple[cpb.TrainingPlan, BindRule]] = {}
    orphans: list[tuple[str, pb.Node]] = []
    for region, n in sorted(nodes, key=lambda rn: rn[1].id):
        if n.pool and n.pool in by_id:
            out[n.id] = (by_id[n.pool], BindRule.ID)
        elif n.pool and (region, n.pool) in by_name:
            out[n.id] = (by_name[(region, n.pool)], BindRule.NAME)
        elif n.capacity_type == pb.CAPACITY_TYPE_TRAINING_PLAN:
            orphans.append((region, n))
    used: dict[str, int] = {}
    for plan, _ in out.values():
        used[plan.id] = used.get(plan.id, 0) + 1
    live = [p for p in plans
            if plan_state(p, now) in (cpb.PLAN_STATE_SCHEDULED, cpb.PLAN_STATE_ACTIVE)]
    for region, n in orphans:
        for p in live:
            if used.get(p.id, 0) < max(0, p.instance_count) and _matches(p, n, region):
                out[n.id] = (p, BindRule.ADOPT)
                used[p.id] = used.get(p.id, 0) + 1
                break
    return out


def bind_agents(agents: Iterable, plans: Iterable[cpb.TrainingPlan],
                now: float) -> dict[str, tuple[cpb.TrainingPlan, BindRule]]:
    """:func:`bind` over every node of the given agents (``AgentState``)."""
    return bind(((n.region or a.region, n) for a in agents for n in a.record.nodes), plans, now)
