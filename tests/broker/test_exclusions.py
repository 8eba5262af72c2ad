"""Nodes avoided after a failure never strand a job (broker/scheduling/exclusions.py).

Found by the 200-job SQLite fault campaign: two 2-node on-demand jobs each excluded one
node in both 2-node on-demand regions and stayed PENDING on an idle fleet."""

from __future__ import annotations

from pathlib import Path

import placement
from broker.config import BrokerConfig
from broker.jobs.transitions import exclusions_forgiven
from broker.scheduling.exclusions import to_forgive
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from placement.model import CapacityType
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

SPOT = CapacityType.SPOT


def _nodes(agent: str, count: int, ctype: CapacityType = CapacityType.ON_DEMAND) -> list[placement.NodeInfo]:
    return [placement.NodeInfo(id=f"{agent}-n{i}", agent_id=agent, region=f"r-{agent}", zone="z",
                               gpus=1, capacity_type=ctype) for i in range(count)]


def _job(job_id: str, excluded: list[str]) -> pb.Job:
    return pb.Job(id=job_id, phase=pb.JOB_PHASE_PENDING, excluded_nodes=excluded)


def _snapshot(nodes: list[placement.NodeInfo], *reqs: placement.JobRequest) -> placement.Snapshot:
    return placement.Snapshot(now=0.0, nodes=tuple(nodes), running=(), pending=reqs)


def _req(job_id: str, excluded: list[str], nodes: int = 2, **kw: object) -> placement.JobRequest:
    return placement.JobRequest(id=job_id, team="t", priority=0, nodes=nodes, gpus_per_node=1,
                                excluded_nodes=frozenset(excluded), **kw)  # type: ignore[arg-type]


def test_blocked_only_by_its_exclusions_forgives_the_fewest_oldest_first() -> None:
    nodes = _nodes("a", 2) + _nodes("b", 2) + _nodes("s", 4, SPOT)  # spot is not asked for
    excluded = ["b-n1", "a-n0"]  # b-n1 was avoided first
    out = to_forgive(_snapshot(nodes, _req("j", excluded)), {"j": _job("j", excluded)})
    assert out == {"j": ("b-n1",)}


def test_a_cluster_that_could_hold_it_keeps_the_exclusions() -> None:
    # c has two nodes nobody excluded: the job waits for occupancy, not for a failed node.
    nodes = _nodes("a", 2) + _nodes("b", 2) + _nodes("c", 2)
    excluded = ["a-n0", "b-n0"]
    assert to_forgive(_snapshot(nodes, _req("j", excluded)), {"j": _job("j", excluded)}) == {}


def test_elastic_minimum_and_unhealthy_nodes() -> None:
    nodes = _nodes("a", 2)
    excluded = ["a-n0"]
    # An elastic job that can run on 1 node fits on a-n1: nothing to forgive.
    elastic = _req("e", excluded, nodes=2, min_nodes=1, max_nodes=2)
    assert to_forgive(_snapshot(nodes, elastic), {"e": _job("e", excluded)}) == {}
    # An unhealthy node is not capacity: forgiving a-n0 would not make room for 2 nodes.
    sick = [nodes[0], placement.NodeInfo(id="a-n1", agent_id="a", region="r-a", zone="z", gpus=1,
                                         healthy=False)]
    assert to_forgive(_snapshot(sick, _req("j", excluded)), {"j": _job("j", excluded)}) == {}


def test_nodes_left_out_for_other_reasons_are_not_forgiven() -> None:
    # a-n1 is left out because its agent refused the launch lately (not in the job record).
    nodes = _nodes("a", 2)
    req = _req("j", ["a-n0", "a-n1"])
    assert to_forgive(_snapshot(nodes, req), {"j": _job("j", ["a-n0"])}) == {}


def test_training_plan_nodes_left_as_a_plan_ends_are_not_forgiven() -> None:
    plan = [placement.NodeInfo(id=f"p-n{i}", agent_id="p", region="r-p", zone="z", gpus=1,
                               capacity_type=CapacityType.TRAINING_PLAN) for i in range(2)]
    excluded = ["p-n0", "p-n1"]  # plan_watch moved the job off an ending plan
    assert to_forgive(_snapshot(plan, _req("j", excluded)), {"j": _job("j", excluded)}) == {}


def test_broker_relaunches_on_a_forgiven_node_and_says_why(tmp_path: Path) -> None:
    """Two on-demand clusters of 2 nodes and a spot one: a 2-node on-demand job fails once
    in each, blamed on one node each time; it runs again (attempt 3) instead of waiting."""
    b = Broker(fast_config(tmp_path, max_restarts=5))
    agents = []
    try:
        b.team()
        agents = [FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 2, 1)).connect(),
                  FakeAgent(b.address, "a2", "r2", nodes_for("r2", "a2", 2, 1)).connect(),
                  FakeAgent(b.address, "a3", "r3", nodes_for(
                      "r3", "a3", 2, 1, capacity_type=pb.CAPACITY_TYPE_SPOT)).connect()]
        job = b.submit(spec("x", nodes=2, gpus=1))
        blamed = []

        def launched_on(attempt: int) -> FakeAgent | None:
            return next((a for a in agents for c in a.commands("launch", job.id)
                         if c.attempt == attempt), None)

        for attempt in (1, 2):
            agent = wait_until(lambda n=attempt: launched_on(n), 30, f"launch {attempt}")
            launch = agent.wait_launch(job.id, attempt)
            agent.update(job.id, attempt, apb.ATTEMPT_STATE_STARTING)
            agent.update(job.id, attempt, apb.ATTEMPT_STATE_RUNNING, step=1)
            b.wait_phase(job.id, pb.JOB_PHASE_RUNNING, timeout=30)
            blamed.append(launch.placement.nodes[0].node_id)
            agent.update(job.id, attempt, apb.ATTEMPT_STATE_FAILED, exit_code=1, message="boom",
                         failed_nodes=[blamed[-1]])
        third = wait_until(lambda: launched_on(3), 30, "attempt 3 launched")
        launch = third.wait_launch(job.id, 3)
        placed = {n.node_id for n in launch.placement.nodes}
        assert blamed[0] in placed  # the longest-avoided node was tried again
        assert third.agent_id != "a3"  # never on spot capacity it did not ask for
        got = b.get(job.id)
        assert list(got.excluded_nodes) == [blamed[1]]
        forgiven = [e for e in b.events(job.id) if e.reason == "no_other_capacity"]
        assert len(forgiven) == 1 and blamed[0] in forgiven[0].message
    finally:
        for a in agents:
            a.close()
        b.stop()


def test_a_moved_job_waiting_for_its_new_home_is_forgiven_too() -> None:
    # MIGRATING waits for placement as PENDING does; before, only PENDING was forgiven and a
    # moved gang blocked by its own exclusions waited forever.
    for phase in (pb.JOB_PHASE_PENDING, pb.JOB_PHASE_MIGRATING):
        job = pb.Job(id="j", phase=phase, excluded_nodes=["a-n0", "b-n1"])
        out = exclusions_forgiven(job, ("a-n0",), 10.0, BrokerConfig())
        assert out is not None, phase
        assert list(out.job.excluded_nodes) == ["b-n1"]
    running = pb.Job(id="j", phase=pb.JOB_PHASE_RUNNING, excluded_nodes=["a-n0"])
    assert exclusions_forgiven(running, ("a-n0",), 10.0, BrokerConfig()) is None
