"""The charts page in a real headless Chromium: a real TLS broker whose scheduler admits
jobs of two teams onto a scripted agent's priced nodes (one job stays queued), its
usage series served through GetUsageSeries to `brokerctl console` (a process), read by
an operator and by a member. The charts carry the run's data points, keep growing
live, fit a phone's width with readable axes, and a member sees their team's lines
only. Screenshots go to the test's tmp dir (or CB_CONSOLE_SHOTS)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.auth.identity import Role
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until
from tests.console.browser import ConsoleProcess, chromium, console_env, require_browser

SIZES = {"laptop": (1366, 768), "phone": (390, 844)}
WAIT_MS = 120_000  # the machine is shared: pages update within seconds, waits are generous
PRICE = 2.5


def _series(b: Broker) -> cpb.UsageSeries:
    return b.capacity.GetUsageSeries(cpb.GetUsageSeriesRequest(window_s=3600))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, ConsoleProcess, Path]]:
    require_browser()
    root = tmp_path_factory.mktemp("charts")
    b = Broker(fast_config(root, usage_sample_s=0.2))
    nodes = nodes_for("us-east-2", "c", 2, 8)
    for n in nodes:
        n.price_per_gpu_hour = PRICE
    agent = FakeAgent(b.address, "charts-agent", "us-east-2", nodes).connect()
    env = console_env({**os.environ, "CB_CA": b.pki.ca_file})
    env.pop("CB_TOKEN", None)
    console = ConsoleProcess(b.address, root / "console.log", env)
    shots = Path(os.environ.get("CB_CONSOLE_SHOTS") or root / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    try:
        b.team("ml")
        b.team("vision")
        running = [b.submit(spec("ml-a", gpus=8)), b.submit(spec("vision-a", team="vision", gpus=4))]
        for j in running:
            b.wait_phase(j.id, pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
        b.submit(spec("ml-b", gpus=8))  # no room left: it queues (the queue-depth line)
        # Two buckets at least, so each team's line is a line and not a dot.
        wait_until(lambda: len(_series(b).times) >= 2 and all(
            t.now_gpus_used for t in _series(b).teams), 40, "two buckets of the run")
        yield b, console, shots
    finally:
        console.stop()
        agent.close()
        b.stop()


def _sign_in(browser: Any, console: ConsoleProcess, token: str) -> Any:
    ctx = browser.new_context(viewport={"width": SIZES["laptop"][0], "height": SIZES["laptop"][1]})
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(console.url + "/signin")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url("**/fleet")
    return page


def _points(page: Any, metric: str, team: str) -> int:
    return int(page.locator(f'figure.chart[data-metric="{metric}"] g.series[data-team="{team}"]')
               .get_attribute("data-points"))


def _drawn_points(page: Any, metric: str, team: str) -> int:
    """Vertices the browser actually holds for the team's line (polylines and dots)."""
    return page.evaluate(
        """([m, t]) => { const g = document.querySelector(
             `figure.chart[data-metric="${m}"] g.series[data-team="${t}"]`);
           let n = 0; for (const p of g.querySelectorAll('polyline')) n += p.points.numberOfItems;
           return n + g.querySelectorAll('line').length; }""", [metric, team])


def test_the_operator_sees_every_teams_lines_with_the_runs_points(run) -> None:  # noqa: ANN001
    b, console, shots = run
    with chromium() as browser:
        page = _sign_in(browser, console, b.token_for("olga", Role.OPERATOR, ""))
        page.click("nav >> text=Charts")
        page.wait_for_url("**/charts")
        assert page.locator("figure.chart").count() == 4
        assert [x.get_attribute("data-team") for x in page.locator("ul.legend.teams li").all()] \
            == ["ml", "vision"]
        for metric in ("queue", "admissions", "gpus", "spend"):
            for team in ("ml", "vision"):
                n = _points(page, metric, team)
                assert n >= 2 and _drawn_points(page, metric, team) == n, (metric, team, n)
        captions = page.locator("figure.chart figcaption").all_inner_texts()
        assert captions == ["Queue depth (jobs waiting)", "Admissions (jobs per 10 s)",
                            "GPUs in use (GPUs)", "Spend rate ($ per hour)"]
        # The numbers of the run: ml holds 8 GPUs at $2.50 with one job queued.
        ml = page.locator('table.usage tr[data-team="ml"] td').all_inner_texts()
        assert ml[1] == "1" and ml[3] == "1" and ml[4] == "8" and ml[6] == "$20.00/h", ml
        vision = page.locator('table.usage tr[data-team="vision"] td').all_inner_texts()
        assert vision[4] == "4" and vision[6] == "$10.00/h", vision
        top = page.locator('figure.chart[data-metric="gpus"] .yaxis span').first.inner_text()
        assert top == "10", top  # 8 GPUs at most: the axis tops at 10
        # Live: new buckets arrive over the page's event stream, no reload.
        before = _points(page, "gpus", "ml")
        page.evaluate("() => { window.__same = true; }")
        page.wait_for_function(
            """n => Number(document.querySelector('figure.chart[data-metric="gpus"]'
                 + ' g.series[data-team="ml"]').getAttribute('data-points')) > n""",
            arg=before, timeout=WAIT_MS)
        assert page.evaluate("() => window.__same === true"), "the page was reloaded"
        # Readable at a phone's width: no sideways scroll, axes' text keeps its size.
        for label, (w, h) in SIZES.items():
            page.set_viewport_size({"width": w, "height": h})
            page.wait_for_timeout(150)
            page.screenshot(path=str(shots / f"charts-{label}.png"), full_page=True)
            assert page.evaluate("() => document.documentElement.scrollWidth") <= w + 1, label
            font = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector("
                                 "'figure.chart .yaxis span')).fontSize)")
            svg_w = page.locator('figure.chart[data-metric="spend"] svg').bounding_box()["width"]
            assert font >= 11 and svg_w >= 250, (label, font, svg_w)
        page.set_viewport_size({"width": SIZES["laptop"][0], "height": SIZES["laptop"][1]})
        # A longer window: coarser buckets, the same teams.
        page.click("p.filters >> text=6h")
        page.wait_for_url("**/charts?window=6h")
        assert "buckets of 1 min" in page.locator("h1").inner_text()
        assert _points(page, "admissions", "ml") >= 1


def test_a_member_sees_only_their_teams_lines(run) -> None:  # noqa: ANN001
    b, console, shots = run
    with chromium() as browser:
        page = _sign_in(browser, console, b.token_for("mia", Role.MEMBER, "vision"))
        page.goto(console.url + "/charts")
        assert [x.get_attribute("data-team") for x in page.locator("ul.legend.teams li").all()] \
            == ["vision"]
        assert page.locator('g.series[data-team="ml"]').count() == 0
        assert page.locator('table.usage tr[data-team="ml"]').count() == 0
        assert _points(page, "gpus", "vision") >= 2
        assert "Only your team's lines are shown" in page.content()
        page.screenshot(path=str(shots / "charts-member.png"), full_page=True)
        # Asking for another team's lines is refused by the broker, and said so.
        resp = page.goto(console.url + "/charts?team=ml")
        assert resp is not None and resp.status == 403
        assert "only for its own team" in page.content()
