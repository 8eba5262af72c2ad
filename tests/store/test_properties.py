"""Property: any interleaving of creates / CAS updates (fresh or stale) / appends keeps
every job's events contiguous (seq 1..n) and its version increasing by exactly one per
successful update, on both stores. Hypothesis finds the odd sequences we would not."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.store import Store, VersionConflict
from broker.store.redis import RedisStore
from broker.store.sqlite import SQLiteStore
from computebroker.v1 import common_pb2 as pb

ops = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.integers(0, 3)),
        st.tuples(st.just("update"), st.integers(0, 9), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("append"), st.integers(0, 9), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=25,
)

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _run(store: Store, sequence) -> None:
    versions: dict[str, int] = {}
    n_events: dict[str, int] = {}
    ids: list[str] = []
    for op in sequence:
        if op[0] == "create":
            jid = f"j{len(ids):03d}"
            job = store.create_job(pb.Job(id=jid, spec=pb.JobSpec(team="t")),
                                   [pb.JobEvent(type="e")] * op[1])
            assert job.version == 1
            ids.append(jid)
            versions[jid], n_events[jid] = 1, op[1]
            continue
        if not ids:
            continue
        jid = ids[op[1] % len(ids)]
        if op[0] == "update":
            _, _, n, stale = op
            job = store.get_job(jid)
            assert job.version == versions[jid]
            job.restarts += 1
            expected = job.version - 1 if stale else job.version
            try:
                out = store.update_job(job, expected, [pb.JobEvent(type="u")] * n)
            except VersionConflict:
                assert stale
            else:
                assert not stale
                assert out.version == versions[jid] + 1
                versions[jid] += 1
                n_events[jid] += n
        else:
            out_events = store.append_events(jid, [pb.JobEvent(type="a")] * op[2])
            assert [e.seq for e in out_events] == list(
                range(n_events[jid] + 1, n_events[jid] + op[2] + 1))
            n_events[jid] += op[2]
        assert store.get_job(jid).version == versions[jid]
    for jid in ids:
        assert [e.seq for e in store.list_events(jid)] == list(range(1, n_events[jid] + 1))
        assert store.get_job(jid).version == versions[jid]


@SETTINGS
@given(sequence=ops)
def test_sqlite_events_contiguous_versions_monotonic(sequence):
    store = SQLiteStore(":memory:")
    try:
        _run(store, sequence)
    finally:
        store.close()


@SETTINGS
@given(sequence=ops)
def test_redis_events_contiguous_versions_monotonic(redis_server, sequence):
    store = RedisStore(f"{redis_server.url}?prefix=h{uuid.uuid4().hex[:12]}")
    try:
        _run(store, sequence)
    finally:
        store.close()
