"""WatchJob fan-out: many watchers of one job all see its events (per-job hub
wake-ups, one shared store read per change, broker/jobs/shared_reads.py)."""

from __future__ import annotations

import threading

from broker.jobs.shared_reads import SharedReads
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, spec, wait_until


def test_every_watcher_gets_the_terminal_event(broker: Broker) -> None:
    broker.team()
    job = broker.submit(spec("watched"))
    other = broker.submit(spec("other"))
    n = 20  # the test broker has 32 server threads; each stream holds one
    got: dict[int, list[str]] = {}
    started = threading.Semaphore(0)

    def watch(w: int) -> None:
        types = got.setdefault(w, [])
        for ev in broker.jobs.WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=60):
            types.append(ev.type)
            if ev.type == "submitted":
                started.release()
            if ev.to_phase == pb.JOB_PHASE_CANCELLED:
                return

    threads = [threading.Thread(target=watch, args=(w,)) for w in range(n)]
    for th in threads:
        th.start()
    for _ in range(n):
        assert started.acquire(timeout=60)
    broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=other.id))  # another job's write: no event here
    broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id, reason="done watching"))
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert all(types[0] == "submitted" and types[-1] == "cancelled" for types in got.values()), got
    assert len(got) == n


def test_concurrent_identical_reads_are_made_once() -> None:
    now = [0.0]
    reads: list[int] = []
    gate = threading.Event()
    shared = SharedReads(ttl_s=0.25, clock=lambda: now[0])

    def fetch() -> list[int]:
        gate.wait(30)
        reads.append(1)
        return [len(reads)]

    out: list[list[int]] = []
    threads = [threading.Thread(target=lambda: out.append(shared.get(("ev", "j", 0, 1), fetch)))
               for _ in range(20)]
    for th in threads:
        th.start()
    wait_until(lambda: len(shared._flights) == 1, 10, "the first read to start")  # noqa: SLF001
    gate.set()
    for th in threads:
        th.join(30)
    assert out == [[1]] * 20 and len(reads) == 1
    assert shared.get(("ev", "j", 0, 2), fetch) == [2]  # the job changed: a new read
    now[0] = 1.0  # past the TTL: read again even with the same counter
    assert shared.get(("ev", "j", 0, 2), fetch) == [3]
