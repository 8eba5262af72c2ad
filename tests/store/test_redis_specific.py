"""Redis-only behaviour: URL handling, retried writes applied once, reconnect after a
server restart (the conformance suite covers the shared semantics)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from broker.store import KIND_AGENT, open_store
from broker.store.base import StoreUnavailable
from broker.store.redis import RedisStore
from broker.store.redis_url import parse_redis_url
from computebroker.v1 import common_pb2 as pb
from tests.fixtures.redis_server import start_redis, stop_redis


def _split_url(url: str) -> tuple[str, str]:
    t = parse_redis_url(url)
    return t.url, t.prefix


def test_url_prefix_parsing():
    assert _split_url("redis://h:1/2?prefix=abc") == ("redis://h:1/2", "abc")
    assert _split_url("redis://h:1/2") == ("redis://h:1/2", "cb")
    assert _split_url("redis://h:1/2?prefix=x&socket_timeout=3") == (
        "redis://h:1/2?socket_timeout=3", "x")
    with pytest.raises(ValueError, match="prefix"):
        _split_url("redis://h:1/0?prefix=")


def test_open_store_redis_uses_prefix(redis_server):
    prefix = f"p{uuid.uuid4().hex[:8]}"
    store = open_store(f"{redis_server.url}?prefix={prefix}")
    try:
        assert isinstance(store, RedisStore)
        store.put_record(KIND_AGENT, "a1", pb.JobSpec(name="x"))
        raw = redis.Redis.from_url(redis_server.url)
        assert raw.keys(f"{prefix}:*") == [f"{prefix}:rec:{KIND_AGENT}".encode()]
        raw.close()
    finally:
        store.close()


def test_retried_write_with_same_token_applies_once(redis_store: RedisStore):
    """A write whose reply was lost is retried with the same token: it must report
    success (not VersionConflict) and must not append its events twice."""
    redis_store.create_job(pb.Job(id="j1", spec=pb.JobSpec(team="a")),
                           [pb.JobEvent(type="submitted")])
    job = redis_store.get_job("j1")
    job.version = 2
    args = [redis_store.prefix, "tok-1", 600, "", "", "j1", "1", "a", "", 1, "",
            job.SerializeToString(), 1, pb.JobEvent(type="x").SerializeToString()]
    assert redis_store._update(args=args) == [0, 2]
    assert redis_store._update(args=args) == [0, 2]  # the "retry"
    assert [e.seq for e in redis_store.list_events("j1")] == [1, 2]
    assert redis_store.get_job("j1").version == 2
    app = [redis_store.prefix, "tok-2", 600, "", "", "j1", 1, pb.JobEvent(type="p").SerializeToString()]
    assert redis_store._append(args=app) == 3
    assert redis_store._append(args=app) == 3
    assert [e.seq for e in redis_store.list_events("j1")] == [1, 2, 3]


def test_reconnects_after_server_restart(tmp_path):
    """Transient connection errors are retried (bounded) instead of failing the call."""
    server = start_redis(tmp_path)
    port = server.port
    store = RedisStore(f"{server.url}?prefix=r", retry_attempts=20, retry_max_delay_s=60)
    try:
        store.put_record(KIND_AGENT, "a", pb.JobSpec(name="before"))
        stop_redis(server)
        restarted: list = []
        t = threading.Timer(0.5, lambda: restarted.append(start_redis(tmp_path, port)))
        t.start()
        # the server is down right now; the call must ride out the restart
        store.put_record(KIND_AGENT, "a", pb.JobSpec(name="after"))
        t.join(timeout=60)
        assert restarted, "server did not restart"
        assert store.get_record(KIND_AGENT, "a", pb.JobSpec).name == "after"
    finally:
        store.close()
        deadline = time.monotonic() + 60
        while not restarted and time.monotonic() < deadline:
            time.sleep(0.1)
        for s in restarted:
            stop_redis(s)


def test_bounded_retry_gives_up_with_connection_error(tmp_path):
    server = start_redis(tmp_path)
    url = server.url
    stop_redis(server)
    store = RedisStore(url, retry_attempts=3, retry_max_delay_s=5, socket_timeout_s=1)
    try:
        with pytest.raises(StoreUnavailable) as info:  # a StoreError, the cause kept
            store.get_record(KIND_AGENT, "a", pb.JobSpec)
        assert isinstance(info.value.__cause__, redis.ConnectionError)
    finally:
        store.close()


def test_server_down_is_store_unavailable_not_a_raw_redis_error(tmp_path):
    """Issue 15 defect 6: a Redis outage that outlasts the retries must surface as
    StoreUnavailable (a StoreError -> UNAVAILABLE with a retry hint), never as a raw
    redis.ConnectionError (which the API mapped to INTERNAL)."""
    from broker.store import StoreError

    server = start_redis(tmp_path)
    store = RedisStore(f"{server.url}?prefix=u", retry_attempts=2, retry_max_delay_s=1,
                       socket_timeout_s=1)
    try:
        store.put_record(KIND_AGENT, "a", pb.JobSpec(name="before"))
        stop_redis(server)
        with pytest.raises(StoreUnavailable) as info:
            store.put_record(KIND_AGENT, "a", pb.JobSpec(name="during"))
        assert isinstance(info.value, StoreError)
        with pytest.raises(StoreUnavailable):
            store.get_job("nope")
    finally:
        store.close()
