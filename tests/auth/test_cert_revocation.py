"""A lost agent host's certificate stops working without a broker restart: a CRL
signed by the broker's CA, or a deny list of serials / SHA-256 fingerprints, re-read
when the file changes. Real mutual TLS, real certificates from the session's dev CA."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from broker.auth.identity import Role
from computebroker.v1 import auth_pb2 as aupb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, wait_until
from tests.fixtures.pki import session_pki

RELOAD_WAIT_S = 15  # the broker looks at the files every 2 s; generous under load


def cert_of(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def agent(b: Broker, agent_id: str) -> FakeAgent:
    return FakeAgent(b.address, agent_id, "us-east-2", nodes_for("us-east-2", agent_id, 1, 8))


def refused(a: FakeAgent) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        a.connect()
    a.close()
    return info.value


def test_crl_and_deny_list_revoke_agents_without_a_restart(tmp_path: Path) -> None:
    crl, deny = tmp_path / "revoked.crl", tmp_path / "deny.txt"
    pki = session_pki()
    pki.ca.write_crl(crl, [])
    deny.write_text("# agents we no longer trust\n")
    b0 = Broker(fast_config(tmp_path, tls_crl=str(crl), cert_deny_list=str(deny)))
    agents: list[FakeAgent] = []
    try:
        lost, other, third = (agent(b0, n) for n in ("lost-host", "kept-host", "third-host"))
        agents += [lost, other, third]
        for a in (lost, other, third):
            a.connect()
        # The CA revokes the lost host's certificate: its live stream is cut at its next
        # message, and it cannot come back; the others carry on.
        serial = cert_of(pki.agent_cert("us-east-2", "lost-host").cert).serial_number
        pki.ca.write_crl(crl, [serial])
        wait_until(lambda: lost.error is not None, RELOAD_WAIT_S, "the revoked agent's stream cut")
        assert lost.error.code() is grpc.StatusCode.CANCELLED
        lost.close()
        e = refused(agent(b0, "lost-host"))
        assert e.code() is grpc.StatusCode.UNAUTHENTICATED
        assert f"serial {serial:#x}) is revoked" in e.details()
        assert other.error is None and third.error is None
        # The operator denies another by fingerprint (colon form, as openssl prints it).
        der = cert_of(pki.agent_cert("us-east-2", "kept-host").cert).public_bytes(serialization.Encoding.DER)
        fp = hashlib.sha256(der).hexdigest().upper()
        deny.write_text("# lost laptop\n" + ":".join(fp[i:i + 2] for i in range(0, 64, 2)) + "\n")
        wait_until(lambda: other.error is not None, RELOAD_WAIT_S, "the denied agent's stream cut")
        e = refused(agent(b0, "kept-host"))
        assert e.code() is grpc.StatusCode.UNAUTHENTICATED and "is revoked" in e.details()
        # A broken deny list keeps the previous one in force (a typo un-revokes nobody).
        deny.write_text("not-a-serial\n")
        time.sleep(3)
        assert "is revoked" in refused(agent(b0, "kept-host")).details()
        # User certificates are covered the same way, on every RPC.
        user = b0.stubs_as("una", Role.MEMBER, "ml", cert=True)
        assert user.auth.WhoAmI(aupb.WhoAmIRequest()).name == "una"
        serial_u = cert_of(pki.user_cert("una", Role.MEMBER, "ml").cert).serial_number
        deny.write_text(f"{serial_u:#x}\n")
        wait_until(lambda: _code(user) is grpc.StatusCode.UNAUTHENTICATED, RELOAD_WAIT_S,
                   "the user certificate refused")
        # The third agent was never named: still connected.
        assert third.error is None
    finally:
        for a in agents:
            a.close()
        b0.stop()


def _code(stubs: object) -> grpc.StatusCode:
    try:
        stubs.auth.WhoAmI(aupb.WhoAmIRequest(), timeout=10)  # type: ignore[attr-defined]
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_a_broker_does_not_start_with_a_bad_crl(tmp_path: Path) -> None:
    bad = tmp_path / "bad.crl"
    bad.write_text("-----BEGIN X509 CRL-----\nnope\n-----END X509 CRL-----\n")
    with pytest.raises(RuntimeError, match="bad.crl"):
        Broker(fast_config(tmp_path, tls_crl=str(bad)))
    with pytest.raises(RuntimeError, match="no such file"):
        Broker(fast_config(tmp_path, cert_deny_list=str(tmp_path / "missing.txt")))
