"""``brokerctl status``: one screen that answers "what is running, what waits and why,
and what does it cost right now" (SkyPilot's ``sky status`` / ``sky queue`` in one).

Built only from what the other commands already read (ListRegions, ListJobs), so it
adds no API: the spend rate is each running job's GPUs placed times its price per
GPU-hour, the fleet line sums the regions' GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from rich.console import Group
from rich.text import Text

from brokerctl import render
from brokersdk.client import phase_name
from computebroker.v1 import capacity_pb2, common_pb2

LIVE = ("running", "launching", "admitted", "checkpointing", "migrating", "suspended")


def spend_per_hour(job: common_pb2.Job) -> float:
    """$ per hour a holding job costs now: GPUs placed x price per GPU-hour."""
    return job.placement.world_size * job.placement.price_per_gpu_hour


def status_view(jobs: Iterable[common_pb2.Job], regions: Sequence[capacity_pb2.RegionInfo],
                width: int = 100, now: float | None = None) -> Group:
    now = time.time() if now is None else now
    jobs = list(jobs)
    live = [j for j in jobs if phase_name(j.phase) in LIVE]
    pending = [j for j in jobs if phase_name(j.phase) == "pending"]
    connected = sum(r.connected for r in regions)
    total = sum(r.total_gpus for r in regions)
    used = sum(r.allocated_gpus for r in regions)
    rate = sum(spend_per_hour(j) for j in live)
    parts: list[object] = []
    head = Text("fleet ", style="bold")
    head.append(f"{connected}/{len(regions)} region(s) connected, {used}/{total} GPUs in use"
                + (f" ({100 * used // total}%)" if total else ""))
    draining = [r.name for r in regions if r.draining]
    if draining:
        head.append(f"; draining: {', '.join(draining)}", style="yellow")
    parts.append(head)
    spend = Text("spend ", style="bold")
    spend.append(f"${rate:,.2f}/h now across {len(live)} running job(s)")
    parts.append(spend)
    parts.append(Text(f"running ({len(live)})", style="bold green"))
    if live:
        parts.append(render.jobs_view(render.newest_first(live), now, width=width))
    parts.append(Text(f"pending ({len(pending)})", style="bold yellow"))
    for j in render.newest_first(pending):
        line = Text(f"{j.id} ", style="bold")
        line.append(f"{j.spec.name or '-'} ({j.spec.team or '-'}, {render.shape(j)}, "
                    f"waiting {render.age(j.created_time, now)}): ")
        line.append(j.pending_reason or "waiting for the next scheduling pass", style="yellow")
        parts.append(line)
    done = [j for j in jobs if j.phase in (common_pb2.JOB_PHASE_FAILED,)
            and j.finished_time and now - j.finished_time < 3600]
    if done:
        parts.append(Text(f"failed in the last hour ({len(done)})", style="bold red"))
        for j in render.newest_first(done):
            line = Text(f"{j.id} ", style="bold")
            line.append(f"{j.spec.name or '-'}: {j.message or '-'}", style="red")
            parts.append(line)
    return Group(*parts)
