"""Ship each rank's stdout/stderr to the broker as ``LogChunk`` messages.

Why tail files instead of pipes: the executor already writes every rank's output to
files under the attempt directory, so ranks never block on a slow agent or broker, an
agent reconnect loses nothing (the file is the buffer), and a resend after a
reconnect starts from the byte offset the broker says it has (``RegisterAck.log_offsets``).

A running attempt's new lines are read at most every ``interval_s`` (1 s): one chunk
per rank and stream per second, not one per agent tick, keeps the broker's store writes
few. Bounds, so a noisy rank cannot starve heartbeats on the shared stream: per attempt a
token bucket of ``rate_bytes_per_s`` (burst of two seconds), chunks of at most
``max_chunk_bytes``, and a backlog cap: when a rank is more than ``max_backlog_bytes``
ahead of what was shipped, the shipper skips to the newest part and the broker
records a "… N bytes not shipped" line (docs/contracts.md "Rank logs").

Ordering: chunks of one (attempt, rank, stream) leave in offset order on one stream;
``flush`` ships the rest of a finished attempt (its last partial line too) and the
agent sends it before the attempt's terminal JobUpdate.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from computebroker.v1 import logs_pb2 as lpb

DEFAULT_RATE = 256 * 1024
DEFAULT_CHUNK = 64 * 1024
DEFAULT_BACKLOG = 8 * 1024 * 1024
DEFAULT_INTERVAL_S = 1.0  # batch a running attempt's lines for this long (fewer store writes)
KEEP_FINISHED_S = 120.0  # as long as the agent re-reports a finished attempt on reconnect


@dataclass(frozen=True)
class LogSource:
    """One rank's output file of one attempt."""

    rank: int
    stream: str  # "stdout" | "stderr"
    path: Path


@dataclass
class _Tail:
    source: LogSource
    offset: int = 0  # next byte to ship


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    tails: list[_Tail]
    tokens: float
    refilled: float
    finished: float | None = None  # clock time of flush
    shipped: float = float("-inf")  # clock time of the last non-final read
    next_tail: int = 0  # round-robin start: every rank gets its turn under the budget
    # its files grow only with a notify() (the agent's own readers write them): looked at
    # only then, not every interval
    notified: bool = False


class LogShipper:
    """Tails the output files of tracked attempts; not thread-safe (the agent's lock)."""

    def __init__(self, *, rate_bytes_per_s: int = DEFAULT_RATE, max_chunk_bytes: int = DEFAULT_CHUNK,
                 max_backlog_bytes: int = DEFAULT_BACKLOG, keep_finished_s: float = KEEP_FINISHED_S,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.rate = max(1, rate_bytes_per_s)
        self.chunk = max(1, max_chunk_bytes)
        self.backlog = max(self.chunk, max_backlog_bytes)
        self.keep_finished_s = keep_finished_s
        self.interval_s = interval_s
        self.clock = clock
        self.wall = wall
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        # notified attempts whose files grew since they were last read (notify() is
        # called from the writers' threads; everything else runs under the agent's lock)
        self._grew: set[tuple[str, int]] = set()
        self._grew_lock = threading.Lock()

    def track(self, job_id: str, attempt: int, sources: Iterable[LogSource],
              notified: bool = False) -> None:
        """Start shipping an attempt's files (from offset 0). ``notified``: the files grow
        only with a :meth:`notify`, so they are not looked at otherwise (they are read
        once now: they may hold lines already, e.g. rebuilt after an agent restart)."""
        now = self.clock()
        self._attempts[(job_id, attempt)] = _Attempt(
            job_id, attempt, [_Tail(s) for s in sources], tokens=2.0 * self.rate, refilled=now,
            notified=notified)
        if notified:
            self.notify(job_id, attempt)

    def notify(self, job_id: str, attempt: int) -> None:
        """An attempt's files grew (thread-safe: called by the threads that write them)."""
        with self._grew_lock:
            self._grew.add((job_id, attempt))

    def tracked(self) -> list[tuple[str, int]]:
        return sorted(self._attempts)

    def rewind(self, offsets: Iterable[lpb.LogOffset]) -> None:
        """A new stream: resume every file where the broker's copy ends (0 if unknown:
        the broker drops what it already has, by offset)."""
        known = {(o.job_id, o.attempt, o.rank, o.stream): o.end_offset for o in offsets}
        for att in self._attempts.values():
            for t in att.tails:
                t.offset = known.get((att.job_id, att.attempt, t.source.rank, t.source.stream), 0)
            if att.notified:
                self.notify(att.job_id, att.attempt)  # read again from the new offsets

    def poll(self) -> list[lpb.LogChunk]:
        """New complete lines of every attempt, within each attempt's byte budget;
        finished attempts ship everything left, last partial line included."""
        now = self.clock()
        out: list[lpb.LogChunk] = []
        with self._grew_lock:
            grew, self._grew = self._grew, set()
        for key, att in list(self._attempts.items()):
            if att.finished is not None:
                out.extend(self._read(att, final=True))
                if now - att.finished > self.keep_finished_s:
                    del self._attempts[key]
                continue
            if att.notified and key not in grew:
                continue  # nothing was written to its files since they were last read
            if now - att.shipped < self.interval_s:
                if att.notified:
                    self.notify(*key)  # grew: read at its next turn
                continue
            att.shipped = now
            att.tokens = min(2.0 * self.rate, att.tokens + (now - att.refilled) * self.rate)
            att.refilled = now
            out.extend(self._read(att, final=False))
            if att.notified and att.tokens <= 0:
                self.notify(*key)  # its budget ran out: the rest at its next turn
        return out

    def flush(self, job_id: str, attempt: int) -> list[lpb.LogChunk]:
        """The attempt ended: everything not shipped yet (kept for resends a while)."""
        att = self._attempts.get((job_id, attempt))
        if att is None:
            return []
        if att.finished is None:
            att.finished = self.clock()
        return self._read(att, final=True)

    # ---- reading ---------------------------------------------------------------------
    def _read(self, att: _Attempt, final: bool) -> list[lpb.LogChunk]:
        out: list[lpb.LogChunk] = []
        n = len(att.tails)
        for i in range(n):
            t = att.tails[(att.next_tail + i) % n]
            while final or att.tokens > 0:  # the last chunk may overdraw: a debt, repaid
                chunk = self._chunk(att, t, self.chunk, final)
                if chunk is None:
                    break
                if not final:
                    att.tokens -= sum(chunk.sizes)
                out.append(chunk)
        att.next_tail = (att.next_tail + 1) % max(1, n)
        return out

    def _chunk(self, att: _Attempt, t: _Tail, budget: int, final: bool) -> lpb.LogChunk | None:
        try:
            size = os.path.getsize(t.source.path)
        except OSError:
            return None
        if size < t.offset:  # truncated under us (never by our executors): start over
            t.offset = 0
        if size - t.offset > self.backlog:
            t.offset = self._skip_to_line(t.source.path, size - self.backlog)
        if size <= t.offset:
            return None
        with open(t.source.path, "rb") as f:
            f.seek(t.offset)
            data = f.read(min(budget, size - t.offset))
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            # No newline: wait for the rest of the line, unless it will not fit one chunk
            # (ship it split) or the attempt ended (ship the partial last line).
            if len(data) < budget and not (final and t.offset + len(data) == size):
                return None
            cut = len(data)
        raw_lines = data[:cut].split(b"\n")
        if raw_lines and raw_lines[-1] == b"":
            raw_lines.pop()
        sizes = [len(r) + 1 for r in raw_lines]
        sizes[-1] -= 0 if data[:cut].endswith(b"\n") else 1
        chunk = lpb.LogChunk(
            job_id=att.job_id, attempt=att.attempt, rank=t.source.rank, stream=t.source.stream,
            offset=t.offset, lines=[r.decode("utf-8", "replace").rstrip("\r") for r in raw_lines],
            sizes=sizes, time=self.wall())
        t.offset += cut
        return chunk

    @staticmethod
    def _skip_to_line(path: Path, pos: int) -> int:
        """The first line start at or after ``pos`` (dropping a backlog keeps lines whole)."""
        with open(path, "rb") as f:
            f.seek(max(0, pos - 1))
            if pos == 0 or f.read(1) == b"\n":
                return pos
            rest = f.read(DEFAULT_CHUNK)
            nl = rest.find(b"\n")
            return pos + nl + 1 if nl >= 0 else pos + len(rest)
