"""One usage view: what operators see (ListTeams / GetTeamQuota / ``brokerctl teams``)
is the scheduler's own per-(team, accelerator) accounting over its snapshot.

Two accelerators, borrowing on one of them: team ``a`` is guaranteed 16 H100s and no
A100s and runs an 8-GPU A100 job, borrowed from ``b``. Summing guarantees across
accelerators (what CapacityService did before) would show ``a`` borrowing nothing.
"""

from __future__ import annotations

import json

import placement
from brokerctl.main import main
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, nodes_for, spec, wait_until


def quota(team: str, **gpus: int) -> cpb.TeamQuota:
    return cpb.TeamQuota(team=team, cohort="c", strategy=cpb.LENDING_STRATEGY_LEND_AND_BORROW,
                         quotas=[cpb.QuotaEntry(accelerator=acc, guaranteed_gpus=n) for acc, n in gpus.items()])


def test_teams_equal_the_scheduler_view_with_two_accelerators_and_borrowing(broker: Broker, capsys) -> None:  # noqa: ANN001
    for q in (quota("a", h100=16, a100=0), quota("b", h100=8, a100=8)):
        broker.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=q))
    agents = [
        FakeAgent(broker.address, "h-a", "us-east-2", nodes_for("us-east-2", "h", 3, 8)).connect(),
        FakeAgent(broker.address, "a-a", "us-west-2",
                  nodes_for("us-west-2", "a", 1, 8, accelerator="a100")).connect(),
    ]
    try:
        jobs = [
            (agents[1], broker.submit(spec("a-a100", team="a", nodes=1, gpus=8,
                                           resources=pb.Resources(nodes=1, gpus_per_node=8,
                                                                  accelerator="a100")))),
            (agents[0], broker.submit(spec("a-h100", team="a", nodes=1, gpus=8,
                                           resources=pb.Resources(nodes=1, gpus_per_node=8,
                                                                  accelerator="h100")))),
            (agents[0], broker.submit(spec("b-h100", team="b", nodes=1, gpus=8,
                                           resources=pb.Resources(nodes=1, gpus_per_node=8,
                                                                  accelerator="h100")))),
        ]
        for agent, job in jobs:
            agent.wait_launch(job.id)
            agent.update(job.id, 1, apb.ATTEMPT_STATE_RUNNING, step=1)
            broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)

        def settled() -> dict[str, placement.TeamUsage] | None:
            snap = broker.server.scheduler.last_snapshot
            view = placement.team_usage(snap) if snap else {}
            return view if sum(t.used for t in view.values()) == 24 else None

        view = wait_until(settled, 10, "the scheduler's snapshot with all three jobs")
        assert (view["a"].used, view["a"].borrowed, view["b"].lent) == (16, 8, 8)
        a100 = {r.accelerator: r for r in view["a"].resources}["a100"]
        assert (a100.used, a100.borrowed) == (8, 8)

        listed = {t.team: t for t in broker.capacity.ListTeams(cpb.ListTeamsRequest()).teams}
        for name, want in view.items():
            got = listed[name]
            assert (got.used_gpus, got.borrowed_gpus, got.lent_gpus) == (want.used, want.borrowed, want.lent)
            # ... and per accelerator line (the console's queue page)
            assert sorted((u.accelerator, u.guaranteed_gpus, u.used_gpus, u.borrowed_gpus,
                           u.lent_gpus, u.pending_gpus) for u in got.usage) == sorted(
                (r.accelerator, r.guaranteed, r.used, r.borrowed, r.lent, r.pending)
                for r in want.resources)
            one = broker.capacity.GetTeamQuota(cpb.GetTeamQuotaRequest(team=name))
            assert (one.used_gpus, one.borrowed_gpus, one.lent_gpus) == (want.used, want.borrowed, want.lent)

        assert main(["--broker", broker.address, "teams", "-o", "json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        rows = rows.get("teams", rows) if isinstance(rows, dict) else rows
        cli = {r["team"]: r for r in rows}
        for name, want in view.items():
            assert (cli[name].get("used_gpus", 0), cli[name].get("borrowed_gpus", 0),
                    cli[name].get("lent_gpus", 0)) == (want.used, want.borrowed, want.lent)
        # GetCapacity's borrowed column adds up to the teams' borrowing.
        rows = broker.capacity.GetCapacity(cpb.GetCapacityRequest()).rows
        assert sum(r.borrowed_gpus for r in rows) == sum(t.borrowed for t in view.values())
        # ... and so do its nodes' (the console's heat map marks borrowed GPUs per node).
        nodes = broker.capacity.GetCapacity(cpb.GetCapacityRequest(include_nodes=True)).nodes
        assert sum(n.borrowed_gpus for n in nodes) == sum(t.borrowed for t in view.values())
        assert all(n.borrowed_gpus <= n.allocated_gpus for n in nodes)
        # Each launch names the capacity type it runs on (the console's timeline colours).
        for _, job in jobs:
            launched = [e for e in broker.events(job.id) if e.type == "launched"]
            assert [e.details["capacity_type"] for e in launched] == [
                str(pb.CAPACITY_TYPE_ON_DEMAND)]
    finally:
        for a in agents:
            a.close()
