"""Recovery policy, one case per trigger: the StopPlan (or none) each policy gives.

The newcomer's path for a new trigger (docs/architecture.md): a member of
``Trigger``, its rule in ``broker/jobs/recovery.py``, a row here.
"""

from __future__ import annotations

import pytest

from broker.jobs.causes import Cause, Family, StopKind
from broker.jobs.recovery import (
    POLICIES,
    BetterCapacity,
    Defragment,
    Failover,
    NoMigration,
    RecoveryPolicy,
    Restart,
    Signal,
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
