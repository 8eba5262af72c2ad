"""A job that only a reserved spare could hold says so wherever pending reasons show.

A real TLS broker with a scripted agent (tests/broker/harness.py): 4 one-GPU nodes in
pool ``p``, one of them reserved as a spare (``Register.pool_spares``). A 4-node job
waits; its pending reason names the spares, and ``brokerctl job`` / ``brokerctl jobs``
(at 80 and 100 columns, and in a pipe) and the console's job and queue pages show it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.auth.identity import Role
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until
from tests.cli.conftest import run_cli
from tests.console.browser import ConsoleProcess, console_env
from tests.console.test_console_tenancy import request, sign_in

NOTE = "only reserved spares are free in pool p of r1/a1"


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, str, Path]]:
    tmp = tmp_path_factory.mktemp("spare-reason")
    b = Broker(fast_config(tmp))
    a = FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 4, 1, pool="p"), spares={"p": 1})
    try:
        b.team("ml")
        a.connect()
        job = b.submit(spec("needs-four", nodes=4, gpus=1))
        wait_until(lambda: b.get(job.id).pending_reason, 20, "a pending reason")
        yield b, job.id, tmp
    finally:
        a.close()
        b.stop()


def test_the_broker_gives_the_spare_reason(waiting: tuple[Broker, str, Path]) -> None:
    b, job_id, _ = waiting
    reason = b.get(job_id).pending_reason
    assert reason.startswith(NOTE + ": 1 of the 4 node(s) it needs would be spares"), reason
    assert "replacing lost nodes in place" in reason


@pytest.mark.parametrize("columns", ["80", "100"])
def test_brokerctl_job_and_jobs_show_it(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                        waiting: tuple[Broker, str, Path], columns: str) -> None:
    b, job_id, _ = waiting
    monkeypatch.setenv("COLUMNS", columns)
    rc, out, err = run_cli(capsys, "--broker", b.address, "job", job_id)
    assert rc == 0, err
    flat = " ".join(out.split())
    assert NOTE in flat and "replacing lost nodes in place" in flat, out
    rc, out, err = run_cli(capsys, "--broker", b.address, "jobs")
    assert rc == 0, err
    assert NOTE in " ".join(out.split()), out
    assert all(len(line) <= int(columns) for line in out.splitlines()), out


def test_the_console_job_and_queue_pages_show_it(waiting: tuple[Broker, str, Path]) -> None:
    b, job_id, tmp = waiting
    env = console_env({**os.environ, "CB_CA": b.pki.ca_file})
    env.pop("CB_TOKEN", None)
    c = ConsoleProcess(b.address, tmp / "console.log", env)
    try:
        cookie = sign_in(c.url, b.token_for("ann", Role.MEMBER, "ml"))
        status, _, page = request(c.url, "GET", f"/jobs/{job_id}", cookie=cookie)
        assert status == 200 and NOTE in page, page[-500:]
        status, _, page = request(c.url, "GET", "/queue", cookie=cookie)
        assert status == 200 and NOTE in page, page[-500:]
    finally:
        c.stop()
