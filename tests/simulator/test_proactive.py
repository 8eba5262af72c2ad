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


def _better_capacity_reference(snap, dec, *, move_s, remaining_s, max_moves=4, fits=None):  # noqa: ANN001, ANN202
    """The rule as first written, without the cheap refusals better_capacity now makes
    before ``fits``: the oracle for the randomized test below."""
    from collections import defaultdict

    from broker.jobs.proactive import free_after
    free = free_after(snap, dec)
    info = {n.id: n for n in snap.nodes}
    plan_free = {n: f for n, f in free.items() if f > 0 and info[n].capacity_type == CapacityType.TRAINING_PLAN}
    cands = []
    for r in snap.running:
        here = info.get(r.allocations[0][0])
        if here is None or here.capacity_type != CapacityType.ON_DEMAND:
            continue
        rem, price = remaining_s(r), here.price_per_gpu_hour
        saving, cost = price * r.gpus * rem / 3600.0, price * r.gpus * move_s(r) / 3600.0
        if saving > cost:
            cands.append((-(saving - cost), r.id, r, rem))
    cands.sort(key=lambda c: (c[0], c[1]))
    out = []
    for _, _, r, rem in cands:
        if len(out) >= max_moves:
            break
        need = sorted((g for _, g in r.allocations), reverse=True)
        by_agent = defaultdict(list)
        for n in sorted(plan_free):
            if fits is not None and not fits(r, info[n]):
                continue
            end = info[n].plan_end
            if end is not None and end - snap.now < rem + move_s(r):
                continue
            by_agent[info[n].agent_id].append(n)
        for agent in sorted(by_agent):
            room = {n: plan_free[n] for n in by_agent[agent]}
            take = []
            for g in need:
                n = max((n for n in room if room[n] >= g), key=lambda n: (room[n], n), default=None)
                if n is None:
                    break
                room[n] -= g
                take.append((n, g))
            if len(take) == len(need):
                for n, g in take:
                    plan_free[n] -= g
                out.append(r.id)
                break
    return out


def test_better_capacity_refusals_change_no_decision():
    """Randomized: scattered free plan capacity, multi-node jobs, plans that end, a fit
    rule; the proposals equal the oracle's, in order."""
    import random

    rng = random.Random(16)
    for trial in range(300):
        nodes = [NodeInfo(f"od{i}", f"a{i % 2}", "r", "z", 8, price_per_gpu_hour=rng.choice((2.0, 4.0)))
                 for i in range(12)]
        nodes += [NodeInfo(f"p{i}", f"a{rng.randrange(3)}", "r", "z", 8,
                           capacity_type=CapacityType.TRAINING_PLAN, plan_start=0.0,
                           plan_end=rng.choice((1e9, 100.0 + rng.uniform(0, 8000))))
                  for i in range(rng.randrange(1, 10))]
        running, used = [], {n.id: 0 for n in nodes}
        for j in range(rng.randrange(1, 14)):
            pool = [n for n in nodes if 8 - used[n.id] > 0]
            k = rng.choice((1, 1, 2, 3))
            share = rng.choice((1, 2, 4, 8))
            picks = [n for n in rng.sample(pool, min(k, len(pool))) if 8 - used[n.id] >= share]
            if not picks:
                continue
            for n in picks:
                used[n.id] += share
            running.append(RunningJob(f"j{j}", "t", 70, tuple((n.id, share) for n in picks)))
        snap = Snapshot(now=100.0, nodes=tuple(nodes), running=tuple(running), pending=())
        dec = placement.Decisions()
        rem = {r.id: rng.uniform(0, 9000) for r in running}
        barred = {(r.id, n.id) for r in running for n in nodes if rng.random() < 0.2}
        kw = dict(move_s=lambda r: 60.0, remaining_s=lambda r, rem=rem: rem[r.id],
                  max_moves=rng.randrange(1, 5),
                  fits=lambda r, n, barred=barred: (r.id, n.id) not in barred)
        got = [p.job_id for p in better_capacity(snap, dec, **kw)]
        assert got == _better_capacity_reference(snap, dec, **kw), trial
