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

from broker.store.base import AlreadyExists, NotFound, VersionConflict
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


def test_job_creations_without_savepoints_fall_back_when_a_member_fails_after_its_row(
        tmp_path: Path) -> None:
    """Creations are written whole, without a savepoint per member; when that fails
    (here: an events row of one new job's id already stored, left by hand, and a
    repeated request id) the group is written again with a savepoint per member: the
    stray row's job is numbered after it, the repeat fails alone, and the others are
    written once each, with their riders."""
    store = SQLiteStore(str(tmp_path / "broker.sqlite"))
    with store._lock:  # noqa: SLF001 - a stray events row, as an operator tool might leave
        store._conn.execute("INSERT INTO events (job_id, seq, data) VALUES (?, ?, ?)",  # noqa: SLF001
                            ("j-2", 1, pb.JobEvent(job_id="j-2", seq=1, type="stray").SerializeToString()))
    rider = ("audit", "k-1", pb.JobEvent(type="rider"))
    results = store.create_jobs([
        (make_job("j-1", team="a", crid="r-1"), [ev("submitted")], [rider]),
        (make_job("j-2", team="a", crid="r-2"), [ev("submitted")]),
        (make_job("j-3", team="a", crid="r-1"), [ev("submitted")]),  # repeats j-1's request id
    ])
    assert [type(r) for r in results] == [pb.Job, pb.Job, AlreadyExists]
    assert [e.type for e in store.list_events("j-2")] == ["stray", "submitted"]
    assert [e.seq for e in store.list_events("j-2")] == [1, 2]
    assert [e.seq for e in store.list_events("j-1")] == [1]
    assert store.list_events("j-3") == []
    assert {j.id for j in store.list_jobs(limit=0)} == {"j-1", "j-2"}
    assert store.get_record("audit", "k-1", pb.JobEvent).type == "rider"


def test_a_batch_of_new_jobs_is_three_inserts(tmp_path: Path) -> None:
    """A batch without duplicates: one INSERT each for the jobs, their events and their
    riders, no savepoint and no MAX(seq) read (new jobs' events are numbered from 1)."""
    store = SQLiteStore(str(tmp_path / "broker.sqlite"))
    traced: list[str] = []
    store._conn.set_trace_callback(traced.append)  # noqa: SLF001 - the statements it ran
    out = store.create_jobs([(make_job(f"j-{i}", team="a", crid=f"r-{i}"), [ev("submitted"), ev("note")],
                              [("audit", f"k-{i}", pb.JobEvent(type=f"rider-{i}"))]) for i in range(5)])
    store._conn.set_trace_callback(None)  # noqa: SLF001
    assert all(isinstance(j, pb.Job) for j in out)
    for i in range(5):
        assert [e.seq for e in store.list_events(f"j-{i}")] == [1, 2]
        assert store.get_record("audit", f"k-{i}", pb.JobEvent).type == f"rider-{i}"
        assert store.find_job_by_request_id("a", f"r-{i}").id == f"j-{i}"
    assert not [s for s in traced if "MAX(seq)" in s or "SAVEPOINT" in s], traced
    assert len([s for s in traced if s.startswith("INSERT")]) == 3, traced
