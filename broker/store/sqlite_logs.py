"""Rank logs in SQLite (mixed into ``SQLiteStore``; see ``Store.append_logs``).

Why three tables: ``log_lines`` holds the text (bounded per attempt), ``log_streams``
the stored end offset per (attempt, rank, stream), which dedups resends, and
``log_attempts`` the running byte total, last seq and dropped-line count, so
appending never scans the lines.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from broker.store import logs_common as lc
from broker.store.group_commit import GroupWriter
from broker.store.sqlite_batch import trim
from computebroker.v1 import logs_pb2 as lpb

LOG_SCHEMA = """
CREATE TABLE IF NOT EXISTS log_lines (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    cost INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (job_id, attempt, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_streams (
    job_id TEXT NOT NULL,
    key TEXT NOT NULL,
    end_offset INTEGER NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_attempts (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    dropped INTEGER NOT NULL,
    PRIMARY KEY (job_id, attempt)
) WITHOUT ROWID;
"""


class SQLiteLogs:
    """``append_logs`` / ``log_offsets`` / ``read_logs`` over the store's connection."""

    _tx: Callable[[], AbstractContextManager[sqlite3.Connection]]
    _read: Callable[[str, Sequence[object]], list[tuple]]
    _writes: GroupWriter

    def append_logs(self, job_id: str, chunk: lpb.LogChunk, max_bytes: int) -> int:
        """Store a chunk's new lines. It joins the store's write group: every running
        attempt ships a chunk every few seconds, and one transaction (one fsync) per
        chunk capped a leader at the disk's fsync rate with a few thousand running."""
        return self._writes.submit(("logs", (job_id, chunk, max_bytes)))

    def _append_logs_member(self, conn: sqlite3.Connection, job_id: str, chunk: lpb.LogChunk,
                            max_bytes: int) -> int:
        key = lc.stream_key(chunk.attempt, chunk.rank, chunk.stream)
        row = conn.execute("SELECT end_offset FROM log_streams WHERE job_id = ? AND key = ?",
                           (job_id, key)).fetchone()
        stored_end = row[0] if row else 0
        fresh = lc.fresh_lines(chunk, stored_end)
        if fresh.end == stored_end and not fresh.lines:
            return stored_end
        conn.execute("INSERT INTO log_streams (job_id, key, end_offset) VALUES (?, ?, ?) "
                     "ON CONFLICT (job_id, key) DO UPDATE SET end_offset = excluded.end_offset",
                     (job_id, key, fresh.end))
        row = conn.execute("SELECT bytes, last_seq, dropped FROM log_attempts "
                           "WHERE job_id = ? AND attempt = ?", (job_id, chunk.attempt)).fetchone()
        total, last_seq, dropped = row if row else (0, 0, 0)
        last_seq = lc.number(fresh.lines, last_seq)
        rows = [(job_id, chunk.attempt, ln.seq, lc.line_cost(ln), ln.SerializeToString())
                for ln in fresh.lines]
        conn.executemany("INSERT INTO log_lines (job_id, attempt, seq, cost, data) "
                         "VALUES (?, ?, ?, ?, ?)", rows)
        total += sum(r[3] for r in rows)
        if total > max_bytes:
            total, dropped = trim(conn, job_id, chunk.attempt, total, dropped, max_bytes)
        conn.execute("INSERT OR REPLACE INTO log_attempts (job_id, attempt, bytes, last_seq, "
                     "dropped) VALUES (?, ?, ?, ?, ?)",
                     (job_id, chunk.attempt, total, last_seq, dropped))
        return fresh.end

    def log_offsets(self, job_id: str) -> list[lpb.LogOffset]:
        rows = self._read("SELECT key, end_offset FROM log_streams WHERE job_id = ? ORDER BY key",
                          (job_id,))
        return [lc.parse_stream_key(job_id, k, end) for k, end in rows]

    def read_logs(self, job_id: str, attempt: int, after_seq: int = 0) -> tuple[list[lpb.LogLine], int]:
        rows = self._read("SELECT dropped FROM log_attempts WHERE job_id = ? AND attempt = ?",
                          (job_id, attempt))
        dropped = rows[0][0] if rows else 0
        data = self._read("SELECT data FROM log_lines WHERE job_id = ? AND attempt = ? AND seq > ? "
                          "ORDER BY seq", (job_id, attempt, after_seq))
        return [lpb.LogLine.FromString(d) for (d,) in data], dropped


