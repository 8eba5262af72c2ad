"""A training plan is real capacity end to end (broker/scheduling/plan_binding.py).

Real broker process, real agent processes (local executor, one trainer rank per node).
us-west-2's agent reports one node group of capacity type ``training_plan`` with no plan
label, as a new user's inventory would; us-east-2 has on-demand capacity. A job that
asks for training-plan capacity only waits while no plan covers those nodes, and runs
on the plan's node once ``brokerctl plans create`` registers an active plan there.
"""

from __future__ import annotations

import pytest

from brokerctl.main import main
from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_foundation import setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster, wait_until

pytestmark = pytest.mark.slow


def test_job_on_training_plan_capacity_runs_on_the_plans_nodes(
        cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    cluster.start_broker()
    cluster.start_agent("us-west-2", nodes=1, gpus=1, capacity_type="training_plan", price=2.5)
    cluster.start_agent("us-east-2", nodes=1, gpus=1, price=4.0)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 2)
        s = spec("on-plan", steps=6, every=3)
        s.capacity_types.append(pb.CAPACITY_TYPE_TRAINING_PLAN)
        handle = client.submit(s)
        # No plan covers the plan nodes yet: pending, with a reason that says why.
        wait_until(lambda: handle.status().pending_reason, timeout=120,
                   what=f"a pending reason\n{cluster.logs()}")
        job = handle.status()
        assert job.phase == pb.JOB_PHASE_PENDING and "training_plan" in job.pending_reason, job

        rc = main(["--broker", cluster.address, "plans", "create", "--name", "p5-week",
                   "--region", "us-west-2", "--instance-type", "sim.gpu", "--count", "1",
                   "--gpus-per-instance", "1",
                   "--duration", "1d2h"])  # outlasts the job's unknown safe point (1 h)
        out, err = capsys.readouterr()
        assert rc == 0, err
        plan = next(p for p in client.plans() if p.name == "p5-week")

        wait_until(lambda: handle.status().phase != pb.JOB_PHASE_PENDING, timeout=180,
                   what=f"the job leaves PENDING: {handle.status().pending_reason}\n{cluster.logs()}")
        job = handle.wait(timeout=240)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.placement.region == "us-west-2"
        assert [n.node_id for n in job.placement.nodes] == ["us-west-2-n-000"]
        assert job.placement.capacity_type == pb.CAPACITY_TYPE_TRAINING_PLAN
        assert job.placement.pool == plan.id

        rows = client.capacity(region="us-west-2").rows
        assert [(r.capacity_type, r.pool) for r in rows] == [
            (pb.CAPACITY_TYPE_TRAINING_PLAN, plan.id)]
        rc = main(["--broker", cluster.address, "capacity", "--region", "us-west-2"])
        out, _ = capsys.readouterr()
        assert rc == 0 and f"plan:{plan.id}" in out, out
