"""``brokerctl usage --over 6h``: per team, the queue, admissions, GPUs and spend over a
window, with a one-line trend of GPUs held (like ``top``'s history, in a terminal).

The numbers are the broker's kept series (GetUsageSeries), summed by
:mod:`brokersdk.usage` exactly as the console's charts page sums them.
"""

from __future__ import annotations

from rich.table import Table

from brokerctl import render
from brokersdk.usage import TeamTotals
from computebroker.v1 import capacity_pb2

SPARKS = "▁▂▃▄▅▆▇█"
TREND_WIDTH = 24  # characters: fits 80 columns with the numbers


def sparkline(values: list[float], width: int = TREND_WIDTH) -> str:
    """``values`` (oldest first) as block characters scaled to their own peak, the whole
    window in at most ``width`` characters (a character is the mean of its share of
    buckets)."""
    n = len(values)
    if n > width:
        values = [sum(values[n * k // width:n * (k + 1) // width])
                  / max(1, n * (k + 1) // width - n * k // width) for k in range(width)]
    top = max(values, default=0.0)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))]
                   for v in values)


def table(series: capacity_pb2.UsageSeries, rows: list[TeamTotals], trend: bool = True) -> Table:
    cols: list[tuple[str, dict]] = [
        ("TEAM", {"flex": True}), ("QUEUED", {"justify": "right"}),
        ("ADMITTED", {"justify": "right"}), ("GPUS", {"justify": "right"}),
        ("SPEND", {"justify": "right"})]
    if trend:
        cols.append(("GPUS TREND", {"no_wrap": True}))
    t = render._table(*cols)
    lines = {line.team: line for line in series.teams}
    for r in rows:
        cells = [r.team, f"{r.pending_now} (peak {r.pending_peak:.0f})", str(r.admissions),
                 f"{r.gpus_now} (avg {r.gpus_mean:.1f})",
                 f"${r.spend_now:,.2f}/h · ${r.spend_usd:,.2f}"]
        if trend:
            cells.append(sparkline(list(lines[r.team].gpus_used)))
        t.add_row(*cells)
    return t
