"""GetUsageSeries end to end: a real TLS broker over a real SQLite store, a scripted
agent stream, real tokens. The series counts what the scheduler did (queued jobs,
admissions, GPUs held, spend), answers each caller only with the teams it may read,
refuses bad windows, and is still there after the broker restarts on the same store."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from broker.auth.identity import Role
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

PRICE = 3.5  # $ per GPU-hour of the agent's nodes


def _series(stub, window_s: float = 3600.0, team: str = "") -> cpb.UsageSeries:  # noqa: ANN001
    return stub.GetUsageSeries(cpb.GetUsageSeriesRequest(window_s=window_s, team=team))


def _line(s: cpb.UsageSeries, team: str) -> cpb.TeamUsageSeries | None:
    return next((t for t in s.teams if t.team == team), None)


def _priced_nodes(region: str, prefix: str, count: int, gpus: int) -> list[pb.Node]:
    nodes = nodes_for(region, prefix, count, gpus)
    for n in nodes:
        n.price_per_gpu_hour = PRICE
    return nodes


@pytest.fixture
def broker(tmp_path: Path):  # noqa: ANN201
    b = Broker(fast_config(tmp_path, usage_sample_s=0.1))
    try:
        yield b
    finally:
        b.stop()


def _run_two_teams(b: Broker) -> tuple[FakeAgent, list[pb.Job]]:
    """ml: two 8-GPU jobs queue with no agent, then run; other: one 4-GPU job."""
    b.team("ml")
    b.team("other")
    jobs = [b.submit(spec("a", gpus=8)), b.submit(spec("b", gpus=8)),
            b.submit(spec("c", team="other", gpus=4))]
    # Queued while no region is connected: the series must see the queue.
    wait_until(lambda: (ml := _line(_series(b.capacity), "ml")) and ml.now_pending_jobs == 2,
               10, "the ml queue of 2 in the series")
    agent = FakeAgent(b.address, "series-agent", "us-east-2",
                      _priced_nodes("us-east-2", "series", 3, 8)).connect()
    for j in jobs:
        b.wait_phase(j.id, pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
    return agent, jobs


def test_the_series_counts_queue_admissions_gpus_and_spend(broker: Broker) -> None:
    b = broker
    agent, _ = _run_two_teams(b)
    try:
        def held() -> cpb.UsageSeries | None:
            s = _series(b.capacity)
            ml, other = _line(s, "ml"), _line(s, "other")
            return s if ml and other and ml.now_gpus_used == 16 and other.now_gpus_used == 4 \
                else None

        s = wait_until(held, 10, "the GPUs held in the newest sample")
        ml, other = _line(s, "ml"), _line(s, "other")
        assert ml is not None and other is not None
        assert s.step_s == 10 and s.sample_interval_s == pytest.approx(0.1)
        assert s.latest_time <= s.end_time and s.latest_time > s.end_time - 10
        n = len(s.times)
        assert n >= 1 and all(len(x) == n for x in (ml.pending_jobs, ml.admissions, ml.gpus_used,
                                                    ml.spend_usd_per_hour))
        assert list(s.times) == sorted(s.times) and s.start_time < s.times[-1] + s.step_s
        assert sum(ml.admissions) == 2 and sum(other.admissions) == 1
        assert max(ml.pending_jobs) > 0  # the queue before the agent came (a bucket's mean)
        assert ml.now_pending_jobs == 0 and ml.now_spend_usd_per_hour == pytest.approx(16 * PRICE)
        assert other.now_spend_usd_per_hour == pytest.approx(4 * PRICE)
        # Bucket values are means of the samples: GPUs between 0 and what is held now,
        # spend their GPUs at the nodes' price.
        assert 0 < ml.gpus_used[-1] <= 16 and 0 < other.gpus_used[-1] <= 4
        for g, usd in zip(ml.gpus_used, ml.spend_usd_per_hour, strict=True):
            assert usd == pytest.approx(g * PRICE)
        # A wider window is served from a coarser tier, with the same admissions.
        wide = _series(b.capacity, 6 * 3600)
        assert wide.step_s == 60 and sum(_line(wide, "ml").admissions) == 2
        day = _series(b.capacity, 24 * 3600)
        assert day.step_s == 300 and sum(_line(day, "other").admissions) == 1
    finally:
        agent.close()


def test_each_caller_reads_only_the_teams_it_may(broker: Broker) -> None:
    b = broker
    agent, _ = _run_two_teams(b)
    try:
        wait_until(lambda: len(_series(b.capacity).teams) == 2, 10, "both teams' lines")
        member = b.stubs_as("alice", Role.MEMBER, "ml").capacity
        assert [t.team for t in _series(member).teams] == ["ml"]
        assert [t.team for t in _series(member, team="ml").teams] == ["ml"]
        with pytest.raises(grpc.RpcError) as e:
            _series(member, team="other")
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "only for its own team" in e.value.details()
        team_admin = b.stubs_as("tom", Role.TEAM_ADMIN, "other").capacity
        assert [t.team for t in _series(team_admin).teams] == ["other"]
        operator = b.stubs_as("olga", Role.OPERATOR, "").capacity
        assert [t.team for t in _series(operator).teams] == ["ml", "other"]
        assert [t.team for t in _series(operator, team="other").teams] == ["other"]
        with pytest.raises(grpc.RpcError) as e:
            _series(b.anonymous().capacity)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        agent.close()


@pytest.mark.parametrize("window", [-1.0, float("nan"), 25 * 3600.0])
def test_a_bad_window_is_refused_with_a_reason(broker: Broker, window: float) -> None:
    with pytest.raises(grpc.RpcError) as e:
        _series(broker.capacity, window)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "window_s" in e.value.details()


def test_the_series_survives_a_broker_restart_on_the_same_store(tmp_path: Path) -> None:
    config = fast_config(tmp_path, usage_sample_s=0.1)
    b = Broker(config)
    try:
        agent, _ = _run_two_teams(b)
        wait_until(lambda: sum(_line(_series(b.capacity), "ml").admissions) == 2, 10,
                   "two ml admissions")
        before = _series(b.capacity, 6 * 3600)
        agent.close()
    finally:
        b.stop()  # the leader saves the series as it stops
    again = Broker(config)
    try:
        after = _series(again.capacity, 6 * 3600)
        ml_before, ml_after = _line(before, "ml"), _line(after, "ml")
        assert ml_after is not None and ml_before is not None
        assert set(before.times) <= set(after.times)
        assert sum(ml_after.admissions) == sum(ml_before.admissions) == 2
        assert max(ml_after.gpus_used) > 0
    finally:
        again.stop()
