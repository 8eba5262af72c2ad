"""One SQLite write group's job updates, log chunks and record puts as multi-row statements.

Why: a write group (broker/store/group_commit.py) is one transaction, but each member
used to be its own statements: a savepoint, the compare-and-set UPDATE, a MAX(seq) read
and an INSERT for its events, a release; a log chunk two reads and three writes inside
its savepoint. Python's sqlite3 lets go of the GIL for every statement it steps (and
for every row it fetches), and with 10,000 running attempts the group's leader waited
to get it back behind a hundred busy threads each time: at ~5 statements a member and
~100 members a group, a group took seconds and the agents' acks fell a minute behind
(benchmarks/bench_running.py; py-spy found most agent-lane threads waiting in the
write group). Here a group costs a fixed handful of statements whatever its size:

* **updates**: one read of every target job's version and last event seq, then one
  ``UPDATE ... FROM (VALUES ...)`` per table-full; members whose version does not match
  get their own VersionConflict / NotFound from that read, without a write (the
  transaction holds the write lock, so the read is exact). Two updates of one job in
  one group are applied in queue order (the later one sees the earlier's version, as
  one after the other would), in separate statements. Their events: one multi-row INSERT.
* **log chunks**: one read of the touched streams' end offsets and the touched
  attempts' totals, then dedup, numbering and the per-attempt bound worked out in
  Python in queue order (logs_common.py, the same rules as one chunk at a time), then
  one multi-row INSERT of the lines and one upsert each of the streams and attempts.
  An attempt over its bound is trimmed with its own two statements (rare: once the
  bound is reached).
* **records**: one multi-row upsert (a later put of the same key wins, as in order).

A statement's rows are padded (with NULL rows it drops) to a power of two, so each
table has a few distinct statements, prepared once and cached. Reads come back as one
JSON row (``json_group_array``), not a row per member: each
fetched row is a GIL round trip too.

Nothing is coalesced away: every update's write is made (a caller was told its version),
and a member is acknowledged only once the group's COMMIT (its fsync) returned. Any
statement failing here (an UPDATE breaking the request-id index, a disk error) raises
:class:`RetryCarefully`: the store rolls the whole transaction back and writes the group
again the old way, a savepoint per member, so a member that fails fails alone and the
others are acknowledged once (tests/store/test_sqlite_batch.py).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Sequence

from broker.store import logs_common as lc
from broker.store.base import (
    NotFound,
    StoreError,
    VersionConflict,
    job_columns,
    numbered_events,
    versioned_copy,
)
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import logs_pb2 as lpb

MAX_ROWS = 256  # rows per multi-row statement (SQLite's variable limit is far above 256 x 8)
MIN_ROWS = 8  # the smallest statement: fewer rows are padded up to it


class RetryCarefully(Exception):  # noqa: N818 - a signal, not an error
    """A batched write failed: roll the transaction back and write the group again with
    a savepoint per member (each member then fails alone)."""


@functools.lru_cache(maxsize=64)
def multi_row(head: str, width: int, rows: int, tail: str) -> str:
    """``head`` + ``rows`` placeholder groups of ``width`` + ``tail``."""
    one = "(" + ", ".join("?" * width) + ")"
    return head + ", ".join([one] * rows) + tail


def padded(n: int) -> int:
    """The statement size for ``n`` rows (n <= MAX_ROWS): the next power of two from
    ``MIN_ROWS``, so a table has at most 6 distinct statements to prepare and cache, and
    a group of any size costs one statement per ``MAX_ROWS`` rows. The rows it pads
    with are NULLs that the statement's ``column1 IS NOT NULL`` filter (inserts) or join
    (updates) drops."""
    size = MIN_ROWS
    while size < n:
        size *= 2
    return size


def insert_rows(conn: sqlite3.Connection, head: str, width: int, flat: list[object], tail: str) -> int:
    """Write ``flat`` (rows of ``width`` values, concatenated) in one statement per
    ``MAX_ROWS`` rows: ``head`` opens a VALUES list that ``tail`` closes (see
    :func:`values_insert`). Returns the rows changed."""
    changed = 0
    step = MAX_ROWS * width
    for at in range(0, len(flat), step):
        part = flat[at:at + step]
        rows = len(part) // width
        size = padded(rows)
        if size > rows:
            part = part + [None] * ((size - rows) * width)
        changed += conn.execute(multi_row(head, width, size, tail), part).rowcount
    return changed


def values_insert(into: str, upsert: str = "") -> tuple[str, str]:
    """(head, tail) of a padded multi-row INSERT: ``INSERT INTO t (cols)`` + rows."""
    return f"{into} SELECT * FROM (VALUES ", f") WHERE column1 IS NOT NULL{upsert}"


def _json_one(conn: sqlite3.Connection, sql: str, *args: object) -> object:
    """A read whose answer is one JSON value (one row: one GIL round trip)."""
    (data,) = conn.execute(sql, [json.dumps(a) for a in args]).fetchone()
    return json.loads(data) if data else None


# ---- updates --------------------------------------------------------------------------
# Each target job's version and last event seq, in one read (one statement less for the
# group's writer to win the interpreter lock back after: the writer thread's time).
_VERSIONS = ("SELECT json_group_object(id, json_array(version,"
             " (SELECT MAX(seq) FROM events WHERE job_id = jobs.id)))"
             " FROM jobs WHERE id IN (SELECT value FROM json_each(?))")
_UPDATE_HEAD = "UPDATE jobs SET team = v.column2, client_request_id = v.column3, phase = v.column4," \
               " region = v.column5, version = v.column6, data = v.column7 FROM (VALUES "
_UPDATE_TAIL = ") AS v WHERE jobs.id = v.column1 AND jobs.version = v.column8"
_INSERT_EVENTS = values_insert("INSERT INTO events (job_id, seq, data)")

UpdateItem = tuple[pb.Job, int, Sequence[pb.JobEvent]]


def write_updates(conn: sqlite3.Connection, items: list[UpdateItem]) -> list[pb.Job | StoreError]:
    """Compare-and-set every item (in order); each gets its stored job or its own error."""
    if not items:
        return []
    read: dict[str, list[int | None]] = _json_one(conn, _VERSIONS, sorted({j.id for j, _, _ in items})) or {}  # type: ignore[assignment]
    versions: dict[str, int] = {j: v for j, (v, _) in read.items()}  # type: ignore[misc]
    last: dict[str, int | None] = {j: s for j, (_, s) in read.items()}
    out: list[pb.Job | StoreError] = []
    rounds: list[list[object]] = []  # a job's n-th update in the group goes in round n
    nth: dict[str, int] = {}
    with_events: list[tuple[str, Sequence[pb.JobEvent]]] = []
    for job, expected, events in items:
        at = versions.get(job.id)
        if at is None:
            out.append(NotFound(f"job {job.id!r} not found"))
            continue
        if at != expected:
            out.append(VersionConflict(f"job {job.id!r} is at version {at}, expected {expected}"))
            continue
        stored = versioned_copy(job, expected + 1)
        versions[job.id] = expected + 1
        n = nth.get(job.id, 0)
        nth[job.id] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].extend((stored.id, *job_columns(stored), stored.version, stored.SerializeToString(), expected))
        if events:
            with_events.append((job.id, events))
        out.append(stored)
    for flat in rounds:
        want = len(flat) // 8
        if insert_rows(conn, _UPDATE_HEAD, 8, flat, _UPDATE_TAIL) != want:
            raise RetryCarefully(f"{want} job updates expected to match")  # cannot happen: read above
    if with_events:
        rows: list[object] = []
        for job_id, events in with_events:
            first = (last.get(job_id) or 0) + 1
            for ev in numbered_events(job_id, first, events):
                rows.extend((job_id, ev.seq, ev.SerializeToString()))
            last[job_id] = first + len(events) - 1
        insert_rows(conn, _INSERT_EVENTS[0], 3, rows, _INSERT_EVENTS[1])
    return out


# ---- log chunks -----------------------------------------------------------------------
# The touched streams' end offsets and the touched attempts' totals, in one read.
_ENDS_AND_TOTALS = (
    "SELECT json_array("
    "(SELECT json_group_array(json_array(s.job_id, s.key, s.end_offset))"
    " FROM json_each(?1) AS p JOIN log_streams AS s"
    " ON s.job_id = p.value ->> 0 AND s.key = p.value ->> 1),"
    "(SELECT json_group_array(json_array(a.job_id, a.attempt, a.bytes, a.last_seq, a.dropped))"
    " FROM json_each(?2) AS p JOIN log_attempts AS a"
    " ON a.job_id = p.value ->> 0 AND a.attempt = p.value ->> 1))")
_INSERT_LINES = values_insert("INSERT INTO log_lines (job_id, attempt, seq, cost, data)")
_UPSERT_STREAMS = values_insert("INSERT INTO log_streams (job_id, key, end_offset)",
                                " ON CONFLICT (job_id, key) DO UPDATE SET end_offset = excluded.end_offset")
_PUT_ATTEMPTS = values_insert("INSERT OR REPLACE INTO log_attempts (job_id, attempt, bytes, last_seq, dropped)")

LogItem = tuple[str, lpb.LogChunk, int]


def write_logs(conn: sqlite3.Connection, items: list[LogItem]) -> list[int]:
    """Store every chunk's new lines (in order); each gets its stream's end offset."""
    if not items:
        return []
    keys = {(job_id, lc.stream_key(c.attempt, c.rank, c.stream)) for job_id, c, _ in items}
    atts = sorted({(job_id, c.attempt) for job_id, c, _ in items})
    got_ends, got_totals = _json_one(conn, _ENDS_AND_TOTALS, sorted(keys), atts)  # type: ignore[misc]
    ends: dict[tuple[str, str], int] = {(j, k): e for j, k, e in got_ends}
    totals: dict[tuple[str, int], list[int]] = {(j, a): [b, s, d] for j, a, b, s, d in got_totals}
    out: list[int] = []
    lines: list[object] = []
    streams: dict[tuple[str, str], int] = {}
    touched: dict[tuple[str, int], int] = {}  # attempt -> its bound (the last chunk's)
    for job_id, chunk, max_bytes in items:
        key = (job_id, lc.stream_key(chunk.attempt, chunk.rank, chunk.stream))
        stored_end = ends.get(key, 0)
        fresh = lc.fresh_lines(chunk, stored_end)
        out.append(fresh.end)
        if fresh.end == stored_end and not fresh.lines:
            continue
        ends[key] = streams[key] = fresh.end
        att = (job_id, chunk.attempt)
        total = totals.setdefault(att, [0, 0, 0])
        total[1] = lc.number(fresh.lines, total[1])
        for ln in fresh.lines:
            cost = lc.line_cost(ln)
            total[0] += cost
            lines.extend((job_id, chunk.attempt, ln.seq, cost, ln.SerializeToString()))
        touched[att] = max_bytes
    if not touched:
        return out
    insert_rows(conn, _INSERT_LINES[0], 5, lines, _INSERT_LINES[1])
    insert_rows(conn, _UPSERT_STREAMS[0], 3, [x for (j, k), e in streams.items() for x in (j, k, e)],
                _UPSERT_STREAMS[1])
    for (job_id, attempt), max_bytes in touched.items():
        total = totals[(job_id, attempt)]
        if total[0] > max_bytes:  # trimmed once for the group: the same lines as chunk by chunk
            total[0], total[2] = trim(conn, job_id, attempt, total[0], total[2], max_bytes)
    insert_rows(conn, _PUT_ATTEMPTS[0], 5, [x for att in touched for x in (*att, *totals[att])],
                _PUT_ATTEMPTS[1])
    return out


def trim(conn: sqlite3.Connection, job_id: str, attempt: int, total: int, dropped: int,
         max_bytes: int) -> tuple[int, int]:
    """Drop an attempt's oldest lines until it fits; return (bytes, dropped)."""
    cut = 0
    for seq, cost in conn.execute("SELECT seq, cost FROM log_lines WHERE job_id = ? AND "
                                  "attempt = ? ORDER BY seq", (job_id, attempt)):
        if total <= max_bytes:
            break
        total -= cost
        dropped += 1
        cut = seq
    conn.execute("DELETE FROM log_lines WHERE job_id = ? AND attempt = ? AND seq <= ?",
                 (job_id, attempt, cut))
    return total, dropped


# ---- records --------------------------------------------------------------------------
PUT_RECORDS = values_insert("INSERT INTO records (kind, key, data)",
                            " ON CONFLICT (kind, key) DO UPDATE SET data = excluded.data")


def write_records(conn: sqlite3.Connection, items: list[tuple[str, str, bytes]]) -> None:
    """Upsert every record; a key put twice keeps the later put (as one after the other)."""
    last = {(k, key): data for k, key, data in items}  # dict order: first put; value: last
    insert_rows(conn, PUT_RECORDS[0], 3, [x for (k, key), data in last.items() for x in (k, key, data)],
                PUT_RECORDS[1])
