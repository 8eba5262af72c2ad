"""Conservation and determinism on a busy mixed scenario, for every policy.

``check=True`` makes the simulator verify at every scheduler pass that each node's held
GPUs equal the sum of its jobs' allocations and never exceed the node (SimError
otherwise), and that no job is both queued and holding GPUs.
"""

from __future__ import annotations

import pytest

from broker.jobs.lifecycle import SUCCEEDED
from simulator import metrics
from simulator.policies import DEFAULT, PolicyKind
from simulator.run import dumps, run
from tests.simulator.helpers import busy_scenario, random_rows, simulate, write_trace

ROWS = random_rows(220)


@pytest.mark.parametrize("policy", DEFAULT, ids=[p.value for p in DEFAULT])
def test_every_job_ends_once_and_time_adds_up(tmp_path, policy: PolicyKind):
    sim = simulate(tmp_path, busy_scenario(), ROWS, policy=policy)
    assert sim.finished == len(ROWS) == len(sim.sj)
    assert all(j.ended == 1 and j.job.phase == SUCCEEDED for j in sim.sj.values())
    assert not sim.holding and not sim.queued and not any(sim.used.values())
    for j in sim.sj.values():
        g = j.job.goodput
        parts = g.productive_s + g.queued_s + g.lost_failure_s + g.lost_preemption_s + g.lost_migration_s
        assert parts == pytest.approx(g.wall_s, abs=1e-6), j.tj.id
        assert g.wall_s == pytest.approx(j.finish_t - j.tj.submit_s, abs=1e-6)
        # GPU-time held covers the useful work (slowdown and losses only add to it)
        assert j.alloc_gpu_s >= j.gpus * j.tj.duration_s - 1e-6
    m = metrics.collect(sim)
    assert 0 < m["utilisation"] <= 1 and 0 < m["goodput"] <= 1
    assert m["goodput_accounting_max_error_s"] < 1e-6


def test_busy_scenario_exercises_interruptions(tmp_path):
    """The scenario above is not trivially calm: ours moves jobs and loses some work."""
    sim = simulate(tmp_path, busy_scenario(), ROWS, policy=PolicyKind.OURS)
    causes = {c for j in sim.sj.values() for c in j.lost}
    assert {"spot_interruption", "region_drain", "auto_resume"} <= causes
    assert sum(j.migrations for j in sim.sj.values()) > 0


def test_same_seed_gives_byte_identical_result(tmp_path):
    import json

    import yaml

    trace = write_trace(tmp_path / "t.csv", ROWS)
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump(busy_scenario()))
    pols = (PolicyKind.OURS, PolicyKind.FAILOVER)
    a = dumps(run(trace, scn, policies=pols, seed=3).result)
    b = dumps(run(trace, scn, policies=pols, seed=3).result)
    assert a == b
    c = run(trace, scn, policies=pols[:1], seed=4).result["policies"]["ours"]
    assert c != json.loads(a)["policies"]["ours"]  # the seed drives failures and interruptions
