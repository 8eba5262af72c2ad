"""Task governance: quotas, lending/borrowing, reclaim, priority preemption, fair share,
team_usage, and the HyperPod acceptance scenario as a multi-pass run."""

from __future__ import annotations

from dataclasses import replace

from placement import TeamQuota, TopologyLevel, schedule
from placement.model import RunningJob
from placement.quota import team_usage

from .helpers import Broker, admitted, block_cluster, job, node, snap

TRAINING, EXPERIMENTATION, INFERENCE = 70, 80, 100


def two_teams(**kw):
    return [TeamQuota(team="A", cohort="c", guaranteed=(("", 8),), **kw),
            TeamQuota(team="B", cohort="c", guaranteed=(("", 8),), **kw)]


def test_hyperpod_acceptance_scenario():
    b = Broker([node(0), node(1)], teams=two_teams())
    # 1. A submits a 2-node job: admitted, borrowing B's idle node.
    b.submit(job("a-train", nodes=2, team="A", priority=TRAINING))
    d = b.step(schedule)
    assert "a-train" in admitted(d)
    u = team_usage(b.snapshot())
    assert (u["A"].used, u["A"].borrowed, u["B"].lent) == (16, 8, 8)
    # 2. B submits a 1-node training job: A's job is preempted to reclaim B's quota.
    b.submit(job("b-train", team="B", priority=TRAINING))
    d = b.step(schedule)
    assert d.admissions == []
    [p] = d.preemptions
    assert (p.job_id, p.for_job_id, p.reason) == ("a-train", "b-train", "reclaim_lent_quota")
    assert "team B reclaims" in p.message and p.work_lost_gpu_s > 0
    assert d.pending_reasons["b-train"].startswith("waiting for 1 preempted job(s) to checkpoint")
    # next pass: B's job is admitted; A's job waits (it would need B's quota again)
    d = b.step(schedule)
    assert "b-train" in admitted(d) and "a-train" in d.pending_reasons
    assert "over quota" in d.pending_reasons["a-train"]
    # 3. B submits experimentation (80 > 70): B's training is preempted (same team).
    b.submit(job("b-exp", team="B", priority=EXPERIMENTATION))
    d = b.step(schedule)
    [p] = d.preemptions
    assert (p.job_id, p.for_job_id, p.reason) == ("b-train", "b-exp", "higher_priority")
    d = b.step(schedule)
    assert "b-exp" in admitted(d)
    assert set(b.running) == {"b-exp"}


def test_no_quota_configured_means_no_enforcement_but_unknown_team_waits_once_quotas_exist():
    nodes = [node(0)]
    assert "j" in admitted(schedule(snap(nodes, [job("j", team="x")])))
    d = schedule(snap(nodes, [job("j", team="x")], teams=[TeamQuota(team="A", guaranteed=(("", 8),))]))
    assert "team x has no quota" in d.pending_reasons["j"]


def test_borrow_limit_and_lend_limit_and_disabled_borrowing():
    nodes = [node(i) for i in range(4)]
    teams = [TeamQuota(team="A", cohort="c", guaranteed=(("", 8),), borrow_limit=8),
             TeamQuota(team="B", cohort="c", guaranteed=(("", 24),), lend_limit=16)]
    d = schedule(snap(nodes, [job("a", nodes=3, team="A")], teams=teams))
    assert "borrow limit 8" in d.pending_reasons["a"]
    d = schedule(snap(nodes, [job("a", nodes=2, team="A")], teams=teams))
    assert "a" in admitted(d)
    no_borrow = [TeamQuota(team="A", cohort="c", guaranteed=(("", 8),), can_borrow=False), teams[1]]
    d = schedule(snap(nodes, [job("a", nodes=2, team="A")], teams=no_borrow))
    assert "borrowing disabled" in d.pending_reasons["a"]


def test_per_accelerator_quota_lines():
    nodes = [node(0, accelerator="h100"), node(1, accelerator="a100")]
    teams = [TeamQuota(team="A", guaranteed=(("h100", 8), ("a100", 0)))]
    d = schedule(snap(nodes, [job("h", team="A", accelerator="h100"), job("a", team="A", accelerator="a100")],
                      teams=teams))
    assert "h" in admitted(d) and "over quota for a100" in d.pending_reasons["a"]


def test_victims_lowest_priority_then_least_work_lost_and_only_as_many_as_needed():
    nodes = [node(i) for i in range(3)]
    teams = [TeamQuota(team="A", guaranteed=(("", 24),))]
    running = [
        RunningJob(id="old-ckpt", team="A", priority=50, allocations=((nodes[0].id, 8),), last_checkpoint_time=0.0),
        RunningJob(id="fresh-ckpt", team="A", priority=50, allocations=((nodes[1].id, 8),), last_checkpoint_time=990.0),
        RunningJob(id="mid-prio", team="A", priority=70, allocations=((nodes[2].id, 8),), last_checkpoint_time=999.0),
    ]
    d = schedule(snap(nodes, [job("hi", team="A", priority=100)], running=running, teams=teams))
    assert [p.job_id for p in d.preemptions] == ["fresh-ckpt"]
    assert d.preemptions[0].work_lost_gpu_s == (1000 - 990) * 8 + 60 * 8


def test_preemption_is_topology_aware():
    # The job needs 2 nodes in one layer-3 block; only victims in that block help.
    nodes = block_cluster({"b0": 2, "b1": 1})
    teams = [TeamQuota(team="A", guaranteed=(("", 24),))]
    running = [
        RunningJob(id="in-b1", team="A", priority=10, allocations=((nodes[2].id, 8),)),
        RunningJob(id="in-b0", team="A", priority=50, allocations=((nodes[0].id, 8),)),
    ]
    d = schedule(snap(nodes, [job("hi", nodes=2, team="A", priority=100, required=TopologyLevel.LAYER_3)],
                      running=running, teams=teams))
    assert [p.job_id for p in d.preemptions] == ["in-b0"]


def test_no_preemption_of_equal_or_higher_priority_or_other_teams_within_guarantee():
    nodes = [node(0)]
    teams = [TeamQuota(team="A", cohort="c", guaranteed=(("", 8),)),
             TeamQuota(team="B", cohort="c", guaranteed=(("", 8),))]
    running = [RunningJob(id="b-own", team="B", priority=10, allocations=((nodes[0].id, 8),))]
    # B is within its guarantee: A (within guarantee too) cannot reclaim from it.
    d = schedule(snap(nodes, [job("a", team="A", priority=100)], running=running, teams=teams))
    assert d.preemptions == [] and "a" in d.pending_reasons


def test_fair_share_among_borrowers():
    # Lender L has 32 idle GPUs; X already borrows 8, Y borrows nothing: Y goes first.
    nodes = [node(i) for i in range(5)]
    teams = [TeamQuota(team="L", cohort="c", guaranteed=(("", 32),)),
             TeamQuota(team="X", cohort="c", guaranteed=(("", 0),)),
             TeamQuota(team="Y", cohort="c", guaranteed=(("", 0),))]
    running = [RunningJob(id="x0", team="X", priority=70, allocations=((nodes[0].id, 8),))]
    pending = [job(f"x{i}", team="X", priority=100, submit_time=i) for i in range(1, 4)] + \
              [job(f"y{i}", team="Y", priority=50, submit_time=10 + i) for i in range(3)]
    d = schedule(snap(nodes, pending, running=running, teams=teams))
    got = [a.job_id for a in d.admissions]
    # 24 lendable GPUs left after X's 8: shares alternate y, x, y (ties broken by team name)
    assert sorted(got) == ["x1", "y0", "y1"]


def test_team_usage_view():
    nodes = [node(i) for i in range(3)]
    teams = two_teams()
    running = [RunningJob(id="a1", team="A", priority=70, allocations=((nodes[0].id, 8), (nodes[1].id, 8)))]
    u = team_usage(snap(nodes, [job("b", team="B", gpus=4)], running=running, teams=teams))
    assert (u["A"].guaranteed, u["A"].used, u["A"].borrowed, u["A"].lent) == (8, 16, 8, 0)
    assert (u["B"].used, u["B"].lent, u["B"].pending, u["B"].cohort) == (0, 8, 4, "c")
    assert u["A"].resources[0].accelerator == ""


def test_victims_already_stopping_are_counted_but_not_announced_again():
    nodes = [node(0), node(1)]
    b = Broker(nodes, teams=two_teams())
    b.submit(job("a-train", nodes=2, team="A"))
    b.step(schedule)
    b.submit(job("b-train", team="B"))
    snap1 = b.snapshot()
    d1 = schedule(snap1)
    assert [p.job_id for p in d1.preemptions] == ["a-train"]
    # the broker is checkpointing the victim: next pass repeats the plan silently
    # (the broker also marks it not preemptible: it is already going)
    running = tuple(replace(r, stopping=True, preemptible=False) for r in snap1.running)
    d2 = schedule(replace(snap1, running=running))
    assert d2.preemptions == [] and d2.admissions == []
    assert d2.pending_reasons["b-train"].startswith("waiting for 1 preempted job(s) to checkpoint (a-train")


def test_pending_job_never_dropped_from_decisions():
    nodes = [node(0)]
    d = schedule(snap(nodes, [job("x", nodes=0), job("y", gpus=16), job("z")]))
    assert set(d.pending_reasons) | set(admitted(d)) == {"x", "y", "z"}
    assert "no GPUs" in d.pending_reasons["x"] and "16 GPU(s) per node" in d.pending_reasons["y"]


def test_per_region_cap_on_top_of_global_quota():
    nodes = [node("e0", agent="e", region="us-east-2"), node("e1", agent="e", region="us-east-2"),
             node("w0", agent="w", region="us-west-2", price_per_gpu_hour=9.0)]
    teams = [TeamQuota(team="A", guaranteed=(("", 24),), region_caps=(("us-east-2", 8),))]
    d = schedule(snap(nodes, [job("a1", team="A"), job("a2", team="A")], teams=teams))
    regions = {a.job_id: a.region for a in d.admissions}
    assert regions == {"a1": "us-east-2", "a2": "us-west-2"}  # the cap pushes a2 to the pricier region
    d = schedule(snap(nodes, [job("a1", team="A"), job("a2", team="A", allowed_regions=frozenset({"us-east-2"}))],
                      teams=teams))
    assert "region cap in us-east-2 (8/8 GPUs)" in d.pending_reasons["a2"]
