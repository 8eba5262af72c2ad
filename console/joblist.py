"""Jobs list view model: rows with GPUs, duration and cost, filtered and sorted.

Why here and not in the template: the filter (team, phase, name or id text), the sort
keys and the cost estimate are decisions; they live in one table (:data:`SORTS`) and
one function each, so the page, its live refresh and the tests read the same rows.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlencode

from brokersdk.enums import TERMINAL_PHASES, phase_name
from computebroker.v1 import common_pb2 as pb


@dataclass
class JobRow:
    job: pb.Job
    phase: str
    gpus: int
    duration_s: float  # submit -> end (or now)
    cost: float  # estimated, in the price unit of the nodes (per GPU-hour)

    @property
    def name(self) -> str:
        return self.job.spec.name or ""


def gpus_of(job: pb.Job) -> int:
    """GPUs it holds now, else the GPUs it asks for."""
    held = sum(a.gpus for a in job.placement.nodes)
    return held or job.spec.resources.nodes * job.spec.resources.gpus_per_node


def duration_of(job: pb.Job, now: float) -> float:
    end = job.finished_time if job.phase in TERMINAL_PHASES and job.finished_time else now
    return max(0.0, end - job.created_time) if job.created_time else 0.0


def cost_of(job: pb.Job) -> float:
    """An estimate: the time the job held capacity (goodput's wall time less its queued
    time) x its GPUs x its latest placement's price per GPU-hour. Why an estimate: a moved
    job paid each attempt's own price; the broker's cost report has the exact sum."""
    price = job.placement.price_per_gpu_hour
    if not price:
        return 0.0
    g = job.goodput
    held = max(0.0, g.wall_s - g.queued_s)
    return held / 3600.0 * gpus_of(job) * price


class Sort(enum.Enum):
    """The jobs list's sort keys (the query's ``sort``); newest first by default."""

    SUBMITTED = "submitted"
    NAME = "name"
    TEAM = "team"
    PHASE = "phase"
    GPUS = "gpus"
    DURATION = "duration"
    COST = "cost"


SORTS: dict[Sort, Callable[[JobRow], object]] = {
    Sort.SUBMITTED: lambda r: (r.job.created_time, r.job.id),
    Sort.NAME: lambda r: (r.name.lower(), r.job.id),
    Sort.TEAM: lambda r: (r.job.spec.team, r.job.id),
    Sort.PHASE: lambda r: (r.phase, r.job.id),
    Sort.GPUS: lambda r: (r.gpus, r.job.id),
    Sort.DURATION: lambda r: (r.duration_s, r.job.id),
    Sort.COST: lambda r: (r.cost, r.job.id),
}
# Columns that read best largest first when first clicked.
DESCENDING_FIRST = frozenset({Sort.SUBMITTED, Sort.GPUS, Sort.DURATION, Sort.COST})


@dataclass
class JobQuery:
    """The list's filters and order, parsed from the page's query string."""

    team: str = ""
    phase: str = ""
    text: str = ""
    sort: Sort = Sort.SUBMITTED
    descending: bool = True

    @classmethod
    def parse(cls, params: dict[str, str]) -> JobQuery:
        try:
            sort = Sort(params.get("sort") or Sort.SUBMITTED.value)
        except ValueError:
            sort = Sort.SUBMITTED
        order = params.get("order", "")
        desc = order == "desc" if order in ("asc", "desc") else sort in DESCENDING_FIRST
        return cls(params.get("team", "").strip(), params.get("phase", "").strip().lower(),
                   params.get("q", "").strip(), sort, desc)

    def link(self, sort: Sort) -> str:
        """The query string that sorts by ``sort`` (again: the other way round)."""
        if sort is self.sort:
            order = "asc" if self.descending else "desc"
        else:
            order = "desc" if sort in DESCENDING_FIRST else "asc"
        parts = [("team", self.team), ("phase", self.phase), ("q", self.text),
                 ("sort", sort.value), ("order", order)]
        return "?" + urlencode([(k, v) for k, v in parts if v])

    def matches(self, row: JobRow) -> bool:
        if self.team and row.job.spec.team != self.team:
            return False
        if self.phase and row.phase != self.phase:
            return False
        t = self.text.lower()
        return not t or t in row.name.lower() or row.job.id.lower().startswith(t)


def build_rows(jobs: Iterable[pb.Job], query: JobQuery, now: float | None = None) -> list[JobRow]:
    now = time.time() if now is None else now
    rows = [JobRow(j, phase_name(j.phase), gpus_of(j), duration_of(j, now), cost_of(j))
            for j in jobs]
    rows = [r for r in rows if query.matches(r)]
    rows.sort(key=SORTS[query.sort], reverse=query.descending)
    return rows
