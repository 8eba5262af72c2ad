"""A job's bounded loss curve: the (step, loss) of every reported step, kept in the job.

Why in the job record: "progress" events are written every ``progress_event_every_steps``
(default 50) and progress writes are throttled, so a curve drawn from them has a handful
of points. The broker buffers each reported step between writes (JobOps) and appends them
here. Why bounded by thinning, not by dropping the oldest: a long job's curve must keep its
start; halving the density of the older half keeps the shape and the newest detail.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, MutableSequence

from computebroker.v1 import common_pb2 as pb

MAX_POINTS = 512  # ~8 KB in the job record at most


def record(series: MutableSequence[pb.LossPoint], points: Iterable[tuple[int, float]],
           cap: int = MAX_POINTS) -> None:
    """Append ``points`` (step, loss) in report order. A step at or before the last one
    (an attempt resumed from an earlier checkpoint) replaces the points it re-runs, so the
    curve is the training that counts. A loss of 0 or not finite means "no loss reported"."""
    for step, loss in points:
        if loss <= 0 or not math.isfinite(loss) or step <= 0:
            continue
        while series and series[-1].step >= step:
            del series[-1]
        series.add(step=step, loss=loss)
    if len(series) > cap:
        thin(series, cap)


def thin(series: MutableSequence[pb.LossPoint], cap: int) -> None:
    """Drop every other point of the older half until at most ``cap`` remain (the first
    and the newest half are kept)."""
    while len(series) > cap:
        n = len(series)
        keep_from = n - cap // 2
        kept = [p for i, p in enumerate(series) if i >= keep_from or i % 2 == 0]
        if len(kept) == n:  # cap < 2: nothing more to halve
            kept = kept[-cap:]
        copies = [pb.LossPoint(step=p.step, loss=p.loss) for p in kept]
        del series[:]
        series.extend(copies)
