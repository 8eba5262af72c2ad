"""Money: the broker charges GPUs x price as phases end (lifecycle.charge_money), and
`brokerctl cost` groups it per team, user, region and capacity type with what moves saved."""

from __future__ import annotations

import os

import pytest
from rich.console import Console

from broker.jobs.outcome import begin
from brokerctl import cost
from computebroker.v1 import common_pb2 as pb

H = 3600.0
T0 = 1000.0


def running(price: float, gpus: int = 8, ctype: int = pb.CAPACITY_TYPE_SPOT,
            region: str = "us-west-2") -> pb.Job:
    return pb.Job(id="j-1", phase=pb.JOB_PHASE_RUNNING, attempt=1, phase_time=T0, created_time=T0,
                  spec=pb.JobSpec(name="c", team="ml"), owner="user:alice",
                  placement=pb.Placement(region=region, world_size=gpus, capacity_type=ctype,
                                         price_per_gpu_hour=price))


def test_an_hour_of_8_spot_gpus_at_2_dollars_costs_16() -> None:
    tx = begin(running(2.0), T0 + H)
    tx.move(pb.JOB_PHASE_SUCCEEDED, "succeeded")
    g = tx.job.goodput
    assert g.cost_usd == pytest.approx(16.0)
    assert dict(g.cost_by_capacity) == pytest.approx({"spot": 16.0})
    assert dict(g.cost_by_region) == pytest.approx({"us-west-2": 16.0})
    assert g.saved_usd == 0.0


def test_a_move_to_cheaper_capacity_saves_the_difference_while_it_runs_there() -> None:
    job = running(2.0, ctype=pb.CAPACITY_TYPE_TRAINING_PLAN)
    job.attempt = 2
    job.migrations.add(from_world_size=8, from_price_per_gpu_hour=4.0, to_attempt=2,
                       to_world_size=8, to_price_per_gpu_hour=2.0, state="done")
    tx = begin(job, T0 + 2 * H)
    tx.move(pb.JOB_PHASE_SUCCEEDED, "succeeded")
    assert tx.job.goodput.cost_usd == pytest.approx(32.0)
    assert tx.job.goodput.saved_usd == pytest.approx(32.0)  # 2 h x 8 GPUs x ($4 - $2)


def jobs() -> list[pb.Job]:
    a = pb.Job(id="j-a", phase=pb.JOB_PHASE_SUCCEEDED, created_time=100.0, finished_time=200.0,
               spec=pb.JobSpec(team="ml"), owner="user:alice",
               goodput=pb.Goodput(cost_usd=30.0, saved_usd=6.0,
                                  cost_by_capacity={"spot": 10.0, "on_demand": 20.0},
                                  cost_by_region={"us-west-2": 10.0, "us-east-2": 20.0}))
    b = pb.Job(id="j-b", phase=pb.JOB_PHASE_RUNNING, created_time=150.0, phase_time=1000.0,
               spec=pb.JobSpec(team="research"), owner="user:bob",
               placement=pb.Placement(region="eu-west-1", world_size=4, price_per_gpu_hour=2.5,
                                      capacity_type=pb.CAPACITY_TYPE_ON_DEMAND))
    old = pb.Job(id="j-old", phase=pb.JOB_PHASE_SUCCEEDED, created_time=1.0, finished_time=2.0,
                 spec=pb.JobSpec(team="ml"), goodput=pb.Goodput(cost_usd=99.0,
                                                                cost_by_capacity={"spot": 99.0}))
    return [a, b, old]


def test_cost_report_groups_and_counts_the_running_phase() -> None:
    now = 1000.0 + H  # j-b has run 1 h at 4 x $2.50
    by_team = cost.report(jobs(), "team", since=50.0, now=now)
    assert set(by_team) == {"ml", "research"}  # j-old ended before the period
    assert by_team["ml"].usd == pytest.approx(30.0) and by_team["ml"].saved == pytest.approx(6.0)
    assert by_team["research"].usd == pytest.approx(10.0)
    assert by_team["research"].by_capacity["on_demand"] == pytest.approx(10.0)
    assert set(cost.report(jobs(), "user", 50.0, now)) == {"alice", "bob"}
    by_region = cost.report(jobs(), "region", 50.0, now)
    assert {k: r.usd for k, r in by_region.items()} == pytest.approx(
        {"us-west-2": 10.0, "us-east-2": 20.0, "eu-west-1": 10.0})
    by_cap = cost.report(jobs(), "capacity", 50.0, now)
    assert {k: r.usd for k, r in by_cap.items()} == pytest.approx({"spot": 10.0, "on_demand": 30.0})


@pytest.mark.parametrize("width", [80, 100])
def test_cost_table_fits(width: int) -> None:
    rows = cost.report(jobs(), "team", 50.0, 1000.0 + H)
    with open(os.devnull, "w") as sink:
        c = Console(width=width, record=True, color_system=None, file=sink)
        c.print(cost.table(rows, "team"))
    text = c.export_text()
    assert all(len(line) <= width for line in text.splitlines()), text
    assert "…" not in text, text
    total = next(line for line in text.splitlines() if line.startswith("total"))
    assert "40.00" in total and "6.00" in total, text
