"""Issue 15 defect 4: after a broker pause, agents were declared lost on stale data.

A broker SIGSTOPped for longer than ``agent_timeout_s`` resumes with every agent's
``last_seen`` old: their heartbeats sit unread in its sockets. The first scheduler pass
computed the expired list from that and declared them lost (``silent 0.0s`` in the log,
because the reader thread touched them meanwhile). The registry now notices that its
own expiry check stalled and restarts every agent's grace period, as at start-up.
Real store (SQLite file); the clock is the registry's injectable clock.
"""

from __future__ import annotations

from pathlib import Path

from broker.agents.registry import AgentRegistry
from broker.store.sqlite import SQLiteStore
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

TIMEOUT = 20.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_stalled_broker_restarts_the_agents_grace_instead_of_declaring_them_lost(
        tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "b.sqlite"))
    clock = Clock()
    reg = AgentRegistry(store, clock)
    agent, session = reg.register(apb.Register(agent_id="a1", region="r1",
                                               nodes=[pb.Node(id="n1", gpus=1)]))
    try:
        for _ in range(5):  # normal passes every second, heartbeats arriving
            clock.now += 1.0
            assert reg.touch("a1", session)
            assert reg.expired(TIMEOUT) == []
        clock.now += 21.0  # the broker is paused (SIGSTOP) for longer than the timeout
        assert reg.expired(TIMEOUT) == [], "declared lost on data from before the pause"
        assert not reg.get("a1").lost
        # The agent really is gone this time: passes keep running, no message arrives.
        for _ in range(int(TIMEOUT) + 2):
            clock.now += 1.0
            lost = reg.expired(TIMEOUT)
            if lost:
                break
        assert [a.agent_id for a in lost] == ["a1"], "a silent agent must still expire"
    finally:
        store.close()
