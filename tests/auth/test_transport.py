"""TLS on every port, the explicit insecure dev mode, and the CLI's credentials."""

from __future__ import annotations

import ssl
import urllib.request
from pathlib import Path

import grpc
import pytest
from pydantic import ValidationError

from broker.config import BrokerConfig
from broker.server import BrokerServer
from brokerctl.main import main as brokerctl
from computebroker.v1 import auth_pb2 as aupb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import capacity_pb2_grpc
from tests.broker.harness import Broker, fast_config


def test_plaintext_clients_get_nothing_from_a_tls_broker(tls_broker: Broker) -> None:
    for address in (tls_broker.address, tls_broker.agent_address):
        with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError) as info:
            capacity_pb2_grpc.CapacityServiceStub(ch).ListRegions(cpb.ListRegionsRequest(), timeout=5)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE


def test_agent_port_requires_a_certificate_from_the_ca(tls_broker: Broker) -> None:
    from brokersdk.credentials import make_channel

    creds = tls_broker.pki.operator()  # a token, no certificate
    with make_channel(tls_broker.agent_address, creds) as ch, pytest.raises(grpc.RpcError) as info:
        capacity_pb2_grpc.CapacityServiceStub(ch).ListRegions(cpb.ListRegionsRequest(), timeout=5)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


def test_broker_refuses_to_start_without_tls(tmp_path: Path) -> None:
    cfg = BrokerConfig(listen="127.0.0.1:0", store=f"sqlite:///{tmp_path / 'b.sqlite'}")
    with pytest.raises(RuntimeError, match="TLS is required"):
        BrokerServer(cfg).start()
    with pytest.raises(ValidationError, match="loopback only"):
        BrokerConfig(listen="0.0.0.0:0", insecure_dev=True)
    rc = brokerctl(["serve", "--store", f"sqlite:///{tmp_path / 'c.sqlite'}", "--listen", "127.0.0.1:0"])
    assert rc == 2


def test_insecure_dev_mode_is_one_local_operator(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, insecure_dev=True))
    try:
        assert b.agent_address == b.address  # one plaintext loopback port
        b.team("dev", gpus=4)
        assert b.auth.WhoAmI(aupb.WhoAmIRequest()).credential == "insecure-dev"
    finally:
        b.stop()


def test_metrics_are_served_over_https(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, metrics_listen="127.0.0.1:0"))
    try:
        ctx = ssl.create_default_context(cafile=b.pki.ca_file)
        url = f"https://127.0.0.1:{b.server.metrics_port}/metrics"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
            assert resp.status == 200 and b"computebroker_agents_connected" in resp.read()
        with pytest.raises(Exception):  # noqa: B017,PT011 - plain HTTP is refused
            urllib.request.urlopen(url.replace("https", "http"), timeout=10).read()
    finally:
        b.stop()


def test_cli_dev_ca_contexts_and_users(tls_broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pki"
    assert brokerctl(["dev-ca", str(d), "--server", tls_broker.address,
                      "--agent", "eu-west-1", "--user", "ops:operator", "--user", "amy:member:ml"]) == 0
    for name in ("ca.pem", "broker.pem", "broker.key", "agents/eu-west-1-agent.pem", "users/amy.pem",
                 "tokens.yaml", "config.yaml", "broker.yaml"):
        assert (d / name).exists(), name
    assert oct((d / "ca.key").stat().st_mode & 0o777) == "0o600"
    # The dev-ca's tokens are static bootstrap tokens of ITS broker; ours knows other ones.
    # So: an operator of our broker makes a token for amy; amy's context then uses it.
    capsys.readouterr()
    monkeypatch.delenv("CB_TOKEN")
    monkeypatch.setenv("CB_CA", tls_broker.pki.ca_file)
    monkeypatch.setenv("CB_CONFIG", str(tmp_path / "none.yaml"))
    assert brokerctl(["--broker", tls_broker.address, "whoami"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "not logged in" in err and "Traceback" not in err
    monkeypatch.setenv("CB_TOKEN", tls_broker.pki.operator_token)
    assert brokerctl(["--broker", tls_broker.address, "users", "create", "amy", "--team", "ml"]) == 0
    secret = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("cbt_"))
    monkeypatch.setenv("CB_TOKEN", secret)
    assert brokerctl(["--broker", tls_broker.address, "whoami"]) == 0
    assert "amy (member, team ml)" in capsys.readouterr().out
    assert brokerctl(["--broker", tls_broker.address, "drain", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert "PERMISSION" not in err and "may not regions.admin" in err and "hint:" in err
    monkeypatch.setenv("CB_TOKEN", tls_broker.pki.operator_token)
    assert brokerctl(["--broker", tls_broker.address, "audit", "--user", "amy", "-o", "json"]) == 0
    assert "DrainRegion" in capsys.readouterr().out
