"""Pure transitions for what an agent reports about an attempt (``JobUpdate``).

Three inputs: progress (STARTING/RUNNING/CHECKPOINTING with steps and checkpoints),
a checkpoint transfer report, and the attempt's end (SUCCEEDED / FAILED /
CHECKPOINTED / STOPPED). All are fenced: only the job's current attempt on its own
agent changes the job. What happens after an attempt ends by itself is the recovery
policy's call (:meth:`broker.jobs.recovery.RecoveryPolicy.restart`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.jobs import migration
from broker.jobs.causes import Cause, Family, StopKind
from broker.jobs.lifecycle import CANCELLED, FAILED, LAUNCHING, RUNNING, SUCCEEDED, Tx
from broker.jobs.outcome import Outcome, WakeScheduler, begin, seal
from broker.jobs.recovery import Restart, policy_for
from broker.jobs.transitions import (
    is_current,
    note_move_completed,
    requeue,
    requeue_open,
    stopped_to_queue,
)
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

if TYPE_CHECKING:
    from broker.config import BrokerConfig

ATTEMPT_TERMINAL = frozenset({
    apb.ATTEMPT_STATE_SUCCEEDED, apb.ATTEMPT_STATE_FAILED, apb.ATTEMPT_STATE_CHECKPOINTED,
    apb.ATTEMPT_STATE_STOPPED,
})
_STARTED = (apb.ATTEMPT_STATE_RUNNING, apb.ATTEMPT_STATE_CHECKPOINTING)


@dataclass(frozen=True)
class AgentUpdate:
    """One JobUpdate from ``agent_id``; ``progress_event``: also record a "progress"
    event (the caller's throttle decides, so history keeps one every N steps)."""

    agent_id: str
    update: apb.JobUpdate
    progress_event: bool = False

    @property
    def actor(self) -> str:
        return f"agent:{self.agent_id}"


def progress(job: pb.Job, inp: AgentUpdate, now: float, config: BrokerConfig) -> Outcome | None:
    """LAUNCHING -> RUNNING on the first running report; progress and checkpoints copied."""
    u = inp.update
    if not is_current(job, inp.agent_id, u.attempt):
        return None
    tx = begin(job, now)
    j = tx.job
    if j.phase == LAUNCHING and u.state in _STARTED:
        tx.move(RUNNING, "running", reason="started", actor=inp.actor,
                message=f"attempt {j.attempt} running on {j.placement.region}")
        migration.running(j, now, u.timings if u.HasField("timings") else None)
    elif j.phase == LAUNCHING and not u.HasField("progress"):
        return None
    first_step_after_move(tx, u)
    apply_progress(tx, u, inp.actor)
    if inp.progress_event and u.HasField("progress"):
        tx.note("progress", reason="progress", actor=inp.actor,
                message=f"step {u.progress.step}/{u.progress.total_steps}",
                details={"step": str(u.progress.step), "loss": f"{u.progress.loss:.4f}",
                         "tokens_per_s": f"{u.progress.tokens_per_s:.1f}"})
    return seal(tx)


def transfer(job: pb.Job, inp: AgentUpdate, now: float, config: BrokerConfig) -> Outcome | None:
    """Checkpoint copy into the new region's store (reported by the destination agent):
    kept on the open Migration; events when it starts, at each quarter, and at its end."""
    u = inp.update
    if not is_current(job, inp.agent_id, u.attempt):
        return None
    t = u.transfer
    tx = begin(job, now)
    j = tx.job
    m = migration.open_migration(j)
    before = pb.TransferStats()
    if m is not None and m.to_attempt == j.attempt:
        before.CopyFrom(m.transfer)
    migration.transfer(j, t)
    details = {"src": t.src_uri, "dst": t.dst_uri, "bytes_total": str(t.bytes_total),
               "bytes_done": str(t.bytes_done), "method": t.method}
    actor = inp.actor
    if t.error:
        tx.note("transfer_failed", reason="transfer_failed", actor=actor,
                message=f"checkpoint transfer failed: {t.error}", details=details)
    elif t.done and not before.done:
        details.update({"seconds": f"{t.seconds:.2f}", "mb_per_s": f"{t.mb_per_s:.1f}",
                        "retries": str(t.retries)})
        tx.note("transfer_done", reason="transfer_done", actor=actor,
                message=f"checkpoint copied to {j.placement.region}: {t.bytes_total / 1e6:.1f} MB"
                        f" in {t.seconds:.2f}s ({t.mb_per_s:.0f} MB/s, {t.method})",
                details=details)
    elif not before.start_time and not t.done:
        tx.note("transfer_started", reason="transfer_started", actor=actor,
                message=f"copying checkpoint {t.src_uri} -> {t.dst_uri}"
                        f" ({t.bytes_total / 1e6:.1f} MB, {t.method})", details=details)
    elif t.bytes_total and not t.done:
        q_old = 4 * before.bytes_done // t.bytes_total
        q_new = 4 * t.bytes_done // t.bytes_total
        if q_new > q_old:
            tx.note("transfer_progress", reason="transfer_progress", actor=actor,
                    message=f"checkpoint transfer {100 * t.bytes_done // t.bytes_total}%"
                            f" ({t.bytes_done / 1e6:.1f}/{t.bytes_total / 1e6:.1f} MB)",
                    details=details)
    return seal(tx)


def attempt_ended(job: pb.Job, inp: AgentUpdate, now: float, config: BrokerConfig) -> Outcome | None:
    """The attempt reported its end: finish, requeue by the stop it answered, or let
    the recovery policy decide by exit code."""
    u = inp.update
    if not is_current(job, inp.agent_id, u.attempt):
        return None
    tx = begin(job, now)
    j = tx.job
    actor = inp.actor
    apply_progress(tx, u, actor)
    kind = StopKind.parse(j.stop_reason)
    detail = u.message.strip().splitlines()[-1][:500] if u.message.strip() else ""
    S = apb
    if u.state == S.ATTEMPT_STATE_SUCCEEDED:
        first_step_after_move(tx, u, force=True)
        if j.phase == LAUNCHING:
            tx.move(RUNNING, "running", reason="started", actor=actor)
        tx.move(SUCCEEDED, "succeeded", reason="completed", actor=actor,
                message=f"attempt {j.attempt} finished all steps")
        return seal(tx, WakeScheduler())
    if kind is StopKind.CANCEL:
        tx.move(CANCELLED, "cancelled", reason=Cause.USER_CANCEL.value, actor=actor,
                message=f"attempt {j.attempt} stopped on cancel")
        return seal(tx, WakeScheduler())
    if u.state == S.ATTEMPT_STATE_CHECKPOINTED or (
            u.state in (S.ATTEMPT_STATE_STOPPED, S.ATTEMPT_STATE_FAILED) and kind is not None):
        saved = u.state == S.ATTEMPT_STATE_CHECKPOINTED
        kind = kind or StopKind.MIGRATE
        lost = 0.0 if saved else tx.lose_work(kind.family)
        migration.stopped(j, now, saved=saved, timings=u.timings if u.HasField("timings") else None,
                          work_lost_s=lost)
        requeue_open(j)
        stopped_to_queue(tx, kind, actor=actor, saved=saved, detail=detail)
        return seal(tx, WakeScheduler())
    tx.lose_work(Family.FAILURE)
    if u.state == S.ATTEMPT_STATE_STOPPED:
        # Stopped without being asked (agent-side decision): relaunch.
        requeue(tx, Family.FAILURE, reason=Cause.STOPPED_BY_AGENT.value, actor=actor,
                message=f"attempt {j.attempt} was stopped by the agent; relaunching")
        return seal(tx, WakeScheduler())
    return _failed(tx, u, detail, actor, config)


def _failed(tx: Tx, u: apb.JobUpdate, detail: str, actor: str, config: BrokerConfig) -> Outcome:
    j = tx.job
    m = migration.open_migration(j)
    if m is not None:  # e.g. the transfer failed: the move goes on with the relaunch
        m.message = f"attempt {j.attempt} failed: {detail}"[:500]
        requeue_open(j)
    policy = policy_for(j, config)
    decision = policy.restart(u.exit_code, j, config)
    code = {"exit_code": str(u.exit_code)}
    if decision is Restart.FAIL_CONFIG:
        tx.move(FAILED, "failed", reason="config_error", actor=actor,
                message=f"attempt {j.attempt} failed with a configuration error"
                        f" (exit 2), retrying will not help: {detail}", details=code)
        return seal(tx, WakeScheduler())
    if decision is not Restart.RETRY:
        tx.move(FAILED, "failed", reason="max_restarts", actor=actor,
                message=f"attempt {j.attempt} failed (exit {u.exit_code}) and the job"
                        f" already restarted {j.restarts} time(s): giving up: {detail}", details=code)
        return seal(tx, WakeScheduler())
    j.restarts += 1
    avoid = policy.exclude_after_failure(tuple(u.failed_nodes))
    j.excluded_nodes.extend(n for n in avoid if n not in j.excluded_nodes)
    requeue(tx, Family.FAILURE, reason=Cause.ATTEMPT_FAILED.value, actor=actor,
            message=f"attempt {j.attempt} failed (exit {u.exit_code}): relaunching"
                    f" ({j.restarts}/{config.max_restarts})"
                    + (f" avoiding {', '.join(avoid)}" if avoid else "")
                    + (f": {detail}" if detail else ""),
            details={**code, "failed_nodes": ",".join(u.failed_nodes)})
    return seal(tx, WakeScheduler())


def first_step_after_move(tx: Tx, u: apb.JobUpdate, force: bool = False) -> None:
    """Close the open move at the new attempt's first step after its resume."""
    j = tx.job
    if not u.HasField("progress"):
        if not force:
            return
    elif not (force or migration.first_step_due(j, u.progress)):
        return
    m = migration.open_migration(j)
    if m is None or m.to_attempt != j.attempt or not m.launched_time:
        return
    if u.HasField("timings"):
        migration.running(j, tx.now, u.timings)
    m = migration.finish(j, tx.now, u.progress.updated_time if u.HasField("progress") else tx.now)
    if m is None:
        return
    note_move_completed(tx, m)


def apply_progress(tx: Tx, u: apb.JobUpdate, actor: str) -> None:
    """Copy the update's progress into the job; a newly durable checkpoint is an event."""
    if not u.HasField("progress"):
        return
    job = tx.job
    old_ckpt = job.progress.last_checkpoint_step
    old_uri = job.progress.last_checkpoint_uri
    p = u.progress
    job.progress.CopyFrom(p)
    job.progress.updated_time = tx.now
    if not p.last_checkpoint_uri and old_uri:
        # Never forget a durable checkpoint because one report left it out.
        job.progress.last_checkpoint_uri = old_uri
        job.progress.last_checkpoint_step = max(old_ckpt, p.last_checkpoint_step)
    if p.last_checkpoint_uri and (p.last_checkpoint_step != old_ckpt or p.last_checkpoint_uri != old_uri):
        job.last_checkpoint_time = tx.now
        tx.note("checkpoint", reason="checkpoint_durable", actor=actor,
                message=f"checkpoint at step {p.last_checkpoint_step} is durable",
                details={"step": str(p.last_checkpoint_step), "uri": p.last_checkpoint_uri})
