"""Recovery policy, one case per trigger: the StopPlan (or none) each policy gives.

The newcomer's path for a new trigger (docs/architecture.md): a member of
``Trigger``, its rule in ``broker/jobs/recovery.py``, a row here.
"""

from __future__ import annotations

import dataclasses

import pytest

from broker.jobs.causes import Cause, Family, StopKind
from broker.jobs.recovery import (
    POLICIES,
    RELAUNCH_RULES,
    BetterCapacity,
    Blocker,
    Defragment,
    Failover,
    LostNodes,
    NoMigration,
    RecoveryPolicy,
    Relaunch,
    Restart,
    Signal,
    SpareNode,
    StayInPlace,
    StopPlan,
    Trigger,
    policy_for,
)
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import CFG, checkpointing, running, spec

NOW = 1000.0
G = CFG.preempt_grace_s

# trigger, signal kwargs -> (kind, cause, checkpoint_first, grace, excluded nodes)
CASES = [
    (Trigger.SPOT_NOTICE, dict(nodes=("n0",), deadline=NOW + 120),
     (StopKind.MIGRATE, Cause.SPOT_INTERRUPTION, True, 110.0, ())),
    (Trigger.SPOT_NOTICE, dict(nodes=("n0",)), (StopKind.MIGRATE, Cause.SPOT_INTERRUPTION, True, G, ())),
    (Trigger.SPOT_NOTICE, dict(deadline=NOW + 3), (StopKind.MIGRATE, Cause.SPOT_INTERRUPTION, True, 5.0, ())),
    (Trigger.REGION_DRAIN, {}, (StopKind.DRAIN, Cause.REGION_DRAIN, True, G, ())),
    (Trigger.PLAN_ENDING, dict(nodes=("p0", "p1"), seconds_left=40),
     (StopKind.MIGRATE, Cause.PLAN_ENDING, True, 39.0, ("p0", "p1"))),
    (Trigger.PREEMPTED, dict(cause=Cause.RECLAIM_LENT_QUOTA),
     (StopKind.PREEMPT, Cause.RECLAIM_LENT_QUOTA, True, G, ())),
    (Trigger.PREEMPTED, {}, (StopKind.PREEMPT, Cause.PREEMPTED, True, G, ())),
    (Trigger.AGENT_LOST, {}, (StopKind.MIGRATE, Cause.AGENT_LOST, False, 0.0, ())),
    (Trigger.ATTEMPT_MISSING, {}, (StopKind.MIGRATE, Cause.ATTEMPT_MISSING, False, 0.0, ())),
    (Trigger.LAUNCH_REFUSED, {}, (StopKind.MIGRATE, Cause.LAUNCH_REFUSED, False, 0.0, ())),
    (Trigger.HANG, {}, (StopKind.MIGRATE, Cause.HANG, False, 0.0, ())),
    (Trigger.BETTER_CAPACITY, {}, (StopKind.MIGRATE, Cause.BETTER_CAPACITY, True, G, ())),
    (Trigger.DEFRAGMENT, dict(nodes=("b0", "b1")), (StopKind.MIGRATE, Cause.DEFRAGMENT, True, G, ("b0", "b1"))),
]


@pytest.mark.parametrize(("trigger", "kw", "want"), CASES,
                         ids=[f"{c[0].name}-{i}" for i, c in enumerate(CASES)])
def test_default_policy_per_trigger(trigger: Trigger, kw: dict, want: tuple) -> None:
    plan = RecoveryPolicy().plan(Signal(trigger, **kw), running(), CFG, NOW)
    assert plan is not None
    assert (plan.kind, plan.cause, plan.checkpoint_first, plan.grace_s, plan.exclude_nodes) == want


def test_attempt_failed_is_decided_by_exit_code() -> None:
    p, job = RecoveryPolicy(), running()
    assert p.plan(Signal(Trigger.ATTEMPT_FAILED), job, CFG, NOW) is None  # not a stop: see restart()
    # A FAILED attempt with exit 0 (its code unknown, e.g. it ended while the agent was
    # down) is a failure to retry, not a success and not final (found by the campaign).
    assert p.restart(0, job, CFG) is Restart.RETRY
    assert p.restart(2, job, CFG) is Restart.FAIL_CONFIG
    for code in (1, 76, 137):
        assert p.restart(code, job, CFG) is Restart.RETRY
    job.restarts = CFG.max_restarts
    assert p.restart(1, job, CFG) is Restart.GIVE_UP
    assert p.restart(2, job, CFG) is Restart.FAIL_CONFIG


def test_loss_during_a_preemption_is_charged_to_preemption() -> None:
    job = checkpointing(trigger=Trigger.PREEMPTED)
    plan = RecoveryPolicy().plan(Signal(Trigger.AGENT_LOST), job, CFG, NOW)
    assert plan is not None and plan.kind is StopKind.PREEMPT and plan.family is Family.PREEMPTION


# ---- the trigger added the newcomer's way: node unhealthy -> move an elastic job ---------
def test_node_unhealthy_moves_an_elastic_job_with_a_checkpoint() -> None:
    job = running(s=spec(nodes=2, elastic=(1, 2)))
    plan = RecoveryPolicy().plan(Signal(Trigger.NODE_UNHEALTHY, nodes=("n0",)), job, CFG, NOW)
    assert plan == StopPlan(StopKind.MIGRATE, Cause.NODE_UNHEALTHY, True, G, exclude_nodes=("n0",))


def test_node_unhealthy_leaves_a_fixed_gang_in_place() -> None:
    for s in (spec(nodes=2), spec(nodes=2, elastic=(2, 2))):
        job = running(s=s)
        assert RecoveryPolicy().plan(Signal(Trigger.NODE_UNHEALTHY, nodes=("n0",)), job, CFG, NOW) is None


def test_stay_in_place_policy_keeps_the_job_and_its_nodes() -> None:
    job = running(s=spec(nodes=2, elastic=(1, 2)))
    p = StayInPlace()
    assert p.plan(Signal(Trigger.NODE_UNHEALTHY, nodes=("n0",)), job, CFG, NOW) is None
    assert p.exclude_after_failure(("n0",)) == ()
    assert RecoveryPolicy().exclude_after_failure(("n0",)) == ("n0",)
    # Everything else is the default's answer.
    assert p.plan(Signal(Trigger.REGION_DRAIN), job, CFG, NOW) == RecoveryPolicy().plan(
        Signal(Trigger.REGION_DRAIN), job, CFG, NOW)


def test_policy_choice_label_over_config() -> None:
    plain = running()
    labelled = running(s=spec(**{"cb.recovery_policy": "stay-in-place"}))
    assert policy_for(plain, CFG).name == "move-anywhere"
    assert policy_for(labelled, CFG).name == "stay-in-place"
    cfg = CFG.model_copy(update={"recovery_policy": "stay-in-place"})
    assert policy_for(plain, cfg).name == "stay-in-place"
    odd = pb.Job()
    odd.CopyFrom(plain)
    odd.spec.labels["cb.recovery-policy"] = "no-such-policy"
    assert policy_for(odd, CFG).name == "move-anywhere"
    assert set(POLICIES) == {"move-anywhere", "stay-in-place", "no-migration", "failover", "defragment",
                             "better-capacity"}


def test_unknown_policy_names_are_refused_at_the_edges() -> None:
    from broker.api.errors import InvalidArgument
    from broker.api.validation import validate_spec
    from broker.config import BrokerConfig

    with pytest.raises(ValueError, match="recovery_policy"):
        BrokerConfig(recovery_policy="teleport")
    s = spec()
    s.labels["cb.recovery-policy"] = "teleport"
    with pytest.raises(InvalidArgument, match="move-anywhere, no-migration, stay-in-place"):
        validate_spec(s, CFG.priority_classes)


# ---- the simulator's baselines and proactive policies (simulator/policies.py) ------------
def test_no_migration_kills_without_a_checkpoint_and_never_moves_proactively() -> None:
    job, p = running(), NoMigration()
    spot = p.plan(Signal(Trigger.SPOT_NOTICE, nodes=("n0",), deadline=NOW + 120), job, CFG, NOW)
    assert spot == StopPlan(StopKind.MIGRATE, Cause.SPOT_INTERRUPTION, False, 0.0)
    assert p.plan(Signal(Trigger.REGION_DRAIN), job, CFG, NOW) == StopPlan(
        StopKind.DRAIN, Cause.REGION_DRAIN, False, 0.0)
    assert p.plan(Signal(Trigger.BETTER_CAPACITY), job, CFG, NOW) is None
    assert p.plan(Signal(Trigger.DEFRAGMENT, nodes=("n0",)), job, CFG, NOW) is None
    # a preemption still checkpoints (the scheduler asks for it)
    assert p.plan(Signal(Trigger.PREEMPTED), job, CFG, NOW) == RecoveryPolicy().plan(
        Signal(Trigger.PREEMPTED), job, CFG, NOW)


def test_failover_avoids_the_capacity_that_failed_it() -> None:
    plan = Failover().plan(Signal(Trigger.SPOT_NOTICE, nodes=("n0",), deadline=NOW + 120), running(), CFG, NOW)
    assert plan == StopPlan(StopKind.MIGRATE, Cause.SPOT_INTERRUPTION, False, 0.0, exclude_nodes=("n0",))


def test_proactive_policies_plan_like_move_anywhere() -> None:
    job = running()
    for p in (Defragment(), BetterCapacity()):
        for sig in (Signal(Trigger.DEFRAGMENT, nodes=("b0",)), Signal(Trigger.BETTER_CAPACITY),
                    Signal(Trigger.SPOT_NOTICE, deadline=NOW + 120)):
            assert p.plan(sig, job, CFG, NOW) == RecoveryPolicy().plan(sig, job, CFG, NOW)


# ---- Trigger.NODE_LOST: replace in place or relaunch from the store ------------------
def lost_view(**kw: object) -> LostNodes:
    """A 3-node job on agent a1, pool p, that lost n1; one spare s0 in n1's block."""
    base: dict = dict(lost=("n1",), survivors=("n0", "n2"), agent_id="a1", pool="p",
                      blocks={"n1": "b0"}, pool_has_blocks=True,
                      spares=(SpareNode("s0", "a1", "p", "b0"),), memory_every=1)
    base.update(kw)
    return LostNodes(**base)


NODE_LOST = Signal(Trigger.NODE_LOST, nodes=("n1",))

# view changes -> (plan kind, blocker, spare swaps)
RELAUNCH_CASES = [
    ({}, (Relaunch.REPLACE_IN_PLACE, Blocker.NONE, (("n1", "s0"),))),
    # no spare in the pool: the store path, as today
    (dict(spares=()), (Relaunch.FROM_STORE, Blocker.NO_SPARE, ())),
    # the memory tier is off: nothing to restore from, the store path
    (dict(memory_every=0), (Relaunch.FROM_STORE, Blocker.MEMORY_TIER_OFF, ())),
    # the only spare is in another block of a pool that has blocks: not used
    (dict(spares=(SpareNode("s1", "a1", "p", "b1"),)), (Relaunch.FROM_STORE, Blocker.NO_SPARE, ())),
    # ... but any block will do in a pool without blocks
    (dict(spares=(SpareNode("s1", "a1", "p", ""),), blocks={"n1": ""}, pool_has_blocks=False),
     (Relaunch.REPLACE_IN_PLACE, Blocker.NONE, (("n1", "s1"),))),
    # a spare of another pool or another agent never takes the place
    (dict(spares=(SpareNode("s2", "a1", "q", "b0"), SpareNode("s3", "a2", "p", "b0"))),
     (Relaunch.FROM_STORE, Blocker.NO_SPARE, ())),
    # two lost nodes need two spares, each from its own block
    (dict(lost=("n1", "n2"), survivors=("n0",), blocks={"n1": "b0", "n2": "b1"},
          spares=(SpareNode("s0", "a1", "p", "b0"), SpareNode("s1", "a1", "p", "b1"))),
     (Relaunch.REPLACE_IN_PLACE, Blocker.NONE, (("n1", "s0"), ("n2", "s1")))),
    (dict(lost=("n1", "n2"), survivors=("n0",), blocks={"n1": "b0", "n2": "b0"}),
     (Relaunch.FROM_STORE, Blocker.NO_SPARE, ())),
    # every node lost: both copies of every shard are gone
    (dict(lost=("n0", "n1", "n2"), survivors=()), (Relaunch.FROM_STORE, Blocker.ALL_NODES_LOST, ())),
    # a survivor was taken by another job (or went away) meanwhile
    (dict(survivors_gone=("n2",)), (Relaunch.FROM_STORE, Blocker.SURVIVOR_GONE, ())),
    # no spare, but the job is elastic: it goes on with its survivors, from memory
    (dict(spares=(), elastic=True, min_nodes=2), (Relaunch.SHRINK_IN_PLACE, Blocker.SHRINK, ())),
    (dict(spares=(), elastic=True), (Relaunch.SHRINK_IN_PLACE, Blocker.SHRINK, ())),
    # ... a spare still wins: the job keeps its size
    (dict(elastic=True, min_nodes=2), (Relaunch.REPLACE_IN_PLACE, Blocker.NONE, (("n1", "s0"),))),
    # ... but not below its min_nodes
    (dict(spares=(), elastic=True, min_nodes=3), (Relaunch.FROM_STORE, Blocker.BELOW_MIN_NODES, ())),
    (dict(lost=("n1", "n2"), survivors=("n0",), blocks={"n1": "b0", "n2": "b0"}, elastic=True,
          min_nodes=2), (Relaunch.FROM_STORE, Blocker.BELOW_MIN_NODES, ())),
    # ... and never without the memory tier, a survivor, or a survivor still free
    (dict(spares=(), elastic=True, memory_every=0), (Relaunch.FROM_STORE, Blocker.MEMORY_TIER_OFF, ())),
    (dict(spares=(), elastic=True, lost=("n0", "n1", "n2"), survivors=()),
     (Relaunch.FROM_STORE, Blocker.ALL_NODES_LOST, ())),
    (dict(spares=(), elastic=True, survivors_gone=("n0",)),
     (Relaunch.FROM_STORE, Blocker.SURVIVOR_GONE, ())),
]


@pytest.mark.parametrize(("kw", "want"), RELAUNCH_CASES, ids=[str(i) for i in range(len(RELAUNCH_CASES))])
def test_node_lost_relaunch_plan(kw: dict, want: tuple) -> None:
    plan = RecoveryPolicy().relaunch(NODE_LOST, lost_view(**kw))
    assert (plan.kind, plan.blocker, plan.swaps) == want
    assert RELAUNCH_RULES[plan.blocker][0] is plan.kind
    assert plan.why and "{" not in plan.why  # every placeholder filled


def test_node_lost_reasons_name_the_pool_block_and_spare() -> None:
    inplace = RecoveryPolicy().relaunch(NODE_LOST, lost_view())
    assert "spare s0 takes the place of lost node n1 in pool p" in inplace.why
    assert "survivors n0, n2" in inplace.why
    other_block = RecoveryPolicy().relaunch(NODE_LOST, lost_view(spares=(SpareNode("s1", "a1", "p", "b1"),)))
    assert other_block.why == ("no ready spare for n1 in pool p (block b0), and the job's size"
                               " is fixed (no elasticity)")
    shrink = RecoveryPolicy().relaunch(NODE_LOST, lost_view(spares=(), elastic=True))
    assert shrink.why == ("no ready spare for n1 in pool p (block b0); the elastic job goes on"
                          " with its survivors n0, n2 (3 -> 2 nodes) and ranks reshard their"
                          " peers' memory copies")
    low = RecoveryPolicy().relaunch(NODE_LOST, lost_view(spares=(), elastic=True, min_nodes=3))
    assert low.why.endswith("and 2 surviving node(s) are fewer than the job's min_nodes 3")
    off = RecoveryPolicy().relaunch(NODE_LOST, lost_view(memory_every=0))
    assert "memory tier is off" in off.why


def test_node_lost_policies_without_spares_use_the_store() -> None:
    """Every policy has an answer; the simulator's no-migration baselines (and Failover)
    never replace in place; the others do when they can."""
    for name, policy in POLICIES.items():
        plan = policy.relaunch(NODE_LOST, lost_view())
        shrink = policy.relaunch(NODE_LOST, lost_view(spares=(), elastic=True))
        if isinstance(policy, NoMigration):
            assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.POLICY), name
            assert (shrink.kind, shrink.blocker) == (Relaunch.FROM_STORE, Blocker.POLICY), name
        else:
            assert plan.kind is Relaunch.REPLACE_IN_PLACE, name
            assert shrink.kind is Relaunch.SHRINK_IN_PLACE, name
    assert all(r in RELAUNCH_RULES for r in Blocker)  # one row per blocker
    # a policy that replaces in place but never shrinks: the store, saying why
    no_shrink = dataclasses.replace(RecoveryPolicy(), name="no-shrink", shrink_in_place=False)
    plan = no_shrink.relaunch(NODE_LOST, lost_view(spares=(), elastic=True))
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.NO_SPARE_NO_SHRINK)
    assert plan.why.endswith("recovery policy no-shrink does not shrink in place")
    # NODE_LOST is not a stop: plan() leaves the running attempt alone
    assert RecoveryPolicy().plan(NODE_LOST, running(), CFG, NOW) is None
