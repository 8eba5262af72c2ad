"""Queue view model: per team, its quota use and its pending jobs in queue order.

Why here and not in the template: the order and the per-accelerator sums are decisions;
they are computed once from the API's answers (ListTeams, ListJobs) and tested as data.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from brokersdk.enums import phase_name, strategy_name
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

PENDING_PHASES = (pb.JOB_PHASE_PENDING, pb.JOB_PHASE_SUSPENDED)
ACTIVE_PHASES = (pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING,
                 pb.JOB_PHASE_CHECKPOINTING, pb.JOB_PHASE_MIGRATING)


@dataclass
class QuotaLine:
    """One quota line as the scheduler accounts it (TeamQuota.usage)."""

    accelerator: str  # "any" for the accelerator-agnostic line
    guaranteed: int
    used: int
    borrowed: int
    lent: int
    pending: int
    borrow_limit: str
    lend_limit: str


@dataclass
class JobLine:
    id: str
    name: str
    phase: str
    gpus: int
    priority: str
    reason: str
    created: float
    region: str = ""


@dataclass
class TeamQueue:
    team: str
    cohort: str
    strategy: str
    used: int
    borrowed: int
    lent: int
    quotas: list[QuotaLine] = field(default_factory=list)
    pending: list[JobLine] = field(default_factory=list)
    active: list[JobLine] = field(default_factory=list)


def _gpus(job: pb.Job) -> int:
    return job.spec.resources.nodes * job.spec.resources.gpus_per_node


def _line(job: pb.Job) -> JobLine:
    return JobLine(job.id, job.spec.name, phase_name(job.phase), _gpus(job),
                   job.spec.priority_class, job.pending_reason or job.message,
                   job.created_time, job.placement.region)


def build_queues(teams: Iterable[cpb.TeamQuota], jobs: Iterable[pb.Job]) -> list[TeamQueue]:
    """Teams (sorted) with their quota lines, pending jobs oldest first (the scheduler's
    order within a priority class) and running jobs."""
    out: dict[str, TeamQueue] = {}
    for t in teams:
        q = out[t.team] = TeamQueue(t.team, t.cohort, strategy_name(t.strategy) or
                                    "lend-and-borrow", t.used_gpus, t.borrowed_gpus, t.lent_gpus)
        limits = {e.accelerator: e for e in t.quotas}
        for u in t.usage:
            e = limits.get(u.accelerator)
            q.quotas.append(QuotaLine(
                u.accelerator or "any", u.guaranteed_gpus, u.used_gpus, u.borrowed_gpus,
                u.lent_gpus, u.pending_gpus,
                str(e.borrow_limit_gpus) if e and e.HasField("borrow_limit_gpus") else "no limit",
                str(e.lend_limit_gpus) if e and e.HasField("lend_limit_gpus") else "no limit"))
    for job in jobs:
        q = out.get(job.spec.team)
        if q is None:
            q = out[job.spec.team] = TeamQueue(job.spec.team, "", "", 0, 0, 0)
        if job.phase in PENDING_PHASES:
            q.pending.append(_line(job))
        elif job.phase in ACTIVE_PHASES:
            q.active.append(_line(job))
    for q in out.values():
        q.pending.sort(key=lambda j: (j.created, j.id))
        q.active.sort(key=lambda j: (j.created, j.id))
    return [out[k] for k in sorted(out)]
