"""How a job running below its requested size is described to people.

Why one function in the SDK: `brokerctl job`/`jobs` and the web console say the same
thing about the same record (``Job.shrunk``: broker/jobs/below_size.py), and both
import the SDK, not the broker.
"""

from __future__ import annotations

import time

from computebroker.v1 import common_pb2

# Shrunk.route values (broker/jobs/recovery.py SizeRoute); "" is a shrink in place.
_SHRINK = ("", "shrink_in_place")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def below_size_text(job: common_pb2.Job) -> str:
    """``running at 2 of 4 ranks since 21:50:03 UTC (why it is small); why it has not
    grown back yet`` ("" when the job has no such record). Ranks when its agent reported
    them (ranks per node times the requested nodes), nodes otherwise."""
    rec = job.shrunk
    if not rec.requested_nodes:
        return ""
    pl = job.placement
    if len(pl.nodes) >= rec.requested_nodes:
        return ""  # placed at its full size again (the record closes when it runs)
    running = len(pl.nodes) or rec.running_nodes
    if pl.ranks > 0 and running:
        per_node = max(1, pl.ranks // running)
        size = f"{pl.ranks} of {rec.requested_nodes * per_node} ranks"
    else:
        size = f"{rec.running_nodes} of {rec.requested_nodes} nodes"
    if rec.route in _SHRINK:
        how = f"shrunk in place after losing {', '.join(rec.lost_nodes) or 'a node'}"
    else:
        how = rec.why or rec.route.replace("_", " ")
    text = f"running at {size} since {_clock(rec.since)} ({how})"
    return text + (f"; {rec.waiting}" if rec.waiting else "")
