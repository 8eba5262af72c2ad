"""End to end: a checkpoint store outage is weather, not a job failure.

Real broker, real agent, real trainer ranks, and a moto S3 server that is *stopped*
mid-run so its port really refuses connections (not a 503 proxy), then started again
on the same port (moto keeps its buckets in this process). The job must wait the outage
out (pending reason naming the store and since when), spend no restart, and finish with
exactly the samples and losses of an uninterrupted run.

Before the store fault table (checkpoint_layout/faults.py) this failed: the save exited
79 and every relaunch 77, each spending a restart, and the job ended FAILED
(max_restarts); a start during the outage exited 2 ("configuration error").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.e2e import test_migration as mig
from tests.e2e.test_foundation import events_of, setup_team, wait_regions
from tests.e2e.test_migration import assert_equivalent, final_samples, job_spec
from tests.fixtures.cluster import Cluster, wait_until
from tests.fixtures.stoppable_s3 import StoppableS3

pytestmark = pytest.mark.slow


# The same uninterrupted run the migration tests compare against (python -m trainer).
reference = mig.reference  # computed once per session (tests/fixtures/once.py)


def test_store_refusing_connections_mid_run_is_waited_out(
        cluster: Cluster, stoppable_s3: StoppableS3, tmp_path: Path, reference: list[dict[str, Any]],
) -> None:
    store = stoppable_s3
    bucket = "cb-outage-us-east-2"
    store.client().create_bucket(Bucket=bucket)
    cluster.extra_env = dict(store.env)
    # No wait in the attempt (store_outage_attempt_wait_s=0): the save's outage ends the
    # attempt at once and the broker's own wait is what this test is about.
    cluster.broker_args = ["--agent-timeout", "6", "--heartbeat-interval", "1",
                           "--set", "store_outage_backoff_base_s=1",
                           "--set", "store_outage_backoff_max_s=4", "--set", "max_restarts=1",
                           "--set", "store_outage_attempt_wait_s=0"]
    cluster.start_broker()
    cluster.start_agent("us-east-2", "--store-probe-interval-s", "1", nodes=1, gpus=1,
                        checkpoint_bucket=f"s3://{bucket}")
    log = tmp_path / "samples.jsonl"
    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 1)
        handle = client.submit(job_spec("outage", log=log))
        wait_until(lambda: handle.status().progress.last_checkpoint_step >= 10, 180,
                   what=f"a durable checkpoint\n{cluster.logs()}")
        store.down()
        down_at = time.time()
        # The attempt's next save cannot reach the store: the job waits, saying why.
        j = wait_until(lambda: (g := handle.status()).phase == pb.JOB_PHASE_PENDING
                       and "unreachable since" in g.pending_reason and g, 180,
                       what=f"the job waiting for its store\n{cluster.logs()}")
        assert "checkpoint store of us-east-2" in j.pending_reason, j.pending_reason
        assert j.restarts == 0
        # The agent's running probe fails too: the region takes no placements meanwhile.
        j = wait_until(lambda: "region us-east-2 gets no jobs" in (g := handle.status()).pending_reason
                       and g, 60, what=f"the region's probe failing\n{cluster.logs()}")
        assert "unreachable since" in j.pending_reason, j.pending_reason
        time.sleep(max(0.0, 20 - (time.time() - down_at)))  # an outage of at least 20 s
        assert handle.status().phase in (pb.JOB_PHASE_PENDING, pb.JOB_PHASE_ADMITTED,
                                         pb.JOB_PHASE_LAUNCHING)
        store.up()
        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.restarts == 0, job
        reasons = [e.reason for e in events_of(client, job.id)]
        assert "store_outage" in reasons, reasons
        assert "config_error" not in reasons and "max_restarts" not in reasons, reasons
    assert_equivalent(final_samples(log), reference)


def test_a_save_during_an_outage_is_waited_out_in_the_attempt(
        cluster: Cluster, stoppable_s3: StoppableS3, tmp_path: Path, reference: list[dict[str, Any]],
) -> None:
    """With the default wait in the attempt, a save that meets the outage does not end
    the attempt: the ranks train on or hold the save, the job stays RUNNING and says why
    (its pending reason), never shows a step below its durable checkpoint, and finishes
    once the store answers with no restart, no requeue and an uninterrupted run's
    samples and losses."""
    store = stoppable_s3
    bucket = "cb-outage-save-us-east-2"
    store.client().create_bucket(Bucket=bucket)
    cluster.extra_env = dict(store.env)
    cluster.broker_args = ["--agent-timeout", "6", "--heartbeat-interval", "1",
                           "--set", "store_outage_attempt_wait_s=300", "--set", "max_restarts=1"]
    cluster.start_broker()
    cluster.start_agent("us-east-2", "--store-probe-interval-s", "1", nodes=1, gpus=1,
                        checkpoint_bucket=f"s3://{bucket}")
    log = tmp_path / "samples.jsonl"
    shown: list[tuple[int, int]] = []  # (step shown, durable step) as the job is polled

    def status() -> pb.Job:
        g = handle.status()
        shown.append((g.progress.step, g.progress.last_checkpoint_step))
        return g

    with cluster.client() as client:
        setup_team(client)
        wait_regions(cluster, client, 1)
        handle = client.submit(job_spec("outage-save", log=log))
        wait_until(lambda: status().progress.last_checkpoint_step >= 10, 180,
                   what=f"a durable checkpoint\n{cluster.logs()}")
        store.down()
        down_at = time.time()
        j = wait_until(lambda: "wait for it to save" in (g := status()).pending_reason and g,
                       180, what=f"the job saying its ranks wait\n{cluster.logs()}")
        assert j.phase == pb.JOB_PHASE_RUNNING and j.restarts == 0, j
        assert "checkpoint store of us-east-2 unreachable since" in j.pending_reason
        assert j.progress.step >= j.progress.last_checkpoint_step >= 10, j.progress
        time.sleep(max(0.0, 20 - (time.time() - down_at)))  # an outage of at least 20 s
        assert status().phase == pb.JOB_PHASE_RUNNING
        store.up()
        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.restarts == 0 and job.attempt == 1 and not job.pending_reason, job
        reasons = [e.reason for e in events_of(client, job.id)]
        assert "store_outage" not in reasons and "config_error" not in reasons, reasons
    durable = 0
    for step, ckpt in shown:
        durable = max(durable, ckpt)
        assert step >= durable, shown
    assert_equivalent(final_samples(log), reference)


CROSS_STEPS = 120


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The cross-region run's training, uninterrupted (python -m trainer, 2 ranks)."""
    from tests.trainer.launch import launch, read_log

    work = tmp_path_factory.mktemp("long-reference")
    log = work / "samples.jsonl"
    run = launch(work / "run", 2, mig.trainer_spec(steps=CROSS_STEPS, log=log),
                 str(work / "ckpt"), job_id="j-ref-long")
    codes = run.wait(300)
    assert codes == [0, 0], run.output()
    return read_log(log)


def test_store_outage_in_one_region_resumes_in_the_region_of_an_older_checkpoint(
        cluster: Cluster, s3_server: Any, tmp_path: Path,
        long_reference: list[dict[str, Any]]) -> None:
    """Cross-region resume after a store outage, end to end. The job trains in eu-west-1
    (durable checkpoints there), is drained to us-east-2 and checkpoints there too; then
    us-east-2's store refuses connections for good (a proxy in front of moto, its port
    closed). Past store_outage_move_after_s the broker resumes the job in eu-west-1 from
    the checkpoint it made there: a move whose event names the store that is down, no
    restart spent, and the result equal to an uninterrupted run (steps after that older
    checkpoint are redone)."""
    from tests.fixtures.faulty_proxy import FaultyProxy

    east, west = "us-east-2", "eu-west-1"
    buckets = {r: s3_server.unique_bucket(f"cb-{r}") for r in (east, west)}
    cluster.broker_args = ["--agent-timeout", "6", "--heartbeat-interval", "1",
                           "--set", "store_outage_backoff_base_s=1",
                           "--set", "store_outage_backoff_max_s=4",
                           "--set", "store_outage_move_after_s=8", "--set", "max_restarts=1",
                           # the ranks do not wait in the attempt (that is the test
                           # above): the broker's wait and move are what this one is about
                           "--set", "store_outage_attempt_wait_s=0"]
    log = tmp_path / "samples.jsonl"
    with FaultyProxy(s3_server.endpoint_url) as proxy:
        cluster.extra_env = dict(s3_server.env)  # eu-west-1: straight to the store
        cluster.start_broker()
        cluster.start_agent(west, nodes=1, gpus=1, price=3.0,
                            checkpoint_bucket=f"s3://{buckets[west]}")
        with cluster.client() as client:
            setup_team(client)
            wait_regions(cluster, client, 1)
            handle = client.submit(job_spec("cross", steps=CROSS_STEPS, log=log))
            j = wait_until(mig.running_in(handle, west, min_ckpt=10), 180,
                           what=f"a durable checkpoint in {west}\n{cluster.logs()}")
            # us-east-2 (cheaper) reaches its store through the proxy that will go down
            cluster.extra_env = {**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint_url}
            cluster.start_agent(east, "--store-probe-interval-s", "1", nodes=1, gpus=1,
                                price=1.0, checkpoint_bucket=f"s3://{buckets[east]}")
            wait_regions(cluster, client, 2)
            client.drain(west, reason="move the job to us-east-2 first")
            j = wait_until(mig.running_in(handle, east, min_ckpt=1), 180,
                           what=f"the job running in {east}\n{cluster.logs()}")
            west_step = max(rc.step for rc in j.region_checkpoints if rc.region == west)
            j = wait_until(lambda: (g := handle.status()).placement.region == east
                           and g.progress.last_checkpoint_step > west_step and g, 180,
                           what=f"a newer checkpoint in {east}\n{cluster.logs()}")
            east_step = j.progress.last_checkpoint_step
            assert j.phase == pb.JOB_PHASE_RUNNING and j.progress.step < CROSS_STEPS, j
            client.drain(west, undrain=True)
            proxy.refuse()  # us-east-2's store is down from now on
            job = handle.wait(timeout=400)
            assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
            assert job.restarts == 0, job
            assert job.placement.region == west, job
            events = events_of(client, job.id)
            moved = [e for e in events if e.type == "moved" and e.reason == "store_outage"]
            assert len(moved) == 1, [(e.type, e.reason, e.message) for e in events]
            d = dict(moved[0].details)
            assert (d["from_region"], d["to_region"]) == (east, west), d
            assert int(d["step"]) == west_step and int(d["unreachable_step"]) >= east_step, d
            assert f"checkpoint store of {east} unreachable since" in moved[0].message
            reasons = [e.reason for e in events]
            assert "config_error" not in reasons and "max_restarts" not in reasons, reasons
    mig.assert_equivalent(final_samples(log), long_reference)
