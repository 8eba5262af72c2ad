"""Text for ``brokerctl logs`` (rank output) and ``brokerctl events`` (history lines).

Why plain lines and not tables: both are streams people read and grep, follow live
(``-f``) and paste into tickets, SkyPilot-style: one line per record, readable at
100 columns, the rank as a ``(rank N)`` prefix only when several ranks speak.
"""

from __future__ import annotations

from rich.text import Text

from brokerctl.render import event_row, full_values, when
from computebroker.v1 import common_pb2, logs_pb2


def attempt_separator(h: logs_pb2.LogAttemptHeader) -> Text:
    """``── attempt 2 · eu-west-1 · 1 rank · started 12:03:04 ──``"""
    parts = [f"attempt {h.attempt}"]
    if h.region:
        parts.append(h.region)
    if h.ranks:  # the ranks that ran; the GPUs placed only when the agent did not say
        parts.append(f"{h.ranks} rank{'' if h.ranks == 1 else 's'}")
    elif h.world_size:
        parts.append(f"world {h.world_size}")
    if h.start_time:
        parts.append(f"started {when(h.start_time)}")
    return Text(f"── {' · '.join(parts)} ──", style="bold cyan")


def log_line(line: logs_pb2.LogLine, with_rank: bool) -> Text:
    text = Text()
    if with_rank:
        text.append(f"(rank {line.rank}) ", style="dim")
    text.append(line.text, style="red" if line.text.startswith("… ") else "")
    return text


def dropped(n: int) -> Text:
    return Text(f"… {n} older lines dropped (the broker keeps the newest per attempt)",
                style="yellow")


MAX_TOKEN = 44


def shorten_tokens(msg: str, max_token: int = MAX_TOKEN) -> str:
    """Ellipsize the middle of long tokens (checkpoint paths, URIs) so a line wraps only
    between words at 100 columns, never inside a path: ``/tmp/…/attempt-1/step-000000010``.
    In a pipe (full_values) tokens stay whole: a log must hold the real path."""
    if full_values():
        return msg
    out = []
    for tok in msg.split(" "):
        if len(tok) > max_token:
            keep = max_token - 1
            tok = tok[: keep // 3] + "…" + tok[-(keep - keep // 3):]
        out.append(tok)
    return " ".join(out)


def event_line(event: common_pb2.JobEvent) -> Text:
    """One history event: local time, type, phase change, region, step, message.
    Print it without ``soft_wrap``: rich then wraps between words (long tokens are
    shortened first), never mid-token."""
    row = event_row(event)
    line = Text()
    line.append(f"{row[1]} ", style="dim")
    line.append(f"{event.type or '-':<12} ", style="bold")
    if isinstance(row[3], Text):
        line.append_text(row[3])
    if event.attempt:
        line.append(f"  #{event.attempt}", style="dim")
    if event.region:
        line.append(f"  {event.region}", style="cyan")
    if event.type == "progress" and event.details:
        d = event.details
        line.append(f"  step {d.get('step', '?')}/{d.get('total_steps', '?')}")
        if d.get("loss"):
            line.append(f" loss {d['loss']}")
    msg = row[6]
    if msg:
        line.append(f"  {shorten_tokens(str(msg))}")
    return line
