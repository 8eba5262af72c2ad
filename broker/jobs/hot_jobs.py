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

* **Only commits fill it**, never a read: a reader that raced a commit cannot put an
  older copy back. A miss (a job not written since this broker leads, or not holding
  GPUs) is read from the store, as before.
* **The higher version wins** (concurrent writers may report out of order), and a job
  that leaves the holding phases is dropped (it has no running attempt to talk about),
  leaving its version behind for a while so a late report of an older copy stays out.
* **Bounded staleness for writers behind the applier's back** (an operator tool on the
  same SQLite file): an entry older than ``max_age_s`` is a miss. Nothing is written
  from a stale copy anyway: every write is a compare-and-set on the version, which
  re-reads the store on a conflict.
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

MAX_AGE_S = 30.0  # as the scheduler's resync of its live jobs (broker/scheduling/live_jobs.py)


class HotJobs:
    """``committed(job)`` on every commit (any thread); ``get(job_id)``: the newest
    committed copy of a job holding GPUs, or None (read the store).

    A commit of a job that does not hold GPUs leaves a *tombstone* (its version) for
    ``max_age_s``: two writers of one job tell their commits after the fact, so the
    listener of an older version (a RUNNING copy) may run after the one of a newer
    (the end); the tombstone keeps that older copy out."""

    def __init__(self, max_age_s: float = MAX_AGE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        # job id -> (the job, or None for a tombstone; its version; when it was told)
        self._jobs: dict[str, tuple[pb.Job | None, int, float]] = {}
        self._tombstones: deque[tuple[float, str]] = deque()  # oldest first, for pruning
        self.hits = 0  # gets answered from memory (tests, benchmarks)
        self.misses = 0

    def committed(self, job: pb.Job) -> None:
        """A job write committed: keep its copy while it holds GPUs, else a tombstone."""
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
        """Drop tombstones older than ``max_age_s`` (lock held)."""
        while self._tombstones and now - self._tombstones[0][0] > self.max_age_s:
            t, job_id = self._tombstones.popleft()
            entry = self._jobs.get(job_id)
            if entry is not None and entry[0] is None and entry[2] == t:
                del self._jobs[job_id]

    def get(self, job_id: str) -> pb.Job | None:
        """The job as last committed here, or None: not holding GPUs, not written by
        this broker since it leads, or not written for ``max_age_s``. Read-only."""
        with self._lock:
            entry = self._jobs.get(job_id)
        if entry is None or entry[0] is None or self._clock() - entry[2] > self.max_age_s:
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
