"""Convert broker state (protos in the store + live agents) into ``placement`` inputs.

The snapshot is the scheduler's whole world for one pass (Kueue's cache snapshot):
only *connected* agents contribute nodes, so nothing is ever admitted onto an
agent that could not receive its Launch; jobs on disconnected agents still hold
their GPUs (they may be reconnecting) until the agent is declared lost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import placement
from broker.agents.registry import AgentState
from broker.jobs import backoff, standby, store_wait
from broker.jobs.lifecycle import HOLDING, QUEUED, RUNNING
from broker.scheduling import plan_binding, preemption_rules, spares
from checkpoint_layout.roots import RootError, under
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

_NONE: frozenset[str] = frozenset()
_NODE_FIELDS = {f.name for f in dataclasses.fields(placement.NodeInfo)}
_RUN_FIELDS = {f.name for f in dataclasses.fields(placement.RunningJob)}


def plan_state(plan: cpb.TrainingPlan, now: float) -> int:
    if plan.state == cpb.PLAN_STATE_CANCELLED:
        return cpb.PLAN_STATE_CANCELLED
    if now < plan.start_time:
        return cpb.PLAN_STATE_SCHEDULED
    if now < plan.end_time:
        return cpb.PLAN_STATE_ACTIVE
    return cpb.PLAN_STATE_EXPIRED


def node_info(agent: AgentState, n: pb.Node, plans: dict[str, cpb.TrainingPlan],
              bound: cpb.TrainingPlan | None = None) -> placement.NodeInfo:
    """``bound``: the plan this node is capacity of (plan_binding.py); without it, the
    plan whose id is the node's pool."""
    kw: dict[str, object] = dict(
        id=n.id, agent_id=agent.agent_id, region=n.region or agent.region, zone=n.zone,
        gpus=n.gpus, accelerator=n.accelerator, instance_type=n.instance_type,
        layer1=n.network_layer_1, layer2=n.network_layer_2, layer3=n.network_layer_3,
        ultraserver=n.ultraserver_id,
        capacity_type=placement.CapacityType(n.capacity_type or pb.CAPACITY_TYPE_ON_DEMAND),
        pool=n.pool, price_per_gpu_hour=n.price_per_gpu_hour,
        interruption_risk=n.interruption_risk, healthy=n.healthy, cordoned=n.cordoned,
    )
    plan = bound if bound is not None else (
        plans.get(n.pool) if n.capacity_type == pb.CAPACITY_TYPE_TRAINING_PLAN else None)
    if plan is None and n.capacity_type == pb.CAPACITY_TYPE_TRAINING_PLAN:
        # Plan capacity that no registered plan covers is not paid for: not usable
        # (an empty window) until `brokerctl plans create` covers it (plan_binding.py).
        kw["plan_start"], kw["plan_end"] = 0.0, 0.0
    if plan is not None:
        # A plan's nodes are prepaid plan capacity in the plan's pool, whatever the agent
        # labelled their type or pool (plan_binding.py: by id, name or adoption).
        kw["capacity_type"] = placement.CapacityType.TRAINING_PLAN
        kw["pool"] = plan.id
        if plan.state == cpb.PLAN_STATE_CANCELLED:
            kw["plan_start"], kw["plan_end"] = plan.start_time, plan.start_time  # empty window
        else:
            kw["plan_start"], kw["plan_end"] = plan.start_time, plan.end_time
        if "available_before_plan" in _NODE_FIELDS:
            kw["available_before_plan"] = True  # the agent reports it: the instance is up
    return placement.NodeInfo(**kw)  # type: ignore[arg-type]


def regions_refusing(uri: str, roots_by_region: dict[str, list[str]]) -> frozenset[str]:
    """Regions whose agent set allowed checkpoint roots (``--checkpoint-root``) that do not
    cover a job's own ``checkpoint_uri``: the agent would refuse the Launch, so the job is
    not placed there at all (issue 12)."""
    if not uri:
        return frozenset()
    out = set()
    for region, roots in roots_by_region.items():
        try:
            if not any(under(uri, r) for r in roots if r):
                out.add(region)
        except RootError:
            out.add(region)
    return frozenset(out)


# Equal request fields shared by every pending job that has them (region sets,
# capacity types, team, accelerator): a 50,000-job backlog asks for a handful of
# distinct values, and a fresh frozenset or string per job was most of a request's
# memory (~3.1 KB per pending job in the memo, ~1 KB after). Sharing also lets the
# engine's caches compare equal sets by identity. Values are immutable, so dropping
# the table (it is bounded) only loses sharing, never a value.
_SHARED: dict[object, object] = {}
_SHARED_MAX = 65_536


def shared(value: object) -> object:
    """``value``, or the equal value seen before (one object for all equal ones)."""
    hit = _SHARED.get(value)
    if hit is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        hit = _SHARED.setdefault(value, value)
    return hit


def job_request(job: pb.Job, priority: int, refusing: frozenset[str] = frozenset(),
                avoid_nodes: frozenset[str] = frozenset(), job_id: str = "") -> placement.JobRequest:
    """``avoid_nodes``: nodes of agents that refused this job's launch lately
    (broker/jobs/backoff.py), left out like ``excluded_nodes``. ``job_id``: ``job.id``
    when the caller already holds it (one string per job, not one per use)."""
    s = job.spec
    ckpt_interval = 0.0
    if s.trainer.checkpoint_every and s.trainer.step_sleep_s:
        ckpt_interval = s.trainer.checkpoint_every * s.trainer.step_sleep_s
    res = s.resources
    denied = frozenset(s.denied_regions) | refusing if s.denied_regions or refusing else _NONE
    excluded = (frozenset(job.excluded_nodes) | avoid_nodes
                if job.excluded_nodes or avoid_nodes else _NONE)
    return placement.JobRequest(
        id=job_id or job.id, team=shared(s.team), priority=priority, nodes=res.nodes,
        gpus_per_node=res.gpus_per_node, accelerator=shared(res.accelerator),
        required=placement.TopologyLevel(s.topology.required),
        preferred=placement.TopologyLevel(s.topology.preferred),
        allowed_regions=shared(frozenset(s.allowed_regions)),
        denied_regions=shared(denied),
        preferred_regions=shared(tuple(s.preferred_regions)), dataset_region=shared(s.dataset_region),
        capacity_types=shared(frozenset(placement.CapacityType(c) for c in s.capacity_types)),
        max_price_per_gpu_hour=s.max_price_per_gpu_hour,
        min_nodes=s.elasticity.min_nodes, max_nodes=s.elasticity.max_nodes,
        submit_time=job.created_time, expected_duration_s=s.expected_duration_s,
        checkpoint_interval_s=ckpt_interval, excluded_nodes=excluded,
    )


def running_job(job: pb.Job, priority: int,
                rules: preemption_rules.PreemptionRules = preemption_rules.NONE) -> placement.RunningJob:
    kw: dict[str, object] = dict(
        id=job.id, team=job.spec.team, priority=priority,
        allocations=tuple((a.node_id, a.gpus) for a in job.placement.nodes),
        accelerator=job.spec.resources.accelerator,
        started_time=job.attempt_started_time or job.started_time or job.updated_time,
        last_checkpoint_time=job.last_checkpoint_time or job.attempt_started_time or job.updated_time,
        # Only a RUNNING job not already being stopped can be asked to checkpoint and yield.
        preemptible=job.phase == RUNNING and not job.stop_reason,
    )
    until = preemption_rules.protected_until(job, rules)
    if until and "protected_until" in _RUN_FIELDS:
        kw["protected_until"] = until
    window = preemption_rules.spared(job, rules)
    if window[1] and "spared" in _RUN_FIELDS:
        kw["spared"] = window
    if "stopping" in _RUN_FIELDS:
        kw["stopping"] = bool(job.stop_reason)
    return placement.RunningJob(**kw)  # type: ignore[arg-type]


def team_quota(q: cpb.TeamQuota) -> placement.TeamQuota:
    borrow = next((e.borrow_limit_gpus for e in q.quotas if e.HasField("borrow_limit_gpus")), None)
    lend = next((e.lend_limit_gpus for e in q.quotas if e.HasField("lend_limit_gpus")), None)
    return placement.TeamQuota(
        team=q.team, cohort=q.cohort,
        guaranteed=tuple((e.accelerator, e.guaranteed_gpus) for e in q.quotas),
        borrow_limit=borrow, lend_limit=lend,
        can_lend=q.strategy != cpb.LENDING_STRATEGY_DONT_LEND,
        can_borrow=q.strategy != cpb.LENDING_STRATEGY_LEND,
        weight=q.fair_share_weight or 1.0,
    )


def queue_key(job: pb.Job, priority: int, job_id: str = "") -> tuple[int, float, str]:
    """Queue order: priority desc, then submit time, then id (deterministic)."""
    return (-priority, job.created_time, job_id or job.id)


class SnapshotMemo:
    """Placement inputs of unchanged jobs, reused across passes: a job's request or
    running entry depends only on the job (its ``version`` moves on every write) and
    its priority (and, for a pending job, the regions whose checkpoint roots refuse it,
    part of the key since agents can change them). Entries of jobs not seen in a pass are dropped.

    By object, too (``_old_obj``/``_new_obj``: ``id(job)`` -> (job, class, priority,
    entry, version)) for the plain pending job (no checkpoint URI of its own, no refusals, no
    store outage, no standby: its entry depends on nothing but the job and its
    class's priority). The scheduler's live set hands the pass the *same* message for
    a job that did not change (broker/scheduling/live_jobs.py), so such a job costs
    one dict lookup, an identity test and the version (the same trust as the key's:
    a job changed in place with its version moved is looked up afresh) instead of
    seven protobuf field reads and a key: at 50,000 pending the build went from
    ~150-250 ms to ~40 ms. The entry holds the job, so its ``id`` cannot be reused
    while the entry lives."""

    def __init__(self) -> None:
        self._old: dict[tuple, object] = {}
        self._new: dict[tuple, object] = {}
        self._old_obj: dict[int, tuple] = {}
        self._new_obj: dict[int, tuple] = {}
        # The same by object for the plain running job (no stop in flight, no standby):
        # (job, class, priority, version, RunningJob). At 10,000 running the key path
        # (a tuple, a closure and two dict operations per job) was ~20% of the leader's
        # CPU, every pass, for jobs that had not changed.
        self._old_run: dict[int, tuple] = {}
        self._new_run: dict[int, tuple] = {}

    def get(self, key: tuple, make):  # noqa: ANN001, ANN201
        hit = self._old.get(key)
        if hit is None:
            hit = make()
        self._new[key] = hit
        return hit

    def rotate(self) -> None:
        self._old, self._new = self._new, {}
        self._old_obj, self._new_obj = self._new_obj, {}
        self._old_run, self._new_run = self._new_run, {}


class NodeMemo:
    """The node side of a snapshot (a ``NodeInfo`` per usable node, node ids per agent),
    reused while nothing it is computed from changed, so that an unchanged fleet is the
    *same* tuple pass after pass (``admission.py`` then skips it with one identity
    test) and its thousands of nodes are not converted again for every submit.

    The key is everything the node side reads: each agent's inventory record as bytes
    (the registry edits node health and cordons in place, so identity proves nothing),
    whether it is connected, the plans as bytes and each plan's state at ``now``
    (binding and windows change when a plan starts, ends or is cancelled). Serializing
    the records is C work, a small fraction of converting the nodes."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: tuple | None = None
        self.builds = 0
        # (the node tuple, its spare ids, the tuple with those spares cordoned)
        self.spares: tuple[tuple, frozenset[str], tuple] | None = None

    def get(self, key: tuple, make):  # noqa: ANN001, ANN201
        if self._value is None or key != self._key:
            self._value, self._key = make(), key
            self.builds += 1
        return self._value


def _node_side(agents: list[AgentState], plans: list[cpb.TrainingPlan], now: float,
               make_before_break: bool) -> tuple:
    """(usable nodes, node ids per agent, node id set per agent when moves make before break)."""
    plan_map = {p.id: p for p in plans}
    bound = plan_binding.bind_agents(agents, plans, now)
    nodes = tuple(
        node_info(a, n, plan_map, bound[n.id][0] if n.id in bound else None) for a in agents
        # A region whose checkpoint store failed the agent's probe gets no placements.
        if a.connected and not a.record.checkpoint_store_error for n in a.record.nodes
    )
    nodes_of = {a.agent_id: [n.id for n in a.record.nodes] for a in agents}
    by_agent: dict[str, frozenset[str]] = {a.agent_id: frozenset(n.id for n in a.record.nodes)
                                           for a in agents} if make_before_break else {}
    return nodes, nodes_of, by_agent


def build(
    *,
    now: float,
    agents: Iterable[AgentState],
    jobs: Iterable[pb.Job],
    teams: Iterable[cpb.TeamQuota],
    plans: Iterable[cpb.TrainingPlan],
    draining: Iterable[str],
    priority_of,  # noqa: ANN001 - Callable[[pb.JobSpec], int]
    memo: SnapshotMemo | None = None,
    make_before_break: bool = False,
    node_memo: NodeMemo | None = None,
    preemption: preemption_rules.PreemptionRules = preemption_rules.NONE,
) -> placement.Snapshot:
    """``make_before_break``: a job moving out (drain/migrate stop in flight) also asks
    for its standby's placement (request id ``<job>~standby``, never preempting), and a
    reserved standby's nodes count as used (broker/jobs/standby.py).
    ``memo`` / ``node_memo``: reuse the conversions of unchanged jobs / an unchanged fleet.
    ``preemption``: the minimum run time and budget that keep a job from being a victim.
    ``priority_of(spec)`` must depend on ``spec.priority_class`` alone: it is asked once
    per class per build (every caller maps the class name to its value)."""
    plans = list(plans)
    agents = list(agents)
    if node_memo is None:
        nodes, nodes_of, by_agent = _node_side(agents, plans, now, make_before_break)
    else:
        key = (tuple((a.agent_id, a.connected, a.record.SerializeToString(deterministic=True)) for a in agents),
               tuple(p.SerializeToString(deterministic=True) for p in plans),
               tuple(plan_state(p, now) for p in plans), make_before_break)
        nodes, nodes_of, by_agent = node_memo.get(
            key, lambda: _node_side(agents, plans, now, make_before_break))
    roots_by_region: dict[str, list[str]] = {}
    for a in agents:
        if a.record.checkpoint_roots:
            store = a.record.checkpoint_bucket
            roots_by_region.setdefault(a.region, []).extend(
                [*a.record.checkpoint_roots, *([store] if store.startswith(("/", "s3://", "file://")) else [])])
    per_pool = spares.per_pool(agents)
    if per_pool:  # walked twice (below and for the spares)
        jobs = list(jobs)
    pending, running = [], []
    # Per job, the body below is the pass's O(queue) part: kept to dict lookups for an
    # unchanged job (the memo inlined, no closure per job) and one priority lookup per
    # class, not per job (``priority_of`` reads the spec's class alone).
    old, new = (memo._old, memo._new) if memo is not None else ({}, {})
    old_obj, new_obj = (memo._old_obj, memo._new_obj) if memo is not None else ({}, None)
    old_run, new_run = (memo._old_run, memo._new_run) if memo is not None else ({}, None)
    prio_of_class: dict[str, int] = {}
    for job in jobs:
        seen = old_obj.get(id(job))
        if seen is not None and seen[0] is job and job.version == seen[4]:  # unchanged, plain, pending
            prio = prio_of_class.get(seen[1])
            if prio is None:
                prio = prio_of_class[seen[1]] = priority_of(job.spec)
            if prio == seen[2]:
                new_obj[id(job)] = seen  # type: ignore[index]
                pending.append(seen[3])
                continue
        seen = old_run.get(id(job))
        if seen is not None and seen[0] is job and job.version == seen[3]:  # unchanged, plain, running
            prio = prio_of_class.get(seen[1])
            if prio is None:
                prio = prio_of_class[seen[1]] = priority_of(job.spec)
            if prio == seen[2]:
                new_run[id(job)] = seen  # type: ignore[index]
                running.append(seen[4])
                continue
        spec = job.spec
        prio = prio_of_class.get(spec.priority_class)
        if prio is None:
            prio = prio_of_class[spec.priority_class] = priority_of(spec)
        if job.phase in QUEUED:
            uri = spec.checkpoint_uri
            refusing = regions_refusing(uri, roots_by_region) if uri and roots_by_region else _NONE
            # Agents that refused its launch lately (time-dependent: part of the memo key).
            avoid = frozenset(n for a in backoff.avoided_agents(job, now) for n in nodes_of.get(a, ())
                              ) if job.refusals else _NONE
            # A store outage the job waits out: its region, until the backoff ends.
            if job.store_wait.count:
                ok = max((a.record.checkpoint_store_ok_since for a in agents
                          if a.region == job.store_wait.region), default=0.0)
                waiting = store_wait.avoided_region(job, now, ok)
                only = store_wait.allowed_regions(job, now)
                out = frozenset(n for a in agents
                                if a.region == waiting or (only is not None and a.region not in only)
                                for n in nodes_of.get(a.agent_id, ()))
                avoid = avoid | out if out else avoid
            jid = job.id  # one string for the key, the queue order and the request
            key = (jid, job.version, prio, 0, refusing, avoid)
            hit = old.get(key)
            if hit is None:
                hit = (queue_key(job, prio, jid), job_request(job, prio, refusing, avoid, jid))
            if new_obj is not None and not uri and not job.refusals and not job.store_wait.count \
                    and not job.HasField("standby"):
                new_obj[id(job)] = (job, spec.priority_class, prio, hit, job.version)
            else:
                new[key] = hit
            pending.append(hit)
        elif job.phase in HOLDING and job.placement.nodes:
            if memo is None:
                running.append(running_job(job, prio, preemption))
            else:
                rj = memo.get((job.id, job.version, prio, 1),
                              lambda j=job, p=prio: running_job(j, p, preemption))
                running.append(rj)
                if new_run is not None and not job.stop_reason and not job.HasField("standby"):
                    new_run[id(job)] = (job, spec.priority_class, prio, job.version, rj)
            if make_before_break and standby.wants_placement(job):
                req = job_request(job, prio, avoid_nodes=frozenset(
                    n for a in backoff.avoided_agents(job, now) for n in nodes_of.get(a, ())))
                # never on the source's agent: starting an attempt there fences the source
                src = frozenset(a.node_id for a in job.placement.nodes) | by_agent.get(
                    job.placement.agent_id, frozenset())
                pending.append((queue_key(job, prio), dataclasses.replace(
                    req, id=standby.request_id(job.id), excluded_nodes=req.excluded_nodes | src,
                    capacity_types=standby.destination_types(job) or req.capacity_types)))
        if standby.waiting(job) and job.standby.placement.nodes:
            held = pb.Job()
            held.CopyFrom(job)
            held.id = standby.request_id(job.id)
            held.placement.CopyFrom(job.standby.placement)
            held.stop_reason = "standby"  # not preemptible: it holds no work yet
            running.append(running_job(held, prio))
    if memo is not None:
        memo.rotate()
    pending.sort(key=lambda kv: kv[0])
    reserved: frozenset[str] = frozenset()
    if per_pool:  # only fleets whose operators reserve spares pay for this
        nodes, reserved = _with_spares(nodes, per_pool, running, jobs, node_memo,
                                       spares.designated(agents))
    return placement.Snapshot(
        now=now, nodes=nodes, running=tuple(running), pending=tuple(r for _, r in pending),
        teams=tuple(team_quota(t) for t in teams), draining_regions=frozenset(draining),
        spares=reserved,
    )


def _with_spares(nodes: tuple, per_pool: dict[tuple[str, str], int],
                 running: list[placement.RunningJob], jobs: Iterable[pb.Job],
                 node_memo: NodeMemo | None,
                 designated: frozenset[str] = frozenset()) -> tuple[tuple, frozenset[str]]:
    """``nodes`` with the reserved spares cordoned (the placement engine then leaves them
    out, as it does any cordoned node), and the spare ids. The same tuple object is
    returned while the spares do not change (the admission cache tests identity)."""
    used = {node for r in running for node, _ in r.allocations}
    held: set[str] = set()
    blamed: set[str] = set()
    for job in jobs:
        blamed.update(job.excluded_nodes)
        rec = job.node_recovery
        if job.phase in QUEUED and rec.failed_attempt and not rec.plan:
            held.update(rec.survivors)
            held.update(rec.lost_nodes)
    reserved = spares.reserved(nodes, per_pool, used, held, blamed, designated)
    cached = node_memo.spares if node_memo is not None else None
    if cached is not None and cached[0] is nodes and cached[1] == reserved:
        return cached[2], reserved
    out = tuple(dataclasses.replace(n, cordoned=True) if n.id in reserved else n for n in nodes)
    if node_memo is not None:
        node_memo.spares = (nodes, reserved, out)
    return out, reserved
