"""Small read helpers over the store shared by the scheduler, services and views."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from broker.store.base import Store
from computebroker.v1 import common_pb2 as pb

PAGE = 500


def iter_jobs(store: Store, *, phases: Iterable[int] = (), team: str = "",
              region: str = "") -> Iterator[pb.Job]:
    """Every job matching the filters, paging by id so no single read is huge."""
    phases = list(phases)
    after = ""
    while True:
        page = store.list_jobs(team=team, phases=phases, region=region, after_id=after, limit=PAGE)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1].id
