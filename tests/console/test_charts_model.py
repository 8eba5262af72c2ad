"""The charts page's model as data (console/charts.py): round axis tops, one line per
team with its own colour, gaps where the broker was down, lone buckets as dots, and
the window's totals next to them."""

from __future__ import annotations

import pytest

from computebroker.v1 import capacity_pb2 as cpb
from console.charts import PALETTE, VIEW_H, VIEW_W, Metric, Window, build_charts, nice_ceiling

T0 = 1_800_000_000.0


def _series() -> cpb.UsageSeries:
    s = cpb.UsageSeries(step_s=10, start_time=T0, end_time=T0 + 60, sample_interval_s=5,
                        times=[T0, T0 + 10, T0 + 40], latest_time=T0 + 45)
    s.teams.add(team="cv", pending_jobs=[0, 1, 3], admissions=[0, 2, 1], gpus_used=[4, 4, 8],
                spend_usd_per_hour=[8, 8, 16], now_gpus_used=8, now_spend_usd_per_hour=16)
    s.teams.add(team="ml", pending_jobs=[2, 0, 0], admissions=[1, 0, 0], gpus_used=[0, 8, 8],
                spend_usd_per_hour=[0, 3.5, 3.5], now_gpus_used=8)
    return s


@pytest.mark.parametrize(("v", "top"), [(0, 1), (0.3, 0.5), (1, 1), (3, 5), (8, 10), (16, 20),
                                        (24, 25), (120, 200), (float("nan"), 1)])
def test_axis_tops_are_round(v: float, top: float) -> None:
    assert nice_ceiling(v) == pytest.approx(top)


def test_four_charts_each_with_a_line_per_team_and_units() -> None:
    view = build_charts(_series(), Window.HOUR)
    assert [c.metric for c in view.charts] == list(Metric)
    assert view.teams == [("cv", PALETTE[0]), ("ml", PALETTE[1])]
    gpus = view.charts[2]
    assert gpus.unit == "GPUs" and gpus.y_labels == ["10", "5", "0"]
    assert view.charts[1].unit == "jobs per 10 s" and view.charts[3].unit == "$ per hour"
    assert [line.points for line in gpus.lines] == [3, 3] and gpus.points == 6
    assert "cv 8.0" in gpus.summary and "ml 8.0" in gpus.summary


def test_a_gap_splits_the_line_and_a_lone_bucket_is_a_dot() -> None:
    view = build_charts(_series(), Window.HOUR)
    cv = view.charts[2].lines[0]
    # Buckets at 0 and 10 s join; the one at 40 s stands alone (nothing at 20 and 30 s).
    assert len(cv.segments) == 2 and " " in cv.segments[0] and " " not in cv.segments[1]
    (x, y), = cv.dots
    assert float(x) == pytest.approx(VIEW_W * 45 / 60) and float(y) == pytest.approx(VIEW_H * 0.2)
    first = [tuple(map(float, p.split(","))) for p in cv.segments[0].split()]
    assert first == [(pytest.approx(50.0), pytest.approx(60.0)),
                     (pytest.approx(150.0), pytest.approx(60.0))]


def test_totals_and_labels_of_the_window() -> None:
    view = build_charts(_series(), Window.parse("6H"))
    assert view.window is Window.SIX_HOURS and Window.parse("bogus") is Window.HOUR
    assert len(view.x_labels) == 5 and view.buckets == 3 and view.step == "10 s"
    cv = next(t for t in view.totals if t.team == "cv")
    assert cv.admissions == 3 and cv.gpus_now == 8 and cv.spend_now == 16


def test_no_data_is_an_empty_page_not_an_error() -> None:
    view = build_charts(cpb.UsageSeries(step_s=10, start_time=T0, end_time=T0 + 3600), Window.HOUR)
    assert view.buckets == 0 and view.teams == [] and all(not c.lines for c in view.charts)
    assert view.charts[0].y_labels == ["1", "0.5", "0"]
