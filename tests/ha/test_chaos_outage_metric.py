"""The fault campaign's outage recovery figures (tests/fixtures/chaos/campaign.py): a job
LAUNCHING at an outage's end whose ranks were still importing then is marked as not
having reached the store, from the attempt's own start-up marks, and the p95 over the
jobs that had reached it is reported beside the full one, never instead of it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixtures.chaos.campaign import _outage_recovery, mark_unreached

END = 1_000_000.0


def _attempt(agents: Path, job: str, n: int, started: float, imported: float | None,
             ended: float | None = None) -> None:
    d = agents / "us-east-2" / "jobs" / job
    (d / f"attempt-{n}").mkdir(parents=True)
    rec = {"job_id": job, "attempt": n, "started": started}
    if ended is not None:
        rec["final"] = {"time": ended, "exit_code": 0}
    (d / f"attempt-{n}.json").write_text(json.dumps(rec))
    startup = {"spawned": started} | ({"imported": imported} if imported is not None else {})
    (d / f"attempt-{n}" / "progress.json").write_text(json.dumps({"startup": startup}))


def test_a_start_still_importing_at_the_end_is_marked_and_reported_beside(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    _attempt(agents, "j-waited", 1, END - 60, END - 40)  # met the outage: held up by it
    _attempt(agents, "j-importing", 1, END - 50, END + 20)  # still importing at the end
    _attempt(agents, "j-relaunched", 1, END - 300, END - 290, ended=END - 100)  # earlier one
    _attempt(agents, "j-relaunched", 2, END - 30, END + 5)
    records = [{"duration_s": 10.0, "end_wall": END, "job_recovery_s": {
        "j-waited": {"phase_at_end": "LAUNCHING", "s": 6.0},
        "j-importing": {"phase_at_end": "LAUNCHING", "s": 50.0},
        "j-relaunched": {"phase_at_end": "LAUNCHING", "s": 40.0},
        "j-running": {"phase_at_end": "RUNNING", "s": 2.0},
    }}]
    mark_unreached(records, agents)
    jobs = records[0]["job_recovery_s"]
    assert jobs["j-waited"]["reached_store"] is True
    assert (jobs["j-importing"]["reached_store"], jobs["j-importing"]["imported_after_end_s"]) == (
        False, 20.0)
    assert jobs["j-relaunched"]["reached_store"] is False  # the attempt live at the end
    assert "reached_store" not in jobs["j-running"]
    out = _outage_recovery(records)
    assert (out["n"], out["p95_s"], out["goal_met"]) == (4, 50.0, False)  # the full figure stays
    assert out["reached_store"] == {"n": 2, "recovered": 2, "p50_s": 4.0, "p95_s": 6.0,
                                    "max_s": 6.0, "not_reached": 2, "goal_met": True}
