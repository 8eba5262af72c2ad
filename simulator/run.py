"""Run several policies on one trace and scenario, same seed; write JSON, Markdown, PNGs.

The result JSON is deterministic (same inputs and seed -> byte-identical file): wall-clock
figures (seconds, events/s) go to ``timing.json`` and the Markdown, never into it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from simulator import metrics, report
from simulator import scenario as scenario_mod
from simulator import trace as trace_mod
from simulator.engine import SimError, Simulation
from simulator.policies import DEFAULT, TABLE, PolicyKind

Progress = Callable[[PolicyKind, float], None]


@dataclass
class Outcome:
    result: dict
    timing: dict = field(default_factory=dict)
    sims: dict[PolicyKind, Simulation] = field(default_factory=dict)


def run(trace_path: str | Path, scenario_path: str | Path, *, policies: tuple[PolicyKind, ...] = DEFAULT,
        seed: int = 1, limit: int | None = None, progress: Progress | None = None,
        check: bool = False, keep: bool = False) -> Outcome:
    scn = scenario_mod.load(scenario_path)
    jobs = trace_mod.load(trace_path, limit)
    result: dict = {
        "trace": {"file": Path(trace_path).name, "sha256": trace_mod.sha256(trace_path), "jobs": len(jobs),
                  "limit": limit},
        "scenario": scn.to_dict(),
        "seed": seed,
        "policies": {},
    }
    timing: dict = {}
    sims = {}
    for kind in policies:
        pol = TABLE[kind]
        cb = (lambda f, k=kind: progress(k, f)) if progress else None
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            sim = Simulation(scn, jobs, pol, seed, progress=cb, check=check).run()
        except SimError as e:  # this policy's run broke: say so, run the others
            result["policies"][kind.value] = {"error": str(e), "summary": pol.summary,
                                              "recovery_policy": pol.recovery.name}
            if progress:
                progress(kind, 1.0)
            continue
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        m = metrics.collect(sim)
        m["summary"] = pol.summary
        m["recovery_policy"] = pol.recovery.name
        result["policies"][kind.value] = m
        # CPU seconds too: on a shared machine wall time measures the neighbours as well
        timing[kind.value] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "events": sim.events,
                              "events_per_s": round(sim.events / wall, 1) if wall else 0.0,
                              "events_per_cpu_s": round(sim.events / cpu, 1) if cpu else 0.0,
                              "passes": sim.passes}
        if progress:
            progress(kind, 1.0)
        if keep:
            sims[kind] = sim
    return Outcome(result, timing, sims)


def dumps(result: dict) -> str:
    return json.dumps(result, sort_keys=True, indent=1) + "\n"


def write(out: Outcome, out_dir: str | Path, plots: bool = True) -> list[Path]:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files = [d / "result.json", d / "timing.json", d / "results.md"]
    files[0].write_text(dumps(out.result))
    files[1].write_text(json.dumps(out.timing, sort_keys=True, indent=1) + "\n")
    files[2].write_text(report.markdown(out.result, out.timing))
    if plots:
        files += report.plots(out.result, d)
    return files
