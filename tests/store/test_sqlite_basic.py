"""Quick SQLite-only smoke test (the full suite for both stores is test_conformance.py)."""

from __future__ import annotations

import pytest

from broker.store import AlreadyExists, VersionConflict, open_store
from broker.store.sqlite import SQLiteStore
from computebroker.v1 import common_pb2 as pb


def test_open_store_sqlite_relative_path_creates_parent_dirs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///var/sub/broker.sqlite")
    try:
        assert isinstance(store, SQLiteStore)
        assert (tmp_path / "var" / "sub" / "broker.sqlite").exists()
    finally:
        store.close()


def test_open_store_rejects_unknown_scheme():
    with pytest.raises(ValueError, match="unsupported store URL"):
        open_store("postgres://x")


def test_memory_store_roundtrip():
    store = open_store("sqlite:///:memory:")
    job = pb.Job(id="j1", spec=pb.JobSpec(team="a"), phase=pb.JOB_PHASE_PENDING)
    created = store.create_job(job, [pb.JobEvent(type="submitted")])
    assert created.version == 1
    with pytest.raises(AlreadyExists):
        store.create_job(job)
    created.phase = pb.JOB_PHASE_ADMITTED
    updated = store.update_job(created, 1, [pb.JobEvent(type="admitted")])
    assert updated.version == 2
    with pytest.raises(VersionConflict):
        store.update_job(created, 1)
    assert [e.seq for e in store.list_events("j1")] == [1, 2]
    assert [e.job_id for e in store.list_events("j1")] == ["j1", "j1"]
    assert store.get_job("j1").phase == pb.JOB_PHASE_ADMITTED
    store.close()
