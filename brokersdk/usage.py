"""What a usage series (``BrokerClient.usage_series``) adds up to over its window.

Why in the SDK: ``brokerctl usage`` and the console's charts page both print these
totals next to the lines; one definition keeps them equal (the spend over a window in
particular: the integral of the spend rate over the buckets that hold samples).
"""

from __future__ import annotations

from dataclasses import dataclass

from computebroker.v1 import capacity_pb2

MAX_WINDOW_S = 24 * 3600.0
"""The longest window the broker keeps (its coarsest tier, broker/telemetry/series.py):
here so a client refuses a longer one instead of printing a title the data does not fill."""


@dataclass(frozen=True)
class TeamTotals:
    team: str
    pending_now: int
    pending_peak: float
    admissions: int
    gpus_now: int
    gpus_mean: float
    gpus_peak: float
    spend_now: float  # $ per hour
    spend_usd: float  # $ over the window


def bucket_seconds(series: capacity_pb2.UsageSeries) -> list[float]:
    """How long each bucket covers inside the window: a whole step, less for the first
    (it may start before the window) and the newest (still filling)."""
    out = []
    for t in series.times:
        start = max(t, series.start_time)
        end = min(t + series.step_s, series.end_time)
        out.append(max(0.0, end - start))
    return out


def totals(series: capacity_pb2.UsageSeries) -> list[TeamTotals]:
    """Per team line: now, peak, mean and window totals (spend as the integral of its
    rate; a gap, when the broker was down, counts nothing)."""
    secs = bucket_seconds(series)
    covered = sum(secs) or 1.0
    out = []
    for line in series.teams:
        gpus = list(line.gpus_used)
        out.append(TeamTotals(
            team=line.team, pending_now=line.now_pending_jobs,
            pending_peak=max(line.pending_jobs, default=0.0),
            admissions=round(sum(line.admissions)), gpus_now=line.now_gpus_used,
            gpus_mean=sum(g * s for g, s in zip(gpus, secs, strict=True)) / covered,
            gpus_peak=max(gpus, default=0.0), spend_now=line.now_spend_usd_per_hour,
            spend_usd=sum(r * s / 3600.0 for r, s in zip(line.spend_usd_per_hour, secs,
                                                          strict=True))))
    return out
