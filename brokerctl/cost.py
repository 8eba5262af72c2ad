"""``brokerctl cost``: what the jobs of a period cost, per team, user, region or capacity
type, with the money moves to cheaper capacity saved (SkyPilot's ``sky cost-report``).

The broker charges each job as its phases end (Goodput.cost_usd and its splits by
capacity type and region, broker/jobs/lifecycle.py ``charge_money``); for a job that
holds GPUs now, the part since its phase began is added here at its current rate. A
job counts in a period when it was live at any time in it; its whole cost counts.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from rich.table import Table

from brokerctl import render
from brokersdk.client import TERMINAL_PHASES
from computebroker.v1 import common_pb2

HOLDING = (common_pb2.JOB_PHASE_ADMITTED, common_pb2.JOB_PHASE_LAUNCHING,
           common_pb2.JOB_PHASE_RUNNING, common_pb2.JOB_PHASE_CHECKPOINTING)
CAPACITY_COLUMNS = ("on_demand", "spot", "training_plan", "reserved")
GROUPS = ("team", "user", "region", "capacity")


@dataclass
class Row:
    jobs: set[str] = field(default_factory=set)
    usd: float = 0.0
    by_capacity: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    saved: float = 0.0


def in_period(job: common_pb2.Job, since: float) -> bool:
    return job.phase not in TERMINAL_PHASES or (job.finished_time or job.created_time) >= since


def job_costs(job: common_pb2.Job, now: float) -> tuple[dict[str, float], dict[str, float], float]:
    """(by capacity type, by region, saved) in $, the running phase included."""
    g = job.goodput
    by_cap = dict(g.cost_by_capacity)
    by_region = dict(g.cost_by_region)
    p = job.placement
    if job.phase in HOLDING and job.phase_time and p.world_size and p.price_per_gpu_hour:
        usd = max(0.0, now - job.phase_time) / 3600.0 * p.world_size * p.price_per_gpu_hour
        ctype = common_pb2.CapacityType.Name(p.capacity_type).removeprefix("CAPACITY_TYPE_").lower()
        by_cap[ctype] = by_cap.get(ctype, 0.0) + usd
        by_region[p.region] = by_region.get(p.region, 0.0) + usd
    return by_cap, by_region, g.saved_usd


def report(jobs: Iterable[common_pb2.Job], by: str, since: float,
           now: float | None = None) -> dict[str, Row]:
    now = time.time() if now is None else now
    rows: dict[str, Row] = defaultdict(Row)
    for j in jobs:
        if not in_period(j, since):
            continue
        by_cap, by_region, saved = job_costs(j, now)
        if by == "region":
            splits = {r: {"": v} for r, v in by_region.items()}
        elif by == "capacity":
            splits = {c: {c: v} for c, v in by_cap.items()}
        else:
            key = j.spec.team if by == "team" else (j.owner.removeprefix("user:") or "-")
            splits = {key or "-": by_cap}
        share = 1.0 / max(1, len(splits))  # saved money split evenly over a job's rows
        for key, caps in splits.items():
            row = rows[key]
            row.jobs.add(j.id)
            for c, v in caps.items():
                row.usd += v
                if c:
                    row.by_capacity[c] += v
            row.saved += saved * share
    return dict(rows)


def table(rows: dict[str, Row], by: str) -> Table:
    cols = [(by.upper(), {"flex": True}), ("JOBS", {"justify": "right"}),
            ("COST $", {"justify": "right"})]
    if by != "region":
        cols += [(c.replace("training_plan", "plan").replace("_", "-").upper() + " $",
                  {"justify": "right"}) for c in CAPACITY_COLUMNS]
    cols.append(("SAVED $", {"justify": "right"}))
    t = render._table(*cols)
    total = Row()
    for key in sorted(rows, key=lambda k: -rows[k].usd):
        r = rows[key]
        total.jobs |= r.jobs
        total.usd += r.usd
        total.saved += r.saved
        for c, v in r.by_capacity.items():
            total.by_capacity[c] += v
        t.add_row(*_cells(key, r, by))
    t.add_section()
    t.add_row(*_cells("total", total, by))
    return t


def _cells(key: str, r: Row, by: str) -> list[str]:
    cells = [key, str(len(r.jobs)), f"{r.usd:,.2f}"]
    if by != "region":
        cells += [f"{r.by_capacity.get(c, 0.0):,.2f}" for c in CAPACITY_COLUMNS]
    return cells + [f"{r.saved:,.2f}"]
