"""Tokens as an attacker would probe them: a secret in use while it is rotated, an
expired token, a revoked token on the other replica of an HA pair. Real TLS brokers,
real SQLite and a real redis-server."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.auth.tokens import KIND_TOKEN
from brokerctl.main import main as brokerctl
from computebroker.v1 import auth_pb2 as aupb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, Stubs, fast_config, spec, wait_until
from tests.fixtures.redis_server import RedisServer


def _with_token(b: Broker, token: str) -> Stubs:
    return Stubs.over(b.open_channel(b.pki.token_credentials(token)))


class PausedTokenRead:
    """The broker's real store, except that the next read of one token record holds
    its answer until :meth:`release`: a verification caught between reading the token
    and caching it, so the rotation lands exactly in that window every time."""

    def __init__(self, real: Any, token_id: str) -> None:
        self._real = real
        self._token_id = token_id
        self.read = threading.Event()
        self._go = threading.Event()
        self._armed = True

    def get_record(self, kind: str, key: str, message_type: type) -> Any:
        out = self._real.get_record(kind, key, message_type)
        if self._armed and kind == KIND_TOKEN and key == self._token_id:
            self._armed = False
            self.read.set()
            assert self._go.wait(30), "never released"
        return out

    def release(self) -> None:
        self._go.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_secret_in_use_during_its_rotation_stops_working(tls_broker: Broker) -> None:
    b = tls_broker
    issued = b.auth.CreateToken(aupb.CreateTokenRequest(user="eve", team="ml", role="member"))
    tokens = b.server.tokens
    real = tokens.store
    paused = tokens.store = PausedTokenRead(real, issued.token.id)
    eve = _with_token(b, issued.secret)
    in_flight: list[Any] = []
    try:
        t = threading.Thread(target=lambda: in_flight.append(
            eve.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("in-flight")), timeout=30)))
        t.start()
        assert paused.read.wait(30), "the check never read the token"
        # The operator rotates while eve's check holds the old record.
        b.auth.RotateToken(aupb.RotateTokenRequest(token_id=issued.token.id), timeout=30)
        paused.release()
        t.join(30)
    finally:
        paused.release()
        tokens.store = real
    assert in_flight, "the call in flight during the rotation did not finish"
    # The old secret, used after the rotation returned, is refused at once.
    with pytest.raises(grpc.RpcError) as info:
        eve.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("after-rotate")), timeout=30)
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "wrong secret" in info.value.details()


def test_tokens_expire_with_a_clear_message(tls_broker: Broker) -> None:
    b = tls_broker
    now = time.time()
    default = b.auth.CreateToken(aupb.CreateTokenRequest(user="fay", team="ml", role="member"))
    assert default.token.expires_time == pytest.approx(now + b.config.token_default_ttl_s, abs=60)
    short = b.auth.CreateToken(aupb.CreateTokenRequest(user="gus", team="ml", role="member", ttl_s=2))
    gus = _with_token(b, short.secret)
    assert gus.auth.WhoAmI(aupb.WhoAmIRequest()).name == "gus"  # now cached on the broker
    time.sleep(max(0.0, short.token.expires_time - time.time()) + 0.2)
    with pytest.raises(grpc.RpcError) as info:
        gus.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("late")))
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert f"token {short.token.id} expired at" in info.value.details()
    assert "ask an operator for a new token" in info.value.details()
    # Nobody gets a token longer than the broker allows, or a negative one.
    for ttl in (b.config.token_max_ttl_s + 1, -5):
        with pytest.raises(grpc.RpcError) as info:
            b.auth.CreateToken(aupb.CreateTokenRequest(user="hal", team="ml", ttl_s=ttl))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    # An expired token cannot be rotated back to life.
    with pytest.raises(grpc.RpcError) as info:
        b.auth.RotateToken(aupb.RotateTokenRequest(token_id=short.token.id))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "expired" in info.value.details()


def test_cli_ttl(tls_broker: Broker, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv("CB_CA", tls_broker.pki.ca_file)
    monkeypatch.setenv("CB_CONFIG", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("CB_TOKEN", tls_broker.pki.operator_token)
    capsys.readouterr()
    assert brokerctl(["--broker", tls_broker.address, "users", "create", "ivy", "--team", "ml",
                      "--ttl", "12h"]) == 0
    out = capsys.readouterr().out
    tid = out.split()[1]
    expires = tls_broker.store.get_record(KIND_TOKEN, tid, aupb.ApiToken).expires_time
    assert expires == pytest.approx(time.time() + 12 * 3600, abs=60)
    assert "expires " in out
    assert brokerctl(["--broker", tls_broker.address, "users", "create", "ivy", "--team", "ml",
                      "--ttl", "soon"]) == 2
    assert "--ttl 'soon'" in capsys.readouterr().err


@pytest.fixture
def replica_pair(tmp_path: Path, redis_server: RedisServer) -> Iterator[tuple[Broker, Broker]]:
    url = f"{redis_server.url}?prefix=tok{uuid.uuid4().hex[:10]}"
    a = Broker(fast_config(tmp_path / "a", store=url, leader_lease_s=2.0, broker_id="tok-a"))
    b = Broker(fast_config(tmp_path / "b", store=url, leader_lease_s=2.0, broker_id="tok-b"))
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()


def test_a_revocation_reaches_the_other_replica_within_one_lease(
        replica_pair: tuple[Broker, Broker]) -> None:
    leader, standby = replica_pair
    wait_until(lambda: leader.server.leadership.is_leader, 20, "a leads")
    issued = leader.auth.CreateToken(aupb.CreateTokenRequest(user="kim", team="ml", role="member"))
    kim_there = _with_token(standby, issued.secret)

    def code_on_standby() -> grpc.StatusCode:
        try:
            kim_there.auth.WhoAmI(aupb.WhoAmIRequest(), timeout=10)
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    # The standby knows kim (authenticated, then: "not the leader"), and has cached her.
    assert code_on_standby() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK)
    leader.auth.RevokeToken(aupb.RevokeTokenRequest(token_id=issued.token.id))
    revoked_at = time.monotonic()
    wait_until(lambda: code_on_standby() is grpc.StatusCode.UNAUTHENTICATED,
               3 * leader.config.leader_lease_s, "the standby refusing the revoked token")
    # One lease interval plus the poll's slack (a 30 s cache would be far beyond it).
    assert time.monotonic() - revoked_at <= leader.config.leader_lease_s + 1.5
