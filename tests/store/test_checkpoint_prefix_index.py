"""The checkpoint-prefix index: a submit that chooses a ``checkpoint_uri`` (or resumes
from a checkpoint path) finds the job owning a prefix by key lookups, in both stores,
never by reading every job. The SQLite plan is read like the ListJobs plans are."""

from __future__ import annotations

import sqlite3
import uuid

from broker.jobs import checkpoint_shares as cs
from broker.store import Store
from broker.store.checkpoint_index import ancestor_keys, descendant_range, prefix_key
from broker.store.sqlite import _SCHEMA, SQLiteStore, checkpoint_prefix_sql
from computebroker.v1 import common_pb2 as pb


def _job(i: int, uri: str = "", team: str = "ml") -> pb.Job:
    return pb.Job(id=f"j{i:06d}", spec=pb.JobSpec(team=team, checkpoint_uri=uri))


def _prefix_jobs(store: Store):
    def lookup(keys, inside=None):
        return [store.get_job(i) for i in store.checkpoint_prefix_jobs(keys, inside)]
    return lookup


def test_keys_are_canonical() -> None:
    assert prefix_key("/data/ckpt/a/") == prefix_key("file:///data//ckpt/a") == "file:/data/ckpt/a"
    assert ancestor_keys("s3://b/x/y") == ["s3:/", "s3:/b", "s3:/b/x", "s3:/b/x/y"]
    low, high = descendant_range("/data/ckpt")
    assert low <= "file:/data/ckpt/a/b" < high
    assert not (low <= "file:/data/ckpt2" < high) and not (low <= "file:/data/ckpt" < high)
    assert prefix_key("relative/dir") == ""


def test_sqlite_plan_searches_the_primary_key_and_never_scans() -> None:
    conn = sqlite3.connect(":memory:")
    conn.executescript(_SCHEMA)
    for n, inside in ((3, True), (4, False), (0, True)):
        sql = checkpoint_prefix_sql(n, inside)
        args = ["k"] * n + (["a/", "a0"] if inside else [])
        plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "SCAN" not in plan.replace("SCAN CONSTANT", ""), plan
        assert "SEARCH checkpoint_prefixes USING PRIMARY KEY (prefix" in plan, plan
        assert "jobs" not in plan.replace("checkpoint_prefixes", ""), plan


def test_index_answers_ancestors_and_descendants(store: Store) -> None:
    store.create_job(_job(1, "/data/ckpt/alice/run1"))
    store.create_job(_job(2, "s3://bucket/team/run2/"))
    store.create_job(_job(3))  # no chosen prefix: not indexed
    store.create_jobs([(_job(4, "file:///data/ckpt/bob"), [])])
    for i in range(5, 40):
        store.create_job(_job(i, f"/data/other/run{i}"))
    assert store.checkpoint_prefix_jobs(ancestor_keys("/data/ckpt/alice/run1/attempt-1/step-000000010")) == ["j000001"]
    assert store.checkpoint_prefix_jobs(ancestor_keys("s3://bucket/team/run2")) == ["j000002"]
    assert store.checkpoint_prefix_jobs(ancestor_keys("/data/ckpt/alice/run10")) == []
    assert store.checkpoint_prefix_jobs([], descendant_range("/data/ckpt")) == ["j000001", "j000004"]
    assert store.checkpoint_prefix_jobs([], descendant_range("/data/ckpt/alice/run1")) == []
    assert store.checkpoint_prefix_jobs([], descendant_range("/")) == [f"j{i:06d}" for i in range(1, 40)
                                                                       if i not in (2, 3)]


def test_submit_rules_use_the_index(store: Store) -> None:
    """The write-prefix and resume-owner rules give the same answers they gave with a
    scan: overlap above and below is refused, a path inside a chosen prefix names its job."""
    a = store.create_job(_job(1, "/data/ckpt/alice"))
    lookup = _prefix_jobs(store)
    for bad in ("/data/ckpt/alice", "/data/ckpt/alice/sub", "/data/ckpt", "file:///data/ckpt/alice/"):
        try:
            cs.check_write_prefix(pb.JobSpec(checkpoint_uri=bad), lookup, [])
        except cs.FailedPrecondition as e:
            assert "j000001" in e.message
        else:
            raise AssertionError(f"{bad} overlaps job 1's prefix and was accepted")
    cs.check_write_prefix(pb.JobSpec(checkpoint_uri="/data/ckpt/alice2"), lookup, [])
    found = cs.owner_of("/data/ckpt/alice/attempt-1/step-000000005", lookup, [], lambda i: None)
    assert found is not None and found[0].id == a.id and found[1] == "/data/ckpt/alice"
    assert cs.owner_of("/data/ckpt/alice2/attempt-1/step-000000005", lookup, [], lambda i: None) is None


def test_an_older_sqlite_file_is_indexed_once_at_open(tmp_path) -> None:
    path = str(tmp_path / "old.sqlite")
    store = SQLiteStore(path)
    store.create_job(_job(1, "/data/ckpt/alice"))
    store.create_job(_job(2))
    store.close()
    conn = sqlite3.connect(path)  # what a file from before the index looks like
    conn.execute("DROP TABLE checkpoint_prefixes")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        assert store.checkpoint_prefix_jobs(ancestor_keys("/data/ckpt/alice/x")) == ["j000001"]
    finally:
        store.close()


def test_redis_builds_the_index_once_for_jobs_stored_before_it(redis_server) -> None:
    from broker.store.redis import RedisStore

    pfx = f"ckptidx{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"{redis_server.url}?prefix={pfx}")
    try:
        store.create_job(_job(1, "/data/ckpt/alice"))
        r = store._r
        r.delete(f"{pfx}:ckpt", f"{pfx}:ckpt:built")  # as a store from before the index
        again = RedisStore(f"{redis_server.url}?prefix={pfx}")
        try:
            assert again.checkpoint_prefix_jobs(ancestor_keys("/data/ckpt/alice/x")) == ["j000001"]
            assert r.exists(f"{pfx}:ckpt:built")
        finally:
            again.close()
    finally:
        store.close()
