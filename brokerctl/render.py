"""Rich renderings of API objects for `brokerctl` (tables, detail panels).

Why a module of its own: the CLI's commands stay a few lines each, and every
table is built in one place with the same rules: headers never wrap or get cut
(each column's ``min_width`` is its header), long free text is ellipsized, and
every table fits a 100-column terminal. Over 400 lines on purpose: one builder per API
object, all under those shared rules (split by object, the rules would scatter).
"""

from __future__ import annotations

import shlex
import time
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from brokersdk.client import (
    capacity_type_name,
    phase_name,
    plan_state_name,
    strategy_name,
    topology_name,
)
from brokersdk.size import below_size_text
from computebroker.v1 import capacity_pb2, common_pb2

PHASE_STYLE = {
    "pending": "yellow",
    "admitted": "cyan",
    "launching": "cyan",
    "running": "green",
    "checkpointing": "magenta",
    "suspended": "yellow",
    "migrating": "magenta",
    "succeeded": "bold green",
    "failed": "bold red",
    "cancelled": "dim",
}


KEEP_CONTROLS = {"\n", "\t"}


def escape_controls(text: str) -> str:
    """``text`` with every control/format character (ESC, CR, BEL, bidi overrides,
    zero-width chars) shown as a visible ``\\xHH``/``\\uHHHH`` escape, newlines and tabs
    kept. Why: job names, messages, labels and rank output come from users and agents;
    printed raw, an ANSI or OSC sequence in them would rewrite the operator's terminal
    (issue 12)."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in KEEP_CONTROLS or unicodedata.category(ch)[0] != "C":
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
    return "".join(out)


def scrub(value: Any) -> Any:
    """A copy of an API message (or a list of them, or a str) with :func:`escape_controls`
    applied to every string in it: what every human-readable rendering prints."""
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    if not isinstance(value, Message):
        return value
    copy = type(value)()
    copy.CopyFrom(value)
    _scrub_in_place(copy)
    return copy


def _scrub_in_place(msg: Message) -> None:
    for fd, val in msg.ListFields():
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            items = dict(val)
            val.clear()
            for k, v in items.items():
                key = escape_controls(k) if isinstance(k, str) else k
                if isinstance(v, Message):
                    _scrub_in_place(v)
                    val[key].CopyFrom(v)
                else:
                    val[key] = escape_controls(v) if isinstance(v, str) else v
        elif fd.type == FieldDescriptor.TYPE_STRING:
            if fd.is_repeated:
                val[:] = [escape_controls(v) for v in val]
            else:
                setattr(msg, fd.name, escape_controls(val))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            for m in (val if fd.is_repeated else [val]):
                _scrub_in_place(m)


_FULL_VALUES: ContextVar[bool] = ContextVar("full_values", default=False)


def full_values() -> bool:
    """True when output goes to a pipe or a file: no value may be cut there (a log or a
    ``grep`` must see the whole job name, region and reason), so cells wrap instead."""
    return _FULL_VALUES.get()


@contextmanager
def full_values_mode(on: bool = True) -> Iterator[None]:
    """Render with (or without) :func:`full_values` inside the block."""
    token = _FULL_VALUES.set(on)
    try:
        yield
    finally:
        _FULL_VALUES.reset(token)


def set_full_values(on: bool) -> None:
    """Per invocation: ``brokerctl.common.consoles`` sets it from ``isatty``."""
    _FULL_VALUES.set(on)


def _table(*columns: str | tuple[str, dict], title: str | None = None) -> Table:
    """A compact table whose headers never wrap (min_width = header length).

    Column options are rich's, plus ``flex=True`` for free-text columns that may
    be shortened (with an ellipsis) to fit on a terminal; the others never shrink.
    In a pipe (:func:`full_values`) every cell wraps (``fold``) and none is cut.
    """
    table = Table(box=box.SIMPLE_HEAD, title=title, pad_edge=False, expand=False,
                  show_edge=False, padding=(0, 1, 0, 0))
    for col in columns:
        name, opts = (col, {}) if isinstance(col, str) else col
        opts = dict(opts)
        # "flex" columns (free text) give way first when the terminal is narrow;
        # the others keep their natural width.
        flex = opts.pop("flex", False)
        opts = {"no_wrap": not flex, "overflow": "ellipsis", "min_width": len(name), **opts}
        if full_values():
            opts.update(no_wrap=False, overflow="fold")
        table.add_column(name, **opts)
    return table


def phase_text(phase: int) -> Text:
    name = phase_name(phase) or "?"
    return Text(name, style=PHASE_STYLE.get(name, ""))


def age(t: float, now: float | None = None) -> str:
    """Compact age ("45s", "12m", "3h", "2d") of an epoch time; "-" when unset."""
    if not t:
        return "-"
    return duration(max(0.0, (now or time.time()) - t))


def duration(s: float) -> str:
    if s <= 0:
        return "0s"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def when(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def size_text(n: int) -> str:
    """Bytes for people: ``812 B``, ``4.2 KiB``, ``3.1 MiB``, ``1.2 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def date_time(t: float, now: float | None = None) -> str:
    """``MM-DD HH:MM`` this year, ``YYYY-MM-DD HH:MM`` in any other: a plan that ends in
    2030 must not read as this January."""
    if not t:
        return "-"
    local = time.localtime(t)
    this_year = time.localtime(time.time() if now is None else now).tm_year
    return time.strftime("%m-%d %H:%M" if local.tm_year == this_year else "%Y-%m-%d %H:%M", local)


def steps(job: common_pb2.Job) -> str:
    """``step/total``. A job running its own code (``run``) counts only what it reports:
    the trainer spec's total is the built-in trainer's default there, and a plain script
    that reports nothing would otherwise read ``0/100`` forever."""
    total = job.progress.total_steps or (0 if job.spec.command else job.spec.trainer.total_steps)
    if not total and not job.progress.step:
        return "-"
    return f"{job.progress.step}/{total}" if total else str(job.progress.step)


def shape(job: common_pb2.Job) -> str:
    r = job.spec.resources
    return f"{r.nodes}×{r.gpus_per_node}"


def job_region(job: common_pb2.Job) -> str:
    return job.placement.region or "-"


def newest_first(jobs: Iterable[common_pb2.Job], limit: int | None = None) -> list[common_pb2.Job]:
    """Newest (by creation time, then id) first; ``limit`` keeps the newest N."""
    out = sorted(jobs, key=lambda j: (j.created_time, j.id), reverse=True)
    return out[:limit] if limit is not None and limit >= 0 else out


def moves(job: common_pb2.Job) -> str:
    """``restarts/moves``: automatic relaunches after a failure / migrations."""
    return f"{job.restarts}/{len(job.migrations)}"


JOBS_COLUMNS: tuple[tuple[str, int, str], ...] = (
    # header, max width (0 = natural), justify
    ("ID", 0, "left"), ("NAME", 14, "left"), ("TEAM", 8, "left"), ("PHASE", 0, "left"),
    ("REGION", 9, "left"), ("SHAPE", 0, "right"), ("STEP", 0, "right"), ("R/M", 0, "right"),
    ("AGE", 0, "right"), ("REASON", 0, "left"),
)


def _clip(text: str, width: int) -> str:
    if full_values():
        return text
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def shrunk_text(job: common_pb2.Job) -> str:
    """That the job runs below its requested size (shrunk after a node loss, moved or
    placed elastically on fewer nodes), since when, why, and why it has not grown back
    yet ("" when it runs at full size; docs/operator/moves.md)."""
    return below_size_text(job)


def _job_reason(job: common_pb2.Job) -> str:
    if job.pending_reason:
        return job.pending_reason
    if phase_name(job.phase) == "failed":
        return job.message
    return shrunk_text(job) if phase_name(job.phase) == "running" else ""


def jobs_table(jobs: Iterable[common_pb2.Job], now: float | None = None, width: int = 100,
               with_reason: bool = True) -> Table:
    """One row per job, in the order given (``newest_first``). REASON says why a job is
    still pending (or why it failed) and gets the width the other columns leave, cut
    with an ellipsis on a terminal (``job ID`` has it whole) and wrapped in a pipe.
    Widths are computed here because rich's own shrinking squeezes the name columns to
    nothing when one cell is long. ``with_reason=False`` (a narrow terminal) leaves
    REASON out, and R/M and AGE too (``job ID`` has them); :func:`jobs_view` then prints
    each reason on a line of its own."""
    jobs = list(jobs)
    keep = [i for i, (h, _, _) in enumerate(JOBS_COLUMNS)
            if with_reason or h not in _NARROW_DROPS]
    columns = [JOBS_COLUMNS[i] for i in keep]
    rows = []
    for job in jobs:
        row = [job.id, job.spec.name or "-", job.spec.team or "-", phase_name(job.phase) or "?",
               job_region(job), shape(job), steps(job), moves(job), age(job.created_time, now),
               _job_reason(job) or "-"]
        rows.append([row[i] for i in keep])
    widths = []
    full = full_values()  # in a pipe a column is capped only by the width, never by taste
    for i, (header, cap, _) in enumerate(columns):
        natural = max([len(header), *(len(r[i]) for r in rows)])
        widths.append(min(natural, max(cap, len(header))) if cap and not full else natural)
    overhead = 2 * (len(widths) - 1) + 1
    last = len("REASON") if with_reason else widths[-1]
    over = sum(widths[:-1]) + last + overhead - width
    # NAME, TEAM, REGION give way (down to their headers), one column at a time from the
    # one with the most room to spare, so a short value keeps its whole width.
    shrink = [i for i, c in enumerate(columns) if c[0] in ("NAME", "TEAM", "REGION")]
    while over > 0:
        i = max(shrink, key=lambda k: widths[k] - len(columns[k][0]))
        if widths[i] <= len(columns[i][0]):
            break
        widths[i] -= 1
        over -= 1
    if with_reason:
        used = sum(widths[:-1]) + overhead
        widths[-1] = max(len("REASON"), min(widths[-1], width - used))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False, show_edge=False,
                  padding=(0, 1, 0, 0))
    for (header, _, justify), w in zip(columns, widths, strict=True):
        table.add_column(header, width=w, no_wrap=not full, justify=justify,  # type: ignore[arg-type]
                         overflow="fold" if full else "ellipsis")
    for r, job in zip(rows, jobs, strict=True):
        cells: list[object] = [_clip(c, w) for c, w in zip(r, widths, strict=True)]
        cells[3] = Text(cells[3], style=PHASE_STYLE.get(r[3], ""))
        if with_reason:
            cells[-1] = Text(cells[-1], style="yellow" if job.pending_reason or shrunk_text(job)
                             else "dim")
        table.add_row(*cells)
    return table


_NARROW_DROPS = ("R/M", "AGE", "REASON")


def _jobs_min_width() -> int:
    """The narrowest jobs table with REASON: IDs whole, shrinkable columns at their headers."""
    fixed = 19 + len("PHASE") + 4 + len("SHAPE") + len("STEP") + len("R/M") + len("AGE") + 4
    shrinkable = len("NAME") + len("TEAM") + len("REGION") + len("REASON")
    return fixed + shrinkable + 2 * (len(JOBS_COLUMNS) - 1) + 1


def jobs_view(jobs: Iterable[common_pb2.Job], now: float | None = None, width: int = 100) -> Group:
    """``brokerctl jobs``: the table, then each job's whole reason on a line of its own
    when the table could not hold it: cut in the REASON column on a terminal, or no
    REASON column at all when the terminal is too narrow for one (80 columns). On a
    terminal those lines are cut at the width; in a pipe they are whole (wrapped)."""
    jobs = list(jobs)
    with_reason = width >= _jobs_min_width() + 8
    parts: list[object] = [jobs_table(jobs, now, width, with_reason=with_reason)]
    if with_reason:
        # In a pipe the REASON cell already holds all of it (wrapped).
        below = [] if full_values() else [j for j in jobs if (j.pending_reason
                                          and len(j.pending_reason) > 40) or shrunk_text(j)]
    else:
        below = [j for j in jobs if _job_reason(j)]
    for j in below:
        line = Text(f"{j.id} ", style="bold")
        label = "pending" if j.pending_reason else phase_name(j.phase)
        line.append(_clip(f"{label}: {_job_reason(j)}", max(10, width - len(j.id) - 1)),
                    style="yellow" if j.pending_reason or shrunk_text(j) else "red")
        parts.append(line)
    return Group(*parts)


_CAUSE_PHRASE = {"spot": "a spot notice", "drain": "a region drain", "plan-end": "its plan's end",
                 "agent-lost": "its agent was lost", "missing": "its attempt went missing",
                 "cheaper": "cheaper capacity", "unhealthy": "an unhealthy node",
                 "refused": "a refused launch", "grow-back": "capacity for its full size returned"}


def _nodes_of(world_size: int, gpus_per_node: int) -> str:
    if not world_size:
        return "?"
    g = gpus_per_node or 1
    return f"{max(1, world_size // g)}×{g}" if world_size % g == 0 else f"world {world_size}"


def ranks_text(ranks: int) -> str:
    return f"{ranks} rank{'' if ranks == 1 else 's'}"


def _size(world_size: int, ranks: int, gpus_per_node: int) -> str:
    """An attempt's size for people: the ranks that really ran when the agent reported
    them (an elastic move's headline: 2 ranks → 1 rank), else the GPUs placed (2×8)."""
    return ranks_text(ranks) if ranks else _nodes_of(world_size, gpus_per_node)


def resumed_at(m: common_pb2.Migration) -> str:
    """The first step the new attempt ran: the one after its checkpoint (as the timeline
    and the events count), or a restart from the beginning without one."""
    return (f"resumed at step {m.checkpoint_step + 1}" if m.checkpoint_step
            else "restarted from the beginning")


def move_story(job: common_pb2.Job, m: common_pb2.Migration) -> str:
    """One move in one line: ``moved after a spot notice: us-west-2 2 ranks →
    eu-west-1 1 rank, resumed at step 20, lost 4 s`` (GPUs ``2×8`` when the agents did not
    report their ranks)."""
    g = job.spec.resources.gpus_per_node
    cause = move_cause(m)
    why = _CAUSE_PHRASE.get(cause, cause.replace("_", " "))
    src = f"{m.from_region or '?'} {_size(m.from_world_size, m.from_ranks, g)}"
    if move_state(m) != "done":
        return f"moving after {why} at step {m.checkpoint_step}: {src} → {m.to_region or '?'} ({move_state(m)})"
    dst = f"{m.to_region or '?'} {_size(m.to_world_size, m.to_ranks, g)}"
    return f"moved after {why}: {src} → {dst}, {resumed_at(m)}, lost {m.total_s:.0f} s"


def job_story(job: common_pb2.Job) -> str:
    """The job's story in one line: where it runs or ran, and its moves (the last one
    told in full, earlier ones counted)."""
    name = phase_name(job.phase)
    where = job.placement.region or "-"
    head = f"{name}"
    if job.placement.region:
        p = job.placement
        size = (_size(p.world_size, p.ranks, job.spec.resources.gpus_per_node)
                if p.world_size or p.ranks else shape(job))
        head += f" in {where} {size}"
    if job.progress.step or job.progress.total_steps:
        head += f" at step {steps(job)}"
    if name == "pending" and job.pending_reason:
        head += f": {job.pending_reason}"
    if not job.migrations:
        return head + ("" if job.restarts == 0 else f"; {job.restarts} restart(s)") + (
            "" if job.node_failures == 0 else f"; {job.node_failures} node failure(s)")
    # A job that moved opens with its last move (phase and place are in the panel below).
    earlier = len(job.migrations) - 1
    return move_story(job, job.migrations[-1]) + (f" (+{earlier} earlier)" if earlier else "")


def _kv(rows: Sequence[tuple[str, object]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value if isinstance(value, Text) else str(value))
    return table


def budget_counts(job: common_pb2.Job) -> str:
    """``restarts: 1, node failures: 2`` (the job's own failures and its nodes', which
    spend two budgets: docs/recovery.md "Restart budgets"); a budget the spec sets is
    shown with its limit (the broker's defaults are its settings, not known here)."""
    spec = job.spec
    nodes = f"node failures: {job.node_failures}"
    if spec.HasField("max_node_failures"):
        window = spec.node_failure_window_s if spec.HasField("node_failure_window_s") else None
        nodes += f" (max {spec.max_node_failures}" + (
            "" if window is None else " over the job's life" if not window
            else f" per {seconds_text(window)}") + ")"
    return f"restarts: {job.restarts}, {nodes}"


def seconds_text(s: float) -> str:
    """``1h``, ``30m``, ``90s``: a window as people say it."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s / size:g}{unit}"
    return f"{s:g}s"


def restart_note(job: common_pb2.Job) -> str:
    """Say plainly when a job's own command has never written a checkpoint: after a stop
    or a move it starts again from the beginning (docs/contracts.md "Your own code")."""
    if not job.spec.command or job.progress.last_checkpoint_uri:
        return ""
    if job.progress.step:  # it reports progress (the trainer library): its checkpoint is due
        return ("no checkpoint yet: until its first one, a move, preemption or failure would"
                " restart this job from the beginning")
    return ("no checkpoint: this job restarts from the beginning after a move, preemption or"
            " failure (its program reports none; see docs/user/bring-your-own-code.md)")


def job_detail(job: common_pb2.Job, events: Sequence[common_pb2.JobEvent] | None,
               now: float | None = None) -> Group:
    """Everything about one job: spec summary, placement, progress, goodput, history."""
    spec = job.spec
    rows: list[tuple[str, object]] = [
        ("id", job.id),
        ("name", spec.name or "-"),
        ("team", spec.team or "-"),
        ("priority", spec.priority_class or "-"),
        ("phase", phase_text(job.phase)),
        ("attempt", f"{job.attempt} ({budget_counts(job)})"),
        ("resources", f"{shape(job)} {spec.resources.accelerator or 'any accelerator'}"),
        ("created", f"{when(job.created_time)} ({age(job.created_time, now)} ago)"),
    ]
    if spec.topology.required or spec.topology.preferred:
        rows.append(
            (
                "topology",
                f"required={topology_name(spec.topology.required) or '-'} "
                f"preferred={topology_name(spec.topology.preferred) or '-'}",
            )
        )
    if spec.allowed_regions or spec.denied_regions or spec.preferred_regions:
        rows.append(
            (
                "regions",
                f"allow={','.join(spec.allowed_regions) or '*'} "
                f"deny={','.join(spec.denied_regions) or '-'} "
                f"prefer={','.join(spec.preferred_regions) or '-'}",
            )
        )
    if spec.command:
        rows.append(("run", shlex.join(spec.command)))
    if spec.HasField("workdir"):
        rows.append(("workdir", f"{spec.workdir.digest} ({spec.workdir.size_bytes / 2**20:.1f} MiB)"))
    note = restart_note(job)
    if note:
        rows.append(("checkpoint", Text(note, style="yellow")))
    if job.pending_reason:
        rows.append(("pending", Text(job.pending_reason, style="yellow")))
    if shrunk_text(job):
        rows.append(("size", Text(shrunk_text(job), style="yellow")))
    for r in job.refusals:  # agents that refused its Launch (broker/jobs/backoff.py)
        rows.append(("refused", Text(f"{r.agent_id} ({r.region or '?'}) x{r.count}, last {when(r.time)},"
                                     f" avoided until {when(r.until)}: {r.message or 'no reason given'}",
                                     style="yellow")))
    if job.message:
        rows.append(("message", job.message))
    table = _kv(rows)

    parts: list[object] = [Text(job_story(job), style="bold"),
                           Panel(table, title=f"job {job.id}", box=box.ROUNDED, expand=False)]

    p = job.placement
    if p.region:
        nodes = ", ".join(f"{n.node_id}({n.gpus})" for n in p.nodes) or "-"
        prow = [
            ("region", f"{p.region} (agent {p.agent_id or '-'})"),
            ("capacity", capacity_cell(p.capacity_type, p.pool)),
            ("nodes", nodes),
            ("ranks", f"{p.ranks} (on {p.world_size} GPUs)" if p.ranks
             else f"- ({p.world_size} GPUs; not reported yet)"),
            ("price", f"${p.price_per_gpu_hour:.2f}/GPU-h"),
        ]
        if p.explanation:
            prow.append(("why", p.explanation))
        parts.append(Panel(_kv(prow), title="placement", box=box.ROUNDED, expand=False))

    pr = job.progress
    if pr.step or pr.total_steps:
        prow = [
            ("step", steps(job)),
            ("loss", f"{pr.loss:.4f}" if pr.loss else "-"),
            ("tokens/s", f"{pr.tokens_per_s:.0f}" if pr.tokens_per_s else "-"),
            ("checkpoint", f"step {pr.last_checkpoint_step} {pr.last_checkpoint_uri}".strip()),
        ]
        if pr.resume.tier:  # where this attempt's state came from (docs/recovery.md)
            prow.append(("resumed", f"from {pr.resume.tier}"
                         + (f" (step {pr.resume.step})" if pr.resume.step else "")))
        rec = job.node_recovery
        if rec.failed_attempt and rec.plan:
            swaps = ", ".join(f"{n} -> {s}" for n, s in sorted(rec.replaced.items()))
            prow.append(("node loss", f"attempt {rec.failed_attempt} lost"
                         f" {', '.join(rec.lost_nodes)}: "
                         + (f"replaced in place ({swaps})" if swaps
                            else f"shrunk in place onto {', '.join(rec.survivors)}"
                            if rec.plan == "shrink_in_place" else "relaunched from the store")
                         + (f", state from {rec.tier}" if rec.tier else "")))
        parts.append(Panel(_kv(prow), title="progress", box=box.ROUNDED, expand=False))

    src = job.spec.resume_source
    if src.job_id or job.checkpoint_shares:
        srow = []
        if src.job_id:
            srow.append(("starts from", f"{src.uri} (job {src.job_id}, {src.share_id})"))
        for sh in job.checkpoint_shares:
            state = (f"revoked by {sh.revoked_by}" if sh.revoked_time
                     else f"granted by {sh.granted_by}")
            srow.append((sh.id, f"team {sh.grantee_team}, {state}"))
        parts.append(Panel(_kv(srow), title="checkpoint shares", box=box.ROUNDED, expand=False))

    g = job.goodput
    if g.wall_s:
        pct = 100.0 * g.productive_s / g.wall_s if g.wall_s else 0.0
        grow = [
            ("productive", f"{duration(g.productive_s)} ({pct:.0f}% of {duration(g.wall_s)})"),
            ("queued", duration(g.queued_s)
             + (f", starting {duration(g.starting_s)}" if g.starting_s else "")),
            (
                "lost",
                f"failures {duration(g.lost_failure_s)}, preemption "
                f"{duration(g.lost_preemption_s)}, migration {duration(g.lost_migration_s)}",
            ),
        ]
        parts.append(Panel(_kv(grow), title="goodput", box=box.ROUNDED, expand=False))

    if job.migrations:
        parts.append(migrations_table(job.migrations, title="migrations", with_job=False))
        notes = [line for i, m in enumerate(job.migrations, 1) for line in move_notes(i, m, now)]
        if notes:
            parts.append(Text("\n".join(notes)))

    if events is not None:  # `brokerctl job` prints them as lines (render_logs.event_line)
        parts.append(events_table(events, title="events"))
    return Group(*parts)


def move_notes(n: int, m: common_pb2.Migration, now: float | None = None) -> list[str]:
    """A make-before-break move's own figures, under the migrations table (one short line
    each, <= 100 columns): the downtime and the pre-copy with its held Stop."""
    out: list[str] = []
    if m.make_before_break:
        down = f"downtime {_secs(m.downtime_s)}" if m.downtime_s else "downtime not yet known"
        out.append(f"move {n}: make-before-break, {down} (source's last step -> training resumed)")
    if m.precopy_from:
        pc = m.precopy
        if pc.error:
            what = f"failed: {pc.error[:60]}"
        elif m.precopy_done_time or pc.done:
            what = (f"{pc.bytes_total / 1e6:,.0f} MB in {_secs(pc.seconds)}"
                    + (f" ({pc.method})" if pc.method else ""))
        else:
            what = "copying"
        out.append(f"move {n}: pre-copy of the last periodic checkpoint {what}")
        if m.stop_held_until and not m.stop_sent_time:
            left = m.stop_held_until - (time.time() if now is None else now)
            out.append(f"move {n}: source's Stop held for the pre-copy, {max(0.0, left):.0f} s at most")
        elif m.stop_sent_time and m.started_time and m.stop_sent_time > m.started_time:
            out.append(f"move {n}: source's Stop held {_secs(m.stop_sent_time - m.started_time)}"
                       " for the pre-copy")
    return out


def _secs(v: float) -> str:
    return f"{v:.1f}s" if v >= 10 else f"{v:.2f}s"


_C = common_pb2
# Short cause labels by the typed cause (Migration.cause_code); a finer string cause
# (e.g. which preemption) and moves recorded by an older broker fall back to the string.
_CAUSE_SHORT = {_C.MIGRATION_CAUSE_SPOT_INTERRUPTION: "spot", _C.MIGRATION_CAUSE_REGION_DRAIN: "drain",
                _C.MIGRATION_CAUSE_PLAN_ENDING: "plan-end", _C.MIGRATION_CAUSE_AGENT_LOST: "agent-lost",
                _C.MIGRATION_CAUSE_ATTEMPT_MISSING: "missing", _C.MIGRATION_CAUSE_BETTER_CAPACITY: "cheaper",
                _C.MIGRATION_CAUSE_NODE_UNHEALTHY: "unhealthy", _C.MIGRATION_CAUSE_LAUNCH_REFUSED: "refused"}
_CAUSE_BY_NAME = {"spot_interruption": "spot", "region_drain": "drain", "plan_ending": "plan-end",
                  "agent_lost": "agent-lost", "attempt_missing": "missing", "better_capacity": "cheaper",
                  "grow_back": "grow-back"}


def move_cause(m: common_pb2.Migration) -> str:
    return _CAUSE_SHORT.get(m.cause_code) or _CAUSE_BY_NAME.get(m.cause, m.cause[:10])


def move_state(m: common_pb2.Migration) -> str:
    """The move's milestone: the typed state when the broker set it, else the string."""
    if m.state_code:
        return common_pb2.MigrationState.Name(m.state_code).removeprefix("MIGRATION_STATE_").lower()
    return m.state


def migrations_table(migrations: Iterable[common_pb2.Migration], title: str | None = None,
                     with_job: bool = True) -> Table:
    """One row per move (fits 100 columns): cause (! = emergency), route, ranks,
    checkpoint time, transfer (time @ MB/s, or % while copying; "mbb" for a make-before-break
    move, which reads the checkpoint in place), total time to the first step after the
    resume (or the state while in progress) and the broker's own share (ORCH). ``-o json`` /
    ``brokerctl job`` (its notes under the table: downtime, pre-copy) tell the rest."""
    cols: list[str | tuple[str, dict]] = []
    if with_job:
        cols.append("JOB")
    # "a → b": the route wraps after its arrow when 80 columns cannot hold it on one line.
    cols += ["CAUSE", ("FROM → TO", {"flex": True, "overflow": "fold"}),
             ("RANKS", {"justify": "right"}), ("CKPT", {"justify": "right"}),
             ("XFER", {"justify": "right"}), ("TOTAL", {"justify": "right"}),
             ("ORCH", {"justify": "right"})]
    t = _table(*cols, title=title)
    for m in migrations:
        state = move_state(m)
        done = state == "done"
        tr = m.transfer
        if tr.done and tr.bytes_total:
            xfer = f"{_secs(tr.seconds)}@{tr.mb_per_s:.0f}MB/s"
        elif tr.bytes_total:
            xfer = f"{100 * tr.bytes_done // tr.bytes_total}%"
        else:
            xfer = "mbb" if m.make_before_break else "-"  # read in place, copied after resuming
        row: list[object] = [m.job_id] if with_job else []
        row += [move_cause(m) + ("!" if m.emergency else ""),
                f"{m.from_region or '-'} → {m.to_region or '?'}",
                # the ranks that ran (GPUs placed where an agent did not report them)
                f"{m.from_ranks or m.from_world_size}>{m.to_ranks or m.to_world_size or '?'}",
                _secs(m.checkpoint_s) if done else "-", xfer,
                _secs(m.total_s) if done else state, _secs(m.orchestration_s) if done else "-"]
        t.add_row(*row)
    return t


def events_table(events: Iterable[common_pb2.JobEvent], title: str | None = None) -> Table:
    """Event history, readable at 100 columns.

    Why four columns: the message says *why* (preempted for which job, moved where,
    timings) and is what people read, so it gets the width; type, phase change,
    region and actor are stacked in one EVENT cell instead of four narrow columns.
    """
    table = _table(
        ("#", {"justify": "right"}),
        "TIME",
        ("EVENT", {"flex": True, "min_width": 22, "max_width": 30}),
        ("MESSAGE", {"flex": True, "overflow": "fold", "ratio": 1, "min_width": 30}),
        title=title,
    )
    for e in events:
        seq, time_s, kind, phase, region, actor, msg = event_row(e)
        cell = Text(str(kind), style="bold")
        cell.append("\n")
        cell.append_text(phase if isinstance(phase, Text) else Text(str(phase)))
        where = " · ".join(x for x in (str(region), str(actor)) if x and x != "-")
        if where:
            cell.append(f"\n{where}", style="dim")
        table.add_row(seq, time_s, cell, msg)
    return table


def event_row(e: common_pb2.JobEvent) -> list[object]:
    if e.from_phase and e.to_phase and e.from_phase != e.to_phase:
        ph = Text(f"{phase_name(e.from_phase)}→", style="dim") + phase_text(e.to_phase)
    elif e.to_phase:
        ph = phase_text(e.to_phase)
    else:
        ph = Text("-")
    msg = e.message or e.reason
    if e.reason and e.message and e.reason not in e.message:
        msg = f"{e.message} [{e.reason}]"
    return [
        str(e.seq),
        when(e.time),
        e.type or "-",
        ph,
        e.region or "-",
        e.actor or "-",
        msg or "",
    ]


def capacity_cell(capacity_type: int, pool: str) -> str:
    """Capacity type and pool in one cell, the pool only when it says more than the type
    (``spot``, ``on-demand``, ``plan:tp-1a2b3c``, ``on-demand:p5-reserved``); no space, so
    a narrow terminal cuts it with an ellipsis instead of wrapping it."""
    ctype = capacity_type_name(capacity_type) or "-"
    if not pool or pool.replace("_", "-") == ctype:
        return ctype
    return f"plan:{pool}" if ctype == "training-plan" else f"{ctype}:{pool}"


def capacity_table(resp: capacity_pb2.GetCapacityResponse, by_block: bool = False) -> Table:
    cols: list[str | tuple[str, dict]] = [
        ("REGION", {"flex": True, "min_width": 9}),
        ("ZONE", {"flex": True}),
        ("CAPACITY", {"flex": True, "max_width": 24}),
        ("ACCEL", {"flex": True}),
    ]
    if by_block:
        cols.append(("BLOCK", {"flex": True, "max_width": 16}))
    # Spare GPUs (reserved for in-place replacement of lost nodes): a column only when
    # some pool reserves spares, so fleets without them keep the narrower table.
    spares = any(r.spare_gpus for r in resp.rows)
    cols += [
        ("TOTAL", {"justify": "right"}),
        ("ALLOC", {"justify": "right"}),
        ("FREE", {"justify": "right"}),
        *([("SPARE", {"justify": "right"})] if spares else []),
        ("BORROW", {"justify": "right"}),
        ("BAD", {"justify": "right"}),
        ("$/GPU-h", {"justify": "right"}),
    ]
    table = _table(*cols)
    totals = [0, 0, 0, 0, 0, 0]
    for r in resp.rows:
        row = [r.region, r.zone or "-", capacity_cell(r.capacity_type, r.pool)]
        row.append(r.accelerator or "-")
        if by_block:
            row.append(r.block or "-")
        free_style = "green" if r.free_gpus else "dim"
        row += [
            str(r.total_gpus),
            str(r.allocated_gpus),
            Text(str(r.free_gpus), style=free_style),
            *([str(r.spare_gpus)] if spares else []),
            str(r.borrowed_gpus),
            Text(str(r.unhealthy_gpus), style="red") if r.unhealthy_gpus else "0",
            f"{r.price_per_gpu_hour:.2f}",
        ]
        table.add_row(*row)
        for i, v in enumerate((r.total_gpus, r.allocated_gpus, r.free_gpus, r.spare_gpus,
                               r.borrowed_gpus, r.unhealthy_gpus)):
            totals[i] += v
    if resp.rows:
        pad = ["", "", "", ""] + ([""] if by_block else [])
        pad[0] = "total"
        table.add_section()
        shown = totals if spares else totals[:3] + totals[4:]
        table.add_row(*pad, *(str(t) for t in shown), "", style="bold")
    return table


def nodes_table(nodes: Sequence[capacity_pb2.NodeUsage]) -> Table:
    table = _table(
        ("NODE", {"flex": True, "max_width": 22}),
        ("REGION", {"flex": True}),
        ("ZONE", {"flex": True}),
        ("TYPE", {"flex": True}),
        ("BLOCK", {"flex": True, "max_width": 14}),
        ("GPUS", {"justify": "right"}),
        ("USED", {"justify": "right"}),
        "STATE",
        ("JOBS", {"flex": True, "max_width": 20, "overflow": "fold"}),
    )
    for nu in nodes:
        n = nu.node
        state = "ok" if n.healthy else "unhealthy"
        if n.cordoned:
            state += ",cordoned"
        if nu.spare:
            state += ",spare"
        table.add_row(
            n.id,
            n.region,
            n.zone or "-",
            capacity_type_name(n.capacity_type) or "-",
            n.ultraserver_id or n.network_layer_3 or "-",
            str(n.gpus),
            str(nu.allocated_gpus),
            Text(state, style="green" if state in ("ok", "ok,spare") else "red"),
            ",".join(nu.job_ids) or "-",
        )
    return table


def regions_table(regions: Iterable[capacity_pb2.RegionInfo], now: float | None = None) -> Table:
    table = _table(
        ("REGION", {"flex": True, "min_width": 9}),
        ("AGENTS", {"flex": True, "max_width": 22}),
        "STATUS",
        "HEARTBEAT",
        ("NODES", {"justify": "right"}),
        ("GPUS", {"justify": "right"}),
        ("ALLOC", {"justify": "right"}),
        ("FREE", {"justify": "right"}),
        ("JOBS", {"justify": "right"}),
    )
    for r in regions:
        if r.draining:
            status = Text("draining", style="yellow")
        elif r.connected:
            status = Text("connected", style="green")
        else:
            status = Text("offline", style="red")
        table.add_row(
            r.name,
            ",".join(r.agent_ids) or "-",
            status,
            (age(r.last_heartbeat_time, now) + " ago") if r.last_heartbeat_time else "-",
            str(r.nodes),
            str(r.total_gpus),
            str(r.allocated_gpus),
            str(r.free_gpus),
            str(r.running_jobs),
        )
    return table


def _quota_summary(q: capacity_pb2.TeamQuota) -> str:
    parts = []
    for e in q.quotas:
        s = f"{e.guaranteed_gpus}"
        if e.accelerator:
            s += f":{e.accelerator}"
        if e.HasField("borrow_limit_gpus"):
            s += f" b≤{e.borrow_limit_gpus}"
        if e.HasField("lend_limit_gpus"):
            s += f" l≤{e.lend_limit_gpus}"
        parts.append(s)
    return "; ".join(parts) or "0"


def teams_table(teams: Iterable[capacity_pb2.TeamQuota]) -> Table:
    table = _table(
        ("TEAM", {"flex": True, "max_width": 16}),
        ("COHORT", {"flex": True, "max_width": 12}),
        "STRATEGY",
        ("GUARANTEED", {"flex": True, "max_width": 24}),
        ("USED", {"justify": "right"}),
        ("BORROW", {"justify": "right"}),
        ("LENT", {"justify": "right"}),
        ("PEND", {"justify": "right"}),
        ("RUN", {"justify": "right"}),
    )
    for q in teams:
        table.add_row(
            q.team,
            q.cohort or "-",
            strategy_name(q.strategy) or "lend-and-borrow",
            _quota_summary(q),
            str(q.used_gpus),
            str(q.borrowed_gpus),
            str(q.lent_gpus),
            str(q.pending_jobs),
            str(q.running_jobs),
        )
    return table


def priority_classes_table(classes: Iterable[capacity_pb2.PriorityClass]) -> Table:
    """Priority classes, highest first (the broker's order); the default class marked."""
    table = _table(
        ("NAME", {"flex": True, "max_width": 24}),
        ("VALUE", {"justify": "right"}),
        "DEFAULT",
        ("DESCRIPTION", {"flex": True, "max_width": 48}),
    )
    for pc in classes:
        table.add_row(pc.name, str(pc.value), "yes" if pc.is_default else "",
                      pc.description or "-")
    return table


def plans_table(plans: Iterable[capacity_pb2.TrainingPlan]) -> Table:
    table = _table(
        ("ID", {"overflow": "fold"}),
        ("NAME", {"flex": True, "max_width": 14}),
        ("REGION", {"flex": True}),
        ("INSTANCES", {"justify": "right"}),
        "STATE",
        "START",
        "END",
        ("TEAM", {"flex": True, "max_width": 10}),
    )
    for p in plans:
        table.add_row(
            p.id,
            p.name or "-",
            f"{p.region}/{p.zone}" if p.zone else p.region,
            f"{p.instance_count}×{p.instance_type or '?'}",
            plan_state_name(p.state) or "-",
            date_time(p.start_time),
            date_time(p.end_time),
            p.team or "shared",
        )
    return table


def tokens_table(tokens: Iterable[object]) -> Table:
    table = _table("ID", ("USER", {"flex": True}), "ROLE", ("TEAM", {"flex": True}), "CREATED",
                   "EXPIRES", "STATE")
    now = time.time()
    for t in tokens:
        expires = t.expires_time  # type: ignore[attr-defined]
        state = ("revoked" if t.revoked else  # type: ignore[attr-defined]
                 "expired" if expires and expires <= now else
                 "rotated" if t.rotated_time else "active")  # type: ignore[attr-defined]
        table.add_row(t.id, t.user, t.role, t.team or "-",  # type: ignore[attr-defined]
                      date_time(t.created_time),  # type: ignore[attr-defined]
                      time.strftime("%Y-%m-%d", time.localtime(expires)) if expires else "never",
                      state)
    return table


def audit_table(records: Iterable[object]) -> Table:
    table = _table("TIME", ("ACTOR", {"flex": True, "max_width": 18}), ("RPC", {"flex": True}),
                   ("TARGET", {"flex": True, "max_width": 22}), "PEER",
                   "RESULT")
    for r in records:
        table.add_row(time.strftime("%m-%d %H:%M:%S", time.localtime(r.time)),  # type: ignore[attr-defined]
                      r.actor, r.method.rsplit("/", 1)[-1], r.target or "-",  # type: ignore[attr-defined]
                      r.peer.removeprefix("ipv4:"), Text(r.result, style="green" if r.result == "OK"  # type: ignore[attr-defined]
                                                         else "red"))
    return table


def to_json(msg_or_list) -> str:
    """JSON for `--output json`: API field names, enums as names."""
    import json

    def one(m):
        return json_format.MessageToDict(m, preserving_proto_field_name=True)

    if isinstance(msg_or_list, list | tuple):
        return json.dumps([one(m) for m in msg_or_list], indent=2)
    return json.dumps(one(msg_or_list), indent=2)
