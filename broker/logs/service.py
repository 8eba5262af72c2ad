"""JobLogs: ingest agent log chunks, answer offsets, stream records to users.

Why its own wake-up hub: log chunks arrive about once a second per rank; waking the
WatchJob watchers (who re-read job events) for each of them would be waste, and a
log follower does not care about job writes except the one that ends the job, which
it notices by re-reading the job on every wake-up (at most ``FOLLOW_POLL_S`` apart).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from broker.api.errors import InvalidArgument, NotFound
from broker.jobs.hub import EventHub
from broker.jobs.lifecycle import TERMINAL
from broker.store import base as store_base
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import logs_pb2 as lpb

log = logging.getLogger(__name__)

FOLLOW_POLL_S = 0.5
HEADER_WAIT_S = 5.0  # longest a follower holds a new attempt's header for its ranks
STREAMS = ("stdout", "stderr")


@dataclass(frozen=True)
class LogQuery:
    """A validated StreamJobLogs request."""

    job_id: str
    follow: bool = False
    rank: int | None = None
    attempt: int = 0
    tail: int = 0

    @classmethod
    def parse(cls, job_id: str, follow: bool, rank: int | None, attempt: int, tail: int) -> LogQuery:
        if not job_id:
            raise InvalidArgument("job_id is empty")
        if rank is not None and rank < 0:
            raise InvalidArgument(f"rank must be >= 0 (got {rank})")
        if attempt < 0:
            raise InvalidArgument(f"attempt must be >= 1, or 0 for every attempt (got {attempt})")
        if tail < 0:
            raise InvalidArgument(f"tail must be >= 0 (got {tail})")
        return cls(job_id, follow, rank, attempt, tail)


class JobLogs:
    """Rank logs of every job over one store; thread-safe (the store is)."""

    def __init__(self, store: store_base.Store, max_bytes_per_attempt: int) -> None:
        self.store = store
        self.max_bytes = max_bytes_per_attempt
        self.hub = EventHub()

    # ---- from agents -----------------------------------------------------------------
    def ingest(self, agent_id: str, chunk: lpb.LogChunk, job: pb.Job | None = None) -> bool:
        """Store a chunk of an attempt the job has had; False (and logged) if refused.

        Old attempts are accepted: a stopped attempt's last lines may arrive after the
        job moved on, and they belong to that attempt's history, not to the new one. So are
        a make-before-break standby's (its start-up lines come before its go).
        ``job``: the job as the caller just read it (None: read it here).
        """
        try:
            job = job if job is not None and job.id == chunk.job_id else self.store.get_job(chunk.job_id)
        except store_base.NotFound:
            log.warning("log chunk for unknown job %s from %s: dropped", chunk.job_id, agent_id)
            return False
        newest = max(job.attempt, job.standby.attempt if job.HasField("standby") else 0)
        if not 1 <= chunk.attempt <= newest or chunk.rank < 0 or chunk.stream not in STREAMS:
            log.warning("log chunk %s#%d rank %d %r from %s does not fit the job: dropped",
                        chunk.job_id, chunk.attempt, chunk.rank, chunk.stream, agent_id)
            return False
        self.store.append_logs(chunk.job_id, chunk, self.max_bytes)
        self.hub.notify(chunk.job_id)
        return True

    def offsets_for(self, job_ids: Iterable[str]) -> list[lpb.LogOffset]:
        """Stored end offsets of these jobs' streams (RegisterAck: the agent resumes there)."""
        out: list[lpb.LogOffset] = []
        for job_id in sorted(set(job_ids)):
            out.extend(self.store.log_offsets(job_id))
        return out

    # ---- to users ------------------------------------------------------------------------
    def stream(self, q: LogQuery, active: Callable[[], bool],
               closed: Callable[[], bool] = lambda: False) -> Iterator[lpb.LogRecord]:
        """Header per attempt, then its lines; with ``follow`` until the job is terminal."""
        job = self._job(q.job_id)
        if q.attempt > job.attempt and not q.follow:
            raise NotFound(f"job {q.job_id} has no attempt {q.attempt} (it has {job.attempt})")
        emitter = _Emitter(q)
        yield from self._initial(q, job, emitter)
        if not q.follow:
            return
        seen = self.hub.counter(q.job_id)
        headers: dict[int, lpb.LogAttemptHeader] = {}
        waiting: dict[int, float] = {}  # attempt -> when its header was first held back
        while active() and not closed():
            ended = job.phase in TERMINAL
            attempts = self._attempts(q, job)
            if any(a not in headers or (a in waiting) for a in attempts):
                headers = self._headers(q.job_id)  # re-read for a new or a held-back attempt
            for a in attempts:
                if self._hold_header(a, headers.get(a), emitter, ended, waiting):
                    break  # later attempts wait behind it: records stay in attempt order
                lines, dropped = self.store.read_logs(q.job_id, a, emitter.cursor.get(a, 0))
                yield from emitter.emit(a, headers.get(a), lines, dropped)
            if ended:
                return
            seen = self.hub.wait(q.job_id, seen, FOLLOW_POLL_S)
            job = self._job(q.job_id)

    @staticmethod
    def _hold_header(a: int, header: lpb.LogAttemptHeader | None, emitter: _Emitter,
                     ended: bool, waiting: dict[int, float]) -> bool:
        """Hold a new attempt's header back (at most ``HEADER_WAIT_S``) until its agent
        has reported the ranks it started.

        Why: the attempt's "launched" event exists before its agent's first report, and
        a header sent then could only name the GPUs placed ("world 2") where the same
        log read afterwards names the ranks ("2 ranks"). A follower and a later reader
        must see the same text. An agent that never reports ranks delays the header by
        the wait only."""
        if a in emitter.announced or header is None or header.ranks or ended:
            waiting.pop(a, None)
            return False
        since = waiting.setdefault(a, time.monotonic())
        if time.monotonic() - since < HEADER_WAIT_S:
            return True
        waiting.pop(a, None)
        return False

    def _initial(self, q: LogQuery, job: pb.Job, emitter: _Emitter) -> Iterator[lpb.LogRecord]:
        headers = self._headers(q.job_id)
        attempts = self._attempts(q, job)
        newest = headers.get(job.attempt)
        if (q.follow and not q.tail and job.phase not in TERMINAL and attempts
                and attempts[-1] == job.attempt and newest is not None and not newest.ranks):
            attempts = attempts[:-1]  # the follow loop sends it once its ranks are known
        per: list[tuple[int, list[lpb.LogLine], int]] = []
        for a in attempts:
            lines, dropped = self.store.read_logs(q.job_id, a)
            per.append((a, lines, dropped))
        if q.tail:
            kept = q.tail
            trimmed: list[tuple[int, list[lpb.LogLine], int]] = []
            for a, lines, _ in reversed(per):
                mine = [ln for ln in lines if emitter.wanted(ln)]
                take = mine[-kept:] if kept > 0 else []
                kept -= len(take)
                if take or (a == per[-1][0]):
                    trimmed.append((a, take, 0))
                for ln in lines:  # the tail's start is where following resumes
                    emitter.cursor[a] = max(emitter.cursor.get(a, 0), ln.seq)
            emitter.announced.update(a for a, _, _ in per)  # no empty headers before the tail
            per = list(reversed(trimmed))
        for a, lines, dropped in per:
            yield from emitter.emit(a, headers.get(a), lines, dropped)

    @staticmethod
    def _attempts(q: LogQuery, job: pb.Job) -> list[int]:
        if q.attempt:
            return [q.attempt] if q.attempt <= job.attempt else []
        return list(range(1, job.attempt + 1))

    def _job(self, job_id: str) -> pb.Job:
        try:
            return self.store.get_job(job_id)
        except store_base.NotFound:
            raise NotFound(f"job {job_id} not found") from None

    def _headers(self, job_id: str) -> dict[int, lpb.LogAttemptHeader]:
        """Per attempt: where and how big it ran, from its "launched" event (GPUs placed)
        and its "running" event (the ranks its agent started)."""
        out: dict[int, lpb.LogAttemptHeader] = {}
        for ev in self.store.list_events(job_id):
            if ev.type == "running" and ev.attempt in out:
                ranks = ev.details.get("ranks", "")
                if ranks.isdigit():
                    out[ev.attempt].ranks = int(ranks)
                continue
            if ev.type != "launched" or not ev.attempt:
                continue
            try:
                world = int(ev.details.get("world_size", "0"))
            except ValueError:
                world = 0
            out[ev.attempt] = lpb.LogAttemptHeader(
                attempt=ev.attempt, region=ev.region, world_size=world, start_time=ev.time,
                agent_id=ev.details.get("agent", ""))
        try:  # the current attempt's ranks are on its placement before its "running" event
            job = self.store.get_job(job_id)
        except store_base.NotFound:
            return out
        head = out.get(job.attempt)
        if head is not None and not head.ranks and job.placement.ranks:
            head.ranks = job.placement.ranks
        for m in job.migrations:  # a moved-to attempt's ranks, as its move recorded them
            head = out.get(m.to_attempt)
            if head is not None and not head.ranks and m.to_ranks:
                head.ranks = m.to_ranks
        return out


class _Emitter:
    """Turns per-attempt reads into records: a header whenever the attempt changes (a
    late line of an earlier attempt gets its header again), the dropped count once per
    attempt, then the lines the query wants; remembers each attempt's last seq."""

    def __init__(self, q: LogQuery) -> None:
        self.q = q
        self.cursor: dict[int, int] = {}
        self.current = 0
        self.announced: set[int] = set()

    def wanted(self, line: lpb.LogLine) -> bool:
        return self.q.rank is None or line.rank == self.q.rank

    def emit(self, attempt: int, header: lpb.LogAttemptHeader | None, lines: list[lpb.LogLine],
             dropped: int) -> Iterator[lpb.LogRecord]:
        if lines:
            self.cursor[attempt] = max(self.cursor.get(attempt, 0), lines[-1].seq)
        mine = [ln for ln in lines if self.wanted(ln)]
        first = attempt not in self.announced
        if not mine and not (first and header is not None):
            return
        if self.current != attempt:
            self.current = attempt
            yield lpb.LogRecord(attempt=header or lpb.LogAttemptHeader(attempt=attempt))
        if first:
            self.announced.add(attempt)
            if dropped and not self.q.tail:
                yield lpb.LogRecord(dropped_lines=dropped)
        for ln in mine:
            yield lpb.LogRecord(line=ln)
