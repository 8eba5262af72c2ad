"""Spare nodes per pool: which free nodes are reserved, and that placement never uses them.

The pure choice (:func:`broker.scheduling.spares.reserved`), the scheduler's snapshot
(the spares are cordoned in it, so ``placement.schedule`` leaves them out, and the same
node tuple comes back while the spares do not change), and the in-place view a job that
lost a node gets (:func:`broker.scheduling.replacements.lost_view`).
"""

from __future__ import annotations

import placement
from broker.agents.registry import AgentSession, AgentState
from broker.jobs.lifecycle import PENDING, RUNNING
from broker.jobs.recovery import Blocker, RecoveryPolicy, Relaunch, Signal, Trigger
from broker.scheduling import snapshot as snap
from broker.scheduling.replacements import lost_view
from broker.scheduling.spares import reserved
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

T0 = 1_800_000_000.0


def node(i: int, *, pool: str = "p", block: str = "b0", healthy: bool = True,
         cordoned: bool = False) -> placement.NodeInfo:
    return placement.NodeInfo(id=f"n{i}", agent_id="a1", region="r", zone="z", gpus=8,
                              pool=pool, layer3=block, healthy=healthy, cordoned=cordoned)


def test_spares_are_the_highest_free_usable_nodes_of_each_pool() -> None:
    nodes = [node(i) for i in range(5)] + [node(9, pool="q")]
    per_pool = {("a1", "p"): 2}
    assert reserved(nodes, per_pool, used=set()) == {"n4", "n3"}
    # used, held (waiting for an in-place decision) and unusable nodes are never spares
    assert reserved(nodes, per_pool, used={"n4"}, held={"n3"}) == {"n2", "n1"}
    sick = [node(0), node(1), node(2, healthy=False), node(3, cordoned=True)]
    assert reserved(sick, per_pool, used=set()) == {"n1", "n0"}
    # a node blamed for a failure is chosen last
    assert reserved(nodes, per_pool, used=set(), blamed={"n4"}) == {"n3", "n2"}
    # a pool with fewer free nodes than spares has them all; no entry, no spares
    assert reserved(nodes, per_pool, used={"n0", "n1", "n2", "n3"}) == {"n4"}
    assert reserved(nodes, {}, used=set()) == frozenset()
    assert reserved(nodes, {("a2", "p"): 1}, used=set()) == frozenset()


def test_labelled_spares_come_first_and_a_busy_one_has_a_stand_in() -> None:
    """Nodes the operator labelled spares (Node.spare) are the spares whenever they are
    free; one that is busy (labelled under a running job) or broken leaves its place to
    the pool's next free node until it is free again."""
    nodes = [node(i) for i in range(5)]
    per_pool = {("a1", "p"): 2}
    assert reserved(nodes, per_pool, used=set(), designated={"n0", "n1"}) == {"n0", "n1"}
    assert reserved(nodes, per_pool, used={"n0"}, designated={"n0", "n1"}) == {"n1", "n4"}
    sick = [node(0, healthy=False), *nodes[1:]]
    assert reserved(sick, per_pool, used=set(), designated={"n0", "n1"}) == {"n1", "n4"}


def agent(count: int, spares: int, labelled: tuple[str, ...] = ()) -> AgentState:
    nodes = [pb.Node(id=f"n{i}", region="r", zone="z", gpus=1, accelerator="sim", pool="p",
                     healthy=True, network_layer_3="b0", capacity_type=pb.CAPACITY_TYPE_ON_DEMAND,
                     spare=f"n{i}" in labelled)
             for i in range(count)]
    rec = apb.Register(agent_id="a1", region="r", nodes=nodes, pool_spares={"p": spares})
    return AgentState("a1", rec, last_seen=T0, session=AgentSession("a1"))


def job(job_id: str, nodes: int, phase: int = PENDING, placed: tuple[str, ...] = ()) -> pb.Job:
    j = pb.Job(id=job_id, phase=phase, created_time=T0, version=1, spec=pb.JobSpec(
        team="ml", priority_class="training", resources=pb.Resources(nodes=nodes, gpus_per_node=1)))
    j.spec.trainer.options["memory_every"] = "1"
    if placed:
        j.placement.agent_id, j.placement.region, j.placement.pool = "a1", "r", "p"
        j.placement.nodes.extend(pb.NodeAssignment(node_id=n, gpus=1, network_layer_3="b0")
                                 for n in placed)
    return j


def build(agents: list[AgentState], jobs: list[pb.Job],
          memo: snap.NodeMemo | None = None) -> placement.Snapshot:
    return snap.build(now=T0, agents=agents, jobs=jobs, teams=[], plans=[], draining=[],
                      priority_of=lambda spec: 50, node_memo=memo)


def test_the_scheduler_never_places_ordinary_ranks_on_a_spare() -> None:
    fleet = [agent(4, spares=1)]
    s = build(fleet, [job("j3", 3)])
    assert s.spares == {"n3"}
    assert [n.id for n in s.nodes if n.cordoned] == ["n3"]
    decided = placement.schedule(s)
    assert [sorted(n for n, _ in a.assignments) for a in decided.admissions] == [["n0", "n1", "n2"]]
    # a job that would need the spare waits
    s4 = build(fleet, [job("j4", 4)])
    assert placement.schedule(s4).admissions == []
    # running on n0..n2: n3 stays the spare; no spares asked: nothing is reserved
    assert build(fleet, [job("r", 3, RUNNING, ("n0", "n1", "n2"))]).spares == {"n3"}
    assert build([agent(4, spares=0)], [job("j4", 4)]).spares == frozenset()
    # the operator labelled n0 a spare: it is the one kept, the job gets n1..n3
    s = build([agent(4, spares=1, labelled=("n0",))], [job("j3", 3)])
    assert s.spares == {"n0"}
    decided = placement.schedule(s)
    assert [sorted(n for n, _ in a.assignments) for a in decided.admissions] == [["n1", "n2", "n3"]]


def test_unchanged_spares_keep_the_same_node_tuple() -> None:
    """The admission cache skips an unchanged fleet by identity (admission.py)."""
    fleet, memo = [agent(4, spares=1)], snap.NodeMemo()
    first = build(fleet, [job("j3", 3)], memo)
    again = build(fleet, [job("j3", 3)], memo)
    assert again.nodes is first.nodes
    moved = build(fleet, [job("r", 1, RUNNING, ("n3",))], memo)  # n3 used: n2 is the spare
    assert moved.spares == {"n2"} and moved.nodes is not first.nodes


def lost_job(lost: str = "n1") -> pb.Job:
    j = job("j", 3, PENDING, ("n0", "n1", "n2"))
    j.attempt = 1
    rec = j.node_recovery
    rec.failed_attempt, rec.step_at_failure = 1, 14
    rec.lost_nodes.append(lost)
    rec.survivors.extend(n for n in ("n0", "n1", "n2") if n != lost)
    j.excluded_nodes.append(lost)
    return j


def plan_for(agents: list[AgentState], j: pb.Job, others: list[pb.Job] = ()):  # noqa: ANN201
    s = build(agents, [j, *others])
    used = {n for r in s.running for n, _ in r.allocations}
    view = lost_view(j, s, {n.id: n for n in s.nodes}, used, set(s.spares))
    return RecoveryPolicy().relaunch(Signal(Trigger.NODE_LOST, nodes=view.lost), view), view


def test_a_job_that_lost_a_node_sees_the_spare_and_its_survivors() -> None:
    plan, view = plan_for([agent(4, spares=1)], lost_job())
    # survivors and the lost node are held, not spares: n3 is the spare
    assert view.survivors == ("n0", "n2") and not view.survivors_gone
    assert [sp.id for sp in view.spares] == ["n3"] and view.pool_has_blocks
    assert (plan.kind, plan.swaps) == (Relaunch.REPLACE_IN_PLACE, (("n1", "n3"),))


def test_no_spare_or_a_survivor_taken_means_the_store_path() -> None:
    plan, _ = plan_for([agent(3, spares=0)], lost_job())
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.NO_SPARE)
    taker = job("other", 1, RUNNING, ("n2",))
    plan, view = plan_for([agent(4, spares=1)], lost_job(), [taker])
    assert view.survivors_gone == ("n2",)
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.SURVIVOR_GONE)
    off = lost_job()
    off.spec.trainer.options["memory_every"] = "0"
    plan, _ = plan_for([agent(4, spares=1)], off)
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.MEMORY_TIER_OFF)


def test_a_registration_reserving_more_spares_than_nodes_is_refused() -> None:
    import pytest

    from broker.api.errors import InvalidArgument
    from broker.api.validation import validate_register

    validate_register(agent(3, spares=2).record)
    with pytest.raises(InvalidArgument, match="pool 'p' reserves 4 spare nodes; 0 to the agent's 3"):
        validate_register(agent(3, spares=4).record)


def test_a_job_that_only_spares_could_hold_says_so_in_its_pending_reason() -> None:
    """4 nodes, 1 spare: a 4-node job would fit only on the spare too, and its reason
    says so (ahead of the ordinary one); a 5-node job would not fit even with the spare,
    so its reason is the ordinary one; a 3-node job is placed."""
    fleet = [agent(4, spares=1)]
    reasons = placement.schedule(build(fleet, [job("j4", 4), job("j5", 5)])).pending_reasons
    assert reasons["j4"].startswith(
        "only reserved spares are free in pool p of r/a1: 1 of the 4 node(s) it needs would be"
        " spares (the pool keeps 1 free for replacing lost nodes in place); needs 4 GPUs")
    assert "spare" not in reasons["j5"] and reasons["j5"].startswith("needs 5 GPUs")
    assert not placement.schedule(build(fleet, [job("j3", 3)])).pending_reasons
    # a job the spares cannot complete never builds the second index (a full fleet
    # pays nothing per admission for the note)
    from placement.scheduler import _Pass

    too_big = _Pass(build(fleet, [job("j5", 5)]))
    assert "spare" not in too_big.run().pending_reasons["j5"] and too_big.spare_view is None
    # no spares reserved: the same job gets the ordinary reason only
    plain = placement.schedule(build([agent(3, spares=0)], [job("j4", 4)])).pending_reasons
    assert "spare" not in plain["j4"]


def test_a_pool_whose_only_usable_node_is_its_spare_says_so() -> None:
    """The pool's other node is unhealthy: no ordinary capacity matches at all."""
    a = agent(2, spares=1)
    a.record.nodes[0].healthy = False
    reasons = placement.schedule(build([a], [job("j1", 1)])).pending_reasons
    assert reasons["j1"].startswith("only reserved spares are free in pool p of r/a1: 1 of the 1")
    assert "no usable capacity matches" in reasons["j1"]
