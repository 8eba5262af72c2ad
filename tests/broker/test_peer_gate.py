"""A per-address cap on connections, before any TLS (broker/api/peer_gate.py).

Tried as an attacker would, over real TLS against a real broker: one machine (a
loopback source address of its own) opens TLS connections and holds them, no
credential, no RPC. Without the gate gRPC takes every one (each a descriptor and a
handshake); with ``max_connections_per_address`` the gate closes the connections over
the cap before reading a byte, so their TLS handshake never happens, while members on
other addresses still watch their jobs and agents still connect. The stream caps and
the audit log still see the client's own address through the gate.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from brokersdk.credentials import ClientCredentials
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import jobs_pb2_grpc
from tests.broker.harness import Broker, fast_config, spec
from tests.broker.relay import SourceRelay
from tests.broker.test_preauth_limits import relayed, victims_still_served

ATTACKER = "127.0.0.2"
CAP = 6


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(fast_config(tmp_path, max_connections_per_address=CAP, leader_lease_s=120))
    yield b
    b.stop()


def tls_connect(b: Broker, source: str) -> ssl.SSLSocket:
    """A real TLS client connection from ``source`` to the broker's public port, with
    gRPC's ALPN; raises when the connection is closed before the handshake finishes."""
    ctx = ssl.create_default_context(cafile=b.pki.ca_file)
    ctx.set_alpn_protocols(["h2"])
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.bind((source, 0))
    raw.settimeout(15)
    raw.connect(("127.0.0.1", b.port))
    try:
        return ctx.wrap_socket(raw, server_hostname="localhost")
    except BaseException:
        raw.close()
        raise


def test_one_address_cannot_hold_more_than_its_connections(gated: Broker) -> None:
    b = gated
    held: list[ssl.SSLSocket] = []
    try:
        for _ in range(CAP):
            s = tls_connect(b, ATTACKER)
            assert s.selected_alpn_protocol() == "h2"  # gRPC's own handshake, end to end
            held.append(s)
        gate = b.server._gate
        assert gate is not None and gate.open_from(ATTACKER) == CAP
        for _ in range(20):  # the rest: closed before any TLS
            with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
                tls_connect(b, ATTACKER).close()
        assert gate.refused >= 20
        # members on other addresses and a new agent are served as if nothing happened
        victims_still_served(b)
        # a connection given back is a slot again
        held.pop().close()
        for _ in range(50):  # the gate sees the close on its next turn
            try:
                held.append(tls_connect(b, ATTACKER))
                break
            except (ConnectionError, ssl.SSLError, OSError):
                time.sleep(0.1)
        else:
            raise AssertionError("a freed slot was not given back")
    finally:
        for s in held:
            with contextlib.suppress(OSError):
                s.close()


def test_caps_and_audit_see_the_clients_address_through_the_gate(gated: Broker) -> None:
    """The per-address stream cap counts the real client (127.0.0.3), not the gate's
    loopback connection: its ninth unauthenticated Watch is refused naming its address,
    while the same Watch from another address is admitted."""
    b = gated
    per_peer = b.config.max_public_streams_per_peer
    relays: list[SourceRelay] = []
    calls: list[grpc.Call] = []
    try:
        ch, relay = relayed(b, "127.0.0.3", ClientCredentials(ca=b.pki.ca_file))
        relays.append(relay)
        health = health_pb2_grpc.HealthStub(ch)
        calls += [health.Watch(health_pb2.HealthCheckRequest(), timeout=60) for _ in range(per_peer)]
        for c in calls:
            assert next(c).status == health_pb2.HealthCheckResponse.SERVING
        extra = health.Watch(health_pb2.HealthCheckRequest(), timeout=60)
        calls.append(extra)
        with pytest.raises(grpc.RpcError) as e:
            next(extra)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "ipv4:127.0.0.3" in e.value.details(), e.value.details()
        other = health_pb2_grpc.HealthStub(b.channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        calls.append(other)
        assert next(other).status == health_pb2.HealthCheckResponse.SERVING
        # the audit log names the client's address, not the gate's loopback connection
        ch2, relay2 = relayed(b, "127.0.0.4", b.pki.token_credentials(b.token_for("alice")))
        relays.append(relay2)
        b.team("ml")
        jobs_pb2_grpc.JobServiceStub(ch2).SubmitJob(jpb.SubmitJobRequest(spec=spec("audited")),
                                                    timeout=30)
        peers = [r.peer for r in b.server.audit.query(limit=500)]
        assert any(p.startswith("ipv4:127.0.0.4:") for p in peers), peers
    finally:
        for c in calls:
            c.cancel()
        for r in relays:
            r.close()


def test_without_the_gate_one_address_holds_any_number(tmp_path: Path) -> None:
    """The defect, as it stands with the gate off (the default): gRPC completes every
    handshake one address asks for."""
    b = Broker(fast_config(tmp_path))
    held: list[ssl.SSLSocket] = []
    try:
        assert b.config.max_connections_per_address == 0 and b.server._gate is None
        for _ in range(CAP + 10):
            held.append(tls_connect(b, ATTACKER))
        assert all(s.selected_alpn_protocol() == "h2" for s in held)
    finally:
        for s in held:
            with contextlib.suppress(OSError):
                s.close()
        b.stop()


def test_the_gate_refuses_api_workers(tmp_path: Path) -> None:
    both = fast_config(tmp_path, max_connections_per_address=4, api_workers=2)
    assert "api_workers" in both.workers_problem()
