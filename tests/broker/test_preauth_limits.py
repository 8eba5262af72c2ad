"""Nobody fills another caller's stream budget: the floods of a security review.

Reproduced as an attacker would, over real TLS against a real broker with its default
caps: (1) four machines, no credential, each one TLS connection holding 130
``grpc.health.v1.Health/Watch`` streams; (2) four members of one team on four machines,
128 ``WatchJob`` each. Before stream pools both took every one of the 512 slots: Alice
(another team) could not watch her job and a new agent could not ``Connect``. The four
machines are four loopback source addresses behind a real TCP relay
(tests/broker/relay.py). Also the per-address caps on their own (small caps, so the
test stays quick).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.auth.identity import Role
from brokersdk.credentials import ClientCredentials, make_channel
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import jobs_pb2_grpc
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until
from tests.broker.relay import SourceRelay

ATTACKERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per channel


@pytest.fixture
def defaults(tmp_path: Path) -> Iterator[Broker]:
    """A broker with the default stream caps (fast_config sets none of them). A long
    leader lease: opening hundreds of streams on a loaded 2-core box must not cost this
    lone broker its lease mid-test (leadership is not what is tested here)."""
    b = Broker(fast_config(tmp_path, leader_lease_s=120))
    yield b
    b.stop()


def relayed(b: Broker, source: str, creds: ClientCredentials) -> tuple[grpc.Channel, SourceRelay]:
    relay = SourceRelay(("127.0.0.1", b.port), [source])
    return make_channel(relay.address, creds, OWN_CONNECTION), relay


def admitted(calls: list[grpc.Call]) -> tuple[int, list[str]]:
    """How many streams got their first message, and the refusals' details."""
    ok, refused = 0, []
    for c in calls:
        try:
            next(c)
            ok += 1
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            refused.append(e.details())
    return ok, refused


def victims_still_served(b: Broker) -> None:
    """Alice (team ml, a member) watches her job; a new agent connects and registers."""
    b.team("ml")
    job = b.submit(spec("alice-job"))
    alice = b.stubs_as("alice", Role.MEMBER, "ml")
    w = alice.jobs.WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=60)
    assert next(w).type == "submitted"
    w.cancel()
    agent = FakeAgent(b.address, "late-agent", "us-east-2", nodes_for("us-east-2", "late", 1, 8))
    try:
        agent.connect()
        assert agent.ack is not None and agent.error is None
    finally:
        agent.close()


def test_anonymous_health_watch_flood_leaves_users_and_agents_served(defaults: Broker) -> None:
    b = defaults
    calls: list[grpc.Call] = []
    relays: list[SourceRelay] = []
    try:
        for src in ATTACKERS:
            ch, relay = relayed(b, src, ClientCredentials(ca=b.pki.ca_file))
            relays.append(relay)
            health = health_pb2_grpc.HealthStub(ch)
            calls += [health.Watch(health_pb2.HealthCheckRequest(), timeout=120) for _ in range(130)]
        ok, refused = admitted(calls)
        victims_still_served(b)
        # Each address holds at most its per-address share of the small public pool.
        assert ok == len(ATTACKERS) * b.config.max_public_streams_per_peer
        assert ok <= b.config.max_public_streams
        assert all("open unauthenticated streams" in r or "open public streams" in r
                   for r in refused), {r[:60] for r in refused}
        # Probes still answer (unary Check needs no stream slot).
        assert health_pb2_grpc.HealthStub(b.channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        for c in calls:
            c.cancel()
        for r in relays:
            r.close()


def test_four_members_flooding_watches_leave_other_teams_and_agents_served(defaults: Broker) -> None:
    b = defaults
    b.team("rivals")
    target = b.submit(spec("rivals-job", team="rivals"))
    calls: list[grpc.Call] = []
    relays: list[SourceRelay] = []
    try:
        for i, src in enumerate(ATTACKERS):
            creds = b.pki.token_credentials(b.token_for(f"mallory-{i}", Role.MEMBER, "rivals"))
            ch, relay = relayed(b, src, creds)
            relays.append(relay)
            jobs = jobs_pb2_grpc.JobServiceStub(ch)
            calls += [jobs.WatchJob(jpb.WatchJobRequest(job_id=target.id), timeout=120)
                      for _ in range(128)]
        ok, refused = admitted(calls)
        victims_still_served(b)
        assert ok == b.config.max_streams_per_team  # the team's share, not the pool
        assert refused and all("per-team limit" in r or "per-identity limit" in r for r in refused)
    finally:
        for c in calls:
            c.cancel()
        for r in relays:
            r.close()


def test_per_address_caps_count_every_identity_and_connection(tmp_path: Path) -> None:
    """One address: its streams across identities, and its connections, are capped."""
    b = Broker(fast_config(tmp_path, max_streams_per_peer=6, max_connections_per_peer=3))
    relays: list[SourceRelay] = []
    calls: list[grpc.Call] = []
    try:
        b.team("ml")
        job = b.submit(spec("j"))
        # Three users on one machine, each one connection, two watches each: 6 streams.
        stubs = []
        for user in ("u1", "u2", "u3"):
            ch, relay = relayed(b, "127.0.0.9", b.pki.token_credentials(b.token_for(user)))
            relays.append(relay)
            stubs.append(jobs_pb2_grpc.JobServiceStub(ch))
            calls += [stubs[-1].WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=60)
                      for _ in range(2)]
        assert admitted(calls) == (6, [])
        # A third watch of u1 on its connection: the address holds 6 streams, its cap.
        extra = stubs[0].WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=60)
        calls.append(extra)
        ok, refused = admitted([extra])
        assert ok == 0 and "ipv4:127.0.0.9 already has 6 open streams" in refused[0]
        assert "max_streams_per_peer=6" in refused[0]
        # One stream ends: u1's connection takes one again; a fourth user's new connection
        # does not (three connections of that address hold streams).
        calls[0].cancel()
        wait_until(lambda: b.server.streams.open == 5, 30, "slot released")
        again = stubs[0].WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=60)
        calls.append(again)
        assert admitted([again]) == (1, [])
        calls[1].cancel()
        wait_until(lambda: b.server.streams.open == 5, 30, "slot released")
        ch, relay = relayed(b, "127.0.0.9", b.pki.token_credentials(b.token_for("u4")))
        relays.append(relay)
        late = jobs_pb2_grpc.JobServiceStub(ch).WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=60)
        calls.append(late)
        ok, refused = admitted([late])
        assert ok == 0 and "ipv4:127.0.0.9 already holds streams on 3 connections" in refused[0]
        assert "max_connections_per_peer=3" in refused[0]
        # A fifth user from another address is not affected by this one's caps.
        other, relay = relayed(b, "127.0.0.10", b.pki.token_credentials(b.token_for("u5")))
        relays.append(relay)
        w = jobs_pb2_grpc.JobServiceStub(other).WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=60)
        calls.append(w)
        assert admitted([w]) == (1, [])
    finally:
        for c in calls:
            c.cancel()
        for r in relays:
            r.close()
        b.stop()
