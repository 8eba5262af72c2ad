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
