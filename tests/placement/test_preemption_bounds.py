"""A running job inside its protection (minimum run time, spent budget) is never a victim,
for a higher priority or to reclaim lent quota; once the protection ends it is."""

from __future__ import annotations

import math

from placement import TeamQuota, schedule
from placement.model import RunningJob

from .helpers import job, node, snap


def _running(jid: str, team: str, protected_until: float) -> RunningJob:
    return RunningJob(id=jid, team=team, priority=70, allocations=((node(0).id, 8),), started_time=900.0,
                      last_checkpoint_time=900.0, protected_until=protected_until)


def test_priority_preemption_waits_for_the_protection():
    high = job("high", priority=100)
    for until, victims in ((1500.0, []), (1000.0, ["low"]), (0.0, ["low"]), (math.inf, [])):
        d = schedule(snap([node(0)], pending=[high], running=[_running("low", "t", until)], now=1000.0,
                          teams=[TeamQuota(team="t", cohort="c", guaranteed=(("", 8),))]))
        assert [p.job_id for p in d.preemptions] == victims, until
        assert not d.admissions


def test_reclaiming_lent_quota_waits_for_the_protection():
    teams = [TeamQuota(team="A", cohort="c", guaranteed=(("", 8),)),
             TeamQuota(team="B", cohort="c", guaranteed=(("", 8),))]
    borrower = RunningJob(id="a2", team="A", priority=70, allocations=((node(1).id, 8),), started_time=900.0,
                          last_checkpoint_time=900.0, protected_until=2000.0)
    own = RunningJob(id="a1", team="A", priority=70, allocations=((node(0).id, 8),), started_time=900.0,
                     last_checkpoint_time=900.0, protected_until=2000.0)
    nodes = [node(0), node(1)]
    d = schedule(snap(nodes, pending=[job("b", team="B")], running=[own, borrower], teams=teams, now=1000.0))
    assert d.preemptions == [] and not d.admissions
    d = schedule(snap(nodes, pending=[job("b", team="B")], running=[own, borrower], teams=teams, now=2000.0))
    assert [p.job_id for p in d.preemptions] in (["a2"], ["a1"])  # either A job frees B's 8
