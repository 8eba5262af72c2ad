"""One behaviour suite for every Store implementation (SQLite and Redis).

The broker is written against broker/store/base.py only; these tests pin down the
semantics it relies on so either store can be swapped in by a URL.
"""

from __future__ import annotations

import threading
import time

import pytest

from broker.store import (
    KIND_AGENT,
    KIND_TEAM,
    AlreadyExists,
    NotFound,
    Store,
    VersionConflict,
)
from broker.store.base import Fenced
from computebroker.v1 import common_pb2 as pb

P = pb  # short alias for phases


def make_job(job_id: str, team: str = "a", crid: str = "", phase: int = P.JOB_PHASE_PENDING,
             region: str = "") -> pb.Job:
    job = pb.Job(id=job_id, spec=pb.JobSpec(team=team, name=f"n-{job_id}"), phase=phase,
                 client_request_id=crid)
    if region:
        job.placement.region = region
    return job


def ev(kind: str, **kw) -> pb.JobEvent:
    return pb.JobEvent(type=kind, **kw)


def cas_update(store: Store, job_id: str, mutate, events=()) -> pb.Job:
    """Read-modify-write with retry, the way the broker is expected to use the store."""
    for _ in range(10_000):
        job = store.get_job(job_id)
        mutate(job)
        try:
            return store.update_job(job, job.version, events)
        except VersionConflict:
            continue
    raise AssertionError("CAS never succeeded")


# ---- jobs --------------------------------------------------------------------------
def test_create_and_get(store: Store):
    job = make_job("j-001", team="vision", region="")
    job.created_time = 123.5
    created = store.create_job(job, [ev("submitted", actor="user:alice")])
    assert created.version == 1
    got = store.get_job("j-001")
    assert got == created
    assert got.spec.team == "vision"
    assert got.created_time == 123.5
    with pytest.raises(NotFound):
        store.get_job("nope")
    with pytest.raises(AlreadyExists):
        store.create_job(make_job("j-001"))


def test_idempotent_request_id(store: Store):
    first = store.create_job(make_job("j-1", team="a", crid="req-42"), [ev("submitted")])
    with pytest.raises(AlreadyExists):
        store.create_job(make_job("j-2", team="a", crid="req-42"), [ev("submitted")])
    # the failed create left nothing behind: no job, no events
    with pytest.raises(NotFound):
        store.get_job("j-2")
    assert store.list_events("j-2") == []
    assert store.find_job_by_request_id("a", "req-42") == first
    assert store.find_job_by_request_id("a", "other") is None
    assert store.find_job_by_request_id("b", "req-42") is None
    # same request id in another team is a different job
    store.create_job(make_job("j-3", team="b", crid="req-42"))
    assert store.find_job_by_request_id("b", "req-42").id == "j-3"
    # empty request ids never collide
    store.create_job(make_job("j-4", team="a"))
    store.create_job(make_job("j-5", team="a"))
    assert store.find_job_by_request_id("a", "") is None


def test_cas_update_and_conflict(store: Store):
    store.create_job(make_job("j-1"), [ev("submitted")])
    job = store.get_job("j-1")
    job.phase = P.JOB_PHASE_ADMITTED
    job.message = "admitted"
    updated = store.update_job(job, 1, [ev("admitted", from_phase=P.JOB_PHASE_PENDING,
                                           to_phase=P.JOB_PHASE_ADMITTED)])
    assert updated.version == 2
    assert store.get_job("j-1") == updated
    # a writer holding the stale version loses, and its write + events are not applied
    stale = make_job("j-1", phase=P.JOB_PHASE_CANCELLED)
    with pytest.raises(VersionConflict):
        store.update_job(stale, 1, [ev("cancelled")])
    assert store.get_job("j-1").phase == P.JOB_PHASE_ADMITTED
    assert [e.type for e in store.list_events("j-1")] == ["submitted", "admitted"]
    with pytest.raises(VersionConflict):
        store.update_job(stale, 5)
    with pytest.raises(NotFound):
        store.update_job(make_job("ghost"), 1)


def test_event_seq_ordering(store: Store):
    store.create_job(make_job("j-1"), [ev("submitted"), ev("queued")])
    store.create_job(make_job("j-2"), [ev("submitted")])
    job = store.get_job("j-1")
    store.update_job(job, job.version, [ev("admitted")])
    appended = store.append_events("j-1", [ev("progress", message="1"),
                                           ev("progress", message="2")])
    assert [(e.job_id, e.seq) for e in appended] == [("j-1", 4), ("j-1", 5)]
    events = store.list_events("j-1")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.type for e in events] == ["submitted", "queued", "admitted", "progress", "progress"]
    assert all(e.job_id == "j-1" for e in events)
    # caller-supplied seq/job_id are ignored: the store assigns them
    out = store.append_events("j-1", [pb.JobEvent(job_id="zzz", seq=99, type="x")])
    assert (out[0].job_id, out[0].seq) == ("j-1", 6)
    assert store.list_events("j-1", after_seq=5)[0].seq == 6
    # resume after a seq, with a limit
    assert [e.seq for e in store.list_events("j-1", after_seq=2, limit=2)] == [3, 4]
    assert store.list_events("j-1", after_seq=6) == []
    # per-job sequences are independent
    assert [e.seq for e in store.list_events("j-2")] == [1]
    with pytest.raises(NotFound):
        store.append_events("ghost", [ev("x")])
    assert store.list_events("ghost") == []


def test_list_filters_and_pagination(store: Store):
    teams = ["a", "b", "c"]
    phases = [P.JOB_PHASE_PENDING, P.JOB_PHASE_RUNNING, P.JOB_PHASE_SUCCEEDED]
    regions = ["", "us-east", "eu-west"]
    model: dict[str, tuple[str, int, str]] = {}
    for i in range(30):
        jid = f"j-{i:03d}"
        t, ph, rg = teams[i % 3], phases[(i // 3) % 3], regions[(i // 2) % 3]
        store.create_job(make_job(jid, team=t, phase=ph, region=rg))
        model[jid] = (t, ph, rg)
    # move some jobs: phase and region changes must move them between indexes
    for i in range(0, 30, 4):
        jid = f"j-{i:03d}"

        def mutate(j: pb.Job) -> None:
            j.phase = P.JOB_PHASE_RUNNING
            j.placement.region = "ap-south"

        cas_update(store, jid, mutate)
        model[jid] = (model[jid][0], P.JOB_PHASE_RUNNING, "ap-south")

    def expected(team="", phs=(), region=""):
        return sorted(j for j, (t, ph, rg) in model.items()
                      if (not team or t == team) and (not phs or ph in phs)
                      and (not region or rg == region))

    cases = [
        {}, {"team": "a"}, {"phases": [P.JOB_PHASE_RUNNING]},
        {"phases": [P.JOB_PHASE_PENDING, P.JOB_PHASE_SUCCEEDED]}, {"region": "us-east"},
        {"region": "ap-south"}, {"team": "b", "phases": [P.JOB_PHASE_RUNNING]},
        {"team": "c", "region": "eu-west", "phases": [P.JOB_PHASE_PENDING]},
        {"team": "nobody"}, {"region": "mars"},
    ]
    for case in cases:
        want = expected(case.get("team", ""), tuple(case.get("phases", ())),
                        case.get("region", ""))
        got = [j.id for j in store.list_jobs(limit=1000, **case)]
        assert got == want, case
        # page through with a small limit: same ids, in order, no duplicates
        paged: list[str] = []
        after = ""
        while True:
            page = store.list_jobs(after_id=after, limit=4, **case)
            assert len(page) <= 4
            if not page:
                break
            paged.extend(j.id for j in page)
            after = page[-1].id
        assert paged == want, case
    assert [j.id for j in store.list_jobs(limit=5)] == sorted(model)[:5]
    assert [j.id for j in store.list_jobs(after_id="j-027")] == ["j-028", "j-029"]


# ---- records -------------------------------------------------------------------------
def test_job_versions_by_phase(store: Store):
    """The scheduler's re-read (broker/scheduling/live_jobs.py): every job in the
    phases with its current version, nothing else."""
    for i, ph in enumerate([P.JOB_PHASE_PENDING, P.JOB_PHASE_RUNNING, P.JOB_PHASE_SUCCEEDED] * 2):
        store.create_job(make_job(f"j-{i:03d}", phase=ph))
    cas_update(store, "j-000", lambda j: setattr(j, "pending_reason", "waiting"))  # version 2
    cas_update(store, "j-003", lambda j: setattr(j, "phase", P.JOB_PHASE_CANCELLED))
    live = [P.JOB_PHASE_PENDING, P.JOB_PHASE_RUNNING]
    assert store.job_versions(live) == {"j-000": 2, "j-001": 1, "j-004": 1}
    assert store.job_versions([P.JOB_PHASE_CANCELLED]) == {"j-003": 2}
    assert store.job_versions(live) == {j.id: j.version for j in store.list_jobs(phases=live, limit=0)}


def test_records_crud(store: Store):
    assert store.get_record(KIND_TEAM, "a", pb.JobSpec) is None
    assert store.list_records(KIND_TEAM, pb.JobSpec) == []
    store.put_record(KIND_TEAM, "zeta", pb.JobSpec(team="zeta"))
    store.put_record(KIND_TEAM, "alpha", pb.JobSpec(team="alpha"))
    store.put_record(KIND_AGENT, "alpha", pb.JobSpec(name="agent"))
    assert store.get_record(KIND_TEAM, "alpha", pb.JobSpec) == pb.JobSpec(team="alpha")
    assert [r.team for r in store.list_records(KIND_TEAM, pb.JobSpec)] == ["alpha", "zeta"]
    store.put_record(KIND_TEAM, "alpha", pb.JobSpec(team="alpha", name="v2"))  # overwrite
    assert store.get_record(KIND_TEAM, "alpha", pb.JobSpec).name == "v2"
    assert store.delete_record(KIND_TEAM, "alpha") is True
    assert store.delete_record(KIND_TEAM, "alpha") is False
    assert [r.team for r in store.list_records(KIND_TEAM, pb.JobSpec)] == ["zeta"]
    # kinds are separate namespaces
    assert store.get_record(KIND_AGENT, "alpha", pb.JobSpec).name == "agent"


# ---- leases ------------------------------------------------------------------------
def test_leases(store: Store):
    assert store.acquire_lease("leader", "broker-1", ttl_s=30) is True
    assert store.acquire_lease("leader", "broker-1", ttl_s=30) is True  # renew
    assert store.acquire_lease("leader", "broker-2", ttl_s=30) is False
    assert store.acquire_lease("other", "broker-2", ttl_s=30) is True  # independent names
    # a short lease that its holder stops renewing expires and can be taken over
    assert store.acquire_lease("short", "broker-1", ttl_s=0.3) is True
    deadline = time.monotonic() + 30
    while not store.acquire_lease("short", "broker-2", ttl_s=30):
        assert time.monotonic() < deadline, "lease never expired"
        time.sleep(0.1)
    assert store.acquire_lease("short", "broker-1", ttl_s=30) is False


def test_lease_epoch_grows_on_each_grant_not_on_renewal(store: Store):
    e1 = store.acquire_lease_epoch("leader", "a", ttl_s=30)
    assert e1 >= 1
    assert store.acquire_lease_epoch("leader", "a", ttl_s=30) == e1  # renewal
    assert store.acquire_lease_epoch("leader", "b", ttl_s=30) == 0  # held by a
    store.acquire_lease("leader", "a", ttl_s=0.001)  # release (1 ms renewal)
    time.sleep(0.05)
    e2 = store.acquire_lease_epoch("leader", "b", ttl_s=30)
    assert e2 > e1


def test_fenced_writes_of_a_replaced_leader_are_refused(store_factory):
    """Issue 15 defect 7: a leader frozen past its lease must not write after a standby
    took over. Every mutating call checks the lease epoch inside the write."""
    old, new = store_factory(), store_factory()
    e_old = old.acquire_lease_epoch("leader", "old", ttl_s=0.3)
    old.fence_writes("leader", e_old)
    old.create_job(make_job("j1"), [ev("submitted")])  # while it leads: fine
    old.put_record(KIND_TEAM, "t", pb.JobSpec(team="t", name="v1"))
    deadline = time.monotonic() + 30
    while not (e_new := new.acquire_lease_epoch("leader", "new", ttl_s=30)):
        assert time.monotonic() < deadline, "lease never expired"
        time.sleep(0.05)
    new.fence_writes("leader", e_new)
    assert e_new > e_old
    job = old.get_job("j1")  # reads stay allowed (a standby reads too)
    job.restarts = 99
    with pytest.raises(Fenced):
        old.update_job(job, job.version, [ev("late")])
    with pytest.raises(Fenced):
        old.create_job(make_job("j2"))
    with pytest.raises(Fenced):
        old.append_events("j1", [ev("late")])
    with pytest.raises(Fenced):
        old.put_record(KIND_TEAM, "t", pb.JobSpec(team="t", name="late"))
    with pytest.raises(Fenced):
        old.delete_record(KIND_TEAM, "t")
    # Nothing of the old leader's late writes reached the store.
    assert new.get_job("j1").restarts == 0
    assert [e.type for e in new.list_events("j1")] == ["submitted"]
    assert new.get_record(KIND_TEAM, "t", pb.JobSpec).name == "v1"
    with pytest.raises(NotFound):
        new.get_job("j2")
    # The new leader writes normally; an unfenced store object is not checked.
    cur = new.get_job("j1")
    cur.restarts = 1
    assert new.update_job(cur, cur.version, [ev("ok")]).restarts == 1
    old.fence_writes("leader", None)
    old.put_record(KIND_TEAM, "u", pb.JobSpec(team="u"))


# ---- concurrency and durability -----------------------------------------------------------
def test_concurrent_cas_increments_lose_nothing(store_factory):
    threads_n, per_thread = 6, 20
    first = store_factory()
    first.create_job(make_job("counter"), [ev("submitted")])
    # half the threads share one store instance, half use their own (like replicas)
    stores = [first if i % 2 == 0 else store_factory() for i in range(threads_n)]
    errors: list[BaseException] = []

    def work(s: Store) -> None:
        try:
            for _ in range(per_thread):
                cas_update(s, "counter", lambda j: setattr(j, "restarts", j.restarts + 1),
                           [ev("inc")])
        except BaseException as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    total = threads_n * per_thread
    job = first.get_job("counter")
    assert job.restarts == total
    assert job.version == total + 1
    events = first.list_events("counter")
    assert [e.seq for e in events] == list(range(1, total + 2))
    assert sum(e.type == "inc" for e in events) == total


def test_second_instance_sees_same_data(store_factory):
    a = store_factory()
    a.create_job(make_job("j-1", crid="r1"), [ev("submitted")])
    cas_update(a, "j-1", lambda j: setattr(j, "message", "hello"), [ev("note")])
    a.put_record(KIND_AGENT, "ag-1", pb.JobSpec(name="ag"))
    a.close()
    b = store_factory()
    assert b.get_job("j-1").message == "hello"
    assert b.get_job("j-1").version == 2
    assert b.find_job_by_request_id("a", "r1").id == "j-1"
    assert [e.seq for e in b.list_events("j-1")] == [1, 2]
    assert b.get_record(KIND_AGENT, "ag-1", pb.JobSpec).name == "ag"
