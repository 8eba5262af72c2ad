"""End to end: the HyperPod task-governance scenario (issue: Placement and task governance).

Real broker, one real agent (2 simulated nodes x 8 GPUs), real trainer processes.
Team A and Team B are each guaranteed one 8-GPU node, in one cohort, lending and
borrowing allowed.

1. A submits a 2-node training job (elastic 1..2 nodes): it runs on both nodes,
   borrowing B's.
2. B submits a 1-node training job: A's job is checkpointed and suspended (A must
   give back what it borrowed), B's job runs; A's job comes back on its own
   guaranteed node, resharded to 1 node.
3. B submits an experimentation job (priority 80 > 70): nothing is free and A is
   within its guarantee, so B's own training job is checkpointed and suspended.
4. Everything finishes; every suspended job resumed from its checkpoint, not step 0.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.fixtures.cluster import ROOT, Cluster, wait_until

pytestmark = pytest.mark.slow


def job_spec(name: str, team: str, *, nodes: int, steps: int, priority: str = "training",
             min_nodes: int = 0, max_nodes: int = 0, sleep: float = 0.2) -> pb.JobSpec:
    return pb.JobSpec(
        name=name, team=team, priority_class=priority,
        resources=pb.Resources(nodes=nodes, gpus_per_node=8),
        elasticity=pb.Elasticity(min_nodes=min_nodes, max_nodes=max_nodes),
        trainer=pb.TrainerSpec(total_steps=steps, checkpoint_every=3, global_batch_size=8,
                               seed=11, model="tiny", step_sleep_s=sleep),
    )


def events(client: object, job_id: str) -> list[pb.JobEvent]:
    return list(client.job(job_id).events(follow=False))  # type: ignore[attr-defined]


def preempted_by(client: object, victim: str, beneficiary: str) -> bool:
    return any(e.type == "preempted" and e.details.get("for_job") == beneficiary
               for e in events(client, victim))


def brokerctl(cluster: Cluster, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "brokerctl", "--broker", cluster.address, *args],
                         cwd=ROOT, capture_output=True, text=True, env={**cluster.env(), "COLUMNS": "100"},
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_hyperpod_task_governance_scenario(cluster: Cluster) -> None:
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=2, gpus=8)
    with cluster.client() as client:
        for team in ("team-a", "team-b"):
            client.set_team_quota(team=team, cohort="research", guaranteed=8)
        wait_until(lambda: any(r.connected for r in client.regions()), timeout=90,
                   what=f"agent connected\n{cluster.logs()}")

        # 1. A borrows B's idle node.
        a = client.submit(job_spec("a-train", "team-a", nodes=2, steps=45, min_nodes=1, max_nodes=2))
        wait_until(lambda: a.status().phase == pb.JOB_PHASE_RUNNING
                   and a.status().progress.last_checkpoint_step >= 3,
                   timeout=180, what=f"A running with a checkpoint\n{cluster.logs()}")
        assert len(a.status().placement.nodes) == 2
        teams = {t.team: t for t in client.teams()}
        assert teams["team-a"].borrowed_gpus == 8, teams["team-a"]
        assert teams["team-b"].lent_gpus == 8, teams["team-b"]
        assert "team-a" in brokerctl(cluster, "teams")

        # 2. B reclaims its node: A is checkpointed and suspended, B runs.
        b_train = client.submit(job_spec("b-train", "team-b", nodes=1, steps=45))
        wait_until(lambda: preempted_by(client, a.id, b_train.id), timeout=120,
                   what=f"A preempted for B's training job\n{cluster.logs()}")
        wait_until(lambda: b_train.status().phase == pb.JOB_PHASE_RUNNING
                   and b_train.status().progress.last_checkpoint_step >= 3,
                   timeout=180, what=f"B's training job running\n{cluster.logs()}")
        a_phases = [e.to_phase for e in events(client, a.id)]
        assert pb.JOB_PHASE_CHECKPOINTING in a_phases and pb.JOB_PHASE_SUSPENDED in a_phases
        # A comes back within its own guarantee, resharded to one node.
        wait_until(lambda: a.status().phase == pb.JOB_PHASE_RUNNING and a.status().attempt >= 2,
                   timeout=180, what=f"A resumed on one node\n{cluster.logs()}")
        assert len(a.status().placement.nodes) == 1
        detail = brokerctl(cluster, "job", a.id)
        assert "preempt" in detail and b_train.id in detail, detail

        # 3. B's higher-priority experiment preempts B's own training job.
        b_exp = client.submit(job_spec("b-exp", "team-b", nodes=1, steps=9,
                                       priority="experimentation"))
        wait_until(lambda: preempted_by(client, b_train.id, b_exp.id), timeout=120,
                   what=f"B's training preempted for B's experiment\n{cluster.logs()}")
        assert not preempted_by(client, a.id, b_exp.id), "A is within its guarantee"

        # 4. Everyone finishes; suspended jobs resumed from checkpoints.
        for handle, steps in ((b_exp, 9), (b_train, 45), (a, 45)):
            job = handle.wait(timeout=420)
            assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
            assert job.progress.step == steps
        for handle in (a, b_train):
            launches = [e for e in events(client, handle.id) if e.type == "launched"]
            assert len(launches) >= 2, launches
            resumed_from = launches[1].details.get("resume_from", "")
            assert resumed_from, f"relaunch of {handle.id} did not resume from a checkpoint"
            assert "step-" in resumed_from
            assert not resumed_from.rstrip("/").endswith("step-000000000")
