"""One usage view: who holds which GPUs, and each team's used / borrowed / lent per
accelerator, from the same snapshot the scheduler decides on.

Why one function: quota is enforced per (team, accelerator) by the scheduler's
ledger (:mod:`placement.quota`); a second derivation (summing guarantees across
accelerators, say) lets ``brokerctl teams`` show borrowing the scheduler does not
see, or miss borrowing it reclaims. So the team numbers here *are*
:func:`placement.team_usage` over the scheduler's snapshot, and the per-node
attribution (GetCapacity's borrowed column) splits each (team, accelerator) line's
borrowing over its most recently started jobs (the first to go on reclaim).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import placement
from broker.agents.registry import AgentState
from broker.jobs.lifecycle import HOLDING, QUEUED, RUNNING
from broker.scheduling import snapshot as snap
from broker.scheduling.preemption_rules import NONE, PreemptionRules
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb


@dataclass
class UsageView:
    teams: dict[str, placement.TeamUsage]
    node_gpus: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    node_jobs: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    node_borrowed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    team_running: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    team_pending: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    region_running: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    spares: frozenset[str] = frozenset()  # nodes reserved as their pool's spares

    def fill(self, q: cpb.TeamQuota) -> cpb.TeamQuota:
        """``q`` with its read-only usage fields filled (GetTeamQuota / ListTeams)."""
        out = cpb.TeamQuota()
        out.CopyFrom(q)
        t = self.teams.get(q.team)
        out.used_gpus = t.used if t else 0
        out.borrowed_gpus = t.borrowed if t else 0
        out.lent_gpus = t.lent if t else 0
        out.pending_jobs = self.team_pending.get(q.team, 0)
        out.running_jobs = self.team_running.get(q.team, 0)
        for r in t.resources if t else ():
            out.usage.add(accelerator=r.accelerator, guaranteed_gpus=r.guaranteed,
                          used_gpus=r.used, borrowed_gpus=r.borrowed, lent_gpus=r.lent,
                          pending_gpus=r.pending)
        return out


def build_snapshot(*, now: float, agents: Iterable[AgentState], jobs: Iterable[pb.Job],
                   teams: Iterable[cpb.TeamQuota], plans: Iterable[cpb.TrainingPlan],
                   regions: Iterable[cpb.RegionInfo], priority_of,  # noqa: ANN001
                   memo: snap.SnapshotMemo | None = None,
                   make_before_break: bool = False,
                   node_memo: snap.NodeMemo | None = None,
                   preemption: PreemptionRules = NONE) -> placement.Snapshot:
    """The scheduler's snapshot (one builder for the scheduler and the usage views)."""
    return snap.build(now=now, agents=agents, jobs=jobs, teams=teams, plans=plans,
                      draining=[r.name for r in regions if r.draining], priority_of=priority_of,
                      memo=memo, make_before_break=make_before_break, node_memo=node_memo,
                      preemption=preemption)


def usage_view(snapshot: placement.Snapshot, jobs: Iterable[pb.Job]) -> UsageView:
    """Usage over ``snapshot``; ``jobs`` are the live jobs it was built from (for job
    counts by phase, which the snapshot does not carry)."""
    view = UsageView(teams=placement.team_usage(snapshot), spares=snapshot.spares)
    holding: list[pb.Job] = []
    for job in jobs:
        if job.phase in QUEUED:
            view.team_pending[job.spec.team] += 1
        elif job.phase in HOLDING:
            holding.append(job)
            view.region_running[job.placement.region] += 1
            if job.phase == RUNNING:
                view.team_running[job.spec.team] += 1
    # Borrowing per (team, accelerator line), newest jobs first to carry it.
    left: dict[tuple[str, str], int] = {}
    for t in view.teams.values():
        for r in t.resources:
            left[(t.team, r.accelerator)] = r.borrowed
    holding.sort(key=lambda j: (j.started_time or j.updated_time, j.id), reverse=True)
    for job in holding:
        acc = job.spec.resources.accelerator
        key = (job.spec.team, acc if (job.spec.team, acc) in left else "")
        for a in job.placement.nodes:
            view.node_gpus[a.node_id] += a.gpus
            view.node_jobs[a.node_id].append(job.id)
            take = min(a.gpus, left.get(key, 0))
            if take:
                view.node_borrowed[a.node_id] += take
                left[key] -= take
    for ids in view.node_jobs.values():
        ids.reverse()  # oldest first, as listed before
    return view
