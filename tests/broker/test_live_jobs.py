"""The scheduler's live-job set (broker/scheduling/live_jobs.py): kept from commits,
the higher version wins when commits are reported out of order, terminal jobs
leave, a full store read happens first, after ``resync_s`` and once detached."""

from __future__ import annotations

from broker.scheduling.live_jobs import LiveJobs
from computebroker.v1 import common_pb2 as pb


def job(jid: str, version: int, phase: int = pb.JOB_PHASE_PENDING) -> pb.Job:
    return pb.Job(id=jid, version=version, phase=phase)


def test_commits_update_the_set_between_reads() -> None:
    store = [job("j-b", 1), job("j-a", 3, pb.JOB_PHASE_RUNNING)]
    now = [0.0]
    live = LiveJobs(lambda: list(store), resync_s=30.0, clock=lambda: now[0])
    assert [j.id for j in live.current()] == ["j-a", "j-b"] and live.full_reads == 1
    live.committed(job("j-c", 1))
    live.committed(job("j-a", 5, pb.JOB_PHASE_RUNNING))
    live.committed(job("j-a", 4, pb.JOB_PHASE_SUCCEEDED))  # an older write reported late
    live.committed(job("j-b", 2, pb.JOB_PHASE_CANCELLED))
    got = {j.id: j.version for j in live.current()}
    assert got == {"j-a": 5, "j-c": 1} and live.full_reads == 1
    live.committed(job("j-a", 4, pb.JOB_PHASE_SUCCEEDED))  # older than the kept copy
    assert {j.id: j.version for j in live.current()} == {"j-a": 5, "j-c": 1}
    store[:] = [job("j-z", 1)]  # written behind the applier's back
    now[0] = 31.0
    assert [j.id for j in live.current()] == ["j-z"] and live.full_reads == 2
    live.detach()
    store[:] = [job("j-y", 1)]
    assert [j.id for j in live.current()] == ["j-y"] and live.full_reads == 3


def big_job(jid: str, version: int = 1) -> pb.Job:
    j = job(jid, version)
    j.spec.team = "ml"
    j.spec.priority_class = "training"
    j.spec.command.extend(["python", "-m", "train"])
    j.spec.resources.nodes = 2
    j.spec.allowed_regions.append("us-east-2")
    j.spec.labels["cb.recovery-policy"] = "failover"  # the broker's own label: a pass reads it
    for k in range(12):
        j.spec.labels[f"example.com/label-{k}"] = f"v{k}"  # the users': no pass reads them
    for k in range(40):
        j.spec.env[f"SECRET_{k}"] = "x" * 40
    return j


def test_the_set_keeps_jobs_without_env_and_users_labels() -> None:
    """What no pass reads is not held for every pending job (most of its memory,
    and the teams' secrets); everything else is the committed job's."""
    full = big_job("j-a")
    live = LiveJobs(lambda: [big_job("j-b")], resync_s=30.0, clock=lambda: 0.0)
    live.committed(full)
    got = {j.id: j for j in live.current()}
    assert set(got) == {"j-a", "j-b"}
    for j in got.values():
        assert not j.spec.env and list(j.spec.command) == ["python", "-m", "train"]
        assert dict(j.spec.labels) == {"cb.recovery-policy": "failover"}
        assert j.spec.resources.nodes == 2 and list(j.spec.allowed_regions) == ["us-east-2"]
        assert j.spec.team == "ml" and j.spec.priority_class == "training"
    expected = pb.Job()
    expected.CopyFrom(full)
    expected.spec.ClearField("env")
    expected.spec.ClearField("labels")
    expected.spec.labels["cb.recovery-policy"] = "failover"
    assert got["j-a"] == expected
    assert full.spec.env and full.spec.command and len(full.spec.labels) == 13  # the committed job untouched
    assert got["j-a"].ByteSize() < full.ByteSize() / 3


def test_a_resync_keeps_the_copies_of_unchanged_jobs() -> None:
    store = [big_job("j-a", 1), big_job("j-b", 1)]
    now = [0.0]
    live = LiveJobs(lambda: list(store), resync_s=30.0, clock=lambda: now[0])
    first = {j.id: j for j in live.current()}
    store[1] = big_job("j-b", 2)
    now[0] = 31.0
    second = {j.id: j for j in live.current()}
    assert live.full_reads == 2
    assert second["j-a"] is first["j-a"]  # same version: not copied again
    assert second["j-b"].version == 2 and not second["j-b"].spec.env


def test_a_resync_parses_only_the_jobs_whose_version_moved() -> None:
    """With the stored versions at hand, a re-read reads the changed and new jobs alone;
    an unchanged job keeps its copy, a finished or deleted one leaves."""
    store = {j.id: j for j in (big_job("j-a", 1), big_job("j-b", 1), big_job("j-c", 1))}
    reads: list[str] = []

    def read_one(jid: str) -> pb.Job | None:
        reads.append(jid)
        return store.get(jid)

    now = [0.0]
    live = LiveJobs(lambda: list(store.values()), resync_s=30.0, clock=lambda: now[0],
                    read_versions=lambda: {j.id: j.version for j in store.values()
                                           if j.phase == pb.JOB_PHASE_PENDING},
                    read_one=read_one)
    first = {j.id: j for j in live.current()}  # the first read is a full one
    assert set(first) == {"j-a", "j-b", "j-c"} and live.rows_parsed == 3 and not reads
    store["j-b"] = big_job("j-b", 2)  # written behind the applier's back
    store["j-d"] = big_job("j-d", 1)  # created behind it
    store["j-c"] = job("j-c", 2, pb.JOB_PHASE_SUCCEEDED)  # finished behind it
    now[0] = 31.0
    second = {j.id: j for j in live.current()}
    assert sorted(reads) == ["j-b", "j-d"] and live.rows_parsed == 5 and live.full_reads == 2
    assert set(second) == {"j-a", "j-b", "j-d"}
    assert second["j-a"] is first["j-a"] and second["j-b"].version == 2
    assert not second["j-d"].spec.env


def test_a_resync_does_not_read_a_job_whose_commit_was_reported() -> None:
    store = {"j-a": big_job("j-a", 1)}
    reads: list[str] = []

    def read_one(jid: str) -> pb.Job | None:
        reads.append(jid)
        return store.get(jid)

    now = [0.0]
    live = LiveJobs(lambda: list(store.values()), resync_s=30.0, clock=lambda: now[0],
                    read_versions=lambda: {j.id: j.version for j in store.values()}, read_one=read_one)
    live.current()
    store["j-a"] = big_job("j-a", 2)
    store["j-b"] = big_job("j-b", 1)
    live.committed(store["j-a"])  # reported by the applier: no read needed
    live.committed(store["j-b"])
    now[0] = 31.0
    got = {j.id: j.version for j in live.current()}
    assert got == {"j-a": 2, "j-b": 1} and reads == []
