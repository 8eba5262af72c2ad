"""Issue 15 defect 1: a same-region relaunch must not start from a pruned checkpoint.

Attempt 1 (its agent paused past agent_timeout, its trainer still running) keeps training
and pruning `attempt-1/`; the broker relaunches attempt 2 from the step it last heard of.
The agent resolves that resume point once, before starting ranks, to the newest complete
checkpoint of the same attempt directory that is at least as new (docs/contracts.md
section 3), and fails the attempt with exit 77 (retryable, not a config error) when there
is none. Real agent, real gRPC stream (FakeBroker), real local executor and directories.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import agent_pb2, common_pb2
from region_agents.agent import RegionAgent
from region_agents.executors.base import EXIT_RESUME_UNAVAILABLE
from tests.agents.fake_broker import FakeBroker, wait_for

AS = agent_pb2.AttemptState
# Stands in for `python -m trainer`: records the CB_RESUME_FROM it was given, exits 0.
RECORD_RESUME = "import os; open(os.environ['OUT'], 'w').write(os.environ.get('CB_RESUME_FROM', ''))"


def checkpoint(root: Path, step: int, complete: bool = True) -> None:
    d = root / f"step-{step:09d}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"x" * 16)
    if complete:
        files = [{"name": "__0_0.distcp", "size": 16}]
        (d / "manifest.json").write_text(json.dumps({"step": step, "files": files}))


def relaunch(broker: FakeBroker, agent: RegionAgent, job_root: Path | str, resume_step: int,
             out: Path) -> agent_pb2.JobUpdate:
    launch = agent_pb2.Launch(
        job_id="j-1", attempt=2, checkpoint_uri=f"{job_root}/attempt-2",
        resume_from=f"{job_root}/attempt-1/step-{resume_step:09d}",
        spec=common_pb2.JobSpec(name="j-1", command=[sys.executable, "-c", RECORD_RESUME],
                                env={"OUT": str(out)},
                                resources=common_pb2.Resources(nodes=1, gpus_per_node=8)),
        placement=common_pb2.Placement(region="test-1", world_size=8,
                                       nodes=[common_pb2.NodeAssignment(node_id="t1-p5-000", gpus=8)]),
    )
    wait_for(lambda: agent.connected, 30, what="connected")
    assert broker.wait_ack(broker.send(launch=launch)).accepted
    return broker.wait_terminal("j-1", 2)


def test_relaunch_from_a_pruned_step_resumes_from_the_newer_complete_one(broker, agent, tmp_path):
    job = tmp_path / "ckpt" / "jobs" / "j-1"  # inside the region's store: no copy, same region
    checkpoint(job / "attempt-1", 14)  # attempt 1 kept training: step 10 was pruned
    checkpoint(job / "attempt-1", 16, complete=False)  # ...and step 16 is still being written
    out = tmp_path / "resume_from.txt"
    end = relaunch(broker, agent, job, 10, out)
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end.message
    assert out.read_text() == str(job / "attempt-1" / "step-000000014")


def test_relaunch_from_a_complete_step_keeps_it(broker, agent, tmp_path):
    job = tmp_path / "ckpt" / "jobs" / "j-1"
    checkpoint(job / "attempt-1", 10)
    checkpoint(job / "attempt-1", 14)
    out = tmp_path / "resume_from.txt"
    assert relaunch(broker, agent, job, 10, out).state == AS.ATTEMPT_STATE_SUCCEEDED
    assert out.read_text() == str(job / "attempt-1" / "step-000000010")  # exactly as named


def test_no_complete_checkpoint_at_least_as_new_is_a_retryable_failure(broker, agent, tmp_path):
    job = tmp_path / "ckpt" / "jobs" / "j-1"
    checkpoint(job / "attempt-1", 8)  # older than what the broker named: never used
    checkpoint(job / "attempt-1", 12, complete=False)
    out = tmp_path / "resume_from.txt"
    end = relaunch(broker, agent, job, 10, out)
    assert end.state == AS.ATTEMPT_STATE_FAILED
    assert end.exit_code == EXIT_RESUME_UNAVAILABLE  # not 2: the broker relaunches
    assert "resume checkpoint unavailable" in end.message and "step-000000010" in end.message
    assert not list(end.failed_nodes)  # no node is to blame
    assert not out.exists()  # no rank was started


def test_s3_relaunch_from_a_pruned_step_resumes_from_the_newer_complete_one(
    broker, agent, tmp_path, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same resolution on S3: one listing of the attempt's prefix, before any rank."""
    s3_server.apply_env(monkeypatch)
    bucket = s3_server.unique_bucket("resume")
    c = s3_server.client()
    for key, body in (("jobs/j-1/attempt-1/step-000000014/__0_0.distcp", b"x"),
                      ("jobs/j-1/attempt-1/step-000000014/manifest.json",
                       json.dumps({"step": 14, "files": [{"name": "__0_0.distcp", "size": 1}]})),
                      ("jobs/j-1/attempt-1/step-000000016/__0_0.distcp", b"x")):
        c.put_object(Bucket=bucket, Key=key, Body=body)
    out = tmp_path / "resume_from.txt"
    end = relaunch(broker, agent, f"s3://{bucket}/jobs/j-1", 10, out)
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end.message
    assert out.read_text() == f"s3://{bucket}/jobs/j-1/attempt-1/step-000000014"
