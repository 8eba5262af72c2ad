"""Job view model: attempts across regions on a time axis, checkpoints, migrations with
their phase durations, goodput, the loss curve and the log tail.

Why from events: the job record keeps only its current placement; its event history
(GetJobEvents) has every launch (region, world size, capacity type in the "launched"
event's details), every durable checkpoint and the sampled progress (loss). Positions are
percentages of the job's lifetime, so the template only draws.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from brokersdk.enums import TERMINAL_PHASES, capacity_type_name, phase_name
from brokersdk.size import below_size_text
from computebroker.v1 import common_pb2 as pb

# A stopped attempt: its bar ends at the first of these after its launch.
_ENDS_ATTEMPT = frozenset({pb.JOB_PHASE_SUSPENDED, pb.JOB_PHASE_MIGRATING, pb.JOB_PHASE_PENDING,
                           *TERMINAL_PHASES})


@dataclass
class Bar:
    """A span on the time axis, in percent of the axis."""

    left: float
    width: float
    label: str
    title: str
    kind: str = ""


@dataclass
class Attempt:
    number: int
    region: str
    world_size: int
    capacity_type: str
    start: float
    end: float
    ongoing: bool
    bar: Bar | None = None


@dataclass
class MigrationRow:
    seq: int
    cause: str
    state: str
    route: str
    world: str
    phases: list[tuple[str, float]]  # (name, seconds) in order
    total_s: float
    bars: list[Bar] = field(default_factory=list)
    why: str = ""  # the event that caused the move (a spot notice, a drain ...), for people
    why_seq: int = 0  # its seq in the event history (the page links to it)


@dataclass
class GoodputPart:
    name: str
    seconds: float
    percent: float


@dataclass
class JobView:
    job: pb.Job
    phase: str
    t0: float
    t1: float
    attempts: list[Attempt]
    checkpoints: list[Bar]
    migrations: list[MigrationRow]
    goodput: list[GoodputPart]
    loss_points: str  # SVG polyline points in a 0..300 x 0..100 box
    loss_range: tuple[float, float]
    steps_range: tuple[int, int]
    log_lines: list[str]
    # "running at 2 of 4 ranks since ... (why)" while it runs below its requested size
    size: str = ""

    @property
    def loss_count(self) -> int:
        """How many steps the curve draws."""
        return len(self.loss_points.split())


def _pct(t: float, t0: float, t1: float) -> float:
    span = max(t1 - t0, 1e-6)
    return max(0.0, min(100.0, 100.0 * (t - t0) / span))


def _bar(start: float, end: float, t0: float, t1: float, label: str, title: str,
         kind: str = "") -> Bar:
    left = _pct(start, t0, t1)
    return Bar(left, max(0.4, _pct(end, t0, t1) - left), label, title, kind)


def attempts_of(job: pb.Job, events: Sequence[pb.JobEvent], now: float) -> list[Attempt]:
    """One entry per launched attempt, from the "launched" events."""
    out: list[Attempt] = []
    for e in events:
        if e.type != "launched":
            continue
        ctype = e.details.get("capacity_type", "")
        name = capacity_type_name(int(ctype)) if ctype.isdigit() else ""
        out.append(Attempt(e.attempt, e.region, int(e.details.get("world_size") or 0),
                           name, e.time, 0.0, False))
    for i, a in enumerate(out):
        nxt = out[i + 1].start if i + 1 < len(out) else None
        end = next((e.time for e in events if e.attempt == a.number and e.time >= a.start
                    and e.to_phase in _ENDS_ATTEMPT), None)
        if end is None and nxt is None and job.phase not in TERMINAL_PHASES:
            a.end, a.ongoing = now, True
        else:
            a.end = end if end is not None else (nxt or job.finished_time or now)
    if out and not out[-1].capacity_type and job.attempt == out[-1].number:
        out[-1].capacity_type = capacity_type_name(job.placement.capacity_type)
    return out


def loss_samples(job: pb.Job, events: Iterable[pb.JobEvent]) -> dict[int, float]:
    """Every known (step, loss): the job's bounded series of reported steps
    (Job.loss_series), the sampled "progress" events (older brokers, or a series thinned
    at its start) and the latest progress. A launch reports step 0 / loss 0 before
    training, and jobs that report no loss report 0: neither is a point."""
    pts: dict[int, float] = {}
    for e in events:
        if e.type == "progress" and "loss" in e.details:
            try:
                pts[int(e.details["step"])] = float(e.details["loss"])
            except ValueError:
                continue
    for p in job.loss_series:
        pts[int(p.step)] = p.loss
    if job.progress.step:
        pts[int(job.progress.step)] = job.progress.loss
    return {s: v for s, v in pts.items() if s > 0 and v > 0}


def loss_curve(job: pb.Job, events: Iterable[pb.JobEvent]) -> tuple[str, tuple[float, float],
                                                                    tuple[int, int]]:
    """SVG polyline points of :func:`loss_samples` in a 0..300 x 0..100 box."""
    pts = loss_samples(job, events)
    if len(pts) < 2:
        return "", (0.0, 0.0), (0, 0)
    steps = sorted(pts)
    lo, hi = min(pts.values()), max(pts.values())
    s0, s1 = steps[0], steps[-1]
    xy = " ".join(f"{300 * (s - s0) / max(1, s1 - s0):.1f},"
                  f"{100 - 100 * (pts[s] - lo) / max(hi - lo, 1e-9):.1f}" for s in steps)
    return xy, (lo, hi), (s0, s1)


# Phases in which a job waits for capacity: its current wait counts as "queued" before
# the broker books it (goodput is accounted when the phase ends).
_WAITING = frozenset({pb.JOB_PHASE_PENDING, pb.JOB_PHASE_ADMITTED})


def goodput_parts(g: pb.Goodput, job: pb.Job | None = None,
                  now: float | None = None) -> list[GoodputPart]:
    """The goodput buckets. The broker books a phase's time when the phase ends, so the
    current phase's time so far is added here: a waiting job's to "queued", a running
    job's to "productive" (else a running job reads as all queued)."""
    waiting = running = 0.0
    if job is not None and job.phase_time:
        so_far = max(0.0, (time.time() if now is None else now) - job.phase_time)
        waiting = so_far if job.phase in _WAITING else 0.0
        running = so_far if job.phase == pb.JOB_PHASE_RUNNING else 0.0
    parts = [("productive", g.productive_s + running), ("queued", g.queued_s + waiting),
             ("lost: failure", g.lost_failure_s), ("lost: preemption", g.lost_preemption_s),
             ("lost: migration", g.lost_migration_s)]
    total = sum(s for _, s in parts) or 1.0
    return [GoodputPart(n, s, 100 * s / total) for n, s in parts]


# A move's phases, each between two of its milestones (known as the move goes on, so an
# unfinished move shows the phases it has passed; durations equal the derived *_s fields).
_MIGRATION_PHASES = (("checkpoint", "started_time", "checkpointed_time"),
                     ("queue", "checkpointed_time", "launched_time"),
                     ("launch", "launched_time", "running_time"),
                     ("first step", "running_time", "first_step_time"))


def migration_phases(m: pb.Migration) -> list[tuple[str, float, float]]:
    """(phase, start, end) for each phase of ``m`` whose two milestones are known."""
    out = []
    for name, a, b in _MIGRATION_PHASES:
        start, end = getattr(m, a), getattr(m, b)
        if start and end and end >= start:
            out.append((name, start, end))
    return out


_PHASE_CLASS = {name: f"mig-{i}" for i, (name, _, _) in enumerate(_MIGRATION_PHASES, 1)}


# Events that never cause a move: reports and bookkeeping, not triggers.
_NOT_CAUSES = frozenset({"progress", "checkpoint", "transfer", "transfer_started",
                         "transfer_progress", "transfer_done", "launched", "running"})


# Phases a trigger moves a running job into: the event that does so is a move's cause.
_MOVE_PHASES = frozenset({pb.JOB_PHASE_CHECKPOINTING, pb.JOB_PHASE_SUSPENDED,
                          pb.JOB_PHASE_MIGRATING})


def is_cause(e: pb.JobEvent) -> bool:
    """An event that stopped or moved an attempt (a spot notice, a drain, a preemption)."""
    return e.type not in _NOT_CAUSES and e.to_phase in _MOVE_PHASES


def cause_event(m: pb.Migration, events: Sequence[pb.JobEvent]) -> pb.JobEvent | None:
    """The event that started move ``m``: of the source attempt's events up to the move's
    start, the last that took the job out of running (a spot notice, a drain, a node gone
    bad, a better offer), not the later steps of the same stop ("checkpoint saved; moving").
    Why: the move's ``cause`` is a code; this event says what happened."""
    best = first_stop = None
    for e in events:
        if e.time > m.started_time + 1.0:
            break
        if e.type in _NOT_CAUSES or not e.message:
            continue
        if m.from_attempt and e.attempt and e.attempt != m.from_attempt:
            continue
        best = e
        if e.to_phase in _MOVE_PHASES and e.from_phase not in _MOVE_PHASES:
            first_stop = e
    return first_stop or best


def migration_rows(migrations: Iterable[pb.Migration], t0: float, t1: float,
                   events: Sequence[pb.JobEvent] = ()) -> list[MigrationRow]:
    """Each move with its phase durations, also as bars on the job's axis."""
    rows: list[MigrationRow] = []
    for m in migrations:
        spans = migration_phases(m)
        known = {name: end - start for name, start, end in spans}
        phases = [(name, known.get(name, 0.0)) for name, _, _ in _MIGRATION_PHASES]
        row = MigrationRow(m.seq, m.cause, m.state, f"{m.from_region} → {m.to_region or '?'}",
                           f"{m.from_world_size} → {m.to_world_size or '?'}", phases,
                           m.total_s or sum(known.values()))
        why = cause_event(m, events)
        if why is not None:
            row.why, row.why_seq = why.message, why.seq
        for name, start, end in spans:
            row.bars.append(_bar(start, end, t0, t1, name,
                                 f"move {m.seq}: {name} {end - start:.1f} s", _PHASE_CLASS[name]))
        rows.append(row)
    return rows


def build_job_view(job: pb.Job, events: Sequence[pb.JobEvent], log_lines: list[str],
                   now: float | None = None) -> JobView:
    now = time.time() if now is None else now
    t0 = job.created_time or (events[0].time if events else now)
    t1 = job.finished_time if job.phase in TERMINAL_PHASES and job.finished_time else now
    attempts = attempts_of(job, events, now)
    for a in attempts:
        a.bar = _bar(a.start, a.end, t0, t1, f"#{a.number} {a.region} ×{a.world_size}",
                     f"attempt {a.number}: {a.region}, world size {a.world_size}, "
                     f"{a.capacity_type or 'capacity ?'}, {a.end - a.start:.0f} s"
                     + (" (running)" if a.ongoing else ""), a.capacity_type)
    ticks = [_bar(e.time, e.time, t0, t1, e.details.get("step", ""),
                  f"checkpoint at step {e.details.get('step', '?')}", "ckpt")
             for e in events if e.type == "checkpoint" and e.reason == "checkpoint_durable"]
    points, lrange, srange = loss_curve(job, events)
    return JobView(job, phase_name(job.phase), t0, t1, attempts, ticks,
                   migration_rows(job.migrations, t0, t1, events),
                   goodput_parts(job.goodput, job, now),
                   points, lrange, srange, log_lines, size_line(job))


# Phases in which a job below its size holds (or is leaving) its smaller placement.
_SIZED = frozenset({pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_CHECKPOINTING})


def size_line(job: pb.Job) -> str:
    """That the job runs below its requested size, since when and why (the same words as
    `brokerctl job`'s size line); "" at full size or while it is not placed."""
    return below_size_text(job) if job.phase in _SIZED else ""


def log_text(records: Iterable[object], limit: int = 500) -> list[str]:
    """The log's newest ``limit`` lines (0 = all): a header line per attempt, then
    "[rank] text"."""
    out: list[str] = []
    for rec in records:
        kind = rec.WhichOneof("kind")  # type: ignore[attr-defined]
        if kind == "attempt":
            a = rec.attempt  # type: ignore[attr-defined]
            out.append(f"── attempt {a.attempt} · {a.region} · world size {a.world_size} ──")
        elif kind == "line":
            ln = rec.line  # type: ignore[attr-defined]
            out.append(f"[{ln.rank}] {ln.text}")
        elif kind == "dropped_lines":
            out.append(f"… {rec.dropped_lines} older lines dropped")  # type: ignore[attr-defined]
    return out[-limit:] if limit else out
