"""The job state machine: phases, allowed edges, and the goodput accounting of a move.

Every phase change goes through :class:`Tx.move`, which checks the transition is
allowed, charges the time spent in the old phase to the right goodput bucket and
appends a JobEvent (who, why, where, attempt). A Tx is pure data (no store, no
clock): :mod:`broker.jobs.transitions` build one per input and
:mod:`broker.jobs.applier` writes the result in one compare-and-set, so history can
never disagree with state, whoever races whom.

Allowed transitions: the design's phase diagram, plus the edges a real broker needs
and the diagram leaves implicit (named below):
- cancel from any live phase;
- a relaunch after a failure or a lost agent goes back to PENDING (HyperPod
  auto-resume) from ADMITTED/LAUNCHING/RUNNING/CHECKPOINTING;
- FAILED from any live phase (unrecoverable error, restarts exhausted);
- SUCCEEDED also from CHECKPOINTING (finished while checkpointing) and LAUNCHING
  (an attempt so short that RUNNING was never reported), and from any live phase when
  a superseded attempt reports it finished all steps with a durable final checkpoint
  (``updates.superseded_ended``: the job was requeued or relaunched meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.api.errors import IllegalTransition
from broker.jobs import backoff, store_wait
from broker.jobs.causes import Family
from computebroker.v1 import common_pb2 as pb

P = pb.JobPhase
PENDING, ADMITTED, LAUNCHING, RUNNING = (
    pb.JOB_PHASE_PENDING, pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
CHECKPOINTING, SUSPENDED, MIGRATING = (
    pb.JOB_PHASE_CHECKPOINTING, pb.JOB_PHASE_SUSPENDED, pb.JOB_PHASE_MIGRATING)
SUCCEEDED, FAILED, CANCELLED = pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED

TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
# Phases in which the job holds GPUs on some agent's nodes.
HOLDING = frozenset({ADMITTED, LAUNCHING, RUNNING, CHECKPOINTING})
# Phases in which the job waits for placement (MIGRATING: moved, waiting for its new home).
QUEUED = frozenset({PENDING, MIGRATING})
LIVE = frozenset(P.values()) - TERMINAL - {pb.JOB_PHASE_UNSPECIFIED}

ALLOWED: dict[int, frozenset[int]] = {
    PENDING: frozenset({ADMITTED, CANCELLED, FAILED, SUCCEEDED}),
    ADMITTED: frozenset({LAUNCHING, PENDING, CANCELLED, FAILED, SUCCEEDED}),
    LAUNCHING: frozenset({RUNNING, PENDING, SUCCEEDED, FAILED, CANCELLED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, CHECKPOINTING, PENDING}),
    CHECKPOINTING: frozenset({SUSPENDED, MIGRATING, PENDING, SUCCEEDED, FAILED, CANCELLED}),
    SUSPENDED: frozenset({PENDING, CANCELLED, FAILED, SUCCEEDED}),
    MIGRATING: frozenset({LAUNCHING, CANCELLED, FAILED, SUCCEEDED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}


def charge_money(job: pb.Job, frm: int, elapsed: float) -> None:
    """``elapsed`` seconds of phase ``frm`` (one that holds GPUs) in dollars: the GPUs
    placed x their price, per capacity type and region; and what the last move saved
    while the job runs where it moved to (cheaper than where it came from)."""
    p = job.placement
    if not p.world_size or not p.price_per_gpu_hour or elapsed <= 0:
        return
    g = job.goodput
    usd = elapsed / 3600.0 * p.world_size * p.price_per_gpu_hour
    g.cost_usd += usd
    ctype = pb.CapacityType.Name(p.capacity_type).removeprefix("CAPACITY_TYPE_").lower()
    g.cost_by_capacity[ctype] = g.cost_by_capacity.get(ctype, 0.0) + usd
    g.cost_by_region[p.region] = g.cost_by_region.get(p.region, 0.0) + usd
    m = job.migrations[-1] if job.migrations else None
    if (frm == RUNNING and m is not None and m.to_attempt == job.attempt
            and m.from_price_per_gpu_hour and m.from_world_size):
        before = m.from_world_size * m.from_price_per_gpu_hour
        now = p.world_size * p.price_per_gpu_hour
        if before > now:
            g.saved_usd += elapsed / 3600.0 * (before - now)


def _bucket(value: str, default: str) -> str:
    """Goodput field charged for a stored ``requeue_cause``/``stop_reason`` string."""
    fam = Family.parse(value)
    return fam.goodput_field if fam is not None else default


def phase_name(phase: int) -> str:
    return P.Name(phase).removeprefix("JOB_PHASE_") if phase in P.values() else str(phase)


def is_terminal(phase: int) -> bool:
    return phase in TERMINAL


@dataclass
class Tx:
    """One pending change of a job: mutate ``job`` and call :meth:`move`/:meth:`note`."""

    job: pb.Job
    now: float
    events: list[pb.JobEvent] = field(default_factory=list)

    def _event(self, type_: str, from_phase: int, to_phase: int, *, reason: str, actor: str,
               message: str, details: dict[str, str] | None) -> pb.JobEvent:
        ev = pb.JobEvent(
            job_id=self.job.id, time=self.now, from_phase=from_phase, to_phase=to_phase,
            type=type_, reason=reason, actor=actor, region=self.job.placement.region,
            attempt=self.job.attempt, message=message,
        )
        for k, v in (details or {}).items():
            ev.details[k] = str(v)
        self.events.append(ev)
        return ev

    def move(self, to: int, type_: str, *, reason: str = "", actor: str = "scheduler",
             message: str = "", details: dict[str, str] | None = None) -> pb.JobEvent:
        """Change phase (checked against :data:`ALLOWED`) and record the event."""
        frm = self.job.phase
        if to not in ALLOWED.get(frm, frozenset()):
            raise IllegalTransition(
                f"job {self.job.id}: {phase_name(frm)} -> {phase_name(to)} is not an allowed transition"
            )
        self._charge(frm)
        if frm == RUNNING:
            # Leaving RUNNING: productive time of this attempt ends here.
            self.job.attempt_started_time = 0.0
        self.job.phase = to
        self.job.phase_time = self.now
        if to == RUNNING:
            self.job.attempt_started_time = self.now
            backoff.reset(self.job)  # an attempt runs: refusals are no longer in a row
            store_wait.reset(self.job)  # an attempt runs: its store answered
            if not self.job.started_time:
                self.job.started_time = self.now
        if to in TERMINAL:
            self.job.finished_time = self.now
            self.job.pending_reason = ""
        if to != PENDING:
            self.job.pending_reason = ""
        if message:
            self.job.message = message
        return self._event(type_, frm, to, reason=reason, actor=actor, message=message, details=details)

    def note(self, type_: str, *, reason: str = "", actor: str = "scheduler", message: str = "",
             details: dict[str, str] | None = None) -> pb.JobEvent:
        """An event that does not change the phase (progress, checkpoint, cancel requested)."""
        return self._event(type_, self.job.phase, self.job.phase, reason=reason, actor=actor,
                           message=message, details=details)

    def ranks_started_at(self, spawn_time: float, *, ran_to_completion: bool = False) -> None:
        """A LAUNCHING attempt's ranks were started at ``spawn_time`` (the agent's
        AttemptTimings): the time before that is the queue's (or a requeue's), the time
        since is start-up (goodput.starting_s), or productive when the attempt already
        finished without ever reporting running (a short ``-- CMD`` job: it worked all
        along). Called just before the move out of LAUNCHING, which then charges ~0."""
        j = self.job
        if j.phase != LAUNCHING or not j.phase_time or not spawn_time:
            return
        spawn = min(self.now, max(j.phase_time, spawn_time))
        now = self.now
        self.now = spawn
        try:
            self._charge(LAUNCHING)
        finally:
            self.now = now
        elapsed = max(0.0, now - spawn)
        if ran_to_completion:
            j.goodput.productive_s += elapsed
        else:
            j.goodput.starting_s += elapsed
        j.phase_time = now

    def lose_work(self, cause: Family) -> float:
        """The running attempt died without a checkpoint now: the time since its last
        durable checkpoint (or its start) was not productive after all. Returns seconds."""
        g = self.job.goodput
        if self.job.phase == RUNNING:
            self._charge(RUNNING)
            self.job.phase_time = self.now
        since = max(self.job.last_checkpoint_time, self.job.attempt_started_time)
        if not since:
            return 0.0
        lost = max(0.0, min(self.now - since, g.productive_s))
        g.productive_s -= lost
        bucket = cause.goodput_field
        setattr(g, bucket, getattr(g, bucket) + lost)
        return lost

    def _charge(self, frm: int) -> None:
        """Credit ``now - phase_time`` to the goodput bucket of phase ``frm``."""
        if not self.job.phase_time:
            return
        elapsed = max(0.0, self.now - self.job.phase_time)
        g = self.job.goodput
        cause = self.job.requeue_cause
        if frm in HOLDING:
            charge_money(self.job, frm, elapsed)
        if frm == RUNNING:
            g.productive_s += elapsed
            return
        if frm in (PENDING, ADMITTED) or (frm == LAUNCHING and not cause):
            bucket = _bucket(cause, "queued_s")
        elif frm in (CHECKPOINTING, SUSPENDED, MIGRATING):
            bucket = _bucket(self.job.stop_reason or cause, "lost_migration_s")
        else:  # LAUNCHING after a requeue
            bucket = _bucket(cause, "lost_failure_s")
        setattr(g, bucket, getattr(g, bucket) + elapsed)
