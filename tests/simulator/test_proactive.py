"""broker/jobs/proactive.py on hand-made snapshots: a move happens only when gain > cost."""

from __future__ import annotations

import placement
from broker.jobs.proactive import better_capacity, defragment
from broker.jobs.recovery import Trigger
from placement import CapacityType, NodeInfo, RunningJob, Snapshot, TopologyLevel


def _nodes(plan_free: bool = False) -> tuple[NodeInfo, ...]:
    ns = [NodeInfo(f"n{i}", "a", "r", "z", 8, layer3="b0" if i < 2 else "b1",
                   ultraserver="u0" if i < 2 else "u1", price_per_gpu_hour=4.0) for i in range(3)]
    if plan_free:
        ns.append(NodeInfo("p0", "a", "r", "z", 8, capacity_type=CapacityType.TRAINING_PLAN, pool="p",
                           plan_start=0.0, plan_end=1e9))
    return tuple(ns)


SMALL = (RunningJob("s1", "t", 70, (("n0", 4),)), RunningJob("s2", "t", 70, (("n0", 4),)))
GANG = placement.JobRequest("g", "t", 70, 2, 8, required=TopologyLevel.LAYER_3)


def _defrag(remaining: float, move: float):
    snap = Snapshot(now=100.0, nodes=_nodes(), running=SMALL, pending=(GANG,))
    dec = placement.schedule(snap)
    assert dec.pending_reasons["g"].startswith("needs ")
    return defragment(snap, dec, move_s=lambda r: move, remaining_s=lambda r: remaining, movable_gpus=8)


def test_defragment_moves_when_the_gang_gains_more_than_the_moves_cost():
    props = _defrag(remaining=1000.0, move=30.0)  # gain 16 x 1000 > cost 2 x 4 x 30
    assert [p.job_id for p in props] == ["s1", "s2"]
    assert all(p.signal.trigger is Trigger.DEFRAGMENT and p.signal.nodes == ("n0", "n1") for p in props)


def test_defragment_stays_when_the_block_frees_soon_anyway():
    assert _defrag(remaining=10.0, move=30.0) == []  # gain 16 x 10 < cost 8 x 30


def test_defragment_never_moves_big_or_busy_jobs():
    snap = Snapshot(now=100.0, nodes=_nodes(), running=SMALL, pending=(GANG,))
    dec = placement.schedule(snap)
    kw = dict(move_s=lambda r: 1.0, remaining_s=lambda r: 1e4)
    assert defragment(snap, dec, movable_gpus=2, **kw) == []  # s1, s2 (4 GPUs) not movable
    assert defragment(snap, dec, movable_gpus=8, busy=frozenset({"s1"}), **kw) == []


def test_better_capacity_moves_to_free_plan_capacity_only_when_it_pays():
    run = (RunningJob("j", "t", 70, (("n2", 8),)),)
    snap = Snapshot(now=100.0, nodes=_nodes(plan_free=True), running=run, pending=())
    dec = placement.schedule(snap)
    props = better_capacity(snap, dec, move_s=lambda r: 60.0, remaining_s=lambda r: 3600.0)
    assert [(p.job_id, p.signal.trigger) for p in props] == [("j", Trigger.BETTER_CAPACITY)]
    assert props[0].gain == 8 * 4.0 and props[0].cost == 8 * 4.0 * 60 / 3600
    # the job ends in 30 s: a 60 s move costs more than it saves
    assert better_capacity(snap, dec, move_s=lambda r: 60.0, remaining_s=lambda r: 30.0) == []
