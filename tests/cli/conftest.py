"""Fixtures for SDK and CLI tests: a REAL broker (broker.server.BrokerServer, gRPC on a
free loopback port, SQLite state in a temp dir). No agents: jobs stay PENDING, which
is all the SDK/CLI paths here need (submit, list, detail, cancel, errors)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokersdk.client import BrokerClient
from tests.fixtures.pki import session_pki

TEAM = "ml"
# broker address -> its checkpoint_root (jobs may choose a checkpoint_uri under it)
CHECKPOINT_ROOTS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def broker_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from broker.config import BrokerConfig
    from broker.server import BrokerServer

    root: Path = tmp_path_factory.mktemp("cli-broker")
    config = BrokerConfig(
        listen="127.0.0.1:0",
        store=f"sqlite:///{root / 'broker.sqlite'}",
        checkpoint_root=str(root / "checkpoints"),
        agent_listen="127.0.0.1:0", **session_pki().broker_settings(),  # TLS + auth
    )
    server = BrokerServer(config)
    port = server.start()
    try:
        address = f"127.0.0.1:{port}"
        CHECKPOINT_ROOTS[address] = root / "checkpoints"
        with BrokerClient(address) as client:
            client.set_team_quota(TEAM, cohort="c", guaranteed=16)
        yield address
    finally:
        server.stop(0.5)


@pytest.fixture
def client(broker_address: str) -> Iterator[BrokerClient]:
    with BrokerClient(broker_address, timeout=15) as c:
        yield c


@pytest.fixture
def dead_address() -> str:
    """A loopback port with nothing listening (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``brokerctl ARGV`` in-process: (exit status, stdout, stderr)."""
    from brokerctl.main import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err
