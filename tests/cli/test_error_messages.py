"""Each way a new user misconfigures the client gets one message that names what to change.

Against real brokers on loopback: a TLS broker with its mutual-TLS agent port (the
dev CA of tests/fixtures/pki.py), an ``--insecure-dev`` plaintext broker, and a broker
on a real redis-server that is then stopped. ``brokerctl`` runs in-process (run_cli)
with the environment a user's shell would have; one test runs it as a subprocess to
see what really reaches the terminal (no raw gRPC log lines).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.auth.identity import Role
from brokersdk.client import BrokerClient
from tests.cli.conftest import run_cli
from tests.fixtures.pki import session_pki
from tests.fixtures.redis_server import start_redis, stop_redis

CLEAN_ENV = ("CB_CA", "CB_TOKEN", "CB_SERVER", "CB_CONTEXT", "CB_INSECURE", "CB_CLIENT_CERT",
             "CB_CLIENT_KEY", "BROKER_ADDRESS")


class Brokers:
    """A TLS broker (``tls``, ``mtls`` = its agent port) and a plaintext dev broker."""

    def __init__(self, root: Path) -> None:
        from broker.config import BrokerConfig
        from broker.server import BrokerServer

        pki = session_pki()
        self.secure = BrokerServer(BrokerConfig(
            listen="127.0.0.1:0", store=f"sqlite:///{root / 'tls.sqlite'}",
            checkpoint_root=str(root / "ck"), agent_listen="127.0.0.1:0", **pki.broker_settings()))
        self.tls = f"127.0.0.1:{self.secure.start()}"
        self.mtls = f"127.0.0.1:{self.secure.agent_port}"
        self.dev = BrokerServer(BrokerConfig(
            listen="127.0.0.1:0", store=f"sqlite:///{root / 'dev.sqlite'}",
            checkpoint_root=str(root / "ck2"), insecure_dev=True))
        self.plain = f"127.0.0.1:{self.dev.start()}"
        with BrokerClient(self.tls, timeout=15) as c:
            c.set_team_quota("ml", cohort="c", guaranteed=16)

    def stop(self) -> None:
        self.secure.stop(0.5)
        self.dev.stop(0.5)


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    b = Brokers(tmp_path_factory.mktemp("errors"))
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A new shell: no CB_* variables, no config file (HOME is empty)."""
    for var in CLEAN_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("CB_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    return monkeypatch


def one_error(err: str) -> tuple[str, str]:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: "), err
    assert len(lines) <= 2 and all("Traceback" not in ln for ln in lines), err
    hint = lines[1] if len(lines) == 2 else ""
    assert not hint or hint.startswith("hint: "), err
    return lines[0], hint


def test_no_config_at_all_says_so(capsys, brokers: Brokers, shell) -> None:
    shell.setenv("CB_SERVER", brokers.tls)
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, hint = one_error(err)
    assert rc == 1
    assert "no client config" in msg and "CB_CONFIG is unset" in msg and "no CA is set" in msg, msg
    assert "CB_CONFIG" in hint and "dev-ca" in hint, hint


def test_a_missing_cb_config_file_is_named(capsys, brokers: Brokers, shell, tmp_path: Path) -> None:
    missing = tmp_path / "forgot" / "config.yaml"
    shell.setenv("CB_CONFIG", str(missing))
    shell.setenv("CB_SERVER", brokers.tls)
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, _ = one_error(err)
    assert f"CB_CONFIG={missing} does not exist" in msg, msg
    # With a CA but no token: the broker answers, and the message still names the file.
    shell.setenv("CB_CA", session_pki().ca_file)
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, hint = one_error(err)
    assert rc == 2 and "not logged in" in msg and f"CB_CONFIG={missing} does not exist" in msg, msg


def test_a_context_from_a_missing_config_is_refused_before_connecting(capsys, shell,
                                                                      tmp_path: Path) -> None:
    shell.setenv("CB_CONFIG", str(tmp_path / "nope.yaml"))
    rc, _, err = run_cli(capsys, "--context", "alice", "jobs")
    msg, _ = one_error(err)
    assert rc == 2 and "nope.yaml does not exist" in msg, msg


def test_plaintext_client_to_a_tls_broker(capsys, brokers: Brokers, shell) -> None:
    shell.setenv("CB_SERVER", brokers.tls)
    shell.setenv("CB_INSECURE", "1")
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, hint = one_error(err)
    assert rc == 1 and "is up and speaks TLS" in msg and "plaintext" in msg, msg
    assert "cannot reach" not in msg and "unset CB_INSECURE" in hint, hint


def test_token_user_on_the_agents_mutual_tls_port(capsys, brokers: Brokers, shell) -> None:
    pki = session_pki()
    shell.setenv("CB_SERVER", brokers.mtls)
    shell.setenv("CB_CA", pki.ca_file)
    shell.setenv("CB_TOKEN", pki.operator_token)
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, hint = one_error(err)
    assert rc == 1 and "mutual-TLS port" in msg and "cannot reach" not in msg, msg
    assert "CB_SERVER" in hint and "BROKER_ADDRESS" not in hint, hint


def test_plaintext_client_on_the_mutual_tls_port(capsys, brokers: Brokers, shell) -> None:
    shell.setenv("CB_SERVER", brokers.mtls)
    shell.setenv("CB_INSECURE", "1")
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, _ = one_error(err)
    assert rc == 1 and "mutual-TLS port" in msg and "plaintext" in msg, msg
    assert "cannot reach" not in msg, msg


def test_tls_client_to_a_plaintext_dev_broker(capsys, brokers: Brokers, shell) -> None:
    pki = session_pki()
    shell.setenv("CB_SERVER", brokers.plain)
    shell.setenv("CB_CA", pki.ca_file)
    shell.setenv("CB_TOKEN", pki.operator_token)
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, hint = one_error(err)
    assert rc == 1 and "speaks plaintext" in msg and "--insecure-dev" in msg, msg
    assert "CB_INSECURE=1" in hint, hint


def test_wrong_ca(capsys, brokers: Brokers, shell, tmp_path: Path) -> None:
    from broker.auth.devca import DevCA

    other = DevCA(tmp_path / "other-ca")
    shell.setenv("CB_SERVER", brokers.tls)
    shell.setenv("CB_CA", str(other.ca_cert_path))
    shell.setenv("CB_TOKEN", session_pki().operator_token)
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, hint = one_error(err)
    assert rc == 1 and "not signed by the CA in" in msg and str(other.ca_cert_path) in msg, msg


def test_nothing_listening_names_cb_server(capsys, shell, dead_address: str) -> None:
    shell.setenv("CB_SERVER", dead_address)
    shell.setenv("CB_CA", session_pki().ca_file)
    shell.setenv("CB_TOKEN", session_pki().operator_token)
    rc, _, err = run_cli(capsys, "--timeout", "2", "jobs")
    msg, hint = one_error(err)
    assert rc == 1 and "nothing is listening" in msg, msg
    assert "CB_SERVER" in hint and "BROKER_ADDRESS" not in hint, hint


@pytest.mark.parametrize("token", ["cbt_abc_def", "not-a-token"])
def test_a_wrong_token_is_one_coherent_message(capsys, brokers: Brokers, shell, token: str) -> None:
    shell.setenv("CB_SERVER", brokers.tls)
    shell.setenv("CB_CA", session_pki().ca_file)
    shell.setenv("CB_TOKEN", token)
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, hint = one_error(err)
    assert rc == 2 and "the broker refused CB_TOKEN" in msg, msg
    assert "not logged in" not in err and "set CB_TOKEN" not in hint, err


def test_a_revoked_token_is_one_coherent_message(capsys, brokers: Brokers, shell) -> None:
    with BrokerClient(brokers.tls, timeout=15, credentials=session_pki().operator()) as op:
        issued = op.create_token("bob", team="ml", role="member")
        op.revoke_token(issued.token.id)
    shell.setenv("CB_SERVER", brokers.tls)
    shell.setenv("CB_CA", session_pki().ca_file)
    shell.setenv("CB_TOKEN", issued.secret)
    rc, _, err = run_cli(capsys, "--timeout", "3", "jobs")
    msg, _ = one_error(err)
    assert rc == 2 and "refused CB_TOKEN" in msg and "not logged in" not in err, err


def test_no_raw_grpc_lines_reach_the_terminal(brokers: Brokers, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV and k != "CB_CONFIG"
           and k != "GRPC_VERBOSITY"}
    env.update(HOME=str(tmp_path), CB_SERVER=brokers.tls)
    proc = subprocess.run([sys.executable, "-m", "brokerctl", "--timeout", "3", "jobs"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "ssl_transport_security" not in proc.stderr, proc.stderr
    assert "CERTIFICATE_VERIFY_FAILED" not in proc.stderr, proc.stderr
    msg, _ = one_error(proc.stderr)
    assert "no client config" in msg, proc.stderr


def test_submit_defaults_to_the_callers_only_team(capsys, brokers: Brokers, shell) -> None:
    """`whoami` knows alice is in ml; submit without --team uses it (not 'default')."""
    pki = session_pki()
    with BrokerClient(brokers.tls, timeout=15, credentials=session_pki().operator()) as op:
        alice = op.create_token("alice", team="ml", role="member").secret
    shell.setenv("CB_SERVER", brokers.tls)
    shell.setenv("CB_CA", pki.ca_file)
    shell.setenv("CB_TOKEN", alice)
    rc, out, err = run_cli(capsys, "submit", "--name", "t", "--steps", "5", "-o", "json")
    assert rc == 0, err
    import json

    assert json.loads(out)["spec"]["team"] == "ml"
    # An explicit --team still wins (and is still authorised as before).
    rc, _, err = run_cli(capsys, "submit", "--name", "t", "--steps", "5", "--team", "other")
    assert rc == 2 and "team other" in err, err
    # A certificate user gets the same default (their team is in the certificate).
    cert = pki.cert_credentials("carol", Role.MEMBER, "ml")
    shell.delenv("CB_TOKEN")
    shell.setenv("CB_SERVER", brokers.mtls)
    shell.setenv("CB_CLIENT_CERT", cert.client_cert)
    shell.setenv("CB_CLIENT_KEY", cert.client_key)
    rc, out, err = run_cli(capsys, "submit", "--name", "t", "--steps", "5", "-o", "json")
    assert rc == 0 and json.loads(out)["spec"]["team"] == "ml", err


def test_state_store_down_is_not_cannot_reach(capsys, shell, tmp_path: Path) -> None:
    """The broker answers UNAVAILABLE "state store unavailable": it is up, its store is not."""
    from broker.config import BrokerConfig
    from broker.server import BrokerServer

    redis = start_redis(tmp_path)
    server = BrokerServer(BrokerConfig(
        listen="127.0.0.1:0", store=redis.url, checkpoint_root=str(tmp_path / "ck"),
        **session_pki().broker_settings()))
    address = f"127.0.0.1:{server.start()}"
    try:
        shell.setenv("CB_SERVER", address)
        shell.setenv("CB_CA", session_pki().ca_file)
        shell.setenv("CB_TOKEN", session_pki().operator_token)
        rc, _, err = run_cli(capsys, "jobs")
        assert rc == 0, err
        stop_redis(redis)
        deadline = time.monotonic() + 30
        while True:
            rc, _, err = run_cli(capsys, "--timeout", "5", "jobs")
            if "state store" in err or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        msg, hint = one_error(err)
        assert rc == 1 and "is up, but its state store is unavailable" in msg, msg
        assert "cannot reach" not in err, err
    finally:
        server.stop(0.5)


def test_a_ca_file_that_is_gone_is_named(capsys, shell, tmp_path: Path) -> None:
    shell.setenv("CB_SERVER", "127.0.0.1:1")
    shell.setenv("CB_CA", str(tmp_path / "gone.pem"))
    shell.setenv("CB_TOKEN", "cbt_a_b")
    rc, _, err = run_cli(capsys, "jobs")
    msg, hint = one_error(err)
    assert rc == 2 and f"cannot read CA file (CB_CA / context ca) {tmp_path / 'gone.pem'}" in msg
    assert "invalid input" not in msg and "CB_CA" in hint, err
