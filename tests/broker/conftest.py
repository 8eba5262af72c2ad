"""Fixtures for broker tests: a real broker server and fake agents."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(fast_config(tmp_path))
    yield b
    b.stop()


@pytest.fixture
def make_agent(broker: Broker) -> Iterator[Callable[..., FakeAgent]]:
    agents: list[FakeAgent] = []

    def make(region: str = "us-east-2", *, agent_id: str = "", nodes: int = 2, gpus: int = 8,
             connect: bool = True, **kw: Any) -> FakeAgent:
        aid = agent_id or f"{region}-a"
        a = FakeAgent(broker.address, aid, region, nodes_for(region, aid, nodes, gpus),
                      bucket=kw.pop("bucket", f"s3://cb-{region}"), **kw)
        agents.append(a)
        if connect:
            a.connect()
        return a

    yield make
    for a in agents:
        a.close()
