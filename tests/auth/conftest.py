"""A real broker over TLS on loopback, shared by a module's auth tests (a broker start
is the slow part; every test makes its own users, teams and jobs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.harness import Broker, fast_config


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(fast_config(Path(tmp_path_factory.mktemp("auth-broker"))))
    b.team("ml", gpus=16)
    b.team("other", gpus=16)
    try:
        yield b
    finally:
        b.stop()
