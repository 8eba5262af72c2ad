"""The admission cache (placement/incremental.py) decides exactly like a from-scratch pass.

Random sequences of the deltas a broker sees (submits, finished attempts, admissions
turning into running jobs, preempted victims going back to the queue, nodes
added/removed/cordoned/unhealthy, a draining region, the clock crossing a training
plan's start) are fed to one kept-alive cache; after every step its decisions must
equal ``placement.schedule`` on the equivalent snapshot, field for field and in order.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from placement.incremental import AdmissionCache
from placement.model import RunningJob, Snapshot
from placement.scheduler import schedule
from tests.placement.test_perf_equivalence import _bench, _variant, as_json

STEPS = 14


def _sequence(seed: int, variant: bool) -> tuple[int, int, int]:
    b = _bench()
    rng = random.Random(seed)
    s = b.make_snapshot(0.1, 300, seed=seed)
    if variant:
        s = _variant(s)
    teams = s.teams
    cache = AdmissionCache(s.nodes, s.running)
    nodes = {n.id: n for n in s.nodes}
    pending = {j.id: j for j in s.pending}
    requests = dict(pending)
    now = s.now
    draining: frozenset[str] = frozenset()
    nxt = 900_000
    admitted = preempted = 0
    team_names = [t.team for t in teams] or ["team-0"]
    for step in range(STEPS):
        full = Snapshot(now=now, nodes=tuple(nodes.values()), running=tuple(cache.running.values()),
                        pending=tuple(pending.values()), teams=teams, draining_regions=draining)
        want = schedule(full)
        got = cache.schedule(now, pending.values(), teams, draining)
        assert as_json(got) == as_json(want), f"seed {seed} step {step}: decisions differ"
        # The broker applies the decisions: admissions run, victims go back to the queue.
        for a in got.admissions:
            j = pending.pop(a.job_id)
            cache.add_running(RunningJob(id=j.id, team=j.team, priority=j.priority, allocations=a.assignments,
                                         accelerator=j.accelerator, started_time=now, last_checkpoint_time=now))
            admitted += 1
        for p in got.preemptions:
            r = cache.remove_running(p.job_id)
            preempted += 1
            if r is not None and r.id in requests:
                pending[r.id] = requests[r.id]
        # Some attempts finish, some jobs arrive.
        for rid in rng.sample(sorted(cache.running), k=min(len(cache.running), rng.randint(0, 12))):
            cache.remove_running(rid)
        for _ in range(rng.randint(0, 25)):
            j = b.synth_job(nxt, rng, team_names)
            nxt += 1
            pending[j.id] = requests[j.id] = j
        # Now and then the fleet changes.
        roll = rng.random()
        ids = sorted(nodes)
        if roll < 0.15:
            nid = rng.choice(ids)
            nodes[nid] = replace(nodes[nid], healthy=not nodes[nid].healthy)
        elif roll < 0.25:
            nid = rng.choice(ids)
            nodes[nid] = replace(nodes[nid], cordoned=True)
        elif roll < 0.32:
            nid = rng.choice(ids)
            nodes[nid + "-twin"] = replace(nodes[nid], id=nid + "-twin")
        elif roll < 0.38:
            del nodes[rng.choice(ids)]
        elif roll < 0.42:
            draining = frozenset() if draining else frozenset({"eu-west-1"})
        if roll < 0.38:
            cache.set_nodes(nodes.values())
        now += 600 if step != STEPS // 2 else 6 * 3600  # mid-run: the scheduled plan starts
    return admitted, preempted, cache.rebuilds


@pytest.mark.parametrize("seed,variant", [(1, False), (2, True), (3, False), (4, True)])
def test_incremental_matches_from_scratch(seed, variant):
    admitted, preempted, rebuilds = _sequence(seed, variant)
    assert admitted > 0  # the sequences are not vacuous
    assert rebuilds < STEPS  # and the cheap path ran (not a rebuild every pass)


def test_sequences_preempt_somewhere():
    assert sum(_sequence(seed, True)[1] for seed in (5, 6)) > 0
