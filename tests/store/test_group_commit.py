"""Group commit (``Store.create_jobs`` and broker/store/group_commit.py), SQLite and Redis.

Behaviour only: members of one batch stand alone (a duplicate fails alone, the
rest are written), nothing is lost or doubled under concurrent creates, duplicate
request ids inside one batch resolve to one job, and the leader fence still
refuses a batched write. Batching is forced deterministically (the first write
waits until the others have queued), never by timing.
"""

from __future__ import annotations

import threading
import time

import pytest

from broker.store import KIND_TEAM, AlreadyExists, Store
from broker.store.base import Fenced, StoreError
from broker.store.group_commit import GroupCommit
from computebroker.v1 import common_pb2 as pb
from tests.store.test_conformance import ev, make_job


def test_a_failing_member_fails_alone(store: Store):
    store.create_job(make_job("j-old", team="a", crid="r-old"))
    results = store.create_jobs([
        (make_job("j-1", team="a", crid="r-1"), [ev("submitted")]),
        (make_job("j-old", team="a"), [ev("submitted")]),  # the id exists
        (make_job("j-2", team="a", crid="r-old"), [ev("submitted")]),  # the request id exists
        (make_job("j-3", team="a", crid="r-3"), [ev("submitted"), ev("note")]),
        (make_job("j-4", team="a", crid="r-3"), [ev("submitted")]),  # repeats j-3's, same batch
    ])
    assert [type(r) for r in results] == [pb.Job, AlreadyExists, AlreadyExists, pb.Job, AlreadyExists]
    assert results[0].version == 1 and results[3].id == "j-3"
    assert [e.seq for e in store.list_events("j-3")] == [1, 2]
    ids = {j.id for j in store.list_jobs(limit=0)}
    assert ids == {"j-old", "j-1", "j-3"}  # nothing of the failed members was written
    assert store.list_events("j-2") == [] and store.list_events("j-4") == []
    assert store.find_job_by_request_id("a", "r-3").id == "j-3"


def test_an_empty_batch_writes_nothing(store: Store):
    assert store.create_jobs([]) == []
    assert store.list_jobs(limit=0) == []


def test_a_fenced_batch_writes_nothing(store_factory):
    old, new = store_factory(), store_factory()
    e_old = old.acquire_lease_epoch("leader", "old", ttl_s=0.3)
    old.fence_writes("leader", e_old)
    assert isinstance(old.create_jobs([(make_job("j-1"), [ev("submitted")])])[0], pb.Job)
    deadline = time.monotonic() + 30
    while not (e_new := new.acquire_lease_epoch("leader", "new", ttl_s=30)):
        assert time.monotonic() < deadline, "lease never expired"
        time.sleep(0.05)
    with pytest.raises(Fenced):
        old.create_jobs([(make_job("j-2"), [ev("submitted")]), (make_job("j-3"), [])])
    with pytest.raises(Fenced):  # and through the group committer, for every member
        GroupCommit(old).create(make_job("j-4"), [ev("submitted")])
    assert {j.id for j in new.list_jobs(limit=0)} == {"j-1"}
    assert e_new > e_old


class _Gate:
    """A store whose first ``create_jobs`` waits until ``n`` more callers queued, so
    the next write is one group of them (deterministic batching)."""

    def __init__(self, store: Store, committer_ref: list[GroupCommit], n: int) -> None:
        self.store, self.ref, self.n = store, committer_ref, n
        self.sizes: list[int] = []
        self.first = True

    def create_jobs(self, items):  # noqa: ANN001, ANN201
        if self.first:
            self.first = False
            deadline = time.monotonic() + 60
            while len(self.ref[0]._queue) < self.n:  # noqa: SLF001 - the test's gate
                assert time.monotonic() < deadline, "the other creates never queued"
                time.sleep(0.005)
        self.sizes.append(len(items))
        return self.store.create_jobs(items)


def test_concurrent_creates_are_grouped_and_none_lost_or_doubled(store: Store):
    threads_n, per_thread = 24, 5
    ref: list[GroupCommit] = []
    gate = _Gate(store, ref, threads_n - 1)
    gc = GroupCommit(gate)  # type: ignore[arg-type]
    ref.append(gc)
    results: dict[str, list] = {}
    lock = threading.Lock()

    def worker(t: int) -> None:
        for k in range(per_thread):
            # every thread also repeats one shared request id: exactly one may win it
            crid = "shared" if k == 0 else f"r-{t}-{k}"
            try:
                out: object = gc.create(make_job(f"j-{t:02d}-{k}", team="a", crid=crid), [ev("submitted")])
            except StoreError as e:
                out = e
            with lock:
                results.setdefault(crid, []).append(out)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    shared = results.pop("shared")
    assert sum(isinstance(r, pb.Job) for r in shared) == 1
    assert all(isinstance(r, AlreadyExists) for r in shared if not isinstance(r, pb.Job))
    assert all(len(v) == 1 and isinstance(v[0], pb.Job) for v in results.values())
    stored = store.list_jobs(limit=0)
    assert len(stored) == len({j.id for j in stored}) == threads_n * (per_thread - 1) + 1
    assert gc.members == threads_n * per_thread
    assert max(gate.sizes) >= threads_n - 1  # the gated write carried a whole group
    assert gc.groups < gc.members


def test_concurrent_record_puts_and_creates_all_land(store: Store):
    """Record writes (audit records) join the same write groups as job creations."""
    def worker(t: int) -> None:
        for k in range(5):
            store.put_record(KIND_TEAM, f"t-{t}-{k}", pb.JobSpec(name=f"v{t}-{k}"))
            store.create_jobs([(make_job(f"j-{t:02d}-{k}"), [ev("submitted")])])

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(12)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    names = {r.name for r in store.list_records(KIND_TEAM, pb.JobSpec)}
    assert names == {f"v{t}-{k}" for t in range(12) for k in range(5)}
    assert len(store.list_jobs(limit=0)) == 60


def test_riders_are_written_with_their_member_only(store: Store):
    """A member's riders (a SubmitJob's audit record) are committed with its job, and
    roll back with it when that member fails alone."""
    store.create_job(make_job("j-old", team="a", crid="r-old"))
    results = store.create_jobs([
        (make_job("j-1", team="a", crid="r-1"), [ev("submitted")], [(KIND_TEAM, "k-1", pb.JobSpec(name="one"))]),
        (make_job("j-2", team="a", crid="r-old"), [ev("submitted")],  # request id taken: fails alone
         [(KIND_TEAM, "k-2", pb.JobSpec(name="two"))]),
        (make_job("j-3", team="a"), [ev("submitted")]),  # no riders
        (make_job("j-4", team="a"), [], [(KIND_TEAM, "k-4a", pb.JobSpec(name="4a")),
                                         (KIND_TEAM, "k-4b", pb.JobSpec(name="4b"))]),
    ])
    assert [type(r) for r in results] == [pb.Job, AlreadyExists, pb.Job, pb.Job]
    assert {r.name for r in store.list_records(KIND_TEAM, pb.JobSpec)} == {"one", "4a", "4b"}
    assert store.get_record(KIND_TEAM, "k-2", pb.JobSpec) is None


def test_riders_through_the_group_committer(store: Store):
    """``GroupCommit.create(..., riders)``: grouped members each keep their own riders."""
    ref: list[GroupCommit] = []
    gate = _Gate(store, ref, 7)
    gc = GroupCommit(gate)  # type: ignore[arg-type]
    ref.append(gc)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            gc.create(make_job(f"j-{t}", team="a", crid="dup" if t in (3, 5) else f"r-{t}"),
                      [ev("submitted")], [(KIND_TEAM, f"k-{t}", pb.JobSpec(name=f"n{t}"))])
        except StoreError as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert len(errors) == 1 and isinstance(errors[0], AlreadyExists)  # one of the two "dup"s
    jobs = {j.id for j in store.list_jobs(limit=0)}
    assert len(jobs) == 7
    names = {r.name for r in store.list_records(KIND_TEAM, pb.JobSpec)}
    assert names == {f"n{j.removeprefix('j-')}" for j in jobs}  # exactly the written members'
    assert max(gate.sizes) >= 7
