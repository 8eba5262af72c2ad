"""End to end (issue 12): a root region agent with ``--run-as-user`` runs the built-in
trainer (real torch ranks) as that unprivileged user; its checkpoints on disk belong to
that user, and the job succeeds. Skipped with a reason when the tests are not root."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.agents.test_job_user import JOB_USER
from tests.agents.test_job_user import job_user as job_user  # noqa: F401 - the fixture
from tests.e2e.test_foundation import complete_checkpoints, setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def open_cluster() -> Iterator[Cluster]:
    """A cluster under a directory the job user can traverse (tmp_path is root-only)."""
    root = Path(tempfile.mkdtemp(prefix="cb-e2e-jobuser-", dir="/tmp"))
    root.chmod(0o755)
    c = Cluster(root=root)
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_trainer_runs_as_the_job_user(open_cluster: Cluster, job_user: str) -> None:  # noqa: F811
    import sys

    from region_agents.executors.job_user import JobUserError, check_can_run, job_user_for

    uid = pwd.getpwnam(JOB_USER).pw_uid
    c = open_cluster
    try:  # the agent itself refuses to start in this case (tests/agents/test_job_user.py)
        check_can_run(job_user_for(job_user, False), sys.executable, str(c.root))  # type: ignore[arg-type]
    except JobUserError as e:
        pytest.skip(f"this host's Python is not usable by an unprivileged user: {e}")
    c.start_broker()
    c.start_agent("us-east-2", "--run-as-user", job_user, nodes=1, gpus=1)
    with c.client() as client:
        setup_team(client)
        wait_regions(c, client, 1)
        job = client.submit(spec("as-user", steps=6, every=3)).wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{c.logs()}"
    ckpts = complete_checkpoints(c.root / "regions" / "us-east-2")
    assert ckpts, f"no complete checkpoint\n{c.logs()}"
    assert all(p.stat().st_uid == uid for p in ckpts)
    adir = next((c.root / "agents" / "us-east-2" / "jobs").glob(f"{job.id}/attempt-1"))
    assert adir.stat().st_uid == uid and os.stat(adir / "progress.json").st_uid == uid


def test_trainer_runs_as_its_jobs_own_uid(open_cluster: Cluster, job_user: str) -> None:  # noqa: F811
    """``--job-uid-range``: the job's ranks run as a uid allocated from the range (no
    passwd entry), in a private hidepid /proc; the checkpoints and the attempt directory
    are that uid's, 0700, and the agent's table names it."""
    import json
    import stat

    c = open_cluster
    c.start_broker()
    c.start_agent("us-east-2", "--job-uid-range", "61800-61899", nodes=1, gpus=1)
    with c.client() as client:
        setup_team(client)
        wait_regions(c, client, 1)
        job = client.submit(spec("as-team", steps=6, every=3)).wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{c.logs()}"
    agent_dir = c.root / "agents" / "us-east-2"
    table = json.loads((agent_dir / "identities.json").read_text())
    uid = table[f"job:{job.id}"]  # a uid of the job's own
    assert 61800 <= uid <= 61899
    ckpts = complete_checkpoints(c.root / "regions" / "us-east-2")
    assert ckpts and all(p.stat().st_uid == uid for p in ckpts), c.logs()
    adir = agent_dir / "jobs" / job.id / "attempt-1"
    st = adir.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o700)
