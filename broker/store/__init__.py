"""State stores behind one narrow interface (docs/architecture.md "State and leadership").

``open_store(url)`` is the one way the broker gets a store, so the config holds a
single URL string and swapping SQLite for Redis is a config change, not a code change.
"""

from __future__ import annotations

from broker.store.base import (
    KIND_AGENT,
    KIND_PLAN,
    KIND_REGION,
    KIND_TEAM,
    AlreadyExists,
    NotFound,
    Store,
    StoreError,
    VersionConflict,
)

_SQLITE_PREFIX = "sqlite:///"


def open_store(url: str) -> Store:
    """Open a store from a URL.

    - ``sqlite:///var/broker.sqlite``: relative to the current directory
      (SQLAlchemy convention: three slashes then the path, so
      ``sqlite:////abs/path.sqlite`` is absolute); parent directories are created.
    - ``sqlite:///:memory:``: throwaway in-process store (tests).
    - ``redis://host:port/db?prefix=cb`` (or ``rediss://``): the HA store; ``prefix``
      namespaces every key (default ``cb``).
    - ``redis+sentinel://H:P[,H:P...]/SERVICE?prefix=cb``: the primary Sentinel names,
      followed across failovers, each job write confirmed by a replica
      (``min_replicas``, ``replica_wait_ms``: broker/store/redis_url.py).
    """
    if url.startswith(_SQLITE_PREFIX):
        from broker.store.sqlite import SQLiteStore

        path = url[len(_SQLITE_PREFIX):]
        if not path:
            raise ValueError(f"store URL {url!r} has no file path (use sqlite:///:memory:)")
        return SQLiteStore(path)
    if url.startswith(("redis://", "rediss://", "unix://", "redis+sentinel://")):
        from broker.store.redis import RedisStore

        return RedisStore(url)
    raise ValueError(
        f"unsupported store URL {url!r}: expected sqlite:///PATH, redis://HOST:PORT/DB"
        " or redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE"
    )


__all__ = [
    "KIND_AGENT",
    "KIND_PLAN",
    "KIND_REGION",
    "KIND_TEAM",
    "AlreadyExists",
    "NotFound",
    "Store",
    "StoreError",
    "VersionConflict",
    "open_store",
]
