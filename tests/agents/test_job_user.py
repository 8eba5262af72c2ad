"""Issue 12: jobs run as a configured unprivileged user, in their own attempt directory;
checkpoint URIs outside the region's allowed roots are refused at launch.

Real processes and a real system user (``useradd``, when the tests run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from computebroker.v1 import agent_pb2
from region_agents.config import AgentConfig
from region_agents.executors.job_user import JobUserError, job_user_for
from region_agents.executors.local import LocalExecutor
from tests.agents.test_local_executor import Collector, make_spec

JOB_USER = "cbjob"
AS = agent_pb2.AttemptState


@pytest.fixture(scope="module")
def job_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("running jobs as another user needs a root agent (these tests are not root)")
    try:
        pwd.getpwnam(JOB_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("useradd is not installed: cannot create the job user")
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        JOB_USER], check=True)
    return JOB_USER


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A work dir the job user can reach (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="cb-jobuser-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_root_agent_without_a_job_user_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(JobUserError, match="--run-as-user"):
        job_user_for("", allow_root_jobs=False, euid=0)
    with pytest.raises(JobUserError, match="is root"):
        job_user_for("root", allow_root_jobs=False, euid=0)
    with pytest.raises(JobUserError, match="does not exist"):
        job_user_for("no-such-user-cb", allow_root_jobs=False, euid=0)
    assert job_user_for("", allow_root_jobs=True, euid=0) is None
    assert job_user_for("", allow_root_jobs=False, euid=1000) is None
    inv = tmp_path / "inv.yaml"
    inv.write_text("region: r\nnodes: []\n")
    if os.geteuid() == 0:
        with pytest.raises(ValueError, match="jobs would run as root"):
            AgentConfig(broker_address="127.0.0.1:1", inventory_path=str(inv))
    with pytest.raises(ValueError, match="'..'"):
        AgentConfig(broker_address="127.0.0.1:1", inventory_path=str(inv), allow_root_jobs=True,
                    checkpoint_allowed_roots=["/data/../etc"])


def test_ranks_run_as_the_job_user_in_their_own_dir(job_user: str, shared_dir: Path) -> None:
    pw = pwd.getpwnam(job_user)
    ex = LocalExecutor(shared_dir / "agent", ranks_per_node=1, python=sys.executable,
                       job_user=job_user_for(job_user, allow_root_jobs=False))
    ckpt = shared_dir / "ckpt" / "j-1" / "attempt-1"
    script = ('id -u > "$CB_WORK_DIR/uid" && pwd > "$CB_WORK_DIR/cwd" && echo ok > "$CB_CHECKPOINT_URI/w"'
              ' && ! touch /root/cb-escape 2>/dev/null')
    ex.launch(make_spec(["bash", "-c", script], nodes=1, gpus=1, ckpt=str(ckpt)))
    c = Collector(ex)
    final = c.wait_terminal()
    adir = shared_dir / "agent" / "jobs" / "j-1" / "attempt-1"
    assert final.state == AS.ATTEMPT_STATE_SUCCEEDED, (adir / "rank-0.stderr").read_text()
    assert (adir / "uid").read_text().strip() == str(pw.pw_uid)
    assert (adir / "cwd").read_text().strip() == str(adir)
    assert (ckpt / "w").stat().st_uid == pw.pw_uid
    assert not Path("/root/cb-escape").exists()
    ex.shutdown()


def test_launch_outside_the_regions_checkpoint_roots_is_refused(broker, inventory_file,  # noqa: ANN001
                                                                tmp_path: Path, fake_trainer) -> None:  # noqa: ANN001
    from region_agents.agent import RegionAgent
    from tests.agents.fake_broker import wait_for
    from tests.agents.test_agent_stream import launch_msg

    allowed = tmp_path / "team-ckpt"
    agent = RegionAgent(AgentConfig(allow_root_jobs=True, broker_address=broker.address,
                                    inventory_path=str(inventory_file), work_dir=str(tmp_path / "w"),
                                    ranks_per_node=1, checkpoint_allowed_roots=[str(allowed)]))
    agent.start()
    try:
        reg = wait_for(lambda: broker.of("register"), 30, what="register")[0]
        assert list(reg.checkpoint_roots) == [str(allowed)]
        for n, uri in enumerate(["/etc/cron.d", "file:///etc/passwd", f"{allowed}/../../etc"]):
            msg = launch_msg(fake_trainer, job=f"j-{n}")
            msg.checkpoint_uri = uri
            ack = broker.wait_ack(broker.send(launch=msg))
            assert not ack.accepted and "checkpoint location refused" in ack.message, ack
        assert not Path("/etc/cron.d/attempt-1").exists()
        ok = launch_msg(fake_trainer, job="j-ok")
        ok.checkpoint_uri = f"{allowed}/j-ok/attempt-1"
        assert broker.wait_ack(broker.send(launch=ok)).accepted
    finally:
        agent.stop()


def test_agent_refuses_to_start_when_the_job_user_cannot_run_python(
        job_user: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A Python under a root-only directory (pytest's tmp_path is one): every launch
    would fail, so the agent says so at start (exit 2) instead of bouncing jobs."""
    from region_agents.agent import main

    private = tmp_path / "bin" / "python"
    private.parent.mkdir()
    private.symlink_to(sys.executable)
    inv = tmp_path / "inv.yaml"
    inv.write_text("region: r\nnodes:\n  - name: a\n    gpus: 1\n")
    assert main(["--broker", "127.0.0.1:1", "--inventory", str(inv), "--work-dir",
                 str(tmp_path / "w"), "--run-as-user", job_user, "--python", str(private)]) == 2
    err = capsys.readouterr().err
    assert f"run_as_user {job_user!r} cannot execute {private}" in err, err
