"""When and how a job is stopped, moved or restarted: one place, as data.

Why one module (like SkyPilot's ``sky/jobs/recovery_strategy.py``): the reasons to
interrupt a running attempt arrive through very different doors (a spot notice in a
heartbeat, an operator draining a region, a training plan about to end, the
scheduler preempting, an agent going silent, an attempt failing), but the decision
is one question: *checkpoint first or not, how long to wait, which bucket the lost
time goes to, what to avoid next time, and whether to try again*. Servicers and the
scheduler only translate what they saw into a :class:`Trigger` with its
:class:`Signal`; a :class:`RecoveryPolicy` turns that into a :class:`StopPlan`
(pure, no I/O), and :func:`broker.jobs.transitions.request_stop` applies it.

Adding a trigger: a member in :class:`Trigger`, its rule in
:meth:`RecoveryPolicy.plan` (or a policy subclass), a case in
``tests/jobs/test_recovery.py``; then the servicer that sees it calls
``JobOps.trigger``. See docs/architecture.md.

Choosing a policy: ``BrokerConfig.recovery_policy`` is the broker-wide default; a job
overrides it with the spec label ``cb.recovery-policy`` (one of :data:`POLICIES`).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.jobs import budgets
from broker.jobs.budgets import (  # noqa: F401  (re-exported: the exit codes' one home)
    DETERMINISTIC_ERRORS,
    EXIT_CONFIG_ERROR,
    EXIT_ERROR,
    EXIT_STORE_UNAVAILABLE,
    Budget,
    deterministic_failure,
)
from broker.jobs.causes import Cause, Family, StopKind

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from computebroker.v1 import common_pb2 as pb

POLICY_LABEL = "cb.recovery-policy"

# Trainer exit codes (docs/contracts.md section 1).
EXIT_CHECKPOINTED = 75
EXIT_GRACE_MISSED = 76
# Reported by the agent, not the trainer: it could not start the attempt (staging, the
# checkpoint copy, the workdir fetch or the spawn failed). Backed off like a refused
# launch (broker/jobs/backoff.py), not counted against max_restarts.
EXIT_LAUNCH_FAILED = -1


class Trigger(enum.Enum):
    """Why an attempt must be interrupted (what a servicer or the scheduler saw)."""

    SPOT_NOTICE = "spot_notice"
    REGION_DRAIN = "region_drain"
    PLAN_ENDING = "plan_ending"
    PREEMPTED = "preempted"
    AGENT_LOST = "agent_lost"
    ATTEMPT_MISSING = "attempt_missing"
    LAUNCH_REFUSED = "launch_refused"
    ATTEMPT_FAILED = "attempt_failed"
    HANG = "hang"
    NODE_UNHEALTHY = "node_unhealthy"
    BETTER_CAPACITY = "better_capacity"
    DEFRAGMENT = "defragment"
    # An attempt failed and its agent blamed specific nodes (JobUpdate.failed_nodes): the
    # relaunch may replace just those nodes in place (:meth:`RecoveryPolicy.relaunch`).
    NODE_LOST = "node_lost"
    # A job running below its requested size (shrunk after a node loss, moved or placed
    # elastically on fewer nodes) finds capacity for that size again
    # (:meth:`RecoveryPolicy.grow`): checkpoint first, then relaunch at full size.
    GROW_BACK = "grow_back"


@dataclass(frozen=True)
class Signal:
    """One trigger with what the observer knew: the nodes concerned, a reclaim
    deadline, the finer cause (e.g. which preemption), and the time left."""

    trigger: Trigger
    nodes: tuple[str, ...] = ()
    deadline: float = 0.0  # absolute reclaim time (spot), 0 = none
    seconds_left: float = 0.0  # plan ending: until the plan's end
    cause: Cause | None = None  # finer reason (preemption: reclaim vs priority)


@dataclass(frozen=True)
class StopPlan:
    """How to stop the current attempt, and what the relaunch must avoid. The relaunch
    budgets are :meth:`RecoveryPolicy.restart`'s (``max_restarts`` counts the job's own
    failures, ``max_node_failures`` its nodes'; moves and losses use up neither)."""

    kind: StopKind  # what the Stop asks; its family is the goodput bucket and requeue cause
    cause: Cause
    checkpoint_first: bool
    grace_s: float
    exclude_nodes: tuple[str, ...] = ()  # the relaunch avoids these (Job.excluded_nodes)

    @property
    def family(self) -> Family:
        return self.kind.family


class Restart(enum.Enum):
    """What to do when an attempt ends by itself (no stop was asked)."""

    RETRY = "retry"  # relaunch from the last durable checkpoint; one of max_restarts spent
    RETRY_NODE = "retry_node"  # a node's failure: relaunch, one of max_node_failures spent
    FAIL_CONFIG = "fail_config"  # exit 2 or a deterministic error: retrying will not help
    GIVE_UP = "give_up"  # max_restarts exhausted
    GIVE_UP_NODES = "give_up_nodes"  # max_node_failures exhausted (within its window)
    WAIT_STORE = "wait_store"  # the checkpoint store is down: wait with backoff, no restart spent


@dataclass(frozen=True)
class RecoveryPolicy:
    """The default policy: move anywhere the scheduler finds room.

    Small named subclasses change one rule each; policies are frozen and stateless,
    so one instance serves every job.
    """

    name: str = "move-anywhere"
    loss_triggers: frozenset[Trigger] = field(
        default=frozenset({Trigger.AGENT_LOST, Trigger.ATTEMPT_MISSING, Trigger.LAUNCH_REFUSED}))
    # Moves nobody forces that a job with this policy consents to (the live broker's
    # broker/scheduling/proactive_watch.py and the simulator look for these only).
    proactive: frozenset[Trigger] = frozenset()

    def plan(self, sig: Signal, job: pb.Job, config: BrokerConfig, now: float) -> StopPlan | None:
        """The stop for ``sig`` on ``job``'s running attempt, or None (leave it alone)."""
        t = sig.trigger
        if t is Trigger.SPOT_NOTICE:
            grace = (max(5.0, sig.deadline - now - 10.0) if sig.deadline else config.preempt_grace_s)
            return StopPlan(StopKind.MIGRATE, Cause.SPOT_INTERRUPTION, True, grace,
                            exclude_nodes=self.avoid(sig))
        if t is Trigger.REGION_DRAIN:
            return StopPlan(StopKind.DRAIN, Cause.REGION_DRAIN, True, config.preempt_grace_s)
        if t is Trigger.PLAN_ENDING:
            return StopPlan(StopKind.MIGRATE, Cause.PLAN_ENDING, True, max(5.0, sig.seconds_left - 1.0),
                            exclude_nodes=sig.nodes)
        if t is Trigger.PREEMPTED:
            return StopPlan(StopKind.PREEMPT, sig.cause or Cause.PREEMPTED, True, config.preempt_grace_s)
        if t is Trigger.NODE_UNHEALTHY:
            return self.node_unhealthy(sig, job, config)
        if t is Trigger.BETTER_CAPACITY:
            return StopPlan(StopKind.MIGRATE, Cause.BETTER_CAPACITY, True, config.preempt_grace_s)
        if t is Trigger.DEFRAGMENT:
            # sig.nodes = the block being freed: the relaunch must not land back in it.
            return StopPlan(StopKind.MIGRATE, Cause.DEFRAGMENT, True, config.preempt_grace_s,
                            exclude_nodes=sig.nodes)
        if t is Trigger.GROW_BACK:
            # sig.nodes = the full-size placement the relaunch takes (grow_back.py)
            if not self.grow_back:
                return None
            return StopPlan(StopKind.MIGRATE, Cause.GROW_BACK, True, config.preempt_grace_s)
        if t is Trigger.HANG:
            return StopPlan(StopKind.MIGRATE, Cause.HANG, False, 0.0, exclude_nodes=self.avoid(sig))
        if t in self.loss_triggers:
            return self.loss(sig, job)
        return None

    def avoid(self, sig: Signal) -> tuple[str, ...]:
        """Nodes a relaunch must not use after ``sig`` (move-anywhere: none beyond what
        the snapshot already leaves out; a doomed spot node leaves it by itself)."""
        return ()

    def node_unhealthy(self, sig: Signal, job: pb.Job, config: BrokerConfig) -> StopPlan | None:
        """An elastic job can resume on fewer/other nodes: checkpoint and move off the
        sick node now, instead of waiting for it to fail and restarting in place. A
        fixed-size gang keeps running (a restart would need the same node count)."""
        if not is_elastic(job):
            return None
        return StopPlan(StopKind.MIGRATE, Cause.NODE_UNHEALTHY, True, config.preempt_grace_s,
                        exclude_nodes=sig.nodes)

    def loss(self, sig: Signal, job: pb.Job) -> StopPlan:
        """The attempt is already gone: nothing to save. ``kind`` is the stop in flight,
        if any: :func:`broker.jobs.transitions.attempt_lost` charges the lost time to
        its family (a preempted job lost mid-stop stays a preemption), else to failure."""
        inflight = StopKind.parse(job.stop_reason)
        cause = {Trigger.AGENT_LOST: Cause.AGENT_LOST, Trigger.ATTEMPT_MISSING: Cause.ATTEMPT_MISSING,
                 Trigger.LAUNCH_REFUSED: Cause.LAUNCH_REFUSED}[sig.trigger]
        return StopPlan(inflight or StopKind.MIGRATE, cause, False, 0.0)

    def restart(self, exit_code: int, job: pb.Job, config: BrokerConfig, message: str = "",
                failed_nodes: tuple[str, ...] = (), now: float = 0.0) -> Restart:
        """An attempt FAILED on its own: which budget its failure spends, and whether the
        budget has room (:data:`broker.jobs.budgets.FAILURE_BUDGETS`, the one table).

        Exit 2 or a message naming a deterministic failure (an ImportError) is a
        configuration error; exit 81 a store outage (waited out, no restart spent:
        broker/jobs/store_wait.py); a blamed node whose rank died by a signal is a node
        failure, relaunched until ``max_node_failures`` within ``node_failure_window_s``
        (``now`` places it in that window); anything else (1, 76 = the emergency save
        missed its grace, a signal on no blamed node) is retried until ``max_restarts``,
        from the last durable checkpoint. Exit code 0 on a FAILED attempt means "unknown"
        (e.g. an attempt that ended while its agent was down, its ranks' codes
        unreadable): a failure like any other, never a success and never final (the
        fault campaign found such attempts failing their job at once)."""
        kind = budgets.classify(exit_code, message, failed_nodes)
        budget = budgets.FAILURE_BUDGETS[kind]
        if budget is Budget.NONE:
            return Restart.FAIL_CONFIG
        if budget is Budget.STORE_WAIT:
            return Restart.WAIT_STORE
        if budget is Budget.NODE_FAILURES:
            return (Restart.RETRY_NODE if budgets.node_budget_left(job, config, now)
                    else Restart.GIVE_UP_NODES)
        return Restart.RETRY if job.restarts < config.max_restarts else Restart.GIVE_UP

    def exclude_after_failure(self, failed_nodes: tuple[str, ...]) -> tuple[str, ...]:
        """Nodes the agent blamed for a failure are avoided by the relaunch."""
        return failed_nodes

    # Whether a NODE_LOST relaunch may replace the lost nodes in place (subclasses that
    # model schedulers without spares turn it off).
    replace_in_place: bool = True
    # Whether an elastic job that lost nodes and finds no spare may go on, at once, on
    # its survivors alone (fewer ranks, resharded from the peers' memory).
    shrink_in_place: bool = True

    def relaunch(self, sig: Signal, view: LostNodes) -> RelaunchPlan:
        """Trigger.NODE_LOST (``sig.nodes`` = the blamed nodes, ``view`` = their pool now):
        REPLACE_IN_PLACE when the memory tier is on, a survivor is left, every survivor is
        still usable, the team's quota has room for the job (as for any admission) and
        the pool has a ready spare (same block when it has blocks) for each lost node;
        with no spare, SHRINK_IN_PLACE when the job is elastic and its survivors are at
        least its ``min_nodes`` (and the policy shrinks); else FROM_STORE, today's path.
        The first blocker found, in :data:`RELAUNCH_RULES`' order of meaning, is the
        reason events give."""
        assert sig.trigger is Trigger.NODE_LOST, sig
        swaps: tuple[tuple[str, str], ...] = ()
        if not self.replace_in_place:
            blocker = Blocker.POLICY
        elif view.memory_every <= 0:
            blocker = Blocker.MEMORY_TIER_OFF
        elif not view.survivors:
            blocker = Blocker.ALL_NODES_LOST
        elif view.survivors_gone:
            blocker = Blocker.SURVIVOR_GONE
        elif view.quota_short:
            blocker = Blocker.QUOTA
        else:
            swaps = match_spares(view) or ()
            blocker = Blocker.NONE if swaps else self._no_spare(view)
        kind, text = RELAUNCH_RULES[blocker]
        block = ""
        if view.pool_has_blocks and blocker in NO_SPARE_BLOCKERS:
            block = " (block " + ", ".join(sorted({view.blocks.get(n, "") for n in view.lost})) + ")"
        why = text.format(
            swaps=", ".join(f"spare {s} takes the place of lost node {n}" for n, s in swaps),
            pool=view.pool or "(default)", survivors=", ".join(view.survivors),
            policy=self.name, gone=", ".join(view.survivors_gone), lost=", ".join(view.lost),
            block=block, quota=view.quota_short, nodes=len(view.lost) + len(view.survivors),
            left=len(view.survivors), min_nodes=view.min_nodes)
        return RelaunchPlan(kind, blocker, why, swaps)

    # Whether a job running below its requested size grows back once capacity returns,
    # and after which routes (:class:`SizeRoute`: a shrink in place, an elastic move, an
    # elastic placement); the rules are the same for every route (:data:`GROW_RULES`).
    grow_back: bool = True
    grow_routes: frozenset[SizeRoute] = field(default_factory=lambda: frozenset(SizeRoute))

    def grow(self, view: ShrunkView) -> GrowPlan:
        """A job running below its size (``Job.shrunk``, whichever :class:`SizeRoute` made
        it small): GROW_BACK when the policy grows jobs back after that route, the job is
        elastic, its agent's pool (so its current region) has free capacity for the missing
        nodes (the lost nodes healthy again, free nodes, ready spares; same block when the
        pool has blocks), the team's quota has room for the extra GPUs, the capacity has stayed
        free for ``settle_s`` (hysteresis: a flapping node does not cause churn) and the
        last shrink or grow back is at least ``min_interval_s`` old (rate limit); else it
        stays shrunk, the first blocker in :data:`GROW_RULES`' order being the reason shown."""
        nodes: tuple[str, ...] = ()
        missing = view.requested - view.running
        if not self.grow_back or view.route not in self.grow_routes:
            blocker = GrowBlocker.POLICY
        elif not view.elastic:
            blocker = GrowBlocker.NOT_ELASTIC
        elif len(view.free) < missing:
            blocker = GrowBlocker.NO_CAPACITY
        elif view.quota_short:
            blocker = GrowBlocker.QUOTA
        elif view.now - view.capacity_since < view.settle_s:
            blocker = GrowBlocker.SETTLING
        elif view.now - view.last_change < view.min_interval_s:
            blocker = GrowBlocker.RATE_LIMIT
        else:
            blocker = GrowBlocker.NONE
            nodes = view.free[:missing]
        kind, text = GROW_RULES[blocker]
        why = text.format(
            requested=view.requested, running=view.running, missing=missing,
            free=len(view.free), pool=view.pool or "(default)", policy=self.name,
            quota=view.quota_short, nodes=", ".join(nodes),
            settle=_utc(view.capacity_since + view.settle_s), settle_s=f"{view.settle_s:.0f}",
            wait=_utc(view.last_change + view.min_interval_s), interval=f"{view.min_interval_s:.0f}",
            route=ROUTE_TEXT[view.route].format(region=view.region or "its region"))
        return GrowPlan(kind, blocker, why, nodes, view.route)

    def _no_spare(self, view: LostNodes) -> Blocker:
        """No spare for every lost node: may the job go on with its survivors alone?"""
        if not view.elastic:
            return Blocker.NO_SPARE
        if not self.shrink_in_place:
            return Blocker.NO_SPARE_NO_SHRINK
        if len(view.survivors) < view.min_nodes:
            return Blocker.BELOW_MIN_NODES
        return Blocker.SHRINK


class Relaunch(enum.Enum):
    """How a job whose attempt lost nodes comes back (Trigger.NODE_LOST)."""

    # Survivors keep their nodes, a spare of the same pool (and block) takes each lost
    # node's place, same world size: the ranks restore from the peers' memory keepers.
    REPLACE_IN_PLACE = "replace_in_place"
    # No spare: an elastic job goes on at once on its survivors alone (fewer ranks); the
    # ranks reshard the peers' memory copies to the new world size.
    SHRINK_IN_PLACE = "shrink_in_place"
    # Today's path: queued again, placed wherever the scheduler finds room, resumed from
    # the newest durable checkpoint (the store).
    FROM_STORE = "from_store"

    @property
    def in_place(self) -> bool:
        """Admitted at once on the survivors (and spares), restored from memory."""
        return self is not Relaunch.FROM_STORE


class Blocker(enum.Enum):
    """What keeps a NODE_LOST relaunch from replacing nodes in place (NONE: nothing)."""

    NONE = "none"
    POLICY = "policy"  # the job's recovery policy never replaces in place
    MEMORY_TIER_OFF = "memory_tier_off"  # no peer copies to restore from
    ALL_NODES_LOST = "all_nodes_lost"  # no survivor: every copy is gone
    SURVIVOR_GONE = "survivor_gone"  # a survivor is no longer free and usable
    # the team's quota (guarantee, borrowing, region cap) has no room for the relaunch:
    # checked exactly as any admission (placement/quota_check.py), so a team over its
    # limits does not keep capacity by losing a node
    QUOTA = "quota"
    NO_SPARE = "no_spare"  # the pool (block) has no ready spare for every lost node
    # No spare, but the job is elastic and its survivors are enough: nothing blocks a
    # shrink in place (the replacement is what is blocked).
    SHRINK = "shrink"
    NO_SPARE_NO_SHRINK = "no_spare_no_shrink"  # no spare; the policy never shrinks in place
    BELOW_MIN_NODES = "below_min_nodes"  # no spare; fewer survivors than the job's min_nodes


# The decision, as data: what each blocker means for the relaunch and how events say it.
RELAUNCH_RULES: dict[Blocker, tuple[Relaunch, str]] = {
    Blocker.NONE: (Relaunch.REPLACE_IN_PLACE, "{swaps} in pool {pool}; survivors {survivors}"
                                               " keep their nodes and ranks restore from"
                                               " their peers' memory"),
    Blocker.POLICY: (Relaunch.FROM_STORE, "recovery policy {policy} does not replace nodes"
                                          " in place"),
    Blocker.MEMORY_TIER_OFF: (Relaunch.FROM_STORE, "the job's memory tier is off (trainer option"
                                                   " memory_every)"),
    Blocker.ALL_NODES_LOST: (Relaunch.FROM_STORE, "every node of the attempt was lost"),
    Blocker.SURVIVOR_GONE: (Relaunch.FROM_STORE, "surviving node(s) {gone} are no longer usable"),
    Blocker.QUOTA: (Relaunch.FROM_STORE, "{quota}"),
    Blocker.NO_SPARE: (Relaunch.FROM_STORE, "no ready spare for {lost} in pool {pool}{block},"
                                            " and the job's size is fixed (no elasticity)"),
    Blocker.SHRINK: (Relaunch.SHRINK_IN_PLACE, "no ready spare for {lost} in pool {pool}{block};"
                                               " the elastic job goes on with its survivors"
                                               " {survivors} ({nodes} -> {left} nodes) and ranks"
                                               " reshard their peers' memory copies"),
    Blocker.NO_SPARE_NO_SHRINK: (Relaunch.FROM_STORE, "no ready spare for {lost} in pool"
                                                      " {pool}{block}, and recovery policy"
                                                      " {policy} does not shrink in place"),
    Blocker.BELOW_MIN_NODES: (Relaunch.FROM_STORE, "no ready spare for {lost} in pool {pool}"
                                                   "{block}, and {left} surviving node(s) are"
                                                   " fewer than the job's min_nodes"
                                                   " {min_nodes}"),
}
NO_SPARE_BLOCKERS = frozenset({Blocker.NO_SPARE, Blocker.SHRINK, Blocker.NO_SPARE_NO_SHRINK,
                               Blocker.BELOW_MIN_NODES})


class Grow(enum.Enum):
    """What a job running shrunk does at a scheduler pass."""

    GROW_BACK = "grow_back"  # checkpoint first, relaunch at the requested size
    STAY = "stay"  # keep running shrunk (the blocker says why)


class SizeRoute(enum.Enum):
    """How a job came to run below its requested size (``Shrunk.route``): every route
    grows back by the same rules (:data:`GROW_RULES`); the decision says which it was."""

    SHRINK_IN_PLACE = "shrink_in_place"  # a node loss, no spare: went on with its survivors
    ELASTIC_MOVE = "elastic_move"  # a move (spot notice, drain, ...) placed it on fewer nodes
    ELASTIC_PLACEMENT = "elastic_placement"  # placement started it on fewer: only part fitted

    @classmethod
    def of(cls, value: str) -> SizeRoute:
        """The record's route; "" (a record an older broker wrote) was a shrink in place."""
        return cls(value) if value else cls.SHRINK_IN_PLACE


# How events and `brokerctl job` name each route ({region}: where the job runs now).
ROUTE_TEXT: dict[SizeRoute, str] = {
    SizeRoute.SHRINK_IN_PLACE: "shrunk in place after a node loss",
    SizeRoute.ELASTIC_MOVE: "moved elastically to {region} on fewer nodes",
    SizeRoute.ELASTIC_PLACEMENT: "placed elastically in {region} on fewer nodes (only part fitted)",
}


class GrowBlocker(enum.Enum):
    """What keeps a shrunk job from growing back (NONE: nothing)."""

    NONE = "none"
    POLICY = "policy"  # the job's recovery policy never grows back
    NOT_ELASTIC = "not_elastic"  # a fixed-size job never runs shrunk (an odd record)
    NO_CAPACITY = "no_capacity"  # too few free nodes in its pool (block) for the full size
    # the team's quota (guarantee, borrowing, region cap) has no room for the extra GPUs
    QUOTA = "quota"
    SETTLING = "settling"  # the capacity has not been free long enough (hysteresis)
    RATE_LIMIT = "rate_limit"  # the last shrink or grow back is too recent


# The decision, as data: what each grow-back blocker means and how `brokerctl job` and
# events say it. Order of meaning: capacity first, then quota, then the time limits.
GROW_RULES: dict[GrowBlocker, tuple[Grow, str]] = {
    GrowBlocker.NONE: (Grow.GROW_BACK, "capacity returned: {nodes} free in pool {pool}"),
    GrowBlocker.POLICY: (Grow.STAY, "recovery policy {policy} does not grow jobs back ({route})"),
    GrowBlocker.NOT_ELASTIC: (Grow.STAY, "the job's size is fixed (no elasticity)"),
    GrowBlocker.NO_CAPACITY: (Grow.STAY, "waiting for capacity: {missing} more node(s) needed"
                                         " in pool {pool}, {free} free"),
    GrowBlocker.QUOTA: (Grow.STAY, "capacity returned but the team's quota has no room for"
                                   " the extra nodes: {quota}"),
    # Absolute times, not countdowns: the reason stays the same from pass to pass, so a
    # waiting job is not rewritten every pass.
    GrowBlocker.SETTLING: (Grow.STAY, "capacity returned; growing back at {settle} if it"
                                      " stays free ({settle_s} s settle time)"),
    GrowBlocker.RATE_LIMIT: (Grow.STAY, "capacity returned; growing back at {wait} (at most"
                                        " one resize per {interval} s)"),
}


def _utc(t: float) -> str:
    """A wall-clock time for reasons people read (UTC, to the second)."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


@dataclass(frozen=True)
class ShrunkView:
    """What the scheduler's pass knows about a job running shrunk and its pool now."""

    requested: int  # the node count it asked for
    running: int  # the node count it runs at
    pool: str
    free: tuple[str, ...]  # nodes that could take the missing ranks now, best first
    now: float
    capacity_since: float  # free capacity for the full size seen continuously since
    last_change: float  # the shrink or the latest grow back, whichever is newer
    settle_s: float
    min_interval_s: float
    quota_short: str = ""  # why the team's quota cannot take the extra GPUs ("" = it can)
    elastic: bool = True
    route: SizeRoute = SizeRoute.SHRINK_IN_PLACE  # how it came to run below its size
    region: str = ""  # where it runs now: growing back stays there (its agent and pool)


@dataclass(frozen=True)
class GrowPlan:
    """The policy's answer for a shrunk job: grow back (on ``nodes`` besides its own) or
    stay, and why (events, ``brokerctl job``)."""

    kind: Grow
    blocker: GrowBlocker
    why: str
    nodes: tuple[str, ...] = ()
    route: SizeRoute = SizeRoute.SHRINK_IN_PLACE  # which route made the job small


@dataclass(frozen=True)
class SpareNode:
    """A free node its pool reserves as a spare (broker/scheduling/spares.py)."""

    id: str
    agent_id: str
    pool: str
    block: str = ""  # UltraServer or layer-3 block; "" when the pool has no blocks


@dataclass(frozen=True)
class LostNodes:
    """What the scheduler's pass knows when a job that lost nodes is relaunched."""

    lost: tuple[str, ...]  # in the failed placement's order
    survivors: tuple[str, ...]
    agent_id: str  # the failed attempt's agent (a gang never spans agents)
    pool: str
    blocks: dict[str, str] = field(default_factory=dict)  # lost node -> its block ("" = none)
    pool_has_blocks: bool = False
    survivors_gone: tuple[str, ...] = ()  # survivors now used by others, unhealthy or away
    spares: tuple[SpareNode, ...] = ()  # the pool's ready spares on that agent
    memory_every: int = 0  # the job's trainer option (0 = tier off)
    # why the team's quota cannot take the relaunch now ("" = it can): the pending
    # reason ordinary admission would give (placement/quota_check.py)
    quota_short: str = ""
    elastic: bool = False  # the job may run on another node count (:func:`is_elastic`)
    min_nodes: int = 0  # its elasticity's lower bound (0: none beyond one node)


@dataclass(frozen=True)
class RelaunchPlan:
    """The policy's answer for Trigger.NODE_LOST: how, why (for events), and for
    REPLACE_IN_PLACE which spare takes which lost node's place (SHRINK_IN_PLACE: none,
    the survivors alone)."""

    kind: Relaunch
    blocker: Blocker
    why: str
    swaps: tuple[tuple[str, str], ...] = ()  # (lost node, spare)


def match_spares(view: LostNodes) -> tuple[tuple[str, str], ...] | None:
    """One distinct spare per lost node, from the same block when the pool has blocks;
    None when some lost node has none. Deterministic (spares in the view's order)."""
    free = list(view.spares)
    swaps = []
    for node in view.lost:
        want = view.blocks.get(node, "")
        pick = next((s for s in free if s.agent_id == view.agent_id and s.pool == view.pool
                     and (not view.pool_has_blocks or s.block == want)), None)
        if pick is None:
            return None
        free.remove(pick)
        swaps.append((node, pick.id))
    return tuple(swaps)


@dataclass(frozen=True)
class StayInPlace(RecoveryPolicy):
    """Keep the job on the capacity it has as long as it runs: a sick node does not
    move an elastic job (it restarts in place if the node really fails), and the
    nodes an agent blames for a failure are not excluded (tightly pinned capacity
    such as a reserved block, where the same nodes come back after a reboot)."""

    name: str = "stay-in-place"

    def node_unhealthy(self, sig: Signal, job: pb.Job, config: BrokerConfig) -> StopPlan | None:
        return None

    def exclude_after_failure(self, failed_nodes: tuple[str, ...]) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class NoMigration(RecoveryPolicy):
    """What a scheduler without live migration does (the simulator's baselines): a spot
    notice, a plan end or a drain kills the attempt without a checkpoint of its own; it
    restarts from its last *periodic* checkpoint wherever there is room. No proactive
    moves (better capacity, defragmentation) either."""

    name: str = "no-migration"
    replace_in_place: bool = False  # the simulator's baselines have no spares either
    shrink_in_place: bool = False  # nor a memory tier to shrink from
    grow_back: bool = False  # so nothing to grow back from
    _KILL = {Trigger.SPOT_NOTICE: (StopKind.MIGRATE, Cause.SPOT_INTERRUPTION),
             Trigger.PLAN_ENDING: (StopKind.MIGRATE, Cause.PLAN_ENDING),
             Trigger.REGION_DRAIN: (StopKind.DRAIN, Cause.REGION_DRAIN)}

    def plan(self, sig: Signal, job: pb.Job, config: BrokerConfig, now: float) -> StopPlan | None:
        if sig.trigger in (Trigger.BETTER_CAPACITY, Trigger.DEFRAGMENT):
            return None
        if sig.trigger in self._KILL:
            kind, cause = self._KILL[sig.trigger]
            return StopPlan(kind, cause, False, 0.0, exclude_nodes=self.avoid(sig))
        return super().plan(sig, job, config, now)


@dataclass(frozen=True)
class Failover(NoMigration):
    """SkyPilot managed jobs' FAILOVER strategy: restart from the job's own last
    checkpoint, same size, avoiding the capacity that just failed it (the simulator
    also puts the next region first in the job's preferred regions)."""

    name: str = "failover"

    def avoid(self, sig: Signal) -> tuple[str, ...]:
        return sig.nodes


@dataclass(frozen=True)
class Defragment(RecoveryPolicy):
    """move-anywhere, plus: move small jobs out of an UltraServer / layer-3 block to make
    room for a waiting large gang when the expected gain beats the move cost
    (:func:`broker.jobs.proactive.defragment` decides; Trigger.DEFRAGMENT stops them)."""

    name: str = "defragment"
    proactive: frozenset[Trigger] = frozenset({Trigger.DEFRAGMENT})


@dataclass(frozen=True)
class BetterCapacity(RecoveryPolicy):
    """move-anywhere, plus: move a job to cheaper or prepaid capacity that freed up when
    the saving over its expected remaining time beats the move cost
    (:func:`broker.jobs.proactive.better_capacity` decides; Trigger.BETTER_CAPACITY)."""

    name: str = "better-capacity"
    proactive: frozenset[Trigger] = frozenset({Trigger.BETTER_CAPACITY})


POLICIES: dict[str, RecoveryPolicy] = {
    p.name: p for p in (RecoveryPolicy(), StayInPlace(), NoMigration(), Failover(), Defragment(),
                        BetterCapacity())
}


def policy_for(job: pb.Job, config: BrokerConfig) -> RecoveryPolicy:
    """The job's label wins over the broker default; unknown names fall back to it
    (submit-time validation rejects them, so this only meets old or hand-made jobs)."""
    name = job.spec.labels.get(POLICY_LABEL, "") or config.recovery_policy
    return POLICIES.get(name) or POLICIES[config.recovery_policy]


def plan_stop(sig: Signal, job: pb.Job, config: BrokerConfig, now: float) -> StopPlan | None:
    """The stop ``job``'s own recovery policy plans for ``sig`` (None = leave it alone).

    The one door every interruption goes through: the live broker's ``JobOps.trigger``
    and ``JobOps.attempt_lost`` and the fleet simulator (``simulator/engine.py``) call
    this, then :func:`broker.jobs.transitions.request_stop` / ``attempt_lost``, so a
    simulated run decides stops exactly as the broker would
    (tests/simulator/test_sim_equivalence.py)."""
    return policy_for(job, config).plan(sig, job, config, now)


def is_elastic(job: pb.Job) -> bool:
    """Unset elasticity (0/0) means exactly ``resources.nodes``."""
    e, n = job.spec.elasticity, job.spec.resources.nodes
    return bool(e.min_nodes or e.max_nodes) and not (e.min_nodes == e.max_nodes == n)
