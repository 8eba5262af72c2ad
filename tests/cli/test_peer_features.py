"""What peers have that brokerctl now has too: jobs by id prefix or name, `jobs --mine`
and `-w`, `status`, `wait-ready`. Against a real TLS broker on loopback (no agents: jobs
stay pending, which is what these views need)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from brokersdk.client import BrokerClient
from tests.cli.conftest import TEAM, run_cli
from tests.fixtures.pki import session_pki


@pytest.fixture(autouse=True)
def _width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")


def submit(capsys, address: str, name: str, *extra: str) -> str:
    rc, out, err = run_cli(capsys, "--broker", address, "submit", "--name", name, "--team", TEAM,
                           "--steps", "5", "-o", "json", *extra)
    assert rc == 0, err
    return json.loads(out)["id"]


def test_a_job_by_unique_prefix_or_name(capsys, broker_address: str) -> None:
    jid = submit(capsys, broker_address, "ref-by-name-1")
    rc, out, err = run_cli(capsys, "--broker", broker_address, "job", jid[:12], "-o", "json")
    assert rc == 0 and json.loads(out)["job"]["id"] == jid, err
    rc, out, err = run_cli(capsys, "--broker", broker_address, "job", "ref-by-name-1", "-o", "json")
    assert rc == 0 and json.loads(out)["job"]["id"] == jid, err
    rc, out, err = run_cli(capsys, "--broker", broker_address, "cancel", "ref-by-name-1")
    assert rc == 0 and jid in out, err


def test_ambiguous_and_unknown_refs_say_so(capsys, broker_address: str) -> None:
    a = submit(capsys, broker_address, "twin")
    b = submit(capsys, broker_address, "twin")
    rc, _, err = run_cli(capsys, "--broker", broker_address, "job", "twin")
    assert rc == 2 and "2 live jobs are named 'twin'" in err and a in err and b in err, err
    common = next(i for i in range(len(a)) if a[i] != b[i])  # ids share a time-based head
    rc, _, err = run_cli(capsys, "--broker", broker_address, "job", a[:max(3, common)])
    assert rc == 2 and "matches" in err and "give more of the id" in err, err
    rc, _, err = run_cli(capsys, "--broker", broker_address, "logs", "no-such-job-anywhere")
    assert rc == 2 and "no job with id, id prefix or name 'no-such-job-anywhere'" in err, err


def test_jobs_mine_shows_only_what_i_submitted(capsys, broker_address: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    mine = submit(capsys, broker_address, "mine-op")
    with BrokerClient(broker_address, credentials=session_pki().operator()) as op:
        alice = op.create_token("alice-mine", team=TEAM, role="member").secret
    monkeypatch.setenv("CB_TOKEN", alice)
    hers = submit(capsys, broker_address, "mine-alice")
    rc, out, err = run_cli(capsys, "--broker", broker_address, "jobs", "--mine", "-o", "json")
    assert rc == 0, err
    ids = {j["id"] for j in json.loads(out)}
    assert hers in ids and mine not in ids, ids
    assert all(j["owner"] == "user:alice-mine" for j in json.loads(out))


def test_jobs_watch_refreshes(capsys, broker_address: str) -> None:
    submit(capsys, broker_address, "watched")
    rc, out, err = run_cli(capsys, "--broker", broker_address, "jobs", "-w", "--interval", "0.1",
                           "--watch-count", "2")
    assert rc == 0, err
    assert out.count("Ctrl-C to stop") == 2 and out.count("watched") >= 2, out


def test_status_overview(capsys, broker_address: str) -> None:
    jid = submit(capsys, broker_address, "status-pending")
    rc, out, err = run_cli(capsys, "--broker", broker_address, "status")
    assert rc == 0, err
    assert "fleet 0/0 region(s) connected" in out, out
    assert "spend $0.00/h now" in out and "running (0)" in out, out
    pending = next(line for line in out.splitlines() if line.startswith(jid))
    assert "status-pending" in pending and "waiting" in pending, out
    assert all(len(line) <= 100 for line in out.splitlines()), out


def test_wait_ready_waits_for_a_broker_that_starts_later(capsys, tmp_path: Path,
                                                         dead_address: str) -> None:
    from broker.config import BrokerConfig
    from broker.server import BrokerServer

    rc, out, _ = run_cli(capsys, "--broker", dead_address, "--timeout", "1", "wait-ready",
                         "--wait-timeout", "1")
    assert rc == 1 and "not ready after 1s" in out, out
    port = int(dead_address.rpartition(":")[2])
    server = BrokerServer(BrokerConfig(
        listen=f"127.0.0.1:{port}", store=f"sqlite:///{tmp_path / 'b.sqlite'}",
        checkpoint_root=str(tmp_path / "ck"), agent_listen="127.0.0.1:0",
        **session_pki().broker_settings()))
    starter = threading.Timer(1.5, server.start)
    starter.start()
    try:
        t0 = time.monotonic()
        rc, out, err = run_cli(capsys, "--broker", dead_address, "--timeout", "1", "wait-ready",
                               "--wait-timeout", "60")
        assert rc == 0 and f"broker ready at {dead_address}" in out, err
        assert time.monotonic() - t0 < 60
    finally:
        starter.join()
        server.stop(0.5)


def test_did_you_mean_for_commands_flags_and_spec_keys(capsys, tmp_path: Path,
                                                       dead_address: str) -> None:
    rc, _, err = run_cli(capsys, "sumbit")
    assert rc == 2 and "did you mean 'submit'?" in err, err
    rc, _, err = run_cli(capsys, "submit", "--stpes", "5", "--nmae", "x")
    assert rc == 2 and "--stpes -> --steps" in err and "--nmae -> --name" in err, err
    rc, _, err = run_cli(capsys, "jobs", "--mnie")
    assert rc == 2 and "--mnie -> --mine" in err, err
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: a\nnodse: 2\ntrainer:\n  total_stesp: 4\n")
    # Checked before anything is sent: the broker address is dead and never asked.
    rc, _, err = run_cli(capsys, "--broker", dead_address, "submit", "-f", str(spec))
    assert rc == 2, err
    assert "nodse: unknown field (did you mean 'nodes'?)" in err, err
    assert "trainer.total_stesp: unknown field (did you mean 'total_steps'?)" in err, err


def test_resubmit_clones_a_job_under_a_new_id(capsys, broker_address: str) -> None:
    old = submit(capsys, broker_address, "to-clone", "--nodes", "2", "--label", "exp=7")
    rc, out, err = run_cli(capsys, "--broker", broker_address, "resubmit", "to-clone",
                           "--name", "cloned", "-o", "json")
    assert rc == 0, err
    new = json.loads(out)
    assert new["id"] != old and new["spec"]["name"] == "cloned"
    assert new["spec"]["resources"]["nodes"] == 2 and new["spec"]["labels"] == {"exp": "7"}
    rc, out, err = run_cli(capsys, "--broker", broker_address, "resubmit", old)
    assert rc == 0 and f"from {old}" in out and "to-clone" in out, err


def test_cost_command_against_the_broker(capsys, broker_address: str) -> None:
    submit(capsys, broker_address, "cost-pending")
    for by in ("team", "user", "region", "capacity"):
        rc, out, err = run_cli(capsys, "--broker", broker_address, "cost", "--since", "7d",
                               "--by", by)
        assert rc == 0, err
        assert f"by {by}" in out or "no jobs" in out, out
    rc, out, err = run_cli(capsys, "--broker", broker_address, "cost", "--by", "team")
    assert rc == 0 and TEAM in out and "total" in out, out
    rc, _, err = run_cli(capsys, "--broker", broker_address, "cost", "--since", "soon")
    assert rc == 2 and "bad duration" in err, err


def test_serve_suggests_a_mistyped_setting(capsys) -> None:
    rc, _, err = run_cli(capsys, "serve", "--insecure-dev", "--set", "schedular_interval_s=1")
    assert rc == 2 and "schedular_interval_s (did you mean 'scheduler_interval_s'?)" in err, err


def test_serve_frontend_refuses_a_store_other_hosts_cannot_share(capsys, tmp_path) -> None:
    rc, _, err = run_cli(capsys, "serve", "--insecure-dev", "--frontend", "--frontend-id", "2",
                         "--store", f"sqlite:///{tmp_path / 'b.sqlite'}")
    assert rc == 2 and "API front-end needs the leader's shared Redis store" in err, err
