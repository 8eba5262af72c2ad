"""Node changes reach the kept-alive capacity index partition by partition
(placement/incremental.py, ``CapacityIndex.rebuild_partition``), and the index they
give is the one a full build makes.

Property-style: random sequences over the placement benchmark's fleet (several
agents, capacity types, pools and a training plan; topology down to UltraServers)
change nodes the way agents' inventory updates do -- health and cordons flipping,
nodes added and removed, a node's topology labels, GPU count or capacity type
changing -- while jobs start and end. After every step the cache's index (and its
future-plans index) is compared, slot by slot, domain by domain and bucket order
included, with a full build over the same nodes and running jobs. The decisions of
passes on such sequences are compared with from-scratch passes in
tests/placement/test_incremental.py.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from placement.incremental import AdmissionCache
from placement.model import CapacityType, NodeInfo, RunningJob, Snapshot
from placement.scheduler import build_fleet
from placement.topology import CapacityIndex, Domain
from tests.placement.test_perf_equivalence import _bench

STEPS = 40


def dump(ix: CapacityIndex) -> tuple:
    """Everything a pass can read of an index, in order."""

    def dom(d: Domain) -> tuple:
        return (d.level, d.label, list(d.cnt), d.free, d.order,
                [s.info.id for s in d.bare], [dom(x) for x in d.subs])

    parts = [(p.key, p.agent_id, p.region, p.accelerator, int(p.capacity_type), p.pool, p.price,
              p.risk, p.plan_start, p.plan_end, p.future, p.maxg, p.total, p.us_max_nodes, p.order,
              [(s.info, s.free, s.klass, s.order, [d.label for d in s.doms]) for s in p.slots],
              [[[s.info.id for s in b] for b in klass] for klass in p.buckets],
              {lvl: [d.label for d in ds] for lvl, ds in p.levels.items()}, dom(p.root))
             for p in ix.partitions]
    return parts, {i: s.info for i, s in sorted(ix.slot_by_id.items())}


def _change(rng: random.Random, nodes: dict[str, NodeInfo]) -> None:
    """One inventory change of the kinds agents report."""
    plain = sorted(i for i, n in nodes.items() if n.plan_start is None and n.plan_end is None)
    nid = rng.choice(plain)
    n = nodes[nid]
    roll = rng.random()
    if roll < 0.35:
        nodes[nid] = replace(n, healthy=not n.healthy)
    elif roll < 0.5:
        nodes[nid] = replace(n, cordoned=not n.cordoned)
    elif roll < 0.6:
        nodes[nid + "-b"] = replace(n, id=nid + "-b")
    elif roll < 0.7:
        del nodes[nid]
    elif roll < 0.8:
        nodes[nid] = replace(n, layer3=n.layer3 + "x", ultraserver="")
    elif roll < 0.9:
        nodes[nid] = replace(n, gpus=max(1, n.gpus // 2))
    else:
        other = (CapacityType.SPOT if n.capacity_type == CapacityType.ON_DEMAND
                 else CapacityType.ON_DEMAND)
        nodes[nid] = replace(n, capacity_type=other)


@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15, 16])
def test_node_changes_give_the_index_a_full_build_gives(seed: int) -> None:
    rng = random.Random(seed)
    s = _bench().make_snapshot(0.1, 300, seed=seed)
    nodes = {n.id: n for n in s.nodes}
    cache = AdmissionCache(s.nodes, s.running)
    now = s.now
    cache.schedule(now, ())
    for step in range(STEPS):
        for _ in range(rng.randint(1, 3)):
            _change(rng, nodes)
        cache.set_nodes(nodes.values())
        # jobs end and start meanwhile (the running deltas are applied in the same pass)
        for rid in rng.sample(sorted(cache.running), k=min(len(cache.running), rng.randint(0, 5))):
            cache.remove_running(rid)
        usable = [n for n in nodes.values() if n.healthy and not n.cordoned and n.plan_start is None]
        for k in range(rng.randint(0, 3)):
            n = rng.choice(usable)
            cache.add_running(RunningJob(id=f"new-{step}-{k}", team="team-0", priority=0,
                                         allocations=((n.id, 1),), accelerator=n.accelerator,
                                         started_time=now, last_checkpoint_time=now))
        cache.schedule(now, ())
        full = build_fleet(Snapshot(now=now, nodes=tuple(nodes.values()),
                                    running=tuple(cache.running.values()), pending=()))
        kept = cache._fleet
        assert kept is not None
        assert dump(kept.index) == dump(full.index), f"seed {seed} step {step}: index differs"
        assert dump(kept.future) == dump(full.future), f"seed {seed} step {step}: future differs"
    # the cheap path ran: partitions were rebuilt, the whole index only now and then
    assert cache.partition_rebuilds > STEPS // 2
    assert cache.rebuilds < STEPS // 2, cache.rebuilds
