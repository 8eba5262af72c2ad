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
from computebroker.v1 import common_pb2 as pb
from console.charts import Window as ChartWindow
from console.charts import build_charts
from console.fleet import CELL_STYLE, OwnJobs, build_fleet
from console.identity import Identity
from console.joblist import JobQuery, Sort, build_rows
from console.jobview import build_job_view, is_cause, log_text
from console.plans import Window, build_gantt, default_window
from console.queue import ACTIVE_PHASES, PENDING_PHASES, build_queues

JOBS_PAGE_LIMIT = 200  # rows shown
JOBS_READ_LIMIT = 5000  # newest jobs read to filter and sort
LOG_TAIL_LINES = 500  # the job page's log: its newest lines (the download has them all)


class Page(enum.Enum):
    """The console's pages: template name and live refresh interval (seconds)."""

    FLEET = ("fleet.html", 5.0)
    QUEUE = ("queue.html", 3.0)
    JOBS = ("jobs.html", 5.0)
    JOB = ("job.html", 5.0)
    MIGRATIONS = ("migrations.html", 5.0)
    PLANS = ("plans.html", 10.0)
    CHARTS = ("charts.html", 10.0)

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


def load_fleet(client: BrokerClient, params: dict[str, str],
               viewer: Identity | None = None) -> dict[str, Any]:
    # The calls each build the broker's usage view: asked at once, not one after the
    # other (benchmarks/bench_console.py).
    with ThreadPoolExecutor(2) as pool:
        regions = pool.submit(client.regions)
        # A viewer who reads only their team's jobs sees other teams' job ids as "another
        # team's job": the ids they may read are their team's active jobs.
        mine = (None if viewer is None or viewer.role.can_operate else
                pool.submit(lambda: OwnJobs.of(client.jobs(phases=list(ACTIVE_PHASES),
                                                           page_size=1000))))
        cap = client.capacity(include_nodes=True)
    own = None if mine is None else mine.result()
    return {"regions": build_fleet(regions.result(), cap.nodes, own), "legend": CELL_STYLE,
            "as_table": params.get("view") == "table"}


def load_queue(client: BrokerClient, params: dict[str, str],
               viewer: Identity | None = None) -> dict[str, Any]:
    jobs = list(client.jobs(phases=[*PENDING_PHASES, *ACTIVE_PHASES], page_size=1000))
    return {"queues": build_queues(client.teams(), jobs)}


def load_jobs(client: BrokerClient, params: dict[str, str],
              viewer: Identity | None = None) -> dict[str, Any]:
    query = JobQuery.parse(params)
    jobs = list(itertools.islice(client.jobs(page_size=500), JOBS_READ_LIMIT))
    rows = build_rows(jobs, query)
    return {"rows": rows[:JOBS_PAGE_LIMIT], "matched": len(rows), "total": len(jobs),
            "query": query, "sorts": list(Sort), "teams": sorted({j.spec.team for j in jobs}),
            "phases": [phase_name(v) for v in pb.JobPhase.values() if v]}


def load_job(client: BrokerClient, params: dict[str, str],
             viewer: Identity | None = None) -> dict[str, Any]:
    job_id = params["job_id"]
    job = client.get_job(job_id)
    events = client.events(job_id)
    lines = log_text(client.logs(job_id, tail=LOG_TAIL_LINES), LOG_TAIL_LINES)
    return {"view": build_job_view(job, events, lines), "events": events}


def load_migrations(client: BrokerClient, params: dict[str, str],
                    viewer: Identity | None = None) -> dict[str, Any]:
    return {"migrations": client.migrations(limit=200)}


def load_plans(client: BrokerClient, params: dict[str, str],
               viewer: Identity | None = None) -> dict[str, Any]:
    plans = client.plans(include_ended=True)
    jobs = client.jobs(phases=list(ACTIVE_PHASES), page_size=1000)
    window = Window.parse(params.get("window", ""), default_window(plans, time.time()))
    return {"gantt": build_gantt(plans, jobs, window=window)}


def load_charts(client: BrokerClient, params: dict[str, str],
                viewer: Identity | None = None) -> dict[str, Any]:
    """The broker's usage series (GetUsageSeries: a member gets their team's lines)."""
    window = ChartWindow.parse(params.get("window", ""))
    view = build_charts(client.usage_series(window.seconds, team=params.get("team", "")), window)
    return {"view": view, "windows": list(ChartWindow), "colors": dict(view.teams)}


# A loader: (the session's client, the page's parameters, who is looking) -> context.
Loader = Callable[[BrokerClient, dict[str, str], "Identity | None"], dict[str, Any]]
LOADERS: dict[Page, Loader] = {
    Page.FLEET: load_fleet, Page.QUEUE: load_queue, Page.JOBS: load_jobs, Page.JOB: load_job,
    Page.MIGRATIONS: load_migrations, Page.PLANS: load_plans, Page.CHARTS: load_charts,
}


def template_globals() -> dict[str, Any]:
    """Helpers every template may call (formatting only, no decisions)."""
    return {"phase_name": phase_name, "capacity_type_name": capacity_type_name,
            "ago": _ago, "clock": _clock, "secs": _secs, "dur": _dur, "is_cause": is_cause,
            "day": _day, "rel": _rel}


def _ago(t: float) -> str:
    if not t:
        return "-"
    s = max(0, int(time.time() - t))
    return f"{s} s ago" if s < 120 else f"{s // 60} min ago" if s < 7200 else f"{s // 3600} h ago"


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _day(t: float) -> str:
    """A date with its year (a plan may be years away)."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def _rel(t: float) -> str:
    """"in 3.1 years" / "2 days ago": how far a time is from now."""
    d = t - time.time()
    a = abs(d)
    text = (f"{a / 3600:.0f} h" if a < 2 * 86400 else f"{a / 86400:.0f} days" if a < 90 * 86400
            else f"{a / 86400 / 365.25:.1f} years")
    return f"in {text}" if d >= 0 else f"{text} ago"


def _dur(s: float) -> str:
    """A duration that may be zero ("0 s", never "-")."""
    s = max(0.0, s)
    return (f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200
            else f"{s / 3600:.1f} h")


def _secs(s: float) -> str:
    return "-" if not s else f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"
