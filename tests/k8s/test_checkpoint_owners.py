"""Checkpoints by owner on the Kubernetes executor (a real API server; the executor as the
agent builds it, with its record of who claimed each checkpoint prefix). The local
executor's rules, by name: a job writes only under a prefix no other job's launch
claimed here, and resumes only from its own checkpoints or from those of the job the
broker named as having shared them (``resume_source``), whatever the spelling of the
path (``file://``, doubled slashes) and for object-store URIs too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from computebroker.v1 import common_pb2 as pb
from region_agents.executors.job_dirs import JobDirError
from region_agents.executors.kubernetes import KubernetesExecutor
from region_agents.resume_views import OwnerBook
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.k8s.helpers import executor_for, trainer_attempt

NODES = ["own-n1"]


@pytest.fixture
def ex(cluster_a: ControlPlane, tmp_path: Path):  # noqa: ANN201
    executor, _ = executor_for(cluster_a)
    executor.owners = OwnerBook(tmp_path / "agent" / "checkpoint-owners.json")
    try:
        yield executor
    finally:
        executor.shutdown()


def _attempt(job: str, ckpt: str, resume: str = "", source: str = ""):  # noqa: ANN202
    spec = trainer_attempt(job, NODES, Path("/unused"))
    spec = replace(spec, checkpoint_uri=ckpt, resume_from=resume)
    if source:
        spec.spec.resume_source.CopyFrom(pb.ResumeSource(job_id=source, team="ml", share_id="s"))
    return spec


@pytest.mark.parametrize("root", ["/data/ckpt", "s3://bucket/ckpt"])
def test_prefixes_and_resume_points_belong_to_their_jobs(ex: KubernetesExecutor, root: str) -> None:
    ex.prepare(_attempt("a-1", f"{root}/a-1/attempt-1"))
    ex.prepare(_attempt("a-1", f"{root}/a-1/attempt-2"))  # its own relaunch
    # another job's prefix, one inside it, or one holding it: refused
    for ckpt in (f"{root}/a-1/attempt-3", f"{root}/a-1/sub/attempt-1", f"{root}/attempt-1"):
        with pytest.raises(JobDirError, match="checkpoints of job a-1"):
            ex.prepare(_attempt("b-1", ckpt))
    step = f"{root}/a-1/attempt-1/step-000000004"
    sneaky = step.replace("/a-1/", "//a-1/") if root.startswith("/") else step
    for resume, source in ((step, ""), (sneaky, ""), (step, "x-9")):
        # no share, or a share from another job: a-1's step is not b-1's to read
        with pytest.raises(JobDirError, match="checkpoints of job a-1"):
            ex.prepare(_attempt("b-1", f"{root}/b-1/attempt-1", resume, source))
    # the broker named a-1's share: the pods may read it (and write only their own)
    ex.prepare(_attempt("b-1", f"{root}/b-1/attempt-1", step, "a-1"))
    # a-1 resumes from its own step; it cannot take b-1's
    ex.prepare(_attempt("a-1", f"{root}/a-1/attempt-4", step))
    with pytest.raises(JobDirError, match="checkpoints of job b-1"):
        ex.prepare(_attempt("a-1", f"{root}/a-1/attempt-5", f"{root}/b-1/attempt-1/step-000000008"))
