"""Per-team usage over time: queue depth, admissions, GPUs held, spend rate.

Why the broker keeps its own series (and not only Prometheus): the console and
``brokerctl usage`` must draw "the last hour / 6 h / 24 h" with nothing else deployed,
and the answer must respect tenancy (a member sees their team's lines), which the API
enforces and a scrape endpoint does not.

Why this shape:

* **Bounded and cheap.** Three tiers of fixed-width buckets (:data:`TIERS`: 10 s for an
  hour, 1 min for 6 h, 5 min for 24 h): at most 360 buckets each, whatever the load.
  Every sample adds to one bucket per tier (O(teams)); old buckets fall off the end.
  A window is served from the finest tier that covers it, so a 24 h chart is 288
  points, not 8,640 (downsampling is done once, as samples arrive).
* **Sampled from the scheduler pass** (broker/scheduling/loop.py), from the snapshot it
  already built: at most once per ``sample_s`` (passes can run many times a second in a
  submit storm; a sample walks the snapshot's pending and running entries once).
  Admissions are counted as the pass launches them, so none is missed between samples.
* **Gauges are means over a bucket**: a bucket keeps the number of samples and each
  team's sums; a team absent from a sample counted 0 in it. A bucket with no sample is
  absent (the broker was down), which a chart shows as a gap rather than as zero.
* **Survives a restart**: the leader saves the tiers to the state store (one record,
  ``usage-series``) every ``save_s`` and when it stops; a restarted broker, or a
  standby that takes over, loads them. What is lost is at most the last ``save_s``.
  It is a store record, not a log: one overwrite per minute, bounded by the tiers
  (~770 KB for 20 teams active all day: benchmarks/bench_usage_series.py), so the
  store's size does not grow with time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import placement
from broker.jobs.standby import SUFFIX as STANDBY_SUFFIX
from brokersdk.usage import MAX_WINDOW_S
from computebroker.v1 import capacity_pb2 as cpb

SERIES_KEY = "fleet"  # the store record's key (kind KIND_USAGE_SERIES)
DEFAULT_WINDOW_S = 3600.0


@dataclass(frozen=True)
class Tier:
    """Buckets of ``step_s`` seconds, ``span_s`` of them kept."""

    step_s: float
    span_s: float

    @property
    def buckets(self) -> int:
        return int(self.span_s // self.step_s)


# Finest first: a window is served from the first tier whose span covers it.
TIERS = (Tier(10.0, 3600.0), Tier(60.0, 6 * 3600.0), Tier(300.0, MAX_WINDOW_S))


@dataclass
class TeamSums:
    pending: float = 0.0
    gpus: float = 0.0
    spend: float = 0.0
    admissions: float = 0.0


@dataclass
class Bucket:
    samples: int = 0
    teams: dict[str, TeamSums] = field(default_factory=dict)

    def team(self, name: str) -> TeamSums:
        t = self.teams.get(name)
        if t is None:
            t = self.teams[name] = TeamSums()
        return t


@dataclass(frozen=True)
class TeamSample:
    """One team's state at one instant."""

    pending: int = 0
    gpus: int = 0
    spend_per_hour: float = 0.0


def sample_snapshot(snapshot: placement.Snapshot) -> dict[str, TeamSample]:
    """Per team: queued jobs, GPUs held and their spend rate ($/h: GPUs x their node's
    price per GPU-hour), from the snapshot the pass already built. Why the snapshot and
    not the live jobs: its entries are plain Python objects (reading protobuf fields of
    every live job cost ~4x more: benchmarks/bench_usage_series.py). A standby that
    holds a move's destination counts (those GPUs are held); its request does not queue."""
    price = {n.id: n.price_per_gpu_hour for n in snapshot.nodes}
    pending: dict[str, int] = {}
    gpus: dict[str, int] = {}
    spend: dict[str, float] = {}
    for r in snapshot.pending:
        if not r.id.endswith(STANDBY_SUFFIX):
            pending[r.team] = pending.get(r.team, 0) + 1
    for run in snapshot.running:
        g = 0
        usd = 0.0
        for node, n in run.allocations:
            g += n
            usd += n * price.get(node, 0.0)
        gpus[run.team] = gpus.get(run.team, 0) + g
        spend[run.team] = spend.get(run.team, 0.0) + usd
    return {t: TeamSample(pending.get(t, 0), gpus.get(t, 0), spend.get(t, 0.0))
            for t in {*pending, *gpus}}


class UsageSeries:
    """The tiers, thread-safe: the scheduler thread writes, API threads read."""

    def __init__(self, sample_s: float = 5.0, tiers: tuple[Tier, ...] = TIERS) -> None:
        self.sample_s = sample_s
        self.tiers = tiers
        self._data: list[OrderedDict[float, Bucket]] = [OrderedDict() for _ in tiers]
        self._lock = threading.Lock()
        self._last_sample = float("-inf")
        self._latest: dict[str, TeamSample] = {}  # the newest sample, for "now" values
        self._latest_time = 0.0
        self.dirty = False  # changed since the last save

    # ---- writing (the scheduler pass) ------------------------------------------------
    def due(self, now: float) -> bool:
        """Whether a pass at ``now`` should sample (at most one per ``sample_s``)."""
        return now - self._last_sample >= self.sample_s

    def sample(self, now: float, teams: dict[str, TeamSample]) -> None:
        """Add one sample (every team's state at ``now``) to each tier."""
        self._last_sample = now
        with self._lock:
            self._latest, self._latest_time = dict(teams), now
            for tier, data in zip(self.tiers, self._data, strict=True):
                b = self._bucket(tier, data, now)
                b.samples += 1
                for name, s in teams.items():
                    t = b.team(name)
                    t.pending += s.pending
                    t.gpus += s.gpus
                    t.spend += s.spend_per_hour
            self.dirty = True

    def admitted(self, team: str, now: float, n: int = 1) -> None:
        """``n`` jobs of ``team`` were launched by the pass at ``now``."""
        with self._lock:
            for tier, data in zip(self.tiers, self._data, strict=True):
                self._bucket(tier, data, now).team(team).admissions += n
            self.dirty = True

    @staticmethod
    def _bucket(tier: Tier, data: OrderedDict[float, Bucket], now: float) -> Bucket:
        start = (now // tier.step_s) * tier.step_s
        b = data.get(start)
        if b is None:
            b = data[start] = Bucket()
            oldest = start - tier.span_s
            while data and next(iter(data)) <= oldest:
                data.popitem(last=False)
        return b

    # ---- reading (GetUsageSeries) ----------------------------------------------------
    def query(self, now: float, window_s: float, teams: set[str] | None = None) -> cpb.UsageSeries:
        """The buckets of the last ``window_s`` seconds from the finest tier that covers
        it; ``teams``: only these teams' lines (None: all). A team with no value in the
        window has no line."""
        window_s = min(max(window_s or DEFAULT_WINDOW_S, self.tiers[0].step_s), MAX_WINDOW_S)
        i = next((k for k, t in enumerate(self.tiers) if t.span_s >= window_s),
                 len(self.tiers) - 1)
        tier = self.tiers[i]
        start = now - window_s
        out = cpb.UsageSeries(step_s=tier.step_s, start_time=start, end_time=now,
                              sample_interval_s=self.sample_s, latest_time=self._latest_time)
        with self._lock:
            rows = [(t, b) for t, b in self._data[i].items()
                    if t + tier.step_s > start and t <= now and (b.samples or b.teams)]
            names = sorted({n for _, b in rows for n in b.teams
                            if teams is None or n in teams})
            lines = {n: out.teams.add(team=n) for n in names}
            for n, line in lines.items():
                latest = self._latest.get(n) or TeamSample()
                line.now_pending_jobs = latest.pending
                line.now_gpus_used = latest.gpus
                line.now_spend_usd_per_hour = latest.spend_per_hour
            for t, b in rows:
                out.times.append(t)
                per = max(b.samples, 1)
                for n, line in lines.items():
                    s = b.teams.get(n) or TeamSums()
                    line.pending_jobs.append(s.pending / per)
                    line.gpus_used.append(s.gpus / per)
                    line.spend_usd_per_hour.append(s.spend / per)
                    line.admissions.append(s.admissions)
        return out

    # ---- persistence (the state store) -----------------------------------------------
    def to_state(self, now: float) -> cpb.UsageSeriesState:
        state = cpb.UsageSeriesState(saved_time=now)
        with self._lock:
            for tier, data in zip(self.tiers, self._data, strict=True):
                st = state.tiers.add(step_s=tier.step_s)
                for t, b in data.items():
                    sb = st.buckets.add(time=t, samples=b.samples)
                    for name, s in b.teams.items():
                        sb.teams.add(team=name, pending_sum=s.pending, gpus_sum=s.gpus,
                                     spend_sum=s.spend, admissions=s.admissions)
            self.dirty = False
        return state

    def load(self, state: cpb.UsageSeriesState, now: float) -> None:
        """Continue from a saved state: tiers matched by step; buckets older than their
        span (the broker was down longer) are dropped; buckets already sampled here
        (this broker ran meanwhile) are kept as they are."""
        by_step = {st.step_s: st for st in state.tiers}
        with self._lock:
            for tier, data in zip(self.tiers, self._data, strict=True):
                st = by_step.get(tier.step_s)
                if st is None:
                    continue
                merged: dict[float, Bucket] = {}
                for sb in st.buckets:
                    if sb.time <= now - tier.span_s or sb.time > now:
                        continue
                    merged[sb.time] = Bucket(sb.samples, {
                        x.team: TeamSums(x.pending_sum, x.gpus_sum, x.spend_sum, x.admissions)
                        for x in sb.teams})
                merged.update(data)
                data.clear()
                data.update(sorted(merged.items()))
