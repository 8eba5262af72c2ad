"""The Redis store's URL: which server(s) to talk to and what an acknowledged write waits for.

Two forms (docs/operator/store-ha.md):

- ``redis://host:port/db?prefix=cb`` (also ``rediss://``, ``unix://``): one server.
- ``redis+sentinel://h1:26379,h2:26379/mymaster?prefix=cb&db=0``: ask the Sentinels
  which server is the primary of ``mymaster`` and follow it across failovers.

Options of both forms, removed here because redis-py would reject them:

- ``prefix``: key namespace (default ``cb``).
- ``min_replicas``: replicas that must confirm each job write (``WAIT``) before the
  broker acknowledges it: a number, or ``all`` (Sentinel URLs only): every replica the
  Sentinels may promote (broker/store/replica_quorum.py). Default 0 for one server
  (nothing to wait for), ``all`` for a Sentinel URL: a failover promotes a replica, so a
  write that replica lacked would be an acknowledged write lost.
- ``replica_wait_ms``: how long a write waits for those confirmations before it is
  answered UNAVAILABLE instead (default 1000).

Why parse by hand: the Sentinel form has several hosts in its netloc, which no URL
library models, and a wrong URL must fail at start-up with a message naming the
mistake, not as a connection error at the first write.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from broker.store.replica_quorum import ReplicaRule

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_PREFIX = "cb"
DEFAULT_REPLICA_WAIT_MS = 1000
_OURS = ("prefix", "min_replicas", "replica_wait_ms")


@dataclass(frozen=True)
class RedisTarget:
    """A parsed store URL. ``url`` is the redis-py URL of a single server ("" for a
    Sentinel target); ``sentinels``/``service``/``db`` describe a Sentinel target."""

    url: str
    prefix: str
    min_replicas: int
    replica_wait_ms: int
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    # ALL: every replica the Sentinels may promote (min_replicas is then its floor, 1)
    replica_rule: ReplicaRule = ReplicaRule.FIXED

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)


def _int_option(url: str, name: str, raw: str, low: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"store URL {url!r}: {name}={raw!r} is not an integer") from None
    if value < low:
        raise ValueError(f"store URL {url!r}: {name} must be >= {low}, got {value}")
    return value


def _replicas_option(url: str, raw: str, sentinel: bool) -> tuple[ReplicaRule, int]:
    """``min_replicas``: a count, or ``all`` (only with Sentinels, who say what "all" is)."""
    if raw.strip().lower() == ReplicaRule.ALL.value:
        if not sentinel:
            raise ValueError(f"store URL {url!r}: min_replicas=all needs a redis+sentinel:// URL "
                             "(the Sentinels say which replicas may be promoted); give a number")
        return ReplicaRule.ALL, 1
    if not raw.strip().lstrip("+-").isdigit():
        raise ValueError(f"store URL {url!r}: min_replicas={raw!r} is not an integer or 'all'")
    return ReplicaRule.FIXED, _int_option(url, "min_replicas", raw, 0)


def _sentinel_hosts(url: str, netloc: str) -> tuple[tuple[str, int], ...]:
    if "@" in netloc:
        raise ValueError(f"store URL {url!r}: Sentinel credentials in the URL are not supported")
    hosts = []
    for item in netloc.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host:
            raise ValueError(f"store URL {url!r}: Sentinel address {item!r} must be HOST:PORT")
        hosts.append((host.strip("[]"), _int_option(url, "Sentinel port", port, 1)))
    return tuple(hosts)


def parse_redis_url(url: str) -> RedisTarget:
    """Parse a Redis store URL; ``ValueError`` names what is wrong with it."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OURS}
    rest = [(k, v) for k, v in query if k not in _OURS]
    prefix = ours.get("prefix", DEFAULT_PREFIX)
    if not prefix:
        raise ValueError(f"store URL {url!r}: prefix must not be empty")
    wait_ms = _int_option(url, "replica_wait_ms",
                          ours.get("replica_wait_ms", str(DEFAULT_REPLICA_WAIT_MS)), 1)
    if parts.scheme != SENTINEL_SCHEME:
        _, replicas = _replicas_option(url, ours.get("min_replicas", "0"), sentinel=False)
        return RedisTarget(urlunsplit(parts._replace(query=urlencode(rest))), prefix,
                           replicas, wait_ms)
    if not parts.netloc:
        raise ValueError(f"store URL {url!r}: no Sentinel addresses "
                         "(redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE)")
    service = parts.path.strip("/")
    if not service or "/" in service:
        raise ValueError(f"store URL {url!r}: name the monitored primary after the hosts "
                         "(redis+sentinel://HOST:PORT,.../SERVICE)")
    extra = dict(rest)
    db = _int_option(url, "db", extra.pop("db", "0"), 0)
    if extra:
        raise ValueError(f"store URL {url!r}: unknown option(s) {sorted(extra)} "
                         f"(known: db, {', '.join(_OURS)})")
    rule, replicas = _replicas_option(url, ours.get("min_replicas", ReplicaRule.ALL.value),
                                      sentinel=True)
    return RedisTarget("", prefix, replicas, wait_ms, _sentinel_hosts(url, parts.netloc),
                       service, db, rule)
