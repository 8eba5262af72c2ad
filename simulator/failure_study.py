"""Goodput with and without node failures, and what each recovery tier buys back.

    python -m simulator.failure_study --trace ../shared/traces/philly_dev.csv \\
        --scenario simulator/scenarios/philly_3region.yaml --limit-jobs 12914 --out docs/sim/failures

Runs one policy (``ours`` by default) on the same trace, scenario and seed under a list of
node-failure settings (:data:`VARIANTS`, applied to the scenario as data): no node
failures; Meta's rate (1.8 h MTTF per 16,384 GPUs, scaled to the fleet) with the store
tier only (what a job without the memory tier gets), with one reserved spare per
on-demand pool, with the memory tier but no spares, and with both; and the same at ten
times Meta's rate (a stress row: the fleet is small, so at Meta's rate it sees few
failures); then with elastic multi-node jobs (down to one node), with and without growing
back (the live pass's step: a job shrunk in place or started small returns to its size
when nodes free up, after the broker's settle time and rate limit). How each job that lost a node comes back is the live broker's decision
(``RecoveryPolicy.relaunch``, see :mod:`simulator.node_recovery`): in place only with the
memory tier and a ready spare in the lost node's block, and never for a one-node job.
Writes ``result.json`` (deterministic: same inputs and seed, same bytes), ``timing.json``
and ``results.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from simulator import metrics, node_recovery
from simulator import scenario as scenario_mod
from simulator import trace as trace_mod
from simulator.engine import Simulation
from simulator.node_recovery import NodeFailures, Tier
from simulator.policies import TABLE, PolicyKind

META = node_recovery.META_MTTF_H_PER_16K_GPUS


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    text: str
    failures: NodeFailures | None  # None: no node failures at all
    no_failures: bool = False  # the section's other settings, but no node failures at all


VARIANTS: tuple[Variant, ...] = (
    Variant("none", "no node failures", None),
    Variant("meta-store", "Meta's rate; store tier (the job queues again)",
            NodeFailures(mttf_h_per_16k_gpus=META)),
    Variant("meta-store-spares", "Meta's rate; store tier, 1 spare per pool",
            NodeFailures(mttf_h_per_16k_gpus=META, spares_per_pool=1)),
    Variant("meta-memory", "Meta's rate; memory tier (60 s), no spares",
            NodeFailures(mttf_h_per_16k_gpus=META, tier=Tier.MEMORY)),
    Variant("meta-memory-spares", "Meta's rate; memory tier (60 s), 1 spare per pool",
            NodeFailures(mttf_h_per_16k_gpus=META, tier=Tier.MEMORY, spares_per_pool=1)),
    Variant("10x-store", "10x Meta's rate; store tier",
            NodeFailures(mttf_h_per_16k_gpus=META / 10)),
    Variant("10x-store-spares", "10x Meta's rate; store tier, 1 spare per pool",
            NodeFailures(mttf_h_per_16k_gpus=META / 10, spares_per_pool=1)),
    Variant("10x-memory-spares", "10x Meta's rate; memory tier (60 s), 1 spare per pool",
            NodeFailures(mttf_h_per_16k_gpus=META / 10, tier=Tier.MEMORY, spares_per_pool=1)),
    # Elastic multi-node jobs (down to one node): a node loss without a spare shrinks them
    # in place, and placement may start them small; with and without growing back.
    Variant("none-elastic-stay", "no node failures; elastic jobs, no grow back",
            NodeFailures(elastic_jobs=True, grow_back=False), no_failures=True),
    Variant("none-elastic-grow", "no node failures; elastic jobs, grow back",
            NodeFailures(elastic_jobs=True), no_failures=True),
    Variant("meta-elastic-stay", "Meta's rate; memory tier, no spares, elastic jobs, no grow back",
            NodeFailures(mttf_h_per_16k_gpus=META, tier=Tier.MEMORY, elastic_jobs=True, grow_back=False)),
    Variant("meta-elastic-grow", "Meta's rate; memory tier, no spares, elastic jobs, grow back",
            NodeFailures(mttf_h_per_16k_gpus=META, tier=Tier.MEMORY, elastic_jobs=True)),
    Variant("10x-elastic-stay", "10x Meta's rate; memory tier, no spares, elastic jobs, no grow back",
            NodeFailures(mttf_h_per_16k_gpus=META / 10, tier=Tier.MEMORY, elastic_jobs=True,
                         grow_back=False)),
    Variant("10x-elastic-grow", "10x Meta's rate; memory tier, no spares, elastic jobs, grow back",
            NodeFailures(mttf_h_per_16k_gpus=META / 10, tier=Tier.MEMORY, elastic_jobs=True)),
)

# RELAUNCH_RULES' blockers as the study's columns ("none" = replaced in place, "shrink" =
# shrunk in place onto the survivors; the rest went through the store)
IN_PLACE = "none"
SHRUNK = "shrink"
FAILURE_BUCKETS = ("auto_resume", "node_replaced")  # lost GPU-hours a node failure caused


def apply(scn: scenario_mod.Scenario, v: Variant) -> scenario_mod.Scenario:
    if v.failures is None or v.no_failures:
        regions = tuple(dataclasses.replace(r, node_mtbf_h=0.0) for r in scn.regions)
        return dataclasses.replace(scn, regions=regions, node_failures=v.failures or NodeFailures())
    return dataclasses.replace(scn, node_failures=v.failures)


def run(trace_path: str, scenario_path: str, limit: int | None, seed: int,
        policy: PolicyKind, variants: tuple[Variant, ...] = VARIANTS) -> tuple[dict, dict]:
    scn = scenario_mod.load(scenario_path)
    jobs = trace_mod.load(trace_path, limit)
    out: dict = {"trace": {"file": Path(trace_path).name, "sha256": trace_mod.sha256(trace_path),
                           "jobs": len(jobs), "limit": limit},
                 "scenario": scn.name, "seed": seed, "policy": policy.value, "variants": []}
    timing: dict = {}
    for v in variants:
        s = apply(scn, v)
        c0 = time.process_time()
        sim = Simulation(s, jobs, TABLE[policy], seed).run()
        timing[v.name] = round(time.process_time() - c0, 2)
        m = metrics.collect(sim)
        rec: dict[str, int] = {}
        small: dict[str, int] = {}
        for j in sim.sj.values():
            for k, n in j.recoveries.items():
                rec[k] = rec.get(k, 0) + n
            for k, n in j.small_routes.items():
                small[k] = small.get(k, 0) + n
        ran_small = [j.finish_t - j.tj.submit_s for j in sim.sj.values() if j.small_routes and j.ended]
        node_mtbf = s.node_failures.node_mtbf_h(s.regions[0].gpus_per_node, s.regions[0].node_mtbf_h)
        out["variants"].append(metrics._r({
            "name": v.name, "text": v.text,
            "node_failures": None if v.failures is None or v.no_failures else s.to_dict()["node_failures"],
            "settings": None if v.failures is None else s.to_dict()["node_failures"],
            "node_mtbf_h": node_mtbf,
            "goodput": m["goodput"], "utilisation": m["utilisation"],
            "jct_mean_h": m["jct_s"]["mean"] / 3600, "jct_p99_h": m["jct_s"]["p99"] / 3600,
            "failures_under_jobs": dict(sorted(rec.items())),
            "lost_gpu_h_node_failures": sum(m["lost_gpu_h"].get(b, 0.0) for b in FAILURE_BUCKETS),
            "lost_gpu_h_total": m["lost_gpu_h_total"],
            "below_size": dict(sorted(small.items())),
            "grow_backs": sum(j.grow_backs for j in sim.sj.values()),
            "lost_gpu_h_grow_back": m["lost_gpu_h"].get("grow_back", 0.0),
            # the jobs that ran below their size at some point: their own JCT
            "below_size_jobs": len(ran_small),
            "below_size_jct_mean_h": (sum(ran_small) / len(ran_small) / 3600) if ran_small else 0.0,
        }))
    return out, timing


def markdown(res: dict, timing: dict) -> str:
    t = res["trace"]
    lines = [f"# Node failures and recovery tiers: {res['scenario']}", "",
             f"Policy `{res['policy']}`, trace `{t['file']}` ({t['jobs']} jobs), seed {res['seed']}.",
             "Lost GPU-h (failures): work redone and GPUs held without progress because of node"
             " failures (queued-again attempts and in-place replacements).", "",
             "Failures under jobs: how the broker's recovery policy relaunched each job that lost a"
             " node (in place, or from the store and why: the rule that blocked the in-place plan).",
             "",
             "Below size: how often a job came to run on fewer nodes than it asked for (shrunk"
             " in place, placed or moved elastically), and how many grow-back moves followed"
             " (their lost GPU-h: the checkpoint-first stop and the relaunch).", "",
             "| variant | node MTBF h | goodput | failures under jobs: replaced / shrunk / from store"
             " (why) | lost GPU-h (failures) | lost GPU-h (all) | below size: shrunk / placed / moved"
             " | grow backs (lost GPU-h) | JCT mean h of those jobs | JCT mean h | JCT p99 h | CPU s |",
             "|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for v in res["variants"]:
        f = v["failures_under_jobs"]
        mtbf = "-" if v["node_failures"] is None else f"{v['node_mtbf_h']:.0f}"
        why = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in sorted(f.items())
                        if k not in (IN_PLACE, SHRUNK))
        store = sum(n for k, n in f.items() if k not in (IN_PLACE, SHRUNK))
        b = v.get("below_size", {})
        below = " / ".join(str(b.get(r, 0)) for r in ("shrink_in_place", "elastic_placement", "elastic_move"))
        lines.append(f"| {v['text']} | {mtbf} | {v['goodput'] * 100:.2f} % | {f.get(IN_PLACE, 0)} / "
                     f"{f.get(SHRUNK, 0)} / {store}{f' ({why})' if why else ''} | "
                     f"{v['lost_gpu_h_node_failures']:.1f} | {v['lost_gpu_h_total']:.0f} | {below} | "
                     f"{v.get('grow_backs', 0)} ({v.get('lost_gpu_h_grow_back', 0.0):.1f}) | "
                     + (f"{v['below_size_jct_mean_h']:.2f} ({v['below_size_jobs']}) | "
                        if v.get("below_size_jobs") else "- | ")
                     + f"{v['jct_mean_h']:.2f} | {v['jct_p99_h']:.2f} | {timing.get(v['name'], 0):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--limit-jobs", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", default=PolicyKind.OURS.value)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    a = ap.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    unknown = sorted(set(names) - {v.name for v in VARIANTS})
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(v.name for v in VARIANTS)}")
    chosen = tuple(v for v in VARIANTS if not names or v.name in names)
    res, timing = run(a.trace, a.scenario, a.limit_jobs, a.seed, PolicyKind(a.policy), chosen)
    d = Path(a.out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "result.json").write_text(json.dumps(res, sort_keys=True, indent=1) + "\n")
    (d / "timing.json").write_text(json.dumps(timing, sort_keys=True, indent=1) + "\n")
    (d / "results.md").write_text(markdown(res, timing))
    print(markdown(res, timing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
