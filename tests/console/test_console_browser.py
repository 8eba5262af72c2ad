"""The web console in a real headless Chromium against a real broker with real agents.

Real parts: `brokerctl serve` (SQLite), two `brokerctl agent` processes (local executor,
real trainer ranks), `brokerctl console` (uvicorn), Chromium via Playwright. The browser
signs in like a person, reads the pages, watches them change live (server-sent events,
no reload) and presses the operator's buttons; the SDK checks what the broker did.
Screenshots go to the test's tmp dir. Outcomes only, never durations.
"""

from __future__ import annotations

import http.client
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

    def page(self) -> Any:
        page = self.browser.new_page()
        page.on("dialog", lambda d: d.accept())  # the console confirms drain/cancel
        return page

    def shot(self, page: Any, name: str) -> None:
        page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)


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
    cluster.broker_args = ["--set", "progress_event_every_steps=5"]
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=2, gpus=1, price=1.0)
    cluster.start_agent("eu-west-1", nodes=2, gpus=1, price=3.0)
    console = ConsoleProcess(cluster.address, root / "logs" / "console.log",
                             console_env(cluster.env()))
    client = cluster.client()
    shots = root / "screenshots"
    shots.mkdir()
    try:
        setup_team(client)
        wait_regions(cluster, client, 2)
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
    item = page.locator(f'ol.pending li[data-job="{blocked.id}"]')
    item.wait_for(timeout=WAIT_MS)
    reason = blocked.status().pending_reason
    assert reason and reason in item.inner_text()
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
    row = page.locator(f'section.gantt[data-region="eu-west-1"] .gantt-row[data-plan="{plan.id}"]')
    assert "scheduled" in row.inner_text()
    env.shot(page, "plans")

    # Job: one attempt bar in us-east-2, checkpoint ticks, a loss curve, the log tail.
    page.goto(f"{env.console.url}/jobs/{mover.id}")
    bars = page.locator(".attempt-bar")
    assert bars.count() == 1 and bars.first.get_attribute("data-region") == "us-east-2"
    page.locator(".tick").first.wait_for(timeout=WAIT_MS)
    page.locator("svg.loss polyline").wait_for(timeout=WAIT_MS)
    page.locator("pre.log", has_text="attempt 1").wait_for(timeout=WAIT_MS)
    env.shot(page, "job-before")
    second.cancel("done with it")

    # The keyboard: "/" finds a job, "g" then "m" opens the migrations page.
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
