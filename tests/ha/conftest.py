"""The HA tests' cluster: brokers on one real redis-server with a short leader lease."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.cluster import Cluster
from tests.fixtures.redis_server import RedisServer
from tests.ha.helpers import LEASE_S


@pytest.fixture
def ha_cluster(tmp_path: Path, redis_server: RedisServer) -> Iterator[Cluster]:
    c = Cluster(root=tmp_path,
                store_url=f"{redis_server.url}?prefix=ha{uuid.uuid4().hex[:10]}",
                broker_args=["--set", f"leader_lease_s={LEASE_S}"])
    try:
        yield c
    finally:
        # A test may leave a broker SIGSTOPped: resume it so it can be stopped.
        for p in [c.broker, *c.replicas.values()]:
            if p is not None and p.popen is not None and p.popen.poll() is None:
                p.popen.send_signal(signal.SIGCONT)
        c.stop()
