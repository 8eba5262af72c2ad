"""The simulator and the live broker decide the same on the same state.

Mid-run, the simulator's incremental snapshot and the live builder
(``broker.scheduling.snapshot.build`` over connected AgentStates, the stored jobs, the
TeamQuota records) go through ``placement.schedule``: identical admissions, preemptions,
reservations and pending reasons. Stop plans: the recovery policy the live broker picks
for a job (``policy_for``: label, else the broker default) is the one the simulator runs.
"""

from __future__ import annotations

import pytest

import placement
from broker.jobs.causes import Cause
from broker.jobs.lifecycle import HOLDING
from broker.jobs.recovery import Signal, Trigger, policy_for
from simulator.engine import T0
from simulator.policies import PolicyKind
from tests.simulator.helpers import busy_scenario, random_rows

ROWS = random_rows(220)


def _sim_at(tmp_path, policy: PolicyKind, t: float):
    import yaml

    from simulator.engine import Simulation
    from simulator.policies import TABLE
    from simulator.scenario import parse
    from simulator.trace import load
    from tests.simulator.helpers import write_trace

    trace = load(write_trace(tmp_path / "t.csv", ROWS))
    sim = Simulation(parse(yaml.safe_load(yaml.safe_dump(busy_scenario()))), trace, TABLE[policy], 1, check=True)
    sim.start()
    sim.advance(until=T0 + t)
    return sim


def _canon(d: placement.Decisions):
    return (sorted(d.admissions, key=lambda a: a.job_id), sorted(d.preemptions, key=lambda p: p.job_id),
            sorted(d.reservations, key=lambda r: r.job_id), dict(sorted(d.pending_reasons.items())))


@pytest.mark.parametrize("policy", [PolicyKind.OURS, PolicyKind.STATIC, PolicyKind.FAILOVER])
@pytest.mark.parametrize("t", [6 * 3600.0, 9 * 3600.0])
def test_same_snapshot_same_decisions(tmp_path, policy, t):
    sim = _sim_at(tmp_path, policy, t)
    assert sim.queued or sim.holding, "the scenario must be busy at this time"
    fast, live = sim.snapshot(), sim.live_snapshot()
    assert sorted(fast.nodes, key=lambda n: n.id) == sorted(live.nodes, key=lambda n: n.id)
    assert sorted(fast.running, key=lambda r: r.id) == sorted(live.running, key=lambda r: r.id)
    assert sorted(fast.pending, key=lambda r: r.id) == sorted(live.pending, key=lambda r: r.id)
    assert sorted(fast.teams, key=lambda q: q.team) == sorted(live.teams, key=lambda q: q.team)
    a, b = placement.schedule(fast), placement.schedule(live)
    assert _canon(a) == _canon(b)
    assert a.admissions or a.preemptions or a.pending_reasons


@pytest.mark.parametrize("policy", [PolicyKind.OURS, PolicyKind.NO_MIGRATION, PolicyKind.DEFRAG])
def test_same_job_same_stop_plan(tmp_path, policy):
    sim = _sim_at(tmp_path, policy, 6 * 3600.0)
    holding = [s for s in sim.sj.values() if s.job.phase in HOLDING]
    assert holding
    for sj in holding:
        live_policy = policy_for(sj.job, sim.cfg)
        for sig in (Signal(Trigger.SPOT_NOTICE, nodes=("x",), deadline=sim.now + 120),
                    Signal(Trigger.PREEMPTED, cause=Cause.HIGHER_PRIORITY), Signal(Trigger.REGION_DRAIN),
                    Signal(Trigger.PLAN_ENDING, nodes=("x",), seconds_left=300)):
            assert live_policy.plan(sig, sj.job, sim.cfg, sim.now) == sim.policy.recovery.plan(
                sig, sj.job, sim.cfg, sim.now)
