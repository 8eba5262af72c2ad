"""The fair static baseline: Kueue per region (borrowing within the home region's cohort)."""

from __future__ import annotations

from simulator.policies import PolicyKind
from tests.simulator.helpers import jct, scenario, simulate


def _scn() -> dict:
    return scenario(
        regions=[{"name": "r1", "pools": [{"kind": "on_demand", "nodes": 2, "price_per_gpu_hour": 2.0}]},
                 {"name": "r2", "pools": [{"kind": "on_demand", "nodes": 1, "price_per_gpu_hour": 2.0}]}],
        teams=[{"name": "a", "region": "r1", "guaranteed_gpus": 8},
               {"name": "b", "region": "r1", "guaranteed_gpus": 8},
               {"name": "c", "region": "r2", "guaranteed_gpus": 8}])


ROWS = [("a1", 0, 1000, 8, "a"), ("a2", 0, 1000, 8, "a"), ("a3", 0, 1000, 8, "a")]




def test_kueue_static_and_ours_differ_as_their_rules_say(tmp_path):
    kueue = simulate(tmp_path, _scn(), ROWS, policy=PolicyKind.KUEUE)
    static = simulate(tmp_path, _scn(), ROWS, policy=PolicyKind.STATIC)
    ours = simulate(tmp_path, _scn(), ROWS, policy=PolicyKind.OURS)
    # Kueue: a borrows b's idle guarantee in r1 (two at once), never r2's node
    assert sorted(round(jct(kueue, j)) for j in ("a1", "a2", "a3")) == [1010, 1010, 2020]
    assert {kueue.sj[j].job.placement.region for j in kueue.sj} == {"r1"}
    assert {t.cohort for t in kueue.teams} == {"r1", "r2"}
    # static: a's guarantee alone, one job at a time
    assert sorted(round(jct(static, j)) for j in ("a1", "a2", "a3")) == [1010, 2020, 3030]
    # ours: one cohort for the fleet, any region: all three at once
    assert sorted(round(jct(ours, j)) for j in ("a1", "a2", "a3")) == [1010, 1010, 1010]
