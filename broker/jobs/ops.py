"""Job operations the servicers and the scheduler call: read what a transition needs,
bind it to its input, hand it to the applier.

Why this layer is thin: the decisions live in :mod:`broker.jobs.transitions`,
:mod:`broker.jobs.updates` and :mod:`broker.jobs.recovery` (pure); the writes and
commands in :mod:`broker.jobs.applier`. What is left here is the I/O a decision
needs first (is the team known, is the agent connected, which bucket does its region
use) and the one piece of per-process state: the progress-write throttle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from broker.agents.registry import AgentState
from broker.api import validation
from broker.api.errors import BrokerError, FailedPrecondition
from broker.ids import new_job_id
from broker.jobs import (
    checkpoint_shares,
    loss_series,
    migration,
    node_recovery,
    precopy,
    standby,
    transitions,
    updates,
)
from broker.jobs.applier import Applier
from broker.jobs.causes import Cause
from broker.jobs.lifecycle import FAILED, HOLDING, LAUNCHING, TERMINAL
from broker.jobs.outcome import Outcome
from broker.jobs.priority_classes import PriorityClasses
from broker.jobs.recovery import RelaunchPlan, Signal, StopPlan, Trigger, plan_stop
from broker.logs import JobLogs
from broker.store.base import KIND_TEAM, AlreadyExists, NotFound
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

if TYPE_CHECKING:
    import placement

log = logging.getLogger(__name__)


class JobOps:
    """Every job write the API and the scheduler make, each one transition."""

    def __init__(self, applier: Applier) -> None:
        self.applier = applier
        # The applier's collaborators, for reads (it is the only writer).
        self.config, self._store, self.agents = applier.config, applier.store, applier.agents
        self.telemetry, self.clock = applier.telemetry, applier.clock
        self.started_time = self.clock()
        self._progress_lock = threading.Lock()
        # job_id -> (last progress write time, last step with a "progress" event)
        self._progress_marks: dict[str, tuple[float, int]] = {}
        # job_id -> (step, loss) reported since its last progress write: the loss curve
        # gets every reported step although writes are throttled (broker/jobs/loss_series.py).
        self._loss_buffer: dict[str, list[tuple[int, float]]] = {}
        self.job_logs = JobLogs(self._store, self.config.log_max_bytes_per_attempt)  # rank output
        # The live priority classes (config defaults + API state), cached for the scheduler.
        self.priorities = PriorityClasses(self._store, self.config)
        # Teams whose record exists: team records are never deleted, so a team seen once
        # needs no store read on its next submit (one read fewer per SubmitJob).
        self._known_teams: set[str] = set()

    def _apply(self, job_id: str, fn: Callable[..., Outcome | None], inp: object,
               current: pb.Job | None = None) -> Outcome | None:
        return self.applier.apply(job_id, lambda job, now: fn(job, inp, now, self.config), current)

    def poke(self) -> None:
        """Wake the scheduler (capacity, quotas or plans changed outside a job write)."""
        self.applier.poke()

    def priority_of(self, spec: pb.JobSpec) -> int:
        return self.priorities.value_of(spec.priority_class)

    # ---- users ---------------------------------------------------------------------------
    def submit(self, spec: pb.JobSpec, client_request_id: str, actor: str) -> tuple[pb.Job, bool]:
        with self.priorities.submitting():  # its class cannot be deleted meanwhile
            return self._submit(spec, client_request_id, actor)

    def _submit(self, spec: pb.JobSpec, client_request_id: str, actor: str) -> tuple[pb.Job, bool]:
        """Validate, then create. A repeated ``client_request_id`` answers the job the
        first request made: found by the create itself (the store refuses a second job
        with the id, AlreadyExists), not by a read before it, so a new submit (nearly
        all of them) costs no extra store read. A repeat whose spec fails validation now
        (its priority class deleted, its region gone) still answers the first job: the
        request-id lookup runs on that error path before the refusal is raised."""
        store = self._store
        try:
            self._admissible(spec)
        except BrokerError:
            existing = (store.find_job_by_request_id(spec.team, client_request_id)
                        if client_request_id else None)
            if existing is not None:
                store.confirm_replicated()  # answered as submitted: on a replica first
                return existing, False
            raise
        out = transitions.submit(
            transitions.Submit(job_id=new_job_id(), spec=spec, client_request_id=client_request_id,
                               actor=actor, regions_known=self.agents.any_registered()),
            self.clock(), self.config)
        self.telemetry.stamp_job(out.job)  # the job's traceparent (JobService opened its span)
        try:
            return self.applier.create(out).job, True
        except AlreadyExists:
            existing = store.find_job_by_request_id(spec.team, client_request_id)
            if existing is None:
                raise
            # A retried submit whose first create reached only the primary (its WAIT timed
            # out: UNAVAILABLE) finds its job here; answering it acknowledges that create.
            store.confirm_replicated()
            return existing, False

    def _admissible(self, spec: pb.JobSpec) -> None:
        """The spec's checks against the live classes, teams and regions; raises."""
        validation.validate_spec(spec, self.priorities.values())
        if spec.team not in self._known_teams:
            if self._store.get_record(KIND_TEAM, spec.team, cpb.TeamQuota) is None:
                if not self.config.auto_create_teams:
                    raise FailedPrecondition(
                        f"team {spec.team!r} does not exist; an operator creates it with"
                        f" `brokerctl teams set {spec.team} --gpus N` (SetTeamQuota)"
                    )
                self._store.put_record(KIND_TEAM, spec.team, cpb.TeamQuota(team=spec.team))
            self._known_teams.add(spec.team)
        validation.check_feasible(spec, [list(a.record.nodes) for a in self.agents.all()])

    def cancel(self, job_id: str, reason: str, actor: str) -> pb.Job:
        def step(job: pb.Job, now: float) -> Outcome | None:
            agent = self.agents.get(job.placement.agent_id) if job.phase in HOLDING else None
            inp = transitions.Cancel(actor=actor, reason=reason,
                                     agent_connected=agent is not None and agent.connected)
            return transitions.cancel(job, inp, now, self.config)

        out = self.applier.apply(job_id, step)
        return out.job if out is not None else self.applier.get(job_id)

    def share_checkpoints(self, job_id: str, grantee_team: str, actor: str) -> pb.CheckpointShare:
        """Record (or keep) the share of ``job_id``'s checkpoints with ``grantee_team``;
        the caller checked who may (checkpoint_shares.check_may_grant)."""
        self.applier.apply(job_id, lambda job, now: checkpoint_shares.grant(job, grantee_team, actor, now))
        share = checkpoint_shares.active_share(self.applier.get(job_id), grantee_team)
        assert share is not None  # just written (or already in force)
        return share

    def revoke_checkpoint_share(self, job_id: str, share_id: str, actor: str) -> pb.CheckpointShare:
        self.applier.apply(job_id, lambda job, now: checkpoint_shares.revoke(job, share_id, actor, now))
        job = self.applier.get(job_id)
        return next(s for s in job.checkpoint_shares if s.id == share_id)

    # ---- scheduler ---------------------------------------------------------------------------
    def launch(self, job_id: str, admission: placement.Admission, explanation: str = "",
               spare_nodes: tuple[str, ...] = ()) -> pb.Job | None:
        """Admit a queued job on ``admission``; the Launch goes out after the write."""
        agent = self.agents.get(admission.agent_id)
        if agent is None or not agent.connected:
            return None
        inp = transitions.Admit(admission=admission, nodes=agent.nodes_by_id(),
                                checkpoint_bucket=agent.record.checkpoint_bucket,
                                explanation=explanation, spare_nodes=spare_nodes)

        def step(job: pb.Job, now: float) -> Outcome | None:
            # a job starting from another job's checkpoints: the share must still be in
            # force (checkpoint_shares.py); one read of that job, only for such jobs
            src = job.spec.resume_source.job_id
            if src and not job.progress.last_checkpoint_uri:
                refusal = checkpoint_shares.launch_refusal(job, self.applier.find(src))
                if refusal:
                    return transitions.resume_refused(job, refusal, now, self.config)
            return transitions.admit(job, inp, now, self.config)

        out = self.applier.apply(job_id, step)
        return out.job if out is not None and out.job.phase not in TERMINAL else None

    def relaunch_after_node_loss(self, job_id: str, plan: RelaunchPlan,
                                 admission: placement.Admission | None,
                                 spare_nodes: tuple[str, ...] = ()) -> pb.Job | None:
        """Apply the recovery policy's NODE_LOST plan (broker/scheduling/replacements.py):
        in place, the job is admitted on ``admission`` (survivors plus spares) and the
        Launch goes out after the write; from the store, it stays queued."""
        admit = None
        if admission is not None:
            agent = self.agents.get(admission.agent_id)
            if agent is not None and agent.connected:
                admit = transitions.Admit(admission=admission,
                                          nodes=agent.nodes_by_id(),
                                          checkpoint_bucket=agent.record.checkpoint_bucket,
                                          spare_nodes=spare_nodes)
        inp = node_recovery.Decided(plan=plan, admit=admit)
        out = self._apply(job_id, node_recovery.decide, inp)
        return out.job if out is not None and out.job.phase not in TERMINAL else None

    def apply_grow(self, job_id: str, fn: Callable[..., Outcome | None], inp: object) -> pb.Job | None:
        """Apply one of broker/jobs/grow_back.py's transitions (the scheduler's
        grow-back step, broker/scheduling/grow_watch.py); the job as written, or None."""
        out = self._apply(job_id, fn, inp)
        return out.job if out is not None and out.job.phase not in TERMINAL else None

    def release_unplaced(self, job_id: str) -> pb.Job | None:
        """A held proactive move whose standby the scheduler could not place: Stop now."""
        out = self._apply(job_id, precopy.release_unplaced, None)
        return out.job if out is not None else None

    def reserve_standby(self, job_id: str, admission: placement.Admission) -> pb.Job | None:
        """Make-before-break: reserve ``admission`` for the moving job's standby attempt."""
        agent = self.agents.get(admission.agent_id)
        if agent is None or not agent.connected:
            return None
        inp = standby.ReserveStandby(admission=admission, nodes=agent.nodes_by_id(),
                                     checkpoint_bucket=agent.record.checkpoint_bucket)
        out = self._apply(job_id, standby.reserve, inp)
        return out.job if out is not None else None

    def standby_missing(self, job_id: str, agent_id: str) -> None:
        """A make-before-break standby its agent no longer runs: drop it."""
        self.applier.apply(job_id, lambda j, now: standby.standby_missing(j, agent_id, now))

    def resend_go(self, job: pb.Job, agent_id: str, attempt: int) -> None:
        """Re-send a promoted standby's Go (lost to a broker or stream restart)."""
        go = standby.go_due(job, agent_id, attempt)
        if go is not None:
            self.applier.run(go, job)

    def set_pending_reason(self, job_id: str, reason: str) -> None:
        self._apply(job_id, transitions.set_pending_reason, reason)

    # ---- recovery triggers ----------------------------------------------------------------
    def trigger(self, job_id: str, sig: Signal, *, actor: str, message: str,
                details: dict[str, str] | None = None) -> pb.Job | None:
        """Something happened to a job's attempt: its recovery policy decides the stop
        (or that there is none); the applier writes it and sends the Stop."""

        def step(job: pb.Job, now: float) -> Outcome | None:
            plan = plan_stop(sig, job, self.config, now)
            if plan is None:
                return None
            inp = transitions.StopRequest(plan=plan, actor=actor, message=message,
                                          details=tuple((details or {}).items()))
            return transitions.request_stop(job, inp, now, self.config)

        out = self.applier.apply(job_id, step)
        return out.job if out is not None else None

    def stop(self, job_id: str, plan: StopPlan, *, actor: str, message: str,
             details: dict[str, str] | None = None) -> pb.Job | None:
        """Apply an explicit stop plan (operators, tests); :meth:`trigger` is the usual door."""
        inp = transitions.StopRequest(plan=plan, actor=actor, message=message,
                                      details=tuple((details or {}).items()))
        out = self._apply(job_id, transitions.request_stop, inp)
        return out.job if out is not None else None

    def attempt_lost(self, job_id: str, agent_id: str, trigger: Trigger, *, message: str,
                     attempt: int | None = None, reason: str = "") -> Outcome | None:
        """The attempt on ``agent_id`` is gone: relaunch elsewhere from the last durable
        checkpoint, or finish a pending cancel."""

        def step(job: pb.Job, now: float) -> Outcome | None:
            plan = plan_stop(Signal(trigger), job, self.config, now)
            if plan is None:
                return None
            inp = transitions.AttemptLost(agent_id=agent_id, plan=plan, message=message,
                                          attempt=attempt, reason=reason)
            return transitions.attempt_lost(job, inp, now, self.config)

        out = self.applier.apply(job_id, step)
        self._count_refusal(out)
        return out

    def _count_refusal(self, out: Outcome | None) -> None:
        """A refused (or unstartable) launch was written: count it by region and outcome."""
        if out is not None and any(e.type == "launch_refused" or (
                e.reason == Cause.LAUNCH_REFUSED and e.from_phase != e.to_phase) for e in out.events):
            self.telemetry.launch_refused(out.job.placement.region, gave_up=out.job.phase == FAILED)

    def refusals_forgotten(self, job_id: str, agent_id: str) -> None:
        """``agent_id`` changed its configuration: it may take ``job_id`` again at once."""
        self._apply(job_id, transitions.refusals_forgotten, agent_id)

    def forgive_exclusions(self, forgive: dict[str, tuple[str, ...]]) -> list[pb.Job]:
        """Let pending jobs try nodes they avoided (broker/scheduling/exclusions.py)."""
        out = []
        for job_id, nodes in forgive.items():
            done = self._apply(job_id, transitions.exclusions_forgiven, nodes)
            if done is not None:
                log.info("job %s: trying %s again (no other capacity)", job_id, ", ".join(nodes))
                out.append(done.job)
        return out

    # ---- housekeeping (scheduler pass) -------------------------------------------------------
    def housekeeping(self, live: Iterable[pb.Job]) -> list[pb.Job]:
        """Lost agents, unanswered stops and cancels, jobs on unknown agents. Returns the
        jobs it changed (as stored), so the pass goes on without re-reading the store."""
        now = self.clock()
        in_grace = now - self.started_time < self.config.grace_s
        changed: list[pb.Job] = []

        def keep(out: Outcome | None) -> None:
            if out is not None:
                changed.append(out.job)

        holding = [j for j in live if j.phase in HOLDING]
        if not in_grace:
            for agent in self.agents.expired(self.config.agent_timeout_s):
                silent = now - agent.last_seen
                log.warning("agent %s lost (silent %.1fs)", agent.agent_id, silent)
                self.agents.mark_lost(agent.agent_id)
                for job in holding:
                    if job.placement.agent_id == agent.agent_id:
                        keep(self.attempt_lost(
                            job.id, agent.agent_id, Trigger.AGENT_LOST,
                            message=f"agent {agent.agent_id} lost (no message for {silent:.0f}s)"))
        done = {j.id for j in changed}
        # The plain case, nearly every job at fleet scale (10,000 running), in two field
        # reads: on a registered agent not lost, no stop in flight (stop_due and the
        # pre-copy hold both need one). Per job, the full checks below cost a lock and
        # a dozen field reads: ~15% of a leader's CPU at 10,000 running.
        fine = {a.agent_id for a in self.agents.all() if not a.lost}
        for job in holding:
            if not job.stop_reason and job.placement.agent_id in fine:
                continue
            if job.id in done:
                continue
            agent = self.agents.get(job.placement.agent_id)
            if agent is None and not in_grace:
                keep(self.attempt_lost(job.id, job.placement.agent_id, Trigger.AGENT_LOST,
                                       message=f"agent {job.placement.agent_id!r} is not registered"))
            elif agent is not None and agent.lost:
                keep(self.attempt_lost(job.id, agent.agent_id, Trigger.AGENT_LOST,
                                       message=f"agent {agent.agent_id} lost"))
            elif transitions.stop_due(job, now, self.config):
                keep(self._apply(job.id, transitions.stop_timed_out,
                                 transitions.StopTimeout(attempt=job.attempt)))
            elif precopy.expired(job, now):  # a pre-copy hold ran out: the Stop goes now
                keep(self._apply(job.id, precopy.release_expired, None))
        return changed

    # ---- agent updates --------------------------------------------------------------------
    def handle_update(self, agent: AgentState, u: apb.JobUpdate, job: pb.Job | None = None) -> None:
        """Apply one JobUpdate (contracts "Agent stream semantics" rules 3-5): fenced by
        attempt and agent; a stale or unknown attempt is told to stop. ``job``: the job
        as the caller just read it (saves a store read per report; writes re-read it)."""
        try:
            job = job if job is not None and job.id == u.job_id else self._store.get_job(u.job_id)
        except NotFound:
            log.warning("update for unknown job %s from %s: stopping it", u.job_id, agent.agent_id)
            if u.state not in updates.ATTEMPT_TERMINAL:
                self.applier.fence(agent.agent_id, u.job_id, u.attempt)
            return
        if standby.is_standby(job, agent.agent_id, u.attempt):  # make-before-break, before its go
            if u.state in updates.ATTEMPT_TERMINAL:
                self.applier.apply(u.job_id, lambda j, now: standby.standby_ended(j, agent.agent_id, u, now))
            elif u.HasField("transfer"):  # its pre-copy ended: the held Stop goes
                self._apply(u.job_id, precopy.reported, u)
            return
        if not transitions.is_current(job, agent.agent_id, u.attempt):
            if u.state not in updates.ATTEMPT_TERMINAL:
                self.applier.fence(agent.agent_id, u.job_id, u.attempt)
            else:  # a superseded attempt's end: its durable work still counts
                self._apply(u.job_id, updates.attempt_ended,
                            updates.AgentUpdate(agent_id=agent.agent_id, update=u))
            return
        inp = updates.AgentUpdate(agent_id=agent.agent_id, update=u)
        if u.HasField("transfer"):
            self._apply(u.job_id, updates.transfer, inp)
        if u.state in updates.ATTEMPT_TERMINAL:
            ended = self._apply(u.job_id, updates.attempt_ended, inp, current=job)
            self._count_refusal(ended)  # exit -1 before RUNNING: backs off like a refusal
            if ended is not None:
                with self._progress_lock:
                    self._progress_marks.pop(u.job_id, None)
                    self._loss_buffer.pop(u.job_id, None)
        else:
            self._progress(job, inp)

    def _progress(self, job: pb.Job, inp: updates.AgentUpdate) -> None:
        """Progress writes are throttled (``progress_write_interval_s``) except when they
        matter: a new durable checkpoint, LAUNCHING -> RUNNING, a move's first step, the
        ranks beginning or ending a wait for their store."""
        u = inp.update
        if updates.tells_nothing_new(job, u):
            return  # e.g. a heartbeat re-listing progress already stored
        now = self.clock()
        every = self.config.progress_event_every_steps
        has = u.HasField("progress")
        with self._progress_lock:
            last_write, last_ev_step = self._progress_marks.get(job.id, (0.0, -1))
            if has and u.progress.loss > 0 and u.progress.step > 0:
                buf = self._loss_buffer.setdefault(job.id, [])
                if not buf or buf[-1] != (u.progress.step, u.progress.loss):
                    buf.append((u.progress.step, u.progress.loss))
                del buf[:-loss_series.MAX_POINTS]  # a stalled writer keeps the newest
        new_ckpt = has and u.progress.last_checkpoint_uri and (
            u.progress.last_checkpoint_step != job.progress.last_checkpoint_step
            or u.progress.last_checkpoint_uri != job.progress.last_checkpoint_uri)
        started = job.phase == LAUNCHING and u.state in (apb.ATTEMPT_STATE_RUNNING,
                                                         apb.ATTEMPT_STATE_CHECKPOINTING)
        step = u.progress.step if has else 0
        want_event = has and (last_ev_step < 0 or step // every > last_ev_step // every
                              or job.attempt_started_time == 0)
        due = now - last_write >= self.config.progress_write_interval_s
        first = has and migration.first_step_due(job, u.progress)
        new_ranks = 0 < u.ranks != job.placement.ranks  # the ranks it started: written once
        # the ranks began or stopped waiting for their store: shown at once
        waits = u.HasField("store_wait") != bool(job.store_wait.ranks_since)
        if not (new_ckpt or started or due or first or new_ranks or waits
                or (want_event and last_ev_step < 0)):
            return
        with self._progress_lock:
            points = tuple(self._loss_buffer.pop(job.id, ()))
        inp = updates.AgentUpdate(agent_id=inp.agent_id, update=u, progress_event=bool(want_event),
                                  loss_points=points)
        if self._apply(job.id, updates.progress, inp, current=job) is not None:
            with self._progress_lock:
                self._progress_marks[job.id] = (now, step if want_event else last_ev_step)

    def fence(self, agent_id: str, job_id: str, attempt: int) -> None:
        self.applier.fence(agent_id, job_id, attempt)

    @staticmethod
    def is_current(job: pb.Job, agent_id: str, attempt: int) -> bool:
        return transitions.is_current(job, agent_id, attempt)

