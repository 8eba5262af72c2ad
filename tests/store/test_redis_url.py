"""Store URL parsing (broker/store/redis_url.py): both forms, their options, and a clear
error for each kind of mistake (a wrong URL must fail at start-up, not at a write)."""

from __future__ import annotations

import pytest

from broker.store import open_store
from broker.store.redis_url import DEFAULT_REPLICA_WAIT_MS, parse_redis_url
from broker.store.replica_quorum import ReplicaRule


def test_single_server_needs_no_replica_unless_asked() -> None:
    t = parse_redis_url("redis://h:1/2?prefix=x&socket_timeout=3")
    assert (t.url, t.prefix, t.min_replicas, t.is_sentinel) == (
        "redis://h:1/2?socket_timeout=3", "x", 0, False)
    t = parse_redis_url("redis://h:1/0?min_replicas=2&replica_wait_ms=250")
    assert (t.url, t.min_replicas, t.replica_wait_ms) == ("redis://h:1/0", 2, 250)


def test_sentinel_url_names_hosts_service_db_and_confirms_by_default() -> None:
    t = parse_redis_url("redis+sentinel://a:26379, b:26380/mymaster?prefix=p&db=3")
    assert t.is_sentinel
    assert t.sentinels == (("a", 26379), ("b", 26380))
    assert (t.service, t.db, t.prefix) == ("mymaster", 3, "p")
    # every replica the Sentinels may promote confirms, by default (at least one)
    assert (t.replica_rule, t.min_replicas, t.replica_wait_ms) == (
        ReplicaRule.ALL, 1, DEFAULT_REPLICA_WAIT_MS)
    t = parse_redis_url("redis+sentinel://a:1/m?min_replicas=0")
    assert (t.replica_rule, t.min_replicas) == (ReplicaRule.FIXED, 0)
    t = parse_redis_url("redis+sentinel://a:1/m?min_replicas=2")
    assert (t.replica_rule, t.min_replicas) == (ReplicaRule.FIXED, 2)
    assert parse_redis_url("redis+sentinel://a:1/m?min_replicas=ALL").replica_rule is ReplicaRule.ALL


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel:///mymaster", "no Sentinel addresses"),
    ("redis+sentinel://a:26379", "name the monitored primary"),
    ("redis+sentinel://a:26379/m/x", "name the monitored primary"),
    ("redis+sentinel://a/m", "must be HOST:PORT"),
    ("redis+sentinel://a:xx/m", "Sentinel port='xx' is not an integer"),
    ("redis+sentinel://u:pw@a:1/m", "credentials"),
    ("redis+sentinel://a:1/m?db=-1", "db must be >= 0"),
    ("redis+sentinel://a:1/m?socket_timeout=3", "unknown option"),
    ("redis+sentinel://a:1/m?min_replicas=one", "min_replicas='one' is not an integer or 'all'"),
    ("redis+sentinel://a:1/m?min_replicas=-1", "min_replicas must be >= 0"),
    ("redis://h:1/0?min_replicas=all", "min_replicas=all needs a redis.sentinel:// URL"),
    ("redis://h:1/0?replica_wait_ms=0", "replica_wait_ms must be >= 1"),
    ("redis://h:1/0?prefix=", "prefix must not be empty"),
])
def test_bad_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace("[", r"\[")):
        parse_redis_url(url)


def test_open_store_lists_the_sentinel_form() -> None:
    with pytest.raises(ValueError, match=r"redis\+sentinel://HOST:PORT"):
        open_store("mysql://x")
    with pytest.raises(ValueError, match="name the monitored primary"):
        open_store("redis+sentinel://a:1")
