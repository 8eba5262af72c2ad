"""The broker's job operations: submit, cancel, launch, stop, agent updates, loss.

Servicers (jobs/capacity/agent) and the scheduler loop are thin: they call these.
Every state change goes through :class:`broker.jobs.lifecycle.Lifecycle` (one CAS write
of job + events); commands to agents are sent *after* the write commits, so an
agent never runs something the store does not know about (a crash between the two
leaves a LAUNCHING job whose Launch was never sent: the agent's reconcile or its
timeout relaunches it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.agents.registry import AgentRegistry, AgentState
from broker.api import validation
from broker.api.errors import FailedPrecondition
from broker.config import BrokerConfig
from broker.ids import new_job_id
from broker.jobs import migration
from broker.jobs.hub import EventHub
from broker.jobs.lifecycle import (
    ADMITTED,
    CANCELLED,
    CHECKPOINTING,
    FAILED,
    HOLDING,
    LAUNCHING,
    MIGRATING,
    PENDING,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    Lifecycle,
    Tx,
    phase_name,
)
from broker.logs import JobLogs
from broker.store.base import KIND_TEAM, AlreadyExists, NotFound, Store
from broker.store.jobs_query import iter_jobs
from broker.telemetry import BrokerTelemetry
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

if TYPE_CHECKING:
    import placement

log = logging.getLogger(__name__)

STOP_REASONS = {
    "cancel": apb.STOP_REASON_CANCEL,
    "preempt": apb.STOP_REASON_PREEMPT,
    "migrate": apb.STOP_REASON_MIGRATE,
    "drain": apb.STOP_REASON_DRAIN,
}
EXIT_CONFIG_ERROR = 2


class BrokerCore:
    """Job operations over one store; shared by every servicer and the scheduler."""

    def __init__(self, config: BrokerConfig, store: Store, clock: Callable[[], float] = time.time):
        self.config = config
        self.store = store
        self.clock = clock
        self.hub = EventHub()
        self.lifecycle = Lifecycle(store, self.hub, clock)
        self.agents = AgentRegistry(store, clock)
        self.started_time = clock()
        self._poke: Callable[[], None] = lambda: None
        self._progress_lock = threading.Lock()
        # job_id -> (last progress write time, last step with a "progress" event)
        self._progress_marks: dict[str, tuple[float, int]] = {}
        self.job_logs = JobLogs(store, config.log_max_bytes_per_attempt)  # rank output
        self.telemetry = BrokerTelemetry()  # spans always (no-op unless tracing); metrics once started

    def set_poke(self, poke: Callable[[], None]) -> None:
        self._poke = poke

    def poke(self) -> None:
        self._poke()

    # ---- helpers -------------------------------------------------------------------
    def priority_of(self, spec: pb.JobSpec) -> int:
        cls = spec.priority_class or self.config.default_priority_class
        return self.config.priority_classes.get(cls, 0)

    def checkpoint_uri_for(self, job: pb.Job, agent: AgentState | None) -> str:
        """Where attempt ``job.attempt`` writes: ``<root>/attempt-<n>`` (attempt-fenced).

        ``<root>`` is the user's URI, else ``<region bucket>/jobs/<job_id>`` (TEAM.md
        rule 7). Why one directory per attempt (docs/contracts.md section 3): a stale
        attempt (its agent was partitioned, declared lost, and came back before it was
        told to stop) keeps writing checkpoints for a while; in its own directory it can
        never overwrite, prune or out-step the new attempt's checkpoints, and the new
        attempt never picks them up, because ``resume_from`` always names the exact
        durable checkpoint the broker recorded from the *current* attempt. The same
        idea as Kubernetes' resourceVersion or a fencing token in a lock service: the
        token (attempt) is part of the write location, so no store-side check is needed.
        """
        if job.spec.checkpoint_uri:
            root = job.spec.checkpoint_uri.rstrip("/")
        else:
            base = (agent.record.checkpoint_bucket if agent else "") or self.config.checkpoint_root
            root = f"{base.rstrip('/')}/jobs/{job.id}"
        return f"{root}/attempt-{job.attempt}"

    # ---- submit ----------------------------------------------------------------------
    def submit(self, spec: pb.JobSpec, client_request_id: str, actor: str) -> tuple[pb.Job, bool]:
        validation.validate_spec(spec, self.config.priority_classes)
        if client_request_id:
            existing = self.store.find_job_by_request_id(spec.team, client_request_id)
            if existing is not None:
                return existing, False
        if self.store.get_record(KIND_TEAM, spec.team, cpb.TeamQuota) is None:
            if not self.config.auto_create_teams:
                raise FailedPrecondition(
                    f"team {spec.team!r} does not exist; an operator creates it with"
                    f" `brokerctl teams set {spec.team} --gpus N` (SetTeamQuota)"
                )
            self.store.put_record(KIND_TEAM, spec.team, cpb.TeamQuota(team=spec.team))
        clusters = [list(a.record.nodes) for a in self.agents.all()]
        validation.check_feasible(spec, clusters)
        now = self.clock()
        job = pb.Job(id=new_job_id(), phase=PENDING, client_request_id=client_request_id,
                     created_time=now, updated_time=now, phase_time=now)
        job.spec.CopyFrom(spec)
        if not job.spec.priority_class:
            job.spec.priority_class = self.config.default_priority_class
        if not self.agents.any_registered():
            job.pending_reason = "no regions registered yet"
        self.telemetry.stamp_job(job)  # the job's traceparent (JobService opened its span)
        res = spec.resources
        ev = pb.JobEvent(
            job_id=job.id, time=now, from_phase=pb.JOB_PHASE_UNSPECIFIED, to_phase=PENDING,
            type="submitted", reason="submitted", actor=actor,
            message=f"submitted by {actor}: {res.nodes} node(s) x {res.gpus_per_node} GPU(s),"
                    f" priority {job.spec.priority_class}",
        )
        try:
            stored = self.lifecycle.create(job, [ev])
        except AlreadyExists:
            existing = self.store.find_job_by_request_id(spec.team, client_request_id)
            if existing is None:
                raise
            return existing, False
        self.poke()
        return stored, True

    # ---- cancel ----------------------------------------------------------------------
    def cancel(self, job_id: str, reason: str, actor: str) -> pb.Job:
        send_stop: list[pb.Job] = []

        def fn(tx: Tx) -> bool:
            job = tx.job
            send_stop.clear()
            if job.phase in TERMINAL:
                raise FailedPrecondition(
                    f"job {job_id} already finished ({phase_name(job.phase)}); nothing to cancel"
                )
            msg = f"cancelled by {actor}" + (f": {reason}" if reason else "")
            agent = self.agents.get(job.placement.agent_id) if job.phase in HOLDING else None
            if job.phase in HOLDING and agent is not None and agent.connected:
                if job.stop_reason == "cancel":
                    return False  # already asked; the agent's answer (or the timeout) ends it
                job.stop_reason = "cancel"
                job.stop_requested_time = tx.now
                tx.note("cancel_requested", reason="user_cancel", actor=actor, message=msg)
                send_stop.append(job)
                return True
            tx.move(CANCELLED, "cancelled", reason="user_cancel", actor=actor, message=msg)
            return True

        stored = self.lifecycle.mutate(job_id, fn)
        if stored is None:
            return self.lifecycle.get(job_id)
        if send_stop:
            self._send_stop(stored, "cancel", checkpoint_first=False, grace_s=0)
        else:
            self.poke()
        return stored

    # ---- launch (scheduler) -------------------------------------------------------------
    def launch(self, job_id: str, admission: placement.Admission, explanation: str = "") -> pb.Job | None:
        """Admit a queued job on ``admission`` and send the agent its Launch."""
        agent = self.agents.get(admission.agent_id)
        if agent is None or not agent.connected:
            return None
        nodes = {n.id: n for n in agent.record.nodes}

        def fn(tx: Tx) -> bool:
            job = tx.job
            if job.phase not in QUEUED:
                return False
            pl = pb.Placement(
                region=admission.region, agent_id=admission.agent_id,
                capacity_type=int(admission.capacity_type), pool=admission.pool,
                price_per_gpu_hour=admission.price_per_gpu_hour,
                explanation=admission.explanation or explanation,
            )
            for node_id, gpus in admission.assignments:
                n = nodes.get(node_id)
                pl.nodes.add(node_id=node_id, gpus=gpus, zone=n.zone if n else "",
                             network_layer_3=n.network_layer_3 if n else "",
                             ultraserver_id=n.ultraserver_id if n else "")
            pl.world_size = sum(g for _, g in admission.assignments)
            job.placement.CopyFrom(pl)
            where = f"{admission.region}/{admission.agent_id} on {len(admission.assignments)} node(s)"
            if job.phase == PENDING:
                tx.move(ADMITTED, "admitted", reason="placed", actor="scheduler",
                        message=f"admitted to {where}: {pl.explanation}",
                        details={"nodes": ",".join(n for n, _ in admission.assignments)})
            relaunch = job.attempt > 0
            job.attempt += 1
            if relaunch:
                job.relaunches += 1
            ckpt = self.checkpoint_uri_for(job, agent)
            resume = job.progress.last_checkpoint_uri
            cause = "migrated" if job.phase == MIGRATING else ("relaunch" if relaunch else "launch")
            migration.launched(job, tx.now, resume)
            tx.move(LAUNCHING, "launched", reason=cause, actor="scheduler",
                    message=f"attempt {job.attempt} launching in {where}"
                            + (f", resuming from {resume}" if resume else ""),
                    details={"checkpoint_uri": ckpt, "resume_from": resume,
                             "agent": admission.agent_id, "world_size": str(pl.world_size)})
            job.stop_reason = ""
            job.stop_requested_time = 0.0
            return True

        stored = self.lifecycle.mutate(job_id, fn)
        if stored is None:
            return None
        msg = apb.BrokerMessage(launch=apb.Launch(
            job_id=stored.id, attempt=stored.attempt, spec=stored.spec, placement=stored.placement,
            checkpoint_uri=self.checkpoint_uri_for(stored, agent),
            resume_from=stored.progress.last_checkpoint_uri,
            transfer_mode=self.config.migration_transfer_mode,
        ))
        self.telemetry.launched(stored, msg.launch)  # span + TRACEPARENT in the Launch env
        if not self.agents.send(admission.agent_id, msg, "launch", stored.id, stored.attempt):
            log.warning("launch of %s attempt %d: agent %s went away; reconcile/timeout will "
                        "relaunch", stored.id, stored.attempt, admission.agent_id)
        return stored

    # ---- stop (preempt / drain / migrate) -----------------------------------------------
    def request_stop(self, job_id: str, why: str, *, actor: str, reason: str, message: str,
                     grace_s: float | None = None, details: dict[str, str] | None = None) -> pb.Job | None:
        """Ask a job's current attempt to checkpoint and stop (``why``: preempt|drain|migrate).

        RUNNING -> CHECKPOINTING and Stop{checkpoint_first}; a job not yet running
        (ADMITTED/LAUNCHING) has nothing to save: it is stopped and requeued at once.
        """
        grace = self.config.preempt_grace_s if grace_s is None else grace_s
        plan: dict[str, object] = {}

        def fn(tx: Tx) -> bool:
            job = tx.job
            plan.clear()
            if job.phase not in HOLDING or job.stop_reason:
                return False
            if job.phase == RUNNING:
                job.stop_reason = why
                job.stop_requested_time = tx.now
                migration.begin(job, tx.now, reason or why)
                tx.move(CHECKPOINTING, _STOP_EVENT[why], reason=reason, actor=actor,
                        message=message, details=details)
                plan["checkpoint_first"] = True
            elif job.phase == CHECKPOINTING:
                return False
            else:
                old = pb.Job()
                old.CopyFrom(job)
                plan["old"] = old
                cause = "preemption" if why == "preempt" else "migration"
                job.requeue_cause = cause
                migration.begin(job, tx.now, reason or why)
                migration.stopped(job, tx.now, saved=False)
                _requeue_open(job)
                tx.move(PENDING, "requeued", reason=reason, actor=actor,
                        message=message + " (not started yet: requeued without checkpoint)",
                        details=details)
                plan["checkpoint_first"] = False
            return True

        stored = self.lifecycle.mutate(job_id, fn)
        if stored is None:
            return None
        if plan.get("checkpoint_first"):
            self._send_stop(stored, why, checkpoint_first=True, grace_s=grace)
        else:
            old = plan["old"]
            assert isinstance(old, pb.Job)
            self._send_stop(old, why, checkpoint_first=False, grace_s=0)
            self.poke()
        return stored

    def _send_stop(self, job: pb.Job, why: str, *, checkpoint_first: bool, grace_s: float) -> bool:
        msg = apb.BrokerMessage(stop=apb.Stop(
            job_id=job.id, attempt=job.attempt, reason=STOP_REASONS.get(why, apb.STOP_REASON_UNSPECIFIED),
            checkpoint_first=checkpoint_first, grace_s=grace_s))
        self.telemetry.stop_sent(job, why, checkpoint_first=checkpoint_first, grace_s=grace_s)
        return self.agents.send(job.placement.agent_id, msg, "stop", job.id, job.attempt)

    def send_stale_stop(self, agent: AgentState, job_id: str, attempt: int) -> None:
        """Fencing: tell an agent to kill an attempt the broker no longer wants (rate-limited)."""
        now = self.clock()
        key = (job_id, attempt)
        if now - agent.stale_stops.get(key, 0.0) < max(5.0, self.config.heartbeat_interval_s * 2):
            return
        agent.stale_stops[key] = now
        msg = apb.BrokerMessage(stop=apb.Stop(job_id=job_id, attempt=attempt,
                                              reason=apb.STOP_REASON_STALE_ATTEMPT,
                                              checkpoint_first=False, grace_s=0))
        self.agents.send(agent.agent_id, msg, "stop", job_id, attempt)
        log.info("stale attempt %s#%d on %s: sent Stop{STALE_ATTEMPT}", job_id, attempt, agent.agent_id)

    # ---- agent updates ------------------------------------------------------------------
    def is_current(self, job: pb.Job, agent_id: str, attempt: int) -> bool:
        return (job.attempt == attempt and job.placement.agent_id == agent_id
                and job.phase in HOLDING)

    def handle_update(self, agent: AgentState, u: apb.JobUpdate) -> None:
        """Apply one JobUpdate (TEAM.md rules 3-5): fenced by attempt and agent."""
        try:
            job = self.store.get_job(u.job_id)
        except NotFound:
            log.warning("update for unknown job %s from %s: stopping it", u.job_id, agent.agent_id)
            if u.state not in _ATTEMPT_TERMINAL:
                self.send_stale_stop(agent, u.job_id, u.attempt)
            return
        if not self.is_current(job, agent.agent_id, u.attempt):
            if u.state not in _ATTEMPT_TERMINAL:
                self.send_stale_stop(agent, u.job_id, u.attempt)
            return
        if u.HasField("transfer"):
            self._transfer(agent, u)
        if u.state in _ATTEMPT_TERMINAL:
            self._finish_attempt(agent, u)
        else:
            self._progress(agent, job, u)

    def _transfer(self, agent: AgentState, u: apb.JobUpdate) -> None:
        """Checkpoint copy into the new region's store (reported by the destination agent):
        kept on the open Migration; events when it starts, at each quarter, and at its end."""
        actor = f"agent:{agent.agent_id}"
        t = u.transfer

        def fn(tx: Tx) -> bool:
            j = tx.job
            if not self.is_current(j, agent.agent_id, u.attempt):
                return False
            m = migration.open_migration(j)
            before = pb.TransferStats()
            if m is not None and m.to_attempt == j.attempt:
                before.CopyFrom(m.transfer)
            migration.transfer(j, t)
            details = {"src": t.src_uri, "dst": t.dst_uri, "bytes_total": str(t.bytes_total),
                       "bytes_done": str(t.bytes_done), "method": t.method}
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
            return True

        self.lifecycle.mutate(u.job_id, fn)

    def _migration_first_step(self, tx: Tx, u: apb.JobUpdate, force: bool = False) -> None:
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
        tx.note("migration_completed", reason=m.cause, actor="broker",
                message=f"moved {m.from_region} -> {m.to_region} (world size {m.from_world_size}"
                        f" -> {m.to_world_size}) in {m.total_s:.1f}s: checkpoint {m.checkpoint_s:.1f}s,"
                        f" queue {m.queue_s:.2f}s, transfer {m.transfer_s:.1f}s, launch {m.launch_s:.1f}s,"
                        f" first step {m.first_step_s:.1f}s; orchestration {m.orchestration_s:.2f}s",
                details=migration.timing_details(m))

    def _apply_progress(self, tx: Tx, u: apb.JobUpdate, actor: str) -> None:
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

    def _progress(self, agent: AgentState, job: pb.Job, u: apb.JobUpdate) -> None:
        now = self.clock()
        every = self.config.progress_event_every_steps
        with self._progress_lock:
            last_write, last_ev_step = self._progress_marks.get(job.id, (0.0, -1))
        new_ckpt = u.HasField("progress") and u.progress.last_checkpoint_uri and (
            u.progress.last_checkpoint_step != job.progress.last_checkpoint_step
            or u.progress.last_checkpoint_uri != job.progress.last_checkpoint_uri)
        transition = job.phase == LAUNCHING and u.state in (apb.ATTEMPT_STATE_RUNNING,
                                                            apb.ATTEMPT_STATE_CHECKPOINTING)
        step = u.progress.step if u.HasField("progress") else 0
        want_event = u.HasField("progress") and (
            last_ev_step < 0 or step // every > last_ev_step // every or job.attempt_started_time == 0)
        due = now - last_write >= self.config.progress_write_interval_s
        first = u.HasField("progress") and migration.first_step_due(job, u.progress)
        if not (new_ckpt or transition or due or first or (want_event and last_ev_step < 0)):
            return
        actor = f"agent:{agent.agent_id}"
        emitted: list[int] = []

        def fn(tx: Tx) -> bool:
            emitted.clear()
            j = tx.job
            if not self.is_current(j, agent.agent_id, u.attempt):
                return False
            if j.phase == LAUNCHING and u.state in (apb.ATTEMPT_STATE_RUNNING,
                                                     apb.ATTEMPT_STATE_CHECKPOINTING):
                tx.move(RUNNING, "running", reason="started", actor=actor,
                        message=f"attempt {j.attempt} running on {j.placement.region}")
                migration.running(j, tx.now, u.timings if u.HasField("timings") else None)
            elif j.phase == LAUNCHING and not u.HasField("progress"):
                return False
            self._migration_first_step(tx, u)
            self._apply_progress(tx, u, actor)
            if want_event:
                tx.note("progress", reason="progress", actor=actor,
                        message=f"step {step}/{u.progress.total_steps}",
                        details={"step": str(step), "loss": f"{u.progress.loss:.4f}",
                                 "tokens_per_s": f"{u.progress.tokens_per_s:.1f}"})
                emitted.append(step)
            return True

        stored = self.lifecycle.mutate(job.id, fn)
        if stored is not None:
            with self._progress_lock:
                self._progress_marks[job.id] = (now, emitted[0] if emitted else last_ev_step)

    def _finish_attempt(self, agent: AgentState, u: apb.JobUpdate) -> None:
        actor = f"agent:{agent.agent_id}"
        S = apb

        def fn(tx: Tx) -> bool:
            j = tx.job
            if not self.is_current(j, agent.agent_id, u.attempt):
                return False
            self._apply_progress(tx, u, actor)
            why = j.stop_reason
            detail = u.message.strip().splitlines()[-1][:500] if u.message.strip() else ""
            if u.state == S.ATTEMPT_STATE_SUCCEEDED:
                self._migration_first_step(tx, u, force=True)
                if j.phase == LAUNCHING:
                    tx.move(RUNNING, "running", reason="started", actor=actor)
                tx.move(SUCCEEDED, "succeeded", reason="completed", actor=actor,
                        message=f"attempt {j.attempt} finished all steps")
                return True
            if why == "cancel":
                tx.move(CANCELLED, "cancelled", reason="user_cancel", actor=actor,
                        message=f"attempt {j.attempt} stopped on cancel")
                return True
            if u.state == S.ATTEMPT_STATE_CHECKPOINTED or (
                    u.state in (S.ATTEMPT_STATE_STOPPED, S.ATTEMPT_STATE_FAILED) and why):
                saved = u.state == S.ATTEMPT_STATE_CHECKPOINTED
                lost = 0.0
                if not saved:
                    lost = tx.lose_work(why or "failure")
                migration.stopped(j, tx.now, saved=saved,
                                  timings=u.timings if u.HasField("timings") else None,
                                  work_lost_s=lost)
                _requeue_open(j)
                self.stopped_to_queue(tx, why or "migrate", actor=actor, saved=saved,
                                      detail=detail)
                return True
            if u.state == S.ATTEMPT_STATE_STOPPED:
                # Stopped without being asked (agent-side decision): relaunch.
                tx.lose_work("failure")
                self.requeue(tx, "failure", reason="stopped_by_agent", actor=actor,
                             message=f"attempt {j.attempt} was stopped by the agent; relaunching")
                return True
            # FAILED
            tx.lose_work("failure")
            m = migration.open_migration(j)
            if m is not None:  # e.g. the transfer failed: the move goes on with the relaunch
                m.message = f"attempt {j.attempt} failed: {detail}"[:500]
                _requeue_open(j)
            if u.exit_code == EXIT_CONFIG_ERROR:
                tx.move(FAILED, "failed", reason="config_error", actor=actor,
                        message=f"attempt {j.attempt} failed with a configuration error"
                                f" (exit 2), retrying will not help: {detail}",
                        details={"exit_code": str(u.exit_code)})
                return True
            if j.restarts >= self.config.max_restarts:
                tx.move(FAILED, "failed", reason="max_restarts", actor=actor,
                        message=f"attempt {j.attempt} failed (exit {u.exit_code}) and the job"
                                f" already restarted {j.restarts} time(s): giving up: {detail}",
                        details={"exit_code": str(u.exit_code)})
                return True
            j.restarts += 1
            for n in u.failed_nodes:
                if n not in j.excluded_nodes:
                    j.excluded_nodes.append(n)
            self.requeue(tx, "failure", reason="auto_resume", actor=actor,
                         message=f"attempt {j.attempt} failed (exit {u.exit_code}): relaunching"
                                 f" ({j.restarts}/{self.config.max_restarts})"
                                 + (f" avoiding {', '.join(u.failed_nodes)}" if u.failed_nodes else "")
                                 + (f": {detail}" if detail else ""),
                         details={"exit_code": str(u.exit_code),
                                  "failed_nodes": ",".join(u.failed_nodes)})
            return True

        if self.lifecycle.mutate(u.job_id, fn) is not None:
            with self._progress_lock:
                self._progress_marks.pop(u.job_id, None)
            self.poke()

    def stopped_to_queue(self, tx: Tx, why: str, *, actor: str, saved: bool, detail: str = "") -> None:
        """An attempt we asked to stop has stopped: route it by why it was stopped.

        preempt -> CHECKPOINTING -> SUSPENDED -> PENDING; drain/migrate ->
        CHECKPOINTING -> MIGRATING (placed elsewhere next, MIGRATING -> LAUNCHING).
        """
        j = tx.job
        what = (f"checkpoint at step {j.progress.last_checkpoint_step} saved" if saved
                else "stopped without a new checkpoint")
        if j.phase in (ADMITTED, LAUNCHING):
            self.requeue(tx, "preemption" if why == "preempt" else "migration",
                         reason=why, actor=actor, message=f"attempt {j.attempt} {what}; requeued")
            return
        if j.phase == RUNNING:
            tx.move(CHECKPOINTING, _STOP_EVENT.get(why, "checkpointing"), reason=why, actor=actor)
        if why == "preempt":
            tx.move(SUSPENDED, "suspended", reason="preempted", actor=actor,
                    message=f"attempt {j.attempt} {what}; suspended")
            j.requeue_cause = "preemption"
            tx.move(PENDING, "requeued", reason="preempted", actor=actor,
                    message="waiting for capacity to resume from its checkpoint")
        else:
            j.requeue_cause = "migration"
            tx.move(MIGRATING, "migrating", reason=why, actor=actor,
                    message=f"attempt {j.attempt} {what}; moving to new capacity"
                            + (f" ({detail})" if detail and not saved else ""))

    def requeue(self, tx: Tx, cause: str, *, reason: str, actor: str, message: str,
                details: dict[str, str] | None = None) -> None:
        """Back to PENDING for a relaunch (attempt+1 at the next launch)."""
        j = tx.job
        j.requeue_cause = cause
        j.stop_reason = ""
        j.stop_requested_time = 0.0
        tx.move(PENDING, "requeued", reason=reason, actor=actor, message=message, details=details)

    # ---- loss / timeouts ----------------------------------------------------------------
    def fail_over(self, job_id: str, agent_id: str, *, reason: str, message: str,
                  attempt: int | None = None) -> pb.Job | None:
        """The attempt on ``agent_id`` is gone (agent lost, attempt missing): relaunch
        elsewhere from the last durable checkpoint, or finish a pending cancel."""

        def fn(tx: Tx) -> bool:
            j = tx.job
            if j.phase not in HOLDING or j.placement.agent_id != agent_id:
                return False
            if attempt is not None and j.attempt != attempt:
                return False
            if j.stop_reason == "cancel":
                tx.move(CANCELLED, "cancelled", reason="user_cancel", actor="broker",
                        message=f"cancelled ({message})")
                return True
            cause = {"preempt": "preemption", "drain": "migration",
                     "migrate": "migration"}.get(j.stop_reason, "failure")
            lost = tx.lose_work(cause)
            migration.begin(j, tx.now, reason)
            migration.stopped(j, tx.now, saved=False, work_lost_s=lost)
            _requeue_open(j)
            ck = j.progress.last_checkpoint_uri
            self.requeue(tx, cause, reason=reason, actor="broker",
                         message=f"{message}; relaunching attempt {j.attempt + 1} "
                                 + (f"from checkpoint step {j.progress.last_checkpoint_step}"
                                    if ck else "from the start (no durable checkpoint yet)"),
                         details={"agent": agent_id, "work_lost_s": f"{lost:.1f}",
                                  "resume_from": ck})
            return True

        stored = self.lifecycle.mutate(job_id, fn)
        if stored is not None:
            self.poke()
        return stored

    def agent_lost(self, agent: AgentState) -> list[str]:
        """No message for agent_timeout_s: its nodes leave the snapshot and its jobs move."""
        silent = self.clock() - agent.last_seen
        log.warning("agent %s lost (silent %.1fs)", agent.agent_id, silent)
        self.agents.mark_lost(agent.agent_id)
        moved = []
        for job in iter_jobs(self.store, phases=HOLDING):
            if job.placement.agent_id != agent.agent_id:
                continue
            if self.fail_over(job.id, agent.agent_id, reason="agent_lost",
                              message=f"agent {agent.agent_id} lost (no message for {silent:.0f}s)"):
                moved.append(job.id)
        return moved

    def housekeeping(self, live_jobs: list[pb.Job]) -> None:
        """Timeouts: lost agents, unanswered stops and cancels, jobs on unknown agents."""
        now = self.clock()
        in_grace = now - self.started_time < self.config.grace_s
        timeout = self.config.agent_timeout_s
        if not in_grace:
            for agent in self.agents.expired(timeout):
                self.agent_lost(agent)
        for job in live_jobs:
            if job.phase not in HOLDING:
                continue
            agent = self.agents.get(job.placement.agent_id)
            if agent is None and not in_grace:
                self.fail_over(job.id, job.placement.agent_id, reason="agent_lost",
                               message=f"agent {job.placement.agent_id!r} is not registered")
                continue
            if agent is not None and agent.lost:
                self.fail_over(job.id, agent.agent_id, reason="agent_lost",
                               message=f"agent {agent.agent_id} lost")
                continue
            if job.stop_reason and job.stop_requested_time:
                limit = (self.config.cancel_timeout_s if job.stop_reason == "cancel"
                         else self.config.preempt_grace_s + self.config.stop_timeout_s)
                if now - job.stop_requested_time > limit:
                    self._stop_timed_out(job)

    def _stop_timed_out(self, job: pb.Job) -> None:
        attempt, agent_id = job.attempt, job.placement.agent_id

        def fn(tx: Tx) -> bool:
            j = tx.job
            if j.phase not in HOLDING or j.attempt != attempt or not j.stop_reason:
                return False
            if j.stop_reason == "cancel":
                tx.move(CANCELLED, "cancelled", reason="cancel_timeout", actor="broker",
                        message="the agent did not confirm the stop in time; cancelled anyway")
                return True
            lost = tx.lose_work(j.stop_reason)
            migration.stopped(j, tx.now, saved=False, work_lost_s=lost)
            self.stopped_to_queue(tx, j.stop_reason, actor="broker", saved=False,
                                  detail="no answer to the stop in time")
            return True

        if self.lifecycle.mutate(job.id, fn) is not None:
            agent = self.agents.get(agent_id)
            if agent is not None:
                self.send_stale_stop(agent, job.id, attempt)
            self.poke()


def _requeue_open(job: pb.Job) -> None:
    """An open move whose new attempt is gone again waits for capacity once more."""
    m = migration.open_migration(job)
    if m is not None and m.state != "checkpointing":
        m.state = "queued"


_ATTEMPT_TERMINAL = frozenset({
    apb.ATTEMPT_STATE_SUCCEEDED, apb.ATTEMPT_STATE_FAILED, apb.ATTEMPT_STATE_CHECKPOINTED,
    apb.ATTEMPT_STATE_STOPPED,
})
_STOP_EVENT = {"preempt": "preempted", "drain": "draining", "migrate": "migrating_out",
               "cancel": "cancel_requested"}
