"""Tenants on one agent host, tried as an attacker would: a job plants a link in its
checkpoint directory and a second job makes the root agent follow it; team B's rank
(of another team, or of the same team) reads job A's ``/proc/<pid>/environ``, signals
A's rank, lists A's directories and the agent's; a workdir unpacks as the job's
identity, not root.

Real processes, a real root agent (the executor) and real Unix identities: ``cbjob``
(``useradd``) for the single ``run_as_user`` setup, and per-job uids from a range. They
skip (saying why) when not run as root: only root can start ranks as other uids; the
CI runs as root.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from computebroker.v1 import agent_pb2
from region_agents.executors.job_dirs import JobDirError
from region_agents.executors.job_user import (
    IdentityPool,
    IdentityScope,
    JobUserError,
    job_user_for,
)
from region_agents.executors.local import LocalExecutor
from tests.agents.fake_broker import wait_for
from tests.agents.test_local_executor import Collector, make_spec

AS = agent_pb2.AttemptState
JOB_USER = "cbjob"
UIDS = (61700, 61799)  # a range no user of this host has (checked by the pool)


@pytest.fixture(scope="module")
def root() -> None:
    if os.geteuid() != 0:
        pytest.skip("these attacks need a root agent and real job users: run the tests as root")


@pytest.fixture(scope="module")
def job_user(root: None) -> str:
    try:
        pwd.getpwnam(JOB_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("useradd is not installed: cannot create the job user")
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", JOB_USER], check=True)
    return JOB_USER


@pytest.fixture
def shared_dir(root: None) -> Iterator[Path]:
    """A work dir job users can reach (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="cb-tenants-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _root_secret(base: Path) -> Path:
    """A root-only directory (0700) with a 0600 secret in it."""
    secret = base / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "secret").write_text("root's secret\n")
    (secret / "secret").chmod(0o600)
    return secret


def _run(ex: LocalExecutor, spec) -> agent_pb2.AttemptState:  # noqa: ANN001
    ex.launch(spec)
    return Collector(ex).wait_terminal()


@pytest.mark.parametrize("below", ["", "/deeper"])
def test_planted_checkpoint_link_is_not_followed(job_user: str, shared_dir: Path,
                                                 below: str) -> None:
    """The issue's attack, as the issue ran it (one ``run_as_user`` for every job): job 1
    plants ``<its ckpt>/evil/attempt-1 -> /root-only``; job 2 asks for that path (or a
    path through it) as its checkpoint dir. Before: the root agent's ``mkdir(exist_ok)``
    and recursive ``chown`` followed the link and job 2 read the secret."""
    secret = _root_secret(shared_dir)
    ex = LocalExecutor(shared_dir / "agent", ranks_per_node=1, python=sys.executable,
                       job_user=job_user_for(job_user, allow_root_jobs=False))
    ckpt1 = shared_dir / "ckpt" / "j-1"
    plant = f'mkdir -p "$CB_CHECKPOINT_URI/evil" && ln -s {secret} "$CB_CHECKPOINT_URI/evil/attempt-1"'
    final = _run(ex, make_spec(["bash", "-c", plant], job="j-1", nodes=1, gpus=1, ckpt=str(ckpt1)))
    assert final.state == AS.ATTEMPT_STATE_SUCCEEDED, final.message
    assert (ckpt1 / "evil" / "attempt-1").is_symlink()

    steal = f'cat {secret}/secret > "$CB_WORK_DIR/stolen"'
    with pytest.raises(JobDirError, match="symlink"):
        ex.launch(make_spec(["bash", "-c", steal], job="j-2", nodes=1, gpus=1,
                            ckpt=f"{ckpt1}/evil/attempt-1{below}"))
    st = secret.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700), "the root-only dir was handed over"
    assert (secret / "secret").stat().st_uid == 0
    assert not list((shared_dir / "agent").rglob("stolen"))
    assert not (secret / "deeper").exists()
    ex.shutdown()


def test_a_team_cannot_use_another_teams_checkpoint_dir(root: None, shared_dir: Path) -> None:
    """Checkpoints by ownership, not by string: team B names team A's directory (under
    the same allowed root) as its checkpoint dir or resume point: refused."""
    pool = IdentityPool(*UIDS, shared_dir / "identities.json")
    ckroot = shared_dir / "ckpt"
    ex = LocalExecutor(shared_dir / "agent", ranks_per_node=1, python=sys.executable,
                       identities=pool, checkpoint_roots=[str(ckroot)])
    a = make_spec(["bash", "-c", 'echo weights > "$CB_CHECKPOINT_URI/model.pt"'], job="a-1",
                  nodes=1, gpus=1, ckpt=str(ckroot / "alice" / "a-1"))
    a.spec.team = "alice"
    assert _run(ex, a).state == AS.ATTEMPT_STATE_SUCCEEDED
    alice = pool.for_job("a-1", "alice")
    assert (ckroot / "alice").stat().st_uid == alice.uid
    assert stat.S_IMODE((ckroot / "alice" / "a-1").stat().st_mode) == 0o700

    for ckpt, resume, why in [
            (ckroot / "alice" / "b-1", "", "not to this job's identity"),
            (ckroot / "alice" / "a-1", "", "not to this job's identity"),
            # a resume point outside its own prefix, with no share: refused by name first
            (ckroot / "bob" / "b-1", str(ckroot / "alice" / "a-1"), "not this job's checkpoint")]:
        b = make_spec(["bash", "-c", "true"], job="b-1", nodes=1, gpus=1, ckpt=str(ckpt))
        b.spec.team = "bob"
        b.resume_from = resume
        with pytest.raises(JobDirError, match=why):
            ex.launch(b)
    assert not (ckroot / "alice" / "b-1").exists()
    ex.shutdown()


ATTACK = r"""
import json, os, signal, sys
a_pid, a_dir, a_ckpt, work = (int(os.environ["A_PID"]), os.environ["A_DIR"],
                             os.environ["A_CKPT"], os.environ["AGENT_WORK"])
out = {}
def attempt(name, fn):
    try:
        out[name] = "ok: " + repr(fn())[:200]
    except OSError as e:
        out[name] = type(e).__name__
attempt("environ", lambda: open(f"/proc/{a_pid}/environ", "rb").read())
attempt("cmdline", lambda: open(f"/proc/{a_pid}/cmdline", "rb").read())
out["proc_visible"] = os.path.exists(f"/proc/{a_pid}")
attempt("signal", lambda: os.kill(a_pid, signal.SIGKILL))
attempt("list_attempt", lambda: os.listdir(a_dir))
attempt("read_ckpt", lambda: open(os.path.join(a_ckpt, "model.pt")).read())
attempt("write_ckpt", lambda: open(os.path.join(a_ckpt, "evil.pt"), "w").write("x"))
attempt("list_jobs", lambda: os.listdir(os.path.join(work, "jobs")))
attempt("list_ckpts", lambda: os.listdir(os.path.join(work, "checkpoints")))
attempt("list_workdirs", lambda: os.listdir(os.path.join(work, "workdirs")))
attempt("read_identities", lambda: open(os.path.join(work, "identities.json")).read())
out["uid"] = os.getuid()
out["groups"] = os.getgroups()
open(os.path.join(os.environ["CB_WORK_DIR"], "result.json"), "w").write(json.dumps(out))
"""


@pytest.mark.parametrize("b_team", ["bob", "alice"])
def test_job_b_cannot_touch_job_a_on_the_same_host(root: None, shared_dir: Path,
                                                   b_team: str) -> None:
    """The issue's attack: job B's rank goes after Alice's running rank (her HF_TOKEN in
    /proc/<pid>/environ, a SIGKILL), her attempt and checkpoint dirs, and the agent's
    own directories. B is another team's job, or another job of Alice's own team (a
    teammate: with a uid per team that one read her token and wrote her checkpoints).
    Each job runs as its own uid from the range."""
    work = shared_dir / "agent"
    pool = IdentityPool(*UIDS, work / "identities.json")
    ex = LocalExecutor(work, ranks_per_node=1, python=sys.executable, identities=pool)
    (work / "workdirs" / "sha256").mkdir(parents=True)  # as WorkdirCache leaves it
    (work / "workdirs").chmod(0o700)

    a = make_spec(["bash", "-c", 'echo w > "$CB_CHECKPOINT_URI/model.pt"; echo $$ >'
                   ' "$CB_WORK_DIR/pid.tmp"; mv "$CB_WORK_DIR/pid.tmp" "$CB_WORK_DIR/pid";'
                   ' exec sleep 120'], job="a-1", nodes=1, gpus=1, env={"HF_TOKEN": "alice-hf-secret"})
    a.spec.team = "alice"
    ex.launch(a)
    ca = Collector(ex)
    a_dir = work / "jobs" / "a-1" / "attempt-1"
    a_pid = int(wait_for(lambda: (a_dir / "pid").exists() and (a_dir / "pid").read_text(), 30,
                         what="alice's rank running"))
    a_ckpt = ex.checkpoint_dir(a)

    b = make_spec(["python3", "-c", ATTACK], job="b-1", nodes=1, gpus=1,
                  env={"A_PID": str(a_pid), "A_DIR": str(a_dir), "A_CKPT": a_ckpt,
                       "AGENT_WORK": str(work)})
    b.spec.team = b_team
    final = _run(ex, b)
    b_dir = work / "jobs" / "b-1" / "attempt-1"
    assert final.state == AS.ATTEMPT_STATE_SUCCEEDED, (b_dir / "rank-0.stderr").read_text()
    got = json.loads((b_dir / "result.json").read_text())

    alice, bob = pool.for_job("a-1", "alice"), pool.for_job("b-1", b_team)
    assert alice.uid != bob.uid and got["uid"] == bob.uid and got["groups"] in ([], [bob.gid])
    assert "alice-hf-secret" not in json.dumps(got)
    for what in ("environ", "cmdline", "signal", "list_attempt", "read_ckpt", "write_ckpt",
                 "list_jobs", "list_ckpts", "list_workdirs", "read_identities"):
        assert not got[what].startswith("ok"), (what, got[what])
    assert got["proc_visible"] is False  # hidepid: Alice's processes are not even listed
    assert os.kill(a_pid, 0) is None  # her rank still runs
    assert not any(e.terminal for e in ca.pump() if e.job_id == "a-1")
    for d, owner in ((a_dir, alice), (Path(a_ckpt), alice), (b_dir, bob)):
        st = d.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (owner.uid, 0o700), d
    assert not (Path(a_ckpt) / "evil.pt").exists()
    ex.stop("a-1", 1, False, 0.0)
    wait_for(lambda: any(e.terminal for e in ca.pump() if e.job_id == "a-1"), 30, what="a stops")
    ex.shutdown()


def test_identities_are_stable_distinct_and_bounded(root: None, shared_dir: Path) -> None:
    path = shared_dir / "ids.json"
    pool = IdentityPool(UIDS[0], UIDS[0] + 1, path)
    a, b = pool.for_job("a-1", "alice"), pool.for_job("a-2", "alice")  # one team, two jobs
    assert a.uid != b.uid and a.uid == a.gid
    again = IdentityPool(UIDS[0], UIDS[0] + 1, path)
    assert again.for_job("a-1", "alice") == a  # survives restarts (and attempts)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(JobUserError, match="used up"):
        pool.for_job("c-1", "carol")


def test_team_scope_keeps_one_uid_per_team(root: None, shared_dir: Path) -> None:
    """``job_identity: team`` (the older scheme, and its identities.json format)."""
    path = shared_dir / "ids.json"
    pool = IdentityPool(UIDS[0], UIDS[0] + 5, path, IdentityScope.TEAM)
    a = pool.for_job("a-1", "alice")
    assert pool.for_job("a-2", "alice") == a != pool.for_job("b-1", "bob")
    assert json.loads(path.read_text())["alice"] == a.uid


def test_workdir_unpacks_as_the_jobs_identity(root: None, shared_dir: Path) -> None:
    """The unpacker runs as the job's uid: what it writes is that uid's (a root unpack
    would leave root's files), and a member the job may not write stays unwritten."""
    work = shared_dir / "agent"
    pool = IdentityPool(*UIDS, work / "identities.json")
    ex = LocalExecutor(work, ranks_per_node=1, python=sys.executable, identities=pool)
    tar = shared_dir / "w.tar"
    with tarfile.open(tar, "w") as t:
        ti = tarfile.TarInfo("pkg/m.txt")
        ti.size = 2
        t.addfile(ti, io.BytesIO(b"hi"))
    tar.chmod(0o600)  # root's: the child reads it through the fd the agent passes
    spec = make_spec(["bash", "-c", "cat pkg/m.txt > \"$CB_WORK_DIR/out\""], job="w-1",
                     nodes=1, gpus=1)
    spec.spec.team = "alice"
    spec.workdir_tar = str(tar)
    final = _run(ex, spec)
    adir = work / "jobs" / "w-1" / "attempt-1"
    assert final.state == AS.ATTEMPT_STATE_SUCCEEDED, (adir / "rank-0.stderr").read_text()
    alice = pool.for_job("w-1", "alice")
    for p in (adir / "workdir", adir / "workdir" / "pkg", adir / "workdir" / "pkg" / "m.txt"):
        assert p.stat().st_uid == alice.uid, p
    assert (adir / "out").read_text() == "hi"
    ex.shutdown()


def test_agent_writes_in_a_job_dir_follow_no_planted_link(job_user: str,
                                                          shared_dir: Path) -> None:
    """The job owns its attempt dir and runs while the root agent writes the stop
    deadline and the fence there: links the job planted under those names must be
    replaced, not written through."""
    victim = shared_dir / "victim"
    victim.write_text("untouched\n")
    victim.chmod(0o600)
    ex = LocalExecutor(shared_dir / "agent", ranks_per_node=1, python=sys.executable,
                       job_user=job_user_for(job_user, allow_root_jobs=False))
    # (old code: the Stop's deadline landed in the victim, a root-only file)
    plant = (f'for n in superseded stop-deadline.json stop-deadline.json.tmp; do ln -sf {victim}'
             ' "$CB_WORK_DIR/$n"; done; touch "$CB_WORK_DIR/planted"; exec sleep 60')
    ex.launch(make_spec(["bash", "-c", plant], job="p-1", nodes=1, gpus=1))
    adir = shared_dir / "agent" / "jobs" / "p-1" / "attempt-1"
    wait_for(lambda: (adir / "planted").exists(), 30, what="links planted")
    c = Collector(ex)
    ex.stop("p-1", 1, True, 5.0)  # writes the stop deadline, then SIGTERM
    ex.launch(make_spec(["true"], job="p-1", attempt=2, nodes=1, gpus=1))  # fences attempt 1
    wait_for(lambda: any(e.terminal and e.attempt == 1 for e in c.pump()), 30, what="stopped")
    assert victim.read_text() == "untouched\n" and victim.stat().st_uid == 0
    ex.shutdown()


def test_the_jobs_environment_never_reaches_a_root_process(root: None,
                                                            shared_dir: Path) -> None:
    """Ranks start as root (namespace, /proc mount) before dropping: a job's BASH_ENV
    (or LD_PRELOAD, PATH, exported functions) must not be seen by those root steps, yet
    the rank must get every variable it was given."""
    evil = shared_dir / "evil.sh"
    evil.write_text(f'echo pwned > "{shared_dir}/marker-$(id -u)"\n')
    evil.chmod(0o755)
    pool = IdentityPool(*UIDS, shared_dir / "identities.json")
    ex = LocalExecutor(shared_dir / "agent", ranks_per_node=1, python=sys.executable,
                       identities=pool)
    assert ex.proc_tools is not None, "this host cannot give ranks a private /proc"
    spec = make_spec(["python3", "-c", "import os; open(os.environ['CB_WORK_DIR'] + '/env',"
                      " 'w').write(os.environ['HF_TOKEN'] + ' ' + os.environ['PATH'])"],
                     job="e-1", nodes=1, gpus=1,
                     env={"BASH_ENV": str(evil), "ENV": str(evil), "HF_TOKEN": "tok=en\tx",
                          "BASH_FUNC_mount%%": "() { /bin/sh " + str(evil) + "; }"})
    spec.spec.team = "alice"
    final = _run(ex, spec)
    adir = shared_dir / "agent" / "jobs" / "e-1" / "attempt-1"
    assert final.state == AS.ATTEMPT_STATE_SUCCEEDED, (adir / "rank-0.stderr").read_text()
    token, path = (adir / "env").read_text().split(" ", 1)
    assert token == "tok=en\tx" and path.startswith(os.path.dirname(sys.executable))
    assert not (shared_dir / "marker-0").exists(), "root sourced the job's BASH_ENV"
    ex.shutdown()


@pytest.mark.parametrize("where", ["step", "file", "parent"])
def test_checkpoint_copy_into_a_job_dir_follows_no_planted_link(root: None, shared_dir: Path,
                                                                where: str) -> None:
    """A move copies a checkpoint (as root) into ``<checkpoint_uri>/step-N``, a directory
    the job's identity owns. A job that planted ``step-N -> /victim`` (or a link in
    place of one of the files, or of the checkpoint dir itself) must not make root
    write there. Before: ``mkdir(parents)`` and ``open(path, "wb")`` followed them."""
    from checkpoint_layout.retry import RetryPolicy
    from region_agents.transfer import TransferFailed, copy_checkpoint
    from tests.agents.test_transfer import make_checkpoint

    src = make_checkpoint(shared_dir / "src", 10)
    victim = shared_dir / "victim"
    victim.mkdir(mode=0o700)
    (victim / "keep").write_text("root's\n")
    job_dir = shared_dir / "dst-root" / "job"
    job_dir.mkdir(parents=True)
    dst = job_dir / "ckpt"
    if where == "parent":
        dst.symlink_to(victim)
    else:
        dst.mkdir()
        if where == "step":
            (dst / src.name).symlink_to(victim)
        else:
            (dst / src.name).mkdir()
            first = sorted(p.name for p in src.iterdir() if p.is_file())[0]
            (dst / src.name / first).symlink_to(victim / "keep")
    for d, dirs, files in os.walk(job_dir):  # the job's: it planted all of these
        for n in [d, *(os.path.join(d, x) for x in dirs + files)]:
            os.chown(n, 65534, 65534, follow_symlinks=False)
    with pytest.raises((TransferFailed, OSError), match="symlink|not followed|Too many levels"):
        copy_checkpoint(str(src), f"{dst}/{src.name}", retry=RetryPolicy(
            attempts=1, wait_initial_s=0.01, wait_max_s=0.01, botocore_attempts=1))
    assert sorted(p.name for p in victim.iterdir()) == ["keep"]
    assert (victim / "keep").read_text() == "root's\n"


def test_an_operators_link_is_crossed_a_jobs_is_not(job_user: str, shared_dir: Path) -> None:
    """``/data -> /mnt/data`` (root's link in root's directory) is the operator's and is
    crossed; the same link owned by the job's user is refused."""
    from region_agents.executors.job_dirs import make_job_dir

    user = job_user_for(job_user, allow_root_jobs=False)
    real = shared_dir / "mnt-data"
    real.mkdir()
    (shared_dir / "data").symlink_to(real)
    make_job_dir(str(shared_dir / "data" / "j-1"), [], user)
    assert (real / "j-1").stat().st_uid == user.uid
    (shared_dir / "jobs-link").symlink_to(real)
    os.chown(shared_dir / "jobs-link", user.uid, user.gid, follow_symlinks=False)
    with pytest.raises(JobDirError, match="symlink"):
        make_job_dir(str(shared_dir / "jobs-link" / "j-2"), [], user)
    assert not (real / "j-2").exists()


def test_the_cve_tar_unpacked_as_the_job_user_lands_nothing(job_user: str,
                                                             shared_dir: Path) -> None:
    """The issue's tarball through the real as-the-job's-user path: refused with the
    member named, and nothing outside the target (the child is the job user: even a
    bug in the checks could write only where that user may)."""
    from region_agents.workdir import WorkdirFetchError, unpack
    from tests.agents.test_safe_untar import cve_2025_4517_tar

    user = job_user_for(job_user, allow_root_jobs=False)
    cve_2025_4517_tar(shared_dir / "evil.tar")
    (shared_dir / "evil.tar").chmod(0o600)
    adir = shared_dir / "attempt"
    adir.mkdir()
    os.chown(adir, user.uid, user.gid)
    before = sorted(str(p) for p in shared_dir.rglob("*"))
    with pytest.raises(WorkdirFetchError, match="over 1024 bytes"):
        unpack(shared_dir / "evil.tar", adir / "workdir", user, sys.executable)
    after = sorted(str(p) for p in shared_dir.rglob("*") if adir / "workdir" not in p.parents)
    assert after == sorted([*before, str(adir / "workdir")])
    assert (adir / "workdir").stat().st_uid == user.uid


def test_agent_config_for_per_job_identities(root: None, tmp_path: Path) -> None:
    from region_agents.config import AgentConfig

    inv = tmp_path / "inv.yaml"
    inv.write_text("region: r\nnodes: []\n")

    def cfg(**kw: object) -> AgentConfig:
        return AgentConfig(broker_address="127.0.0.1:1", inventory_path=str(inv),
                           insecure=True, **kw)  # type: ignore[arg-type]

    assert cfg(job_uid_range="61000-61999").job_uid_range == "61000-61999"
    for bad, why in [("61000", "FIRST-LAST"), ("500-900", "1000 <="), ("62000-61000", "1000 <=")]:
        with pytest.raises(JobUserError, match=why):
            cfg(job_uid_range=bad)
    with pytest.raises(JobUserError, match="not both"):
        cfg(job_uid_range="61000-61999", run_as_user="cbjob")
    assert cfg(job_uid_range="61000-61999").job_identity == "job"  # a uid per job by default
    assert cfg(job_uid_range="61000-61999", job_identity="team").job_identity == "team"
    with pytest.raises(JobUserError, match="job or team"):
        cfg(job_uid_range="61000-61999", job_identity="user")
