"""The one narrow state interface the broker uses (docs/architecture.md "State and leadership").

Why this shape:
- Jobs are stored as serialized ``computebroker.v1.Job`` protobufs with a
  ``version`` that every write compares-and-sets, so two writers (scheduler loop,
  an RPC, an agent stream, a second broker replica) can never silently overwrite
  each other: the loser gets :class:`VersionConflict`, re-reads, and retries.
- A job write and the events it causes are one atomic operation: history can
  never disagree with state, and a crash between the two cannot happen.
- Everything else (agents, plans, teams, regions, broker settings) is a small
  keyed record: ``put_record``/``get_record``/``list_records`` per kind, protobuf
  bytes as the value. Last writer wins there; those records have one owner each.
- ``acquire_lease`` gives one leader among broker replicas. Both stores enforce it
  (SQLite too: two broker processes pointed at one file must not both schedule). A
  broker restarted after a crash with a new holder id waits out the old lease's TTL.
- **Fencing**: every lease grant to a new holder increments the lease's *epoch*
  (``acquire_lease_epoch`` returns it). A leader calls ``fence_writes(name, epoch)``;
  from then on every mutating call of that store object checks, inside the same
  atomic write (Redis script / SQLite transaction), that the lease's epoch is still
  ``epoch`` and raises :class:`Fenced` otherwise. A leader frozen past its lease
  (SIGSTOP, GC pause, partition) therefore cannot write once a standby took over,
  however late its queued writes arrive.

Implementations: ``broker.store.sqlite.SQLiteStore`` (embedded default) and
``broker.store.redis.RedisStore`` (HA). Both pass ``tests/store/test_conformance.py``.
"""

from __future__ import annotations

import abc
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TypeVar

from google.protobuf.message import Message

from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import logs_pb2 as lpb

M = TypeVar("M", bound=Message)


class StoreError(Exception):
    """Base of store errors."""


class NotFound(StoreError):
    pass


class AlreadyExists(StoreError):
    pass


class VersionConflict(StoreError):
    """The job changed since it was read; re-read and retry."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (connection refused/reset, timeout) even after the
    store's own bounded retries. Callers see UNAVAILABLE and retry later; the write may
    or may not have happened, so only idempotent writes should be blindly repeated."""


class CorruptRecord(StoreError):
    """A stored value that no longer decodes (disk or manual damage, a bug of an older
    broker). Reads of that one record answer DATA_LOSS; lists skip it (see decode_each)."""


# What was skipped, by kind ("job", "event", "record:agent"...): surfaced in the log (one
# warning per record) and as the metric computebroker.store.corrupt_records (issue 12).
CORRUPT: Counter[str] = Counter()
_log = logging.getLogger(__name__)


def decode(message_type: type[M], data: bytes, what: str) -> M:
    """One stored value, or CorruptRecord naming it (never a DecodeError traceback)."""
    try:
        return message_type.FromString(data)
    except Exception as e:  # noqa: BLE001 - DecodeError, or worse bytes
        CORRUPT[what.split(" ", 1)[0]] += 1
        _log.warning("store: %s does not decode as %s (%s); skipped", what,
                     message_type.DESCRIPTOR.name, e)
        raise CorruptRecord(f"stored {what} is damaged and cannot be read; an operator"
                            " should restore or delete it") from None


def decode_each(message_type: type[M], items: Iterable[tuple[str, bytes]]) -> list[M]:
    """Decode ``(what, data)`` pairs, skipping (and logging) the ones that do not decode:
    one bad record must never break a scheduler pass or a list for everyone."""
    out = []
    for what, data in items:
        try:
            out.append(decode(message_type, data, what))
        except CorruptRecord:
            continue
    return out


class Fenced(StoreError):
    """A write carried a leader epoch older than the lease's current one: another
    replica leads now, so this one must not change anything (issue 15 defect 7)."""


# Kinds of keyed records (put_record / get_record / list_records).
KIND_AGENT = "agent"  # computebroker.v1.Register (+ broker bookkeeping), key = agent_id
KIND_PLAN = "plan"  # computebroker.v1.TrainingPlan, key = plan id
KIND_TEAM = "team"  # computebroker.v1.TeamQuota, key = team
KIND_REGION = "region"  # computebroker.v1.RegionInfo (draining flag etc.), key = region
# The quota an operator last set for a team: the ceiling its team admins stay within.
KIND_TEAM_GRANT = "team-grant"  # computebroker.v1.TeamQuota, key = team
# Priority classes set through the API (broker/jobs/priority_classes.py); the config's
# classes are the defaults for names with no record. A deleted class leaves a tombstone
# so the config's default for that name does not come back.
KIND_PRIORITY_CLASS = "priority-class"  # computebroker.v1.PriorityClass, key = name
KIND_PRIORITY_CLASS_DELETED = "priority-class-deleted"  # computebroker.v1.PriorityClass, key = name
# computebroker.v1.UsageSeriesState, key "fleet": the usage series (broker/telemetry/series.py)
KIND_USAGE_SERIES = "usage-series"


def job_columns(job: pb.Job) -> tuple[str, str, int, str]:
    """The indexed columns of a stored job: team, client request id, phase, region."""
    return job.spec.team, job.client_request_id, int(job.phase), job.placement.region


def versioned_copy(job: pb.Job, version: int) -> pb.Job:
    """The job as it will be stored: a copy carrying ``version``."""
    stored = pb.Job()
    stored.CopyFrom(job)
    stored.version = version
    return stored


def new_job_copy(job: pb.Job) -> pb.Job:
    """:meth:`Store.create_job`'s precondition and stored form (version 1)."""
    if not job.id:
        raise StoreError("job.id must be set before create_job")
    return versioned_copy(job, 1)


# A keyed record written together with a job creation: (kind, key, message).
Rider = tuple[str, str, Message]
# One member of ``Store.create_jobs``: (job, events) or (job, events, riders).
CreateItem = tuple[pb.Job, Sequence[pb.JobEvent]] | tuple[pb.Job, Sequence[pb.JobEvent], Sequence[Rider]]


def riders_of(item: CreateItem) -> Sequence[Rider]:
    """The keyed records that ride along a ``create_jobs`` member (none for a pair)."""
    return item[2] if len(item) > 2 else ()  # type: ignore[misc]


def numbered_events(job_id: str, first_seq: int,
                    events: Sequence[pb.JobEvent]) -> list[pb.JobEvent]:
    """Copies of ``events`` as stored: this job's id and seq first_seq, first_seq+1, ..."""
    out = []
    for i, ev in enumerate(events, start=first_seq):
        e = pb.JobEvent()
        e.CopyFrom(ev)
        e.job_id = job_id
        e.seq = i
        out.append(e)
    return out


class Store(abc.ABC):
    """Narrow, synchronous, thread-safe state interface."""

    # ---- jobs and their events -------------------------------------------------
    @abc.abstractmethod
    def create_job(self, job: pb.Job, events: Sequence[pb.JobEvent] = ()) -> pb.Job:
        """Insert a new job (version becomes 1) with its first events.

        Raises AlreadyExists if the id exists, or if ``job.client_request_id`` is set
        and a job with the same (team, client_request_id) exists: the caller then
        returns that job (idempotent submit) via :meth:`find_job_by_request_id`.
        """

    def create_jobs(self, items: Sequence[CreateItem]) -> list[pb.Job | StoreError]:
        """Group commit: :meth:`create_job` for each (job, events), as few atomic writes
        as the store allows (SQLite: one transaction, one fsync; Redis: one pipeline).

        Each member stands alone: the result list holds, per item and in order, the
        stored job or the error that member alone met (``AlreadyExists`` for a
        duplicate id or request id, even one repeated inside the same batch); the
        other members are written regardless. A failure of the whole write (Fenced,
        StoreUnavailable, a failed commit) raises and writes nothing of the batch
        on SQLite (Redis: the members before it may have been written, each whole).

        A member may carry *riders* (``(job, events, [(kind, key, message), ...])``):
        keyed records written only if its job is, and durable before this returns
        (SQLite: inside the member's savepoint; Redis: a second pipeline). Why: a
        SubmitJob's audit record then shares its job's commit instead of waiting
        for a commit of its own (broker/auth/audit.py)."""
        out: list[pb.Job | StoreError] = []
        for item in items:
            try:
                out.append(self.create_job(item[0], item[1]))
            except AlreadyExists as e:
                out.append(e)
                continue
            for kind, key, message in riders_of(item):
                self.put_record(kind, key, message)
        return out

    @abc.abstractmethod
    def get_job(self, job_id: str) -> pb.Job:
        """Raises NotFound."""

    @abc.abstractmethod
    def find_job_by_request_id(self, team: str, client_request_id: str) -> pb.Job | None: ...

    # ---- acknowledging what was read ---------------------------------------------
    def get_job_confirmed(self, job_id: str) -> pb.Job:
        """:meth:`get_job`, returned only once the store's replicas hold everything the
        read saw. Why: a broker that acknowledges on the strength of a read (an agent's
        re-sent end found already applied) must not acknowledge a write that reached the
        primary but no replica (its own WAIT timed out, so it was never acknowledged);
        a failover would lose it. One server, nothing to confirm: the plain read."""
        return self.get_job(job_id)

    def confirm_replicated(self) -> None:
        """Return once the replicas hold everything the store held when called, else
        raise :class:`StoreUnavailable`: the barrier before an acknowledgement that rests
        on reads. One server: nothing to wait for."""
        return None

    @abc.abstractmethod
    def update_job(
        self, job: pb.Job, expected_version: int, events: Sequence[pb.JobEvent] = ()
    ) -> pb.Job:
        """Compare-and-set: write ``job`` if the stored version == expected_version.

        The stored job gets version expected_version + 1 (returned). Events are
        appended atomically with the write; the store assigns their ``seq``
        (1, 2, 3 ... per job) and ``job_id``. Raises VersionConflict or NotFound.
        """

    @abc.abstractmethod
    def list_jobs(
        self,
        *,
        team: str = "",
        phases: Sequence[int] = (),
        region: str = "",
        after_id: str = "",
        limit: int = 100,
    ) -> list[pb.Job]:
        """Jobs ordered by id (ids sort by creation), after ``after_id``; filters AND."""

    def job_versions(self, phases: Sequence[int]) -> dict[str, int]:
        """``{id: version}`` of every job in ``phases``. Why: the scheduler's periodic
        re-read of its live jobs needs to parse only the jobs whose version moved
        (broker/scheduling/live_jobs.py); a store that can read the column alone
        overrides this (SQLite), the default reads the jobs."""
        from broker.store.jobs_query import iter_jobs  # the paging helper lives there

        return {j.id: j.version for j in iter_jobs(self, phases=phases)}

    @abc.abstractmethod
    def checkpoint_prefix_jobs(self, keys: Sequence[str], inside: tuple[str, str] | None = None,
                               ) -> list[str]:
        """Ids (sorted, once each) of the jobs whose chosen checkpoint prefix has one of
        ``keys`` or a key in the half-open range ``inside`` (broker/store/
        checkpoint_index.py makes both). An indexed lookup in every store: a submit
        that chooses a prefix must not read every job the broker ever had."""

    @abc.abstractmethod
    def list_events(self, job_id: str, after_seq: int = 0, limit: int = 0) -> list[pb.JobEvent]:
        """A job's events with seq > after_seq, oldest first; limit 0 = all."""

    @abc.abstractmethod
    def append_events(self, job_id: str, events: Sequence[pb.JobEvent]) -> list[pb.JobEvent]:
        """Append events that do not change the job (e.g. progress); returns them with seq."""

    # ---- rank logs (docs/contracts.md "Rank logs") ----------------------------------
    @abc.abstractmethod
    def append_logs(self, job_id: str, chunk: lpb.LogChunk, max_bytes: int) -> int:
        """Store a chunk's new lines atomically; return the stream's stored end offset.

        Dedup by offset: lines ending at or before the stored end of (job, attempt,
        rank, stream) are skipped (a resend after a reconnect), so a chunk applied twice
        changes nothing. A chunk starting past the stored end (the agent dropped part of
        its backlog) is stored after a marker line saying how many bytes are missing.
        Lines get the attempt's next ``seq``. Then, while the attempt's stored text is
        over ``max_bytes``, its oldest lines are dropped and counted (:meth:`read_logs`).
        """

    @abc.abstractmethod
    def log_offsets(self, job_id: str) -> list[lpb.LogOffset]:
        """The stored end offset of every (attempt, rank, stream) of a job."""

    @abc.abstractmethod
    def read_logs(self, job_id: str, attempt: int, after_seq: int = 0) -> tuple[list[lpb.LogLine], int]:
        """An attempt's stored lines with seq > after_seq (oldest first) and how many
        of its oldest lines were dropped by the size bound."""

    # ---- keyed records -----------------------------------------------------------
    @abc.abstractmethod
    def put_record(self, kind: str, key: str, message: Message) -> None: ...

    @abc.abstractmethod
    def get_record(self, kind: str, key: str, message_type: type[Message]) -> Message | None: ...

    @abc.abstractmethod
    def list_records(self, kind: str, message_type: type[Message]) -> list[Message]:
        """All records of a kind, ordered by key."""

    @abc.abstractmethod
    def delete_record(self, kind: str, key: str) -> bool: ...

    # ---- leadership --------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew lease ``name`` for ``holder``; False if another holder has it."""
        return self.acquire_lease_epoch(name, holder, ttl_s) > 0

    @abc.abstractmethod
    def acquire_lease_epoch(self, name: str, holder: str, ttl_s: float) -> int:
        """Take or renew lease ``name``; 0 if another holder has it, else the lease's
        epoch: incremented each time the lease passes to a holder (a new one, or the
        same one after it had expired), unchanged by a renewal."""

    @abc.abstractmethod
    def fence_writes(self, name: str, epoch: int | None) -> None:
        """From now on refuse (raise :class:`Fenced`) every mutating call unless lease
        ``name`` is still at ``epoch``; ``None`` turns fencing off (the default)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections/files."""
