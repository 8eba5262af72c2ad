"""Concurrent SubmitJob through a real gRPC broker (group commit, live-job cache).

Behaviour only: concurrent submits with their own request ids each create one job,
concurrent retries of one request id create exactly one (every caller gets that
job), every job has exactly one "submitted" event, and the scheduler, which keeps
its live jobs from the applier's commits instead of re-reading the store, sees
every one of them.
"""

from __future__ import annotations

import threading

from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, spec, wait_until


def test_concurrent_submits_none_lost_or_doubled(broker: Broker) -> None:
    broker.team()
    threads_n, per_thread = 16, 6
    out: list[tuple[str, str, bool]] = []
    lock = threading.Lock()
    start = threading.Barrier(threads_n)

    def worker(t: int) -> None:
        start.wait(30)
        for k in range(per_thread):
            crid = "same-request" if k % 3 == 0 else f"req-{t}-{k}"
            r = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec(f"j{t}-{k}"), client_request_id=crid),
                                      timeout=60)
            with lock:
                out.append((crid, r.job.id, r.created))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert len(out) == threads_n * per_thread
    same = [(jid, created) for crid, jid, created in out if crid == "same-request"]
    assert len({jid for jid, _ in same}) == 1  # every retry got the one job
    assert sum(created for _, created in same) == 1
    own = [(jid, created) for crid, jid, created in out if crid != "same-request"]
    assert all(created for _, created in own) and len({jid for jid, _ in own}) == len(own)
    ids = {jid for _, jid, _ in out}
    stored = {j.id for j in broker.store.list_jobs(limit=0)}
    assert stored == ids
    for jid in ids:
        assert [e.type for e in broker.events(jid)].count("submitted") == 1
    loop = broker.server.scheduler
    assert loop is not None
    wait_until(lambda: loop.last_snapshot is not None
               and {j.id for j in loop.last_snapshot.pending} == ids, 30,
               "the scheduler's pass to see every submitted job")
