"""Read-only views the servicers get instead of the store.

Why a view and not the store: job writes must go through the applier (one CAS path
with its commands after commit). A servicer that holds only a view cannot write a
job behind the state machine's back; keyed records (teams, plans, regions) are
written through :class:`RecordsView` methods that name what they write.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from google.protobuf.message import Message

from broker.api.errors import NotFound as ApiNotFound
from broker.jobs.hot_jobs import HotJobs
from broker.jobs.hub import EventHub
from broker.jobs.shared_reads import SharedReads
from broker.store.base import (
    KIND_PLAN,
    KIND_REGION,
    KIND_TEAM,
    KIND_TEAM_GRANT,
    KIND_USAGE_SERIES,
    NotFound,
    Store,
)
from broker.store.jobs_query import iter_jobs
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb


def job_not_found(job_id: str) -> str:
    """The one NOT_FOUND text for a job id: the same for a job that does not exist and
    for another team's job (broker/api/jobs_service.py says why)."""
    return f"job {job_id!r} not found"


class JobsView:
    """Jobs and their events, read-only; ``hub`` wakes watchers after each commit."""

    def __init__(self, store: Store, hub: EventHub, hot: HotJobs | None = None) -> None:
        self._store = store
        self.hub = hub
        self._hot = hot
        self._shared = SharedReads()

    def get(self, job_id: str) -> pb.Job:
        try:
            return self._store.get_job(job_id)
        except NotFound as e:
            raise ApiNotFound(job_not_found(job_id)) from e

    def find(self, job_id: str) -> pb.Job | None:
        try:
            return self._store.get_job(job_id)
        except NotFound:
            return None

    def find_live(self, job_id: str) -> pb.Job | None:
        """:meth:`find`, from memory when the job holds GPUs and was last written by this
        leader (broker/jobs/hot_jobs.py): the agent streams' read, once per message.
        Read-only; a decision acknowledged as durable uses :meth:`find_confirmed`."""
        if self._hot is not None:
            job = self._hot.get(job_id)
            if job is not None:
                return job
        return self.find(job_id)

    def find_confirmed(self, job_id: str) -> pb.Job | None:
        """:meth:`find`, once the store's replicas hold what it read (Store.get_job_confirmed):
        for a decision the broker acknowledges."""
        try:
            return self._store.get_job_confirmed(job_id)
        except NotFound:
            return None

    def confirm_replicated(self) -> None:
        """Wait until the replicas hold all the store held now (Store.confirm_replicated)."""
        self._store.confirm_replicated()

    def checkpoint_prefix_jobs(self, keys: Sequence[str], inside: tuple[str, str] | None = None,
                               ) -> list[pb.Job]:
        """The jobs the store's checkpoint-prefix index names for ``keys`` / ``inside``
        (broker/store/checkpoint_index.py), oldest first."""
        out = []
        for job_id in self._store.checkpoint_prefix_jobs(keys, inside):
            job = self.find(job_id)
            if job is not None:
                out.append(job)
        return out

    def list(self, *, team: str = "", phases: Iterable[int] = (), region: str = "",
             after_id: str = "", limit: int = 100) -> list[pb.Job]:
        return self._store.list_jobs(team=team, phases=list(phases), region=region,
                                     after_id=after_id, limit=limit)

    def versions(self, phases: Iterable[int]) -> dict[str, int]:
        """``{id: version}`` of the jobs in ``phases`` (no job parsed where the store can)."""
        return self._store.job_versions(sorted(phases))

    def iter(self, *, phases: Iterable[int] = (), team: str = "") -> Iterator[pb.Job]:
        return iter_jobs(self._store, phases=phases, team=team)

    def events(self, job_id: str, after_seq: int = 0, limit: int = 0) -> list[pb.JobEvent]:
        return self._store.list_events(job_id, after_seq=after_seq, limit=limit)

    # WatchJob's reads: one store read per job change for all its watchers
    # (broker/jobs/shared_reads.py); ``seen`` is the hub counter the watcher holds.
    def watch_events(self, job_id: str, after_seq: int, seen: int) -> list[pb.JobEvent]:
        return self._shared.get(("ev", job_id, after_seq, seen), lambda: self.events(job_id, after_seq))

    def watch_get(self, job_id: str, seen: int) -> pb.Job:
        return self._shared.get(("job", job_id, seen), lambda: self.get(job_id))


class RecordsView:
    """Operator-owned records (teams, plans, regions): last writer wins, one owner each."""

    TYPES: dict[str, type[Message]] = {KIND_TEAM: cpb.TeamQuota, KIND_PLAN: cpb.TrainingPlan,
                                       KIND_REGION: cpb.RegionInfo,
                                       KIND_TEAM_GRANT: cpb.TeamQuota,
                                       KIND_USAGE_SERIES: cpb.UsageSeriesState}

    def __init__(self, store: Store) -> None:
        self._store = store

    def get(self, kind: str, key: str) -> Any:
        """The record, or None (typed by :attr:`TYPES`)."""
        return self._store.get_record(kind, key, self.TYPES[kind])

    def put(self, kind: str, key: str, message: Message) -> None:
        self._store.put_record(kind, key, message)

    def all(self, kind: str) -> list[Any]:
        return self._store.list_records(kind, self.TYPES[kind])

    def teams(self) -> dict[str, cpb.TeamQuota]:
        return {t.team: t for t in self.all(KIND_TEAM)}

    def plans(self) -> list[cpb.TrainingPlan]:
        return self.all(KIND_PLAN)

    def regions(self) -> dict[str, cpb.RegionInfo]:
        return {r.name: r for r in self.all(KIND_REGION)}
