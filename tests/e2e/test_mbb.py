"""End to end: a make-before-break move (broker/jobs/standby.py, trainer/standby.py).

Real broker process with ``make_before_break=true``, one agent process per region
(local executor), real trainer ranks (gloo) and moto's S3 HTTP server. The source
region's trainer writes through a proxy whose write gate the test closes before the
drain: the source's final checkpoint is then held mid-save, deterministically, while
the destination's standby is reserved, started and parked. Only then is the gate
opened. Asserted on the job record, its Migration record and the per-step sample log
(one line per step, in the order the steps happened), never on how long anything took:
* the drain is a planned move of a job with a periodic checkpoint: the source's Stop is
  held until the destination's agent has pre-copied that checkpoint into its region
  (broker/jobs/precopy.py), then sent;
* the standby exists and is parked (no step, not the job's attempt) while the source saves;
* every source step precedes every destination step (fenced first);
* the destination resumed at exactly the next unseen sample on another world size,
  reading the checkpoint straight from the source region's bucket (no copy first);
* the Migration record's make-before-break phases are present and ordered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_foundation import events_of, setup_team, wait_regions
from tests.e2e.test_migration import job_spec, running_in
from tests.fixtures.cluster import Cluster, wait_until
from tests.trainer.launch import read_log
from trainer.sampler import ResumableSampler

pytestmark = pytest.mark.slow
STEPS = 40


def test_drain_make_before_break_standby_goes_after_the_source_is_fenced(
        cluster: Cluster, s3_server: Any, tmp_path: Path) -> None:
    from tests.fixtures.faulty_proxy import FaultyProxy

    buckets = {r: s3_server.unique_bucket(f"cb-{r}") for r in ("us-east-2", "eu-west-1")}
    log = tmp_path / "samples.jsonl"
    cluster.broker_args = ["--agent-timeout", "6", "--heartbeat-interval", "1",
                           "--set", "make_before_break=true"]
    with FaultyProxy(s3_server.endpoint_url) as proxy:
        cluster.extra_env = {**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint_url}
        cluster.start_broker()
        cluster.start_agent("us-east-2", nodes=2, gpus=1, price=1.0,
                            checkpoint_bucket=f"s3://{buckets['us-east-2']}")
        cluster.extra_env = dict(s3_server.env)  # the destination talks to the store directly
        cluster.start_agent("eu-west-1", nodes=1, gpus=1, price=3.0,
                            checkpoint_bucket=f"s3://{buckets['eu-west-1']}")
        with cluster.client() as client:
            setup_team(client)
            wait_regions(cluster, client, 2)
            s = job_spec("mbb", steps=STEPS, nodes=2, log=log)
            s.elasticity.min_nodes, s.elasticity.max_nodes = 1, 2
            h = client.submit(s)
            before = wait_until(running_in(h, "us-east-2"), timeout=240,
                                what=f"job running in us-east-2\n{cluster.logs()}")
            assert before.placement.world_size == 2
            proxy.plan.gate.clear()  # the source's writes (its final checkpoint) now wait
            client.drain("us-east-2", reason="make-before-break test")
            standby_dir = cluster.root / "agents" / "eu-west-1" / "jobs" / h.id / "attempt-2"

            def parked() -> Any:
                j = h.status()
                try:
                    state = json.loads((standby_dir / "progress.json").read_text()).get("state")
                except (FileNotFoundError, json.JSONDecodeError):
                    state = None
                # ... and its agent has pre-copied the last periodic checkpoint (that needs
                # no write of the source's, so it never waits for the gate)
                return (j.HasField("standby") and state == "standby"
                        and j.migrations[-1].precopy_done_time > 0 and j)

            try:
                held = wait_until(parked, timeout=240,
                                  what=f"standby parked in eu-west-1\n{cluster.logs()}")
                # the standby is reserved and started but is not the job's attempt
                assert held.phase == pb.JOB_PHASE_CHECKPOINTING and held.attempt == 1
                assert held.standby.attempt == 2 and held.standby.placement.region == "eu-west-1"
                assert {r["attempt"] for r in read_log(log)} == {1}  # it took no step
                # nor saved: the only keys in its region are the pre-copied checkpoint's
                pre = held.migrations[-1].precopy_from.rstrip("/").rpartition("/")[2]
                assert pre.startswith("step-")
                keys = s3_server.list_keys(buckets["eu-west-1"], f"jobs/{h.id}/")
                assert all(k.startswith(f"jobs/{h.id}/attempt-2/{pre}/") for k in keys), keys
                assert f"jobs/{h.id}/attempt-2/{pre}/manifest.json" in keys  # complete
            finally:
                proxy.plan.gate.set()
            job = h.wait(timeout=300)
            assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
            assert job.placement.region == "eu-west-1" and job.placement.world_size == 1
            assert job.attempt == 2 and job.progress.step == STEPS
            assert not job.HasField("standby")
            (m,) = client.migrations(job_id=job.id)
            types = [e.type for e in events_of(client, job.id)]

    assert (m.cause, m.state, m.make_before_break) == ("region_drain", "done", True)
    assert (m.from_world_size, m.to_world_size, m.from_attempt, m.to_attempt) == (2, 1, 1, 2)
    # the make-before-break phases, present and ordered (broker clock)
    assert 0 < m.started_time <= m.standby_launched_time <= m.checkpointed_time <= m.go_time
    assert m.go_time == m.launched_time <= m.running_time <= m.first_step_time
    # downtime: the source's last step -> the destination resumed training (trainer clocks)
    assert 0 < m.last_source_step_time <= m.exit_time and m.downtime_s > 0
    assert m.downtime_s < m.first_step_time - m.last_source_step_time + 1e-6
    # ... and the agents' view of the source: SIGTERM, then exit, before the go
    assert 0 < m.stop_signal_time <= m.exit_time <= m.go_time
    # pre-copy: the last periodic checkpoint reached eu-west-1 before the source's Stop
    assert m.precopy_from.startswith(f"s3://{buckets['us-east-2']}/jobs/{job.id}/attempt-1/step-")
    assert m.precopy.done and not m.precopy.error and m.precopy.bytes_done > 0
    pre = m.precopy_from.rstrip("/").rpartition("/")[2]
    assert m.precopy_uri == f"s3://{buckets['eu-west-1']}/jobs/{job.id}/attempt-2/{pre}"
    assert m.started_time <= m.precopy_done_time <= m.stop_sent_time <= m.checkpointed_time
    assert m.precopy_done_time <= m.stop_signal_time  # the source's SIGTERM came after it
    last_launch = len(types) - 1 - types[::-1].index("launched")  # the go
    assert types.index("precopied") < types.index("stop_sent") < last_launch
    assert pre < m.resume_from.rstrip("/").rpartition("/")[2]  # the final one is newer
    # read straight from the source region's bucket: no copy on the critical path
    assert m.resume_from.startswith(f"s3://{buckets['us-east-2']}/jobs/{job.id}/attempt-1/")
    assert not m.transfer.bytes_total
    assert types.index("standby_launched") < types.index("migration_completed")

    recs = read_log(log)
    attempts = [r["attempt"] for r in recs]
    assert attempts == sorted(attempts) and set(attempts) == {1, 2}  # fenced first
    dst = [r for r in recs if r["attempt"] == 2]
    assert dst[0]["step"] == m.checkpoint_step + 1
    assert [r["step"] for r in dst] == list(range(m.checkpoint_step + 1, STEPS + 1))
    assert {r["world_size"] for r in recs if r["attempt"] == 1} == {2}
    assert {r["world_size"] for r in dst} == {1}
    sampler = ResumableSampler(65536, global_batch=8, seed=7, micro_batch=8)
    ref = [sampler.next().ids for _ in range(STEPS)]
    for r in recs:  # exactly the samples of an uninterrupted run at that step
        assert r["ids"] == ref[r["step"] - 1], f"attempt {r['attempt']} step {r['step']}"
