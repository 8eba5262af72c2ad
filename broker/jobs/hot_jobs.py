"""HotJobs: the newest committed copy of every job an agent runs, read from memory.

Why: an agent stream reads the job for each message it carries (a JobUpdate is
fenced by attempt, a log chunk is checked against the job's attempts, a heartbeat's
changed entries are compared with the stored progress). With 10,000 running attempts
that was 2,000+ store reads a second through the store's one reader connection, and
a reader holds that connection's lock while it waits for the GIL to come back from
SQLite: under a scheduling pass (which holds the GIL for its whole 5 ms slices) each
read cost a GIL switch, the lock made them a queue, and the agents' acks fell minutes
behind (benchmarks/bench_running.py, docs/operator/scale.md). Every job write of the
leader goes through its one applier (broker/jobs/applier.py), which tells this cache
each commit, so the job an agent talks about is at hand without a read.

What keeps it right:

* **Commits fill it** (and the scheduler's reads, below), never a stream's own miss; a
  miss (a job not holding GPUs, or not written or re-read since this broker leads) is
  read from the store, as before. Versions decide, not arrival order: a copy older than
  the one kept (or than a forgotten job's tombstone) is ignored.
* **The higher version wins** (concurrent writers may report out of order), and a job
  that leaves the holding phases is dropped (it has no running attempt to talk about),
  leaving its version behind for a while so a late report of an older copy stays out.
* **Bounded staleness for writers behind the applier's back** (an operator tool on the
  same SQLite file): the scheduler's safety re-read of its live jobs (every 30 s,
  broker/scheduling/live_jobs.py) tells this cache every job it read because its
  version moved, under the same rule (the higher version wins). Nothing is written
  from a stale copy anyway: every write is a compare-and-set on the version, which
  re-reads the store on a conflict. An entry does not age out by itself: a job whose
  trainer reports no progress is written once, at its start, and is then talked about
  for hours; and a leader behind on its writes must not fall back to the store reads
  that put it behind.
* **Cleared when leadership changes** (broker/leadership.py): a replica that led before
  has not seen the other leader's writes.
* Decisions that are acknowledged as durable (an attempt's end) still read the store
  (``JobsView.find_confirmed``): on Redis they must see what a replica holds.

Copies: a committed job is copied once on the way in (the applier's caller may go on
editing the job it got back); ``get`` hands out that copy, which callers only read
(transitions work on their own copy: broker/jobs/outcome.py ``begin``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from broker.jobs.lifecycle import HOLDING
from computebroker.v1 import common_pb2 as pb

TOMBSTONE_S = 30.0  # how long a forgotten job's version keeps older copies out


class HotJobs:
    """``committed(job)`` on every commit (any thread); ``get(job_id)``: the newest
    committed copy of a job holding GPUs, or None (read the store).

    A commit of a job that does not hold GPUs leaves a *tombstone* (its version) for
    ``tombstone_s``: two writers of one job tell their commits after the fact, so the
    listener of an older version (a RUNNING copy) may run after the one of a newer
    (the end); the tombstone keeps that older copy out."""

    def __init__(self, tombstone_s: float = TOMBSTONE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.tombstone_s = tombstone_s
        self._clock = clock
        self._lock = threading.Lock()
        # job id -> (the job, or None for a tombstone; its version; when it was told)
        self._jobs: dict[str, tuple[pb.Job | None, int, float]] = {}
        self._tombstones: deque[tuple[float, str]] = deque()  # oldest first, for pruning
        self.hits = 0  # gets answered from memory (tests, benchmarks)
        self.misses = 0

    def committed(self, job: pb.Job) -> None:
        """A job write committed (or the store read with a version the cache may not
        have seen): keep its copy while it holds GPUs, else a tombstone."""
        copy = None
        if job.phase in HOLDING:
            copy = pb.Job()
            copy.CopyFrom(job)
        now = self._clock()
        with self._lock:
            self._prune(now)
            old = self._jobs.get(job.id)
            if old is not None and old[1] > job.version:
                return  # a newer commit was told first
            self._jobs[job.id] = (copy, job.version, now)
            if copy is None:
                self._tombstones.append((now, job.id))

    def _prune(self, now: float) -> None:
        """Drop tombstones older than ``tombstone_s`` (lock held)."""
        while self._tombstones and now - self._tombstones[0][0] > self.tombstone_s:
            t, job_id = self._tombstones.popleft()
            entry = self._jobs.get(job_id)
            if entry is not None and entry[0] is None and entry[2] == t:
                del self._jobs[job_id]

    def get(self, job_id: str) -> pb.Job | None:
        """The job as last committed here, or None: not holding GPUs, or not written
        (nor re-read by the scheduler) since this broker leads. Read-only."""
        with self._lock:
            entry = self._jobs.get(job_id)
        if entry is None or entry[0] is None:
            self.misses += 1
            return None
        self.hits += 1
        return entry[0]

    def clear(self) -> None:
        """Forget everything (leadership changed: others may have written meanwhile)."""
        with self._lock:
            self._jobs.clear()
            self._tombstones.clear()

    def __len__(self) -> int:
        """Jobs kept (tombstones aside)."""
        with self._lock:
            return sum(1 for e in self._jobs.values() if e[0] is not None)
