"""The console as a member would attack it: sign in again and again to push the
operator's session out, and read other teams' job ids off the fleet page. A real
broker (TLS, tokens), a real fake agent stream and `brokerctl console` as a process;
plain HTTP requests (no browser needed for either)."""

from __future__ import annotations

import http.client
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.auth.identity import Role
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec
from tests.console.browser import ConsoleProcess, console_env

SIGN_INS = 300  # more than the old shared table's 256 sessions


def request(url: str, method: str, path: str, form: dict[str, str] | None = None,
            cookie: str = "") -> tuple[int, Any, str]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if form is not None else {}
    if cookie:
        headers["Cookie"] = cookie
    conn.request(method, path, body=urllib.parse.urlencode(form) if form is not None else None,
                 headers=headers)
    resp = conn.getresponse()
    body = resp.read().decode(errors="replace")
    conn.close()
    return resp.status, resp.headers, body


def sign_in(url: str, token: str) -> str:
    status, headers, body = request(url, "POST", "/signin", {"token": token})
    assert status == 303, (status, body[-500:])
    return headers["set-cookie"].split(";")[0]


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[Broker, ConsoleProcess]]:
    b = Broker(fast_config(tmp_path))
    env = console_env({**os.environ, "CB_CA": b.pki.ca_file})
    env.pop("CB_TOKEN", None)
    c = ConsoleProcess(b.address, tmp_path / "console.log", env)
    try:
        yield b, c
    finally:
        c.stop()
        b.stop()


def test_a_member_cannot_push_the_operators_session_out(
        console: tuple[Broker, ConsoleProcess]) -> None:
    b, c = console
    operator = sign_in(c.url, b.token_for("olga", Role.OPERATOR, ""))
    member_token = b.token_for("mallory", Role.MEMBER, "ml")
    for _ in range(SIGN_INS):
        sign_in(c.url, member_token)
    status, _, body = request(c.url, "GET", "/fleet", cookie=operator)
    assert status == 200 and "olga" in body, (status, body[-300:])


def test_the_fleet_page_shows_a_member_only_their_teams_job_ids(
        console: tuple[Broker, ConsoleProcess]) -> None:
    b, c = console
    b.team("ml")
    b.team("other")
    agent = FakeAgent(b.address, "fleet-agent", "us-east-2", nodes_for("us-east-2", "fleet", 2, 8))
    agent.connect()
    try:
        mine = b.submit(spec("ml-job", gpus=8))
        theirs = b.submit(spec("other-job", team="other", gpus=8))
        for j in (mine, theirs):
            b.wait_phase(j.id, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
        member = sign_in(c.url, b.token_for("ann", Role.MEMBER, "ml"))
        status, _, page = request(c.url, "GET", "/fleet", cookie=member)
        assert status == 200
        assert mine.id in page and theirs.id not in page
        operator = sign_in(c.url, b.token_for("olga", Role.OPERATOR, ""))
        status, _, page = request(c.url, "GET", "/fleet", cookie=operator)
        assert status == 200 and mine.id in page and theirs.id in page
    finally:
        agent.close()
