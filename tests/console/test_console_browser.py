"""The web console in a real headless Chromium against a real broker with real agents.

Real parts: `brokerctl serve` (SQLite), two `brokerctl agent` processes (local executor,
real trainer ranks), `brokerctl console` (uvicorn), Chromium via Playwright. The browser
signs in like a person, reads the pages, watches them change live (server-sent events,
no reload) and presses the operator's buttons; the SDK checks what the broker did.
Screenshots go to the test's tmp dir. Outcomes only, never durations.
"""

from __future__ import annotations

import http.client
import os
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from brokersdk.client import BrokerClient
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.console.browser import (
    ConsoleProcess,
    chromium,
    console_env,
    new_user,
    require_browser,
)
from tests.e2e.test_foundation import setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster, wait_until

pytestmark = pytest.mark.slow

SIZES = {"laptop": (1366, 768), "phone": (390, 844)}
WAIT_MS = 120_000  # generous: pages update within seconds, but the machine is shared


def issue_token(client: BrokerClient, user: str, role: str, team: str = "") -> str:
    """A bearer token for a new user, issued by the bootstrap operator (the tests' SDK
    identity, tests/fixtures/pki.py); the console itself never uses that operator's."""
    return client.create_token(user, team=team, role=role).secret


@dataclass
class Env:
    cluster: Cluster
    console: ConsoleProcess
    client: BrokerClient
    shots: Path
    browser: Any  # the operator's Playwright BrowserContext
    chromium: Any  # the Playwright Browser (other users get contexts of their own)
    operator_token: str = ""
    mover: Any = None  # JobHandle of the job the drain moves
    spotty: Any = None  # JobHandle of the job a spot notice moves

    def page(self) -> Any:
        page = self.browser.new_page()
        page.on("dialog", lambda d: d.accept())  # the console confirms drain/cancel
        page.set_default_navigation_timeout(WAIT_MS)  # the machine is shared
        return page

    def shot(self, page: Any, name: str) -> None:
        """Screenshots at a laptop's size and at a phone's (390x844), for people to look
        at; each size must also fit the page's width (no sideways scrolling of the page)."""
        for label, (w, h) in SIZES.items():
            page.set_viewport_size({"width": w, "height": h})
            page.wait_for_timeout(100)
            page.screenshot(path=str(self.shots / f"{name}-{label}.png"), full_page=True)
            overflow = page.evaluate("() => document.documentElement.scrollWidth")
            assert overflow <= w + 1, f"{name} at {w} px is {overflow} px wide"
        w, h = SIZES["laptop"]
        page.set_viewport_size({"width": w, "height": h})


def sign_in(env: Env, page: Any, token: str | None = None) -> None:
    """Sign in through the form (the browser profile keeps the session for later tests)."""
    page.goto(env.console.url + "/fleet")
    if not page.url.endswith("/signin"):
        return
    page.fill("#token", env.operator_token if token is None else token)
    page.click("button[type=submit]")
    page.wait_for_url("**/fleet")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    require_browser()
    root = tmp_path_factory.mktemp("console")
    cluster = Cluster(root=root)
    # The default: a "progress" event every 50 steps (the loss curve must not depend on them).
    cluster.broker_args = ["--set", "progress_event_every_steps=50",
                           "--set", "grow_back_settle_s=1", "--set", "grow_back_min_interval_s=2"]
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=2, gpus=1, price=1.0)
    cluster.start_agent("eu-west-1", nodes=2, gpus=1, price=3.0)
    # Cheapest, but spot: only jobs that ask for spot run there (the spot-notice test).
    cluster.start_agent("ap-south-1", nodes=1, gpus=1, price=0.5, capacity_type="spot")
    console = ConsoleProcess(cluster.address, root / "logs" / "console.log",
                             console_env(cluster.env()))
    client = cluster.client()
    # CB_CONSOLE_SHOTS: keep the screenshots somewhere to look at after the run.
    shots = Path(os.environ.get("CB_CONSOLE_SHOTS") or root / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    try:
        setup_team(client)
        wait_regions(cluster, client, 3)
        operator = issue_token(client, "olga", "operator")
        with chromium() as browser:
            yield Env(cluster, console, client, shots, new_user(browser), browser, operator)
    finally:
        client.close()
        console.stop()
        cluster.stop()


def test_pages_render_live_data(env: Env) -> None:
    client = env.client
    mover = client.submit(spec("mover", steps=600, every=5, sleep=0.15))
    env.mover = mover
    env.cluster.wait_progressing(mover, 6)
    assert mover.status().placement.region == "us-east-2"  # the cheaper region

    page = env.page()
    sign_in(env, page)
    # Fleet: both regions, one GPU in use in us-east-2 (the mover), marked on its node.
    region = page.locator('section.region[data-region="us-east-2"]')
    page.locator('section.region[data-region="eu-west-1"]').wait_for()
    used = region.locator(".cell.full")
    assert used.count() == 1
    node = mover.status().placement.nodes[0].node_id
    assert used.first.get_attribute("data-node") == node
    assert mover.id in (used.first.get_attribute("title") or "")
    # Live: a job submitted now fills the other node without a reload.
    marker = page.evaluate("() => { window.__same = 1; return 1 }")
    second = client.submit(spec("second", steps=600, every=5, sleep=0.15))
    page.locator('section.region[data-region="us-east-2"] .cell.full').nth(1).wait_for(
        timeout=WAIT_MS)
    assert page.evaluate("() => window.__same") == marker  # same document: pushed, not reloaded
    assert page.evaluate("() => document.body.dataset.updated")  # ... by the live stream
    env.shot(page, "fleet")

    # Cordon from the heat map: click a cell, press Cordon; the broker cordons that node.
    target = page.locator('section.region[data-region="eu-west-1"] .cell[data-node]').first
    node_id = target.get_attribute("data-node")
    target.click()
    assert page.input_value("#node-eu-west-1") == node_id
    page.locator('section.region[data-region="eu-west-1"] form.cordon').get_by_role(
        "button", name="Cordon", exact=True).click()
    page.locator(".flash", has_text=f"node {node_id} cordoned").wait_for()
    assert page.locator(f'.cell.cordoned[data-node="{node_id}"]').count() == 1
    cap = client.capacity(include_nodes=True)
    assert next(u.node for u in cap.nodes if u.node.id == node_id).cordoned
    page.fill("#node-eu-west-1", node_id)
    page.get_by_role("button", name="Uncordon").first.click()
    page.locator(".flash", has_text=f"node {node_id} uncordoned").wait_for()
    assert not next(u.node for u in client.capacity(include_nodes=True).nodes
                    if u.node.id == node_id).cordoned

    # Queue: a job only us-east-2 may run waits there, with its pending reason.
    wanted = spec("blocked", nodes=2)
    wanted.allowed_regions.append("us-east-2")
    blocked = client.submit(wanted)
    page.goto(env.console.url + "/queue")
    reason = wait_until(lambda: blocked.status().pending_reason, timeout=120,
                        what="the scheduler's pending reason")
    page.locator(f'ol.pending li[data-job="{blocked.id}"]', has_text=reason).wait_for(
        timeout=WAIT_MS)
    assert page.locator(f'section.team[data-team="ml"] ul.active li[data-job="{mover.id}"]').count()
    cells = page.locator('section.team[data-team="ml"] tr[data-accelerator="any"] td')
    assert cells.nth(1).inner_text() == "64" and int(cells.nth(2).inner_text()) >= 1  # used
    env.shot(page, "queue")

    # Training plans: a plan window per region on the Gantt.
    now = time.time()
    plan = client.create_plan(plan=cpb.TrainingPlan(
        id="tp-console", name="console plan", region="eu-west-1", instance_type="sim.gpu",
        accelerator="sim", instance_count=1, gpus_per_instance=1, start_time=now + 3600,
        end_time=now + 7200, team="ml"))
    page.goto(env.console.url + "/plans")
    far = client.create_plan(plan=cpb.TrainingPlan(
        id="tp-far", name="far plan", region="eu-west-1", instance_type="sim.gpu",
        accelerator="sim", instance_count=1, gpus_per_instance=1,
        start_time=now + 4 * 365 * 86400, end_time=now + 4 * 365 * 86400 + 86400, team="ml"))
    page.goto(env.console.url + "/plans")
    row = page.locator(f'section.gantt[data-region="eu-west-1"] .gantt-row[data-plan="{plan.id}"]')
    assert "scheduled" in row.inner_text()
    # The axis is a window around now: the plan in an hour is a real bar, the one four
    # years away is told in words, not squeezed into a sliver.
    # (the default window is the smallest that shows the next plan whole: a day here)
    assert page.locator('a[data-window="day"][aria-current]').count() == 1
    bar = row.locator(".plan-bar")
    assert bar.bounding_box()["width"] > 30  # type: ignore[index]
    far_row = page.locator(f'.gantt-row[data-plan="{far.id}"]')
    assert far_row.get_attribute("data-outside") == "after"
    assert "starts" in far_row.locator(".offwindow").inner_text()
    assert str(time.gmtime(far.start_time).tm_year) in far_row.inner_text()
    env.shot(page, "plans")
    page.goto(env.console.url + "/plans?window=all")
    assert page.locator(f'.gantt-row[data-plan="{far.id}"] .plan-bar').count() == 1

    # Jobs list: filter by team, phase and name; sort by a column.
    page.goto(env.console.url + "/jobs?team=ml&sort=gpus")
    rows = page.locator("table.jobs tbody tr[data-job]")
    assert rows.count() >= 3
    assert {rows.nth(i).get_attribute("data-team") for i in range(rows.count())} == {"ml"}
    assert rows.first.get_attribute("data-job") == blocked.id  # 2 GPUs: the most
    assert page.locator('th[aria-sort="descending"]', has_text="GPUs").count() == 1
    page.fill('form.filters input[name="q"]', "block")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**q=block**")
    assert [rows.nth(i).get_attribute("data-job") for i in range(rows.count())] == [blocked.id]
    page.goto(env.console.url + "/jobs?phase=running")
    running = page.locator("table.jobs tbody tr[data-job]")
    assert running.count() >= 1
    assert {running.nth(i).get_attribute("data-phase") for i in range(running.count())} == {
        "running"}
    page.goto(env.console.url + "/jobs")
    env.shot(page, "jobs")
    # A job still queued: no "queued -", no "loss 0.0000"; its wait so far is counted.
    page.goto(f"{env.console.url}/jobs/{blocked.id}")
    text = page.locator("main").inner_text()
    assert "queued -" not in text and "loss 0.0000" not in text and "not launched yet" in text
    env.shot(page, "job-queued")

    # Job: one attempt bar in us-east-2, checkpoint ticks, a loss curve, the log tail.
    page.goto(f"{env.console.url}/jobs/{mover.id}")
    bars = page.locator(".attempt-bar")
    assert bars.count() == 1 and bars.first.get_attribute("data-region") == "us-east-2"
    page.locator(".tick").first.wait_for(timeout=WAIT_MS)
    page.locator("svg.loss polyline").wait_for(timeout=WAIT_MS)
    page.locator("pre.log", has_text="attempt 1").wait_for(timeout=WAIT_MS)
    # The loss curve has every reported step, not only the sampled "progress" events.
    page.wait_for_function("() => +document.querySelector('svg.loss').dataset.points >= 25",
                           timeout=WAIT_MS)
    sampled = [e for e in client.events(mover.id) if e.type == "progress"]
    page.reload()
    points = int(page.locator("svg.loss").get_attribute("data-points") or 0)
    assert points >= 25 and points > 3 * len(sampled), (points, len(sampled))
    # The whole event history, not the newest 15.
    history = client.events(mover.id)
    page.reload()
    assert len(history) > 15
    assert page.locator("table.events tbody tr").count() >= len(history)
    assert page.locator("table.events tbody tr").first.get_attribute("data-type") == "submitted"
    assert not page.locator("table.events tr.ev-progress").first.is_visible()
    page.locator('label[for="show-progress"]').click()
    assert page.locator("table.events tr.ev-progress").first.is_visible()
    # The log is its tail, scrolled to its newest line; search filters its lines.
    newest = [r.line.text for r in client.logs(mover.id, tail=1) if r.WhichOneof("kind") == "line"]
    page.reload()
    assert newest and newest[-1] in page.locator("pre.log").inner_text()
    assert page.evaluate("() => { const p = document.querySelector('pre.log');"
                         " return p.scrollHeight - p.scrollTop - p.clientHeight < 30; }")
    total = page.locator("pre.log .ln").count()
    page.fill("#log-search", "attempt 1")
    page.locator("#log-matches", has_text="match").wait_for()
    assert 1 <= page.locator("pre.log .ln:not(.miss)").count() < total
    with page.expect_download() as dl:
        page.get_by_role("link", name="Download the whole log").click()
    body = Path(dl.value.path()).read_text()
    assert body.startswith("── attempt 1") and body.count("\n") >= total - 1
    page.fill("#log-search", "")
    env.shot(page, "job-before")
    second.cancel("done with it")

    # The keyboard: "/" finds a job, "g" then "m" opens the migrations page (from outside
    # a text field: "/" typed in the log's search field is just a "/").
    page.locator("h1").click()
    page.keyboard.press("/")
    assert page.evaluate("() => document.activeElement.id") == "find-job"
    page.keyboard.type(mover.id)
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/jobs/{mover.id}")
    page.locator("main").click(position={"x": 5, "y": 5})
    page.keyboard.press("g")
    page.keyboard.press("m")
    page.wait_for_url("**/migrations")


def test_operator_drain_moves_job_and_its_timeline_gains_a_bar(env: Env) -> None:
    mover = env.mover
    assert mover is not None, "runs after test_pages_render_live_data"
    wait_until(lambda: mover.status().progress.last_checkpoint_step >= 5, timeout=180,
               what=f"a durable checkpoint\n{env.cluster.logs()}")
    job_page = env.page()
    sign_in(env, job_page)
    job_page.goto(f"{env.console.url}/jobs/{mover.id}")
    assert job_page.locator(".attempt-bar").count() == 1

    fleet = env.page()
    fleet.goto(env.console.url + "/fleet")
    # The operator's forms are folded away until asked for.
    assert not fleet.locator("#reason-us-east-2").is_visible()
    fleet.locator('details.ops[data-ops="us-east-2"] summary').click()
    fleet.fill("#reason-us-east-2", "maintenance")
    fleet.get_by_role("button", name="Drain us-east-2").click()
    fleet.locator(".flash", has_text="us-east-2 draining").wait_for()
    fleet.locator('section.region[data-region="us-east-2"] .badge.warn').wait_for()

    # The job page, left open, gains the second attempt's bar live (in eu-west-1).
    job_page.locator('.attempt-bar[data-region="eu-west-1"]').wait_for(timeout=WAIT_MS)
    assert job_page.locator(".attempt-bar").count() == 2
    # ... and its move's row fills in live up to "done" (first step after the resume).
    job_page.locator("table.migrations tr.migration", has_text="region_drain").filter(
        has_text="done").wait_for(timeout=WAIT_MS)
    env.shot(job_page, "job-after-drain")
    job = mover.status()
    assert job.placement.region == "eu-west-1" and job.attempt == 2
    migs = env.client.migrations(job_id=mover.id)
    assert [m.cause for m in migs] == ["region_drain"]
    assert env.client.regions()[[r.name for r in env.client.regions()].index("us-east-2")].draining

    fleet.goto(env.console.url + "/migrations")
    assert fleet.locator(f'tr.migration[data-job="{mover.id}"]', has_text="region_drain").count()
    env.shot(fleet, "migrations")

    # Cancel from the console: the broker cancels the job.
    job_page.goto(f"{env.console.url}/jobs/{mover.id}")
    job_page.get_by_role("button", name="Cancel job").click()
    job_page.locator(".flash", has_text="cancelling").wait_for()
    done = mover.wait(timeout=120)
    assert done.phase == pb.JOB_PHASE_CANCELLED


def test_spot_notice_is_the_named_cause_of_a_move_and_the_node_shows_reclaimed(env: Env) -> None:
    client = env.client
    wanted = spec("spotty", steps=2000, every=5, sleep=0.15)
    wanted.capacity_types.extend([pb.CAPACITY_TYPE_SPOT, pb.CAPACITY_TYPE_ON_DEMAND])
    spotty = client.submit(wanted)
    env.spotty = spotty
    wait_until(lambda: spotty.status().progress.last_checkpoint_step >= 5, timeout=180,
               what=f"the spot job's first checkpoint\n{env.cluster.logs()}")
    placed = spotty.status().placement
    assert placed.region == "ap-south-1"  # the cheapest, and spot was asked for
    node = placed.nodes[0].node_id
    notices = env.cluster.root / "agents" / "ap-south-1" / "spot-notices"
    notices.mkdir(parents=True, exist_ok=True)
    (notices / node).write_text("60")
    wait_until(lambda: spotty.status().attempt >= 2 and spotty.status().placement.region
               == "eu-west-1", timeout=240, what=f"the move off spot\n{env.cluster.logs()}")

    page = env.page()
    sign_in(env, page)
    page.goto(f"{env.console.url}/jobs/{spotty.id}")
    row = page.locator("table.migrations tr.migration", has_text="spot_interruption")
    row.wait_for(timeout=WAIT_MS)
    why = row.locator(".why a")
    assert "spot interruption notice" in why.inner_text() and node in why.inner_text()
    target = why.get_attribute("href") or ""
    cause = page.locator(f"table.events tr{target}")
    assert cause.count() == 1 and "cause" in (cause.get_attribute("class") or "")
    assert "spot interruption notice" in cause.inner_text()
    env.shot(page, "job-spot-move")

    # The fleet shows the spot node as reclaimed, not merely unhealthy.
    page.goto(env.console.url + "/fleet")
    cell = page.locator(f'.cell[data-node="{node}"]')
    cell.wait_for()
    assert "reclaimed" in (cell.get_attribute("class") or "")
    assert "spot reclaimed" in page.locator('section.region[data-region="ap-south-1"] p.sum').inner_text()
    env.shot(page, "fleet-reclaimed")
    page.get_by_role("link", name="table of nodes").click()
    row = page.locator(f'table.nodes tr[data-node="{node}"]')
    row.wait_for()
    assert "reclaimed" in row.inner_text() and "0.50/GPU-h" in row.inner_text()
    assert page.locator(".cell[data-node]").count() == 0  # the table instead of the map
    env.shot(page, "fleet-table")

    # A 2-node elastic job finds room for 1 node only (eu-west-1's other node runs the
    # spot job, us-east-2 is drained, the spot node reclaimed): its page says it runs
    # below its size and why; once the spot job ends it grows back, and its history
    # shows the grow-back move (the module's broker settles 1 s, resizes at most every 2 s).
    small = spec("grower", nodes=2, steps=4000, every=5, sleep=0.15)
    small.elasticity.min_nodes, small.elasticity.max_nodes = 1, 2
    grower = client.submit(small)
    env.cluster.wait_progressing(grower, 2)
    page.goto(f"{env.console.url}/jobs/{grower.id}")
    size = page.locator("#job-size")
    size.wait_for(timeout=WAIT_MS)
    assert size.inner_text().startswith("running at 1 of 2 ranks since ")
    assert "(placement found room for 1 of 2 nodes in eu-west-1)" in size.inner_text()
    env.shot(page, "job-below-size")
    spotty.cancel()
    page.locator("table.migrations tr.migration", has_text="grow_back").filter(
        has_text="done").wait_for(timeout=WAIT_MS)
    page.reload()
    assert page.locator("#job-size").count() == 0 and page.locator(".attempt-bar").count() == 2
    assert len(grower.status().placement.nodes) == 2
    grower.cancel()
    grower.wait(timeout=120)


def _post(url: str, path: str, form: dict[str, str], cookie: str = "",
          origin: str | None = None) -> tuple[int, Any, str]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if cookie:
        headers["Cookie"] = cookie
    if origin:
        headers["Origin"] = origin
    conn.request("POST", path, body=urllib.parse.urlencode(form), headers=headers)
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, resp.headers, body


def test_session_cookie_and_csrf_guard_actions(env: Env) -> None:
    status, headers, _ = _post(env.console.url, "/signin", {"token": env.operator_token})
    assert status == 303
    cookie = headers["set-cookie"]
    attrs = {a.strip().lower() for a in cookie.split(";")}
    assert {"httponly", "samesite=strict", "secure", "path=/"} <= attrs, cookie
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    jar = cookie.split(";")[0]
    # An action without the session's CSRF token, or from another site, changes nothing.
    for form, origin in (({"region": "eu-west-1"}, None),
                         ({"region": "eu-west-1", "csrf": "forged"}, None)):
        status, _, body = _post(env.console.url, "/actions/drain", form, jar, origin)
        assert status == 403 and "CSRF" in body
    status, _, body = _post(env.console.url, "/signin", {"token": env.operator_token},
                            origin="http://evil.example")
    assert status == 403
    # No token, or a wrong one: the broker refuses, no session is made.
    for bad in ("", "cbt_nope_nope"):
        status, headers, body = _post(env.console.url, "/signin", {"token": bad})
        assert status == 401 and "Sign-in failed" in body and "set-cookie" not in headers
    assert not next(r for r in env.client.regions() if r.name == "eu-west-1").draining
    # Without a session: pages send you to sign in, live streams refuse.
    conn = http.client.HTTPConnection("127.0.0.1", env.console.port, timeout=30)
    conn.request("GET", "/queue")
    resp = conn.getresponse()
    assert resp.status == 303 and resp.headers["location"] == "/signin"
    resp.read()
    conn.request("GET", "/live/fleet")
    assert conn.getresponse().status == 401
    conn.close()


def test_member_cannot_see_another_teams_job(env: Env) -> None:
    if env.mover is None:
        env.mover = env.client.submit(spec("mover", steps=50, every=5, sleep=0.1))
    job = env.mover.status()
    issued = env.client.create_token("mia", team="vision", role="member")
    token = issued.secret
    browser = new_user(env.chromium)  # her own cookie jar
    try:
        page = browser.new_page()
        page.on("dialog", lambda d: d.accept())
        sign_in(env, page, token)
        assert "mia" in page.locator(".who").inner_text()
        assert "member" in page.locator(".who").inner_text()
        # Read-only: no operator buttons anywhere on the fleet.
        page.locator('section.region[data-region="us-east-2"]').wait_for()
        assert page.locator("form.action button").count() == 0
        # Team ml's jobs on the fleet are "another team's job", never their ids.
        theirs = env.client.submit(spec("theirs", steps=2000, every=50, sleep=0.15))
        env.cluster.wait_progressing(theirs, 2)
        running = [j.id for j in env.client.jobs(phases=["running"])]
        assert theirs.id in running
        page.reload()
        titles = " ".join(page.locator(".cell[data-node]").evaluate_all(
            "cells => cells.map(c => c.title)"))
        assert "another team's job" in titles
        assert not any(jid in titles for jid in running)
        env.shot(page, "fleet-member")
        # Team ml's job: refused by the broker, and nothing of it shown.
        resp = page.goto(f"{env.console.url}/jobs/{job.id}")
        assert resp is not None and resp.status in (403, 404)
        body = page.locator("main").inner_text()
        assert job.spec.name not in body and "Timeline" not in body
        page.screenshot(path=str(env.shots / "member-refused.png"), full_page=True)
        # Her session's own CSRF token does not make a drain allowed: the broker refuses.
        page.goto(env.console.url + "/fleet")
        csrf = page.locator('form[action="/signout"] input[name="csrf"]').get_attribute("value")
        cookie = next(c for c in browser.cookies() if c["name"] == "cb_console")
        status, _, _ = _post(env.console.url, "/actions/drain",
                             {"region": "eu-west-1", "csrf": csrf or ""},
                             f"cb_console={cookie['value']}")
        assert status == 403
        # Every call carries her token: once it is revoked, the console signs her out.
        env.client.revoke_token(issued.token.id)
        resp = page.goto(env.console.url + "/queue")
        assert resp is not None and resp.status == 401
        assert page.locator(".error", has_text="Sign-in failed").count() == 1
        page.goto(env.console.url + "/fleet")
        assert page.url.endswith("/signin")
    finally:
        browser.close()
    assert not next(r for r in env.client.regions() if r.name == "eu-west-1").draining
