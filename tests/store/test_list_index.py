"""A filtered ListJobs reads the live jobs it asks for, not the team's finished history:
the SQLite plans name the (team, phase, id) / (region, phase, id) / (phase, id) indexes
and never scan the table or sort the team's whole history; Redis walks the phase sets."""

from __future__ import annotations

import itertools
import sqlite3

import pytest

from broker.store.sqlite import _SCHEMA, SQLiteStore, list_jobs_sql
from computebroker.v1 import common_pb2 as pb

LIVE = [pb.JOB_PHASE_PENDING, pb.JOB_PHASE_RUNNING]


def _plan(team: str, phases: list[int], region: str) -> str:
    conn = sqlite3.connect(":memory:")
    conn.executescript(_SCHEMA)
    sql, args = list_jobs_sql(team=team, phases=phases, region=region, after_id="", limit=100)
    return " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))


@pytest.mark.parametrize(("team", "phases", "region"), [
    (t, p, r) for t, p, r in itertools.product(["ml", ""], [LIVE, [pb.JOB_PHASE_PENDING], []],
                                               ["us-east-2", ""]) if p])
def test_phase_filtered_lists_walk_a_phase_index(team: str, phases: list[int], region: str) -> None:
    plan = _plan(team, phases, region)
    assert "SCAN jobs" not in plan, plan
    want = "jobs_team_phase" if team else ("jobs_region_phase" if region else "jobs_phase")
    assert f"USING INDEX {want} " in plan, plan
    assert "phase=?" in plan, plan


def test_team_lists_without_a_phase_use_the_team_index() -> None:
    plan = _plan("ml", [], "")
    assert "USING INDEX jobs_team " in plan and "TEMP B-TREE" not in plan, plan


def _job(i: int, team: str, phase: int) -> pb.Job:
    return pb.Job(id=f"j{i:06d}", spec=pb.JobSpec(team=team), phase=phase,
                  placement=pb.Placement(region="us-east-2"))


def test_filtered_list_is_right_with_much_history(tmp_path) -> None:
    store = SQLiteStore(str(tmp_path / "s.sqlite"))
    try:
        for i in range(3000):
            phase = (pb.JOB_PHASE_SUCCEEDED if i % 500 else pb.JOB_PHASE_PENDING)
            store.create_job(_job(i, "ml" if i % 2 == 0 else "cv", phase), [])
        got = store.list_jobs(team="ml", phases=LIVE, limit=100)
        assert [j.id for j in got] == [f"j{i:06d}" for i in range(0, 3000, 500)]
        page = store.list_jobs(team="ml", phases=LIVE, after_id="j000500", limit=2)
        assert [j.id for j in page] == ["j001000", "j001500"]
        assert len(store.list_jobs(team="ml", limit=0)) == 1500
        assert len(store.list_jobs(phases=[pb.JOB_PHASE_SUCCEEDED], region="us-east-2",
                                   limit=0)) == 2994
    finally:
        store.close()
