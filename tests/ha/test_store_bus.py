"""The store bus between API front-ends and the leader (broker/api/store_bus.py), on a
real redis-server: what is announced arrives, only a leader acts on it, and every way
an announcement can be lost makes the leader re-read the store."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.api import store_bus
from broker.api.store_bus import FrontendBus, LeaderBus
from broker.config import BrokerConfig
from broker.jobs.hub import EventHub
from broker.store.redis import RedisStore
from computebroker.v1 import common_pb2 as pb
from tests.fixtures.cluster import wait_until
from tests.fixtures.redis_server import RedisServer, start_redis


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    s = RedisStore(f"{redis_server.url}?prefix=bus{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


class Leader:
    def __init__(self, store: RedisStore) -> None:
        self.leading = True
        self.jobs: list[str] = []
        self.rereads = 0
        self.hub = EventHub()
        self.bus = LeaderBus(store, self.hub, lambda: self.leading,
                             lambda jobs: self.jobs.extend(j.id for j in jobs), self._reread)

    def _reread(self) -> None:
        self.rereads += 1


def test_creations_reach_the_leader_and_its_changes_wake_frontend_watchers(store: RedisStore) -> None:
    leader = Leader(store)
    leader.bus.start()
    fe_hub = EventHub()
    fe = FrontendBus(store, "fe-a", 1, fe_hub)
    fe.start()
    try:
        wait_until(lambda: leader.bus.listener.connected.is_set() and fe.connected, timeout=10)
        assert leader.rereads == 1  # its first subscription: anything said before is re-read
        fe.add(pb.Job(id="j-1"))
        fe.add(pb.Job(id="j-2"))
        wait_until(lambda: leader.jobs == ["j-1", "j-2"], timeout=5, what="creations heard")
        assert leader.bus.frontends() == ["fe-a"]
        # The leader's write of j-1 wakes a watcher of j-1 on the front-end.
        seen = fe_hub.counter("j-1")
        woke: list[int] = []
        t = threading.Thread(target=lambda: woke.append(fe_hub.wait("j-1", seen, 5.0)))
        t.start()
        time.sleep(0.1)
        leader.hub.notify("j-1")
        t.join()
        assert woke and woke[0] != seen
        # A standby hears the same messages and ignores them (promotion reads the store).
        leader.leading = False
        fe.add(pb.Job(id="j-3"))
        time.sleep(0.5)
        assert leader.jobs == ["j-1", "j-2"]
    finally:
        fe.close()
        leader.bus.stop()


def test_a_silent_frontend_and_a_lost_subscription_make_the_leader_reread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_bus, "SILENT_S", 1.5)
    own = start_redis(tmp_path)  # its own server: this test drops every subscriber on it
    store = RedisStore(own.url)
    leader = Leader(store)
    leader.bus.start()
    fe = FrontendBus(store, "fe-b", 2, EventHub())
    fe.start()
    try:
        wait_until(lambda: leader.bus.frontends() == ["fe-b"], timeout=10, what="the beat")
        before = leader.rereads
        fe.close()  # gone without a word (as if frozen or killed)
        wait_until(lambda: leader.rereads > before, timeout=10, what="re-read on silence")
        # The server drops the leader's subscription (a Redis restart, a failover).
        before = leader.rereads
        store._r.client_kill_filter(_type="pubsub")
        wait_until(lambda: leader.rereads > before, timeout=15, what="re-read on resubscribe")
        assert leader.bus.listener.connected.is_set()
        assert leader.bus.listener.reconnects >= 1  # counted (a front-end's metrics show it)
        assert leader.bus.listener.address == f"127.0.0.1:{own.port}"
        assert store.primary_address() is None  # one server: nothing to compare with
    finally:
        leader.bus.stop()
        store.close()
        own.proc.kill()
        own.proc.wait()


def test_a_frontend_needs_the_shared_redis_store() -> None:
    assert "Redis" in BrokerConfig(frontend=True, store="sqlite:///x.db",
                                   insecure_dev=True).frontend_problem()
    assert "one process" in BrokerConfig(frontend=True, store="redis://h:6379/0", api_workers=2,
                                         insecure_dev=True).frontend_problem()
    assert BrokerConfig(frontend=True, store="redis://h:6379/0", insecure_dev=True).frontend_problem() == ""
