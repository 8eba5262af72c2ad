"""Checkpoints by owner, at the agent: a real root agent (local executor), real per-team
Unix identities and real rank processes. A job resumes only from its own checkpoints or
from the prefix of the job the broker named as having shared them (``resume_source``);
a shared local checkpoint reaches the rank as a root-owned read-only copy, and a
symlink anywhere in it (or on the way to it) refuses the launch. A second job may not
write under a prefix another job's launch made, even with the same uid."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from computebroker.v1 import agent_pb2
from computebroker.v1 import common_pb2 as pb
from region_agents.executors.job_dirs import JobDirError
from region_agents.executors.job_user import IdentityPool
from region_agents.executors.local import LocalExecutor
from tests.agents.test_local_executor import Collector, make_spec

AS = agent_pb2.AttemptState
UIDS = (61600, 61699)  # a range no user of this host has (checked by the pool)
STEP = "step-000000010"

# A rank that reads what it was handed, tries to write into it and into the source
# (by its real path), and records every outcome in its own checkpoint directory.
READER = r"""
import json, os
out, src = {}, os.environ["CB_RESUME_FROM"]
out["resume"] = src
out["read"] = open(os.path.join(src, "model.pt")).read()
targets = [("write_view", os.path.join(src, "model.pt")), ("new_in_view", os.path.join(src, "new.pt"))]
if os.environ.get("SOURCE"):
    targets.append(("write_source", os.path.join(os.environ["SOURCE"], "model.pt")))
for name, path in targets:
    try:
        with open(path, "a") as f:
            f.write("tampered")
        out[name] = "ok"
    except OSError as e:
        out[name] = e.strerror
out["stat"] = {}
for d, dirs, files in os.walk(src):
    for n in [d] + [os.path.join(d, f) for f in files + dirs]:
        st = os.lstat(n)
        out["stat"][os.path.relpath(n, src)] = [st.st_uid, st.st_gid, st.st_mode & 0o7777]
json.dump(out, open(os.path.join(os.environ["CB_CHECKPOINT_URI"], "result.json"), "w"))
"""


@pytest.fixture
def host() -> Iterator[tuple[LocalExecutor, IdentityPool, Path]]:
    if os.geteuid() != 0:
        pytest.skip("these checks need a root agent and real job identities: run as root")
    d = Path(tempfile.mkdtemp(prefix="cb-shares-", dir="/tmp"))
    d.chmod(0o755)
    pool = IdentityPool(*UIDS, d / "agent" / "identities.json")
    ex = LocalExecutor(d / "agent", ranks_per_node=1, python=sys.executable, identities=pool,
                       checkpoint_roots=[str(d / "ckpt")])
    try:
        yield ex, pool, d / "ckpt"
    finally:
        ex.shutdown()
        shutil.rmtree(d, ignore_errors=True)


def _spec(job: str, team: str, ckroot: Path, command: list[str], **env: str):  # noqa: ANN202
    s = make_spec(command, job=job, nodes=1, gpus=1, env=env,
                  ckpt=str(ckroot / job / "attempt-1"))
    s.spec.team = team
    return s


def _run(ex: LocalExecutor, spec) -> agent_pb2.AttemptState:  # noqa: ANN001
    ex.launch(spec)
    return Collector(ex).wait_terminal()


def _writer(ex: LocalExecutor, ckroot: Path, plant: str = "") -> Path:
    """Job a-1 (team alice) writes a checkpoint step (and, with ``plant``, runs it)."""
    cmd = (f'mkdir -p "$CB_CHECKPOINT_URI/{STEP}/shard" && echo weights >'
           f' "$CB_CHECKPOINT_URI/{STEP}/model.pt" && echo s > "$CB_CHECKPOINT_URI/{STEP}/shard/0"'
           f' && echo {{}} > "$CB_CHECKPOINT_URI/{STEP}/manifest.json"; {plant}')
    final = _run(ex, _spec("a-1", "alice", ckroot, ["bash", "-c", cmd]))
    assert final.state == AS.ATTEMPT_STATE_SUCCEEDED, final.message
    return ckroot / "a-1" / "attempt-1" / STEP


def _shared(spec, ckroot: Path, resume: Path, scheme: str = ""):  # noqa: ANN001, ANN202
    """What the broker sends once a share is in force (``scheme``: ``file://`` spellings,
    as a job that chose ``checkpoint_uri: file:///...`` has them)."""
    spec.resume_from = f"{scheme}{resume}"
    spec.spec.resume_source.CopyFrom(pb.ResumeSource(
        job_id="a-1", team="alice", prefix=f"{scheme}{ckroot / 'a-1'}", uri=f"{scheme}{resume}",
        share_id="s"))
    return spec


@pytest.mark.parametrize(("team", "scheme"), [("alice", ""), ("bob", ""), ("bob", "file://")])
def test_a_shared_checkpoint_is_read_through_a_read_only_copy(host, team: str, scheme: str) -> None:  # noqa: ANN001
    """Same team (same uid) or another team: refused without the broker's share; with
    it, the rank reads a root-owned copy it cannot write, never the source."""
    import json

    ex, pool, ckroot = host
    step = _writer(ex, ckroot)
    reader = ["python3", "-c", READER]
    # the source's real path is tried too: every job has a uid of its own, so the kernel
    # keeps a reader out of the source's files whatever its team
    source = str(step)
    unshared = _spec("b-1", team, ckroot, reader, SOURCE=source)
    unshared.resume_from = str(step)  # no resume_source: the broker named no share
    with pytest.raises(JobDirError, match="not this job's checkpoint.*brokerctl share"):
        ex.launch(unshared)
    final = _run(ex, _shared(_spec("b-1", team, ckroot, reader, SOURCE=source), ckroot, step, scheme))
    assert final.state == AS.ATTEMPT_STATE_SUCCEEDED, final.message
    got = json.loads((ckroot / "b-1" / "attempt-1" / "result.json").read_text())
    view = Path(got["resume"])
    assert view != step and view.name == STEP and ex.work_dir in view.parents
    assert got["read"] == "weights\n"
    assert got["write_view"] == "Permission denied" and got["new_in_view"] == "Permission denied"
    reader_uid = pool.for_job("b-1", team).uid
    # as the rank saw it (the copy is removed once the attempt ends)
    assert set(got["stat"]) == {".", "model.pt", "manifest.json", "shard", "shard/0"}
    for rel, (uid, gid, mode) in got["stat"].items():
        is_dir = rel in (".", "shard")
        assert uid == 0 and gid == pool.for_job("b-1", team).gid, rel
        assert mode == (0o750 if is_dir else 0o440), rel
    assert not view.parent.exists(), "the copy outlived the attempt that read it"
    assert got["write_source"] == "Permission denied"  # another uid, even of one team
    assert reader_uid != pool.for_job("a-1", "alice").uid
    assert (step / "model.pt").read_text() == "weights\n"  # the trainer never wrote there
    assert (step / "model.pt").stat().st_uid == pool.for_job("a-1", "alice").uid


def test_planted_links_in_or_to_a_shared_checkpoint_are_refused(host) -> None:  # noqa: ANN001
    """Job a-1 plants a link to job o-1's checkpoints (another team's) as a step of its
    own, and a link inside a real step; a reader with a-1's share gets neither."""
    ex, pool, ckroot = host
    other = _run(ex, _spec("o-1", "olga", ckroot, ["bash", "-c", 'mkdir "$CB_CHECKPOINT_URI/step-000000005"'
                                                     ' && echo olga-secret > "$CB_CHECKPOINT_URI/step-000000005/model.pt"']))
    assert other.state == AS.ATTEMPT_STATE_SUCCEEDED
    olga = ckroot / "o-1" / "attempt-1" / "step-000000005"
    plant = (f'ln -s {olga} "$CB_CHECKPOINT_URI/step-000000020"; mkdir "$CB_CHECKPOINT_URI/step-000000030"'
             f' && ln -s {olga}/model.pt "$CB_CHECKPOINT_URI/step-000000030/model.pt"')
    step = _writer(ex, ckroot, plant)
    base = step.parent
    assert (base / "step-000000020").is_symlink()
    for bad in (base / "step-000000020", base / "step-000000030"):
        spec = _shared(_spec("b-1", "bob", ckroot, ["true"]), ckroot, bad)
        with pytest.raises(JobDirError, match="symlink"):
            ex.launch(spec)
    # '..' out of the shared prefix into olga's: refused by name before any walk
    sneaky = _shared(_spec("b-1", "bob", ckroot, ["true"]), ckroot,
                     ckroot / "a-1" / ".." / "o-1" / "attempt-1" / "step-000000005")
    with pytest.raises(JobDirError, match="not this job's checkpoint"):
        ex.launch(sneaky)
    # nothing of olga's was copied anywhere the reader could see
    assert not [p for p in (ex.work_dir / "jobs").rglob("model.pt")
                if p.read_text() == "olga-secret\n"]


def test_a_prefix_belongs_to_the_job_that_made_it(host) -> None:  # noqa: ANN001
    """Same team, same uid: job d-1 may not take a-1's prefix (or one inside it) as its
    own checkpoint directory, nor resume from a-1's step as if it were its own."""
    ex, _, ckroot = host
    step = _writer(ex, ckroot)
    for ckpt in (ckroot / "a-1" / "attempt-2", ckroot / "a-1" / "sub" / "attempt-1"):
        d = make_spec(["true"], job="d-1", nodes=1, gpus=1, ckpt=str(ckpt))
        d.spec.team = "alice"
        # per-job uids: a-1's directory is another identity's; under a uid per team the
        # agent's record of who made each prefix refuses it (both say whose it is)
        with pytest.raises(JobDirError, match="checkpoints of job a-1|not to this job's identity"):
            ex.launch(d)
    # a-1's own relaunch resumes from its own step in place (no copy)
    again = make_spec(["bash", "-c", 'test "$CB_RESUME_FROM" = "$WANT"'], job="a-1", attempt=2,
                      nodes=1, gpus=1, ckpt=str(ckroot / "a-1" / "attempt-2"), env={"WANT": str(step)})
    again.spec.team = "alice"
    again.resume_from = str(step)
    assert _run(ex, again).state == AS.ATTEMPT_STATE_SUCCEEDED


def test_a_standbys_go_gets_the_same_resume_rule(host) -> None:  # noqa: ANN001
    """Make-before-break: the Go names where the held standby resumes. A shared local
    checkpoint reaches it as the read-only copy too; one it may not read aborts it."""
    import json

    from checkpoint_layout.standby_go import Go, GoAction

    ex, _, ckroot = host
    step = _writer(ex, ckroot)
    wait_go = ('while [ ! -e "$CB_STANDBY_GO_FILE" ]; do sleep 0.05; done;'
               ' cp "$CB_STANDBY_GO_FILE" "$CB_CHECKPOINT_URI/go-seen.json"')
    for job, shared, want in (("s-1", True, "view"), ("s-2", False, "abort")):
        sb = _spec(job, "bob", ckroot, ["bash", "-c", wait_go])
        sb.standby = True
        if shared:
            _shared(sb, ckroot, step)
            sb.resume_from = ""  # a standby starts with nothing; its Go says where from
        ex.launch(sb)
        go = Go(GoAction.GO, str(step), "move")
        if shared:
            ex.go(job, 1, go)
        else:
            with pytest.raises(JobDirError, match="not this job's checkpoint"):
                ex.go(job, 1, go)
        final = Collector(ex).wait_terminal()
        assert final.state == AS.ATTEMPT_STATE_SUCCEEDED, final.message
        seen = json.loads((ckroot / job / "attempt-1" / "go-seen.json").read_text())
        if want == "view":
            assert seen["action"] == "go" and seen["resume_from"] != str(step)
            assert ex.work_dir in Path(seen["resume_from"]).parents
        else:
            assert seen["action"] == "abort" and not seen["resume_from"]


# A reader that keeps running after it read its copy: it reports a checkpoint of its own
# (the progress contract) only when told to, so the test sees the copy before and after.
HOLDER = r"""
import json, os, time
src, ck = os.environ["CB_RESUME_FROM"], os.environ["CB_CHECKPOINT_URI"]
open(os.path.join(ck, "seen"), "w").write(src)
while not os.path.exists(os.path.join(ck, "save")):
    time.sleep(0.05)
os.makedirs(os.path.join(ck, "step-000000011"))
p = os.environ["CB_PROGRESS_FILE"]
json.dump({"state": "running", "step": 11, "last_checkpoint_step": 11,
           "last_checkpoint_uri": os.path.join(ck, "step-000000011"), "time": time.time()},
          open(p + ".tmp", "w"))
os.replace(p + ".tmp", p)
while not os.path.exists(os.path.join(ck, "exit")):
    time.sleep(0.05)
"""


def _wait(cond, what: str, timeout: float = 30.0) -> None:  # noqa: ANN001
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_copy_is_removed_once_the_job_saves_its_own_checkpoint(host) -> None:  # noqa: ANN001
    """The copy of a shared checkpoint lives while the attempt may still need it: from
    launch until the attempt saved a checkpoint of its own (then every rank is past its
    start and every relaunch resumes from its own), and never past the attempt's end."""
    ex, _, ckroot = host
    step = _writer(ex, ckroot)
    spec = _shared(_spec("b-2", "bob", ckroot, ["python3", "-c", HOLDER]), ckroot, step)
    ex.launch(spec)
    own = ckroot / "b-2" / "attempt-1"
    _wait(lambda: (own / "seen").exists(), "the rank to read its copy")
    view = Path((own / "seen").read_text())
    assert view.name == STEP and (view / "model.pt").read_text() == "weights\n"
    collector = Collector(ex)
    for _ in range(10):  # still running, no checkpoint of its own: the copy stays
        collector.events.extend(ex.poll())
    assert view.exists()
    (own / "save").touch()
    _wait(lambda: (collector.events.extend(ex.poll()), not view.parent.exists())[1],
          "the copy to be removed after the job's own checkpoint")
    (own / "exit").touch()
    assert collector.wait_terminal().state == AS.ATTEMPT_STATE_SUCCEEDED
    assert (step / "model.pt").read_text() == "weights\n"  # the source is never touched


def test_an_agent_restart_removes_copies_of_attempts_that_ended(host) -> None:  # noqa: ANN001
    """A copy left behind (the agent died before the attempt's end was seen) is removed
    at the next start; a running attempt's copy is kept."""
    ex, pool, ckroot = host
    step = _writer(ex, ckroot)
    ex.launch(_shared(_spec("b-3", "bob", ckroot, ["python3", "-c", HOLDER]), ckroot, step))
    own = ckroot / "b-3" / "attempt-1"
    _wait(lambda: (own / "seen").exists(), "the rank to read its copy")
    live_view = Path((own / "seen").read_text()).parent
    stale = ex.work_dir / "jobs" / "gone-1" / "resume-4"
    (stale / STEP).mkdir(parents=True)
    (stale / STEP / "model.pt").write_text("left behind")
    again = LocalExecutor(ex.work_dir, ranks_per_node=1, python=sys.executable, identities=pool,
                          checkpoint_roots=[str(ckroot)])
    again.recover()
    assert not stale.exists() and live_view.exists()
    (own / "save").touch()
    (own / "exit").touch()
    assert Collector(ex).wait_terminal().state == AS.ATTEMPT_STATE_SUCCEEDED
    assert not live_view.exists()
    again.shutdown()
