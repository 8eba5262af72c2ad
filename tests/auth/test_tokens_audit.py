"""Bearer tokens (create, use, rotate, revoke; hashed at rest; both stores) and the
audit log of mutations, over real TLS."""

from __future__ import annotations

import grpc
import pytest

from broker.auth.identity import Role
from broker.auth.tokens import KIND_TOKEN, TokenError, TokenManager
from brokersdk.client import BrokerClient, NotAuthenticated
from computebroker.v1 import auth_pb2 as aupb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, Stubs, spec
from tests.fixtures.redis_server import RedisServer


def _with_token(b: Broker, token: str) -> Stubs:
    return Stubs.over(b.open_channel(b.pki.token_credentials(token)))


def test_no_or_bad_credential_is_unauthenticated_with_a_hint(tls_broker: Broker) -> None:
    for stubs in (tls_broker.anonymous(), _with_token(tls_broker, "cbt_0123456789ab_" + "x" * 40),
                  _with_token(tls_broker, "not-a-token")):
        with pytest.raises(grpc.RpcError) as info:
            stubs.jobs.ListJobs(jpb.ListJobsRequest())
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    from brokersdk.credentials import ClientCredentials

    creds = ClientCredentials(ca=tls_broker.pki.ca_file)
    with BrokerClient(tls_broker.address, credentials=creds) as c, \
            pytest.raises(NotAuthenticated) as err:
        c.whoami()
    assert "not logged in" in (err.value.hint or "")


def test_identity_comes_from_the_credential_not_a_header(tls_broker: Broker) -> None:
    alice = tls_broker.stubs_as("alice-h", Role.MEMBER, "ml")
    md = [("x-cb-user", "admin"), ("user", "admin")]
    me = alice.auth.WhoAmI(aupb.WhoAmIRequest(), metadata=md)
    assert (me.name, me.role, me.team) == ("alice-h", "member", "ml")
    job = alice.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("h")), metadata=md).job
    assert tls_broker.events(job.id)[0].actor == "user:alice-h"
    with pytest.raises(grpc.RpcError) as info:
        alice.auth.ListTokens(aupb.ListTokensRequest(), metadata=md)
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_operator_creates_rotates_and_revokes_tokens(tls_broker: Broker) -> None:
    b = tls_broker
    issued = b.auth.CreateToken(aupb.CreateTokenRequest(user="dave", team="ml", role="member"))
    assert issued.secret.startswith(f"cbt_{issued.token.id}_") and not issued.token.secret_hash
    stored = b.store.get_record(KIND_TOKEN, issued.token.id, aupb.ApiToken)
    # the secret's random part (after "cbt_<id>_"; it may itself contain "_") is not stored
    random_part = issued.secret.removeprefix(f"cbt_{issued.token.id}_")
    assert stored.secret_hash.startswith("$argon2id$") and random_part not in stored.secret_hash
    dave = _with_token(b, issued.secret)
    assert dave.auth.WhoAmI(aupb.WhoAmIRequest()).name == "dave"
    rotated = b.auth.RotateToken(aupb.RotateTokenRequest(token_id=issued.token.id))
    with pytest.raises(grpc.RpcError) as info:
        dave.auth.WhoAmI(aupb.WhoAmIRequest())  # the old secret, cached before: dropped
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    dave2 = _with_token(b, rotated.secret)
    assert dave2.auth.WhoAmI(aupb.WhoAmIRequest()).name == "dave"
    b.auth.RevokeToken(aupb.RevokeTokenRequest(token_id=issued.token.id))
    with pytest.raises(grpc.RpcError) as info:
        dave2.jobs.ListJobs(jpb.ListJobsRequest())
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "revoked" in (info.value.details() or "")
    listed = b.auth.ListTokens(aupb.ListTokensRequest(user="dave", include_revoked=True)).tokens
    assert [t.revoked for t in listed] == [True] and not listed[0].secret_hash


def test_tokens_in_the_redis_store(redis_server: RedisServer) -> None:
    from broker.store import open_store

    store = open_store(f"{redis_server.url}?prefix=tok-test")
    try:
        tm = TokenManager(store)
        issued = tm.create("erin", "ml", Role.TEAM_ADMIN, "test")
        p = TokenManager(store).verify(issued.secret)  # another replica: from the store
        assert (p.name, p.role, p.team) == ("erin", Role.TEAM_ADMIN, "ml")
        tm.revoke(issued.token.id)
        with pytest.raises(TokenError):
            TokenManager(store).verify(issued.secret)
    finally:
        store.close()


def test_mutations_are_audited_and_only_operators_read_the_log(tls_broker: Broker) -> None:
    b = tls_broker
    frank = b.stubs_as("frank", Role.MEMBER, "ml")
    job = frank.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("audited"))).job
    frank.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id))
    with pytest.raises(grpc.RpcError):
        frank.auth.CreateToken(aupb.CreateTokenRequest(user="x", team="ml"))
    with pytest.raises(grpc.RpcError) as info:
        frank.auth.ListAuditRecords(aupb.ListAuditRecordsRequest())
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    recs = b.auth.ListAuditRecords(aupb.ListAuditRecordsRequest(actor="frank")).records
    got = [(r.method.rsplit("/", 1)[-1], r.target, r.result) for r in recs]
    assert got == [("CreateToken", "", "PERMISSION_DENIED"), ("CancelJob", job.id, "OK"),
                   ("SubmitJob", "spec:ml", "OK")]
    assert all(r.actor == "user:frank" and r.role == "member" and r.peer.startswith("ipv4:127.0.0.1")
               and r.time > 0 for r in recs)
    assert not [r for r in recs if "GetJob" in r.method]  # reads are not audited


def test_a_renewed_cache_entry_rereads_the_record_but_does_not_hash_again(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Past the cache TTL a token's entry is renewed by reading its record (a revocation
    or a rotation elsewhere is seen), not by argon2 again (16 concurrent callers used to
    hash 16 times every TTL); a rotated secret (new hash) is verified in full, and fails."""
    import time
    import types

    from broker.auth import tokens as tokens_mod
    from broker.store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "s.sqlite"))
    now = [1000.0]
    monkeypatch.setattr(tokens_mod, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=time.time))
    mgr = TokenManager(store, cache_ttl_s=10.0)
    other = TokenManager(store, cache_ttl_s=10.0)  # another replica, same store
    issued = mgr.create("ana", "ml", Role.MEMBER, "op")
    hashes: list[str] = []
    real = tokens_mod._HASHER  # noqa: SLF001

    class Counting:
        hash = staticmethod(real.hash)

        def verify(self, h: str, secret: str) -> bool:
            hashes.append(h)
            return real.verify(h, secret)

    monkeypatch.setattr(tokens_mod, "_HASHER", Counting())
    assert other.verify(issued.secret).name == "ana" and len(hashes) == 1
    assert other.verify(issued.secret).name == "ana" and len(hashes) == 1  # cached
    now[0] += 11
    assert other.verify(issued.secret).name == "ana" and len(hashes) == 1  # renewed, no hash
    rotated = mgr.rotate(issued.token.id)
    now[0] += 11
    with pytest.raises(TokenError, match="wrong secret"):
        other.verify(issued.secret)  # the new hash: verified in full, and refused
    assert len(hashes) == 2
    assert other.verify(rotated.secret).name == "ana" and len(hashes) == 3
    mgr.revoke(issued.token.id)
    now[0] += 11
    with pytest.raises(TokenError, match="revoked"):
        other.verify(rotated.secret)
