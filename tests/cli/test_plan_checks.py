"""`plans create` refuses a plan no agent node can ever be, and plan dates show the year.

A real TLS broker (tests/broker/harness.py ``Broker``) with a scripted agent that
registers over the real mutual-TLS agent stream: us-east-2 has on-demand nodes only,
us-west-2 has two unlabelled training-plan nodes (p5.48xlarge) and one labelled
``pool: p5-named``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from brokerctl import render
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for
from tests.cli.conftest import run_cli


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(fast_config(tmp_path_factory.mktemp("plans")))
    plan = pb.CAPACITY_TYPE_TRAINING_PLAN
    agents = [
        FakeAgent(b.address, "use2-a", "us-east-2", nodes_for("us-east-2", "use2", 2, 8)),
        FakeAgent(b.address, "usw2-a", "us-west-2",
                  nodes_for("us-west-2", "usw2", 2, 8, capacity_type=plan)
                  + nodes_for("us-west-2", "usw2-named", 1, 8, capacity_type=plan,
                              pool="p5-named")),
    ]
    for a in agents:
        a.connect()
    try:
        yield b
    finally:
        for a in agents:
            a.close()
        b.stop()


def create(capsys, fleet: Broker, *extra: str) -> tuple[int, str, str]:
    kind = () if "--instance-type" in extra else ("--instance-type", "p5.48xlarge")
    return run_cli(capsys, "--broker", fleet.address, "plans", "create", "--count", "1",
                   "--duration", "24h", *kind, *extra)


def test_unknown_region_is_refused_with_the_known_ones(capsys, fleet: Broker) -> None:
    rc, _, err = create(capsys, fleet, "--name", "x", "--region", "mars-1")
    assert rc == 2 and "unknown region 'mars-1'" in err, err
    assert "us-east-2, us-west-2" in err and "--force" in err, err
    rc, _, err = create(capsys, fleet, "--name", "x", "--region", "us-west2")
    assert rc == 2 and "did you mean 'us-west-2'" in err, err


def test_a_plan_no_node_can_back_is_refused(capsys, fleet: Broker) -> None:
    rc, _, err = create(capsys, fleet, "--name", "od", "--region", "us-east-2")
    assert rc == 2 and "no node in us-east-2 can back this plan" in err, err
    rc, _, err = create(capsys, fleet, "--name", "wrong-type", "--region", "us-west-2",
                        "--instance-type", "p4d.24xlarge")
    assert rc == 2 and "no node in us-west-2 can back" in err, err
    assert not [p for p in fleet_plans(fleet) if p in ("od", "wrong-type")]


def test_plans_that_nodes_can_back_are_accepted(capsys, fleet: Broker) -> None:
    rc, out, err = create(capsys, fleet, "--name", "p5-named", "--region", "us-west-2", "-o", "json")
    assert rc == 0, err
    assert json.loads(out)["name"] == "p5-named"
    rc, _, err = create(capsys, fleet, "--name", "p5-adopt", "--region", "us-west-2")
    assert rc == 0, err


def test_force_registers_a_plan_before_its_agent(capsys, fleet: Broker) -> None:
    rc, _, err = create(capsys, fleet, "--name", "later", "--region", "ap-south-9", "--force")
    assert rc == 0, err
    assert "later" in fleet_plans(fleet)


def fleet_plans(fleet: Broker) -> list[str]:
    from brokersdk.client import BrokerClient

    with BrokerClient(fleet.address) as c:
        return [p.name for p in c.plans(include_ended=True)]


def test_plan_dates_show_the_year_when_not_this_year(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        now = 1795500000.0  # 2026-11-24
        assert render.date_time(now + 3600, now=now) == "11-24 07:00"
        assert render.date_time(1893888000.0, now=now) == "2030-01-06 00:00"
        assert render.date_time(0.0) == "-"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_plans_table_of_a_far_plan_names_its_year(capsys, fleet: Broker,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    rc, _, err = create(capsys, fleet, "--name", "far", "--region", "ap-south-9", "--force",
                        "--start", "2030-01-06T00:00:00+00:00")
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "--broker", fleet.address, "plans", "list")
    assert rc == 0, err
    row = next(line for line in out.splitlines() if " far " in line)
    assert "2030-01-0" in row, out
