"""An in-place relaunch respects its team's quota exactly like any admission.

The rule (docs/recovery.md, "Quota"): the failed attempt released the job's GPUs when
it was requeued, so the relaunch needs the whole job's GPUs again from the team's room
now -- guarantee headroom, what the cohort lends (not what a lender's own queued work
waits for), the surplus no guarantee covers, and the region cap. A team that was within
its limits finds that room again (even at exactly its limit); a team over its limits
does not keep capacity by losing a node: the job goes to the store path and waits in
the queue with the quota reason, like any admission.

Pure cases through the pass's own view (:func:`broker.scheduling.replacements.lost_view`
and the recovery policy), the check itself (:class:`placement.quota_check.QuotaCheck`),
and a real broker with a scripted agent: in place at exactly the limit, then, after the
operator lowers the guarantee, the next node loss goes to the store path and the job
waits for quota instead of taking the spare.
"""

from __future__ import annotations

from pathlib import Path

import placement
from broker.agents.registry import AgentSession, AgentState
from broker.jobs.lifecycle import PENDING, RUNNING
from broker.jobs.recovery import Blocker, RecoveryPolicy, Relaunch, Signal, Trigger
from broker.scheduling import snapshot as snap
from broker.scheduling.replacements import lost_view
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from placement.quota_check import QuotaCheck
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

T0 = 1_800_000_000.0


def agent(count: int = 6, spares: int = 2) -> AgentState:
    nodes = [pb.Node(id=f"n{i}", region="r", zone="z", gpus=1, accelerator="sim", pool="p",
                     healthy=True, network_layer_3="b0", capacity_type=pb.CAPACITY_TYPE_ON_DEMAND)
             for i in range(count)]
    rec = apb.Register(agent_id="a1", region="r", nodes=nodes, pool_spares={"p": spares})
    return AgentState("a1", rec, last_seen=T0, session=AgentSession("a1"))


def job(job_id: str, nodes: int, phase: int = PENDING, placed: tuple[str, ...] = (),
        team: str = "ml") -> pb.Job:
    j = pb.Job(id=job_id, phase=phase, created_time=T0, version=1, spec=pb.JobSpec(
        team=team, priority_class="training", resources=pb.Resources(nodes=nodes, gpus_per_node=1)))
    j.spec.trainer.options["memory_every"] = "1"
    if placed:
        j.placement.agent_id, j.placement.region, j.placement.pool = "a1", "r", "p"
        j.placement.nodes.extend(pb.NodeAssignment(node_id=n, gpus=1, network_layer_3="b0")
                                 for n in placed)
    return j


def lost_job(team: str = "ml") -> pb.Job:
    """3 nodes, n1 lost: requeued (holding nothing), waiting for its relaunch plan."""
    j = job("j", 3, PENDING, ("n0", "n1", "n2"), team=team)
    j.attempt = 1
    rec = j.node_recovery
    rec.failed_attempt, rec.step_at_failure = 1, 14
    rec.lost_nodes.append("n1")
    rec.survivors.extend(["n0", "n2"])
    j.excluded_nodes.append("n1")
    return j


def quota(team: str, gpus: int, cohort: str = "", strategy: int = 0,
          borrow_limit: int | None = None) -> cpb.TeamQuota:
    entry = cpb.QuotaEntry(guaranteed_gpus=gpus)
    if borrow_limit is not None:
        entry.borrow_limit_gpus = borrow_limit
    return cpb.TeamQuota(team=team, cohort=cohort, strategy=strategy, quotas=[entry])


def plan_for(teams: list[cpb.TeamQuota], others: list[pb.Job] = (), j: pb.Job | None = None):  # noqa: ANN201
    j = j or lost_job()
    s = snap.build(now=T0, agents=[agent()], jobs=[j, *others], teams=teams, plans=[], draining=[],
                   priority_of=lambda spec: 50)
    used = {n for r in s.running for n, _ in r.allocations}
    view = lost_view(j, s, {n.id: n for n in s.nodes}, used, set(s.spares))
    return RecoveryPolicy().relaunch(Signal(Trigger.NODE_LOST, nodes=view.lost), view)


def test_a_team_at_exactly_its_limit_gets_its_job_back_in_place() -> None:
    """The job's own 3 GPUs are what freed: 0 used + 3 <= 3 guaranteed."""
    plan = plan_for([quota("ml", 3)])
    assert (plan.kind, plan.blocker) == (Relaunch.REPLACE_IN_PLACE, Blocker.NONE)
    # no quotas at all (quotas off): in place as before
    assert plan_for([]).kind is Relaunch.REPLACE_IN_PLACE


def test_a_team_over_its_guarantee_does_not_keep_capacity_by_losing_a_node() -> None:
    """The operator lowered the guarantee to 2 under a running 3-GPU job: ordinary
    admission would not give it 3 GPUs, so neither does the relaunch."""
    plan = plan_for([quota("ml", 2)])
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.QUOTA)
    assert plan.why == ("team ml over quota for any accelerator: uses 0 of 2 guaranteed GPUs"
                        " and needs 3 more (borrowing disabled)")
    assert not plan.swaps
    # room taken since by another of its jobs: 2 running + 3 > 4
    other = job("o", 2, RUNNING, ("n3", "n4"))
    plan = plan_for([quota("ml", 4)], [other])
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.QUOTA)
    assert "uses 2 of 4 guaranteed GPUs and needs 3 more" in plan.why


def test_borrowed_gpus_come_back_only_while_the_cohort_still_lends_them() -> None:
    """ml borrows 2 of its 3 GPUs from lender's idle guarantee. While lender is idle the
    relaunch borrows them again; once lender's own queued job waits for that guarantee
    (demand-aware lending: it is not idle), the relaunch must not take it."""
    teams = [quota("ml", 1, "c"), quota("lender", 4, "c")]
    plan = plan_for(teams)
    assert plan.kind is Relaunch.REPLACE_IN_PLACE
    waiting = job("lj", 3, PENDING, team="lender")
    plan = plan_for(teams, [waiting])
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.QUOTA)
    assert "cohort c has 1 idle GPUs to lend" in plan.why
    # a borrow limit counts too: it may borrow 1, it needs 2 above its guarantee
    plan = plan_for([quota("ml", 1, "c", borrow_limit=1), quota("lender", 4, "c")])
    assert (plan.kind, plan.blocker) == (Relaunch.FROM_STORE, Blocker.QUOTA)


def test_the_check_charges_what_it_lets_through_and_reads_region_caps() -> None:
    s = placement.Snapshot(
        now=T0, nodes=tuple(placement.NodeInfo(id=f"n{i}", agent_id="a1", region="r", zone="z",
                                               gpus=1) for i in range(8)),
        running=(), pending=(),
        teams=(placement.TeamQuota(team="ml", guaranteed=(("", 5),), region_caps=(("r", 4),)),))
    check = QuotaCheck(s)
    assert check.short("ml", "", 3, "r") == ""
    check.charge("ml", "", 3, "r")
    # two relaunches in one pass cannot both use the same room
    assert check.short("ml", "", 2, "r").startswith("team ml is at its region cap in r (3/4 GPUs)")
    assert check.short("ml", "", 2, "elsewhere") == ""
    assert "uses 3 of 5 guaranteed GPUs and needs 3 more" in check.short("ml", "", 3, "elsewhere")


def test_surplus_no_guarantee_covers_is_lendable_as_in_the_pass_last_phase() -> None:
    """8 usable GPUs, 2 guaranteed in all: 6 belong to nobody, and a team in a cohort
    may borrow them (placement's phase 3), so the relaunch may too."""
    s = placement.Snapshot(
        now=T0, nodes=tuple(placement.NodeInfo(id=f"n{i}", agent_id="a1", region="r", zone="z",
                                               gpus=1) for i in range(8)),
        running=(), pending=(),
        teams=(placement.TeamQuota(team="ml", cohort="c", guaranteed=(("", 1),)),
               placement.TeamQuota(team="other", cohort="c", guaranteed=(("", 1),))))
    assert QuotaCheck(s).short("ml", "", 3, "r") == ""
    fixed = placement.Snapshot(now=T0, nodes=s.nodes, running=(), pending=(), teams=(
        placement.TeamQuota(team="ml", guaranteed=(("", 1),), can_borrow=False),))
    assert "(borrowing disabled)" in QuotaCheck(fixed).short("ml", "", 3, "r")


def _launched(agent_: FakeAgent, job_id: str, attempt: int) -> bool:
    return any(c.attempt == attempt for c in agent_.commands("launch", job_id))


def test_broker_relaunches_in_place_at_the_limit_and_not_over_it(tmp_path: Path) -> None:
    """A real broker, one agent with 7 one-GPU nodes and 2 spares, team ml guaranteed
    exactly the job's 3 GPUs: a node loss is replaced in place. The operator then lowers
    the guarantee to 2; the next loss goes to the store path (the event says why), the
    spare stays a spare, and the job waits with the quota reason instead of running."""
    b = Broker(fast_config(tmp_path, max_restarts=5))
    a = None
    try:
        b.team("ml", gpus=3)
        a = FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 7, 1, pool="p"),
                      spares={"p": 2}).connect()
        j = b.submit(spec("q", nodes=3, gpus=1, trainer=pb.TrainerSpec(
            total_steps=100, checkpoint_every=10, global_batch_size=8, options={"memory_every": "1"})))
        first = a.wait_launch(j.id, 1)
        placed = [n.node_id for n in first.placement.nodes]
        assert not {"a1-n5", "a1-n6"} & set(placed)  # the spares
        a.update(j.id, 1, apb.ATTEMPT_STATE_STARTING)
        a.update(j.id, 1, apb.ATTEMPT_STATE_RUNNING, step=12)
        b.wait_phase(j.id, pb.JOB_PHASE_RUNNING)
        a.update(j.id, 1, apb.ATTEMPT_STATE_FAILED, exit_code=1, message="rank died",
                 failed_nodes=[placed[1]])
        second = a.wait_launch(j.id, 2, timeout=30)
        again = [n.node_id for n in second.placement.nodes]
        assert again[0] == placed[0] and again[2] == placed[2]
        assert again[1] in {"a1-n5", "a1-n6"}  # a spare took the lost node's slot
        rec = b.get(j.id).node_recovery
        assert rec.plan == "replace_in_place"

        b.team("ml", gpus=2)  # lowered under the running job
        a.update(j.id, 2, apb.ATTEMPT_STATE_STARTING)
        a.update(j.id, 2, apb.ATTEMPT_STATE_RUNNING, step=20)
        b.wait_phase(j.id, pb.JOB_PHASE_RUNNING)
        a.update(j.id, 2, apb.ATTEMPT_STATE_FAILED, exit_code=1, message="rank died",
                 failed_nodes=[again[0]])
        got = wait_until(lambda: (g := b.get(j.id)).node_recovery.plan
                         and g.node_recovery.failed_attempt == 2 and g, 30, "the second plan")
        assert got.node_recovery.plan == "from_store"
        assert got.node_recovery.why.startswith("team ml over quota")
        ev = [e for e in b.events(j.id) if e.reason == "from_store"]
        assert ev and "relaunching from the store (team ml over quota for any accelerator:" \
                      " uses 0 of 2 guaranteed GPUs and needs 3 more" in ev[-1].message
        waiting = wait_until(lambda: (g := b.get(j.id)).pending_reason and g, 20, "a pending reason")
        assert waiting.phase == pb.JOB_PHASE_PENDING
        assert "team ml over quota" in waiting.pending_reason
        assert not _launched(a, j.id, 3)
        # the operator gives the quota back: admitted again by the ordinary path
        b.team("ml", gpus=3)
        third = a.wait_launch(j.id, 3, timeout=30)
        assert len(third.placement.nodes) == 3
    finally:
        if a is not None:
            a.close()
        b.stop()
