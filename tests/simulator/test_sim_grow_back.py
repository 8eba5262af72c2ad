"""Growing back in the fleet simulator: a job below its requested size (shrunk in place
after a node loss, or started small by elastic placement) returns to its size when
nodes free up, decided by the live pass's steps (``grow_watch.check`` after placement,
``grow_watch.relaunch_grown`` before it) with the broker's settle time (60 s) and rate
limit (300 s); ``grow_back: false`` is the same run without them (it stays small).

Exact times: the tiny scenario's arithmetic (10 s grid, 1 GB/s, 10 s process start,
16 GB of state for a 16-GPU job; a job on half its nodes trains at half speed).
"""

from __future__ import annotations

import pytest

from broker.jobs.recovery import Blocker, SizeRoute
from simulator.engine import T0
from tests.simulator.helpers import jct, scenario, simulate
from tests.simulator.test_sim_node_recovery import _fail_at, _scn


def test_a_job_shrunk_in_place_grows_back_when_a_node_is_free(tmp_path):
    # Runs on n0, n1 from 10; n0 fails at 400; no spare, elastic, memory tier: shrunk in
    # place onto n1 at the pass at 400, from memory (30 s of work lost, 20 s rejoin + 8 s
    # shard), running at 428 at half speed with 640 s of work left. n2 is free: capacity
    # seen at 430, settled at 490, but the rate limit holds until 700 (shrink + 300 s):
    # stopped checkpoint first at 700 (work 496; 16 s write), relaunched on n1, n2 at the
    # pass at 720 (16 s read + 10 s start), 504 s left at full speed: ends at 1250.
    sim = _fail_at(tmp_path, _scn(tier="memory", elastic_jobs=True), 400)
    j = sim.sj["g"]
    assert j.recoveries == {Blocker.SHRINK.value: 1}
    assert jct(sim, "g") == pytest.approx(1250)
    assert j.grow_backs == 1 and j.job.attempt == 3 and not j.job.HasField("shrunk")
    assert j.lost["node_replaced"] == pytest.approx(30 * 16 + 28 * 8)  # held 8 GPUs after the shrink
    assert j.lost["grow_back"] == pytest.approx(16 * 8 + 26 * 16)  # the save, then read + start
    assert [m.cause for m in j.job.migrations] == ["grow_back"]
    assert j.job.migrations[0].started_time == pytest.approx(T0 + 700)
    # without growing back it stays on n1 at half speed: 428 + 640 / 0.5
    stay = _fail_at(tmp_path, _scn(tier="memory", elastic_jobs=True, grow_back=False), 400)
    assert jct(stay, "g") == pytest.approx(1708)
    assert stay.sj["g"].job.shrunk.route == SizeRoute.SHRINK_IN_PLACE.value
    assert "grow_back" not in stay.sj["g"].lost


def test_a_job_placed_small_grows_back_and_the_gpus_add_up(tmp_path):
    # Two nodes; "a" (one node) runs 10-510; the elastic 16-GPU "g" finds one node at the
    # pass at 10 (route elastic_placement) and trains at half speed from 20. "a" ends at
    # 510: capacity seen then, settled at 570 (rate limit: placed at 10, past): stopped
    # checkpoint first at 570 (periodic checkpoint at 320 = work 150, stop at work 275;
    # 16 s write), relaunched at 590 on both nodes (16 s read + 10 s start), 725 s left
    # at full speed from 616: ends at 1341. Without growing back: 20 + 1000 / 0.5.
    rows = [("a", 0, 500, 8, "t"), ("g", 5, 1000, 16, "t")]
    scn = scenario(node_failures={"elastic_jobs": True})
    sim = simulate(tmp_path, scn, rows)
    g = sim.sj["g"]
    assert jct(sim, "g") == pytest.approx(1341 - 5)
    assert g.grow_backs == 1 and [m.cause for m in g.job.migrations] == ["grow_back"]
    # GPU-seconds held: 8 GPUs for 10..586, 16 for 590..1341 (goodput counts what it held)
    assert g.alloc_gpu_s == pytest.approx(8 * 576 + 16 * 751)
    small = simulate(tmp_path, scenario(node_failures={"elastic_jobs": True, "grow_back": False}), rows)
    assert jct(small, "g") == pytest.approx(2020 - 5)
    assert small.sj["g"].job.shrunk.route == SizeRoute.ELASTIC_PLACEMENT.value
    assert small.sj["g"].alloc_gpu_s == pytest.approx(8 * 2010)
    # fixed-size gangs (the default) wait for both nodes instead: 510 + 10 + 1000
    fixed = simulate(tmp_path, scenario(), rows)
    assert jct(fixed, "g") == pytest.approx(1520 - 5) and not fixed.sj["g"].job.HasField("shrunk")


def test_a_busy_run_with_elastic_jobs_conserves_gpus_and_time(tmp_path):
    """The busy mixed scenario (spot, a plan, node failures, hangs, an outage, a drain, a
    reclaim) with elastic gangs and the memory tier: shrinks, elastic placements and
    moves, and grow backs all happen; every pass checks that no GPU is counted twice;
    every job ends once and its time adds up; in this run growing back shortens the mean JCT (a
    fraction of a second of CPU per run)."""
    from broker.jobs.lifecycle import SUCCEEDED
    from simulator import metrics
    from tests.simulator.helpers import busy_scenario, random_rows

    rows = random_rows(220)
    out = {}
    for grow in (True, False):
        scn = busy_scenario()
        # a node MTBF of 10 h (8-GPU nodes): enough failures under gangs to shrink some
        scn["node_failures"] = {"tier": "memory", "elastic_jobs": True, "grow_back": grow,
                                "mttf_h_per_16k_gpus": 0.005}
        sim = simulate(tmp_path, scn, rows)
        assert sim.finished == len(rows) and all(j.job.phase == SUCCEEDED for j in sim.sj.values())
        for j in sim.sj.values():
            g = j.job.goodput
            parts = g.productive_s + g.queued_s + g.lost_failure_s + g.lost_preemption_s + g.lost_migration_s
            assert parts == pytest.approx(g.wall_s, abs=1e-6), j.tj.id
            assert j.alloc_gpu_s >= j.gpus * j.tj.duration_s - 1e-6  # linear scaling: no free work
        routes = {r for j in sim.sj.values() for r in j.small_routes}
        out[grow] = (metrics.collect(sim), sum(j.grow_backs for j in sim.sj.values()), routes)
    m, grew, routes = out[True]
    assert grew > 0 and {"shrink_in_place", "elastic_placement"} <= routes
    assert out[False][1] == 0
    assert m["jct_s"]["mean"] < out[False][0]["jct_s"]["mean"]
