"""The campaign's fault schedule with store outages spread over their whole range.

A claim about outages "of 10-120 s" needs a run that had a 10 s one and a 120 s one;
seeded uniform draws did not give that (seed 42: 14-89 s). ``spread`` must reach both
ends and change nothing else about the seed's schedule.
"""

from __future__ import annotations

from tests.fixtures.chaos.faults import DURATION_S, STORE_OUTAGES, FaultKind, schedule

KINDS = [FaultKind.S3_REFUSED, FaultKind.S3_REFUSED_RESUME, FaultKind.RANK_SIGKILL]


def test_spread_outages_reach_both_ends_evenly() -> None:
    faults = schedule(42, 12, KINDS, spread=STORE_OUTAGES)
    outages = sorted(f.duration_s for f in faults if f.kind in STORE_OUTAGES)
    lo, hi = DURATION_S[FaultKind.S3_REFUSED]
    assert len(outages) >= 2
    assert outages[0] == lo and outages[-1] == hi, outages
    steps = {round(b - a, 1) for a, b in zip(outages, outages[1:], strict=False)}
    assert max(steps) - min(steps) <= 0.2, outages  # evenly spaced (rounded to 0.1 s)


def test_spread_changes_only_outage_durations() -> None:
    plain = schedule(42, 12, KINDS)
    spread = schedule(42, 12, KINDS, spread=STORE_OUTAGES)
    assert [(f.kind, f.target, f.gap_s) for f in plain] == [(f.kind, f.target, f.gap_s) for f in spread]
    assert [f.duration_s for f in plain if f.kind not in STORE_OUTAGES] == \
        [f.duration_s for f in spread if f.kind not in STORE_OUTAGES]
    assert schedule(42, 12, KINDS, spread=STORE_OUTAGES) == spread  # seeded: the same twice
