"""The ranks an attempt really runs reach the broker and every view of the job.

A real broker and a real agent whose node has 4 GPUs but runs one rank per node
(``--ranks-per-node 1``, tests/fixtures/cluster.py): the placement is 4 GPUs, the trainer's
world size is 1. The agent reports the ranks it started (JobUpdate.ranks); the job's
placement, its "running" event, the log header and ``brokerctl job`` say 1 rank, not 4.
"""

from __future__ import annotations

import os
import subprocess
import sys

from computebroker.v1 import common_pb2 as pb
from tests.fixtures.cluster import Cluster, wait_until


def test_ranks_not_gpus_in_the_job_view_and_log_headers(cluster: Cluster) -> None:
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=1, gpus=4)
    with cluster.client() as client:
        client.set_team_quota(team="ml", guaranteed_gpus=16)
        wait_until(lambda: any(r.connected for r in client.regions()), timeout=90,
                   what=f"agent connected\n{cluster.logs()}")
        handle = client.submit(pb.JobSpec(
            name="ranks", team="ml", priority_class="training",
            resources=pb.Resources(nodes=1, gpus_per_node=4),
            trainer=pb.TrainerSpec(total_steps=4, checkpoint_every=2, global_batch_size=4,
                                   model="tiny", options={"log_every": "1"})))
        job = handle.wait(timeout=240)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert (job.placement.world_size, job.placement.ranks) == (4, 1), job.placement
        running = [e for e in client.events(job.id) if e.type == "running"]
        assert running and running[0].details["ranks"] == "1", running
        header = next(r.attempt for r in handle.logs() if r.WhichOneof("kind") == "attempt")
        assert (header.world_size, header.ranks) == (4, 1), header

    env = dict(os.environ, COLUMNS="100", NO_COLOR="1")
    for args, want in ((["logs", job.id], "· 1 rank ·"), (["job", job.id], "1 (on 4 GPUs)")):
        out = subprocess.run([sys.executable, "-m", "brokerctl", "--broker", cluster.address,
                              *args], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert want in out.stdout, out.stdout
