"""Migration records: one ``Migration`` per move of a running job to other capacity.

Why a record on the job (``Job.migrations``) and not just events: a move spans two
attempts, two agents and up to four processes (old trainer, broker, mover, new
trainer); operators want one row per move with its timing breakdown (checkpoint,
queue, transfer, launch, first step after resume) and the share that is the broker's
own orchestration. Keeping it inside the job means it is written in the same
compare-and-set as the phase change that caused it (history can never disagree with
state) and it survives a broker restart with nothing extra to persist. SkyPilot's
managed-job recovery keeps a similar per-recovery record; Kueue records requeue
reasons on the workload itself.

The functions here only edit a :class:`broker.jobs.lifecycle.Tx` (pure apart from that), so
they may run several times when a CAS write is retried.

Milestones, in order (each sets a time and the ``state``)::

    begin (stop requested / loss detected)  -> checkpointing
    stopped (old attempt reported its end)  -> queued
    launched (new Launch sent)              -> launching
    transfer (agent copies the checkpoint)  -> transferring
    running (new attempt RUNNING)           -> starting
    first step after the resume             -> done  (durations derived, event "migration_completed")
"""

from __future__ import annotations

from broker.jobs.causes import Cause, MoveState
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

OPEN_STATES = frozenset(s.value for s in MoveState if s.open)
KEEP = 20  # migrations kept per job (oldest dropped)


def set_state(m: pb.Migration, state: MoveState) -> None:
    """The string (old readers) and the typed twin, always together."""
    m.state = state.value
    m.state_code = state.proto


def open_migration(job: pb.Job) -> pb.Migration | None:
    """The job's move in progress, if any (always the newest record)."""
    if job.migrations and job.migrations[-1].state in OPEN_STATES:
        return job.migrations[-1]
    return None


def close_landed(job: pb.Job, now: float) -> pb.Migration | None:
    """Close the open move if it already brought the job's *current* attempt here; return it.

    Why: a move stays open until the new attempt reports its first step after the resume.
    If that attempt is moved again first (a second spot notice, a drain right after a
    move), the new move is a different one: without closing the old record, ``begin``
    would reuse it, the second move would get no record, and the first would be closed by
    the third attempt's first step with the wrong destination. The landed move is DONE
    (first step as reported, else now: it was not reported in time, the message says so).
    A new attempt that never ran has not landed: its move goes on, re-routed (kept open).
    """
    m = open_migration(job)
    if m is None or not m.launched_time or m.to_attempt != job.attempt:
        return None
    if job.phase not in (pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_CHECKPOINTING):
        return None
    p = job.progress
    if p.step > m.checkpoint_step and p.updated_time:
        return finish(job, now, min(now, p.updated_time))
    done = finish(job, now, now)
    if done is not None:
        done.message = (f"attempt {job.attempt} was moved again before its first step after"
                        " the resume was reported")
    return done


def begin(job: pb.Job, now: float, cause: Cause | str, *, emergency: bool | None = None,
          message: str = "") -> pb.Migration:
    """Start recording a move of ``job``'s current attempt (idempotent while one is open
    for this attempt: a drain during a spot move does not start a second record; a move
    that already landed this attempt is closed first, see ``close_landed``)."""
    close_landed(job, now)
    m = open_migration(job)
    if m is not None:
        return m
    seq = job.migrations[-1].seq + 1 if job.migrations else 1
    text = cause.value if isinstance(cause, Cause) else cause
    typed = Cause.parse(text)
    m = job.migrations.add(
        job_id=job.id, job_name=job.spec.name, seq=seq, cause=text,
        cause_code=typed.proto if typed is not None else pb.MIGRATION_CAUSE_OTHER,
        emergency=(typed is not None and typed.emergency) if emergency is None else emergency,
        from_region=job.placement.region, from_agent=job.placement.agent_id,
        from_attempt=job.attempt, from_world_size=job.placement.world_size,
        from_ranks=job.placement.ranks, started_time=now, message=message,
        from_price_per_gpu_hour=job.placement.price_per_gpu_hour,
    )
    set_state(m, MoveState.CHECKPOINTING)
    if len(job.migrations) > KEEP:
        del job.migrations[: len(job.migrations) - KEEP]
    return m


def stopped(job: pb.Job, now: float, *, saved: bool, timings: apb.AttemptTimings | None = None,
            work_lost_s: float = 0.0) -> None:
    """The old attempt is gone (checkpointed, killed or lost): waiting for new capacity."""
    m = open_migration(job)
    if m is None or m.state != MoveState.CHECKPOINTING:
        return
    set_state(m, MoveState.QUEUED)
    m.checkpointed_time = now
    m.checkpoint_step = job.progress.last_checkpoint_step
    m.checkpoint_uri = job.progress.last_checkpoint_uri
    m.work_lost_s += work_lost_s
    if job.progress.step_time:  # the source's last step (trainer clock): downtime starts
        m.last_source_step_time = job.progress.step_time
    if not saved and not m.emergency:
        m.emergency = True  # had to be killed without its checkpoint
    if timings is not None:
        m.stop_signal_time = timings.stop_signal_time
        m.exit_time = timings.exit_time


def launched(job: pb.Job, now: float, resume_from: str) -> None:
    """A new attempt was placed and its Launch is about to be sent."""
    m = open_migration(job)
    if m is None:
        return
    if m.state == MoveState.CHECKPOINTING:  # relaunched before the old attempt's end was reported
        stopped(job, now, saved=bool(job.progress.last_checkpoint_uri))
    set_state(m, MoveState.LAUNCHING)
    m.launched_time = now
    m.to_region = job.placement.region
    m.to_agent = job.placement.agent_id
    m.to_attempt = job.attempt
    m.to_world_size = job.placement.world_size
    m.to_ranks = job.placement.ranks  # 0 until the new attempt's agent reports its ranks
    m.to_price_per_gpu_hour = job.placement.price_per_gpu_hour
    m.resume_from = resume_from
    m.checkpoint_step = job.progress.last_checkpoint_step
    m.checkpoint_uri = job.progress.last_checkpoint_uri
    m.ClearField("transfer")
    m.spawn_time = 0.0
    m.running_time = 0.0


def transfer(job: pb.Job, stats: pb.TransferStats) -> pb.Migration | None:
    """The destination agent reports checkpoint-copy progress (or its end)."""
    m = open_migration(job)
    if m is None or m.to_attempt != job.attempt:
        return None
    m.transfer.CopyFrom(stats)
    if stats.dst_uri and stats.done and not stats.error:
        m.resume_from = stats.dst_uri
        step = stats.src_uri.rstrip("/").rpartition("/")[2].removeprefix("step-")
        if step.isdigit() and int(step) > m.checkpoint_step:
            # The mover found a newer complete checkpoint than the one we knew of.
            m.checkpoint_step = int(step)
            m.checkpoint_uri = stats.src_uri
    if m.state in (MoveState.LAUNCHING, MoveState.TRANSFERRING):
        set_state(m, MoveState.STARTING if stats.done else MoveState.TRANSFERRING)
    return m


def running(job: pb.Job, now: float, timings: apb.AttemptTimings | None) -> None:
    m = open_migration(job)
    if m is None or m.to_attempt != job.attempt:
        return
    set_state(m, MoveState.STARTING)
    if not m.running_time:
        m.running_time = now
    if timings is not None and timings.spawn_time:
        m.spawn_time = timings.spawn_time


def first_step_due(job: pb.Job, progress: pb.Progress) -> bool:
    """True when ``progress`` is the first step the new attempt made after resuming."""
    m = open_migration(job)
    return (m is not None and m.to_attempt == job.attempt and m.launched_time > 0
            and progress.step > m.checkpoint_step)


def finish(job: pb.Job, now: float, first_step_time: float, *,
           state: MoveState = MoveState.DONE,
           message: str = "", resumed_time: float = 0.0) -> pb.Migration | None:
    """Close the open move and derive its durations; returns it (None if none was open)."""
    m = open_migration(job)
    if m is None:
        return None
    set_state(m, MoveState(state))
    m.finished_time = now
    if message:
        m.message = message
    if state != MoveState.DONE:
        return m
    m.first_step_time = first_step_time or now
    if not m.running_time:
        m.running_time = min(now, m.first_step_time)
    end = m.first_step_time
    m.checkpoint_s = max(0.0, m.checkpointed_time - m.started_time) if m.checkpointed_time else 0.0
    m.queue_s = max(0.0, m.launched_time - m.checkpointed_time) if m.checkpointed_time else 0.0
    m.transfer_s = m.transfer.seconds
    m.launch_s = max(0.0, m.running_time - m.launched_time)
    m.first_step_s = max(0.0, end - m.running_time)
    m.total_s = max(0.0, end - m.started_time)
    m.orchestration_s = orchestration_s(m)
    if m.last_source_step_time and resumed_time >= m.last_source_step_time:
        m.downtime_s = resumed_time - m.last_source_step_time  # last step -> training resumed
    return m


def orchestration_s(m: pb.Migration) -> float:
    """Total time minus what is not the broker's or the agents' doing: the trainer
    writing its checkpoint (SIGTERM -> exit), the bytes moved between stores, and the
    new processes starting, loading and making their first step (spawn -> first step).
    What is left is signalling, detection, scheduling and launch round trips. A lost
    agent's detection timeout (agent_timeout_s) is orchestration by this definition:
    use ``cause`` to tell those moves apart."""
    save = (m.exit_time - m.stop_signal_time) if m.exit_time and m.stop_signal_time else 0.0
    start = (m.first_step_time - m.spawn_time) if m.spawn_time else 0.0
    return max(0.0, m.total_s - max(0.0, save) - m.transfer.seconds - max(0.0, start))


def timing_details(m: pb.Migration) -> dict[str, str]:
    """The event details of a finished move (what ``brokerctl job`` shows)."""
    d = {
        "cause": m.cause, "from": f"{m.from_region}/{m.from_agent}", "to": f"{m.to_region}/{m.to_agent}",
        "world_size": f"{m.from_world_size}->{m.to_world_size}", "checkpoint_step": str(m.checkpoint_step),
        "ranks": f"{m.from_ranks or '?'}->{m.to_ranks or '?'}",
        "checkpoint_s": f"{m.checkpoint_s:.2f}", "queue_s": f"{m.queue_s:.2f}",
        "transfer_s": f"{m.transfer_s:.2f}", "launch_s": f"{m.launch_s:.2f}",
        "first_step_s": f"{m.first_step_s:.2f}", "total_s": f"{m.total_s:.2f}",
        "orchestration_s": f"{m.orchestration_s:.2f}", "emergency": str(m.emergency).lower(),
    }
    if m.make_before_break:
        d["make_before_break"] = "true"
        d["go_s"] = f"{max(0.0, m.go_time - m.checkpointed_time):.2f}"
    if m.downtime_s:
        d["downtime_s"] = f"{m.downtime_s:.2f}"
    if m.transfer.bytes_total:
        d.update({"transfer_bytes": str(m.transfer.bytes_total),
                  "transfer_mb_per_s": f"{m.transfer.mb_per_s:.1f}",
                  "transfer_method": m.transfer.method})
    return d


def estimate_move_s(job: pb.Job, *, floor_s: float, margin: float) -> float:
    """How long before a capacity deadline a planned move must start, learned from the
    job's own history: its last checkpoint (SIGTERM -> exit) plus its last transfer's
    bytes at that transfer's MB/s, times ``margin``; never less than ``floor_s``
    (a job that never moved yet gets the floor)."""
    ckpt = xfer = 0.0
    for m in reversed(job.migrations):
        if not ckpt and m.exit_time and m.stop_signal_time:
            ckpt = m.exit_time - m.stop_signal_time
        elif not ckpt and m.checkpoint_s and not m.emergency:
            ckpt = m.checkpoint_s
        if not xfer and m.transfer.bytes_total and m.transfer.mb_per_s > 0:
            xfer = m.transfer.bytes_total / (m.transfer.mb_per_s * 1e6)
        if ckpt and xfer:
            break
    return max(floor_s, margin * (ckpt + xfer))
