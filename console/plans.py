"""Training plans view model: a Gantt of plan windows per region, with the jobs on them.

The axis is a window around now (:class:`Window`: a day, a week, a month, a year, or
everything). Why: plans run from last year to years ahead, and one axis over all of them
squeezes each into a sliver; a plan outside the window keeps its row, with its dates in
words instead of a bar, and the page counts what lies before and after the window.

A job is "on" a plan when its placement's capacity type is TRAINING_PLAN and its pool is
the plan id (an agent's training-plan pool is named after the plan). It is *reserved*
when it belongs to the plan's team (or the plan is shared), *backfilled* otherwise: idle
prepaid capacity another team borrows.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from brokersdk.enums import phase_name, plan_state_name
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb


class Window(enum.Enum):
    """The plans axis: (seconds before now, seconds after now); ALL spans every plan."""

    DAY = ("day", 6 * 3600, 24 * 3600)
    WEEK = ("week", 24 * 3600, 7 * 86400)
    MONTH = ("month", 3 * 86400, 31 * 86400)
    YEAR = ("year", 30 * 86400, 366 * 86400)
    ALL = ("all", 0, 0)

    @property
    def label(self) -> str:
        return self.value[0]

    @classmethod
    def parse(cls, text: str, default: Window) -> Window:
        return next((w for w in cls if w.label == text), default)


def default_window(plans: Iterable[cpb.TrainingPlan], now: float) -> Window:
    """The smallest window that shows the next plan (the first by start among those not
    yet ended) from its start to its end; a month when none ends within a year."""
    upcoming = sorted((p for p in plans if p.end_time >= now), key=lambda p: p.start_time)
    if not upcoming:
        return Window.MONTH
    first = upcoming[0]
    for w in (Window.DAY, Window.WEEK, Window.MONTH, Window.YEAR):
        _, back, ahead = w.value
        if first.start_time >= now - back and first.end_time <= now + ahead:
            return w
    return Window.YEAR


@dataclass
class Tick:
    left: float  # percent of the axis
    label: str


@dataclass
class PlanJob:
    id: str
    name: str
    team: str
    gpus: int
    phase: str
    use: str  # "reserved" | "backfill"


@dataclass
class PlanRow:
    plan: cpb.TrainingPlan
    state: str
    left: float
    width: float
    jobs: list[PlanJob] = field(default_factory=list)
    outside: str = ""  # "" = drawn; else where it lies: "before" | "after"
    clipped_start: bool = False  # began before the window
    clipped_end: bool = False  # ends after the window

    @property
    def gpus(self) -> int:
        return self.plan.instance_count * self.plan.gpus_per_instance


@dataclass
class RegionGantt:
    region: str
    rows: list[PlanRow] = field(default_factory=list)


@dataclass
class Gantt:
    t0: float
    t1: float
    now_pct: float
    regions: list[RegionGantt]
    window: Window = Window.ALL
    ticks: list[Tick] = field(default_factory=list)
    before: int = 0  # plans that ended before the window
    after: int = 0  # plans that start after it

    @property
    def windows(self) -> list[Window]:
        return list(Window)


def _ticks(t0: float, t1: float, count: int = 6) -> list[Tick]:
    """``count`` + 1 evenly spaced labels; hours when the axis spans under two days."""
    fmt = "%m-%d %H:%M" if t1 - t0 < 2 * 86400 else "%Y-%m-%d"
    return [Tick(100 * i / count, time.strftime(fmt, time.localtime(t0 + (t1 - t0) * i / count)))
            for i in range(count + 1)]


def build_gantt(plans: Iterable[cpb.TrainingPlan], jobs: Iterable[pb.Job],
                now: float | None = None, window: Window = Window.ALL) -> Gantt:
    now = time.time() if now is None else now
    plans = list(plans)
    if window is Window.ALL:
        t0 = min([p.start_time for p in plans] + [now])
        t1 = max([p.end_time for p in plans] + [now + 3600])
    else:
        t0, t1 = now - window.value[1], now + window.value[2]
    span = max(t1 - t0, 1.0)
    by_plan: dict[str, list[PlanJob]] = {}
    owners = {p.id: p.team for p in plans}
    for j in jobs:
        if j.placement.capacity_type != pb.CAPACITY_TYPE_TRAINING_PLAN or not j.placement.pool:
            continue
        owner = owners.get(j.placement.pool)
        use = "reserved" if not owner or owner == j.spec.team else "backfill"
        gpus = sum(a.gpus for a in j.placement.nodes)
        by_plan.setdefault(j.placement.pool, []).append(
            PlanJob(j.id, j.spec.name, j.spec.team, gpus, phase_name(j.phase), use))
    regions: dict[str, RegionGantt] = {}
    before = after = 0
    for p in sorted(plans, key=lambda p: (p.region, p.start_time, p.id)):
        start, end = max(p.start_time, t0), min(p.end_time, t1)
        outside = "before" if p.end_time < t0 else "after" if p.start_time > t1 else ""
        before += outside == "before"
        after += outside == "after"
        left = 100 * (start - t0) / span
        row = PlanRow(p, plan_state_name(p.state), left,
                      max(0.5, 100 * (end - start) / span), by_plan.get(p.id, []), outside,
                      p.start_time < t0, p.end_time > t1)
        regions.setdefault(p.region, RegionGantt(p.region)).rows.append(row)
    return Gantt(t0, t1, 100 * (now - t0) / span, [regions[k] for k in sorted(regions)],
                 window, _ticks(t0, t1), before, after)
