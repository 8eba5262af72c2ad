"""Training plans view model: a Gantt of plan windows per region, with the jobs on them.

A job is "on" a plan when its placement's capacity type is TRAINING_PLAN and its pool is
the plan id (an agent's training-plan pool is named after the plan). It is *reserved*
when it belongs to the plan's team (or the plan is shared), *backfilled* otherwise: idle
prepaid capacity another team borrows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from brokersdk.enums import phase_name, plan_state_name
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb


@dataclass
class PlanJob:
    id: str
    name: str
    team: str
    gpus: int
    phase: str
    use: str  # "reserved" | "backfill"


@dataclass
class PlanRow:
    plan: cpb.TrainingPlan
    state: str
    left: float
    width: float
    jobs: list[PlanJob] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.plan.instance_count * self.plan.gpus_per_instance


@dataclass
class RegionGantt:
    region: str
    rows: list[PlanRow] = field(default_factory=list)


@dataclass
class Gantt:
    t0: float
    t1: float
    now_pct: float
    regions: list[RegionGantt]


def build_gantt(plans: Iterable[cpb.TrainingPlan], jobs: Iterable[pb.Job],
                now: float | None = None) -> Gantt:
    now = time.time() if now is None else now
    plans = list(plans)
    t0 = min([p.start_time for p in plans] + [now])
    t1 = max([p.end_time for p in plans] + [now + 3600])
    span = max(t1 - t0, 1.0)
    by_plan: dict[str, list[PlanJob]] = {}
    owners = {p.id: p.team for p in plans}
    for j in jobs:
        if j.placement.capacity_type != pb.CAPACITY_TYPE_TRAINING_PLAN or not j.placement.pool:
            continue
        owner = owners.get(j.placement.pool)
        use = "reserved" if not owner or owner == j.spec.team else "backfill"
        gpus = sum(a.gpus for a in j.placement.nodes)
        by_plan.setdefault(j.placement.pool, []).append(
            PlanJob(j.id, j.spec.name, j.spec.team, gpus, phase_name(j.phase), use))
    regions: dict[str, RegionGantt] = {}
    for p in sorted(plans, key=lambda p: (p.region, p.start_time, p.id)):
        left = 100 * (p.start_time - t0) / span
        row = PlanRow(p, plan_state_name(p.state), left,
                      max(0.5, 100 * (p.end_time - p.start_time) / span), by_plan.get(p.id, []))
        regions.setdefault(p.region, RegionGantt(p.region)).rows.append(row)
    return Gantt(t0, t1, 100 * (now - t0) / span, [regions[k] for k in sorted(regions)])
