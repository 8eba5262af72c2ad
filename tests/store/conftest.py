"""Store fixtures: ``store`` runs each conformance test against SQLite and Redis.

``store_factory`` opens a *second* store on the same data (a restarted broker or a
second replica), which is how tests check that state lives in the store, not in RAM.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from broker.store import Store
from broker.store.redis import RedisStore
from broker.store.sqlite import SQLiteStore


@pytest.fixture(params=["sqlite", "redis"])
def store_factory(request, tmp_path) -> Iterator[Callable[[], Store]]:
    """Returns a function opening a new store instance over one shared backing state."""
    opened: list[Store] = []
    if request.param == "sqlite":
        path = str(tmp_path / "state" / "broker.sqlite")

        def make() -> Store:
            s = SQLiteStore(path)
            opened.append(s)
            return s
    else:
        server = request.getfixturevalue("redis_server")
        url = f"{server.url}?prefix=t{uuid.uuid4().hex[:12]}"

        def make() -> Store:
            s = RedisStore(url)
            opened.append(s)
            return s

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def store(store_factory) -> Store:
    return store_factory()
