"""The charts page's model: the broker's usage series as four small line charts (queue
depth, admissions, GPUs in use, spend rate), one line per team, over a chosen window.

Why server-drawn SVG and no chart library: the console ships plain JavaScript with no
framework and a CSP without inline script; an SVG polyline computed here is a few
hundred bytes, refreshes through the page's live stream like every other page, works
without JavaScript, and is tested as data (tests/console/test_charts_model.py). The
axis labels are HTML around the SVG, not SVG text, so they keep their size when the
chart is squeezed to a phone's width (the SVG stretches; its strokes do not scale).
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field

from brokersdk.usage import TeamTotals, totals
from computebroker.v1 import capacity_pb2

VIEW_W, VIEW_H = 600.0, 100.0  # the SVG's viewBox (stretched to the box's size)
# Team colours, in order of the sorted team names (distinct, readable on white).
PALETTE = ("#2f81f7", "#d29922", "#1a7f37", "#8250df", "#cf222e", "#0f7b8a", "#bf3989",
           "#6e7781")


class Window(enum.Enum):
    """The windows offered (a link each); the broker serves any up to 24 h."""

    HOUR = ("1h", 3600.0)
    SIX_HOURS = ("6h", 6 * 3600.0)
    DAY = ("24h", 24 * 3600.0)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def seconds(self) -> float:
        return self.value[1]

    @classmethod
    def parse(cls, text: str) -> Window:
        """A window's label; anything else is the hour (a bad link still shows a page)."""
        return next((w for w in cls if w.label == text.strip().lower()), cls.HOUR)


class Metric(enum.Enum):
    """The charts, in page order: (field of TeamUsageSeries, title, unit, decimals)."""

    QUEUE = ("pending_jobs", "Queue depth", "jobs waiting", 1)
    ADMISSIONS = ("admissions", "Admissions", "jobs per bucket", 0)
    GPUS = ("gpus_used", "GPUs in use", "GPUs", 1)
    SPEND = ("spend_usd_per_hour", "Spend rate", "$ per hour", 2)

    @property
    def field(self) -> str:
        return self.value[0]

    @property
    def title(self) -> str:
        return self.value[1]

    @property
    def unit(self) -> str:
        return self.value[2]

    @property
    def decimals(self) -> int:
        return self.value[3]


@dataclass
class Line:
    team: str
    color: str
    segments: list[str]  # SVG polyline points, one per run of buckets without a gap
    points: int
    last: float  # the newest bucket's value

    @property
    def dots(self) -> list[tuple[str, str]]:
        """Lone points (a segment of one bucket) are drawn as dots: a polyline of one
        point is invisible."""
        return [tuple(s.split(",", 1)) for s in self.segments if " " not in s]  # type: ignore[misc]


@dataclass
class Chart:
    metric: Metric
    unit: str
    y_labels: list[str]  # top, middle, bottom
    lines: list[Line] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(line.points for line in self.lines)

    @property
    def summary(self) -> str:
        """What a screen reader hears (and a tooltip shows): each team's newest value."""
        news = ", ".join(f"{line.team} {line.last:.{self.metric.decimals}f}" for line in self.lines)
        return f"{self.metric.title} ({self.unit}), newest bucket: {news or 'no data'}"


@dataclass
class ChartsView:
    window: Window
    step_s: float
    charts: list[Chart]
    x_labels: list[str]
    teams: list[tuple[str, str]]  # (team, colour)
    totals: list[TeamTotals]
    buckets: int
    sample_s: float

    @property
    def step(self) -> str:
        return f"{self.step_s / 60:g} min" if self.step_s >= 60 else f"{self.step_s:g} s"


def nice_ceiling(v: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= ``v`` (1 for nothing): round axis tops."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    base = 10 ** math.floor(math.log10(v))
    return next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= v * (1 - 1e-9))


def _fmt(v: float, decimals: int) -> str:
    text = f"{v:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _segments(xs: list[float], ys: list[float], times: list[float], step: float,
              top: float) -> list[str]:
    """Polyline point lists, split where buckets are missing (the broker was down)."""
    out: list[list[str]] = []
    prev = None
    for x, y, t in zip(xs, ys, times, strict=True):
        if prev is None or t - prev > step * 1.5:
            out.append([])
        out[-1].append(f"{x:.1f},{VIEW_H - VIEW_H * y / top:.1f}")
        prev = t
    return [" ".join(seg) for seg in out]


def build_charts(series: capacity_pb2.UsageSeries, window: Window) -> ChartsView:
    """The page's charts from GetUsageSeries (the teams are those the broker returned:
    the caller's own for a member, every team's for an operator)."""
    start, end = series.start_time, series.end_time
    span = max(end - start, 1e-9)
    times = list(series.times)
    # A bucket is drawn at its middle, kept inside the window.
    xs = [VIEW_W * (min(max(t + series.step_s / 2, start), end) - start) / span for t in times]
    colors = {line.team: PALETTE[i % len(PALETTE)] for i, line in enumerate(series.teams)}
    charts = []
    for m in Metric:
        top = nice_ceiling(max((max(getattr(line, m.field), default=0.0)
                                for line in series.teams), default=0.0))
        unit = f"jobs per {_step_text(series.step_s)}" if m is Metric.ADMISSIONS else m.unit
        chart = Chart(m, unit, [_fmt(top, m.decimals), _fmt(top / 2, m.decimals + 1), "0"])
        for line in series.teams:
            ys = list(getattr(line, m.field))
            chart.lines.append(Line(line.team, colors[line.team],
                                    _segments(xs, ys, times, series.step_s, top), len(ys),
                                    ys[-1] if ys else 0.0))
        charts.append(chart)
    fmt = "%H:%M" if span <= 24 * 3600 else "%m-%d %H:%M"
    x_labels = [time.strftime(fmt, time.localtime(start + span * k / 4)) for k in range(5)]
    return ChartsView(window, series.step_s, charts, x_labels, list(colors.items()),
                      totals(series), len(times), series.sample_interval_s)


def _step_text(step_s: float) -> str:
    return f"{step_s / 60:g} min" if step_s >= 60 else f"{step_s:g} s"
