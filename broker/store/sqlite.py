"""SQLite store: the embedded default (one file, nothing to start).

Why these choices:
- **WAL + synchronous=FULL**: every acknowledged write has been fsynced to the WAL
  before the call returns, so a broker killed at any instant (SIGKILL, power loss)
  restarts with every acknowledged write and a consistent file. WAL keeps readers
  from blocking behind the writer and makes each commit one sequential append.
- **One writer connection and one reader connection, each guarded by a lock** (not
  one connection per thread): SQLite allows a single writer at a time anyway, and
  with synchronous=FULL each write costs an fsync; per-thread connections would add
  SQLITE_BUSY retries and leak as gRPC pools churn threads. The separate reader
  (WAL: it sees every committed write, never waits for the writer) keeps reads from
  queueing behind a commit's fsync. Writes are few and large: concurrent job
  creations share one transaction (``create_jobs``, broker/store/group_commit.py).
  Writes still use ``BEGIN IMMEDIATE`` with a busy timeout, so a second *process*
  (e.g. an operator tool) opening the same file is also safe.
- Jobs are stored as serialized protobuf ``data`` plus the few columns that are
  queried (team, client_request_id, phase, region, version): the schema never has to
  follow the proto, and the indexed columns are rewritten from the proto on every write.
- Leases are real (name, holder, expiry, epoch) rows so the conformance suite holds
  for both stores; with a single broker process they are simply always granted to it.
  Fencing (``fence_writes``) reads the lease's epoch inside each write transaction
  (BEGIN IMMEDIATE holds the write lock, so no grant can slip in between).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from google.protobuf.message import Message

from broker.store.base import (
    AlreadyExists,
    CreateItem,
    Fenced,
    NotFound,
    Store,
    StoreError,
    VersionConflict,
    decode,
    decode_each,
    job_columns,
    new_job_copy,
    numbered_events,
    riders_of,
    versioned_copy,
)
from broker.store.checkpoint_index import job_prefix_key
from broker.store.group_commit import GroupWriter
from broker.store.private_files import private_dirs, private_sqlite
from broker.store.sqlite_batch import (
    PUT_RECORDS,
    RetryCarefully,
    insert_rows,
    values_insert,
    write_logs,
    write_records,
    write_updates,
)
from broker.store.sqlite_logs import LOG_SCHEMA, SQLiteLogs
from broker.store.write_turn import WriteTurn
from computebroker.v1 import common_pb2 as pb

# Which index a filtered ListJobs walks, as data. A phase filter names the live phases
# (pending, running) in practice: walking (team, phase, id) reads only those rows, however
# much finished history the team has. Left to itself SQLite's planner prefers (team, id),
# which needs no sort for ORDER BY id but reads every job the team ever had; INDEXED BY
# makes the choice explicit (and an index that cannot serve the query is an error, not a
# silent full scan). tests/store/test_list_index.py reads the query plans.
_LIST_INDEX: dict[tuple[bool, bool, bool], str] = {
    # (team, phases, region) -> index
    (True, True, False): "jobs_team_phase",
    (True, True, True): "jobs_team_phase",
    (False, True, True): "jobs_region_phase",
    (False, True, False): "jobs_phase",
    (True, False, False): "jobs_team",
    (True, False, True): "jobs_team",
}


def _list_index(team: bool, phases: bool, region: bool) -> str:
    return _LIST_INDEX.get((team, phases, region), "")


def checkpoint_prefix_sql(n_keys: int, inside: bool) -> str:
    """The SELECT of :meth:`SQLiteStore.checkpoint_prefix_jobs` (one place, so a test
    can read its plan): exact keys and one key range, both on the primary key."""
    parts = []
    if n_keys:
        parts.append("SELECT job_id FROM checkpoint_prefixes WHERE prefix IN"
                     f" ({','.join('?' * n_keys)})")
    if inside:
        parts.append("SELECT job_id FROM checkpoint_prefixes WHERE prefix >= ? AND prefix < ?")
    return " UNION ".join(parts)


def _index_row(conn: sqlite3.Connection, job: pb.Job) -> None:
    key = job_prefix_key(job.spec.checkpoint_uri)
    if key:
        conn.execute("INSERT OR IGNORE INTO checkpoint_prefixes (prefix, job_id) VALUES (?, ?)",
                     (key, job.id))


def list_jobs_sql(*, team: str = "", phases: Sequence[int] = (), region: str = "",
                  after_id: str = "", limit: int = 100) -> tuple[str, list[object]]:
    """The SELECT a filtered ListJobs runs (one place, so a test can read its plan)."""
    where = ["id > ?"]
    args: list[object] = [after_id]
    if team:
        where.append("team = ?")
        args.append(team)
    if phases:
        where.append(f"phase IN ({','.join('?' * len(phases))})")
        args.extend(int(p) for p in phases)
    if region:
        where.append("region = ?")
        args.append(region)
    index = _list_index(bool(team), bool(phases), bool(region))
    hint = f" INDEXED BY {index}" if index else ""
    sql = f"SELECT id, data FROM jobs{hint} WHERE {' AND '.join(where)} ORDER BY id"
    if limit > 0:
        sql += " LIMIT ?"
        args.append(limit)
    return sql, args


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    client_request_id TEXT NOT NULL,
    phase INTEGER NOT NULL,
    region TEXT NOT NULL,
    version INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_request_id
    ON jobs (team, client_request_id) WHERE client_request_id != '';
CREATE INDEX IF NOT EXISTS jobs_team ON jobs (team, id);
CREATE INDEX IF NOT EXISTS jobs_phase ON jobs (phase, id);
CREATE INDEX IF NOT EXISTS jobs_team_phase ON jobs (team, phase, id);
CREATE INDEX IF NOT EXISTS jobs_region_phase ON jobs (region, phase, id);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
-- The checkpoint-prefix index (broker/store/checkpoint_index.py): one row per job that
-- chose a checkpoint_uri, written with the job; read by key and by key range only.
CREATE TABLE IF NOT EXISTS checkpoint_prefixes (
    prefix TEXT NOT NULL,
    job_id TEXT NOT NULL,
    PRIMARY KEY (prefix, job_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0
);
"""

log = logging.getLogger(__name__)


_INSERT_JOBS = values_insert("INSERT INTO jobs (id, team, client_request_id, phase, region, version, data)")
_INSERT_EVENTS = values_insert("INSERT INTO events (job_id, seq, data)")


_PUT_RECORD = ("INSERT INTO records (kind, key, data) VALUES (?, ?, ?)"
               " ON CONFLICT (kind, key) DO UPDATE SET data = excluded.data")


class SQLiteStore(SQLiteLogs, Store):
    """Store in one SQLite file (``":memory:"`` for a throwaway in-process store)."""

    def __init__(self, path: str, *, busy_timeout_s: float = 30.0) -> None:
        self.path = path
        if path != ":memory:":
            private_dirs(os.path.dirname(os.path.abspath(path)))
            private_sqlite(path)  # 0600 before SQLite opens it: the WAL/SHM inherit it
        self._lock = threading.RLock()
        # isolation_level=None: autocommit; transactions are explicit BEGIN IMMEDIATE.
        self._conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False,
            cached_statements=512,  # multi-row INSERTs of each batch size (_create_batch)
        )
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            indexed = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'checkpoint_prefixes'").fetchone()
            self._conn.executescript(_SCHEMA + LOG_SCHEMA)
            if not indexed:  # a file from before the index: build it once from the jobs
                self._backfill_prefixes()
            cols = {r[1] for r in self._conn.execute("PRAGMA table_info(leases)")}
            if "epoch" not in cols:  # a file from before leader fencing
                self._conn.execute(
                    "ALTER TABLE leases ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")
        self._fence: tuple[str, int] | None = None
        # Processes sharing the file take turns per write transaction (write_turn.py).
        self._turn = WriteTurn(path) if path != ":memory:" else None
        # Job creations and record puts queue here and share transactions (group commit).
        # A dedicated writer thread keeps writing groups while writes queue (group_commit.py).
        self._writes: GroupWriter[tuple[str, object], object] = GroupWriter(
            self._write_group, name="sqlite-writer")
        # Reads get their own connection (a file only; ":memory:" is per connection):
        # in WAL mode a reader sees every committed write and never waits for the
        # writer, so GetJob/ListJobs/WatchJob do not queue behind a commit's fsync.
        self._rlock = self._lock
        self._rconn = self._conn
        if path != ":memory:":
            self._rlock = threading.Lock()
            self._rconn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None,
                                          check_same_thread=False)
            self._rconn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")

    def _backfill_prefixes(self) -> None:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for job_id, data in conn.execute("SELECT id, data FROM jobs").fetchall():
                _index_row(conn, decode(pb.Job, data, f"job {job_id}"))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # ---- plumbing ------------------------------------------------------------------
    @contextmanager
    def _tx(self, fenced: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction: takes the write lock up front (BEGIN IMMEDIATE) so a
        read-then-write inside it can never be invalidated by another writer. With
        fencing on, the lease epoch is checked first, inside the same transaction."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError("store is closed")
            turn = self._turn
            if turn is not None:
                turn.acquire()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except BaseException:
                if turn is not None:
                    turn.release()
                raise
            try:
                if fenced and self._fence is not None:
                    name, epoch = self._fence
                    row = conn.execute("SELECT epoch FROM leases WHERE name = ?",
                                       (name,)).fetchone()
                    if (row[0] if row else 0) != epoch:
                        raise Fenced(f"leader epoch {epoch} is stale: another broker leads now")
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # also after a failed COMMIT (e.g. disk full): never leave the shared
                # connection inside an open transaction
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                if turn is not None:
                    turn.release()

    def _read(self, sql: str, args: Sequence[object] = ()) -> list[tuple]:
        with self._rlock:
            if self._rconn is None:
                raise StoreError("store is closed")
            return self._rconn.execute(sql, args).fetchall()

    @staticmethod
    def _insert_events(
        conn: sqlite3.Connection, job_id: str, events: Sequence[pb.JobEvent]
    ) -> list[pb.JobEvent]:
        if not events:
            return []
        (last,) = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)
        ).fetchone()
        out = numbered_events(job_id, last + 1, events)
        conn.executemany("INSERT INTO events (job_id, seq, data) VALUES (?, ?, ?)",
                         [(job_id, e.seq, e.SerializeToString()) for e in out])
        return out

    # ---- jobs ----------------------------------------------------------------------
    def create_job(self, job: pb.Job, events: Sequence[pb.JobEvent] = ()) -> pb.Job:
        stored = new_job_copy(job)
        team, crid, phase, region = job_columns(stored)
        try:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO jobs (id, team, client_request_id, phase, region, version, data)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (stored.id, team, crid, phase, region, 1, stored.SerializeToString()),
                )
                _index_row(conn, stored)
                self._insert_events(conn, stored.id, events)
        except sqlite3.IntegrityError as e:
            raise AlreadyExists(
                f"job {stored.id!r} or request id ({team!r}, {crid!r}) already exists"
            ) from e
        return stored

    def create_jobs(self, items: Sequence[CreateItem]) -> list[pb.Job | StoreError]:
        """One BEGIN IMMEDIATE transaction (fenced once, one fsync at COMMIT) with a
        SAVEPOINT per member, so a member that fails rolls back alone (with its
        riders). It joins the store's write group: record writes queued meanwhile
        share the transaction."""
        return self._writes.submit(("jobs", list(items)))  # type: ignore[return-value]

    def _write_group(self, group: list[tuple[str, object]]) -> list[object]:
        """One transaction for a group of writes (job batches, job updates, log chunks
        and record puts); a whole-transaction failure (Fenced, COMMIT) reaches them all.
        A job update that fails on its own (a version conflict, a job gone) raises to its
        caller only: the others commit.

        The group is first written whole, a few multi-row statements per kind
        (:meth:`_write_batched`, broker/store/sqlite_batch.py: a job update or log chunk
        used to cost ~5 statements of its own). Job batches likewise: one multi-row
        INSERT each for their jobs, their events and their riders, no savepoint, no read
        (a new job's events are numbered from 1). Why: SQLite's Python module lets go of the GIL for every
        statement it steps, and under 16 concurrent submits each let-go was a thread
        switch or two: a savepoint per member, a MAX(seq) read and one INSERT per row
        were ~6 statements per submit against ~6 per group now (the switches, not the
        statements, were the cost: benchmarks/bench_submit_cpu.py). Should any of it
        fail (a duplicate id or request id: a client's retry), the transaction is rolled
        back and the group written again the careful way, a savepoint per member, so a
        failing member still fails alone and the others are written once."""
        try:
            with self._tx() as conn:
                return self._write_batched(conn, group)
        except RetryCarefully:
            with self._tx() as conn:
                return self._write_members(conn, group)

    def _write_batched(self, conn: sqlite3.Connection, group: list[tuple[str, object]]) -> list[object]:
        """The group by kind, each kind in a few multi-row statements (sqlite_batch.py),
        members of a kind in queue order. Kinds touch disjoint rows within one group (a
        job is updated only after its creation returned, i.e. in a later group), so
        writing creations, then updates, then log chunks, then records stores what the
        queue order would."""
        out: list[object] = [None] * len(group)
        by_kind: dict[str, list[int]] = {}
        for i, (kind, _) in enumerate(group):
            by_kind.setdefault(kind, []).append(i)
        try:
            for i in by_kind.get("jobs", ()):
                out[i] = self._create_batch(conn, group[i][1])  # type: ignore[arg-type]
            for kind, write in (("update", write_updates), ("logs", write_logs)):
                at = by_kind.get(kind, [])
                for i, r in zip(at, write(conn, [group[i][1] for i in at]), strict=True):  # type: ignore[misc]
                    out[i] = r
            if "record" in by_kind:
                write_records(conn, [group[i][1] for i in by_kind["record"]])  # type: ignore[misc]
        except (sqlite3.Error, ValueError, TypeError) as e:
            raise RetryCarefully from e
        return out

    def _write_members(self, conn: sqlite3.Connection, group: list[tuple[str, object]]) -> list[object]:
        """The careful way, member by member in queue order, a savepoint for each that
        may fail alone."""
        out: list[object] = []
        for kind, item in group:
            if kind == "jobs":
                out.append(self._create_members(conn, item))  # type: ignore[arg-type]
            elif kind == "record":
                conn.execute(_PUT_RECORD, item)  # type: ignore[arg-type]
                out.append(None)
            else:
                write = self._update_member if kind == "update" else self._append_logs_member
                conn.execute("SAVEPOINT member")
                try:
                    out.append(write(conn, *item))  # type: ignore[misc]
                except StoreError as e:
                    conn.execute("ROLLBACK TO member")
                    out.append(e)
                conn.execute("RELEASE member")
        return out

    @staticmethod
    def _create_batch(conn: sqlite3.Connection, items: list[CreateItem]) -> list[pb.Job | StoreError]:
        """New jobs, their events and riders in one multi-row INSERT per table (see
        :meth:`_write_group`); any statement's failure raises :class:`RetryCarefully`."""
        out: list[pb.Job | StoreError] = []
        jobs: list[object] = []
        events: list[object] = []
        riders: list[object] = []
        written: list[pb.Job] = []
        for item in items:
            try:
                stored = new_job_copy(item[0])
            except StoreError as e:  # refused before any write: this member alone
                out.append(e)
                continue
            out.append(stored)
            written.append(stored)
            jobs.extend((stored.id, *job_columns(stored), 1, stored.SerializeToString()))
            for ev in numbered_events(stored.id, 1, item[1]):
                events.extend((stored.id, ev.seq, ev.SerializeToString()))
            for kind, key, message in riders_of(item):
                riders.extend((kind, key, message.SerializeToString()))
        try:
            insert_rows(conn, _INSERT_JOBS[0], 7, jobs, _INSERT_JOBS[1])
            insert_rows(conn, _INSERT_EVENTS[0], 3, events, _INSERT_EVENTS[1])
            insert_rows(conn, PUT_RECORDS[0], 3, riders, PUT_RECORDS[1])
            for stored in written:
                _index_row(conn, stored)
        except (sqlite3.Error, ValueError, TypeError) as e:
            raise RetryCarefully from e
        return out

    def _create_members(self, conn: sqlite3.Connection,
                        items: list[CreateItem]) -> list[pb.Job | StoreError]:
        """The careful way: a savepoint per member, so each fails alone."""
        out: list[pb.Job | StoreError] = []
        for item in items:
            job, events = item[0], item[1]
            try:
                stored = new_job_copy(job)
            except StoreError as e:
                out.append(e)
                continue
            team, crid, phase, region = job_columns(stored)
            conn.execute("SAVEPOINT member")
            try:
                conn.execute(
                    "INSERT INTO jobs (id, team, client_request_id, phase, region, version, data)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (stored.id, team, crid, phase, region, 1, stored.SerializeToString()),
                )
                _index_row(conn, stored)
                self._insert_events(conn, stored.id, events)
                for kind, key, message in riders_of(item):
                    conn.execute(_PUT_RECORD, (kind, key, message.SerializeToString()))
            except sqlite3.IntegrityError:
                conn.execute("ROLLBACK TO member")
                out.append(AlreadyExists(
                    f"job {stored.id!r} or request id ({team!r}, {crid!r}) already exists"))
            except (sqlite3.Error, ValueError, TypeError) as e:  # this member only
                conn.execute("ROLLBACK TO member")
                out.append(StoreError(f"job {stored.id!r} not written: {e}"))
            else:
                out.append(stored)
            conn.execute("RELEASE member")
        return out

    def get_job(self, job_id: str) -> pb.Job:
        rows = self._read("SELECT data FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise NotFound(f"job {job_id!r} not found")
        return decode(pb.Job, rows[0][0], f"job {job_id}")

    def checkpoint_prefix_jobs(self, keys: Sequence[str], inside: tuple[str, str] | None = None,
                               ) -> list[str]:
        keys = list(dict.fromkeys(keys))
        if not keys and inside is None:
            return []
        args: list[object] = [*keys, *(inside or ())]
        rows = self._read(checkpoint_prefix_sql(len(keys), inside is not None), args)
        return sorted({r[0] for r in rows})

    def find_job_by_request_id(self, team: str, client_request_id: str) -> pb.Job | None:
        if not client_request_id:
            return None
        rows = self._read(
            # "!= ''" lets SQLite use the partial unique index (it cannot prove a bound
            # parameter is non-empty); without it this scanned the team's every job.
            "SELECT data FROM jobs WHERE team = ? AND client_request_id = ? AND client_request_id != ''",
            (team, client_request_id),
        )
        return decode(pb.Job, rows[0][0], f"job for request {client_request_id}") if rows else None

    def update_job(
        self, job: pb.Job, expected_version: int, events: Sequence[pb.JobEvent] = ()
    ) -> pb.Job:
        """Compare-and-set one job. It joins the store's write group: with many agent
        streams reporting at once (progress, ends, launches) their updates share one
        transaction and one fsync instead of queueing for one each (each still returns
        only after its commit)."""
        return self._writes.submit(("update", (job, expected_version, events)))  # type: ignore[return-value]

    @staticmethod
    def _update_member(conn: sqlite3.Connection, job: pb.Job, expected_version: int,
                       events: Sequence[pb.JobEvent]) -> pb.Job:
        stored = versioned_copy(job, expected_version + 1)
        team, crid, phase, region = job_columns(stored)
        # The compare and the set in one statement; the version is read only to say why
        # nothing was updated. Why: the group's leader runs every member's statements,
        # and each one gives up the GIL and waits to get it back (5 ms at worst behind
        # a scheduling pass): at 10,000 running, a statement less per progress write.
        try:
            cur = conn.execute(
                "UPDATE jobs SET team = ?, client_request_id = ?, phase = ?, region = ?,"
                " version = ?, data = ? WHERE id = ? AND version = ?",
                (team, crid, phase, region, stored.version, stored.SerializeToString(),
                 stored.id, expected_version),
            )
        except sqlite3.IntegrityError as e:
            raise AlreadyExists(f"request id ({team!r}, {crid!r}) already used") from e
        if cur.rowcount != 1:
            row = conn.execute("SELECT version FROM jobs WHERE id = ?", (stored.id,)).fetchone()
            if row is None:
                raise NotFound(f"job {stored.id!r} not found")
            raise VersionConflict(
                f"job {stored.id!r} is at version {row[0]}, expected {expected_version}"
            )
        SQLiteStore._insert_events(conn, stored.id, events)
        return stored

    def list_jobs(
        self,
        *,
        team: str = "",
        phases: Sequence[int] = (),
        region: str = "",
        after_id: str = "",
        limit: int = 100,
    ) -> list[pb.Job]:
        sql, args = list_jobs_sql(team=team, phases=phases, region=region,
                                  after_id=after_id, limit=limit)
        return decode_each(pb.Job, ((f"job {r[0]}", r[1]) for r in self._read(sql, args)))

    def job_versions(self, phases: Sequence[int]) -> dict[str, int]:
        """The version column alone (no job is parsed), through the phase index."""
        if not phases:
            return {}
        marks = ",".join("?" * len(phases))
        return dict(self._read(f"SELECT id, version FROM jobs INDEXED BY jobs_phase WHERE phase IN ({marks})",
                               [int(p) for p in phases]))

    def list_events(self, job_id: str, after_seq: int = 0, limit: int = 0) -> list[pb.JobEvent]:
        sql = "SELECT seq, data FROM events WHERE job_id = ? AND seq > ? ORDER BY seq"
        args: list[object] = [job_id, after_seq]
        if limit > 0:
            sql += " LIMIT ?"
            args.append(limit)
        return decode_each(pb.JobEvent, ((f"event {job_id}#{r[0]}", r[1])
                                         for r in self._read(sql, args)))

    def append_events(self, job_id: str, events: Sequence[pb.JobEvent]) -> list[pb.JobEvent]:
        with self._tx() as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                raise NotFound(f"job {job_id!r} not found")
            return self._insert_events(conn, job_id, events)

    # ---- keyed records ---------------------------------------------------------------
    def put_record(self, kind: str, key: str, message: Message) -> None:
        """Concurrent record writes (an audit record per mutating RPC, agent
        bookkeeping) share one transaction and fsync with each other and with job
        creations (the store's write group)."""
        self._writes.submit(("record", (kind, key, message.SerializeToString())))

    def get_record(self, kind: str, key: str, message_type: type[Message]) -> Message | None:
        rows = self._read("SELECT data FROM records WHERE kind = ? AND key = ?", (kind, key))
        return decode(message_type, rows[0][0], f"record:{kind} {key}") if rows else None

    def list_records(self, kind: str, message_type: type[Message]) -> list[Message]:
        rows = self._read("SELECT key, data FROM records WHERE kind = ? ORDER BY key", (kind,))
        return decode_each(message_type, ((f"record:{kind} {k}", d) for k, d in rows))

    def delete_record(self, kind: str, key: str) -> bool:
        with self._tx() as conn:
            cur = conn.execute("DELETE FROM records WHERE kind = ? AND key = ?", (kind, key))
            return cur.rowcount > 0

    # ---- leadership ------------------------------------------------------------------
    def acquire_lease_epoch(self, name: str, holder: str, ttl_s: float) -> int:
        # Wall clock (not monotonic): another process may share the file.
        now = time.time()
        with self._tx(fenced=False) as conn:
            row = conn.execute(
                "SELECT holder, expires_at, epoch FROM leases WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] != holder and row[1] > now:
                return 0
            renewal = row is not None and row[0] == holder and row[1] > now
            epoch = (row[2] if row else 0) + (0 if renewal else 1)
            conn.execute(
                "INSERT INTO leases (name, holder, expires_at, epoch) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
                " expires_at = excluded.expires_at, epoch = excluded.epoch",
                (name, holder, now + ttl_s, epoch),
            )
            return epoch

    def fence_writes(self, name: str, epoch: int | None) -> None:
        self._fence = None if epoch is None else (name, epoch)

    def close(self) -> None:
        w = self._writes
        w.close()
        if w.groups:  # how well group commit amortized the fsyncs (a batch of jobs is one write)
            log.info("sqlite store %s: %d writes in %d transactions (%.1f per commit)",
                     self.path, w.members, w.groups, w.members / w.groups)
        with self._rlock:
            if self._rconn is not None and self._rconn is not self._conn:
                self._rconn.close()
            self._rconn = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._turn is not None:
                self._turn.close()
