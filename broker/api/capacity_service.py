"""CapacityService: what operators call (regions, capacity, plans, teams, priority classes,
drain, cordon).

Usage numbers come from :func:`broker.scheduling.usage.usage_view` over a snapshot
built the scheduler's way from the store and the agents' inventories, on each call:
nothing to keep in sync, the same answer after a broker restart, and the same
numbers the scheduler enforces. A drain is a recovery trigger (REGION_DRAIN); the
job's recovery policy decides the stop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from broker.agents.registry import AgentRegistry
from broker.api import validation
from broker.api.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, rpc
from broker.api.limits import INT32_MAX
from broker.auth.identity import Role
from broker.auth.interceptor import principal_of
from broker.auth.policy import Permission, PermissionDenied, authorize, sees_all_teams
from broker.config import BrokerConfig
from broker.ids import new_plan_id
from broker.jobs.lifecycle import HOLDING, QUEUED
from broker.jobs.ops import JobOps
from broker.jobs.recovery import Signal, Trigger
from broker.jobs.views import JobsView, RecordsView
from broker.scheduling import plan_binding
from broker.scheduling.snapshot import plan_state
from broker.scheduling.usage import UsageView, build_snapshot, usage_view
from broker.store.base import KIND_PLAN, KIND_REGION, KIND_TEAM, KIND_TEAM_GRANT
from broker.telemetry.series import MAX_WINDOW_S
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import capacity_pb2_grpc
from computebroker.v1 import common_pb2 as pb

M = TypeVar("M", bound=Message)


def _within_grant(q: cpb.TeamQuota, grant: cpb.TeamQuota | None) -> None:
    """A team admin's quota stays within what operators granted the team: same cohort,
    no higher fair-share weight (it decides the team's share of everything borrowed in
    the cohort), per accelerator no more guaranteed GPUs and no higher borrow limit."""
    if grant is None:
        raise PermissionDenied(f"team {q.team} has no quota granted by an operator yet;"
                               " an operator creates it (`brokerctl teams set`)")
    if q.cohort != grant.cohort:
        raise PermissionDenied(f"only operators move team {q.team} to another cohort"
                               f" (granted: {grant.cohort or '(none)'})")
    weight, granted_weight = q.fair_share_weight or 1.0, grant.fair_share_weight or 1.0
    if weight > granted_weight:
        raise PermissionDenied(f"fair_share_weight {weight:g} exceeds the operators' grant of"
                               f" {granted_weight:g} for team {q.team}")
    granted = {e.accelerator: e for e in grant.quotas}
    for e in q.quotas:
        g = granted.get(e.accelerator)
        label = e.accelerator or "any accelerator"
        if g is None or e.guaranteed_gpus > g.guaranteed_gpus:
            raise PermissionDenied(
                f"{label}: {e.guaranteed_gpus} guaranteed GPUs exceeds the operators' grant of"
                f" {g.guaranteed_gpus if g is not None else 0}")
        if g.HasField("borrow_limit_gpus") and (
                not e.HasField("borrow_limit_gpus") or e.borrow_limit_gpus > g.borrow_limit_gpus):
            raise PermissionDenied(f"{label}: the borrow limit may not exceed the granted"
                                   f" {g.borrow_limit_gpus} GPUs")


def _validated_copy(request: Message, field: str, validate: Callable[[M], None]) -> M:
    """A copy of the request's required message ``field``, checked by ``validate``."""
    if not request.HasField(field):
        raise InvalidArgument(f"{field} is missing")
    out = type(getattr(request, field))()
    out.CopyFrom(getattr(request, field))
    validate(out)
    return out


def sat32(value: int) -> int:
    """Totals go into int32 proto fields: saturate instead of overflowing (which made
    ListRegions/GetCapacity answer INTERNAL forever, issue 12). Inventories are capped
    (broker/api/limits.py) so this only guards sums over very many agents."""
    return min(value, INT32_MAX)


class CapacityService(capacity_pb2_grpc.CapacityServiceServicer):
    def __init__(self, ops: JobOps, jobs: JobsView, records: RecordsView, agents: AgentRegistry,
                 config: BrokerConfig) -> None:
        self.ops, self.jobs, self.records = ops, jobs, records
        self.agents, self.config = agents, config

    def _teams(self) -> dict[str, cpb.TeamQuota]:
        return self.records.teams()

    def _region_records(self) -> dict[str, cpb.RegionInfo]:
        return self.records.regions()

    def _usage(self) -> UsageView:
        """The scheduler's view of usage, over a snapshot built the scheduler's way."""
        return self._usage_and_holding()[0]

    def _usage_and_holding(self) -> tuple[UsageView, list[pb.Job]]:
        """The usage view, and the jobs holding GPUs it was built from.

        Streamed: a queued job is read, turned into its placement request, counted for
        its team and dropped. Why: the view was built over a list of every live job as
        read (a ~3.5 KB job takes ~15 KB parsed), so one ListTeams, SetTeamQuota or
        GetCapacity call at a 50,000-job backlog held ~750 MB at once and left the
        broker's RSS there. The holding jobs (GPUs on nodes) are few and kept."""
        holding: list[pb.Job] = []
        pending: dict[str, int] = {}

        def live() -> Iterator[pb.Job]:
            for job in self.jobs.iter(phases=[*HOLDING, *QUEUED]):
                if job.phase in QUEUED:
                    pending[job.spec.team] = pending.get(job.spec.team, 0) + 1
                else:
                    holding.append(job)
                yield job

        snapshot = build_snapshot(now=time.time(), agents=self.agents.all(), jobs=live(),
                                  teams=self.records.teams().values(), plans=self.records.plans(),
                                  regions=self.records.regions().values(),
                                  priority_of=self.ops.priority_of)
        view = usage_view(snapshot, holding)
        for team, n in pending.items():
            view.team_pending[team] += n
        return view, holding

    # ---- regions and capacity ----------------------------------------------------------
    @rpc
    def ListRegions(self, request: cpb.ListRegionsRequest, context: grpc.ServicerContext) -> cpb.ListRegionsResponse:
        usage = self._usage()
        records = self._region_records()
        regions: dict[str, cpb.RegionInfo] = {}
        for a in self.agents.all():
            r = regions.setdefault(a.region, cpb.RegionInfo(name=a.region))
            r.agent_ids.append(a.agent_id)
            r.connected = r.connected or a.connected
            r.last_heartbeat_time = max(r.last_heartbeat_time, a.last_seen)
            if a.record.checkpoint_bucket and not r.checkpoint_bucket:
                r.checkpoint_bucket = a.record.checkpoint_bucket
            for n in a.record.nodes:
                r.nodes = sat32(r.nodes + 1)
                r.total_gpus = sat32(r.total_gpus + n.gpus)
                r.allocated_gpus = sat32(r.allocated_gpus + min(n.gpus, usage.node_gpus.get(n.id, 0)))
        for name, rec in records.items():
            r = regions.setdefault(name, cpb.RegionInfo(name=name))
            r.draining = rec.draining
            r.drain_reason = rec.drain_reason
        for r in regions.values():
            r.free_gpus = max(0, r.total_gpus - r.allocated_gpus)
            r.running_jobs = usage.region_running.get(r.name, 0)
            if not r.checkpoint_bucket:
                r.checkpoint_bucket = self.config.checkpoint_root
        return cpb.ListRegionsResponse(regions=[regions[k] for k in sorted(regions)])

    @rpc
    def GetCapacity(self, request: cpb.GetCapacityRequest, context: grpc.ServicerContext) -> cpb.GetCapacityResponse:
        usage, live = self._usage_and_holding()
        # Which jobs' ids the caller may see on nodes: its own team's (operators: all).
        # Other teams' jobs still count in the GPU numbers; their ids are not shown.
        who = principal_of(context)
        shown = None if sees_all_teams(who) else {j.id for j in live if j.spec.team == who.team}
        rows: dict[tuple, cpb.CapacityRow] = {}
        nodes_out: list[cpb.NodeUsage] = []
        # A plan's nodes show as its pool (plan id) of type training-plan (plan_binding.py).
        bound = plan_binding.bind_agents(self.agents.all(), self.records.plans(), time.time())
        for a in self.agents.all():
            for n in a.record.nodes:
                region = n.region or a.region
                if request.region and region != request.region:
                    continue
                block = (n.ultraserver_id or n.network_layer_3) if request.by_block else ""
                ctype, pool = n.capacity_type, n.pool
                if n.id in bound:
                    ctype, pool = pb.CAPACITY_TYPE_TRAINING_PLAN, bound[n.id][0].id
                key = (region, n.zone, ctype, pool, n.accelerator, block)
                row = rows.get(key)
                if row is None:
                    row = rows[key] = cpb.CapacityRow(
                        region=region, zone=n.zone, capacity_type=ctype, pool=pool,
                        accelerator=n.accelerator, block=block,
                        price_per_gpu_hour=n.price_per_gpu_hour)
                used = min(n.gpus, usage.node_gpus.get(n.id, 0))
                row.total_gpus = sat32(row.total_gpus + n.gpus)
                row.allocated_gpus = sat32(row.allocated_gpus + used)
                row.borrowed_gpus = sat32(row.borrowed_gpus + min(used, usage.node_borrowed.get(n.id, 0)))
                usable = n.healthy and not n.cordoned and a.connected
                if not n.healthy:
                    row.unhealthy_gpus = sat32(row.unhealthy_gpus + n.gpus)
                spare = n.id in usage.spares  # free, but only for in-place replacements
                if spare:
                    row.spare_gpus = sat32(row.spare_gpus + n.gpus)
                elif usable:
                    row.free_gpus = sat32(row.free_gpus + max(0, n.gpus - used))
                if request.include_nodes:
                    nodes_out.append(cpb.NodeUsage(
                        node=n, allocated_gpus=used,
                        job_ids=[j for j in usage.node_jobs.get(n.id, []) if shown is None or j in shown],
                        borrowed_gpus=min(used, usage.node_borrowed.get(n.id, 0)), spare=spare))
        return cpb.GetCapacityResponse(rows=[rows[k] for k in sorted(rows, key=str)], nodes=nodes_out)

    # ---- training plans -------------------------------------------------------------------
    def _with_state(self, plan: cpb.TrainingPlan) -> cpb.TrainingPlan:
        out = cpb.TrainingPlan()
        out.CopyFrom(plan)
        out.state = plan_state(plan, time.time())  # type: ignore[assignment]
        return out

    def _save_plan(self, plan: cpb.TrainingPlan, state: int) -> cpb.TrainingPlan:
        """Store the plan with ``state`` (UNSPECIFIED = by its times), wake the scheduler,
        answer with the state it has now."""
        plan.state = state  # type: ignore[assignment]
        self.records.put(KIND_PLAN, plan.id, plan)
        self.ops.poke()
        return self._with_state(plan)

    @rpc
    def CreateTrainingPlan(self, request: cpb.CreateTrainingPlanRequest, context: grpc.ServicerContext) -> cpb.TrainingPlan:
        plan = _validated_copy(request, "plan", validation.validate_plan)
        if plan.id:
            if not validation.TEAM_RE.match(plan.id):
                raise InvalidArgument(f"plan.id {plan.id!r}: use letters, digits, '.', '_' or '-'")
            if self.records.get(KIND_PLAN, plan.id) is not None:
                raise AlreadyExists(f"training plan {plan.id!r} already exists")
        else:
            plan.id = new_plan_id()
        if not plan.name:
            plan.name = plan.id
        return self._save_plan(plan, cpb.PLAN_STATE_UNSPECIFIED)

    @rpc
    def ListTrainingPlans(self, request: cpb.ListTrainingPlansRequest, context: grpc.ServicerContext) -> cpb.ListTrainingPlansResponse:
        out = []
        for p in self.records.plans():
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
        plan = self.records.get(KIND_PLAN, request.plan_id)
        if plan is None:
            raise NotFound(f"training plan {request.plan_id!r} not found")
        assert isinstance(plan, cpb.TrainingPlan)
        state = plan_state(plan, time.time())
        if state in (cpb.PLAN_STATE_CANCELLED, cpb.PLAN_STATE_EXPIRED):
            raise FailedPrecondition(
                f"training plan {plan.id} is already {cpb.PlanState.Name(state).removeprefix('PLAN_STATE_').lower()}")
        return self._save_plan(plan, cpb.PLAN_STATE_CANCELLED)

    # ---- teams ------------------------------------------------------------------------------
    @rpc
    def SetTeamQuota(self, request: cpb.SetTeamQuotaRequest, context: grpc.ServicerContext) -> cpb.TeamQuota:
        q = _validated_copy(request, "quota", validation.validate_quota)
        for f in ("used_gpus", "borrowed_gpus", "lent_gpus", "pending_jobs", "running_jobs"):
            q.ClearField(f)  # read-only usage, never stored
        who = principal_of(context)
        authorize(who, Permission.QUOTA_SET, q.team)
        if who.role is Role.OPERATOR:
            self.records.put(KIND_TEAM_GRANT, q.team, q)  # the ceiling for the team's admins
        else:
            _within_grant(q, self.records.get(KIND_TEAM_GRANT, q.team))
        self.records.put(KIND_TEAM, q.team, q)
        self.ops.poke()
        return self._usage().fill(q)

    @rpc
    def GetTeamQuota(self, request: cpb.GetTeamQuotaRequest, context: grpc.ServicerContext) -> cpb.TeamQuota:
        if not request.team:
            raise InvalidArgument("team is empty")
        teams = self._teams()
        if request.team not in teams:
            raise NotFound(f"team {request.team!r} not found; create it with"
                           f" `brokerctl teams set {request.team} --gpus N`")
        return self._usage().fill(teams[request.team])

    @rpc
    def ListTeams(self, request: cpb.ListTeamsRequest, context: grpc.ServicerContext) -> cpb.ListTeamsResponse:
        teams = self._teams()
        usage = self._usage()
        return cpb.ListTeamsResponse(teams=[usage.fill(teams[t]) for t in sorted(teams)])

    # ---- usage over time (broker/telemetry/series.py) ------------------------------------
    @rpc
    def GetUsageSeries(self, request: cpb.GetUsageSeriesRequest,
                       context: grpc.ServicerContext) -> cpb.UsageSeries:
        """The kept series for the last ``window_s``. Tenancy as ListJobs: a member or team
        admin reads its own team's lines only (naming another team is refused, not
        silently emptied); operators read every team's, or one."""
        if not math.isfinite(request.window_s) or request.window_s < 0:
            raise InvalidArgument(f"window_s must be a positive number of seconds, not"
                                  f" {request.window_s}")
        if request.window_s > MAX_WINDOW_S:
            raise InvalidArgument(f"window_s {request.window_s:g} is beyond the kept"
                                  f" {MAX_WINDOW_S / 3600:g} h")
        who = principal_of(context)
        team = request.team
        if not sees_all_teams(who) and not team:
            team = who.team
        authorize(who, Permission.JOBS_READ, team or who.team)
        teams = {team} if team else None
        return self.ops.telemetry.series.query(time.time(), request.window_s, teams)

    # ---- priority classes (broker/jobs/priority_classes.py) ----------------------------------
    @rpc
    def SetPriorityClass(self, request: cpb.SetPriorityClassRequest, context: grpc.ServicerContext) -> cpb.PriorityClass:
        pc = _validated_copy(request, "priority_class", validation.validate_priority_class)
        out = self.ops.priorities.set(pc)
        self.ops.poke()  # queued jobs of that class may now rank differently
        return out

    @rpc
    def ListPriorityClasses(self, request: cpb.ListPriorityClassesRequest, context: grpc.ServicerContext) -> cpb.ListPriorityClassesResponse:
        return cpb.ListPriorityClassesResponse(priority_classes=self.ops.priorities.list())

    @rpc
    def DeletePriorityClass(self, request: cpb.DeletePriorityClassRequest, context: grpc.ServicerContext) -> cpb.DeletePriorityClassResponse:
        if not request.name:
            raise InvalidArgument("name is empty: say which priority class to delete")
        self.ops.priorities.delete(request.name)
        self.ops.poke()
        return cpb.DeletePriorityClassResponse(name=request.name)

    # ---- drain / cordon -----------------------------------------------------------------
    @rpc
    def DrainRegion(self, request: cpb.DrainRegionRequest, context: grpc.ServicerContext) -> cpb.DrainRegionResponse:
        """Stop admitting work in a region and move what runs there elsewhere
        (checkpoint first, then MIGRATING -> placed in another region)."""
        if not request.region:
            raise InvalidArgument("region is empty")
        known = {a.region for a in self.agents.all()} | set(self._region_records())
        if request.region not in known:
            raise NotFound(f"region {request.region!r} is unknown; known: {', '.join(sorted(known)) or 'none'}")
        rec = self.records.get(KIND_REGION, request.region) or cpb.RegionInfo(name=request.region)
        rec.draining = not request.undrain
        rec.drain_reason = request.reason if rec.draining else ""
        self.records.put(KIND_REGION, rec.name, rec)
        moved: list[str] = []
        if rec.draining:
            why = f": {request.reason}" if request.reason else ""
            for job in self.jobs.iter(phases=HOLDING):
                if job.placement.region != request.region:
                    continue
                if self.ops.trigger(job.id, Signal(Trigger.REGION_DRAIN),
                                    actor=principal_of(context).actor,
                                    message=f"region {request.region} is draining{why}; checkpointing"
                                            " to move elsewhere") is not None:
                    moved.append(job.id)
        self.ops.poke()
        return cpb.DrainRegionResponse(region=request.region, draining=rec.draining, moved_job_ids=moved)

    @rpc
    def CordonNode(self, request: cpb.CordonNodeRequest, context: grpc.ServicerContext) -> cpb.CordonNodeResponse:
        if not request.node_id:
            raise InvalidArgument("node_id is empty")
        found = self.agents.find_node(request.node_id)
        if found is None:
            raise NotFound(f"node {request.node_id!r} is not registered by any agent")
        agent, _ = found
        want = not request.uncordon

        def apply(n: pb.Node) -> bool:
            if n.id != request.node_id or n.cordoned == want:
                return False
            n.cordoned = want
            return True

        self.agents.update_nodes(agent.agent_id, apply)
        self.ops.poke()
        return cpb.CordonNodeResponse(node_id=request.node_id, cordoned=want)
