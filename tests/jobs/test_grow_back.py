"""A job shrunk in place grows back: the policy's rows, the pure transitions, and the
scheduler pass's view of the pool (docs/recovery.md, docs/operator/moves.md).

Policy rows (:meth:`RecoveryPolicy.grow`, ``GROW_RULES``): grow when capacity returned;
not when the team's quota has no room for the extra nodes; not within the settle time
(hysteresis) nor the rate limit; not for a fixed-size job; never under a policy that does
not grow back. Transitions (broker/jobs/grow_back.py): the shrink records the requested
size, a STAY pass writes only what changed, GROW_BACK stops the attempt checkpoint first
and records the full-size nodes (a lost node that came back is no longer avoided), and
the first attempt running at full size says "grew back to 3 nodes: capacity returned".
The pass's view (broker/scheduling/grow_watch.py) is built from a real snapshot of agent
and job records: which nodes count, in which order, and the hysteresis start.
"""

from __future__ import annotations

import dataclasses

import pytest

import placement
from broker.agents.registry import AgentSession, AgentState
from broker.jobs import grow_back as gb
from broker.jobs import node_recovery as nr
from broker.jobs import transitions as t
from broker.jobs import updates
from broker.jobs.causes import Cause, StopKind
from broker.jobs.lifecycle import CHECKPOINTING, QUEUED, RUNNING
from broker.jobs.outcome import SendStop
from broker.jobs.recovery import (
    POLICIES,
    Grow,
    GrowBlocker,
    LostNodes,
    RecoveryPolicy,
    ShrunkView,
    Signal,
    SizeRoute,
    Trigger,
    plan_stop,
)
from broker.scheduling import grow_watch
from broker.scheduling import snapshot as snap
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import AGENT, CFG, must, spec, submitted, update

NOW = 10_000.0


def shrunk_view(**kw: object) -> ShrunkView:
    """3 requested, 2 running, the lost node n1 free for 120 s, shrunk 600 s ago."""
    base: dict[str, object] = dict(requested=3, running=2, pool="p", free=("n1", "n3"), now=NOW,
                                   capacity_since=NOW - 120, last_change=NOW - 600, settle_s=60.0,
                                   min_interval_s=300.0, quota_short="", elastic=True)
    base.update(kw)
    return ShrunkView(**base)  # type: ignore[arg-type]


GROW_CASES = [
    ({}, (Grow.GROW_BACK, GrowBlocker.NONE, ("n1",), "capacity returned: n1 free in pool p")),
    (dict(free=()), (Grow.STAY, GrowBlocker.NO_CAPACITY, (),
                     "waiting for capacity: 1 more node(s) needed in pool p, 0 free")),
    (dict(requested=4, running=1, free=("n1", "n3")),
     (Grow.STAY, GrowBlocker.NO_CAPACITY, (), "waiting for capacity: 3 more node(s) needed in pool p,"
                                             " 2 free")),
    (dict(quota_short="team ml over quota for any accelerator: uses 2 of 2 guaranteed GPUs and"
                      " needs 1 more (borrowing disabled)"),
     (Grow.STAY, GrowBlocker.QUOTA, (), "capacity returned but the team's quota has no room for the"
                                        " extra nodes: team ml over quota for any accelerator: uses 2"
                                        " of 2 guaranteed GPUs and needs 1 more (borrowing disabled)")),
    (dict(capacity_since=NOW - 20), (Grow.STAY, GrowBlocker.SETTLING, (),
                                     "capacity returned; growing back at 02:47:20 UTC if it stays"
                                     " free (60 s settle time)")),
    (dict(capacity_since=NOW), (Grow.STAY, GrowBlocker.SETTLING, (),
                                "capacity returned; growing back at 02:47:40 UTC if it stays free"
                                " (60 s settle time)")),
    (dict(last_change=NOW - 100), (Grow.STAY, GrowBlocker.RATE_LIMIT, (),
                                   "capacity returned; growing back at 02:50:00 UTC (at most one"
                                   " resize per 300 s)")),
    (dict(elastic=False), (Grow.STAY, GrowBlocker.NOT_ELASTIC, (),
                           "the job's size is fixed (no elasticity)")),
    (dict(settle_s=0.0, min_interval_s=0.0, capacity_since=NOW, last_change=NOW),
     (Grow.GROW_BACK, GrowBlocker.NONE, ("n1",), "capacity returned: n1 free in pool p")),
]


@pytest.mark.parametrize(("kw", "want"), GROW_CASES, ids=[f"{c[1][1].name}-{i}" for i, c in enumerate(GROW_CASES)])
def test_grow_back_policy_rows(kw: dict, want: tuple) -> None:
    plan = RecoveryPolicy().grow(shrunk_view(**kw))
    assert (plan.kind, plan.blocker, plan.nodes, plan.why) == want


@pytest.mark.parametrize("route", list(SizeRoute), ids=[r.value for r in SizeRoute])
@pytest.mark.parametrize(("kw", "want"), GROW_CASES, ids=[f"{c[1][1].name}-{i}" for i, c in enumerate(GROW_CASES)])
def test_every_route_grows_back_by_the_same_rows(route: SizeRoute, kw: dict, want: tuple) -> None:
    """A job an elastic move or an elastic placement left small meets the same rules as a
    shrink in place (settle time, rate limit, quota, capacity); the plan names its route."""
    plan = RecoveryPolicy().grow(shrunk_view(route=route, region="eu-west-1", **kw))
    assert (plan.kind, plan.blocker, plan.nodes, plan.why) == want
    assert plan.route is route


def test_the_policy_rows_name_the_route_and_a_policy_may_grow_back_some_routes_only() -> None:
    only_shrinks = dataclasses.replace(RecoveryPolicy(), grow_routes=frozenset({SizeRoute.SHRINK_IN_PLACE}))
    assert only_shrinks.grow(shrunk_view()).kind is Grow.GROW_BACK
    plan = only_shrinks.grow(shrunk_view(route=SizeRoute.ELASTIC_MOVE, region="eu-west-1"))
    assert (plan.kind, plan.blocker, plan.route) == (Grow.STAY, GrowBlocker.POLICY, SizeRoute.ELASTIC_MOVE)
    assert plan.why == ("recovery policy move-anywhere does not grow jobs back (moved elastically to"
                        " eu-west-1 on fewer nodes)")
    plan = POLICIES["failover"].grow(shrunk_view(route=SizeRoute.ELASTIC_PLACEMENT, region="r"))
    assert plan.why == ("recovery policy failover does not grow jobs back (placed elastically in r"
                        " on fewer nodes (only part fitted))")


def test_policies_without_a_memory_tier_never_grow_back() -> None:
    for name in ("no-migration", "failover"):
        plan = POLICIES[name].grow(shrunk_view())
        assert (plan.kind, plan.blocker) == (Grow.STAY, GrowBlocker.POLICY), name
        assert plan.why == (f"recovery policy {name} does not grow jobs back (shrunk in place"
                            " after a node loss)")
        assert POLICIES[name].plan(Signal(Trigger.GROW_BACK), pb.Job(), CFG, NOW) is None
    for name in ("move-anywhere", "stay-in-place", "better-capacity", "defragment"):
        assert POLICIES[name].grow(shrunk_view()).kind is Grow.GROW_BACK, name


def test_the_grow_back_trigger_is_a_checkpoint_first_move() -> None:
    plan = RecoveryPolicy().plan(Signal(Trigger.GROW_BACK, nodes=("n0", "n2", "n1")),
                                 pb.Job(), CFG, NOW)
    assert plan is not None
    assert (plan.kind, plan.cause, plan.checkpoint_first, plan.grace_s, plan.exclude_nodes) == (
        StopKind.MIGRATE, Cause.GROW_BACK, True, CFG.preempt_grace_s, ())


def shrunk_running() -> pb.Job:
    """3 nodes asked (2 at least), n1 lost, no spare: shrunk in place onto n0, n2 at
    t=140 and running attempt 2 at t=150."""
    s = spec(nodes=3, elastic=(2, 3))
    s.trainer.options["memory_every"] = "1"
    adm3 = placement.Admission(job_id="j-1", agent_id=AGENT, region="us-east-2",
                               assignments=(("n0", 8), ("n1", 8), ("n2", 8)), pool="p")
    j = must(t.admit(submitted(s), t.Admit(adm3, {}, "s3://b"), 110.0, CFG))
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=14, ckpt=10), 120.0, CFG))
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=-9,
                                             failed=("n1",)), 130.0, CFG))
    plan = RecoveryPolicy().relaunch(Signal(Trigger.NODE_LOST, nodes=("n1",)), nr_view(j))
    adm2 = dataclasses.replace(adm3, assignments=(("n0", 8), ("n2", 8)))
    j = must(nr.decide(j, nr.Decided(plan, t.Admit(adm2, {}, "s3://b")), 140.0, CFG))
    return must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=15, ckpt=10), 150.0, CFG))


def nr_view(j: pb.Job) -> LostNodes:
    return LostNodes(lost=tuple(j.node_recovery.lost_nodes), survivors=tuple(j.node_recovery.survivors),
                     agent_id=AGENT, pool="p", memory_every=1, elastic=True, min_nodes=2)


def test_a_shrink_records_the_requested_size_and_the_way_back() -> None:
    j = shrunk_running()
    rec = j.shrunk
    assert j.phase == RUNNING and gb.is_shrunk(j)
    assert (rec.requested_nodes, rec.running_nodes, rec.since, list(rec.lost_nodes)) == (3, 2, 140.0, ["n1"])
    assert rec.why.startswith("no ready spare for n1 in pool p")
    assert "n1" in j.excluded_nodes  # the relaunch avoided it (move-anywhere)

    # a pass that sees no capacity: the reason is written once, not again while unchanged
    stay = RecoveryPolicy().grow(shrunk_view(free=(), capacity_since=0.0))
    out = gb.observe(j, gb.Observed(stay, 0.0), 200.0, CFG)
    assert out is not None and not out.events and not out.commands
    j = out.job
    assert j.shrunk.waiting == "waiting for capacity: 1 more node(s) needed in pool p, 0 free"
    assert gb.observe(j, gb.Observed(stay, 0.0), 210.0, CFG) is None

    # capacity seen (settling): the hysteresis start is kept on the job
    settling = RecoveryPolicy().grow(shrunk_view(capacity_since=300.0, now=310.0))
    j = must(gb.observe(j, gb.Observed(settling, 300.0), 310.0, CFG))
    assert j.shrunk.capacity_since == 300.0 and "stays free" in j.shrunk.waiting
    later = RecoveryPolicy().grow(shrunk_view(capacity_since=300.0, now=330.0))
    assert later.blocker is GrowBlocker.SETTLING
    assert gb.observe(j, gb.Observed(later, 300.0), 330.0, CFG) is None  # same reason: no write

    # grow back: checkpoint-first stop, full-size nodes recorded, n1 trusted again
    grow = RecoveryPolicy().grow(shrunk_view(now=1000.0, capacity_since=300.0, last_change=140.0))
    assert grow.kind is Grow.GROW_BACK
    out = gb.observe(j, gb.Observed(grow, 300.0, ("n0", "n2", "n1")), 1000.0, CFG)
    assert out is not None
    j = out.job
    assert j.phase == CHECKPOINTING and j.stop_reason == "migrate"
    stop = next(c for c in out.commands if isinstance(c, SendStop))
    assert stop.checkpoint_first and stop.kind is StopKind.MIGRATE and stop.attempt == 2
    assert j.migrations[-1].cause == "grow_back"
    assert list(j.shrunk.grow_nodes) == ["n0", "n2", "n1"]
    assert (j.shrunk.grow_time, j.shrunk.grow_backs) == (1000.0, 1)
    assert "n1" not in j.excluded_nodes
    moved = [e for e in out.events if e.to_phase == CHECKPOINTING]
    assert moved and moved[0].reason == "grow_back"
    assert moved[0].message == ("growing back to 3 nodes: capacity returned: n1 free in pool p;"
                                " checkpoint first, then relaunched on n0, n2, n1 (ran at 2 of 3:"
                                " shrunk in place after losing n1)")
    assert moved[0].details["route"] == "shrink_in_place"
    assert gb.observe(j, gb.Observed(grow, 300.0, ("n0", "n2", "n1")), 1001.0, CFG) is None  # stopping

    # the attempt checkpointed: queued, then admitted on the full-size nodes
    u = update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=20, ckpt=20)
    j = must(updates.attempt_ended(j, u, 1010.0, CFG))
    assert j.phase in QUEUED and list(j.shrunk.grow_nodes) == ["n0", "n2", "n1"]
    assert gb.relaunch_due(j)  # the pass admits it on those nodes
    adm = placement.Admission(job_id=j.id, agent_id=AGENT, region="us-east-2",
                              assignments=(("n0", 8), ("n2", 8), ("n1", 8)), pool="p")
    j = must(t.admit(j, t.Admit(adm, {}, "s3://b"), 1011.0, CFG))
    assert gb.grown(j, None, 1012.0, CFG) is None  # not running yet
    # its first running report closes the record
    out = updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=21, ckpt=20), 1015.0, CFG)
    assert out is not None and out.job.phase == RUNNING
    assert not out.job.HasField("shrunk")
    grew = [e for e in out.events if e.type == "grew_back"]
    assert [(e.reason, e.message) for e in grew] == [(
        "capacity_returned", "grew back to 3 nodes: capacity returned (ran at 2 of 3 for 875 s:"
                             " shrunk in place after losing n1)")]
    assert gb.grown(out.job, None, 1016.0, CFG) is None  # nothing left to close


def test_a_grow_back_stop_that_fails_still_grows_back_from_the_last_checkpoint() -> None:
    j = shrunk_running()
    grow = RecoveryPolicy().grow(shrunk_view(now=1000.0, capacity_since=300.0, last_change=140.0))
    j = must(gb.observe(j, gb.Observed(grow, 300.0, ("n0", "n2", "n1")), 1000.0, CFG))
    failed = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=76),
                                        1010.0, CFG))
    assert failed.phase in QUEUED and gb.relaunch_due(failed)  # the move, from the last checkpoint
    # a later node loss of the relaunched job is NODE_LOST's to decide, not this record's
    failed.node_recovery.failed_attempt = failed.attempt
    assert not gb.relaunch_due(failed)


def test_the_pass_closes_a_full_size_record_left_open() -> None:
    j = shrunk_running()
    j.placement.nodes.add(node_id="n1", gpus=8)  # e.g. a record an older broker left open
    out = gb.grown(j, None, 2000.0, CFG)
    assert out is not None and not out.job.HasField("shrunk")
    assert out.events[0].message.startswith("grew back to 3 nodes: placed at full size again")


def test_a_grow_back_whose_nodes_were_taken_falls_back_to_ordinary_placement() -> None:
    j = shrunk_running()
    grow = RecoveryPolicy().grow(shrunk_view(now=1000.0, capacity_since=300.0, last_change=140.0))
    j = must(gb.observe(j, gb.Observed(grow, 300.0, ("n0", "n2", "n1")), 1000.0, CFG))
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=20, ckpt=20),
                                   1010.0, CFG))
    out = gb.relaunch_missed(j, "n1 no longer free", 1011.0, CFG)
    assert out is not None and out.job.phase in QUEUED and not out.job.shrunk.grow_nodes
    assert gb.is_shrunk(out.job)  # still short of its size until it runs at 3
    assert out.events[0].message == ("grow back: n1 no longer free; placed by the scheduler like any"
                                     " queued job instead")


# ---- the pass's view, from real agent and job records -------------------------------------

T0 = 1_800_000_000.0


def agent(count: int = 5, spares: int = 0) -> AgentState:
    nodes = [pb.Node(id=f"n{i}", region="r", zone="z", gpus=1, accelerator="sim", pool="p",
                     healthy=True, capacity_type=pb.CAPACITY_TYPE_ON_DEMAND) for i in range(count)]
    nodes.append(pb.Node(id="x0", region="r", zone="z", gpus=1, accelerator="sim", pool="other",
                         healthy=True, capacity_type=pb.CAPACITY_TYPE_ON_DEMAND))
    rec = apb.Register(agent_id="a1", region="r", nodes=nodes, pool_spares={"p": spares} if spares else {})
    return AgentState("a1", rec, last_seen=T0, session=AgentSession("a1"))


def running_job(job_id: str, nodes: tuple[str, ...], requested: int = 0, team: str = "ml") -> pb.Job:
    j = pb.Job(id=job_id, phase=RUNNING, created_time=T0, version=1, attempt=2, spec=pb.JobSpec(
        team=team, priority_class="training",
        resources=pb.Resources(nodes=requested or len(nodes), gpus_per_node=1)))
    if requested:
        j.spec.elasticity.min_nodes, j.spec.elasticity.max_nodes = 2, requested
        j.shrunk.requested_nodes, j.shrunk.running_nodes = requested, len(nodes)
        j.shrunk.since = T0 - 1000
        j.shrunk.lost_nodes.append("n1")
        j.excluded_nodes.extend(["n1", "n4"])  # n4: avoided for an older failure
    j.placement.agent_id, j.placement.region, j.placement.pool = "a1", "r", "p"
    j.placement.nodes.extend(pb.NodeAssignment(node_id=n, gpus=1) for n in nodes)
    return j


def build(jobs: list[pb.Job], teams: list[cpb.TeamQuota] = (), spares: int = 0) -> placement.Snapshot:
    return snap.build(now=T0, agents=[agent(spares=spares)], jobs=jobs, teams=teams, plans=[],
                      draining=[], priority_of=lambda spec: 50)


def test_the_lost_node_comes_first_then_free_nodes_then_spares_never_avoided_or_busy() -> None:
    j = running_job("j", ("n0", "n2"), requested=3)
    s = build([j])
    used = grow_watch.used_nodes(s, None)
    assert grow_watch.candidates(j, s, used) == ("n1", "n3")  # n4 avoided, x0 another pool
    other = running_job("o", ("n1",))
    s = build([j, other])
    assert grow_watch.candidates(j, s, grow_watch.used_nodes(s, None)) == ("n3",)
    s = build([j], spares=1)  # n3 is the pool's spare now: last
    assert s.spares == frozenset({"n3"})
    assert grow_watch.candidates(j, s, grow_watch.used_nodes(s, None)) == ("n1", "n3")


def test_the_view_keeps_the_hysteresis_start_and_asks_quota_for_the_extra_nodes_only() -> None:
    j = running_job("j", ("n0", "n2"), requested=3)
    s = build([j])
    v = grow_watch.view_of(j, s, grow_watch.used_nodes(s, None), 60.0, 300.0)
    assert (v.requested, v.running, v.free, v.capacity_since, v.last_change) == (
        3, 2, ("n1", "n3"), T0, T0 - 1000)
    assert RecoveryPolicy().grow(v).blocker is GrowBlocker.SETTLING
    j.shrunk.capacity_since = T0 - 61
    v = grow_watch.view_of(j, s, grow_watch.used_nodes(s, None), 60.0, 300.0)
    assert v.capacity_since == T0 - 61 and RecoveryPolicy().grow(v).nodes == ("n1",)
    # capacity gone again (another job took n1 and n3): the start is forgotten
    s = build([j, running_job("o", ("n1", "n3"))])
    v = grow_watch.view_of(j, s, grow_watch.used_nodes(s, None), 60.0, 300.0)
    assert (v.free, v.capacity_since) == ((), 0.0)
    # quota: 2 GPUs held of a 2-GPU guarantee, the extra node does not fit
    s = build([j], teams=[cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=2)])])
    v = grow_watch.view_of(j, s, grow_watch.used_nodes(s, None), 60.0, 300.0)
    plan = RecoveryPolicy().grow(v)
    assert plan.blocker is GrowBlocker.QUOTA and "needs 1 more" in plan.why
    s = build([j], teams=[cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=3)])])
    v = grow_watch.view_of(j, s, grow_watch.used_nodes(s, None), 60.0, 300.0)
    assert v.quota_short == ""


class _Jobs:
    """What :func:`grow_watch.check` needs of ``JobOps``: the config and the write of a
    transition (applied to records held here, as the simulator applies them)."""

    def __init__(self, jobs: list[pb.Job]) -> None:
        self.config = CFG.model_copy(update={"grow_back_settle_s": 0.0, "grow_back_min_interval_s": 0.0})
        self.jobs = {j.id: j for j in jobs}

    def apply_grow(self, job_id: str, fn, inp):  # noqa: ANN001, ANN201
        out = fn(self.jobs[job_id], inp, T0, self.config)
        if out is None:
            return None
        self.jobs[job_id] = out.job
        return out.job


def test_two_shrunk_jobs_of_a_team_do_not_grow_into_the_same_room() -> None:
    """Two free nodes (n1, n6), two shrunk jobs each one node short, and quota for one
    more GPU: the first grows back on its lost node, the second stays with the quota
    reason (the pass charges what it lets through)."""
    a = running_job("a", ("n0", "n2"), requested=3)
    b = running_job("b", ("n3", "n4"), requested=3)
    del b.shrunk.lost_nodes[:], b.excluded_nodes[:]
    b.shrunk.lost_nodes.append("n5")
    b.excluded_nodes.append("n5")
    other = running_job("o", ("n5",), team="other")
    nodes = [pb.Node(id=f"n{i}", region="r", zone="z", gpus=1, accelerator="sim", pool="p",
                     healthy=True, capacity_type=pb.CAPACITY_TYPE_ON_DEMAND) for i in range(7)]
    ag = AgentState("a1", apb.Register(agent_id="a1", region="r", nodes=nodes), last_seen=T0,
                    session=AgentSession("a1"))
    s = snap.build(now=T0, agents=[ag], jobs=[a, b, other], priority_of=lambda spec: 50, plans=[],
                   draining=[], teams=[cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=5)])])
    ops = _Jobs([a, b])
    changed = grow_watch.check(ops, [a, b, other], s)  # type: ignore[arg-type]
    assert {j.id for j in changed} == {"a", "b"}
    ga, gb_ = ops.jobs["a"], ops.jobs["b"]
    assert ga.phase == CHECKPOINTING and list(ga.shrunk.grow_nodes) == ["n0", "n2", "n1"]
    assert gb_.phase == RUNNING and gb_.shrunk.waiting.startswith(
        "capacity returned but the team's quota has no room for the extra nodes: team ml")


# ---- the other routes: an elastic move, an elastic placement ---------------------------------

def _adm(*nodes: str, region: str = "us-east-2") -> t.Admit:
    return t.Admit(placement.Admission(job_id="j-1", agent_id=AGENT, region=region,
                                       assignments=tuple((n, 8) for n in nodes), pool="p"),
                   {}, "s3://b")


def test_an_elastic_placement_below_the_requested_size_records_its_route() -> None:
    j = must(t.admit(submitted(spec(nodes=3, elastic=(1, 3))), _adm("n0"), 110.0, CFG))
    rec = j.shrunk
    assert gb.is_shrunk(j) and rec.route == SizeRoute.ELASTIC_PLACEMENT.value
    assert (rec.requested_nodes, rec.running_nodes, rec.since, list(rec.lost_nodes)) == (3, 1, 110.0, [])
    assert rec.why == "placement found room for 1 of 3 nodes in us-east-2"
    # full size, or a fixed-size job: no record
    assert not gb.is_shrunk(must(t.admit(submitted(spec(nodes=3, elastic=(1, 3))),
                                         _adm("n0", "n1", "n2"), 110.0, CFG)))
    assert not gb.is_shrunk(must(t.admit(submitted(spec(nodes=1)), _adm("n0"), 110.0, CFG)))


def moved_small() -> pb.Job:
    """2 nodes asked (1 at least), running in us-east-2 on n0, n1; a spot notice moves it
    checkpoint first and it is placed on the one node eu-west-1 has (2 -> 1)."""
    j = must(t.admit(submitted(spec(nodes=2, elastic=(1, 2))), _adm("n0", "n1"), 110.0, CFG))
    assert not gb.is_shrunk(j)
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=14, ckpt=10), 120.0, CFG))
    stop = plan_stop(Signal(Trigger.SPOT_NOTICE, nodes=("n0", "n1"), deadline=250.0), j, CFG, 130.0)
    assert stop is not None
    j = must(t.request_stop(j, t.StopRequest(plan=stop, actor="agent", message="spot notice"), 130.0, CFG))
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=15, ckpt=15),
                                   140.0, CFG))
    j = must(t.admit(j, _adm("e0", region="eu-west-1"), 150.0, CFG))
    return must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=16, ckpt=15), 160.0, CFG))


def test_an_elastic_move_below_the_requested_size_grows_back_in_its_region() -> None:
    j = moved_small()
    rec = j.shrunk
    assert j.phase == RUNNING and j.placement.region == "eu-west-1"
    assert (rec.route, rec.requested_nodes, rec.running_nodes, rec.since) == (
        SizeRoute.ELASTIC_MOVE.value, 2, 1, 150.0)
    assert rec.why == "a move (spot interruption) found room for 1 of 2 nodes in eu-west-1"
    # the same rules: within the rate limit after the move, it stays
    v = shrunk_view(requested=2, running=1, free=("e1",), now=300.0, capacity_since=200.0,
                    last_change=gb.last_change(j), route=gb.below_size.route_of(j), region="eu-west-1")
    assert RecoveryPolicy().grow(v).blocker is GrowBlocker.RATE_LIMIT
    grow = RecoveryPolicy().grow(dataclasses.replace(v, now=500.0))
    assert grow.kind is Grow.GROW_BACK and grow.nodes == ("e1",)
    out = gb.observe(j, gb.Observed(grow, 200.0, ("e0", "e1")), 500.0, CFG)
    assert out is not None and out.job.phase == CHECKPOINTING
    moved = [e for e in out.events if e.to_phase == CHECKPOINTING]
    assert moved[0].message == ("growing back to 2 nodes: capacity returned: e1 free in pool p;"
                                " checkpoint first, then relaunched on e0, e1 (ran at 1 of 2: a move"
                                " (spot interruption) found room for 1 of 2 nodes in eu-west-1)")
    assert moved[0].details["route"] == "elastic_move"
    j = must(updates.attempt_ended(out.job, update(out.job, apb.ATTEMPT_STATE_CHECKPOINTED, step=30,
                                                   ckpt=30), 510.0, CFG))
    assert gb.relaunch_due(j)
    j = must(t.admit(j, _adm("e0", "e1", region="eu-west-1"), 511.0, CFG))
    out = updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=31, ckpt=30), 520.0, CFG)
    assert out is not None and not out.job.HasField("shrunk")
    grew = [e for e in out.events if e.type == "grew_back"]
    assert [e.message for e in grew] == [
        "grew back to 2 nodes: capacity returned (ran at 1 of 2 for 370 s: a move (spot"
        " interruption) found room for 1 of 2 nodes in eu-west-1)"]
    assert grew[0].details["route"] == "elastic_move"


def test_placed_small_again_keeps_the_route_and_the_start() -> None:
    """A grow back whose nodes were taken is placed like any queued job: if that is
    small again, the record keeps its route and start (the rate limit is not reset) and
    follows the new running size."""
    j = moved_small()
    grow = RecoveryPolicy().grow(shrunk_view(requested=2, running=1, free=("e1",), now=500.0,
                                             capacity_since=200.0, last_change=150.0))
    j = must(gb.observe(j, gb.Observed(grow, 200.0, ("e0", "e1")), 500.0, CFG))
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=30, ckpt=30),
                                   510.0, CFG))
    j = must(gb.relaunch_missed(j, "e1 no longer free", 511.0, CFG))
    j = must(t.admit(j, _adm("e2", region="eu-west-1"), 512.0, CFG))
    rec = j.shrunk
    assert (rec.route, rec.since, rec.running_nodes, rec.grow_time) == ("elastic_move", 150.0, 1, 500.0)


def test_a_make_before_break_move_onto_fewer_nodes_records_its_route() -> None:
    """The standby of a make-before-break move becomes the job's attempt without a new
    admission: its promotion writes the same record when it has fewer nodes."""
    from broker.jobs import standby

    mbb = CFG.model_copy(update={"make_before_break": True})
    j = must(t.admit(submitted(spec(nodes=2, elastic=(1, 2))), _adm("n0", "n1"), 110.0, mbb))
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=5, ckpt=4), 120.0, mbb))
    plan = plan_stop(Signal(Trigger.REGION_DRAIN), j, mbb, 130.0)
    assert plan is not None
    j = must(t.request_stop(j, t.StopRequest(plan=plan, actor="operator", message="drain"), 130.0, mbb))
    adm = placement.Admission(job_id=j.id, agent_id="eu", region="eu-west-1", assignments=(("e0", 8),))
    j = must(standby.reserve(j, standby.ReserveStandby(adm, {}, "s3://cb-eu-west-1"), 131.0, mbb))
    assert not gb.is_shrunk(j)  # reserved, not the job's attempt yet
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=6, ckpt=6),
                                   140.0, mbb))
    assert j.attempt == 2 and j.placement.region == "eu-west-1"
    rec = j.shrunk
    assert (rec.route, rec.requested_nodes, rec.running_nodes, rec.since) == ("elastic_move", 2, 1, 140.0)
    assert rec.why == "a move (region drain) found room for 1 of 2 nodes in eu-west-1"
