"""The discrete-event loop: simulated clock, simulated agents, the real broker decisions.

What is real (the same functions the live broker calls):
- placement: :func:`placement.schedule` on a snapshot built with the broker's own
  converters (:func:`broker.scheduling.snapshot.node_info`, ``job_request``,
  ``running_job``, ``team_quota``);
- the job state machine: :mod:`broker.jobs.transitions` (submit, admit, request_stop,
  attempt_lost) and :mod:`broker.jobs.updates` (progress, attempt_ended) on real
  ``pb.Job`` records, with their goodput accounting;
- what to do on an interruption: :func:`broker.jobs.recovery.plan_stop` (the job's
  :class:`~broker.jobs.recovery.RecoveryPolicy`, the function ``JobOps.trigger`` and
  ``JobOps.attempt_lost`` call) and then ``transitions.request_stop`` / ``attempt_lost``;
- proactive moves: :mod:`broker.jobs.proactive`.

What is simulated: time (a heap of events, ``now`` passed to every pure function, as the
live code takes it from ``ops.clock()``), and the agents: a Launch becomes RUNNING after
the modelled start-up (checkpoint read + cross-region transfer + process start), a
checkpoint-first Stop becomes CHECKPOINTED after the modelled write (or STOPPED when the
grace is too short), and the job's last durable checkpoint is the last periodic one
(every ``checkpoint.interval_s`` of running), as an agent would report it.

The scheduler runs like the live loop: a pass at most every ``scheduler_interval_s``
when a transition asked for one (``WakeScheduler``), so decisions are batched per tick.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import placement
from broker.agents.registry import AgentSession, AgentState
from broker.config import BrokerConfig
from broker.jobs import below_size, grow_back, proactive, transitions, updates
from broker.jobs import node_recovery as live_node_recovery
from broker.jobs.causes import Cause
from broker.jobs.lifecycle import HOLDING, LAUNCHING, QUEUED, RUNNING, TERMINAL
from broker.jobs.outcome import Outcome, SendLaunch, SendStop, WakeScheduler
from broker.jobs.recovery import Grow, Relaunch, RelaunchPlan, Signal, Trigger, plan_stop
from broker.scheduling import exclusions, grow_watch, preemption_rules, replacements
from broker.scheduling import snapshot as snapmod
from broker.scheduling import spares as spares_mod
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from simulator import estimates, fleet, quota_filter
from simulator.policies import Policy, Proactive, Quotas
from simulator.scenario import PoolKind, Scenario
from simulator.streams import Process, Streams
from simulator.trace import TraceJob

# Event kinds; at equal times the scheduler tick runs last (after GPUs were freed).
SUBMIT, RUN, FINISH, STOP_DONE, SPOT_NOTICE, SPOT_RECLAIM, SPOT_RETURN = range(7)
NODE_FAIL, NODE_REPAIR, HANG, HANG_DETECT, REGION_OUT, REGION_BACK = range(7, 13)
DRAIN_ON, DRAIN_OFF, PLAN_START, PLAN_ENDING, PLAN_END, SAMPLE, RECLAIM_ON, TICK = range(13, 21)
SAMPLE_S = 3600.0
# The simulated clock is a unix time (trace second 0 = T0): the broker treats a time of 0
# as "unset" (e.g. ``Tx._charge`` skips a zero ``phase_time``), as a live clock never is.
T0 = 1_700_000_000.0
PLAN_LEAD_S = 600.0
LAUNCH = "launch"  # lost-time bucket of a first start-up (no cause)
NODE_REPLACED = "node_replaced"  # work redone and downtime of an in-place replacement
TOPOLOGY = "topology_slowdown"


# With nothing running and nothing finishing for this long after the last submit, the
# queued jobs can never run (only periodic ticks and fleet processes remain): stop, say so.
STALL_HORIZON_S = 30 * 86400.0


class SimError(RuntimeError):
    """A conservation invariant broke: a bug, never an expected outcome."""


@dataclass(slots=True, eq=False)
class SimJob:
    tj: TraceJob
    nodes: int
    gpn: int
    job: pb.Job
    prio: int
    ckpt_bytes: float
    durable: float = 0.0  # work-seconds saved in the last durable checkpoint
    ckpt_region: str = ""
    run_t0: float = -1.0  # wall time the current attempt started RUNNING
    speed: float = 1.0
    hang_t: float = -1.0
    epoch: int = 0  # bumps when the attempt ends: stale events are dropped
    admit_t: float = 0.0
    alloc: tuple[tuple[str, int], ...] = ()
    region: str = ""
    ctype: int = 0
    price: float = 0.0
    stop_cause: Cause | None = None
    stop_t: float = 0.0
    stop_work: float = 0.0
    next_cost: str = LAUNCH  # bucket of the next start-up's time
    req: placement.JobRequest | None = None
    run: placement.RunningJob | None = None
    ended: int = 0
    finish_t: float = 0.0
    first_start: float = -1.0
    preemptions: int = 0
    migrations: int = 0
    lost: dict[str, float] = field(default_factory=dict)  # bucket -> GPU-seconds
    alloc_gpu_s: float = 0.0
    cost: dict[str, float] = field(default_factory=dict)  # capacity kind -> dollars
    wait_s: float = 0.0  # every interval spent queued (first queue and every re-queue)
    queued_t: float = -1.0  # when the current queued interval began (-1 = not queued)
    unplaceable: str = ""  # why no state of the fleet could ever run it ("" = it can run)
    # NODE_LOST relaunch plans the broker's policy chose: blocker ("none" = in place) -> count
    recoveries: dict[str, int] = field(default_factory=dict)
    # a running job's failure: (failure time, periodic checkpoint wall, memory snapshot wall,
    # memory snapshot work, lost-time bucket, GPUs it held), for an in-place relaunch from memory
    mem_point: tuple[float, float, float, float, str, int] | None = None
    grow_backs: int = 0  # grow-back moves begun (broker/jobs/grow_back.py)
    # times it came to run below its size, by route (Job.shrunk.route)
    small_routes: dict[str, int] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """The GPUs it asked for (its work is measured at this size)."""
        return self.nodes * self.gpn

    @property
    def held(self) -> int:
        """The GPUs its current allocation holds (fewer while it runs below its size)."""
        return sum(g for _, g in self.alloc) if self.alloc else self.gpus

    @property
    def frac(self) -> float:
        """The share of its requested nodes it runs on: its speed scales with it."""
        return len(self.alloc) / self.nodes if self.alloc and self.nodes else 1.0


# NODE_LOST plans that resume from the peers' memory (a spare in the lost node's place, or
# the survivors alone): the rest resume from the store
_FROM_MEMORY = frozenset({Relaunch.REPLACE_IN_PLACE.value, Relaunch.SHRINK_IN_PLACE.value})

_KIND = {pb.CAPACITY_TYPE_SPOT: "spot", pb.CAPACITY_TYPE_TRAINING_PLAN: "plan",
         pb.CAPACITY_TYPE_ON_DEMAND: "on_demand"}


class Simulation:
    """One policy over one trace; :meth:`run` returns the per-job records and samples."""

    def __init__(self, scn: Scenario, jobs: list[TraceJob], policy: Policy, seed: int,
                 progress: Callable[[float], None] | None = None, check: bool = False) -> None:
        self.scn, self.policy, self.seed, self.check = scn, policy, seed, check
        self.progress = progress
        # no budget ends a simulated job: it measures goodput, not give-ups
        self.cfg = BrokerConfig(max_restarts=1_000_000, max_node_failures=10_000,
                                recovery_policy=policy.recovery.name,
                                preempt_min_run_s=scn.preempt_min_run_s, preempt_budget=scn.preempt_budget,
                                preempt_gain_factor=scn.preempt_gain_factor if policy.gain_rule else 0.0,
                                preempt_requeue_s=scn.preempt_requeue_s)
        self.rules = preemption_rules.from_config(self.cfg)
        self.now = T0
        self.heap: list[tuple[float, int, int, int, object]] = []
        self.seq = 0
        self.events = 0
        self.passes = 0
        self.snodes, self.plans = fleet.build(scn, T0)
        self.node = {s.node.id: s for s in self.snodes}
        self.plan_map = {p.id: p for p in self.plans}
        self.present = {s.node.id for s in self.snodes if s.pool.kind is not PoolKind.TRAINING_PLAN}
        self.nf = scn.node_failures
        self.used: dict[str, int] = defaultdict(int)
        self.on_node: dict[str, set[str]] = defaultdict(set)
        self.agents = {r.name: AgentState(fleet.agent_of(r.name), apb.Register(
            agent_id=fleet.agent_of(r.name), region=r.name, checkpoint_bucket=f"sim://{r.name}",
            pool_spares=self._pool_spares(r.name)), last_seen=0.0) for r in scn.regions}
        # the broker's spares: N free nodes per pool, chosen every pass (spares.reserved)
        self.per_pool = spares_mod.per_pool(self.agents.values())
        self._spares_memo: tuple = ()
        self.undecided: set[str] = set()  # queued jobs waiting for their NODE_LOST plan
        self.ninfo: dict[str, placement.NodeInfo] = {}
        self.nodes_t: tuple[placement.NodeInfo, ...] | None = None
        self.draining: set[str] = set()
        self.down_regions: set[str] = set()
        self.sj: dict[str, SimJob] = {}
        self.queued: dict[str, SimJob] = {}
        self.holding: dict[str, SimJob] = {}
        self.trace = jobs
        self.tick_at = -1.0
        # one generator per (process, node), keyed by names (simulator/streams.py)
        self.streams = Streams(seed, scn.name)
        self.samples: list[dict] = []
        self.region_gpus = defaultdict(int)
        for s in self.snodes:
            if s.node.id in self.present:
                self.region_gpus[s.region.name] += s.node.gpus
        self.region_used: dict[str, int] = defaultdict(int)
        self.team_used: dict[str, int] = defaultdict(int)
        self.team_gpu_s: dict[str, float] = defaultdict(float)
        self._last_team_t = T0
        self.slow = dict(scn.slowdown)
        self.region_names = [r.name for r in scn.regions]
        self.teams = self._teams()
        self.moving: set[str] = set()
        self.in_tick = False  # jobs stopped by a proactive move, not yet relaunched
        self._seen: dict[object, object] = {}  # interned request fields (see _interned)
        self._fit_memo: dict[tuple, str] = {}
        self.pipe_free: dict[object, float] = {}  # shared store / link -> when it is free again
        self.left_out = 0  # queued jobs the quota filter kept out of passes, summed over passes
        self.small: set[str] = set()  # jobs with a below-size record (Job.shrunk)

    # ---- set-up ------------------------------------------------------------------------
    def _teams(self) -> tuple[placement.TeamQuota, ...]:
        if self.policy.quotas is Quotas.NONE:
            return ()
        out = []
        # every scenario team (an idle team's guarantee is what the others borrow) and every
        # trace team the scenario leaves out (the default quota)
        for name in sorted({j.team for j in self.trace} | {t.name for t in self.scn.teams}):
            t = self.scn.team(name)
            e = cpb.QuotaEntry(accelerator="", guaranteed_gpus=t.guaranteed_gpus)
            if self.policy.quotas is Quotas.STATIC:
                e.borrow_limit_gpus = 0
            # Kueue per region: one cohort per region, so a team borrows only from the teams
            # of its home region (its jobs run only there: the policy's home_only)
            cohort = self._home(name) if self.policy.quotas is Quotas.REGION else "fleet"
            q = cpb.TeamQuota(team=name, cohort=cohort, quotas=[e])
            out.append(snapmod.team_quota(q))
        return tuple(out)

    def _pool_spares(self, region: str) -> dict[str, int]:
        """What a region's agent registers as ``pool_spares``: the scenario's spares per
        on-demand pool (the broker then reserves that many free nodes of each)."""
        if self.nf.spares_per_pool <= 0:
            return {}
        return {s.node.pool: self.nf.spares_per_pool for s in self.snodes
                if s.region.name == region and s.pool.kind is PoolKind.ON_DEMAND}

    def _home(self, name: str) -> str:
        known = {t.name for t in self.scn.teams}
        return (self.scn.team(name) if name in known else self._auto_team(name)).region

    def team_records(self) -> list[cpb.TeamQuota]:
        """The TeamQuota records the live broker would hold (for the equivalence test)."""
        out = []
        for t in self.teams:
            e = cpb.QuotaEntry(accelerator="", guaranteed_gpus=dict(t.guaranteed).get("", 0))
            if t.borrow_limit is not None:
                e.borrow_limit_gpus = t.borrow_limit
            out.append(cpb.TeamQuota(team=t.team, cohort=t.cohort, quotas=[e]))
        return out

    def _spec(self, tj: TraceJob) -> tuple[pb.JobSpec, int, int]:
        scn, pol = self.scn, self.policy
        team = scn.team(tj.team) if tj.team in {t.name for t in scn.teams} else self._auto_team(tj.team)
        gpn_max = scn.regions[0].gpus_per_node
        nodes = max(1, math.ceil(tj.gpus / gpn_max))
        gpn = math.ceil(tj.gpus / nodes)
        spec = pb.JobSpec(name=tj.id, team=tj.team, priority_class=team.priority_class)
        spec.resources.nodes, spec.resources.gpus_per_node = nodes, gpn
        if nodes > 1 and pol.topology:
            spec.topology.required = _LEVEL[scn.gang_required]
            spec.topology.preferred = _LEVEL[scn.gang_preferred]
        if pol.home_only:
            spec.allowed_regions.append(team.region)
        else:
            spec.preferred_regions.extend(self._region_order(team.region))
        kinds = [pb.CAPACITY_TYPE_ON_DEMAND, pb.CAPACITY_TYPE_TRAINING_PLAN]
        if pol.spot and tj.gpus <= scn.spot_for_gpus_at_most:
            kinds.append(pb.CAPACITY_TYPE_SPOT)
        spec.capacity_types.extend(kinds)
        # the estimate a user would state, never the trace's truth (simulator/estimates.py)
        spec.expected_duration_s = estimates.estimate(
            estimates.EstimateModel(scn.duration_estimate), tj.duration_s, tj.id, self.seed,
            sigma=scn.estimate_sigma, padding=scn.estimate_padding)
        if self.nf.elastic_jobs and nodes > 1:  # may run (and shrink) down to one node
            spec.elasticity.min_nodes, spec.elasticity.max_nodes = 1, nodes
        spec.trainer.checkpoint_every = max(1, int(scn.checkpoint.interval_s))
        spec.trainer.step_sleep_s = 1.0
        if self.nf.memory_every:  # the memory tier: the broker's relaunch rule reads it
            spec.trainer.options[live_node_recovery.MEMORY_OPTION] = str(self.nf.memory_every)
        return spec, nodes, gpn

    def _auto_team(self, name: str):  # noqa: ANN202 - a Team for a trace team the scenario omits
        names = sorted({j.team for j in self.trace} - {t.name for t in self.scn.teams})
        region = self.scn.unknown_team_region or self.region_names[names.index(name) % len(self.region_names)]
        return dataclasses.replace(self.scn.team(name), region=region)

    def _region_order(self, first: str) -> list[str]:
        i = self.region_names.index(first)
        return self.region_names[i:] + self.region_names[:i]

    # ---- events ------------------------------------------------------------------------
    def push(self, t: float, kind: int, payload: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, 1 if kind == TICK else 0, self.seq, kind, payload))

    def wake(self) -> None:
        """WakeScheduler: one pass at the next point of the scheduler's interval grid
        (the next one, not this one, when the request comes from a pass itself)."""
        if self.tick_at >= self.now:
            return  # a pass is already due
        iv = self.scn.scheduler_interval_s
        t = math.ceil(self.now / iv) * iv
        if self.in_tick and t <= self.now:
            t = self.now + iv
        self.tick_at = t
        self.push(t, TICK)

    def _exp(self, process: Process, node_id: str, rate_per_h: float) -> float:
        return self.streams.exp_s(process, node_id, rate_per_h)

    def _seed_processes(self) -> None:
        for tj in self.trace:
            self.push(T0 + tj.submit_s, SUBMIT, tj)
        for s in self.snodes:
            r, p = s.region, s.pool
            if self._mtbf(s) > 0:
                self.push(T0 + self._exp(Process.NODE_FAIL, s.node.id, 1.0 / self._mtbf(s)), NODE_FAIL, s.node.id)
            if r.hang_mtbf_h > 0:
                self.push(T0 + self._exp(Process.HANG, s.node.id, 1.0 / r.hang_mtbf_h), HANG, s.node.id)
            if p.kind is PoolKind.SPOT and p.interruptions_per_node_hour > 0:
                self.push(T0 + self._exp(Process.SPOT, s.node.id, p.interruptions_per_node_hour) + p.notice_s,
                          SPOT_NOTICE, s.node.id)
        for plan in self.plans:
            self.push(plan.start_time, PLAN_START, plan.id)
            self.push(max(plan.start_time, plan.end_time - PLAN_LEAD_S), PLAN_ENDING, plan.id)
            self.push(plan.end_time, PLAN_END, plan.id)
        for w in self.scn.outages:
            self.push(T0 + w.start_s, REGION_OUT, w.region)
            self.push(T0 + w.end_s, REGION_BACK, w.region)
        for w in self.scn.reclaims:
            self.push(T0 + w.start_s, RECLAIM_ON, w)
        for w in self.scn.drains:
            self.push(T0 + w.start_s, DRAIN_ON, w.region)
            self.push(T0 + w.end_s, DRAIN_OFF, w.region)
        self.push(T0, SAMPLE)

    def run(self) -> Simulation:
        """Simulate until every job ended; raise :class:`SimError` if one never does."""
        self.start()
        self.advance()
        self._account_teams()
        total = len(self.trace)
        if self.finished != total or self.queued or self.holding:
            raise SimError(f"{total - self.finished} job(s) never ended ({len(self.queued)} queued,"
                           f" {len(self.holding)} holding GPUs)")
        return self

    def start(self) -> None:
        self._seed_processes()
        self.finished = 0
        self._done_mark = 0

    def advance(self, until: float | None = None) -> None:
        """Process events in time order until all jobs ended (or the clock passes ``until``)."""
        handlers = {SUBMIT: self._submit, RUN: self._running, FINISH: self._finish,
                    STOP_DONE: self._stop_done, SPOT_NOTICE: self._spot_notice,
                    SPOT_RECLAIM: self._spot_reclaim, SPOT_RETURN: self._spot_return,
                    NODE_FAIL: self._node_fail, NODE_REPAIR: self._node_repair, HANG: self._hang,
                    HANG_DETECT: self._hang_detect, REGION_OUT: self._region_out,
                    REGION_BACK: self._region_back, DRAIN_ON: self._drain_on, DRAIN_OFF: self._drain_off,
                    PLAN_START: self._plan_start, PLAN_ENDING: self._plan_ending, PLAN_END: self._plan_end,
                    SAMPLE: self._sample, TICK: self._tick, RECLAIM_ON: self._reclaim_on}
        total = len(self.trace)
        heap, pop = self.heap, heapq.heappop
        last_sub = max((tj.submit_s for tj in self.trace), default=0.0) + T0
        mark, mark_t = (self.finished, len(self.holding)), self.now
        while heap and self.finished < total:
            if until is not None and heap[0][0] > until:
                self.now = until
                return
            t, _, _, kind, payload = pop(heap)
            self.now = t
            self.events += 1
            handlers[kind](payload)
            if self.events % 4096 == 0:  # a queue that can never run would tick forever
                state = (self.finished, len(self.holding))
                if state != mark:
                    mark, mark_t = state, t
                elif not self.holding and t > last_sub and t - mark_t > STALL_HORIZON_S:
                    stuck = sorted(self.queued)[:5]
                    raise SimError(
                        f"{len(self.queued)} job(s) can never run (nothing ran for "
                        f"{STALL_HORIZON_S / 86400:.0f} simulated days after the last submit), "
                        f"e.g. {', '.join(stuck)}: a job larger than any region or its team's "
                        "static quota? Check the scenario's quotas and the trace's sizes")
            if self.progress is not None and self.finished - self._done_mark >= 500:
                self._done_mark = self.finished
                self.progress(self.finished / max(1, total))

    # ---- applying transitions (the simulated agent executes the commands) ----------------
    def apply(self, sj: SimJob, out: Outcome | None) -> bool:
        if out is None:
            return False
        old = sj.job.phase
        sj.job = out.job
        sj.req = sj.run = None
        if out.job.HasField("shrunk") and sj.tj.id not in self.small:  # below its size:
            self.small.add(sj.tj.id)  # the pass looks at it (growing back)
            route = below_size.route_of(out.job).value
            sj.small_routes[route] = sj.small_routes.get(route, 0) + 1
        ph = out.job.phase
        if ph in QUEUED:
            self.queued[sj.tj.id] = sj
            if sj.queued_t < 0:
                sj.queued_t = self.now
        else:
            self.queued.pop(sj.tj.id, None)
            if sj.queued_t >= 0:
                sj.wait_s += self.now - sj.queued_t
                sj.queued_t = -1.0
        for c in out.commands:
            if isinstance(c, WakeScheduler):
                self.wake()
            elif isinstance(c, SendLaunch):
                self._launch(sj)
            elif isinstance(c, SendStop):
                self._agent_stop(sj, c, old)
        if ph in TERMINAL and not sj.ended:
            sj.ended = 1
            sj.finish_t = self.now - T0
            self.finished += 1
        return True

    def _shared(self, key: object, nbytes: float, own_gbps: float, shared_gbps: float, t: float) -> float:
        """When ``nbytes`` started at ``t`` are through a shared pipe (a region's store, an
        inter-region link): one job moves at most at ``own_gbps``; the pipe carries
        ``shared_gbps`` for everyone, in turn (first come, first served), so a burst of
        checkpoints or transfers waits for the ones ahead of it."""
        start = max(t, self.pipe_free.get(key, 0.0))
        done = start + nbytes / (shared_gbps * 1e9)
        self.pipe_free[key] = done
        return max(t + nbytes / (own_gbps * 1e9), done)

    def _launch(self, sj: SimJob) -> None:
        ck = self.scn.checkpoint
        region = sj.job.placement.region
        t = self.now
        if sj.mem_point is not None and sj.job.node_recovery.plan in _FROM_MEMORY:
            self._launch_from_memory(sj)
            return
        sj.mem_point = None
        if sj.durable > 0:
            if sj.ckpt_region and sj.ckpt_region != region:
                gbps = self.scn.bandwidth(sj.ckpt_region, region)
                t = self._shared(("link", *sorted((sj.ckpt_region, region))), sj.ckpt_bytes, gbps, gbps, t)
            t = self._shared(("store", region), sj.ckpt_bytes, ck.read_gbps, ck.store_gbps, t)
        delay = t - self.now + ck.process_start_s
        self._charge(sj, sj.next_cost, delay * sj.held)
        self.push(self.now + delay, RUN, (sj, sj.epoch))

    def _launch_from_memory(self, sj: SimJob) -> None:
        """An in-place relaunch after a node loss: the survivors and the spare resume from
        the last in-memory snapshot (the spare reads the lost node's shard from its buddy
        after joining), not from the periodic checkpoint the failure was charged back to."""
        fail_t, wall_ckpt, wall_mem, work_mem, bucket, held = sj.mem_point
        sj.mem_point = None
        sj.lost[bucket] = sj.lost.get(bucket, 0.0) - (fail_t - wall_ckpt) * held  # not lost after all
        self._charge(sj, NODE_REPLACED, (fail_t - wall_mem) * held)
        sj.durable = max(sj.durable, work_mem)
        shard = sj.ckpt_bytes / max(1, sj.nodes)
        delay = self.nf.rejoin_s + shard / (self.nf.peer_gbps * 1e9)
        self._charge(sj, NODE_REPLACED, delay * sj.held)
        self.push(self.now + delay, RUN, (sj, sj.epoch))

    def _agent_stop(self, sj: SimJob, c: SendStop, old_phase: int) -> None:
        if c.checkpoint_first and sj.job.phase not in QUEUED:
            # The trainer saves now; progress stops; the write decides saved or not.
            ck = self.scn.checkpoint
            key = ("store", sj.region)
            before = self.pipe_free.get(key, 0.0)
            write = self._shared(key, sj.ckpt_bytes, ck.write_gbps, ck.store_gbps, self.now) - self.now
            if write > c.grace_s:  # cut off at the grace: the store is free from then on
                self.pipe_free[key] = max(before, self.now + c.grace_s) if before < self.now + c.grace_s \
                    else before
            sj.stop_work = self._work_of(sj, self.now)
            sj.stop_t = self.now
            sj.hang_t = self.now  # progress is frozen from here (no FINISH while stopping)
            sj.epoch += 1
            saved = write <= c.grace_s
            self.push(self.now + (write if saved else c.grace_s), STOP_DONE, (sj, sj.epoch, saved))
            return
        # Killed without a checkpoint of its own (or never started): GPUs free now.
        self._lose(sj, old_phase)
        self._release(sj)

    # ---- work model ----------------------------------------------------------------------
    def _work_of(self, sj: SimJob, t: float) -> float:
        if sj.run_t0 < 0:
            return sj.durable
        end = sj.hang_t if sj.hang_t >= 0 else t
        return min(sj.tj.duration_s, sj.durable + max(0.0, end - sj.run_t0) * sj.speed)

    def _periodic(self, sj: SimJob, t: float, every_s: float | None = None) -> tuple[float, float]:
        """(wall time, work) of the last periodic durable checkpoint of this attempt (or
        of the last in-memory snapshot, taken every ``every_s`` of running)."""
        if sj.run_t0 < 0:
            return 0.0, sj.durable
        iv = self.scn.checkpoint.interval_s if every_s is None else every_s
        end = sj.hang_t if sj.hang_t >= 0 else t
        k = math.floor(max(0.0, end - sj.run_t0) / iv) if iv > 0 else 0
        wall = sj.run_t0 + k * iv
        return wall, min(sj.tj.duration_s, sj.durable + k * iv * sj.speed)

    def _note_checkpoint(self, sj: SimJob) -> None:
        """What the agent last reported: the attempt's latest periodic checkpoint."""
        wall, work = self._periodic(sj, self.now)
        if sj.run_t0 >= 0 and wall > sj.run_t0:
            sj.job.last_checkpoint_time = wall
            sj.durable, sj.run_t0 = work, wall
            sj.ckpt_region = sj.region
            if sj.job.phase == RUNNING:
                sj.job.attempt_started_time = max(sj.job.attempt_started_time, 0.0)

    def _lose(self, sj: SimJob, old_phase: int) -> None:
        """The attempt ends without its own checkpoint: keep the periodic one."""
        if old_phase == RUNNING or sj.run_t0 >= 0:
            wall, work = self._periodic(sj, self.now)
            lost_wall = self.now - wall
            cause = sj.stop_cause.value if sj.stop_cause else "failure"
            self._charge(sj, cause, lost_wall * sj.held)
            if work > sj.durable:
                sj.ckpt_region = sj.region
            sj.durable = work
        sj.next_cost = sj.stop_cause.value if sj.stop_cause else "failure"

    def _charge(self, sj: SimJob, bucket: str, gpu_s: float) -> None:
        if gpu_s > 0:
            sj.lost[bucket] = sj.lost.get(bucket, 0.0) + gpu_s

    # ---- holding GPUs ----------------------------------------------------------------------
    def _hold(self, sj: SimJob, adm: placement.Admission) -> None:
        sj.alloc = adm.assignments
        sj.region = adm.region
        sj.ctype = int(adm.capacity_type)
        sj.price = adm.price_per_gpu_hour
        sj.admit_t = self.now
        self._account_teams()
        for n, g in adm.assignments:
            self.used[n] += g
            self.on_node[n].add(sj.tj.id)
            if self.used[n] > self.node[n].node.gpus:
                raise SimError(f"node {n} over-allocated: {self.used[n]} > {self.node[n].node.gpus} GPUs")
        self.holding[sj.tj.id] = sj
        self.region_used[sj.region] += sj.held
        self.team_used[sj.tj.team] += sj.held

    def _release(self, sj: SimJob) -> None:
        if sj.tj.id not in self.holding:
            return
        self._account_teams()
        dt = self.now - sj.admit_t
        held = sj.held
        sj.alloc_gpu_s += dt * held
        kind = _KIND.get(sj.ctype, "on_demand")
        if kind != "plan":
            sj.cost[kind] = sj.cost.get(kind, 0.0) + dt * held * sj.price / 3600.0
        for n, g in sj.alloc:
            self.used[n] -= g
            self.on_node[n].discard(sj.tj.id)
        del self.holding[sj.tj.id]
        self.region_used[sj.region] -= held
        self.team_used[sj.tj.team] -= held
        sj.run_t0 = -1.0
        sj.hang_t = -1.0
        sj.epoch += 1
        sj.alloc = ()
        self.moving.discard(sj.tj.id)

    def _account_teams(self) -> None:
        dt = self.now - self._last_team_t
        if dt > 0:
            for team, g in self.team_used.items():
                if g:
                    self.team_gpu_s[team] += g * dt
        self._last_team_t = self.now

    # ---- handlers ------------------------------------------------------------------------
    def _submit(self, tj: TraceJob) -> None:
        spec, nodes, gpn = self._spec(tj)
        job = transitions.submit(transitions.Submit(tj.id, spec, "", "sim", True), self.now, self.cfg).job
        gpus = nodes * gpn
        ck = self.scn.checkpoint
        sj = SimJob(tj, nodes, gpn, job, self.cfg.priority_classes.get(spec.priority_class, 0),
                    ckpt_bytes=ck.bytes_per_gpu * gpus)
        self.sj[tj.id] = sj
        self.queued[tj.id] = sj
        sj.queued_t = self.now
        if tj.duration_s <= 0:  # nothing to run: it ends at once (counted, never placed)
            self.apply(sj, _succeed_pending(job, self.now))
            return
        why = self._never_fits(sj)
        if why:  # reported per job (metrics "unplaceable"); the run goes on without it
            sj.unplaceable = why
            self.apply(sj, _fail_pending(job, self.now, why))
            return
        self.wake()

    def _never_fits(self, sj: SimJob) -> str:
        """Why no state of the fleet could ever run this job, or "".

        Why here and not a stall detector: a job larger than every topology block (or
        every region it may use, or its team's static quota) would wait forever; found at
        submit, it is named with its real cause and the other jobs' results still count."""
        spec = sj.job.spec
        home_only = bool(spec.allowed_regions)
        key = (sj.nodes, sj.gpn, tuple(spec.allowed_regions), tuple(spec.capacity_types),
               spec.topology.required, sj.tj.team if self.policy.quotas is Quotas.STATIC else "")
        hit = self._fit_memo.get(key)
        if hit is not None:
            return hit
        level = {v: k for k, v in _LEVEL.items()}.get(spec.topology.required, "none")
        attr = {"ultraserver": "ultraserver_id", "layer_3": "network_layer_3",
                "layer_2": "network_layer_2"}.get(level)
        best = 0  # most nodes with room for one rank in one allowed block
        for region in (spec.allowed_regions if home_only else self.region_names):
            blocks: dict[str, int] = defaultdict(int)
            for s in self.snodes:
                n = s.node
                if n.region == region and n.gpus >= sj.gpn and n.capacity_type in spec.capacity_types:
                    blocks[getattr(n, attr) if attr else region] += 1
            best = max(best, *blocks.values(), 0)
        why = ""
        where = f"its home region {spec.allowed_regions[0]}" if home_only else "any region"
        if best < sj.nodes:
            block = {"ultraserver": "UltraServer", "layer_3": "layer-3 block",
                     "layer_2": "layer-2 block"}.get(level, "region")
            why = (f"needs {sj.nodes} node(s) of {sj.gpn} GPUs in one {block}; the largest {block} in"
                   f" {where} has {best} such node(s)"
                   + (f" (scenario gang_required: {self.scn.gang_required})" if attr else ""))
        elif self.policy.quotas is Quotas.STATIC:
            quota = next((dict(t.guaranteed).get("", 0) for t in self.teams if t.team == sj.tj.team), 0)
            if sj.gpus > quota:
                why = (f"needs {sj.gpus} GPUs; team {sj.tj.team}'s static quota is {quota} GPUs"
                       " and static quotas never borrow")
        self._fit_memo[key] = why
        return why

    def _running(self, payload) -> None:  # noqa: ANN001
        sj, epoch = payload
        if epoch != sj.epoch or sj.job.phase != LAUNCHING:
            return
        u = apb.JobUpdate(job_id=sj.tj.id, attempt=sj.job.attempt, state=apb.ATTEMPT_STATE_RUNNING)
        self.apply(sj, updates.progress(sj.job, updates.AgentUpdate(sj.job.placement.agent_id, u), self.now,
                                        self.cfg))
        sj.run_t0 = self.now
        if sj.first_start < 0:
            sj.first_start = self.now
        if self.nf.grow_back and sj.job.HasField("shrunk"):
            self.wake()  # below its size: the next pass looks for room to grow back
        sj.speed = self._speed(sj)
        left = (sj.tj.duration_s - sj.durable) / sj.speed
        self.push(self.now + left, FINISH, (sj, sj.epoch))

    def _speed(self, sj: SimJob) -> float:
        """Work per second: the share of its nodes it runs on, times the topology's."""
        return sj.frac * self._topology_speed(sj)

    def _topology_speed(self, sj: SimJob) -> float:
        if len(sj.alloc) <= 1:
            return 1.0
        ns = [self.node[n].node for n, _ in sj.alloc]
        for level, attr in (("ultraserver", "ultraserver_id"), ("layer_3", "network_layer_3"),
                            ("layer_2", "network_layer_2")):
            if len({getattr(n, attr) for n in ns}) == 1:
                return self.slow.get(level, 1.0)
        return self.slow.get("cluster", 1.0)

    def _finish(self, payload) -> None:  # noqa: ANN001
        sj, epoch = payload
        if epoch != sj.epoch or sj.job.phase != RUNNING:
            return
        wall = (self.now - sj.run_t0)
        self._charge(sj, TOPOLOGY, (wall - (sj.tj.duration_s - sj.durable) / sj.frac) * sj.held)
        sj.durable = sj.tj.duration_s
        u = apb.JobUpdate(job_id=sj.tj.id, attempt=sj.job.attempt, state=apb.ATTEMPT_STATE_SUCCEEDED)
        self._release(sj)
        self.apply(sj, updates.attempt_ended(sj.job, updates.AgentUpdate(sj.job.placement.agent_id, u),
                                             self.now, self.cfg))

    def _stop_done(self, payload) -> None:  # noqa: ANN001
        sj, epoch, saved = payload
        if epoch != sj.epoch or sj.job.phase not in HOLDING:
            return
        cause = sj.stop_cause.value if sj.stop_cause else "preemption"
        self._charge(sj, cause, (self.now - sj.stop_t) * sj.held)  # GPUs held while saving
        if saved:
            ran = sj.stop_work - sj.durable
            self._charge(sj, TOPOLOGY, ((sj.stop_t - sj.run_t0) - ran / sj.frac) * sj.held)
            sj.durable = sj.stop_work
            sj.ckpt_region = sj.region
            sj.job.last_checkpoint_time = self.now
        else:  # the grace ran out: back to the last periodic checkpoint
            wall, work = self._periodic(sj, sj.stop_t)
            self._charge(sj, cause, (sj.stop_t - wall) * sj.held)
            if work > sj.durable:
                sj.ckpt_region = sj.region
            sj.durable = work
        sj.next_cost = cause
        state = apb.ATTEMPT_STATE_CHECKPOINTED if saved else apb.ATTEMPT_STATE_STOPPED
        u = apb.JobUpdate(job_id=sj.tj.id, attempt=sj.job.attempt, state=state)
        agent = sj.job.placement.agent_id
        self._release(sj)
        self.apply(sj, updates.attempt_ended(sj.job, updates.AgentUpdate(agent, u), self.now, self.cfg))

    def trigger(self, sj: SimJob, sig: Signal, actor: str = "sim") -> bool:
        """What ``JobOps.trigger`` does live: ``recovery.plan_stop`` plans the stop (the
        broker config's recovery policy is this policy's), ``transitions.request_stop``
        applies it. In between, the simulated agent reports its last periodic checkpoint
        (as a progress update would have before the trigger)."""
        if sj.job.phase not in HOLDING or sj.job.stop_reason:
            return False
        plan = plan_stop(sig, sj.job, self.cfg, self.now)
        if plan is None:
            return False
        self._note_checkpoint(sj)
        old = sj.job.phase
        sj.stop_cause = plan.cause
        if self.policy.rotate_region_on_failure and sj.region:
            order = self._region_order(sj.region)
            del sj.job.spec.preferred_regions[:]
            sj.job.spec.preferred_regions.extend(order[1:] + order[:1])
        out = transitions.request_stop(sj.job, transitions.StopRequest(plan, actor, sig.trigger.value),
                                       self.now, self.cfg)
        if out is None:
            return False
        if plan.family.value == "preemption":
            sj.preemptions += 1
        elif plan.checkpoint_first and old == RUNNING:
            sj.migrations += 1
        self.apply(sj, out)
        return True

    def lost(self, sj: SimJob, trig: Trigger, cause: Cause) -> None:
        """The attempt is gone (node reclaimed, region down): ``transitions.attempt_lost``."""
        if sj.job.phase not in HOLDING:
            return
        self._note_checkpoint(sj)
        plan = plan_stop(Signal(trig), sj.job, self.cfg, self.now)
        old = sj.job.phase
        if sj.stop_cause is None or not sj.job.stop_reason:
            sj.stop_cause = cause
        self._lose(sj, old)
        agent = sj.job.placement.agent_id
        self._release(sj)
        self.apply(sj, transitions.attempt_lost(sj.job, transitions.AttemptLost(agent, plan, cause.text),
                                                self.now, self.cfg))

    def failed(self, sj: SimJob, node_id: str) -> None:
        """A node failed under the job: the agent reports the attempt FAILED, its rank on
        that node killed (exit -9, the node blamed), as a real agent does; it spends the
        job's max_node_failures, not max_restarts (broker/jobs/budgets.py)."""
        if sj.job.phase not in HOLDING:
            return
        self._note_checkpoint(sj)
        sj.stop_cause = Cause.ATTEMPT_FAILED
        self._lose(sj, sj.job.phase)
        agent = sj.job.placement.agent_id
        u = apb.JobUpdate(job_id=sj.tj.id, attempt=sj.job.attempt, state=apb.ATTEMPT_STATE_FAILED,
                          exit_code=-9, failed_nodes=[node_id], message="node failed")
        self._release(sj)
        self.apply(sj, updates.attempt_ended(sj.job, updates.AgentUpdate(agent, u), self.now, self.cfg))

    def _jobs_on(self, node_id: str) -> list[SimJob]:
        return [self.sj[j] for j in sorted(self.on_node.get(node_id, ()))]

    def _set_node(self, node_id: str, **kw) -> None:  # noqa: ANN003
        n = self.node[node_id].node
        for k, v in kw.items():
            setattr(n, k, v)
        self.ninfo.pop(node_id, None)
        self.nodes_t = None
        self.wake()

    def _spot_notice(self, node_id: str) -> None:
        s = self.node[node_id]
        if node_id not in self.present or not s.node.healthy:
            self.push(self.now + self._exp(Process.SPOT, node_id, s.pool.interruptions_per_node_hour), SPOT_NOTICE,
                      node_id)
            return
        deadline = self.now + s.pool.notice_s
        self._set_node(node_id, cordoned=True)
        for sj in self._jobs_on(node_id):
            self.trigger(sj, Signal(Trigger.SPOT_NOTICE, nodes=(node_id,), deadline=deadline))
        self.push(deadline, SPOT_RECLAIM, node_id)

    def _spot_reclaim(self, payload) -> None:  # noqa: ANN001 - node id, or (node id, back at)
        node_id, back = payload if isinstance(payload, tuple) else (payload, None)
        self._set_node(node_id, healthy=False)
        for sj in self._jobs_on(node_id):
            self.lost(sj, Trigger.AGENT_LOST, Cause.SPOT_INTERRUPTION)
        if back is not None:
            self.push(back, SPOT_RETURN, (node_id, False))
        else:
            self.push(self.now + self.node[node_id].pool.return_after_s, SPOT_RETURN, (node_id, True))

    def _spot_return(self, payload) -> None:  # noqa: ANN001
        node_id, again = payload
        s = self.node[node_id]
        self._set_node(node_id, healthy=s.region.name not in self.down_regions, cordoned=False)
        if again:
            self.push(self.now + self._exp(Process.SPOT, node_id, s.pool.interruptions_per_node_hour) + s.pool.notice_s,
                      SPOT_NOTICE, node_id)

    def _reclaim_on(self, w) -> None:  # noqa: ANN001 - a scheduled reclaim of a region's spot nodes
        for s in self.snodes:
            if s.region.name != w.region or s.pool.kind is not PoolKind.SPOT or not s.node.healthy:
                continue
            deadline = self.now + s.pool.notice_s
            self._set_node(s.node.id, cordoned=True)
            for sj in self._jobs_on(s.node.id):
                self.trigger(sj, Signal(Trigger.SPOT_NOTICE, nodes=(s.node.id,), deadline=deadline))
            self.push(deadline, SPOT_RECLAIM, (s.node.id, T0 + w.end_s))

    def _mtbf(self, s: fleet.SimNode) -> float:
        return self.nf.node_mtbf_h(s.region.gpus_per_node, s.region.node_mtbf_h)

    def _node_fail(self, node_id: str) -> None:
        s = self.node[node_id]
        if s.node.healthy:
            self._set_node(node_id, healthy=False)
            for sj in self._jobs_on(node_id):
                self._recover(sj, node_id)
            self.push(self.now + s.region.repair_s, NODE_REPAIR, node_id)
        elif self._mtbf(s) > 0:
            self.push(self.now + self._exp(Process.NODE_FAIL, node_id, 1.0 / self._mtbf(s)), NODE_FAIL, node_id)

    def _node_repair(self, node_id: str) -> None:
        s = self.node[node_id]
        if s.region.name not in self.down_regions:
            self._set_node(node_id, healthy=True)
        if self._mtbf(s) > 0:
            self.push(self.now + self._exp(Process.NODE_FAIL, node_id, 1.0 / self._mtbf(s)), NODE_FAIL, node_id)

    def _recover(self, sj: SimJob, node_id: str) -> None:
        """A node failed under ``sj``: the agent reports the attempt FAILED, blaming the
        node (the broker records the loss and queues the job); the next pass asks the
        broker's recovery policy how it comes back (:meth:`_relaunch_lost`). A running job
        with the memory tier keeps what an in-place relaunch would restore from memory."""
        running = sj.job.phase == RUNNING and not sj.job.stop_reason and sj.hang_t < 0 and sj.run_t0 >= 0
        point = None
        if running and self.nf.memory_every:
            wall_ckpt, _ = self._periodic(sj, self.now)
            wall_mem, work_mem = self._periodic(sj, self.now, self.nf.memory_snapshot_s)
            point = (self.now, wall_ckpt, wall_mem, work_mem, Cause.ATTEMPT_FAILED.value, sj.held)
        self.failed(sj, node_id)
        sj.mem_point = point
        if live_node_recovery.undecided(sj.job):
            self.undecided.add(sj.tj.id)

    def _hang(self, node_id: str) -> None:
        s = self.node[node_id]
        for sj in self._jobs_on(node_id):
            if sj.job.phase == RUNNING and sj.hang_t < 0 and not sj.job.stop_reason:
                sj.hang_t = self.now
                sj.epoch += 1  # no FINISH: no progress while hung
                self.push(self.now + s.region.hang_detect_s, HANG_DETECT, (sj, sj.epoch))
        self.push(self.now + self._exp(Process.HANG, node_id, 1.0 / s.region.hang_mtbf_h), HANG, node_id)

    def _hang_detect(self, payload) -> None:  # noqa: ANN001
        sj, epoch = payload
        if epoch != sj.epoch or sj.hang_t < 0:
            return
        if not self.trigger(sj, Signal(Trigger.HANG, nodes=tuple(n for n, _ in sj.alloc))):
            return

    def _region_out(self, region: str) -> None:
        self.down_regions.add(region)
        for s in self.snodes:
            if s.region.name == region:
                self._set_node(s.node.id, healthy=False)
        for sj in sorted(self.holding.values(), key=lambda j: j.tj.id):
            if sj.region == region:
                self.lost(sj, Trigger.AGENT_LOST, Cause.AGENT_LOST)

    def _region_back(self, region: str) -> None:
        self.down_regions.discard(region)
        for s in self.snodes:
            if s.region.name == region:
                self._set_node(s.node.id, healthy=True, cordoned=False)

    def _drain_on(self, region: str) -> None:
        self.draining.add(region)
        self.wake()
        for sj in sorted(self.holding.values(), key=lambda j: j.tj.id):
            if sj.region == region:
                self.trigger(sj, Signal(Trigger.REGION_DRAIN))

    def _drain_off(self, region: str) -> None:
        self.draining.discard(region)
        self.wake()

    def _plan_nodes(self, plan_id: str) -> list[str]:
        return [s.node.id for s in self.snodes if s.node.pool == plan_id]

    def _plan_start(self, plan_id: str) -> None:
        for n in self._plan_nodes(plan_id):
            self.present.add(n)
            self.region_gpus[self.node[n].region.name] += self.node[n].node.gpus
        self.nodes_t = None
        self.wake()

    def _plan_ending(self, plan_id: str) -> None:
        plan = self.plan_map[plan_id]
        nodes = set(self._plan_nodes(plan_id))
        for sj in sorted(self.holding.values(), key=lambda j: j.tj.id):
            if any(n in nodes for n, _ in sj.alloc):
                self.trigger(sj, Signal(Trigger.PLAN_ENDING, nodes=tuple(sorted(nodes)),
                                        seconds_left=plan.end_time - self.now))

    def _plan_end(self, plan_id: str) -> None:
        nodes = set(self._plan_nodes(plan_id))
        for sj in sorted(self.holding.values(), key=lambda j: j.tj.id):
            if any(n in nodes for n, _ in sj.alloc):
                self.lost(sj, Trigger.AGENT_LOST, Cause.PLAN_ENDING)
        for n in nodes:
            self.present.discard(n)
            self.region_gpus[self.node[n].region.name] -= self.node[n].node.gpus
        self.nodes_t = None
        self.wake()

    def _sample(self, _payload: object) -> None:
        self.push(self.now + SAMPLE_S, SAMPLE)
        self.samples.append({
            "t": self.now - T0,
            "used": {r: self.region_used[r] for r in self.region_names},
            "capacity": {r: self.region_gpus[r] for r in self.region_names},
            "queued": len(self.queued),
        })

    # ---- the scheduler pass -----------------------------------------------------------------
    def node_infos(self) -> tuple[placement.NodeInfo, ...]:
        if self.nodes_t is None:
            out = []
            for nid in sorted(self.present):
                ni = self.ninfo.get(nid)
                if ni is None:
                    s = self.node[nid]
                    ni = snapmod.node_info(self.agents[s.region.name], s.node, self.plan_map)
                    if not self.policy.topology:
                        ni = dataclasses.replace(ni, layer1="", layer2="", layer3="", ultraserver="")
                    self.ninfo[nid] = ni
                out.append(ni)
            self.nodes_t = tuple(out)
        return self.nodes_t

    def snapshot(self) -> placement.Snapshot:
        """The scheduler's input, built incrementally with the broker's converters."""
        pending, running = [], []
        for sj in self.queued.values():
            if sj.req is None:
                sj.req = self._interned(snapmod.job_request(sj.job, sj.prio))
            pending.append(sj.req)
        for sj in self.holding.values():
            if sj.run is None:
                sj.run = snapmod.running_job(sj.job, sj.prio, self.rules)
            running.append(sj.run)
        nodes, reserved = self.node_infos(), frozenset()
        if self.per_pool:
            nodes, reserved = self._with_spares(nodes, running)
        return placement.Snapshot(now=self.now, nodes=nodes, running=tuple(running),
                                  pending=tuple(pending), teams=self.teams,
                                  draining_regions=frozenset(self.draining), spares=reserved)

    def _with_spares(self, nodes: tuple[placement.NodeInfo, ...],
                     running: list[placement.RunningJob]) -> tuple[tuple[placement.NodeInfo, ...], frozenset[str]]:
        """The live builder's spares (``spares.reserved`` with the same inputs: nodes in
        use, the nodes of jobs waiting for a relaunch plan, the nodes jobs blame), cordoned
        so that ordinary placement leaves them alone."""
        used = {n for r in running for n, _ in r.allocations}
        held: set[str] = set()
        for jid in self.undecided:
            rec = self.sj[jid].job.node_recovery
            held.update(rec.survivors)
            held.update(rec.lost_nodes)
        blamed = {n for js in (self.queued, self.holding) for sj in js.values() for n in sj.job.excluded_nodes}
        reserved = spares_mod.reserved(nodes, self.per_pool, used, held, blamed)
        memo = self._spares_memo
        if memo and memo[0] is nodes and memo[1] == reserved:
            return memo[2], reserved
        out = tuple(dataclasses.replace(n, cordoned=True) if n.id in reserved else n for n in nodes)
        self._spares_memo = (nodes, reserved, out)
        return out, reserved

    def _interned(self, req: placement.JobRequest) -> placement.JobRequest:
        """The same request with its region / capacity sets shared with every equal one:
        the engine's caches key on them, and equal-but-distinct sets are compared
        element by element on every lookup (equal values: the same decisions)."""
        seen = self._seen
        kw = {}
        for f in ("allowed_regions", "denied_regions", "preferred_regions", "capacity_types"):
            v = getattr(req, f)
            kw[f] = seen.setdefault(v, v)
        return dataclasses.replace(req, **kw)

    def live_snapshot(self) -> placement.Snapshot:
        """The same state through the live broker's builder (``snapshot.build``), for the
        equivalence test: connected agents registering these nodes, the jobs as stored."""
        agents = []
        for r in self.scn.regions:
            rec = apb.Register(agent_id=fleet.agent_of(r.name), region=r.name,
                               nodes=[self.node[n].node for n in sorted(self.present)
                                      if self.node[n].region.name == r.name],
                               pool_spares=self._pool_spares(r.name))
            agents.append(AgentState(rec.agent_id, rec, last_seen=self.now, session=AgentSession(rec.agent_id)))
        jobs = [sj.job for sj in self.sj.values() if sj.job.phase not in TERMINAL]
        return snapmod.build(now=self.now, agents=agents, jobs=jobs, teams=self.team_records(),
                             plans=self.plans, draining=sorted(self.draining),
                             priority_of=lambda s: self.cfg.priority_classes.get(s.priority_class, 0),
                             preemption=self.rules)

    def _tick(self, _payload: object) -> None:
        if self.now != self.tick_at:
            return
        self.tick_at = -1.0
        if self.check:
            self.check_conservation()
        self._forgive_exclusions()
        if self.undecided:
            self._relaunch_lost()
        growing = self.nf.grow_back and self.small
        if growing:
            self._relaunch_grown()
        if not self.queued and not growing and (self.policy.proactive is Proactive.NONE or not self.holding):
            return  # nothing to place (a proactive policy still looks for better homes)
        snap = self.snapshot()
        dec = self.decide(snap)
        self.passes += 1
        self.in_tick = True
        try:
            self.apply_decisions(snap, dec)
            if growing:
                self._grow_check(snap, dec)
        finally:
            self.in_tick = False
        self.small = {j for j in self.small if j in self.sj and below_size.is_shrunk(self.sj[j].job)}

    # ---- growing back (the live pass's grow_watch steps, called as they are) ---------------
    def _relaunch_grown(self) -> None:
        """Before placement: each job stopped to grow back is admitted at once on its
        full-size nodes, or left to ordinary placement if they were taken."""
        todo = [self.sj[j].job for j in sorted(self.small) if j in self.queued
                and grow_back.relaunch_due(self.sj[j].job)]
        if todo:
            self.in_tick = True
            try:
                grow_watch.relaunch_grown(_GrowOps(self), todo, self.snapshot())
            finally:
                self.in_tick = False

    def _grow_check(self, snap: placement.Snapshot, dec: placement.Decisions) -> None:
        """After placement: each running job below its size asks its policy (settle time,
        rate limit, quota) and grows back checkpoint first, or says why not. While one
        has seen capacity (settling, rate-limited) the next pass is asked for, as the live
        loop's one-second passes would look again."""
        live = [self.sj[j].job for j in sorted(self.small)
                if j in self.holding and self.sj[j].job.phase == RUNNING]
        if not live:
            return
        grow_watch.check(_GrowOps(self), live, snap, dec)
        if any(self.sj[j.id].job.phase == RUNNING and self.sj[j.id].job.shrunk.capacity_since
               for j in live):
            self.wake()

    def apply_grow(self, job_id: str, fn: Callable[..., Outcome | None], inp: object) -> pb.Job | None:
        """What ``JobOps.apply_grow`` does live, plus the simulated agent's part of a
        grow-back stop: its last periodic checkpoint reported, the stop's cause kept (the
        time it costs is charged to ``grow_back``), the move counted."""
        sj = self.sj[job_id]
        growing = (isinstance(inp, grow_back.Observed) and inp.plan.kind is Grow.GROW_BACK
                   and sj.job.phase == RUNNING)
        if growing:
            self._note_checkpoint(sj)
        out = fn(sj.job, inp, self.now, self.cfg)
        if out is None:
            return None
        if growing and out.job.phase != RUNNING:
            sj.stop_cause = Cause.GROW_BACK
            sj.migrations += 1
            sj.grow_backs += 1
        self.apply(sj, out)
        return sj.job if sj.job.phase not in TERMINAL else None

    def launch(self, job_id: str, admission: placement.Admission, explanation: str = "",
               spare_nodes: tuple[str, ...] = ()) -> pb.Job | None:
        """What ``JobOps.launch`` does live (a grow back's relaunch on its full-size nodes);
        ``spare_nodes`` (warm rank starters live) changes no decision here."""
        sj = self.sj[job_id]
        out = transitions.admit(sj.job, transitions.Admit(admission, {}, f"sim://{admission.region}",
                                                          explanation=explanation),
                                self.now, self.cfg)
        if out is None:
            return None
        self._hold(sj, admission)
        self.apply(sj, out)
        return sj.job

    def _forgive_exclusions(self) -> None:
        """The live pass's first step (``exclusions.to_forgive``, then
        ``transitions.exclusions_forgiven``): a pending job whose avoided nodes are all that
        could ever hold it tries the longest-avoided of them again."""
        excluding = {j: sj.job for j, sj in self.queued.items() if sj.job.excluded_nodes}
        if not excluding:
            return
        for job_id, nodes in sorted(exclusions.to_forgive(self.snapshot(), excluding).items()):
            sj = self.sj[job_id]
            self.apply(sj, transitions.exclusions_forgiven(sj.job, nodes, self.now, self.cfg))

    def _relaunch_lost(self) -> None:
        """The live pass's step before placement (``replacements.relaunch_lost``, called
        as is): each job that lost nodes gets its recovery policy's NODE_LOST plan on this
        pass's snapshot, applied through ``node_recovery.decide`` (in place: admitted on
        its survivors plus spares; from the store: left queued for placement)."""
        live = [self.sj[j].job for j in sorted(self.undecided)]
        snap = self.snapshot()  # while they are undecided: their nodes are never spares
        self.undecided.clear()
        self.in_tick = True
        try:
            replacements.relaunch_lost(_RelaunchOps(self), live, snap)
        finally:
            self.in_tick = False

    def relaunch_after_node_loss(self, job_id: str, plan: RelaunchPlan,
                                 admission: placement.Admission | None,
                                 spare_nodes: tuple[str, ...] = ()) -> pb.Job | None:
        """What ``JobOps.relaunch_after_node_loss`` does live: write the plan with
        ``node_recovery.decide`` (an in-place plan admits the job on ``admission``).
        ``spare_nodes`` (the pool's spares that get warm rank starters live) changes no
        decision and the simulator models no process start-up, so it is not used."""
        sj = self.sj[job_id]
        admit = (transitions.Admit(admission, {}, f"sim://{admission.region}") if admission is not None
                 else None)
        out = live_node_recovery.decide(sj.job, live_node_recovery.Decided(plan=plan, admit=admit),
                                        self.now, self.cfg)
        if out is None:
            return None
        key = plan.blocker.value if out.job.node_recovery.plan == plan.kind.value else "agent"
        sj.recoveries[key] = sj.recoveries.get(key, 0) + 1
        if admission is not None and out.job.phase not in QUEUED:
            self._hold(sj, admission)
        self.apply(sj, out)
        return sj.job

    def decide(self, snap: placement.Snapshot) -> placement.Decisions:
        """``placement.schedule`` of the pass; under static quotas without the jobs it
        provably leaves pending for quota (:mod:`simulator.quota_filter`: same
        admissions, preemptions and reservations; ``check`` mode verifies that)."""
        pending = quota_filter.placeable(snap) if self.policy.quotas is Quotas.STATIC else snap.pending
        if len(pending) == len(snap.pending):
            return placement.schedule(snap)
        self.left_out += len(snap.pending) - len(pending)
        dec = placement.schedule(dataclasses.replace(snap, pending=pending)) if pending else placement.Decisions()
        if self.check:
            full = placement.schedule(snap)
            if (dec.admissions, dec.preemptions, dec.reservations) != (
                    full.admissions, full.preemptions, full.reservations):
                raise SimError(f"t={self.now}: the quota filter changed a decision")
        return dec

    def check_conservation(self) -> None:
        """No GPU counted twice: per node, the GPUs held equal the sum of the holding
        jobs' allocations and never exceed the node; queued and holding are disjoint."""
        per: dict[str, int] = defaultdict(int)
        for sj in self.holding.values():
            for n, g in sj.alloc:
                per[n] += g
        for n in set(per) | {k for k, v in self.used.items() if v}:
            if per[n] != self.used[n] or per[n] > self.node[n].node.gpus:
                raise SimError(f"t={self.now}: node {n} holds {per[n]} GPUs by jobs, {self.used[n]} counted,"
                               f" {self.node[n].node.gpus} exist")
        both = set(self.queued) & set(self.holding)
        if both:
            raise SimError(f"t={self.now}: jobs both queued and holding GPUs: {sorted(both)[:5]}")

    def apply_decisions(self, snap: placement.Snapshot, dec: placement.Decisions) -> None:
        """What ``SchedulerLoop.apply`` does live: launch admissions, stop victims."""
        for adm in dec.admissions:
            sj = self.sj[adm.job_id]
            self._hold(sj, adm)
            self.apply(sj, transitions.admit(sj.job, transitions.Admit(adm, {}, f"sim://{adm.region}"),
                                             self.now, self.cfg))
        for pre in dec.preemptions:
            sj = self.sj.get(pre.job_id)
            if sj is not None:
                self.trigger(sj, Signal(Trigger.PREEMPTED, cause=Cause.parse(pre.reason)), actor="scheduler")
        if self.policy.proactive is not Proactive.NONE:
            self._proactive(snap, dec)

    def move_s(self, r: placement.RunningJob) -> float:
        sj = self.sj[r.id]
        ck = self.scn.checkpoint
        b = sj.ckpt_bytes
        return (b / (ck.write_gbps * 1e9) + b / (ck.read_gbps * 1e9) + ck.process_start_s
                + b / (self.scn.inter_region_gbps * 1e9))

    def remaining_s(self, r: placement.RunningJob) -> float:
        sj = self.sj[r.id]  # from the job's stated estimate: the policy never sees the truth
        return estimates.remaining(sj.job.spec.expected_duration_s, self._work_of(sj, self.now))

    def _proactive(self, snap: placement.Snapshot, dec: placement.Decisions) -> None:
        busy = frozenset(j for j in self.moving if j in self.holding)
        if self.policy.proactive is Proactive.DEFRAG:
            props = proactive.defragment(snap, dec, move_s=self.move_s, remaining_s=self.remaining_s,
                                         movable_gpus=self.scn.movable_gpus, busy=busy)
        else:
            props = proactive.better_capacity(snap, dec, move_s=self.move_s, remaining_s=self.remaining_s,
                                              busy=busy)
        for p in props:
            sj = self.sj[p.job_id]
            if sj.job.phase == RUNNING and self.trigger(sj, p.signal, actor="proactive"):
                self.moving.add(sj.tj.id)


class _GrowOps:
    """What ``grow_watch.check`` and ``relaunch_grown`` need of the live ``JobOps``: the
    config, the write of a grow-back transition, the launch (the simulation applies them)."""

    def __init__(self, sim: Simulation) -> None:
        self.config = sim.cfg
        self.apply_grow = sim.apply_grow
        self.launch = sim.launch


class _RelaunchOps:
    """What ``replacements.relaunch_lost`` needs of the live ``JobOps``: the config and
    the write of a plan (the simulation applies it)."""

    def __init__(self, sim: Simulation) -> None:
        self.config = sim.cfg
        self.relaunch_after_node_loss = sim.relaunch_after_node_loss


_LEVEL = {"none": pb.TOPOLOGY_LEVEL_UNSPECIFIED if hasattr(pb, "TOPOLOGY_LEVEL_UNSPECIFIED") else 0,
          "ultraserver": int(placement.TopologyLevel.ULTRASERVER),
          "layer_3": int(placement.TopologyLevel.LAYER_3), "layer_2": int(placement.TopologyLevel.LAYER_2)}


def _fail_pending(job: pb.Job, now: float, why: str) -> Outcome:
    """A job no fleet state can run: PENDING -> FAILED (an allowed edge), with the reason."""
    from broker.jobs.lifecycle import FAILED
    from broker.jobs.outcome import begin, seal

    tx = begin(job, now)
    tx.move(FAILED, "failed", reason="unplaceable", actor="sim", message=why)
    return seal(tx)


def _succeed_pending(job: pb.Job, now: float) -> Outcome:
    """A zero-length trace job: PENDING -> SUCCEEDED (an allowed edge) without placement."""
    from broker.jobs.lifecycle import SUCCEEDED
    from broker.jobs.outcome import begin, seal

    tx = begin(job, now)
    tx.move(SUCCEEDED, "succeeded", reason="completed", actor="sim", message="zero-length job in the trace")
    return seal(tx)
