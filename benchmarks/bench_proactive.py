"""Cost of the proactive rules (broker/jobs/proactive.py) at fleet scale, against a full
placement pass on the same snapshot, in the same process.

Why: the live broker runs them after a scheduler pass (broker/scheduling/proactive_watch.py,
at most every ``proactive_interval_s``) in the scheduler's own thread, so their cost is
time the queue waits. The snapshot is benchmarks/bench_placement.py's (20,000 GPUs and
5,000 pending jobs, both x ``--scale``; ~40% busy). Every running on-demand job consents
(``recovery_policy=better-capacity`` as the broker default: the worst case) and each
``fits`` call runs the live filter (``placement.firstfit.node_fits_job`` on the job's
request). Cases:

* ``better_capacity`` / ``typical``: the queue drained (waiting jobs take plan capacity
  first), the plan nodes as bench_placement leaves them (most free): the rule finds its
  moves early;
* ``better_capacity`` / ``scattered``: every plan node keeps 1 free GPU (a job fills the
  rest) and the jobs whose shares are 2+ GPUs consent, so no share fits anywhere and
  every candidate is refused: the longest scan;
* ``defragment``: the full queue; the first waiting gang that fits nowhere, movable jobs
  of <= 8 GPUs.

Prints p50/p99 ms per call and the ratio to the full pass's p50; writes
benchmarks/results/proactive.json.

    .venv/bin/python benchmarks/bench_proactive.py [--scale 1,5] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_placement as bp  # noqa: E402

import placement  # noqa: E402
from broker.jobs import proactive  # noqa: E402
from placement.firstfit import node_fits_job  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "proactive.json"
MOVE_S = 120.0  # plan_move_floor_s: a job that never moved
REMAINING_S = 10 * 3600.0


def timed(fn, repeats: int) -> tuple[list[float], object]:  # noqa: ANN001
    out, last = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        last = fn()
        out.append((time.perf_counter() - t) * 1000)
    return out, last


def scattered(snap: placement.Snapshot) -> placement.Snapshot:
    """Every usable plan node keeps exactly 1 free GPU: a 7-GPU job on each free GPU group."""
    used: dict[str, int] = {}
    for r in snap.running:
        for n, g in r.allocations:
            used[n] = used.get(n, 0) + g
    extra = []
    for n in snap.nodes:
        if n.capacity_type == placement.CapacityType.TRAINING_PLAN and (n.plan_start or 0) <= snap.now:
            free = n.gpus - used.get(n.id, 0)
            if free > 1:
                extra.append(placement.RunningJob(id=f"fill-{n.id}", team="t0", priority=50,
                                                  allocations=((n.id, free - 1),)))
    return replace(snap, running=snap.running + tuple(extra))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", default="1,5", help="fleet sizes x 20,000 GPUs (comma-separated)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    report: dict = {"runs": {}}
    for scale in (float(x) for x in args.scale.split(",")):
        report["runs"][f"{scale:g}x"] = run_scale(scale, args.repeats)
    report["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "load_avg_1m": round(os.getloadavg()[0], 2)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def run_scale(scale: float, repeats: int) -> dict:
    snap = bp.make_snapshot(scale, round(5000 * scale))
    gpus = sum(n.gpus for n in snap.nodes)
    say = print
    say(f"snapshot: {gpus:,} GPUs, {len(snap.running):,} running, {len(snap.pending):,} pending")
    full, dec = timed(lambda: placement.schedule(snap), repeats)
    base = bp.pct(full, 50)
    say(f"  full placement pass (baseline): p50 {base:.1f} ms")

    info = {n.id: n for n in snap.nodes}
    requests: dict[str, placement.JobRequest] = {}

    def fits(r: placement.RunningJob, node: placement.NodeInfo) -> bool:
        req = requests.get(r.id)
        if req is None:  # the live filter: the job's own request, built once per check
            req = requests[r.id] = placement.JobRequest(
                id=r.id, team=r.team, priority=r.priority, nodes=len(r.allocations),
                gpus_per_node=max(g for _, g in r.allocations), accelerator=r.accelerator)
        return node_fits_job(node, req, snap.draining_regions)

    def on_demand(s: placement.Snapshot) -> int:
        return sum(1 for r in s.running if info[r.allocations[0][0]].capacity_type
                   == placement.CapacityType.ON_DEMAND)

    kw = dict(move_s=lambda r: MOVE_S, remaining_s=lambda r: REMAINING_S, may_move=lambda r: True)
    out: dict = {"gpus": gpus, "running": len(snap.running), "pending": len(snap.pending),
                 "full_pass_ms_p50": round(base, 2), "cases": {}}
    # Plan capacity goes to waiting jobs first (the pass before the rule admits them): the
    # better-capacity cases run on a drained queue, when plan capacity is left free.
    drained = replace(snap, pending=())
    cases = {
        "better_capacity/typical": (drained, lambda s, d: proactive.better_capacity(s, d, fits=fits, **kw)),
        "better_capacity/scattered": (scattered(drained), lambda s, d: proactive.better_capacity(
            s, d, fits=fits, **{**kw, "may_move": lambda r: min(g for _, g in r.allocations) > 1})),
        "defragment": (snap, lambda s, d: proactive.defragment(s, d, movable_gpus=8, fits=fits, **kw)),
    }
    say(f"  {'case':<28}{'p50 ms':>9}{'p99 ms':>9}{'vs pass':>9}{'moves':>7}{'candidates':>12}")
    for name, (s, rule) in cases.items():
        d = dec if s is snap else placement.schedule(s)  # this snapshot's own pass
        requests.clear()
        times, props = timed(lambda s=s, d=d, rule=rule: (requests.clear(), rule(s, d))[1], repeats)
        p50, p99 = bp.pct(times, 50), bp.pct(times, 99)
        row = {"p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "ratio_vs_full_pass": round(p50 / base, 3),
               "moves": len(props), "on_demand_running": on_demand(s)}
        out["cases"][name] = row
        say(f"  {name:<28}{p50:>9.1f}{p99:>9.1f}{p50 / base:>8.2f}x{len(props):>7}{row['on_demand_running']:>12,}")
    return out


if __name__ == "__main__":
    sys.exit(main())
