"""What a node's health flipping costs the scheduler's kept-alive capacity index
(placement/incremental.py): the partitions of the changed node built again, against the
whole index built again (what every node change did before), in the same run.

Why it is measured: an agent reports its nodes' health with its heartbeats, and at
2,000 Kubernetes nodes (the Kubernetes scale benchmark) some node changes every few
seconds when the cluster is busy; each change rebuilt the capacity index from every
node before the next pass could decide anything.

Two fleets: the Kubernetes scale benchmark's (2,000 8-GPU nodes of one agent, on-demand
and spot: two partitions, 2,500 two-node jobs running) and the placement benchmark's
(several agents, pools, a plan: many partitions). Per fleet, a node's health is flipped
``--flips`` times; each time the next pass's fleet preparation is timed (a pass with an
empty queue: everything it does is preparing the index), first with the partition
rebuild (the cache as it is) and then with the whole index dropped (the old rule), over
the same flips. Median and p90 in ms, the load average recorded.

    .venv/bin/python benchmarks/bench_node_deltas.py [--flips 60]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from placement.incremental import AdmissionCache  # noqa: E402
from placement.model import CapacityType, NodeInfo, RunningJob  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "node_deltas.json"


def kwok_fleet() -> tuple[list[NodeInfo], list[RunningJob]]:
    """bench_k8s.py's nodes and jobs, as the broker sees them."""
    nodes = [NodeInfo(id=f"gpu-{i:05d}", agent_id="us-east-2-agent", region="us-east-2",
                      zone=f"us-east-2{'abc'[i % 3]}", gpus=8, instance_type="p5.48xlarge",
                      layer1=f"l1-{i // 512}", layer2=f"l2-{i // 128}", layer3=f"l3-{i // 16}",
                      ultraserver=f"us-{i // 18}" if i % 4 == 0 else "",
                      capacity_type=(CapacityType.ON_DEMAND, CapacityType.SPOT)[i % 2])
             for i in range(2000)]
    running = [RunningJob(id=f"j{i}", team="bench", priority=0,
                          allocations=((nodes[(2 * i) % 2000].id, 2), (nodes[(2 * i + 1) % 2000].id, 2)),
                          accelerator="", started_time=0.0, last_checkpoint_time=0.0)
               for i in range(2500)]
    return nodes, running


def placement_fleet() -> tuple[list[NodeInfo], list[RunningJob]]:
    spec = importlib.util.spec_from_file_location("bench_placement", REPO / "benchmarks" / "bench_placement.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(mod)
    snap = mod.make_snapshot(1.0, 10, seed=7)
    return list(snap.nodes), list(snap.running)


def timed_flips(nodes: list[NodeInfo], running: list[RunningJob], flips: int, whole: bool) -> dict:
    """ms per pass after a node's health flipped (``whole``: the index dropped, as before)."""
    now = 1_000.0
    cache = AdmissionCache(nodes, running)
    cache.schedule(now, ())
    plain = [i for i, n in enumerate(nodes) if n.plan_start is None and n.plan_end is None]
    nodes = list(nodes)
    walls = []
    for k in range(flips):
        i = plain[(k * 7919) % len(plain)]
        nodes[i] = replace(nodes[i], healthy=not nodes[i].healthy)
        cache.set_nodes(nodes)
        if whole:
            cache._fleet = None  # the old set_nodes: any difference dropped the index
        t = time.perf_counter()
        cache.schedule(now, ())
        walls.append((time.perf_counter() - t) * 1000)
    walls.sort()
    return {"median_ms": round(statistics.median(walls), 2),
            "p90_ms": round(walls[int(0.9 * (len(walls) - 1))], 2),
            "index_rebuilds": cache.rebuilds, "partition_rebuilds": cache.partition_rebuilds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flips", type=int, default=60)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    out: dict = {"benchmark": "node_deltas", "flips": args.flips, "cpus": os.cpu_count(),
                 "load_before": [round(x, 2) for x in os.getloadavg()], "fleets": {}}
    for name, make in (("kubernetes_scale", kwok_fleet), ("placement", placement_fleet)):
        nodes, running = make()
        partitions = len({(n.agent_id, n.region, n.accelerator, int(n.capacity_type), n.pool,
                           n.price_per_gpu_hour, n.interruption_risk, n.plan_start, n.plan_end)
                          for n in nodes})
        out["fleets"][name] = {
            "nodes": len(nodes), "running": len(running), "partitions": partitions,
            "partition_rebuild": timed_flips(nodes, running, args.flips, whole=False),
            "whole_index_rebuild": timed_flips(nodes, running, args.flips, whole=True),
        }
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
