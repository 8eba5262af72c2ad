"""CapacityService: what operators call (regions, capacity, plans, teams, drain, cordon).

Usage numbers are computed from the store (jobs holding GPUs) and the agents'
registered inventories on each call: nothing to keep in sync, and the same answer
after a broker restart.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import grpc

from broker.api import validation
from broker.api.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, rpc
from broker.ids import new_plan_id
from broker.jobs.core import BrokerCore
from broker.jobs.lifecycle import HOLDING, QUEUED, RUNNING
from broker.scheduling.snapshot import plan_state
from broker.store.base import KIND_PLAN, KIND_REGION, KIND_TEAM
from broker.store.jobs_query import iter_jobs
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import capacity_pb2_grpc
from computebroker.v1 import common_pb2 as pb


@dataclass
class Usage:
    """Who holds which GPUs right now."""

    node_gpus: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    node_jobs: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    node_borrowed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    team_used: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    team_borrowed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    team_running: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    team_pending: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    region_running: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def guaranteed_of(q: cpb.TeamQuota | None) -> int:
    return sum(e.guaranteed_gpus for e in q.quotas) if q else 0


def compute_usage(core: BrokerCore, teams: dict[str, cpb.TeamQuota]) -> Usage:
    """GPU use per node and team; a team's GPUs beyond its guarantee are *borrowed*
    (attributed to its most recently started jobs: the first to go on reclaim)."""
    u = Usage()
    holding: list[pb.Job] = []
    for job in iter_jobs(core.store, phases=[*HOLDING, *QUEUED]):
        if job.phase in QUEUED:
            u.team_pending[job.spec.team] += 1
            continue
        holding.append(job)
    holding.sort(key=lambda j: (j.started_time or j.updated_time, j.id))
    for job in holding:
        team = job.spec.team
        if job.phase == RUNNING:
            u.team_running[team] += 1
        u.region_running[job.placement.region] += 1
        allowance = max(0, guaranteed_of(teams.get(team)) - u.team_used[team])
        for a in job.placement.nodes:
            u.node_gpus[a.node_id] += a.gpus
            u.node_jobs[a.node_id].append(job.id)
            over = max(0, a.gpus - allowance)
            allowance = max(0, allowance - a.gpus)
            u.node_borrowed[a.node_id] += over
            u.team_borrowed[team] += over
            u.team_used[team] += a.gpus
    return u


def lent_by_team(teams: dict[str, cpb.TeamQuota], u: Usage) -> dict[str, int]:
    """Spread each cohort's borrowed GPUs over its lenders' idle guarantees (by name)."""
    lent: dict[str, int] = defaultdict(int)
    cohorts: dict[str, list[str]] = defaultdict(list)
    for name, q in teams.items():
        cohorts[q.cohort or f"__solo__{name}"].append(name)
    for members in cohorts.values():
        borrowed = sum(u.team_borrowed[m] for m in members)
        for m in sorted(members):
            q = teams[m]
            if q.strategy == cpb.LENDING_STRATEGY_DONT_LEND or borrowed <= 0:
                continue
            idle = max(0, guaranteed_of(q) - u.team_used[m])
            limit = next((e.lend_limit_gpus for e in q.quotas if e.HasField("lend_limit_gpus")), None)
            give = min(idle, borrowed, limit if limit is not None else idle)
            lent[m] += give
            borrowed -= give
    return lent


class CapacityService(capacity_pb2_grpc.CapacityServiceServicer):
    def __init__(self, core: BrokerCore) -> None:
        self.core = core

    def _teams(self) -> dict[str, cpb.TeamQuota]:
        return {t.team: t for t in self.core.store.list_records(KIND_TEAM, cpb.TeamQuota)}  # type: ignore[union-attr]

    def _region_records(self) -> dict[str, cpb.RegionInfo]:
        return {r.name: r for r in self.core.store.list_records(KIND_REGION, cpb.RegionInfo)}  # type: ignore[union-attr]

    # ---- regions and capacity ----------------------------------------------------------
    @rpc
    def ListRegions(self, request: cpb.ListRegionsRequest, context: grpc.ServicerContext) -> cpb.ListRegionsResponse:
        usage = compute_usage(self.core, self._teams())
        records = self._region_records()
        regions: dict[str, cpb.RegionInfo] = {}
        for a in self.core.agents.all():
            r = regions.setdefault(a.region, cpb.RegionInfo(name=a.region))
            r.agent_ids.append(a.agent_id)
            r.connected = r.connected or a.connected
            r.last_heartbeat_time = max(r.last_heartbeat_time, a.last_seen)
            if a.record.checkpoint_bucket and not r.checkpoint_bucket:
                r.checkpoint_bucket = a.record.checkpoint_bucket
            for n in a.record.nodes:
                r.nodes += 1
                r.total_gpus += n.gpus
                r.allocated_gpus += min(n.gpus, usage.node_gpus.get(n.id, 0))
        for name, rec in records.items():
            r = regions.setdefault(name, cpb.RegionInfo(name=name))
            r.draining = rec.draining
            r.drain_reason = rec.drain_reason
        for r in regions.values():
            r.free_gpus = max(0, r.total_gpus - r.allocated_gpus)
            r.running_jobs = usage.region_running.get(r.name, 0)
            if not r.checkpoint_bucket:
                r.checkpoint_bucket = self.core.config.checkpoint_root
        return cpb.ListRegionsResponse(regions=[regions[k] for k in sorted(regions)])

    @rpc
    def GetCapacity(self, request: cpb.GetCapacityRequest, context: grpc.ServicerContext) -> cpb.GetCapacityResponse:
        usage = compute_usage(self.core, self._teams())
        rows: dict[tuple, cpb.CapacityRow] = {}
        nodes_out: list[cpb.NodeUsage] = []
        for a in self.core.agents.all():
            for n in a.record.nodes:
                region = n.region or a.region
                if request.region and region != request.region:
                    continue
                block = (n.ultraserver_id or n.network_layer_3) if request.by_block else ""
                key = (region, n.zone, n.capacity_type, n.pool, n.accelerator, block)
                row = rows.get(key)
                if row is None:
                    row = rows[key] = cpb.CapacityRow(
                        region=region, zone=n.zone, capacity_type=n.capacity_type, pool=n.pool,
                        accelerator=n.accelerator, block=block,
                        price_per_gpu_hour=n.price_per_gpu_hour)
                used = min(n.gpus, usage.node_gpus.get(n.id, 0))
                row.total_gpus += n.gpus
                row.allocated_gpus += used
                row.borrowed_gpus += min(used, usage.node_borrowed.get(n.id, 0))
                usable = n.healthy and not n.cordoned and a.connected
                if not n.healthy:
                    row.unhealthy_gpus += n.gpus
                row.free_gpus += max(0, n.gpus - used) if usable else 0
                if request.include_nodes:
                    nodes_out.append(cpb.NodeUsage(node=n, allocated_gpus=used,
                                                   job_ids=usage.node_jobs.get(n.id, [])))
        return cpb.GetCapacityResponse(rows=[rows[k] for k in sorted(rows, key=str)], nodes=nodes_out)

    # ---- training plans -------------------------------------------------------------------
    def _with_state(self, plan: cpb.TrainingPlan) -> cpb.TrainingPlan:
        out = cpb.TrainingPlan()
        out.CopyFrom(plan)
        out.state = plan_state(plan, time.time())  # type: ignore[assignment]
        return out

    @rpc
    def CreateTrainingPlan(self, request: cpb.CreateTrainingPlanRequest, context: grpc.ServicerContext) -> cpb.TrainingPlan:
        if not request.HasField("plan"):
            raise InvalidArgument("plan is missing")
        plan = cpb.TrainingPlan()
        plan.CopyFrom(request.plan)
        validation.validate_plan(plan)
        if plan.id:
            if not validation.TEAM_RE.match(plan.id):
                raise InvalidArgument(f"plan.id {plan.id!r}: use letters, digits, '.', '_' or '-'")
            if self.core.store.get_record(KIND_PLAN, plan.id, cpb.TrainingPlan) is not None:
                raise AlreadyExists(f"training plan {plan.id!r} already exists")
        else:
            plan.id = new_plan_id()
        if not plan.name:
            plan.name = plan.id
        plan.state = cpb.PLAN_STATE_UNSPECIFIED
        self.core.store.put_record(KIND_PLAN, plan.id, plan)
        self.core.poke()
        return self._with_state(plan)

    @rpc
    def ListTrainingPlans(self, request: cpb.ListTrainingPlansRequest, context: grpc.ServicerContext) -> cpb.ListTrainingPlansResponse:
        out = []
        for p in self.core.store.list_records(KIND_PLAN, cpb.TrainingPlan):
            assert isinstance(p, cpb.TrainingPlan)
            if request.region and p.region != request.region:
                continue
            p = self._with_state(p)
            if not request.include_ended and p.state in (cpb.PLAN_STATE_EXPIRED, cpb.PLAN_STATE_CANCELLED):
                continue
            out.append(p)
        return cpb.ListTrainingPlansResponse(plans=out)

    @rpc
    def CancelTrainingPlan(self, request: cpb.CancelTrainingPlanRequest, context: grpc.ServicerContext) -> cpb.TrainingPlan:
        if not request.plan_id:
            raise InvalidArgument("plan_id is empty")
        plan = self.core.store.get_record(KIND_PLAN, request.plan_id, cpb.TrainingPlan)
        if plan is None:
            raise NotFound(f"training plan {request.plan_id!r} not found")
        assert isinstance(plan, cpb.TrainingPlan)
        state = plan_state(plan, time.time())
        if state in (cpb.PLAN_STATE_CANCELLED, cpb.PLAN_STATE_EXPIRED):
            raise FailedPrecondition(
                f"training plan {plan.id} is already {cpb.PlanState.Name(state).removeprefix('PLAN_STATE_').lower()}")
        plan.state = cpb.PLAN_STATE_CANCELLED
        self.core.store.put_record(KIND_PLAN, plan.id, plan)
        self.core.poke()
        return self._with_state(plan)

    # ---- teams ------------------------------------------------------------------------------
    def _filled(self, q: cpb.TeamQuota, usage: Usage, lent: dict[str, int]) -> cpb.TeamQuota:
        out = cpb.TeamQuota()
        out.CopyFrom(q)
        out.used_gpus = usage.team_used.get(q.team, 0)
        out.borrowed_gpus = usage.team_borrowed.get(q.team, 0)
        out.lent_gpus = lent.get(q.team, 0)
        out.pending_jobs = usage.team_pending.get(q.team, 0)
        out.running_jobs = usage.team_running.get(q.team, 0)
        return out

    @rpc
    def SetTeamQuota(self, request: cpb.SetTeamQuotaRequest, context: grpc.ServicerContext) -> cpb.TeamQuota:
        if not request.HasField("quota"):
            raise InvalidArgument("quota is missing")
        q = cpb.TeamQuota()
        q.CopyFrom(request.quota)
        validation.validate_quota(q)
        for f in ("used_gpus", "borrowed_gpus", "lent_gpus", "pending_jobs", "running_jobs"):
            q.ClearField(f)  # read-only usage, never stored
        self.core.store.put_record(KIND_TEAM, q.team, q)
        self.core.poke()
        teams = self._teams()
        usage = compute_usage(self.core, teams)
        return self._filled(q, usage, lent_by_team(teams, usage))

    @rpc
    def GetTeamQuota(self, request: cpb.GetTeamQuotaRequest, context: grpc.ServicerContext) -> cpb.TeamQuota:
        if not request.team:
            raise InvalidArgument("team is empty")
        teams = self._teams()
        if request.team not in teams:
            raise NotFound(f"team {request.team!r} not found; create it with"
                           f" `brokerctl teams set {request.team} --gpus N`")
        usage = compute_usage(self.core, teams)
        return self._filled(teams[request.team], usage, lent_by_team(teams, usage))

    @rpc
    def ListTeams(self, request: cpb.ListTeamsRequest, context: grpc.ServicerContext) -> cpb.ListTeamsResponse:
        teams = self._teams()
        usage = compute_usage(self.core, teams)
        lent = lent_by_team(teams, usage)
        return cpb.ListTeamsResponse(teams=[self._filled(teams[t], usage, lent) for t in sorted(teams)])

    # ---- drain / cordon -----------------------------------------------------------------
    @rpc
    def DrainRegion(self, request: cpb.DrainRegionRequest, context: grpc.ServicerContext) -> cpb.DrainRegionResponse:
        """Stop admitting work in a region and move what runs there elsewhere
        (checkpoint first, then MIGRATING -> placed in another region)."""
        core = self.core
        if not request.region:
            raise InvalidArgument("region is empty")
        known = {a.region for a in core.agents.all()} | set(self._region_records())
        if request.region not in known:
            raise NotFound(f"region {request.region!r} is unknown; known: {', '.join(sorted(known)) or 'none'}")
        rec = core.store.get_record(KIND_REGION, request.region, cpb.RegionInfo) or cpb.RegionInfo(name=request.region)
        assert isinstance(rec, cpb.RegionInfo)
        rec.draining = not request.undrain
        rec.drain_reason = request.reason if rec.draining else ""
        core.store.put_record(KIND_REGION, request.region, rec)
        moved: list[str] = []
        if rec.draining:
            for job in iter_jobs(core.store, phases=HOLDING):
                if job.placement.region != request.region:
                    continue
                why = f": {request.reason}" if request.reason else ""
                if core.request_stop(job.id, "drain", actor="operator", reason="region_drain",
                                     message=f"region {request.region} is draining{why}; checkpointing"
                                             " to move elsewhere") is not None:
                    moved.append(job.id)
        core.poke()
        return cpb.DrainRegionResponse(region=request.region, draining=rec.draining, moved_job_ids=moved)

    @rpc
    def CordonNode(self, request: cpb.CordonNodeRequest, context: grpc.ServicerContext) -> cpb.CordonNodeResponse:
        if not request.node_id:
            raise InvalidArgument("node_id is empty")
        found = self.core.agents.find_node(request.node_id)
        if found is None:
            raise NotFound(f"node {request.node_id!r} is not registered by any agent")
        agent, _ = found
        want = not request.uncordon

        def apply(n: pb.Node) -> bool:
            if n.id != request.node_id or n.cordoned == want:
                return False
            n.cordoned = want
            return True

        self.core.agents.update_nodes(agent.agent_id, apply)
        self.core.poke()
        return cpb.CordonNodeResponse(node_id=request.node_id, cordoned=want)
