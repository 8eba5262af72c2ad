"""End to end: the broker moves running jobs between regions when capacity shifts.

Real broker process, one real agent process per region (local executor, one rank per
node), real trainer ranks (gloo), and moto's real S3 HTTP server with one checkpoint
bucket per region. A move is checkpoint -> place -> copy the checkpoint into the new
region's bucket (agent, region_agents/transfer.py) -> resume there, possibly on a
different world size. Tests assert outcomes (phases, events, Migration records, bytes
in the buckets, the trainer's per-step sample log against an uninterrupted run), never
how long anything took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_foundation import events_of, setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster, _kill_leftover_trainers, live_attempts, wait_until
from tests.fixtures.once import key_of, once_per_session
from tests.trainer.launch import launch, read_log

pytestmark = pytest.mark.slow

STEPS, EVERY, SLEEP = 40, 5, 0.25
REL_TOL = 1e-5


def s3_setup(cluster: Cluster, s3: Any, *regions: str, broker_args: tuple[str, ...] = ()) -> dict[str, str]:
    """One bucket per region on the moto server; agents and trainers get its endpoint."""
    cluster.extra_env = dict(s3.env)
    cluster.broker_args = ["--agent-timeout", "6", "--heartbeat-interval", "1", *broker_args]
    return {r: s3.unique_bucket(f"cb-{r}") for r in regions}


def two_regions(cluster: Cluster, s3: Any, *, src_nodes: int = 1, dst_nodes: int = 1,
                **src: Any) -> dict[str, str]:
    """The broker, a cheap source region (us-east-2, ``src`` inventory extras) and a dearer
    destination (eu-west-1), each with its own bucket; returns the buckets."""
    buckets = s3_setup(cluster, s3, "us-east-2", "eu-west-1")
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=src_nodes, gpus=1, price=1.0,
                        checkpoint_bucket=f"s3://{buckets['us-east-2']}", **src)
    cluster.start_agent("eu-west-1", nodes=dst_nodes, gpus=1, price=3.0,
                        checkpoint_bucket=f"s3://{buckets['eu-west-1']}")
    return buckets


def trainer_spec(steps: int = STEPS, log: Path | None = None) -> dict[str, Any]:
    return {"total_steps": steps, "checkpoint_every": EVERY, "global_batch_size": 8, "seed": 7,
            "model": "tiny", "step_sleep_s": 0.0,
            "options": {"sample_log": str(log)} if log else {}}


def job_spec(name: str, *, steps: int = STEPS, nodes: int = 1, log: Path | None = None,
             **kw: Any) -> pb.JobSpec:
    s = spec(name, steps=steps, every=EVERY, sleep=SLEEP, nodes=nodes, gpus=1, **kw)
    if log is not None:
        s.trainer.options["sample_log"] = str(log)
    return s


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The same training run, uninterrupted, launched directly (python -m trainer, 2 ranks).
    Run once per session (tests/fixtures/once.py): tests/e2e/test_store_outage.py
    compares with the same run."""
    def run_it() -> list[dict[str, Any]]:
        work = tmp_path_factory.mktemp("reference")
        log = work / "samples.jsonl"
        run = launch(work / "run", 2, trainer_spec(log=log), str(work / "ckpt"), job_id="j-ref")
        codes = run.wait(240)
        assert codes == [0, 0], run.output()
        records = read_log(log)
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))
        return records

    return once_per_session(key_of("e2e reference", 2, trainer_spec()), run_it)


def final_samples(log: Path) -> list[dict[str, Any]]:
    """Per step, the record of the attempt that made it last (a step re-done after a
    resume from an older checkpoint counts once, as the run that continued)."""
    by_step: dict[int, dict[str, Any]] = {}
    for rec in read_log(log):
        by_step[rec["step"]] = rec
    return [by_step[s] for s in sorted(by_step)]


def assert_equivalent(run: list[dict[str, Any]], ref: list[dict[str, Any]]) -> None:
    assert [r["step"] for r in run] == [r["step"] for r in ref]
    for got, want in zip(run, ref, strict=True):
        assert got["ids"] == want["ids"], f"step {got['step']}: different samples"
        rel = abs(got["loss"] - want["loss"]) / abs(want["loss"])
        assert rel <= REL_TOL, f"step {got['step']}: loss {got['loss']} vs {want['loss']}"


def manifests(s3: Any, bucket: str, prefix: str) -> dict[str, dict[str, Any]]:
    c = s3.client()
    return {k: json.loads(c.get_object(Bucket=bucket, Key=k)["Body"].read())
            for k in s3.list_keys(bucket, prefix) if k.endswith("manifest.json")}


def running_in(handle: Any, region: str, min_ckpt: int = EVERY) -> Any:
    def ok() -> Any:
        j = handle.status()
        return (j.phase == pb.JOB_PHASE_RUNNING and j.placement.region == region
                and j.progress.last_checkpoint_step >= min_ckpt) and j
    return ok


def test_spot_notice_resumes_in_other_region_on_smaller_world_equivalently(
        cluster: Cluster, s3_server: Any, tmp_path: Path, reference: list[dict[str, Any]]) -> None:
    buckets = two_regions(cluster, s3_server, src_nodes=2, capacity_type="spot")
    log = tmp_path / "samples.jsonl"
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 2)
        s = job_spec("spot-move", nodes=2, log=log)
        s.elasticity.min_nodes, s.elasticity.max_nodes = 1, 2
        s.capacity_types.extend([pb.CAPACITY_TYPE_SPOT, pb.CAPACITY_TYPE_ON_DEMAND])
        handle = client.submit(s)
        before = wait_until(running_in(handle, "us-east-2"), timeout=180,
                            what=f"job running on spot with a checkpoint\n{cluster.logs()}")
        assert before.placement.world_size == 2
        notices = cluster.root / "agents" / "us-east-2" / "spot-notices"
        notices.mkdir(parents=True, exist_ok=True)
        for a in before.placement.nodes:  # the whole spot pool is reclaimed in 60 s
            (notices / a.node_id).write_text("60")
        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.placement.region == "eu-west-1" and job.placement.world_size == 1
        assert job.attempt == 2 and job.progress.step == STEPS

        migs = client.migrations(job_id=job.id)
        assert len(migs) == 1, migs
        m = migs[0]
        assert (m.cause, m.state, m.emergency) == ("spot_interruption", "done", True)
        assert (m.from_region, m.to_region) == ("us-east-2", "eu-west-1")
        assert (m.from_world_size, m.to_world_size, m.from_attempt, m.to_attempt) == (2, 1, 1, 2)
        assert m.checkpoint_uri.startswith(f"s3://{buckets['us-east-2']}/jobs/{job.id}/attempt-1/")
        assert m.resume_from.startswith(f"s3://{buckets['eu-west-1']}/jobs/{job.id}/attempt-2/")
        assert m.transfer.done and not m.transfer.error and m.transfer.bytes_total > 0
        assert m.transfer.method and m.transfer.mb_per_s > 0
        assert m.total_s > 0 and m.first_step_time >= m.running_time > 0
        types = [e.type for e in events_of(client, job.id)]
        assert "transfer_done" in types and "migration_completed" in types, types
        assert job.goodput.lost_migration_s > 0 and job.goodput.productive_s > 0
        done = manifests(s3_server, buckets["eu-west-1"], f"jobs/{job.id}/attempt-2/")
        assert any(mf["step"] == STEPS and mf["attempt"] == 2 for mf in done.values()), done

    records = final_samples(log)
    assert {r["world_size"] for r in records if r["attempt"] == 1} == {2}
    assert {r["world_size"] for r in records if r["attempt"] == 2} == {1}
    assert_equivalent(records, reference)


def test_plan_expiry_moves_job_before_plan_ends_without_emergency(
        cluster: Cluster, s3_server: Any) -> None:
    steps = 120
    buckets = s3_setup(cluster, s3_server, "us-west-2", "eu-west-1",
                       broker_args=("--set", "plan_move_floor_s=8"))
    cluster.start_broker()
    cluster.start_agent("us-west-2", nodes=1, gpus=1, capacity_type="training_plan",
                        pool="tp-e2e", price=0.5, checkpoint_bucket=f"s3://{buckets['us-west-2']}")
    cluster.start_agent("eu-west-1", nodes=1, gpus=1, price=3.0,
                        checkpoint_bucket=f"s3://{buckets['eu-west-1']}")
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 2)
        now = time.time()
        plan = client.create_plan(plan=cpb.TrainingPlan(
            id="tp-e2e", region="us-west-2", instance_type="sim.gpu", accelerator="sim",
            instance_count=1, gpus_per_instance=1, start_time=now - 60, end_time=now + 35))
        s = job_spec("plan-move", steps=steps)
        s.capacity_types.extend([pb.CAPACITY_TYPE_TRAINING_PLAN, pb.CAPACITY_TYPE_ON_DEMAND])
        handle = client.submit(s)
        wait_until(running_in(handle, "us-west-2", 0), timeout=120,
                   what=f"job running on the plan\n{cluster.logs()}")
        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.placement.region == "eu-west-1" and job.progress.step == steps
        evs = events_of(client, job.id)
        reasons = {e.reason for e in evs}
        assert not reasons & {"spot_interruption", "agent_lost", "attempt_missing"}, reasons
        out = [e for e in evs if e.type == "migrating_out"]
        assert len(out) == 1 and out[0].reason == "plan_ending" and out[0].details["emergency"] == "false"
        assert out[0].time < plan.end_time
        migs = client.migrations(job_id=job.id)
        assert len(migs) == 1
        m = migs[0]
        assert (m.cause, m.state, m.emergency, m.work_lost_s) == ("plan_ending", "done", False, 0.0)
        # The old attempt checkpointed and exited by itself (exit 75) before the plan ended.
        assert 0 < m.checkpointed_time < plan.end_time
        assert m.exit_time and m.stop_signal_time and m.exit_time < plan.end_time
        assert m.checkpoint_step > 0 and m.to_region == "eu-west-1"
        stopped = [e for e in evs if e.type == "migrating" and e.attempt == 1]
        assert stopped and "saved" in stopped[0].message, [e.message for e in stopped]
        # Not placed back on the plan's nodes that were about to end.
        assert "us-west-2-n-000" in job.excluded_nodes


def test_lost_agent_returns_and_its_stale_attempt_cannot_overwrite(
        cluster: Cluster, s3_server: Any) -> None:
    buckets = two_regions(cluster, s3_server)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 2)
        handle = client.submit(job_spec("fenced", steps=120))
        wait_until(running_in(handle, "us-east-2"), timeout=180,
                   what=f"job running in us-east-2\n{cluster.logs()}")
        agent_a = cluster.agents["us-east-2"]
        assert agent_a.popen is not None
        os.kill(agent_a.popen.pid, signal.SIGSTOP)  # frozen: it cannot stop its trainer
        try:
            moved = wait_until(lambda: (j := handle.status()).attempt == 2 and j.phase == pb.JOB_PHASE_RUNNING
                               and j.placement.region == "eu-west-1" and j, timeout=120,
                               what=f"relaunch in eu-west-1\n{cluster.logs()}")
            # Its ranks stopped on their own when the frozen agent's lease ran out (3/4 of
            # the agent timeout, contracts §9), before the relaunch: never two at once.
            assert 1 not in live_attempts(cluster.root, moved.id), "the stale attempt still runs"
        finally:
            os.kill(agent_a.popen.pid, signal.SIGCONT)
        # The agent comes back, re-registers with attempt 1: the broker fences it off.
        wait_until(lambda: 1 not in live_attempts(cluster.root, moved.id), timeout=90,
                   what=f"stale attempt 1 stopped\n{cluster.logs()}")
        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        m = client.migrations(job_id=job.id)[0]
        assert m.cause == "agent_lost" and m.state == "done" and m.checkpoint_step >= EVERY
        # Until its lease ran out, the frozen agent's ranks could still save. A checkpoint
        # of attempt 1 newer than the one attempt 2 resumed from is durable work: the
        # broker may then restart the job from it (newer_checkpoint_superseded), and the
        # job ends in a later attempt. Otherwise attempt 2 finishes in eu-west-1.
        restarted = [e for e in events_of(client, job.id) if e.reason == "newer_checkpoint"]
        if restarted:
            assert job.attempt >= 3, job
        else:
            assert job.placement.region == "eu-west-1" and job.attempt == 2, job
        # Attempt-fenced locations: an attempt writes only under its own attempt-N/ (in
        # eu-west-1 also the copy it resumed from, saved by an earlier attempt), and
        # attempt 1 only ever wrote in us-east-2.
        a1 = manifests(s3_server, buckets["us-east-2"], f"jobs/{job.id}/")
        a2 = manifests(s3_server, buckets["eu-west-1"], f"jobs/{job.id}/")
        assert any("/attempt-1/" in k for k in a1)
        for k, mf in a1.items():
            assert f"/attempt-{mf['attempt']}/" in k, (k, mf)
        for k, mf in a2.items():
            under = int(k.split("/attempt-")[1].split("/")[0])
            assert under >= 2 and mf["attempt"] <= under, (k, mf)
        newest = max([*a1.values(), *a2.values()], key=lambda mf: (mf["step"], mf["attempt"]))
        assert newest["step"] == 120 and newest["attempt"] == job.attempt
        assert f"/jobs/{job.id}/attempt-{job.attempt}/" in job.progress.last_checkpoint_uri


def test_agent_sigkill_resumes_elsewhere_from_last_durable_checkpoint(
        cluster: Cluster, s3_server: Any, tmp_path: Path, reference: list[dict[str, Any]]) -> None:
    two_regions(cluster, s3_server, dst_nodes=2)
    log = tmp_path / "samples.jsonl"
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 2)
        s = job_spec("killed", nodes=1, log=log)
        handle = client.submit(s)
        before = wait_until(running_in(handle, "us-east-2", 10), timeout=180,
                            what=f"job running in us-east-2\n{cluster.logs()}")
        cluster.agents["us-east-2"].kill(signal.SIGKILL)
        _kill_leftover_trainers(cluster.root / "agents" / "us-east-2")  # the machine died too
        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.placement.region == "eu-west-1" and job.progress.step == STEPS
        m = client.migrations(job_id=job.id)[0]
        assert (m.cause, m.state, m.emergency) == ("agent_lost", "done", True)
        assert m.checkpoint_step >= before.progress.last_checkpoint_step
        assert m.transfer.done and m.transfer.bytes_total > 0
    records = final_samples(log)
    resumed = [r for r in records if r["attempt"] == 2]
    assert resumed and resumed[0]["step"] == m.checkpoint_step + 1
    assert_equivalent(records, reference)


def test_drain_region_three_jobs_finish_elsewhere(
        cluster: Cluster, s3_server: Any, reference: list[dict[str, Any]]) -> None:
    two_regions(cluster, s3_server, src_nodes=3, dst_nodes=3)
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 2)
        handles = [client.submit(job_spec(f"drain-{i}")) for i in range(3)]
        for h in handles:
            wait_until(running_in(h, "us-east-2"), timeout=240,
                       what=f"{h.id} running in us-east-2\n{cluster.logs()}")
        resp = client.drain("us-east-2", reason="maintenance")
        assert sorted(resp.moved_job_ids) == sorted(h.id for h in handles)
        for h in handles:
            job = h.wait(timeout=300)
            assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
            assert job.placement.region == "eu-west-1" and job.progress.step == STEPS
            # Same result as the uninterrupted run: the final loss matches.
            rel = abs(job.progress.loss - reference[-1]["loss"]) / abs(reference[-1]["loss"])
            assert rel <= REL_TOL, (job.progress.loss, reference[-1]["loss"])
            m = client.migrations(job_id=job.id)[0]
            assert (m.cause, m.state, m.emergency) == ("region_drain", "done", False)
            assert m.transfer.done and m.transfer.bytes_total > 0
        table = client.migrations()
        assert {m.job_id for m in table} == {h.id for h in handles}
    # What an operator sees: `brokerctl migrations` (fits 100 columns) and `brokerctl job`.
    env = {**os.environ, "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "brokerctl", "--broker", cluster.address, "migrations"],
                         capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    assert all(len(line) <= 100 for line in out.splitlines()), out
    for h in handles:
        assert h.id in out
    assert "drain" in out and "us-east-2 → eu-west-1" in out
    detail = subprocess.run([sys.executable, "-m", "brokerctl", "--broker", cluster.address, "job",
                             handles[0].id], capture_output=True, text=True, env=env, timeout=60,
                            check=True).stdout
    assert "migrations" in detail and "goodput" in detail and "migration_completed" in detail


def test_transfer_with_injected_s3_errors_is_retried_and_job_succeeds(
        cluster: Cluster, s3_server: Any) -> None:
    from tests.fixtures.faulty_proxy import FaultPlan, FaultyProxy

    buckets = s3_setup(cluster, s3_server, "us-east-2", "eu-west-1")
    with FaultyProxy(s3_server.endpoint_url) as proxy:
        # Every 3rd object write of the destination agent's copy fails with 503; its
        # trainer talks to the store directly (--env), so only the transfer sees faults.
        proxy.plan = FaultPlan(fail_every=3)
        cluster.start_broker()
        cluster.start_agent("us-east-2", nodes=1, gpus=1, price=1.0,
                            checkpoint_bucket=f"s3://{buckets['us-east-2']}")
        cluster.extra_env = {**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint_url}
        cluster.start_agent("eu-west-1", "--env", f"AWS_ENDPOINT_URL={s3_server.endpoint_url}",
                            nodes=1, gpus=1, price=3.0,
                            checkpoint_bucket=f"s3://{buckets['eu-west-1']}")
        with cluster.client() as client:
            setup_team(client)
            wait_regions(cluster, client, 2)
            handle = client.submit(job_spec("faulty", steps=30))
            wait_until(running_in(handle, "us-east-2"), timeout=180,
                       what=f"job running in us-east-2\n{cluster.logs()}")
            client.drain("us-east-2", reason="move through a flaky store")
            job = handle.wait(timeout=300)
            assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
            assert job.placement.region == "eu-west-1" and job.progress.step == 30
            assert proxy.plan.injected > 0, "no fault was injected: the test proved nothing"
            m = client.migrations(job_id=job.id)[0]
            assert m.state == "done" and m.transfer.done and not m.transfer.error
            # Never resumed from a partial copy: the trainer loaded the verified copy (it
            # refuses anything without a manifest), which the mover wrote manifest-last.
            assert m.resume_from.startswith(f"s3://{buckets['eu-west-1']}/jobs/{job.id}/attempt-2/")
            rank0 = cluster.root / "agents" / "eu-west-1" / "jobs" / job.id / "attempt-2"
            out = "".join(p.read_text() for p in rank0.glob("rank-0.std*"))
            assert f"resumed from {m.resume_from}" in out, out[-2000:]
