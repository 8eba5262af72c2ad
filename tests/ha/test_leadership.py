"""Leader election inside real broker servers (in-process, real gRPC, real stores).

Complements test_failover.py (processes + SIGKILL): a leader that loses its lease
steps down at once, and SQLite enforces one leader per file while letting a
gracefully stopped leader hand over immediately.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import grpc
import pytest
import redis

from broker.config import BrokerConfig
from broker.server import BrokerServer
from tests.fixtures.cluster import wait_until
from tests.fixtures.pki import session_pki
from tests.fixtures.redis_server import RedisServer
from tests.ha.helpers import probe


def _server(store: str, broker_id: str, lease: float = 3.0) -> BrokerServer:
    return BrokerServer(BrokerConfig(listen="127.0.0.1:0", store=store, broker_id=broker_id,
                                     leader_lease_s=lease, scheduler_interval_s=0.2,
                                     agent_listen="127.0.0.1:0", **session_pki().broker_settings()))


def test_leader_that_loses_its_lease_steps_down(redis_server: RedisServer) -> None:
    prefix = f"hl{uuid.uuid4().hex[:10]}"
    leader = _server(f"{redis_server.url}?prefix={prefix}", "hl-a")
    leader.start()
    try:
        assert leader.leadership is not None and leader.leadership.is_leader
        assert leader.scheduler is not None
        address = f"127.0.0.1:{leader.port}"
        assert probe(address)[0]
        # Another holder takes the lease (as after a long pause of ours): step down.
        r = redis.Redis.from_url(redis_server.url)
        r.set(f"{prefix}:lease:leader", "intruder", px=60_000)
        wait_until(lambda: not leader.leadership.is_leader and leader.scheduler is None,
                   timeout=30, what="step-down")
        ok, details = probe(address)
        assert not ok and details.startswith("standby broker hl-a;"), details
        # The lease comes free again: this replica leads once more.
        r.delete(f"{prefix}:lease:leader")
        wait_until(lambda: probe(address)[0], timeout=30, what="re-election")
        r.close()
    finally:
        leader.stop()


def test_sqlite_one_leader_per_file_and_graceful_handover(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.sqlite'}"
    first = _server(url, "sq-a")
    first.start()
    second = _server(url, "sq-b")
    second.start()
    try:
        assert first.leadership is not None and first.leadership.is_leader
        assert second.leadership is not None and not second.leadership.is_leader
        ok, details = probe(f"127.0.0.1:{second.port}")
        assert not ok and f"the leader is sq-a (127.0.0.1:{first.port})" in details, details
        before = time.time()
        first.stop()  # releases the file lock: the standby leads at its next poll
        wait_until(lambda: second.leadership.is_leader, timeout=30, what="promotion")
        assert probe(f"127.0.0.1:{second.port}")[0]
        # Agents known from the store get their grace period from the promotion.
        assert second.ops is not None and second.ops.started_time >= before
    finally:
        second.stop()
        first.stop()


def test_memory_store_always_leads() -> None:
    server = _server("sqlite:///:memory:", "mem")
    server.start()
    try:
        assert server.leadership is not None and server.leadership.is_leader
        with session_pki().channel(f"127.0.0.1:{server.port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=5)
        assert probe(f"127.0.0.1:{server.port}")[0]
    finally:
        server.stop()


def test_replaced_leader_store_writes_are_fenced(redis_server: RedisServer) -> None:
    """Issue 15 defect 7: a leader frozen past its lease wrote to Redis after a standby
    took over. Now the lease grant bumps an epoch and every write of the old leader's
    store checks it inside the write: refused at once, before the old leader's own
    lease tick even runs, and nothing reaches the store."""
    from broker.store import KIND_TEAM
    from broker.store.base import Fenced
    from computebroker.v1 import common_pb2 as pb

    prefix = f"hf{uuid.uuid4().hex[:10]}"
    leader = _server(f"{redis_server.url}?prefix={prefix}", "hf-a", lease=30.0)
    leader.start()
    r = redis.Redis.from_url(redis_server.url)
    try:
        assert leader.leadership is not None and leader.leadership.is_leader
        assert leader._store is not None
        store = leader._store  # the leader's own store object (fenced with its epoch)
        store.put_record(KIND_TEAM, "before", pb.JobSpec(team="before"))
        # A standby takes over (what acquire_lease_epoch does once our lease expired).
        r.set(f"{prefix}:lease:leader", "hf-b", px=60_000)
        r.incr(f"{prefix}:lease:leader:epoch")
        with pytest.raises(Fenced):
            store.put_record(KIND_TEAM, "late", pb.JobSpec(team="late"))
        assert r.hget(f"{prefix}:rec:team", "late") is None
        assert r.hget(f"{prefix}:rec:team", "before") is not None
        wait_until(lambda: not leader.leadership.is_leader, timeout=60, what="step-down")
    finally:
        r.close()
        leader.stop()
