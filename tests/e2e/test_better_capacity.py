"""A proactive move end to end (broker/scheduling/proactive_watch.py): a job whose
recovery policy is ``better-capacity`` trains on on-demand capacity; a training plan is
registered over another region's idle plan nodes; the broker checkpoints the job, moves
it onto the prepaid node and it finishes there, resumed from its own checkpoint.

Real broker process, real agent processes (local executor, one real trainer rank per
node), checkpoints on the local file system.
"""

from __future__ import annotations

import pytest

from brokerctl.main import main
from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_foundation import setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster, wait_until

pytestmark = pytest.mark.slow


def test_a_job_moves_to_a_plan_that_came_free_and_finishes_there(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.start_broker("--set", "proactive_interval_s=0.5", "--set", "proactive_min_dwell_s=0",
                         "--set", "plan_move_floor_s=1")
    cluster.start_agent("us-west-2", nodes=1, gpus=1, capacity_type="training_plan", price=2.5)
    cluster.start_agent("us-east-2", nodes=1, gpus=1, price=4.0)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 2)
        s = spec("saver", steps=40, every=4, sleep=0.4)
        s.labels["cb.recovery-policy"] = "better-capacity"
        handle = client.submit(s)
        wait_until(lambda: (j := handle.status()).phase == pb.JOB_PHASE_RUNNING
                   and j.progress.last_checkpoint_step >= 4, timeout=180,
                   what=f"running on on-demand with a checkpoint\n{cluster.logs()}")
        job = handle.status()
        assert job.placement.region == "us-east-2" and not job.migrations

        rc = main(["--broker", cluster.address, "plans", "create", "--name", "p5-week",
                   "--region", "us-west-2", "--instance-type", "sim.gpu", "--count", "1",
                   "--gpus-per-instance", "1", "--duration", "1d2h"])
        _, err = capsys.readouterr()
        assert rc == 0, err

        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.placement.region == "us-west-2"
        assert job.placement.capacity_type == pb.CAPACITY_TYPE_TRAINING_PLAN
        (m,) = job.migrations
        assert (m.cause, m.from_region, m.to_region, m.emergency) == (
            "better_capacity", "us-east-2", "us-west-2", False)
        assert 4 <= m.checkpoint_step < 40 and m.state == "done"
        ev = next(e for e in client.events(job.id) if e.reason == "better_capacity")
        assert "free prepaid plan capacity" in ev.message and float(ev.details["gain"]) > float(
            ev.details["cost"])
