"""The static-quota filter (simulator/quota_filter.py) leaves jobs out of a pass without
changing a decision: on real mid-run snapshots of the busy scenario, the engine on the
filtered queue admits, preempts and reserves exactly what it does on the full queue;
a team with a possible priority victim keeps its whole queue; a whole static-quota run
in ``check`` mode (the engine also runs the full queue every pass) ends every job."""

from __future__ import annotations

import dataclasses

import pytest

import placement
from simulator import quota_filter
from simulator.engine import T0, Simulation
from simulator.policies import TABLE, PolicyKind
from simulator.scenario import parse
from simulator.trace import load
from tests.simulator.helpers import busy_scenario, random_rows, write_trace

ROWS = random_rows(400, seed=3)


def _scn(tight: bool):  # noqa: ANN202
    s = busy_scenario()
    if tight:  # small guarantees: long over-quota queues, as on the Philly trace
        for t in s["teams"]:
            t["guaranteed_gpus"] = 32  # the largest job: every job can run eventually
    return parse(s)


def _sims(tmp_path, tight: bool):  # noqa: ANN202
    sim = Simulation(_scn(tight), load(write_trace(tmp_path / "t.csv", ROWS)), TABLE[PolicyKind.STATIC], 1,
                     check=True)
    sim.start()
    for h in range(2, 30, 2):
        sim.advance(until=T0 + h * 3600.0)
        yield sim


def _same(a: placement.Decisions, b: placement.Decisions) -> bool:
    return (a.admissions, a.preemptions, a.reservations) == (b.admissions, b.preemptions, b.reservations)


def test_filtered_queue_same_decisions(tmp_path):
    left_out = 0
    for sim in _sims(tmp_path, tight=True):
        snap = sim.snapshot()
        kept = quota_filter.placeable(snap)
        assert set(kept) <= set(snap.pending)
        left_out += len(snap.pending) - len(kept)
        assert _same(placement.schedule(dataclasses.replace(snap, pending=kept)), placement.schedule(snap))
    assert left_out > 50, "the tight scenario must leave many over-quota jobs out"


def test_a_team_with_a_priority_victim_keeps_its_queue(tmp_path):
    for sim in _sims(tmp_path, tight=True):
        snap = sim.snapshot()
        teams = {r.team for r in snap.running if r.preemptible}
        dropped = {j.team for j in snap.pending} - {j.team for j in quota_filter.placeable(snap)}
        if not teams & dropped:
            continue
        team = sorted(teams & dropped)[0]
        # one more urgent job of that team: its running jobs become possible victims
        pend = tuple(dataclasses.replace(j, priority=j.priority + 1) if j.team == team else j
                     for j in snap.pending)
        snap2 = dataclasses.replace(snap, pending=pend)
        kept = quota_filter.placeable(snap2)
        assert {j.id for j in kept if j.team == team} == {j.id for j in pend if j.team == team}
        assert _same(placement.schedule(dataclasses.replace(snap2, pending=kept)), placement.schedule(snap2))
        return
    pytest.fail("no moment where a team with running jobs had jobs left out")


def test_global_quotas_are_not_filtered(tmp_path):
    sim = next(_sims(tmp_path, tight=True))
    snap = sim.snapshot()
    borrowing = tuple(dataclasses.replace(t, borrow_limit=None) for t in snap.teams)
    snap = dataclasses.replace(snap, teams=borrowing)
    assert quota_filter.placeable(snap) is snap.pending


def test_static_run_in_check_mode_ends_every_job(tmp_path):
    """check=True: every pass the engine also runs on the full queue (SimError on a
    difference), and the node books are verified."""
    sim = Simulation(_scn(True), load(write_trace(tmp_path / "t.csv", ROWS)), TABLE[PolicyKind.STATIC], 1,
                     check=True).run()
    assert sim.finished == len(ROWS)
    assert sim.left_out > 0
