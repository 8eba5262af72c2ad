"""Client credentials: kubectl-style contexts, CB_* overrides, and a real call with a
context made by `brokerctl dev-ca` (its certificate on the mutual-TLS port)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.auth.devca import write_client_config
from broker.auth.identity import Role
from brokersdk.client import BrokerClient
from brokersdk.credentials import CredentialsError, resolve
from tests.broker.harness import Broker


def test_contexts_and_environment_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write_client_config(tmp_path / "config.yaml", {
        "ops": {"server": "a:1", "ca": "/ca.pem", "token": "cbt_ops"},
        "me-cert": {"server": "a:2", "ca": "/ca.pem", "client-cert": "/me.pem", "client-key": "/me.key"},
    }, "ops")
    for var in ("CB_TOKEN", "CB_CA", "CB_SERVER", "CB_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CB_CONFIG", str(cfg))
    assert (resolve().server, resolve().token) == ("a:1", "cbt_ops")
    c = resolve(context="me-cert")
    assert (c.server, c.client_cert, c.token) == ("a:2", "/me.pem", "")
    monkeypatch.setenv("CB_CONTEXT", "me-cert")
    monkeypatch.setenv("CB_TOKEN", "cbt_env")
    c = resolve()
    assert (c.server, c.token, c.client_cert) == ("a:2", "cbt_env", "")  # a token replaces the cert
    with pytest.raises(CredentialsError, match="not in"):
        resolve(context="nope")


def test_a_dev_ca_certificate_context_talks_to_the_mtls_port(tls_broker: Broker, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cred = tls_broker.pki.user_cert("gina", Role.TEAM_ADMIN, "ml")
    cfg = write_client_config(tmp_path / "c.yaml", {"gina": {
        "server": tls_broker.agent_address, "ca": tls_broker.pki.ca_file,
        "client-cert": str(cred.cert), "client-key": str(cred.key)}}, "gina")
    for var in ("CB_TOKEN", "CB_CA", "CB_SERVER", "CB_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CB_CONFIG", str(cfg))
    with BrokerClient("") as c:  # server, CA and certificate all from the context
        me = c.whoami()
    assert (me.name, me.role, me.team, me.credential) == ("gina", "team-admin", "ml", "cert")
