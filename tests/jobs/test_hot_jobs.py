"""HotJobs (broker/jobs/hot_jobs.py): the agent streams' in-memory read of the jobs they
run. What must hold: only commits fill it, the newest version wins whatever order the
commits are reported in, a job that stops holding GPUs is forgotten, an entry too old
is a miss, and what it hands out is its own copy."""

from __future__ import annotations

from broker.jobs.hot_jobs import HotJobs
from computebroker.v1 import common_pb2 as pb


def job(version: int, phase: int = pb.JOB_PHASE_RUNNING, step: int = 0, jid: str = "j1") -> pb.Job:
    j = pb.Job(id=jid, version=version, phase=phase)
    j.progress.step = step
    return j


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_newest_commit_wins_in_any_order() -> None:
    hot = HotJobs()
    hot.committed(job(3, step=30))
    hot.committed(job(2, step=20))  # reported late by a concurrent writer
    got = hot.get("j1")
    assert got is not None and got.version == 3 and got.progress.step == 30
    hot.committed(job(4, step=40))
    got = hot.get("j1")
    assert got is not None and got.version == 4 and got.progress.step == 40


def test_only_jobs_holding_gpus_are_kept_and_an_end_forgets() -> None:
    hot = HotJobs()
    hot.committed(job(1, phase=pb.JOB_PHASE_PENDING))
    assert hot.get("j1") is None and len(hot) == 0
    hot.committed(job(2, phase=pb.JOB_PHASE_LAUNCHING))
    assert hot.get("j1") is not None
    hot.committed(job(3, phase=pb.JOB_PHASE_SUCCEEDED))
    assert hot.get("j1") is None and len(hot) == 0
    # the RUNNING version's commit told after the end's (two writers of one job): the
    # end's tombstone keeps the stale copy out
    hot.committed(job(2, phase=pb.JOB_PHASE_RUNNING))
    assert hot.get("j1") is None


def test_a_late_older_copy_after_a_failed_launch_stays_out() -> None:
    """LAUNCHING (never kept before) then back to PENDING, told in reverse order."""
    hot = HotJobs()
    hot.committed(job(3, phase=pb.JOB_PHASE_PENDING))
    hot.committed(job(2, phase=pb.JOB_PHASE_LAUNCHING))
    assert hot.get("j1") is None


def test_tombstones_are_pruned_after_a_while() -> None:
    clock = Clock()
    hot = HotJobs(tombstone_s=30.0, clock=clock)
    for i in range(100):
        hot.committed(job(1, phase=pb.JOB_PHASE_PENDING, jid=f"q{i}"))
    assert len(hot._jobs) == 100  # tombstones
    clock.t += 31.0
    hot.committed(job(1, jid="r"))
    assert set(hot._jobs) == {"r"}


def test_an_entry_does_not_age_out() -> None:
    """A job whose trainer reports no progress is written once and talked about for
    hours; a leader behind on its writes must not fall back to store reads."""
    clock = Clock()
    hot = HotJobs(tombstone_s=30.0, clock=clock)
    hot.committed(job(1))
    clock.t += 3600.0
    assert hot.get("j1") is not None


def test_kept_copy_is_not_the_callers_object() -> None:
    hot = HotJobs()
    mine = job(1, step=5)
    hot.committed(mine)
    mine.progress.step = 999  # the applier's caller edits the job it got back
    got = hot.get("j1")
    assert got is not None and got.progress.step == 5


def test_clear_forgets_everything_and_counts() -> None:
    hot = HotJobs()
    hot.committed(job(1, jid="a"))
    hot.committed(job(1, jid="b"))
    assert hot.get("a") is not None and hot.hits == 1
    hot.clear()
    assert hot.get("a") is None and hot.get("b") is None and hot.misses == 2
