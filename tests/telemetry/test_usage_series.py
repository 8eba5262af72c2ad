"""The usage series as data (broker/telemetry/series.py): bounded tiers, means per
bucket, gaps where nothing was sampled, the finest tier that covers a window, and a
saved state that continues where it stopped."""

from __future__ import annotations

import pytest

import placement
from broker.jobs.standby import SUFFIX as STANDBY_SUFFIX
from broker.telemetry.series import TIERS, TeamSample, UsageSeries, sample_snapshot

T0 = 1_800_000_000.0  # a multiple of 300: bucket edges line up in every tier


def _node(node_id: str, gpus: int, price: float) -> placement.NodeInfo:
    return placement.NodeInfo(id=node_id, agent_id="a", region="r", zone="z", gpus=gpus,
                              price_per_gpu_hour=price)


def _request(job_id: str, team: str) -> placement.JobRequest:
    return placement.JobRequest(id=job_id, team=team, priority=0, nodes=1, gpus_per_node=1)


def _running(job_id: str, team: str, *allocations: tuple[str, int]) -> placement.RunningJob:
    return placement.RunningJob(id=job_id, team=team, priority=0, allocations=allocations)


def test_a_sample_counts_queued_jobs_gpus_held_and_their_spend_rate() -> None:
    snapshot = placement.Snapshot(
        now=T0, nodes=(_node("n1", 8, 2.0), _node("n2", 8, 1.0), _node("n3", 8, 3.0)),
        pending=(_request("a", "ml"), _request("b", "ml"),
                 _request("c" + STANDBY_SUFFIX, "cv")),  # a move's standby: not queued
        running=(_running("d", "ml", ("n1", 8)), _running("e", "ml", ("n2", 2), ("n3", 2)),
                 _running("c" + STANDBY_SUFFIX, "cv", ("n3", 2))))  # held: counts
    assert sample_snapshot(snapshot) == {
        "ml": TeamSample(pending=2, gpus=12, spend_per_hour=16 + 2 + 6),
        "cv": TeamSample(pending=0, gpus=2, spend_per_hour=6.0)}


def test_bucket_values_are_means_and_admissions_are_counts() -> None:
    s = UsageSeries(sample_s=1.0)
    s.sample(T0 + 1, {"ml": TeamSample(4, 8, 16.0)})
    s.sample(T0 + 3, {})  # ml had nothing queued or running at that instant
    s.admitted("ml", T0 + 4)
    s.admitted("ml", T0 + 5, 2)
    s.sample(T0 + 12, {"ml": TeamSample(1, 2, 4.0)})
    out = s.query(T0 + 15, 60)
    assert out.step_s == 10 and list(out.times) == [T0, T0 + 10]
    (ml,) = out.teams
    assert list(ml.pending_jobs) == [2.0, 1.0] and list(ml.gpus_used) == [4.0, 2.0]
    assert list(ml.spend_usd_per_hour) == [8.0, 4.0] and list(ml.admissions) == [3.0, 0.0]
    assert (ml.now_pending_jobs, ml.now_gpus_used, ml.now_spend_usd_per_hour) == (1, 2, 4.0)
    assert out.latest_time == T0 + 12


def test_a_time_without_samples_is_a_gap_not_a_zero() -> None:
    s = UsageSeries()
    s.sample(T0, {"ml": TeamSample(1, 1, 1.0)})
    s.sample(T0 + 120, {"ml": TeamSample(1, 1, 1.0)})  # the broker was down in between
    out = s.query(T0 + 125, 3600)
    assert list(out.times) == [T0, T0 + 120]


def test_a_window_is_served_from_the_finest_tier_that_covers_it() -> None:
    s = UsageSeries()
    for k in range(0, 7200, 10):
        s.sample(T0 + k, {"ml": TeamSample(1, 2, 3.0)})
    now = T0 + 7200
    assert [s.query(now, w).step_s for w in (600, 3600, 3601, 6 * 3600, 7 * 3600, 0)] == \
        [10, 10, 60, 60, 300, 10]
    hour = s.query(now, 3600)
    assert len(hour.times) == 360 and all(t > now - 3600 - 10 for t in hour.times)
    two_h = s.query(now, 7200)
    assert len(two_h.times) == 120 and two_h.teams[0].gpus_used[0] == 2.0


def test_tiers_stay_bounded_however_long_it_runs() -> None:
    s = UsageSeries()
    for k in range(0, 3 * 24 * 3600, 10):  # three days, a sample every 10 s
        s.sample(T0 + k, {f"team{k % 5}": TeamSample(1, 1, 1.0)})
    sizes = [len(d) for d in s._data]
    assert sizes == [t.buckets for t in TIERS] == [360, 360, 288]


def test_only_the_teams_asked_for_get_lines() -> None:
    s = UsageSeries()
    s.sample(T0, {"ml": TeamSample(1, 0, 0.0), "cv": TeamSample(0, 8, 8.0)})
    assert [t.team for t in s.query(T0 + 1, 600).teams] == ["cv", "ml"]
    assert [t.team for t in s.query(T0 + 1, 600, {"ml"}).teams] == ["ml"]
    assert [t.team for t in s.query(T0 + 1, 600, {"nobody"}).teams] == []


def test_a_saved_state_continues_after_a_restart_and_drops_what_aged_out() -> None:
    old = UsageSeries()
    old.sample(T0, {"ml": TeamSample(2, 4, 8.0)})
    old.admitted("ml", T0 + 1)
    state = old.to_state(T0 + 5)
    assert not old.dirty
    new = UsageSeries()
    new.sample(T0 + 2 * 3600, {"ml": TeamSample(0, 1, 1.0)})  # sampled before the load
    new.load(state, T0 + 2 * 3600)
    day = new.query(T0 + 2 * 3600, 24 * 3600)
    assert list(day.times) == [T0, T0 + 2 * 3600]
    assert list(day.teams[0].admissions) == [1.0, 0.0]
    # Two hours later the 10 s tier no longer holds the old bucket; the 1 min tier does.
    assert list(new.query(T0 + 2 * 3600, 3600).times) == [T0 + 2 * 3600]
    assert T0 in new.query(T0 + 2 * 3600, 6 * 3600).times


@pytest.mark.parametrize("window", [1.0, 10.0])
def test_a_tiny_window_still_has_its_bucket(window: float) -> None:
    s = UsageSeries()
    s.sample(T0 + 5, {"ml": TeamSample(1, 0, 0.0)})
    assert list(s.query(T0 + 6, window).times) == [T0]
