"""Training-plan windows, reservations on scheduled plans with backfill, elastic jobs."""

from __future__ import annotations

from placement import CapacityType, TopologyLevel, schedule
from placement.model import RunningJob

from .helpers import admitted, block_cluster, job, node, snap

NOW = 10_000.0


def plan_node(i, start, end, **kw):
    return node(f"p{i}", agent="a1", capacity_type=CapacityType.TRAINING_PLAN, pool="tp", plan_start=start,
                plan_end=end, layer1="l1", layer2="l2", layer3="pb", **kw)


def test_plan_nodes_only_inside_window():
    nodes = [plan_node(0, NOW + 100, NOW + 10_000), plan_node(1, 0, NOW - 1)]
    d = schedule(snap(nodes, [job("j", checkpoint_interval_s=60)], now=NOW))
    assert d.admissions == [] and "j" in d.pending_reasons


def test_never_start_on_a_plan_ending_before_next_checkpoint():
    nodes = [plan_node(0, 0, NOW + 1800)]
    d = schedule(snap(nodes, [job("late", checkpoint_interval_s=3600), job("ok", checkpoint_interval_s=600)], now=NOW))
    assert "ok" in admitted(d)
    assert "late" in d.pending_reasons and "next checkpoint" in d.pending_reasons["late"]
    # a short job that finishes in time is fine too
    d = schedule(snap(nodes, [job("short", checkpoint_interval_s=3600, expected_duration_s=900)], now=NOW))
    assert "short" in admitted(d)


def test_big_gang_reserved_on_scheduled_plan_and_backfill_only_if_it_checkpoints_in_time():
    start = NOW + 7200
    plan = [plan_node(i, start, start + 86400, available_before_plan=True) for i in range(4)]
    od = block_cluster({"b0": 2}, agent="a2")
    gang = job("gang", nodes=4, required=TopologyLevel.LAYER_3, checkpoint_interval_s=3 * 3600, priority=90)
    quick = job("quick", checkpoint_interval_s=1800)  # safe point before the plan starts
    slow = job("slow", checkpoint_interval_s=4 * 3600, expected_duration_s=5 * 3600)
    fill = [RunningJob(id=f"r{i}", team="t", priority=70, allocations=((n.id, 8),)) for i, n in enumerate(od)]
    d = schedule(snap(plan + od, [gang, quick, slow], running=fill, now=NOW))
    assert [r.job_id for r in d.reservations] == ["gang"]
    res = d.reservations[0]
    assert res.start_time == start and len(res.assignments) == 4 and res.pool == "tp"
    assert "reserved" in d.pending_reasons["gang"]
    adm = admitted(d)
    assert "quick" in adm and adm["quick"][0][0].startswith("p")  # backfilled on the plan's nodes
    assert "slow" in d.pending_reasons


def test_elastic_job_admitted_smaller_when_full_size_does_not_fit():
    nodes = block_cluster({"b0": 3})
    d = schedule(snap(nodes, [job("el", nodes=6, min_nodes=2, max_nodes=6)]))
    assert len(admitted(d)["el"]) == 3
    assert "elastic: 3 of 6 nodes" in d.admissions[0].explanation
    d = schedule(snap(nodes, [job("el", nodes=6, min_nodes=4, max_nodes=6)]))
    assert "at least 4 node(s)" in d.pending_reasons["el"]
