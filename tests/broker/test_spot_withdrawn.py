"""A spot notice that is withdrawn before its deadline gives the node back: the broker
had taken it out of the fleet for the notice, and nothing else would ever restore it
(the agent's own health never changed). Real broker, scripted agent over the real stream."""

from __future__ import annotations

import time

from computebroker.v1 import agent_pb2 as apb
from tests.broker.harness import Broker, wait_until


def healthy(broker: Broker, node: str) -> bool:
    from computebroker.v1 import capacity_pb2 as cpb

    resp = broker.capacity.GetCapacity(cpb.GetCapacityRequest(include_nodes=True))
    return next(u.node.healthy for u in resp.nodes if u.node.id == node)


def beat(agent, *notices: str, health: tuple[tuple[str, bool], ...] = ()) -> None:  # noqa: ANN001
    agent.send(apb.AgentMessage(heartbeat=apb.Heartbeat(
        time=time.time(),
        spot_notices=[apb.SpotNotice(node_id=n, deadline_time=time.time() + 120) for n in notices],
        node_health=[apb.NodeHealth(node_id=n, healthy=h) for n, h in health])))


def test_a_withdrawn_notice_makes_the_node_healthy_again(broker: Broker, make_agent) -> None:  # noqa: ANN001
    agent = make_agent("us-east-2", heartbeat=False)
    node = agent.nodes[0].id
    beat(agent, node)
    wait_until(lambda: not healthy(broker, node), 20, "the noticed node out of the fleet")
    beat(agent, node)  # still active: stays out
    time.sleep(0.5)
    assert not healthy(broker, node)
    beat(agent)  # withdrawn
    wait_until(lambda: healthy(broker, node), 20, "the node back after the withdrawal")


def test_a_reclaimed_node_stays_out_until_the_agent_says_healthy(broker: Broker,
                                                                  make_agent) -> None:  # noqa: ANN001
    agent = make_agent("us-east-2", heartbeat=False)
    node = agent.nodes[1].id
    beat(agent, node)
    wait_until(lambda: not healthy(broker, node), 20, "the noticed node out of the fleet")
    # The deadline passed: the agent itself reports the node unhealthy, then the notice
    # goes away (the instance is gone): it stays out.
    beat(agent, node, health=((node, False),))
    beat(agent)
    time.sleep(0.5)
    assert not healthy(broker, node)
    beat(agent, health=((node, True),))  # replaced / came back
    wait_until(lambda: healthy(broker, node), 20, "the node back when the agent says so")
