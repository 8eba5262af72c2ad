"""The pass's last phase: capacity no team's guarantee covers (the surplus) is lent to
quota-blocked jobs, in fair-share order, without preemption; the guarantees stay
reclaimable."""

from __future__ import annotations

from placement import TeamQuota, schedule
from placement.model import RunningJob
from placement.quota import QuotaLedger

from .helpers import admitted, job, node, snap


def _teams(a: int = 8, b: int = 8, **kw) -> list[TeamQuota]:
    return [TeamQuota(team="A", cohort="c", guaranteed=(("", a),), **kw),
            TeamQuota(team="B", cohort="c", guaranteed=(("", b),), **kw)]


def test_surplus_capacity_is_lent_to_a_quota_blocked_team():
    # 4 nodes = 32 GPUs, guarantees 8 + 8 = 16: 16 GPUs belong to no one. A is idle (lends
    # its 8); B's 1-GPU jobs may use B's 8, A's 8 and the 16 of surplus: 32 of its 40.
    nodes = [node(i) for i in range(4)]
    pending = [job(f"b{i:02d}", gpus=1, team="B", submit_time=i) for i in range(40)]
    d = schedule(snap(nodes, pending, teams=_teams()))
    assert len(d.admissions) == 32
    # the oldest first within the team; the rest say why they wait
    assert set(admitted(d)) == {f"b{i:02d}" for i in range(32)}
    assert "over quota" in d.pending_reasons["b39"]
    assert not d.preemptions


def test_without_surplus_borrowing_stops_at_the_lenders_guarantee():
    # 2 nodes = 16 GPUs = the guarantees: nothing beyond A's idle 8 is lent (as before).
    nodes = [node(i) for i in range(2)]
    pending = [job(f"b{i:02d}", gpus=1, team="B", submit_time=i) for i in range(40)]
    d = schedule(snap(nodes, pending, teams=_teams()))
    assert len(d.admissions) == 16


def test_surplus_is_not_lent_to_a_team_that_may_not_borrow():
    nodes = [node(i) for i in range(4)]
    pending = [job(f"b{i:02d}", gpus=1, team="B", submit_time=i) for i in range(40)]
    d = schedule(snap(nodes, pending, teams=_teams(borrow_limit=0)))
    assert len(d.admissions) == 8  # its own guarantee only (static quotas stay static)


def test_surplus_goes_to_the_lowest_borrowed_share_first():
    # 4 nodes = 32 GPUs, guarantees 16: 16 GPUs of surplus. X already borrows 8 of it (its
    # guarantee is 0); Y borrows nothing: Y's jobs get the other 8, though X's are older.
    nodes = [node(i) for i in range(4)]
    teams = [TeamQuota(team="L", cohort="c", guaranteed=(("", 16),)),
             TeamQuota(team="X", cohort="c", guaranteed=(("", 0),)),
             TeamQuota(team="Y", cohort="c", guaranteed=(("", 0),))]
    running = [RunningJob(id="l0", team="L", priority=70, allocations=((nodes[0].id, 8),)),
               RunningJob(id="x0", team="X", priority=70, allocations=((nodes[1].id, 8),))]
    pending = [job(f"x{i}", gpus=1, team="X", submit_time=i) for i in range(1, 9)] + \
              [job(f"y{i}", gpus=1, team="Y", submit_time=100 + i) for i in range(8)]
    # L's idle 8 GPUs are not lent (its queued job wants them: demand-aware); that job (24 GPUs)
    # is more than L's 8 of headroom and the 8 of surplus left, so it waits
    pending.append(job("l1", nodes=3, gpus=8, team="L", submit_time=0))
    d = schedule(snap(nodes, pending, running=running, teams=teams))
    got = set(admitted(d))
    assert {f"y{i}" for i in range(8)} <= got
    assert not any(j.startswith("x") for j in got) and "l1" not in got


def test_a_surplus_borrower_is_reclaimed_by_the_owner_like_any_borrower():
    # B holds all 32 GPUs (8 of its own, 8 lent by A, 16 of surplus); A asks for its 8.
    nodes = [node(i) for i in range(4)]
    running = [RunningJob(id=f"b{i}", team="B", priority=70, allocations=((nodes[i].id, 8),),
                          started_time=0.0) for i in range(4)]
    d = schedule(snap(nodes, [job("a0", team="A")], running=running, teams=_teams(), now=5000.0))
    assert [(p.for_job_id, p.reason) for p in d.preemptions] == [("a0", "reclaim_lent_quota")]


def test_ledger_surplus_left_counts_borrowing_beyond_the_cohorts_lendable_quota():
    teams = tuple(_teams())
    running = (RunningJob(id="b", team="B", priority=70, allocations=(("n", 20),)),)
    led = QuotaLedger(teams, running, ())
    assert led.surplus_left() == 0  # not lent before the last phase
    led.lend_surplus(32)  # 32 - 16 guaranteed = 16; B borrows 12, 8 of them A's: 4 taken
    assert (led.surplus, led.surplus_left()) == (16, 12)
    assert led.room("B", "") == 12


def test_the_live_schedulers_admission_cache_lends_the_surplus_too():
    # The live broker runs its passes on AdmissionCache (broker/scheduling/admission.py):
    # the same phases, so the same 32 admissions as test_surplus_capacity_is_lent_...
    from placement.incremental import AdmissionCache

    nodes = [node(i) for i in range(4)]
    pending = [job(f"b{i:02d}", gpus=1, team="B", submit_time=i) for i in range(40)]
    d = AdmissionCache(nodes).schedule(1000.0, tuple(pending), tuple(_teams()), frozenset())
    assert set(admitted(d)) == {f"b{i:02d}" for i in range(32)}


def test_a_reclaim_takes_from_the_largest_borrower_first():
    # L lends its idle guarantee to X (borrows 16) and Y (borrows 8). L asks for 8 back:
    # X's job is the victim although Y's lost less work since its last checkpoint (Kueue's
    # fair-sharing preemption: the team furthest above its share gives back first).
    nodes = [node(i) for i in range(4)]
    teams = [TeamQuota(team="L", cohort="c", guaranteed=(("", 32),)),
             TeamQuota(team="X", cohort="c", guaranteed=(("", 0),)),
             TeamQuota(team="Y", cohort="c", guaranteed=(("", 0),))]
    running = [RunningJob(id="x0", team="X", priority=70, allocations=((nodes[0].id, 8),), started_time=0.0),
               RunningJob(id="x1", team="X", priority=70, allocations=((nodes[1].id, 8),), started_time=0.0),
               RunningJob(id="y0", team="Y", priority=70, allocations=((nodes[2].id, 8),), started_time=4000.0),
               RunningJob(id="l0", team="L", priority=70, allocations=((nodes[3].id, 8),), started_time=0.0)]
    d = schedule(snap(nodes, [job("l1", team="L")], running=running, teams=teams, now=5000.0))
    [p] = d.preemptions
    assert (p.job_id, p.reason) in {("x0", "reclaim_lent_quota"), ("x1", "reclaim_lent_quota")}
