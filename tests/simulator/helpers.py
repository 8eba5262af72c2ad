"""Tiny scenarios and traces written to tmp_path for the simulator tests."""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from simulator.engine import T0, Simulation
from simulator.policies import TABLE, PolicyKind
from simulator.scenario import parse
from simulator.trace import load

HEADER = "job_id,submit_time_s,duration_s,num_gpus,gpu_type,user_or_team,status\n"


def write_trace(path: Path, rows: list[tuple[str, float, float, int, str]]) -> Path:
    path.write_text(HEADER + "".join(f"{j},{s},{d},{g},,{t},\n" for j, s, d, g, t in rows))
    return path


def scenario(**over) -> dict:  # noqa: ANN003
    """One region, no random failures or interruptions, a 10 s scheduler grid, 1 GB/s
    everywhere, 10 s process start: every time below is exact."""
    base = {
        "name": "tiny", "scheduler_interval_s": 10, "inter_region_gbps": 1.0,
        "checkpoint": {"bytes_per_gpu": 1e9, "interval_s": 300, "write_gbps": 1.0, "read_gbps": 1.0,
                       "process_start_s": 10},
        "regions": [{"name": "r1", "pools": [{"kind": "on_demand", "nodes": 2, "price_per_gpu_hour": 2.0}]}],
        "teams": [{"name": "t", "region": "r1", "guaranteed_gpus": 64}],
    }
    base.update(over)
    return base


def simulate(tmp: Path, scn: dict, rows: list, policy: PolicyKind = PolicyKind.OURS, seed: int = 1,
             check: bool = True) -> Simulation:
    trace = write_trace(tmp / "trace.csv", rows)
    return Simulation(parse(yaml.safe_load(yaml.safe_dump(scn))), load(trace), TABLE[policy], seed,
                      check=check).run()


def jct(sim: Simulation, job_id: str) -> float:
    j = sim.sj[job_id]
    return j.finish_t - j.tj.submit_s


def random_rows(n: int, seed: int = 7) -> list:
    """A busy mixed trace: mostly 1-GPU jobs, some 8/16/32-GPU gangs, three teams."""
    rng = random.Random(seed)
    rows, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 120)
        g = rng.choices([1, 2, 4, 8, 16, 32], [60, 8, 8, 12, 8, 4])[0]
        rows.append((f"j{i:04d}", round(t), round(rng.expovariate(1 / 5400)) + 1, g, rng.choice("abc")))
    return rows


def busy_scenario() -> dict:
    """Three regions with spot, a plan, failures, hangs, an outage, a drain, a reclaim."""
    day = 86400
    return {
        "name": "busy", "scheduler_interval_s": 60, "inter_region_gbps": 1.0,
        "checkpoint": {"bytes_per_gpu": 2e9, "interval_s": 900, "write_gbps": 2.0, "read_gbps": 4.0,
                       "process_start_s": 30},
        "regions": [
            {"name": "a", "node_mtbf_h": 60, "hang_mtbf_h": 400, "pools": [
                {"kind": "on_demand", "nodes": 6, "price_per_gpu_hour": 3.0},
                {"kind": "spot", "nodes": 2, "price_per_gpu_hour": 1.0, "interruptions_per_node_hour": 0.2},
                {"kind": "training_plan", "name": "p", "nodes": 4, "price_per_gpu_hour": 1.5,
                 "start_s": 0.1 * day, "end_s": 0.4 * day}]},
            {"name": "b", "node_mtbf_h": 60, "pools": [
                {"kind": "on_demand", "nodes": 4, "price_per_gpu_hour": 3.5},
                {"kind": "spot", "nodes": 2, "price_per_gpu_hour": 1.2, "interruptions_per_node_hour": 0.3}]},
            {"name": "c", "pools": [{"kind": "on_demand", "nodes": 4, "price_per_gpu_hour": 4.0}]},
        ],
        "teams": [{"name": "a", "region": "a", "guaranteed_gpus": 48},
                  {"name": "b", "region": "b", "guaranteed_gpus": 32},
                  {"name": "c", "region": "c", "guaranteed_gpus": 32}],
        "outages": [{"region": "b", "start_s": 0.2 * day, "end_s": 0.25 * day}],
        "drains": [{"region": "c", "start_s": 0.3 * day, "end_s": 0.35 * day}],
        "reclaims": [{"region": "a", "start_s": 0.15 * day, "end_s": 0.2 * day}],
    }


__all__ = ["T0", "busy_scenario", "jct", "random_rows", "scenario", "simulate", "write_trace"]
