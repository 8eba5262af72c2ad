"""Read-only views the servicers get instead of the store.

Why a view and not the store: job writes must go through the applier (one CAS path
with its commands after commit). A servicer that holds only a view cannot write a
job behind the state machine's back; keyed records (teams, plans, regions) are
written through :class:`RecordsView` methods that name what they write.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf.message import Message

from broker.api.errors import NotFound as ApiNotFound
from broker.jobs.hub import EventHub
from broker.store.base import KIND_PLAN, KIND_REGION, KIND_TEAM, NotFound, Store
from broker.store.jobs_query import iter_jobs
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb


class JobsView:
    """Jobs and their events, read-only; ``hub`` wakes watchers after each commit."""

    def __init__(self, store: Store, hub: EventHub) -> None:
        self._store = store
        self.hub = hub

    def get(self, job_id: str) -> pb.Job:
        try:
            return self._store.get_job(job_id)
        except NotFound as e:
            raise ApiNotFound(f"job {job_id!r} not found") from e

    def find(self, job_id: str) -> pb.Job | None:
        try:
            return self._store.get_job(job_id)
        except NotFound:
            return None

    def list(self, *, team: str = "", phases: Iterable[int] = (), region: str = "",
             after_id: str = "", limit: int = 100) -> list[pb.Job]:
        return self._store.list_jobs(team=team, phases=list(phases), region=region,
                                     after_id=after_id, limit=limit)

    def iter(self, *, phases: Iterable[int] = (), team: str = "") -> Iterator[pb.Job]:
        return iter_jobs(self._store, phases=phases, team=team)

    def events(self, job_id: str, after_seq: int = 0, limit: int = 0) -> list[pb.JobEvent]:
        return self._store.list_events(job_id, after_seq=after_seq, limit=limit)


class RecordsView:
    """Operator-owned records (teams, plans, regions): last writer wins, one owner each."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def _list(self, kind: str, t: type[Message]) -> list:
        return self._store.list_records(kind, t)

    def teams(self) -> dict[str, cpb.TeamQuota]:
        return {t.team: t for t in self._list(KIND_TEAM, cpb.TeamQuota)}

    def team(self, name: str) -> cpb.TeamQuota | None:
        return self._store.get_record(KIND_TEAM, name, cpb.TeamQuota)  # type: ignore[return-value]

    def put_team(self, q: cpb.TeamQuota) -> None:
        self._store.put_record(KIND_TEAM, q.team, q)

    def plans(self) -> list[cpb.TrainingPlan]:
        return self._list(KIND_PLAN, cpb.TrainingPlan)

    def plan(self, plan_id: str) -> cpb.TrainingPlan | None:
        return self._store.get_record(KIND_PLAN, plan_id, cpb.TrainingPlan)  # type: ignore[return-value]

    def put_plan(self, plan: cpb.TrainingPlan) -> None:
        self._store.put_record(KIND_PLAN, plan.id, plan)

    def regions(self) -> dict[str, cpb.RegionInfo]:
        return {r.name: r for r in self._list(KIND_REGION, cpb.RegionInfo)}

    def region(self, name: str) -> cpb.RegionInfo | None:
        return self._store.get_record(KIND_REGION, name, cpb.RegionInfo)  # type: ignore[return-value]

    def put_region(self, rec: cpb.RegionInfo) -> None:
        self._store.put_record(KIND_REGION, rec.name, rec)
