"""The scheduler's live jobs, kept between passes from the applier's commits.

Why: a pass used to read every live job from the store and parse it. Under a
stream of submits (each one wakes the scheduler) that full read *was* the broker's
main cost: O(queue) work per submit, holding the store's lock against the very
submits that caused it. Every job write goes through the one applier
(broker/jobs/applier.py), which hands each committed job here, so the set can be
kept by deltas: a pass costs the changes since the last one.

Compact: the set holds each live job WITHOUT ``spec.env`` and without the users'
``spec.labels`` (:func:`compact`; the broker's own ``cb.`` labels, such as the
recovery policy a pass reads, are kept). No pass reads the rest (placement needs
resources, regions, team, class, progress; every write re-reads the stored job
through the applier), and a map is the costliest part of a parsed job: a ~3.5 KB job
with 40 variables and 12 labels took ~15 KB of the broker's RSS parsed, ~5.4 KB
without the variables and ~2.6 KB without the users' labels too (measured with RSS:
protobuf's arenas are not seen by tracemalloc), so a 50k-job backlog held ~750 MB
here alone at first. It also keeps the teams' secrets out of the scheduler's
long-lived copies. (``spec.command`` is kept: dropping it
too failed a scheduler test, a lost agent's job not placed again, in one run; the
reader was not found, so the field stays until it is.)

Safety net: a re-read every ``resync_s`` (and a full read on the first pass), so a
job written behind the applier's back (an operator tool on the same SQLite file) is
seen within that time. Given ``read_versions`` and ``read_one``, the re-read takes
the live jobs' versions alone and reads and parses only the jobs whose version
moved: a full read parsed every row (~15 us each: ~0.75 s of CPU every 30 s at a
50,000-job backlog, a share of every submit's CPU), nearly all to find it unchanged.
Commits may be reported out of order by concurrent writers:
the higher ``version`` of a job always wins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from broker.jobs.lifecycle import LIVE
from computebroker.v1 import common_pb2 as pb

RESYNC_S = 30.0
DROPPED_SPEC_FIELDS = ("env",)  # what no scheduling pass reads (see above)
KEPT_LABEL_PREFIX = "cb."  # the broker's own labels (recovery policy): passes read them


def compact(job: pb.Job) -> pb.Job:
    """A copy of ``job`` without the spec fields no pass reads. Two copies, not
    one: a protobuf message keeps the memory of a cleared map in its arena, so the
    trimmed copy is copied once more into a fresh message that never held it."""
    spec = job.spec
    users_labels = any(not k.startswith(KEPT_LABEL_PREFIX) for k in spec.labels)
    if not users_labels and not any(len(getattr(spec, f)) for f in DROPPED_SPEC_FIELDS):
        return job  # nothing to drop: kept as committed, as before
    trimmed = pb.Job()
    trimmed.CopyFrom(job)
    for f in DROPPED_SPEC_FIELDS:
        trimmed.spec.ClearField(f)
    if users_labels:
        labels = trimmed.spec.labels
        for k in [k for k in labels if not k.startswith(KEPT_LABEL_PREFIX)]:
            del labels[k]
    out = pb.Job()
    out.CopyFrom(trimmed)
    return out


class LiveJobs:
    def __init__(self, read_all: Callable[[], Iterable[pb.Job]], resync_s: float = RESYNC_S,
                 clock: Callable[[], float] = time.monotonic,
                 read_versions: Callable[[], dict[str, int]] | None = None,
                 read_one: Callable[[str], pb.Job | None] | None = None) -> None:
        self._read_all = read_all
        self._read_versions = read_versions
        self._read_one = read_one
        self.rows_parsed = 0  # jobs read and parsed by full reads and re-reads (tests, benchmarks)
        self.resync_s = resync_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, pb.Job] = {}  # commits since the last pass
        self._live: dict[str, pb.Job] | None = None
        self._synced_at = 0.0
        self.full_reads = 0
        self.attached = True  # False once the applier no longer reports commits here

    def committed(self, job: pb.Job) -> None:
        """A job write committed (the applier's listener; any thread)."""
        with self._lock:
            old = self._pending.get(job.id)
            if old is None or job.version >= old.version:
                self._pending[job.id] = job

    def current(self) -> list[pb.Job]:
        """The live jobs now, ordered by id (as a store read returns them)."""
        with self._lock:
            changes, self._pending = self._pending, {}
        live = self._live
        if live is None or not self.attached or self._clock() - self._synced_at >= self.resync_s:
            # Commits reported from here on are applied after the read (the higher
            # version wins), so none is lost between the read and the next pass.
            # An unchanged job (same version) keeps its compact copy; with the versions
            # at hand (_reread) only the changed and new jobs are read and parsed.
            kept = self._live or {}
            if kept and self.attached and self._read_versions is not None and self._read_one is not None:
                live = self._reread(kept, self._read_versions(), self._read_one, changes)
            else:
                live = {}
                for j in self._read_all():
                    self.rows_parsed += 1
                    prev = kept.get(j.id)
                    live[j.id] = prev if prev is not None and prev.version == j.version else compact(j)
            self._synced_at = self._clock()
            self.full_reads += 1
        for job in changes.values():
            old = live.get(job.id)
            if old is not None and old.version > job.version:
                continue
            if job.phase in LIVE:
                live[job.id] = compact(job)
            else:
                live.pop(job.id, None)
        self._live = live
        return sorted(live.values(), key=_job_id)

    def _reread(self, kept: dict[str, pb.Job], versions: dict[str, int],
                read_one: Callable[[str], pb.Job | None],
                changes: dict[str, pb.Job]) -> dict[str, pb.Job]:
        """The live set from the stored versions: kept copies where the version is the
        same, a read of the job where it moved or is new (gone or finished: left out).
        A job whose commit since the last pass is at hand (``changes``, applied after
        this) is not read again."""
        live: dict[str, pb.Job] = {}
        for jid, version in versions.items():
            prev = kept.get(jid)
            if prev is not None and prev.version == version:
                live[jid] = prev
                continue
            told = changes.get(jid)
            if told is not None and told.version >= version:
                continue  # the reported commit is this version (or newer): applied below
            job = read_one(jid)
            self.rows_parsed += 1
            if job is not None and job.phase in LIVE:
                live[jid] = compact(job)
        return live

    def detach(self) -> None:
        """No more commits will be reported (the loop stopped): every later
        ``current()`` reads the store, as a pass did before this cache."""
        self.attached = False
        self.forget()

    def forget(self) -> None:
        """Drop everything: the next pass reads the store again."""
        with self._lock:
            self._pending = {}
        self._live = None


def _job_id(job: pb.Job) -> str:
    return job.id
