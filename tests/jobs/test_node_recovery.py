"""A job that lost nodes, through the pure transitions: the record its failure leaves, the
plan written by the scheduler's pass (in place: launched at once on the survivors plus
the spares, in slot order; from the store: queued), and the event its relaunch's first
resume report turns into."""

from __future__ import annotations

import dataclasses

import placement
from broker.jobs import node_recovery as nr
from broker.jobs import transitions as t
from broker.jobs import updates
from broker.jobs.lifecycle import LAUNCHING, PENDING
from broker.jobs.outcome import SendLaunch
from broker.jobs.recovery import (
    Blocker,
    LostNodes,
    RecoveryPolicy,
    Relaunch,
    Signal,
    SpareNode,
    Trigger,
)
from computebroker.v1 import agent_pb2 as apb
from tests.jobs.helpers import AGENT, CFG, admission, must, spec, submitted, update


def failed_after_losing_n1(memory_every: str = "1", min_nodes: int = 0):  # noqa: ANN201
    s = spec(nodes=3)
    s.trainer.options["memory_every"] = memory_every
    if min_nodes:
        s.elasticity.min_nodes, s.elasticity.max_nodes = min_nodes, 3
    j = must(t.admit(submitted(s), admission(3), 110.0, CFG))
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=14, ckpt=10), 120.0, CFG))
    return must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=-9,
                                                failed=("n1",)), 130.0, CFG))


SPARES = (SpareNode("s0", AGENT, "", ""),)


def view(j) -> LostNodes:  # noqa: ANN001
    return LostNodes(lost=tuple(j.node_recovery.lost_nodes), survivors=tuple(j.node_recovery.survivors),
                     agent_id=AGENT, pool="", spares=SPARES, memory_every=nr.memory_every(j))


def test_a_failure_blaming_a_node_leaves_the_record_for_the_pass() -> None:
    j = failed_after_losing_n1()
    rec = j.node_recovery
    assert j.phase == PENDING and nr.undecided(j)
    assert (rec.failed_attempt, list(rec.lost_nodes), list(rec.survivors), rec.step_at_failure) == (
        1, ["n1"], ["n0", "n2"], 14)


def test_in_place_launches_on_the_survivors_with_the_spare_in_the_lost_slot() -> None:
    j = failed_after_losing_n1()
    plan = RecoveryPolicy().relaunch(Signal(Trigger.NODE_LOST, nodes=("n1",)), view(j))
    assert plan.kind is Relaunch.REPLACE_IN_PLACE
    adm = placement.Admission(job_id=j.id, agent_id=AGENT, region="us-east-2",
                              assignments=(("n0", 8), ("s0", 8), ("n2", 8)))
    out = nr.decide(j, nr.Decided(plan, t.Admit(admission=adm, nodes={}, checkpoint_bucket="s3://b")),
                    140.0, CFG)
    assert out is not None
    job = out.job
    assert job.phase == LAUNCHING and job.attempt == 2
    assert [a.node_id for a in job.placement.nodes] == ["n0", "s0", "n2"]
    assert dict(job.node_recovery.replaced) == {"n1": "s0"} and job.node_recovery.relaunch_attempt == 2
    launch = next(c for c in out.commands if isinstance(c, SendLaunch)).launch
    assert [a.node_id for a in launch.placement.nodes] == ["n0", "s0", "n2"]
    assert launch.resume_from.endswith("step-10")  # the store stays the fallback
    assert [e.type for e in out.events][:1] == ["node_recovery"]
    assert out.events[0].reason == "replace_in_place"
    assert nr.decide(job, nr.Decided(plan), 141.0, CFG) is None  # decided once

    # the relaunch's first resume report: from memory at step 14, nothing lost
    u = update(job, apb.ATTEMPT_STATE_RUNNING, step=14, ckpt=10)
    u.update.progress.resume.tier, u.update.progress.resume.step = "memory", 14
    u.update.progress.resume.restored_from_peer.append(1)
    out = updates.progress(job, u, 150.0, CFG)
    assert out is not None
    recovered = [e for e in out.events if e.type == "recovered"]
    assert [e.message for e in recovered] == [
        "recovered from memory (step 14, lost 0 steps); rank(s) 1 restored from another node's copy"]
    assert out.job.node_recovery.tier == "memory"
    again = updates.progress(out.job, update(out.job, apb.ATTEMPT_STATE_RUNNING, step=15, ckpt=10),
                             151.0, CFG)
    assert again is None or not [e for e in again.events if e.type == "recovered"]


def test_no_spare_an_elastic_job_shrinks_on_its_survivors_and_says_the_world_sizes() -> None:
    j = failed_after_losing_n1(min_nodes=2)
    v = view(j)
    v = dataclasses.replace(v, spares=(), elastic=True, min_nodes=2)
    plan = RecoveryPolicy().relaunch(Signal(Trigger.NODE_LOST, nodes=("n1",)), v)
    assert (plan.kind, plan.blocker, plan.swaps) == (Relaunch.SHRINK_IN_PLACE, Blocker.SHRINK, ())
    adm = placement.Admission(job_id=j.id, agent_id=AGENT, region="us-east-2",
                              assignments=(("n0", 8), ("n2", 8)))
    out = nr.decide(j, nr.Decided(plan, t.Admit(admission=adm, nodes={}, checkpoint_bucket="s3://b")),
                    140.0, CFG)
    assert out is not None
    job = out.job
    assert job.phase == LAUNCHING and job.attempt == 2 and not job.node_recovery.replaced
    assert [a.node_id for a in job.placement.nodes] == ["n0", "n2"]
    assert out.events[0].reason == "shrink_in_place"
    assert "lost n1: shrinking in place (no ready spare for n1" in out.events[0].message
    u = update(job, apb.ATTEMPT_STATE_RUNNING, step=14, ckpt=10)
    u.update.progress.resume.tier, u.update.progress.resume.step = "memory", 13
    u.update.progress.resumed_from_world_size, u.update.progress.world_size = 3, 2
    out = updates.progress(job, u, 150.0, CFG)
    assert out is not None
    assert [e.message for e in out.events if e.type == "recovered"] == [
        "recovered from memory (step 13, lost 1 steps, world 3 -> 2)"]


def test_from_the_store_stays_queued_and_says_why() -> None:
    j = failed_after_losing_n1(memory_every="0")
    plan = RecoveryPolicy().relaunch(Signal(Trigger.NODE_LOST, nodes=("n1",)), view(j))
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.MEMORY_TIER_OFF)
    out = nr.decide(j, nr.Decided(plan), 140.0, CFG)
    assert out is not None and out.job.phase == PENDING and not nr.undecided(out.job)
    assert out.events[0].message.startswith("attempt 1 lost n1: relaunching from the store (the job's"
                                            " memory tier is off")
    job = must(t.admit(out.job, admission(3), 150.0, CFG))  # ordinary placement, later
    # the first report after a store resume need not name the checkpoint yet
    u = update(job, apb.ATTEMPT_STATE_RUNNING)
    u.update.progress.resume.tier = "store"
    done = updates.progress(job, u, 160.0, CFG)
    assert done is not None
    assert [e.message for e in done.events if e.type == "recovered"] == [
        "recovered from store (step 10, lost 4 steps): the job's memory tier is off"
        " (trainer option memory_every)"]


def test_a_failure_without_blame_records_nothing() -> None:
    s = spec(nodes=2)
    j = must(t.admit(submitted(s), admission(2), 110.0, CFG))
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=1), 130.0, CFG))
    assert j.phase == PENDING and not j.HasField("node_recovery") and not nr.undecided(j)
