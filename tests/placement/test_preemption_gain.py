"""Preemption only when it pays: a job near its stated end is spared (not a victim) in
its ``spared`` interval, for a higher priority or to reclaim lent quota; outside it
(before, and past its own estimate) it is a victim as before."""

from __future__ import annotations

from placement import TeamQuota, schedule
from placement.model import RunningJob

from .helpers import job, node, snap


def _running(jid: str, team: str, spared: tuple[float, float], n: int = 0) -> RunningJob:
    return RunningJob(id=jid, team=team, priority=70, allocations=((node(n).id, 8),), started_time=900.0,
                      last_checkpoint_time=900.0, spared=spared)


def test_priority_preemption_skips_a_job_in_its_spared_interval():
    high = job("high", priority=100)
    teams = [TeamQuota(team="t", cohort="c", guaranteed=(("", 8),))]
    for window, victims in (((900.0, 1200.0), []), ((1001.0, 1200.0), ["low"]), ((500.0, 1000.0), ["low"]),
                            ((0.0, 0.0), ["low"])):
        d = schedule(snap([node(0)], pending=[high], running=[_running("low", "t", window)], now=1000.0,
                          teams=teams))
        assert [p.job_id for p in d.preemptions] == victims, window
        assert not d.admissions


def test_a_reclaim_takes_the_borrower_that_is_not_about_to_end():
    teams = [TeamQuota(team="A", cohort="c", guaranteed=(("", 8),)),
             TeamQuota(team="B", cohort="c", guaranteed=(("", 8),))]
    ending = _running("a-ending", "A", (900.0, 1300.0), n=0)  # ends by itself soon: spared
    long = _running("a-long", "A", (0.0, 0.0), n=1)
    d = schedule(snap([node(0), node(1)], pending=[job("b", team="B")], running=[ending, long], teams=teams,
                      now=1000.0))
    assert [p.job_id for p in d.preemptions] == ["a-long"]
    # both spared: B waits for one to end (no victim at all)
    d = schedule(snap([node(0), node(1)], pending=[job("b", team="B")], teams=teams, now=1000.0,
                      running=[ending, _running("a-long", "A", (950.0, 5000.0), n=1)]))
    assert d.preemptions == [] and not d.admissions
