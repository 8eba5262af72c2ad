"""SQLite: one write group's job updates, log chunks and record puts are a few multi-row
statements, whatever the group's size (broker/store/sqlite_batch.py).

What is pinned here: the statements a group costs do not grow with its members; a job
written twice in one group is written in queue order (the later update sees the earlier
one's version, events and log lines are numbered in order, progress never goes back);
the log bound trims the same lines as chunk by chunk; and the decision on errors: a
member that fails fails **alone** and every other member of the group is written and
acknowledged with its own result -- a stale version or a missing job without leaving
the batched write, a statement that fails (here an update breaking the request-id
index) by writing the group again a savepoint per member. Groups are handed to the
store's group writer directly: no threads, no timing."""

from __future__ import annotations

import time
from pathlib import Path

from broker.store.base import AlreadyExists, NotFound, VersionConflict
from broker.store.sqlite import SQLiteStore
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import logs_pb2 as lpb
from tests.store.test_conformance import ev, make_job


def chunk(job_id: str, offset: int, lines: list[str], attempt: int = 1) -> lpb.LogChunk:
    return lpb.LogChunk(job_id=job_id, attempt=attempt, rank=0, stream="stdout", offset=offset,
                        lines=lines, sizes=[len(x) + 1 for x in lines], time=time.time())


def stepped(store: SQLiteStore, job_id: str, step: int) -> pb.Job:
    job = store.get_job(job_id)
    job.progress.step = step
    return job


def traced_group(store: SQLiteStore, group: list[tuple[str, object]]) -> tuple[list[object], list[str]]:
    """Write ``group`` as one group; its results and the statements it ran."""
    traced: list[str] = []
    store._conn.set_trace_callback(traced.append)  # noqa: SLF001 - the statements it ran
    try:
        out = store._write_group(group)  # noqa: SLF001 - one group, built by the test
    finally:
        store._conn.set_trace_callback(None)  # noqa: SLF001
    return out, traced


def progress_group(store: SQLiteStore, ids: list[str]) -> list[tuple[str, object]]:
    group: list[tuple[str, object]] = []
    for i, job_id in enumerate(ids):
        group.append(("update", (stepped(store, job_id, 50 + i), 1, [ev("progress")])))
        group.append(("logs", (job_id, chunk(job_id, 0, [f"{job_id} a", f"{job_id} b"]), 1 << 20)))
        group.append(("record", ("agent-note", job_id, pb.JobEvent(type=f"note {job_id}").SerializeToString())))
    return group


def test_a_group_costs_the_same_statements_at_4_and_at_200_members(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "broker.sqlite"))
    small = [f"s-{i}" for i in range(4)]
    big = [f"b-{i:03d}" for i in range(200)]
    store.create_jobs([(make_job(j), []) for j in small + big])
    counts = []
    for ids in (small, big):
        out, traced = traced_group(store, progress_group(store, ids))
        assert all(isinstance(r, pb.Job) for r in out[0::3]), out
        assert out[1::3] == [2 * (len(j) + 3) for j in ids]  # each stream's end: both lines
        assert not [s for s in traced if "SAVEPOINT" in s], traced  # no member alone
        counts.append(len(traced))
    # BEGIN, 2 for the updates (versions and last seqs, UPDATE) and 1 for their events, 4
    # for the chunks (1 read, lines, streams, attempts), 1 for the records, COMMIT; at 200
    # members the 400 log lines take a second INSERT (256 rows a statement)
    assert counts == [10, 11], counts
    for j in big:
        got = store.get_job(j)
        assert got.version == 2 and got.progress.step == 50 + big.index(j)
        assert [e.type for e in store.list_events(j)] == ["progress"]
        assert [ln.text for ln in store.read_logs(j, 1)[0]] == [f"{j} a", f"{j} b"]
        assert store.get_record("agent-note", j, pb.JobEvent).type == f"note {j}"
    store.close()


def test_one_jobs_writes_in_one_group_apply_in_queue_order(tmp_path: Path) -> None:
    """Two updates of a job in one group: the second was computed on the first's
    result (version 2), a third on the stale version 1 conflicts; their events and the
    stream's two chunks (the second overlapping the first) are numbered in order; a
    record put twice keeps the later put."""
    store = SQLiteStore(str(tmp_path / "broker.sqlite"))
    store.create_jobs([(make_job("j-1"), [ev("submitted")]), (make_job("j-2"), [])])
    first, second = stepped(store, "j-1", 100), stepped(store, "j-1", 150)
    stale = stepped(store, "j-1", 120)
    out, traced = traced_group(store, [
        ("update", (first, 1, [ev("progress")])),
        ("logs", ("j-1", chunk("j-1", 0, ["one", "two"]), 1 << 20)),
        ("record", ("k", "x", b"old")),
        ("update", (second, 2, [ev("progress"), ev("checkpoint")])),
        ("update", (stale, 1, [ev("progress")])),
        ("logs", ("j-1", chunk("j-1", 4, ["two", "three"]), 1 << 20)),  # resends "two"
        ("update", (stepped(store, "j-2", 7), 1, [])),
        ("record", ("k", "x", b"new")),
    ])
    assert isinstance(out[0], pb.Job) and out[0].version == 2 and out[0].progress.step == 100
    assert isinstance(out[3], pb.Job) and out[3].version == 3 and out[3].progress.step == 150
    assert isinstance(out[4], VersionConflict)  # fails alone, inside the batched write
    assert out[1] == 8 and out[5] == 14  # each chunk's stream end
    assert isinstance(out[6], pb.Job) and out[6].version == 2
    assert not [s for s in traced if "SAVEPOINT" in s or "ROLLBACK" in s], traced
    job = store.get_job("j-1")
    assert job.version == 3 and job.progress.step == 150  # never the stale 120
    assert [(e.seq, e.type) for e in store.list_events("j-1")] == [
        (1, "submitted"), (2, "progress"), (3, "progress"), (4, "checkpoint")]
    lines, dropped = store.read_logs("j-1", 1)
    assert [(ln.seq, ln.text) for ln in lines] == [(1, "one"), (2, "two"), (3, "three")] and dropped == 0
    assert store._read("SELECT data FROM records WHERE kind = 'k' AND key = 'x'") == [(b"new",)]  # noqa: SLF001
    store.close()


def test_a_failing_statement_fails_its_member_alone_and_the_rest_is_acknowledged(tmp_path: Path) -> None:
    """An update that would give a job another job's request id breaks the unique index
    inside the multi-row UPDATE: the transaction is rolled back and the group written
    again a savepoint per member; that member hears AlreadyExists, a missing job hears
    NotFound, and every other member gets its own result, written once."""
    store = SQLiteStore(str(tmp_path / "broker.sqlite"))
    store.create_jobs([(make_job(f"j-{i}", team="a", crid=f"r-{i}"), []) for i in range(4)])
    thief = stepped(store, "j-2", 9)
    thief.client_request_id = "r-0"
    group: list[tuple[str, object]] = [
        ("update", (stepped(store, "j-0", 10), 1, [ev("progress")])),
        ("logs", ("j-1", chunk("j-1", 0, ["hello"]), 1 << 20)),
        ("update", (thief, 1, [ev("progress")])),
        ("update", (make_job("j-missing"), 1, [])),
        ("update", (stepped(store, "j-3", 30), 1, [])),
        ("record", ("k", "y", b"kept")),
    ]
    out, traced = traced_group(store, group)
    assert "ROLLBACK" in traced and any("SAVEPOINT" in s for s in traced), traced  # the careful way
    assert isinstance(out[0], pb.Job) and out[0].progress.step == 10
    assert out[1] == 6
    assert isinstance(out[2], AlreadyExists)
    assert isinstance(out[3], NotFound)
    assert isinstance(out[4], pb.Job) and out[4].progress.step == 30
    assert store.get_job("j-2").version == 1 and store.list_events("j-2") == []
    assert store.get_job("j-0").version == 2 and [e.seq for e in store.list_events("j-0")] == [1]
    assert store.get_job("j-3").progress.step == 30
    assert [ln.text for ln in store.read_logs("j-1", 1)[0]] == ["hello"]  # written once
    assert store._read("SELECT data FROM records WHERE key = 'y'") == [(b"kept",)]  # noqa: SLF001
    store.close()


def test_the_log_bound_trims_the_same_lines_as_chunk_by_chunk(tmp_path: Path) -> None:
    """Chunks of two attempts over a small bound, once as one group, once a group per
    chunk: the same lines survive with the same seqs, and the same count is dropped."""
    def chunks() -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        for attempt in (1, 2):
            offset = 0
            for k in range(5):
                texts = [f"a{attempt} line {k}.{m} " + "x" * (10 * m) for m in range(3)]
                out.append(("logs", ("j-1", chunk("j-1", offset, texts, attempt), 120)))
                offset += sum(len(t) + 1 for t in texts)
        return out

    stores = []
    for name, grouped in (("one", True), ("each", False)):
        store = SQLiteStore(str(tmp_path / f"{name}.sqlite"))
        store.create_job(make_job("j-1"))
        if grouped:
            store._write_group(chunks())  # noqa: SLF001
        else:
            for c in chunks():
                store._write_group([c])  # noqa: SLF001
        stores.append(store)
    for attempt in (1, 2):
        got = [s.read_logs("j-1", attempt) for s in stores]
        assert [(ln.seq, ln.text) for ln in got[0][0]] == [(ln.seq, ln.text) for ln in got[1][0]]
        assert got[0][1] == got[1][1] > 0  # dropped
        assert sum(len(ln.text) + 1 for ln in got[0][0]) <= 120
    assert stores[0].log_offsets("j-1") == stores[1].log_offsets("j-1")
    for s in stores:
        s.close()
