"""Decision-equivalence guard for performance work on ``placement.scheduler``.

Speed-ups must not change a single decision. This test builds the benchmark's
synthetic cluster (``benchmarks/bench_placement.make_snapshot``) at 1/4 size for a
few seeds, plus variants that exercise the less common paths (region caps, borrow
limits, a team without quota, a second cohort, accelerator quota lines, stopping
and non-preemptible victims, excluded nodes, region filters, price caps, unhealthy
and cordoned nodes, a draining region, quotas off) and a short broker-like
multi-pass run, and compares a digest of the full Decisions (admissions with
their explanations, preemptions with messages, every pending reason,
reservations) with the golden digests recorded *before* optimising, in
``golden/perf_equivalence.json``.

Regenerate only when a decision change is intended (and say why in the commit):
``.venv/bin/python -m tests.placement.test_perf_equivalence --regen``
(``--dump FILE`` writes the full decisions, to diff two engines by hand).
On a mismatch the test says which parts differ and writes the current decisions
as JSON under pytest's tmp_path, to diff against a run of the previous engine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from placement.model import Decisions, RunningJob, Snapshot
from placement.scheduler import schedule

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden" / "perf_equivalence.json"


def _bench():
    """The benchmark module, loaded from its file (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_placement", ROOT / "benchmarks" / "bench_placement.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _variant(s: Snapshot) -> Snapshot:
    """Same cluster, with the governance and filter features the plain benchmark leaves unused."""
    teams = []
    for t in s.teams:
        i = int(t.team.split("-")[1])
        if i == 9:
            continue  # a team without quota: its jobs stay pending
        kw: dict = {}
        if i in (0, 2):
            kw["region_caps"] = (("us-east-2", 200), ("eu-west-1", 120))
        if i == 1:
            g = t.guaranteed[0][1]
            kw["guaranteed"] = (("h100", g // 2), ("", g // 2))
        if i == 3:
            kw["borrow_limit"] = 64
        if i == 4:
            kw["can_lend"] = False
        if i == 5:
            kw["weight"] = 2.0
        if i in (6, 7):
            kw["cohort"] = "other"
            kw["lend_limit"] = 100
        if i == 8:
            kw["can_borrow"] = False
        teams.append(replace(t, **kw))
    running = []
    for k, r in enumerate(s.running):
        kw = {}
        if k % 7 == 0:
            kw["stopping"] = True
        if k % 11 == 0:
            kw["preemptible"] = False
        if k % 5 == 0:
            kw["accelerator"] = "h100"
        if k % 3 == 0:
            kw["restart_cost_s"] = 600.0
        running.append(replace(r, **kw) if kw else r)
    ids = [n.id for n in s.nodes]
    pending = []
    for k, j in enumerate(s.pending):
        kw = {}
        if k % 13 == 0:
            kw["excluded_nodes"] = frozenset(ids[(k * 31) % len(ids): (k * 31) % len(ids) + 3])
        if k % 17 == 0:
            kw["allowed_regions"] = frozenset({"us-west-2", "eu-west-1"})
        if k % 19 == 0:
            kw["denied_regions"] = frozenset({"us-east-2"})
        if k % 23 == 0:
            kw["max_price_per_gpu_hour"] = 3.0
        if k % 29 == 0:
            kw["preferred_regions"] = ("eu-west-1", "us-west-2")
        if k % 37 == 0:
            kw["checkpoint_interval_s"] = 0.0
            kw["expected_duration_s"] = 0.0
        pending.append(replace(j, **kw) if kw else j)
    nodes = []
    for k, n in enumerate(s.nodes):
        if k % 97 == 0:
            n = replace(n, healthy=False)
        elif k % 89 == 0:
            n = replace(n, cordoned=True)
        nodes.append(n)
    return replace(s, teams=tuple(teams), running=tuple(running), pending=tuple(pending), nodes=tuple(nodes))


def _multi_pass(s: Snapshot, passes: int = 3) -> list[Decisions]:
    """Broker-like: admissions start running, victims go back to pending, time moves on."""
    requests = {j.id: j for j in s.pending}
    pending = dict(requests)
    running = {r.id: r for r in s.running}
    out = []
    now = s.now
    for _ in range(passes):
        d = schedule(replace(s, now=now, pending=tuple(pending.values()), running=tuple(running.values())))
        out.append(d)
        for a in d.admissions:
            j = pending.pop(a.job_id)
            running[j.id] = RunningJob(id=j.id, team=j.team, priority=j.priority, allocations=a.assignments,
                                       accelerator=j.accelerator, started_time=now, last_checkpoint_time=now)
        for p in d.preemptions:
            r = running.pop(p.job_id)
            if r.id in requests:
                pending[r.id] = requests[r.id]
        now += 60
    return out


def _steady_state(s: Snapshot, passes: int = 30, seed: int = 11, queue: int = 200) -> list[Decisions]:
    """The benchmark's incremental workload (1% of running jobs finish and 25 jobs
    arrive per pass; admissions run, victims keep running): long enough for many
    preemption searches, hopeless ones included, to shape later passes."""
    b = _bench()
    rng = random.Random(seed)
    teams = sorted({t.team for t in s.teams}) or ["team-0"]
    running, pending, nxt, out = list(s.running), list(s.pending[:queue]), 10_000_000, []
    for _ in range(passes):
        rng.shuffle(running)
        running = running[max(1, len(running) // 100):]
        pending += [b.synth_job(nxt + k, rng, teams) for k in range(25)]
        nxt += 25
        d = schedule(replace(s, running=tuple(running), pending=tuple(pending)))
        out.append(d)
        by_id = {j.id: j for j in pending}
        for a in d.admissions:
            j = by_id[a.job_id]
            running.append(RunningJob(id=j.id, team=j.team, priority=j.priority, allocations=a.assignments,
                                      started_time=s.now, last_checkpoint_time=s.now))
        done = {a.job_id for a in d.admissions}
        pending = [j for j in pending if j.id not in done]
    return out


def scenarios() -> dict[str, list[Decisions]]:
    b = _bench()
    s7 = b.make_snapshot(0.25, 1250, seed=7)
    s8 = b.make_snapshot(0.25, 1250, seed=8)
    s9 = b.make_snapshot(0.25, 1250, seed=9)
    crowded7 = b.make_snapshot(0.25, 5000, seed=7)
    crowded8 = b.make_snapshot(0.25, 5000, seed=8)
    return {
        "seed7_quotas": [schedule(s7)],
        "seed8_quotas": [schedule(s8)],
        "seed8_variant": [schedule(_variant(s8))],
        "seed9_no_quotas_draining": [schedule(replace(s9, teams=(), draining_regions=frozenset({"eu-west-1"})))],
        "seed7_multipass": _multi_pass(s7),
        "seed9_variant_multipass": _multi_pass(_variant(s9)),
        "seed7_steady_state": _steady_state(s7),
        "seed9_variant_steady_state": _steady_state(_variant(s9)),
        # Crowded: four times the queue on the same cluster, so thousands of jobs find
        # no capacity after the preemption searches are spent (the engine's no-room
        # memo) and victim searches meet full blocks (the fewest-victims bound).
        # Recorded with the engine before that work (issue 16 section 3).
        "seed7_crowded": [schedule(crowded7)],
        "seed8_crowded_variant": [schedule(_variant(crowded8))],
        "seed7_crowded_steady_state": _steady_state(crowded7, passes=8, queue=3000),
    }


def as_json(d: Decisions) -> dict:
    """Every field of every decision, in the engine's own order (order is part of the output)."""
    return {
        "admissions": [[a.job_id, a.agent_id, a.region, [list(x) for x in a.assignments], int(a.capacity_type),
                        a.pool, a.price_per_gpu_hour, a.explanation] for a in d.admissions],
        "preemptions": [[p.job_id, p.for_job_id, p.reason, p.work_lost_gpu_s, p.message] for p in d.preemptions],
        "pending_reasons": [[k, v] for k, v in d.pending_reasons.items()],
        "reservations": [[r.job_id, r.agent_id, r.region, r.pool, r.start_time, [list(x) for x in r.assignments],
                          r.explanation] for r in d.reservations],
    }


def digest(ds: list[Decisions]) -> dict:
    out: dict = {}
    for part in ("admissions", "preemptions", "pending_reasons", "reservations"):
        items = [as_json(d)[part] for d in ds]
        blob = json.dumps(items, sort_keys=True, separators=(",", ":")).encode()
        out[part] = {"count": [len(x) for x in items], "sha256": hashlib.sha256(blob).hexdigest()}
    return out


def _check_no_quota_sanity(name: str, ds: list[Decisions]) -> None:
    # Not vacuous: the scenarios admit, preempt and explain.
    assert any(d.admissions for d in ds), name
    assert all(d.pending_reasons for d in ds), name


@pytest.fixture(scope="module")
def results() -> dict[str, list[Decisions]]:
    return scenarios()


def test_scenarios_exercise_the_engine(results):
    for name, ds in results.items():
        _check_no_quota_sanity(name, ds)
    assert sum(len(d.preemptions) for ds in results.values() for d in ds) > 0
    assert sum(len(d.reservations) for ds in results.values() for d in ds) > 0


def test_decisions_match_golden(results, tmp_path):
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) == set(results)
    diffs = []
    for name, ds in results.items():
        got = digest(ds)
        for part, want in golden[name].items():
            if got[part] != want:
                diffs.append(f"{name}.{part}: got {got[part]}, golden {want}")
        if any(got[p] != golden[name][p] for p in got):
            (tmp_path / f"{name}.json").write_text(json.dumps([as_json(d) for d in ds], indent=1))
    assert not diffs, "decisions changed (current decisions in " + str(tmp_path) + "):\n" + "\n".join(diffs)


def _regen() -> None:
    res = scenarios()
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps({k: digest(v) for k, v in res.items()}, indent=2, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    if "--dump" in sys.argv:
        out = Path(sys.argv[sys.argv.index("--dump") + 1])
        out.write_text(json.dumps({k: [as_json(d) for d in v] for k, v in scenarios().items()}, indent=1))
    elif "--regen" in sys.argv:
        _regen()
    else:
        print(__doc__)
