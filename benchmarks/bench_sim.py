#!/usr/bin/env python3
"""Fleet simulator speed: simulated events per CPU-second, and growth from 1/4 to the full trace.

    python benchmarks/bench_sim.py [--trace ../shared/traces/philly_dev.csv]
        [--scenario simulator/scenarios/philly_3region.yaml] [--policy ours,static-quota]

Runs each policy on the first 1/4, 1/2 and all jobs of the trace (file order; ``--fractions``), measures
CPU time (the machine is shared: wall time would measure the neighbours too), the share
of it spent inside ``placement.schedule``, and prints the growth ratio against the 1/4
run (the in-run baseline): linear growth = the jobs ratio. Writes benchmarks/results/sim.json.
``static-quota`` is in by default: its queues are the longest, so it is the slowest policy
(the goal is at most 60 CPU-seconds per policy on the whole trace).
The default trace is the development trace next to the repository (``../shared/traces/``
from its root: the first 54 days of Microsoft's Philly trace, see simulator/trace.py); a
relative --trace is read from the current directory, then from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import placement  # noqa: E402
from simulator import engine, policies, scenario, trace  # noqa: E402


def measure(scn, jobs, kind) -> dict:  # noqa: ANN001
    spent = [0.0]
    real = placement.schedule

    def timed(snap):  # noqa: ANN001, ANN202
        c = time.process_time()
        try:
            return real(snap)
        finally:
            spent[0] += time.process_time() - c

    engine.placement.schedule = timed
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        sim = engine.Simulation(scn, jobs, policies.TABLE[kind], 1).run()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    finally:
        engine.placement.schedule = real
    return {"jobs": len(jobs), "events": sim.events, "passes": sim.passes, "cpu_s": round(cpu, 2),
            "wall_s": round(wall, 2), "events_per_cpu_s": round(sim.events / cpu, 0),
            "engine_share": round(spent[0] / cpu, 3),
            "simulated_days": round(max(j.finish_t for j in sim.sj.values()) / 86400, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="../shared/traces/philly_dev.csv",
                    help="job trace CSV (default: the development trace next to the repository)")
    ap.add_argument("--scenario", default=str(ROOT / "simulator/scenarios/philly_3region.yaml"))
    ap.add_argument("--policy", default="ours,static-quota", help="comma-separated policies")
    ap.add_argument("--fractions", default="0.25,0.5,1", help="shares of the trace, the first is the baseline")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/sim.json"))
    a = ap.parse_args()
    if not Path(a.trace).exists() and (ROOT / a.trace).exists():
        a.trace = str(ROOT / a.trace)  # relative to the repository, run from elsewhere
    scn = scenario.load(a.scenario)
    kinds = policies.parse(a.policy)
    full = trace.load(a.trace)
    load_start = os.getloadavg()  # the box is shared: CPU time is the measure, load the context
    runs = []
    for kind in kinds:
        mine = []
        for frac in (float(x) for x in a.fractions.split(",")):
            jobs = trace.load(a.trace, limit=int(len(full) * frac)) if frac < 1 else full
            r = {"policy": kind.value, "fraction": frac, **measure(scn, jobs, kind)}
            mine.append(r)
            print(f"{kind.value:>12} {frac:>5.2f} of the trace: {r['jobs']:>6} jobs, {r['events']:>7} events,"
                  f" {r['passes']:>6} passes, {r['cpu_s']:>7.1f} CPU s, {r['events_per_cpu_s']:>7.0f} events/CPU-s,"
                  f" engine {r['engine_share']:.0%}", flush=True)
        base = mine[0]
        for r in mine:
            r["cpu_vs_quarter"] = round(r["cpu_s"] / base["cpu_s"], 2)
            r["jobs_vs_quarter"] = round(r["jobs"] / base["jobs"], 2)
        print(f"{kind.value}: growth {mine[0]['fraction']:g} -> {mine[-1]['fraction']:g} of the trace:"
              f" {mine[-1]['jobs_vs_quarter']}x jobs, {mine[-1]['cpu_vs_quarter']}x CPU time")
        runs += mine
    out = {"trace": Path(a.trace).name, "trace_sha256": trace.sha256(a.trace), "scenario": scn.name,
           "policy": ",".join(k.value for k in kinds), "runs": runs,
           "load_avg_1m": {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)},
           "method": "CPU time (time.process_time) of Simulation.run for one policy; engine share ="
                     " CPU inside placement.schedule; fractions = the first N jobs in file order"}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
