"""Policies see a duration estimate with the scenario's error model, never the truth."""

from __future__ import annotations

import pytest

from simulator.estimates import EstimateModel, estimate, remaining
from simulator.scenario import ScenarioError, parse
from tests.simulator.helpers import scenario, simulate


def test_lognormal_estimates_are_wrong_per_job_and_deterministic():
    ests = [estimate(EstimateModel.LOGNORMAL, 3600.0, f"j{i}", 1) for i in range(200)]
    assert ests == [estimate(EstimateModel.LOGNORMAL, 3600.0, f"j{i}", 1) for i in range(200)]
    assert len(set(ests)) == 200 and all(e >= 60 for e in ests)
    off = sorted(abs(e / 3600.0 - 1) for e in ests)
    assert off[100] > 0.3  # the median job's estimate is off by more than 30 %
    assert estimate(EstimateModel.LOGNORMAL, 3600.0, "j0", 2) != ests[0]  # the seed matters


def test_requested_limit_rounds_the_padded_truth_up_a_ladder():
    assert estimate(EstimateModel.REQUESTED_LIMIT, 3000.0, "x", 1) == 2 * 3600  # 1.5 x 50 min -> 2 h
    assert estimate(EstimateModel.REQUESTED_LIMIT, 20 * 3600.0, "x", 1) == 72 * 3600
    assert estimate(EstimateModel.EXACT, 1234.0, "x", 1) == 1234.0
    assert remaining(3600.0, 1000.0) == 2600.0 and remaining(3600.0, 5000.0) == 600.0


def test_the_engine_hands_policies_the_estimate(tmp_path):
    rows = [(f"j{i}", i, 1000 + i, 1, "t") for i in range(5)]
    sim = simulate(tmp_path, scenario(duration_estimate="lognormal", estimate_sigma=1.0), rows)
    seen = {j: sim.sj[j].job.spec.expected_duration_s for j in sim.sj}
    assert all(seen[j] != sim.sj[j].tj.duration_s for j in seen)
    assert seen == {j: estimate(EstimateModel.LOGNORMAL, sim.sj[j].tj.duration_s, j, 1) for j in seen}
    exact = simulate(tmp_path, scenario(duration_estimate="exact"), rows)
    assert all(exact.sj[j].job.spec.expected_duration_s == exact.sj[j].tj.duration_s for j in exact.sj)


def test_an_unknown_estimate_model_is_refused():
    with pytest.raises(ScenarioError, match="duration_estimate must be one of lognormal"):
        parse(scenario(duration_estimate="psychic"))
