"""`brokerctl usage --over 6h` against a real TLS broker whose scheduler admitted jobs
onto a scripted agent's priced nodes: per team, queued / admitted / GPUs / spend, at 80
and 100 columns and in a pipe; the window totals are the SDK's (brokersdk/usage.py)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from brokerctl.usage import sparkline
from brokersdk.usage import bucket_seconds, totals
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until
from tests.cli.conftest import run_cli


def test_window_totals_integrate_the_spend_rate_over_the_buckets_inside_the_window() -> None:
    s = cpb.UsageSeries(step_s=60, start_time=1030, end_time=1200, times=[1020, 1080, 1140])
    s.teams.add(team="ml", gpus_used=[8, 8, 4], spend_usd_per_hour=[36, 36, 18],
                admissions=[1, 0, 2], pending_jobs=[3, 1, 0], now_gpus_used=4)
    assert bucket_seconds(s) == [50, 60, 60]
    (t,) = totals(s)
    assert t.spend_usd == pytest.approx((36 * 50 + 36 * 60 + 18 * 60) / 3600)
    assert t.admissions == 3 and t.pending_peak == 3 and t.gpus_peak == 8
    assert t.gpus_mean == pytest.approx((8 * 50 + 8 * 60 + 4 * 60) / 170)


def test_a_sparkline_scales_to_its_own_peak() -> None:
    assert sparkline([0, 4, 8]) == "▁▅█"
    assert sparkline([0, 0]) == "▁▁"
    assert len(sparkline(list(range(100)))) == 24
    # A long window is summarised whole, not cut to its newest buckets.
    assert sparkline([0.0] * 180 + [8.0] * 180) == "▁" * 12 + "█" * 12


@pytest.fixture
def busy_broker(tmp_path: Path):  # noqa: ANN201
    b = Broker(fast_config(tmp_path, usage_sample_s=0.1))
    b.team("ml")
    b.team("vision-research-long-team-name")
    nodes = nodes_for("us-east-2", "u", 2, 8)
    for n in nodes:
        n.price_per_gpu_hour = 2.25
    agent = FakeAgent(b.address, "usage-agent", "us-east-2", nodes).connect()
    jobs = [b.submit(spec("a", gpus=8)),
            b.submit(spec("b", team="vision-research-long-team-name", gpus=4))]
    for j in jobs:
        b.wait_phase(j.id, pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
    wait_until(lambda: all(t.now_gpus_used for t in b.capacity.GetUsageSeries(
        cpb.GetUsageSeriesRequest(window_s=3600)).teams), 10, "both teams holding GPUs")
    try:
        yield b
    finally:
        agent.close()
        b.stop()


@pytest.mark.parametrize("columns", ["80", "100"])
def test_usage_fits_the_terminal_width_and_names_every_team(busy_broker: Broker, capsys,  # noqa: ANN001
                                                            monkeypatch, columns: str) -> None:  # noqa: ANN001
    monkeypatch.setenv("COLUMNS", columns)
    rc, out, err = run_cli(capsys, "--broker", busy_broker.address, "usage", "--over", "6h")
    assert rc == 0, err
    assert all(len(line) <= int(columns) for line in out.splitlines()), out
    flat = " ".join(out.split())
    assert "usage over the last 6h" in flat and "buckets of 1 min" in flat
    # A long team name is whole at 100 columns, folded (never cut) at 80.
    assert ("vision-research-long-team-name" in out) == (columns == "100"), out
    assert "vision-research-long-team-n" in out and "…" not in out, out
    assert "$18.00/h" in flat and "$9.00/h" in flat, out  # 8 and 4 GPUs at $2.25
    assert ("GPUS TREND" in out) == (columns == "100"), out


def test_usage_in_a_pipe_and_as_json(busy_broker: Broker, capsys, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("COLUMNS", raising=False)
    rc, out, err = run_cli(capsys, "--broker", busy_broker.address, "usage")
    assert rc == 0, err
    row = next(line for line in out.splitlines() if line.startswith("ml "))
    assert "8 (avg" in row and "$18.00/h" in row and "GPUS TREND" in out, out
    rc, out, err = run_cli(capsys, "--broker", busy_broker.address, "usage", "--over", "24h",
                           "-o", "json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["step_s"] == 300 and {t["team"] for t in data["teams"]} == {
        "ml", "vision-research-long-team-name"}
    rc, _, err = run_cli(capsys, "--broker", busy_broker.address, "usage", "--over", "2d")
    assert rc == 2 and "at most 24h" in err, err
    with pytest.raises(grpc.RpcError) as refused:  # the broker refuses it too, for other clients
        busy_broker.capacity.GetUsageSeries(cpb.GetUsageSeriesRequest(window_s=2 * 86400))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "24 h" in refused.value.details()


@pytest.mark.parametrize("over", ["48h", "BAD", "0s"])
def test_a_window_the_broker_does_not_keep_is_refused_before_any_call(over: str, capsys,  # noqa: ANN001
                                                                      monkeypatch) -> None:
    """Nothing listens at the address: the refusal must come from the CLI itself (exit 2,
    a message naming the flag), not from a connection attempt or a clamped window."""
    monkeypatch.setenv("CB_SERVER", "127.0.0.1:9")
    rc, out, err = run_cli(capsys, "usage", "--over", over)
    assert rc == 2, (out, err)
    assert "cannot reach" not in err
    assert over in err
