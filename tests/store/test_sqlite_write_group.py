"""SQLite: job updates and log appends join the store's write group (one transaction and
one fsync for the writes that queued meanwhile), and each still stands alone.

Why: every agent stream's reader writes progress, ends and log chunks one at a time;
one fsync each capped a leader at the disk's fsync rate (about 200 a second on the
benchmark machine) with a few thousand attempts running. Grouping is forced
deterministically here (the store's write lock is held while the writers queue),
never by timing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from broker.store.base import NotFound, VersionConflict
from broker.store.sqlite import SQLiteStore
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import logs_pb2 as lpb
from tests.store.test_conformance import ev, make_job


def chunk(job_id: str, offset: int, lines: list[str]) -> lpb.LogChunk:
    return lpb.LogChunk(job_id=job_id, attempt=1, rank=0, stream="stdout", offset=offset, lines=lines,
                        sizes=[len(x) + 1 for x in lines], time=time.time())


def test_updates_and_log_chunks_share_one_commit_and_fail_alone(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "broker.sqlite"))
    n = 12
    for i in range(n):
        store.create_job(make_job(f"j-{i}"))
    results: dict[str, object] = {}

    def update(i: int, version: int) -> None:
        job = store.get_job(f"j-{i}")
        job.progress.step = 100 + i
        try:
            results[f"u{i}"] = store.update_job(job, version, [ev("progress")])
        except (VersionConflict, NotFound) as e:
            results[f"u{i}"] = e

    def logs(i: int) -> None:
        results[f"l{i}"] = store.append_logs(f"j-{i}", chunk(f"j-{i}", 0, [f"line {i}a", f"line {i}b"]),
                                             1 << 20)

    def gone() -> None:
        try:
            store.update_job(make_job("j-missing"), 1)
        except NotFound as e:
            results["gone"] = e

    threads = [threading.Thread(target=update, args=(i, 1 if i != 3 else 7)) for i in range(n)]
    threads += [threading.Thread(target=logs, args=(i,)) for i in range(n)]
    threads.append(threading.Thread(target=gone))
    groups_before = store._writes.groups  # noqa: SLF001 - the test's view of the batching
    with store._lock:  # noqa: SLF001 - hold the writer: everyone queues behind the first
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(store._writes._queue) < len(threads) - 1:  # noqa: SLF001
            assert time.monotonic() < deadline, "the writers never queued"
            time.sleep(0.005)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    # the first writer's own transaction, then one for all the others
    assert store._writes.groups - groups_before == 2  # noqa: SLF001
    assert isinstance(results["u3"], VersionConflict)  # a stale version fails alone ...
    assert isinstance(results["gone"], NotFound)  # ... and so does a missing job
    for i in range(n):
        job = store.get_job(f"j-{i}")
        if i == 3:
            assert job.version == 1 and job.progress.step == 0 and store.list_events("j-3") == []
            continue
        assert isinstance(results[f"u{i}"], pb.Job) and results[f"u{i}"].version == 2
        assert job.version == 2 and job.progress.step == 100 + i
        assert [e.type for e in store.list_events(f"j-{i}")] == ["progress"]
    for i in range(n):  # every chunk stored, whatever happened to the updates beside it
        lines, dropped = store.read_logs(f"j-{i}", 1)
        assert [ln.text for ln in lines] == [f"line {i}a", f"line {i}b"] and dropped == 0
        assert results[f"l{i}"] == sum(len(x) + 1 for x in (f"line {i}a", f"line {i}b"))
    store.close()
    # and durably: a fresh open of the file sees the same
    again = SQLiteStore(str(tmp_path / "broker.sqlite"))
    assert again.get_job("j-5").progress.step == 105
    assert len(again.read_logs("j-5", 1)[0]) == 2
    again.close()
