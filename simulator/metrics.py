"""Metrics of one simulated policy run, from the jobs' records and the samples.

Definitions (docs/simulator.md repeats them):
- utilisation: GPUs held / GPUs present, averaged over hourly samples until the last job ends;
- goodput: useful GPU-time (GPUs x the trace duration) / GPU-time held (admission to release);
- JCT: finish - submit; queue wait: every interval the job spent queued (its first queue and
  every re-queue after a preemption, failure or move), not only the broker's ``queued_s``
  bucket (which files re-queued time under the cause that re-queued it);
- jobs no state of the fleet could run (``unplaceable``) are listed per job with the reason
  and left out of JCT and wait;
- lost GPU-hours by cause: work redone after an interruption (back to the last durable
  checkpoint), time spent checkpointing for a stop, start-up time of the relaunch
  (read + transfer + process start), hangs, and gangs slowed by a spread placement;
- cost: spot and on-demand per GPU-hour held; training plans are prepaid (whole window);
- fairness: per team, GPUs held on average / min(guarantee, average demand); Jain's index
  over those ratios (1 = every team got the same fraction of what it was entitled to).
"""

from __future__ import annotations

import math
from collections import defaultdict

from simulator.engine import SAMPLE_S, Simulation


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (deterministic, no interpolation)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def _stats(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "mean": sum(xs) / len(xs) if xs else 0.0, "p50": pct(xs, 50), "p99": pct(xs, 99)}


def _counts(xs: list[float]) -> dict[str, float]:
    """Per-job counts (preemptions): mean, p99 and the worst job."""
    return {"mean": sum(xs) / len(xs) if xs else 0.0, "p99": pct(xs, 99), "max": max(xs, default=0.0)}


def _r(v):  # noqa: ANN001, ANN202 - round floats for a stable, readable JSON
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, dict):
        return {k: _r(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_r(x) for x in v]
    return v


def collect(sim: Simulation) -> dict:
    jobs = sorted(sim.sj.values(), key=lambda j: j.tj.id)
    end = max((j.finish_t for j in jobs), default=0.0)
    jct: dict[str, list[float]] = defaultdict(list)
    wait: dict[str, list[float]] = defaultdict(list)
    lost: dict[str, float] = defaultdict(float)
    cost: dict[str, float] = defaultdict(float)
    useful = held = 0.0
    worst = 0.0  # per-job goodput conservation error (seconds)
    preempt = migr = 0
    demand: dict[str, float] = defaultdict(float)
    unplaceable = []
    per_job_preempt: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        team = j.tj.team
        if j.unplaceable:  # never ran: reported per job, not a JCT of 0
            unplaceable.append({"job": j.tj.id, "team": team, "gpus": j.gpus, "reason": j.unplaceable})
            continue
        c = j.finish_t - j.tj.submit_s
        jct[team].append(c)
        jct[""].append(c)
        g = j.job.goodput
        wait[team].append(j.wait_s)
        wait[""].append(j.wait_s)
        per_job_preempt[team].append(float(j.preemptions))
        per_job_preempt[""].append(float(j.preemptions))
        parts = (g.productive_s + g.queued_s + g.starting_s + g.lost_failure_s
                 + g.lost_preemption_s + g.lost_migration_s)
        worst = max(worst, abs(parts - g.wall_s))
        for k, v in j.lost.items():
            lost[k] += v / 3600.0
        for k, v in j.cost.items():
            cost[k] += v
        useful += j.gpus * j.tj.duration_s
        held += j.alloc_gpu_s
        preempt += j.preemptions
        migr += j.migrations
        demand[team] += j.gpus * j.tj.duration_s
    for p in sim.plans:
        cost["plan"] += p.instance_count * p.gpus_per_instance * (p.end_time - p.start_time) / 3600.0 * p.price_per_gpu_hour
    samples = [s for s in sim.samples if s["t"] <= end] or sim.samples[:1]
    used = sum(sum(s["used"].values()) for s in samples)
    cap = sum(sum(s["capacity"].values()) for s in samples)
    span = max(end, SAMPLE_S)
    quota = {t.team: dict(t.guaranteed).get("", 0) for t in sim.teams} or {
        t.name: t.guaranteed_gpus for t in sim.scn.teams}
    fair = {}
    for team in sorted(jct):
        if not team:
            continue
        avg_held = sim.team_gpu_s.get(team, 0.0) / span
        entitled = min(quota.get(team, 0), demand[team] / span)
        fair[team] = {"avg_gpus_held": avg_held, "guaranteed": quota.get(team, 0),
                      "avg_demand": demand[team] / span,
                      "held_over_entitled": avg_held / entitled if entitled > 0 else None}
    ratios = [min(1.0, f["held_over_entitled"]) for f in fair.values() if f["held_over_entitled"] is not None]
    jain = (sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios))) if ratios and any(ratios) else 0.0
    return _r({
        "jobs": len(jobs),
        "makespan_h": end / 3600.0,
        "utilisation": used / cap if cap else 0.0,
        "goodput": useful / held if held else 0.0,
        "jct_s": _stats(jct[""]),
        "queue_wait_s": _stats(wait[""]),
        "per_team": {t: {"jct_s": _stats(jct[t]), "queue_wait_s": _stats(wait[t]),
                         "preemptions_per_job": _counts(per_job_preempt[t])} for t in sorted(jct) if t},
        "preemptions": preempt,
        "preemptions_per_job": _counts(per_job_preempt[""]),
        "unplaceable": unplaceable,
        "migrations": migr,
        "lost_gpu_h": dict(sorted(lost.items())),
        "lost_gpu_h_total": sum(lost.values()),
        "cost_usd": {k: cost.get(k, 0.0) for k in ("on_demand", "spot", "plan")},
        "cost_usd_total": sum(cost.values()),
        "fairness": {"jain_index": jain, "teams": fair},
        "events": sim.events,
        "scheduler_passes": sim.passes,
        "goodput_accounting_max_error_s": worst,
        # every 6th hourly sample (keeps the committed JSON small), and the JCT CDF as
        # percentiles 0..100 (enough for the plot)
        "samples": [{"t": s["t"], "used": s["used"], "capacity": s["capacity"], "queued": s["queued"]}
                    for s in samples[::6]],
        "jct_cdf_s": [pct(jct[""], q) if q else min(jct[""], default=0.0) for q in range(101)],
    })
