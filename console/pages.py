"""What each page needs from the broker: one loader per page, SDK calls only.

Why separate from the routes: a loader is a blocking function of (client, params) that
returns the template's context; the routes run it in a worker thread, and the live
stream (live.py) runs the very same loader to re-render a page.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from brokersdk.client import BrokerClient
from brokersdk.enums import capacity_type_name, phase_name
from console.fleet import CELL_STYLE, build_fleet
from console.jobview import build_job_view, log_text
from console.plans import build_gantt
from console.queue import ACTIVE_PHASES, PENDING_PHASES, build_queues

JOBS_PAGE_LIMIT = 200


class Page(enum.Enum):
    """The console's pages: template name and live refresh interval (seconds)."""

    FLEET = ("fleet.html", 5.0)
    QUEUE = ("queue.html", 3.0)
    JOBS = ("jobs.html", 5.0)
    JOB = ("job.html", 5.0)
    MIGRATIONS = ("migrations.html", 5.0)
    PLANS = ("plans.html", 10.0)

    @property
    def template(self) -> str:
        return self.value[0]

    @property
    def interval_s(self) -> float:
        return self.value[1]


@dataclass
class Loaded:
    page: Page
    context: dict[str, Any]


def load_fleet(client: BrokerClient, params: dict[str, str]) -> dict[str, Any]:
    # The two calls each build the broker's usage view: asked at once, not one after the
    # other (benchmarks/bench_console.py).
    with ThreadPoolExecutor(2) as pool:
        regions = pool.submit(client.regions)
        cap = client.capacity(include_nodes=True)
    return {"regions": build_fleet(regions.result(), cap.nodes), "legend": CELL_STYLE}


def load_queue(client: BrokerClient, params: dict[str, str]) -> dict[str, Any]:
    jobs = list(client.jobs(phases=[*PENDING_PHASES, *ACTIVE_PHASES], page_size=1000))
    return {"queues": build_queues(client.teams(), jobs)}


def load_jobs(client: BrokerClient, params: dict[str, str]) -> dict[str, Any]:
    jobs = list(itertools.islice(client.jobs(page_size=500), 5000))
    jobs.sort(key=lambda j: (j.created_time, j.id), reverse=True)
    return {"jobs": jobs[:JOBS_PAGE_LIMIT], "total": len(jobs)}


def load_job(client: BrokerClient, params: dict[str, str]) -> dict[str, Any]:
    job_id = params["job_id"]
    job = client.get_job(job_id)
    events = client.events(job_id)
    lines = log_text(client.logs(job_id, tail=40))
    return {"view": build_job_view(job, events, lines), "events": events[-15:]}


def load_migrations(client: BrokerClient, params: dict[str, str]) -> dict[str, Any]:
    return {"migrations": client.migrations(limit=200)}


def load_plans(client: BrokerClient, params: dict[str, str]) -> dict[str, Any]:
    plans = client.plans(include_ended=True)
    jobs = client.jobs(phases=list(ACTIVE_PHASES), page_size=1000)
    return {"gantt": build_gantt(plans, jobs)}


LOADERS: dict[Page, Callable[[BrokerClient, dict[str, str]], dict[str, Any]]] = {
    Page.FLEET: load_fleet, Page.QUEUE: load_queue, Page.JOBS: load_jobs, Page.JOB: load_job,
    Page.MIGRATIONS: load_migrations, Page.PLANS: load_plans,
}


def template_globals() -> dict[str, Any]:
    """Helpers every template may call (formatting only, no decisions)."""
    return {"phase_name": phase_name, "capacity_type_name": capacity_type_name,
            "ago": _ago, "clock": _clock, "secs": _secs}


def _ago(t: float) -> str:
    if not t:
        return "-"
    s = max(0, int(time.time() - t))
    return f"{s} s ago" if s < 120 else f"{s // 60} min ago" if s < 7200 else f"{s // 3600} h ago"


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _secs(s: float) -> str:
    return "-" if not s else f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"
