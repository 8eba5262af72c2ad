"""End to end: the whole path from submit to a finished training job (issue: Foundation).

Real broker process (gRPC, SQLite), real agent processes (local executor), real trainer
ranks (torch.distributed, gloo), local checkpoint directories. The tests talk to the
broker only through the SDK, like a user, and kill processes with SIGKILL to prove
that nothing is lost.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.fixtures.cluster import Cluster, wait_until

pytestmark = pytest.mark.slow

TERMINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}


def spec(name: str, *, steps: int = 12, every: int = 3, sleep: float = 0.0, nodes: int = 1,
         gpus: int = 1, team: str = "ml", **kw: object) -> pb.JobSpec:
    s = pb.JobSpec(
        name=name, team=team, priority_class="training",
        resources=pb.Resources(nodes=nodes, gpus_per_node=gpus),
        trainer=pb.TrainerSpec(total_steps=steps, checkpoint_every=every, global_batch_size=8,
                               seed=7, model="tiny", step_sleep_s=sleep),
    )
    for key, value in kw.items():
        setattr(s, key, value)
    return s


def setup_team(client: object, team: str = "ml", gpus: int = 64) -> None:
    client.set_team_quota(team=team, guaranteed_gpus=gpus)  # type: ignore[attr-defined]


def job_of(client: object, job_id: str) -> pb.Job:
    return client.job(job_id).status()  # type: ignore[attr-defined]


def events_of(client: object, job_id: str) -> list[pb.JobEvent]:
    return list(client.job(job_id).events(follow=False))  # type: ignore[attr-defined]


def complete_checkpoints(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("manifest.json"))


def wait_regions(cluster: Cluster, client: object, n: int) -> None:
    wait_until(lambda: sum(1 for r in client.regions() if r.connected) >= n,  # type: ignore[attr-defined]
               timeout=90, what=f"{n} connected regions\n{cluster.logs()}")


def test_submit_run_succeed_with_checkpoints(cluster: Cluster) -> None:
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=2, gpus=2)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 1)
        handle = client.submit(spec("e2e-ok", nodes=2, gpus=1))
        job = handle.wait(timeout=240)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.placement.region == "us-east-2"
        assert job.progress.step == 12
        assert job.progress.last_checkpoint_step == 12
        phases = [e.to_phase for e in events_of(client, job.id) if e.to_phase]
        for expected in (pb.JOB_PHASE_PENDING, pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_LAUNCHING,
                         pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_SUCCEEDED):
            assert expected in phases, phases
        ckpts = complete_checkpoints(cluster.root / "regions" / "us-east-2")
        assert ckpts, "no complete checkpoint on disk"
        assert any(p.name.endswith("12") for p in ckpts), ckpts


def test_cancel_while_running(cluster: Cluster) -> None:
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=1, gpus=2)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 1)
        handle = client.submit(spec("e2e-cancel", steps=10_000, every=50, sleep=0.05))
        wait_until(lambda: handle.status().phase == pb.JOB_PHASE_RUNNING and handle.status().progress.step > 0,
                   timeout=180, what=f"job running\n{cluster.logs()}")
        handle.cancel("test cancel")
        job = handle.wait(timeout=120)
        assert job.phase == pb.JOB_PHASE_CANCELLED, job
        # The capacity it held is free again.
        wait_until(lambda: all(r.allocated_gpus == 0 for r in client.regions()), timeout=60,
                   what="GPUs released after cancel")
        # Cancelling a finished job is a precondition failure, not a crash.
        from brokersdk.client import BrokerError

        with pytest.raises(BrokerError) as err:
            handle.cancel("again")
        assert "FAILED_PRECONDITION" in str(err.value.code)


def test_agent_killed_job_resumes_elsewhere_from_checkpoint(cluster: Cluster) -> None:
    cluster.broker_args = ["--agent-timeout", "6", "--heartbeat-interval", "1"]
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=1, gpus=2)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 1)
        handle = client.submit(spec("e2e-move", steps=60, every=5, sleep=0.15))
        wait_until(lambda: handle.status().progress.last_checkpoint_step >= 10, timeout=240,
                   what=f"a durable checkpoint at step >= 10\n{cluster.logs()}")
        before = handle.status()
        assert before.placement.region == "us-east-2"
        # The only other region comes up now, then the first agent dies hard.
        cluster.start_agent("eu-west-1", nodes=1, gpus=2)
        wait_regions(cluster, client, 2)
        cluster.agents["us-east-2"].kill(signal.SIGKILL)
        from tests.fixtures.cluster import _kill_leftover_trainers

        # A dead machine takes its processes with it.
        _kill_leftover_trainers(cluster.root / "agents" / "us-east-2")
        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.placement.region == "eu-west-1"
        assert job.attempt >= 2
        evs = events_of(client, job.id)
        launches = [e for e in evs if e.type == "launched"]
        assert len(launches) >= 2
        relaunch = launches[-1]
        assert relaunch.region == "eu-west-1"
        # Resumed from a checkpoint, not from step 0: the relaunch names the durable
        # checkpoint the broker knew of (step >= 10) as its resume point.
        resume_from = relaunch.details.get("resume_from", "")
        assert "step-" in resume_from, relaunch
        resumed_step = int(resume_from.rstrip("/").rsplit("step-", 1)[1])
        assert resumed_step >= before.progress.last_checkpoint_step >= 10, (resume_from, before.progress)
        assert any(e.reason in ("agent_lost", "agent_timeout") for e in evs), [e.reason for e in evs]
        assert job.progress.step == 60


def test_broker_killed_and_restarted_loses_nothing(cluster: Cluster) -> None:
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=2, gpus=2)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 1)
        long = client.submit(spec("e2e-survivor", steps=40, every=5, sleep=0.15))
        queued = [client.submit(spec(f"e2e-q{i}", steps=6, every=3, nodes=2, gpus=2)) for i in range(2)]
        wait_until(lambda: long.status().progress.step >= 3, timeout=180,
                   what=f"long job progressing\n{cluster.logs()}")
        ids = sorted([long.id, *[q.id for q in queued]])
        events_before = {i: len(events_of(client, i)) for i in ids}
    assert cluster.broker is not None
    cluster.broker.kill(signal.SIGKILL)
    cluster.start_broker()
    with cluster.client() as client:
        after_ids = sorted(j.id for j in client.jobs())
        for i in ids:
            assert i in after_ids
            assert len(events_of(client, i)) >= events_before[i]
        jobs = [client.job(i).wait(timeout=300) for i in ids]
        for job in jobs:
            assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        # Every event seq is contiguous: nothing was lost or duplicated.
        for i in ids:
            seqs = [e.seq for e in events_of(client, i)]
            assert seqs == list(range(1, len(seqs) + 1))


def test_capacity_shows_usage_while_running(cluster: Cluster) -> None:
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=2, gpus=4)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 1)
        handle = client.submit(spec("e2e-cap", steps=10_000, every=100, sleep=0.05, nodes=1, gpus=3))
        wait_until(lambda: handle.status().phase == pb.JOB_PHASE_RUNNING, timeout=180,
                   what=f"job running\n{cluster.logs()}")
        rows = [r for r in client.capacity().rows if r.region == "us-east-2"]
        assert sum(r.total_gpus for r in rows) == 8
        assert sum(r.allocated_gpus for r in rows) == 3
        assert sum(r.free_gpus for r in rows) == 5
        handle.cancel("done looking")
        handle.wait(timeout=120)
        rows = [r for r in client.capacity().rows if r.region == "us-east-2"]
        wait_until(lambda: sum(r.allocated_gpus for r in client.capacity().rows) == 0, timeout=60,
                   what="capacity released")
        assert sum(r.free_gpus for r in client.capacity().rows) == 8
