"""The broker's job state machine as pure functions: ``(job, input, now, config) -> Outcome``.

One function per input the broker reacts to: submit, admission, cancel, stop request
(any :class:`broker.jobs.recovery.StopPlan`), attempt lost, stop timeout, pending
reason. Agent job updates (progress, transfer, an attempt's end) are in
:mod:`broker.jobs.updates`. None of them reads a clock, a store or a socket, so they
are tested as tables (tests/jobs/test_transitions.py) and may be re-run when their
compare-and-set write loses a race. ``None`` means "nothing to write" (the job moved
on meanwhile). :mod:`broker.jobs.applier` writes the Outcome and runs its commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.api.errors import FailedPrecondition
from broker.jobs import backoff, below_size, migration, precopy, shown_progress, store_wait
from broker.jobs.causes import Cause, Family, MoveState, StopKind
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
    SUSPENDED,
    TERMINAL,
    Tx,
    phase_name,
)
from broker.jobs.outcome import Outcome, SendLaunch, SendStop, WakeScheduler, begin, seal
from broker.jobs.recovery import StopPlan
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

if TYPE_CHECKING:
    import placement
    from broker.config import BrokerConfig


# ---- inputs -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    job_id: str
    spec: pb.JobSpec
    client_request_id: str
    actor: str
    regions_known: bool


@dataclass(frozen=True)
class Admit:
    """The scheduler placed a queued job; ``nodes`` = the agent's node records by id."""

    admission: placement.Admission
    nodes: dict[str, pb.Node]
    checkpoint_bucket: str
    explanation: str = ""
    spare_nodes: tuple[str, ...] = ()  # its pool's spares now (Launch.spare_nodes)


@dataclass(frozen=True)
class Cancel:
    actor: str
    reason: str
    agent_connected: bool  # the job's agent can be told to stop


@dataclass(frozen=True)
class StopRequest:
    plan: StopPlan
    actor: str
    message: str
    details: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class AttemptLost:
    """The attempt on ``agent_id`` is gone (agent lost, attempt missing, launch refused)."""

    agent_id: str
    plan: StopPlan
    message: str
    attempt: int | None = None
    reason: str = ""  # a refused launch: the agent's own words (CommandAck.message)


@dataclass(frozen=True)
class StopTimeout:
    attempt: int


# ---- helpers --------------------------------------------------------------------------------
def checkpoint_uri_for(job: pb.Job, bucket: str, config: BrokerConfig) -> str:
    """Where attempt ``job.attempt`` writes: ``<root>/attempt-<n>`` (attempt-fenced).

    ``<root>`` is the user's URI, else ``<region bucket>/jobs/<job_id>`` (contracts
    "Agent stream semantics" rule 7). Why one directory per attempt (docs/contracts.md
    section 3): a stale attempt (its agent was partitioned, declared lost, and came
    back before it was told to stop) keeps writing checkpoints for a while; in its own
    directory it can never overwrite, prune or out-step the new attempt's checkpoints,
    and the new attempt never picks them up, because ``resume_from`` always names the
    exact durable checkpoint the broker recorded from the *current* attempt. The same
    idea as a fencing token in a lock service: the token (attempt) is part of the
    write location, so no store-side check is needed.
    """
    if job.spec.checkpoint_uri:
        root = job.spec.checkpoint_uri.rstrip("/")
    else:
        base = bucket or config.checkpoint_root
        root = f"{base.rstrip('/')}/jobs/{job.id}"
    return f"{root}/attempt-{job.attempt}"


def requeue(tx: Tx, cause: Family, *, reason: str, actor: str, message: str,
            details: dict[str, str] | None = None) -> None:
    """Back to PENDING for a relaunch (attempt+1 at the next launch)."""
    j = tx.job
    j.requeue_cause = cause.value
    j.stop_reason = ""
    j.stop_requested_time = 0.0
    tx.move(PENDING, "requeued", reason=reason, actor=actor, message=message, details=details)


def requeue_open(job: pb.Job) -> None:
    """An open move whose new attempt is gone again waits for capacity once more."""
    m = migration.open_migration(job)
    if m is not None and m.state != MoveState.CHECKPOINTING:
        migration.set_state(m, MoveState.QUEUED)


def stopped_to_queue(tx: Tx, kind: StopKind, *, actor: str, saved: bool, detail: str = "") -> None:
    """An attempt we asked to stop has stopped: route it by what the stop asked.

    preempt -> CHECKPOINTING -> SUSPENDED -> PENDING; drain/migrate ->
    CHECKPOINTING -> MIGRATING (placed elsewhere next, MIGRATING -> LAUNCHING).
    """
    j = tx.job
    what = (f"checkpoint at step {j.progress.last_checkpoint_step} saved" if saved
            else "stopped without a new checkpoint")
    if j.phase in (ADMITTED, LAUNCHING):
        requeue(tx, kind.family, reason=kind.value, actor=actor,
                message=f"attempt {j.attempt} {what}; requeued")
        return
    if j.phase == RUNNING:
        tx.move(CHECKPOINTING, kind.event, reason=kind.value, actor=actor)
    if kind is StopKind.PREEMPT:
        tx.move(SUSPENDED, "suspended", reason="preempted", actor=actor,
                message=f"attempt {j.attempt} {what}; suspended")
        j.requeue_cause = Family.PREEMPTION.value
        tx.move(PENDING, "requeued", reason="preempted", actor=actor,
                message="waiting for capacity to resume from its checkpoint")
    else:
        j.requeue_cause = Family.MIGRATION.value
        tx.move(MIGRATING, "migrating", reason=kind.value, actor=actor,
                message=f"attempt {j.attempt} {what}; moving to new capacity"
                        + (f" ({detail})" if detail and not saved else ""))


def is_current(job: pb.Job, agent_id: str, attempt: int) -> bool:
    """Fencing: only the job's current attempt on its own agent may change it."""
    return job.attempt == attempt and job.placement.agent_id == agent_id and job.phase in HOLDING


def stop_of(job: pb.Job, kind: StopKind | None, checkpoint_first: bool, grace_s: float) -> SendStop:
    """The Stop for ``job``'s current attempt on its agent."""
    return SendStop(agent_id=job.placement.agent_id, job_id=job.id, attempt=job.attempt,
                    kind=kind, checkpoint_first=checkpoint_first, grace_s=grace_s)


_stop_of = stop_of


# ---- transitions -------------------------------------------------------------------------
def submit(inp: Submit, now: float, config: BrokerConfig) -> Outcome:
    """A new PENDING job and its "submitted" event."""
    job = pb.Job(id=inp.job_id, phase=PENDING, client_request_id=inp.client_request_id,
                 owner=inp.actor,
                 created_time=now, updated_time=now, phase_time=now)
    job.spec.CopyFrom(inp.spec)
    if not job.spec.priority_class:
        job.spec.priority_class = config.default_priority_class
    if not inp.regions_known:
        job.pending_reason = "no regions registered yet"
    res = inp.spec.resources
    ev = pb.JobEvent(
        job_id=job.id, time=now, from_phase=pb.JOB_PHASE_UNSPECIFIED, to_phase=PENDING,
        type="submitted", reason="submitted", actor=inp.actor,
        message=f"submitted by {inp.actor}: {res.nodes} node(s) x {res.gpus_per_node} GPU(s),"
                f" priority {job.spec.priority_class}",
    )
    return Outcome(job=job, events=(ev,), commands=(WakeScheduler(new_job=True),))


def cancel(job: pb.Job, inp: Cancel, now: float, config: BrokerConfig) -> Outcome | None:
    """Cancel: a job holding GPUs on a connected agent is asked to stop (the agent's
    answer or the cancel timeout ends it); anything else is CANCELLED at once."""
    if job.phase in TERMINAL:
        raise FailedPrecondition(
            f"job {job.id} already finished ({phase_name(job.phase)}); nothing to cancel")
    tx = begin(job, now)
    j = tx.job
    msg = f"cancelled by {inp.actor}" + (f": {inp.reason}" if inp.reason else "")
    if j.phase in HOLDING and inp.agent_connected:
        if j.stop_reason == StopKind.CANCEL:
            return None  # already asked
        j.stop_reason = StopKind.CANCEL.value
        j.stop_requested_time = now
        tx.note("cancel_requested", reason=Cause.USER_CANCEL.value, actor=inp.actor, message=msg)
        return seal(tx, _stop_of(j, StopKind.CANCEL, False, 0.0))
    tx.move(CANCELLED, "cancelled", reason=Cause.USER_CANCEL.value, actor=inp.actor, message=msg)
    return seal(tx, WakeScheduler())


def placement_of(adm: placement.Admission, nodes: dict[str, pb.Node], explanation: str) -> pb.Placement:
    """The job's Placement record for an admission (also a standby's, broker.jobs.standby)."""
    pl = pb.Placement(
        region=adm.region, agent_id=adm.agent_id, capacity_type=int(adm.capacity_type),
        pool=adm.pool, price_per_gpu_hour=adm.price_per_gpu_hour,
        explanation=adm.explanation or explanation,
    )
    for node_id, gpus in adm.assignments:
        n = nodes.get(node_id)
        pl.nodes.add(node_id=node_id, gpus=gpus, zone=n.zone if n else "",
                     network_layer_3=n.network_layer_3 if n else "",
                     ultraserver_id=n.ultraserver_id if n else "")
    pl.world_size = sum(g for _, g in adm.assignments)
    return pl


def admit(job: pb.Job, inp: Admit, now: float, config: BrokerConfig) -> Outcome | None:
    """Place a queued job: ADMITTED (first time) -> LAUNCHING with attempt+1, and the
    Launch for the agent (resuming from the last durable checkpoint)."""
    if job.phase not in QUEUED:
        return None
    adm = inp.admission
    if adm.agent_id in backoff.avoided_agents(job, now):
        return None  # it refused this job lately (backoff.py); the snapshot should not offer it
    tx = begin(job, now)
    j = tx.job
    pl = placement_of(adm, inp.nodes, inp.explanation)
    j.placement.CopyFrom(pl)
    below_size.admitted(j, job.phase, now)  # placed on fewer nodes than asked: to grow back
    where = f"{adm.region}/{adm.agent_id} on {len(adm.assignments)} node(s)"
    if j.phase == PENDING:
        tx.move(ADMITTED, "admitted", reason="placed", actor="scheduler",
                message=f"admitted to {where}: {pl.explanation}",
                details={"nodes": ",".join(n for n, _ in adm.assignments)})
    relaunch = j.attempt > 0
    j.attempt += 1
    if relaunch:
        j.relaunches += 1
    ckpt = checkpoint_uri_for(j, inp.checkpoint_bucket, config)
    moved = store_wait.move_source(j, adm.region, now)
    if moved is not None:  # its own region's store stays down: resume where it can
        w = j.store_wait
        tx.note("moved", reason="store_outage", actor="scheduler",
                message=f"checkpoint store of {w.region} unreachable since"
                        f" {store_wait.clock(w.since)} ({backoff.seconds(now - w.since)}): resuming"
                        f" in {adm.region} from its durable checkpoint at step {moved.step}"
                        f" (the newer one at step {j.progress.last_checkpoint_step} is in the"
                        f" store that is down; steps after {moved.step} are redone)",
                details={"from_region": w.region, "to_region": adm.region,
                         "step": str(moved.step), "uri": moved.uri,
                         "unreachable_step": str(j.progress.last_checkpoint_step)})
        j.progress.last_checkpoint_step, j.progress.last_checkpoint_uri = moved.step, moved.uri
    # its own last durable checkpoint; before it has one, the shared checkpoint it starts
    # from (checked at submit and again just before this: broker/jobs/ops.py)
    resume = j.progress.last_checkpoint_uri or j.spec.resume_source.uri
    if relaunch:
        shown_progress.start_at_resume_step(j)
    why = "migrated" if j.phase == MIGRATING else ("relaunch" if relaunch else "launch")
    migration.launched(j, now, resume)
    tx.move(LAUNCHING, "launched", reason=why, actor="scheduler",
            message=f"attempt {j.attempt} launching in {where}"
                    + (f", resuming from {resume}" if resume else ""),
            details={"checkpoint_uri": ckpt, "resume_from": resume,
                     "agent": adm.agent_id, "world_size": str(pl.world_size),
                     # the console's timeline draws each attempt with its capacity type
                     "capacity_type": str(pl.capacity_type), "pool": pl.pool})
    j.stop_reason = ""
    j.stop_requested_time = 0.0
    launch = apb.Launch(job_id=j.id, attempt=j.attempt, spec=j.spec, placement=j.placement,
                        checkpoint_uri=ckpt, resume_from=resume,
                        transfer_mode=config.migration_transfer_mode,
                        spare_nodes=inp.spare_nodes)
    launch.env[store_wait.STORE_WAIT_ENV] = f"{store_wait.attempt_wait_s(j, now, config):g}"
    return seal(tx, SendLaunch(agent_id=adm.agent_id, launch=launch))


def resume_refused(job: pb.Job, message: str, now: float, config: BrokerConfig) -> Outcome | None:
    """A queued job whose shared starting checkpoint it may no longer read (the share was
    revoked, the job that wrote it is gone) fails instead of launching: starting from
    scratch would silently train something else (broker/jobs/checkpoint_shares.py)."""
    if job.phase not in QUEUED:
        return None
    tx = begin(job, now)
    tx.move(FAILED, "failed", reason="resume_not_shared", actor="broker",
            message=f"not launched: {message}",
            details={"resume_from": job.spec.resume_source.uri,
                     "source_job": job.spec.resume_source.job_id})
    return seal(tx, WakeScheduler())


def _ranks_change(m: pb.Migration) -> str:
    """``ranks 2 -> 1`` when both attempts reported their ranks, else the GPUs placed."""
    if m.from_ranks and m.to_ranks:
        return f"ranks {m.from_ranks} -> {m.to_ranks}"
    return f"world size {m.from_world_size} -> {m.to_world_size}"


def note_move_completed(tx: Tx, m: pb.Migration) -> None:
    """The ``migration_completed`` event of a closed move (what ``brokerctl job`` shows)."""
    tx.note("migration_completed", reason=m.cause, actor="broker",
            message=f"moved {m.from_region} -> {m.to_region} ({_ranks_change(m)})"
                    f" in {m.total_s:.1f}s: checkpoint {m.checkpoint_s:.1f}s,"
                    f" queue {m.queue_s:.2f}s, transfer {m.transfer_s:.1f}s, launch {m.launch_s:.1f}s,"
                    f" first step {m.first_step_s:.1f}s; orchestration {m.orchestration_s:.2f}s"
                    + (f"; downtime {m.downtime_s:.1f}s" if m.downtime_s else "")
                    + (" (make-before-break)" if m.make_before_break else "")
                    + (f" ({m.message})" if m.message else ""),
            details=migration.timing_details(m))


def begin_move(tx: Tx, now: float, cause: Cause) -> None:
    """Record the start of a move of the current attempt; a previous move that landed
    this attempt and was still waiting for its first step is closed first, with its event
    (``migration.close_landed``), so two quick moves are two records."""
    landed = migration.close_landed(tx.job, now)
    if landed is not None:
        note_move_completed(tx, landed)
    migration.begin(tx.job, now, cause)


def request_stop(job: pb.Job, inp: StopRequest, now: float, config: BrokerConfig) -> Outcome | None:
    """Apply a :class:`StopPlan` to the job's current attempt.

    RUNNING -> CHECKPOINTING and Stop{checkpoint_first}; a job not yet running
    (ADMITTED/LAUNCHING) has nothing to save: stopped and requeued at once. A job
    already stopping, or not holding GPUs, is left alone.
    """
    plan = inp.plan
    if precopy.held(job) is not None:  # a planned move's Stop waits for its pre-copy: now
        return precopy.urgent(job, plan, now)
    if job.phase not in HOLDING or job.stop_reason or job.phase == CHECKPOINTING:
        return None
    tx = begin(job, now)
    j = tx.job
    if plan.family is Family.PREEMPTION:  # counted against BrokerConfig.preempt_budget
        j.preemptions += 1
    add = [n for n in plan.exclude_nodes if n not in j.excluded_nodes]
    j.excluded_nodes.extend(add)
    details = dict(inp.details)
    if j.phase == RUNNING and plan.checkpoint_first:
        hold = precopy.wanted(j, plan, config)
        j.stop_reason = plan.kind.value
        begin_move(tx, now, plan.cause)
        if hold:  # pre-copy first: the Stop waits (broker/jobs/precopy.py), training goes on
            precopy.hold(j, plan, now, config)
            details["precopy_from"] = j.progress.last_checkpoint_uri
        else:
            j.stop_requested_time = now
            m = migration.open_migration(j)
            if m is not None:
                m.stop_sent_time = now
        tx.move(CHECKPOINTING, plan.kind.event, reason=plan.cause.value, actor=inp.actor,
                message=inp.message + (" (the stop waits until the destination region holds the"
                                       " last periodic checkpoint)" if hold else ""),
                details=details)
        # make-before-break: the scheduler places the move's standby now, not at its next pass
        wake = (WakeScheduler(),) if config.make_before_break else ()
        stop = () if hold else (_stop_of(j, plan.kind, True, plan.grace_s),)
        return seal(tx, *stop, *wake)
    stop = _stop_of(job, plan.kind, False, 0.0)  # the old attempt, before the requeue
    lost = tx.lose_work(plan.family) if j.phase == RUNNING else 0.0
    j.requeue_cause = plan.family.value
    begin_move(tx, now, plan.cause)
    migration.stopped(j, now, saved=False, work_lost_s=lost)
    requeue_open(j)
    suffix = (" (not started yet: requeued without checkpoint)" if j.phase != RUNNING
              else " (stopped without checkpoint)")
    tx.move(PENDING, "requeued", reason=plan.cause.value, actor=inp.actor,
            message=inp.message + suffix, details=details)
    return seal(tx, stop, WakeScheduler())


def attempt_lost(job: pb.Job, inp: AttemptLost, now: float, config: BrokerConfig) -> Outcome | None:
    """The attempt is gone without a word: relaunch from the last durable checkpoint
    (attempt+1 at the next admission), or finish a pending cancel."""
    if job.phase not in HOLDING or job.placement.agent_id != inp.agent_id:
        return None
    if inp.attempt is not None and job.attempt != inp.attempt:
        return None
    tx = begin(job, now)
    j = tx.job
    if j.stop_reason == StopKind.CANCEL:
        tx.move(CANCELLED, "cancelled", reason=Cause.USER_CANCEL.value, actor="broker",
                message=f"cancelled ({inp.message})")
        return seal(tx, WakeScheduler())
    inflight = StopKind.parse(j.stop_reason)
    family = inflight.family if inflight is not None else Family.FAILURE
    refused = inp.plan.cause is Cause.LAUNCH_REFUSED
    decision = backoff.decide(j, inp.agent_id, inp.reason, now, config) if refused else None
    if decision is not None:
        _note_refusal(tx, inp, decision)
        if decision.action is backoff.RefusalAction.GIVE_UP:
            tx.move(FAILED, "failed", reason=Cause.LAUNCH_REFUSED.value, actor="broker",
                    message=backoff.give_up_message(j, inp.agent_id, inp.reason),
                    details={"agent": inp.agent_id, "refusals": str(j.launch_refusals)})
            return seal(tx, WakeScheduler())
    lost = tx.lose_work(family)
    begin_move(tx, now, inp.plan.cause)
    migration.stopped(j, now, saved=False, work_lost_s=lost)
    requeue_open(j)
    ck = j.progress.last_checkpoint_uri
    what, avoid = inp.message, ""
    if decision is not None:
        if not decision.distinct:  # the launch_refused event already says why
            what = f"agent {inp.agent_id} refused the launch again, same reason"
        avoid = (f" (not placed on {inp.agent_id} again for {backoff.seconds(decision.delay_s)};"
                 f" {j.launch_refusals} refusal(s) in a row)")
    requeue(tx, family, reason=inp.plan.cause.value, actor="broker",
            message=f"{what}{avoid}; relaunching attempt {j.attempt + 1} "
                    + (f"from checkpoint step {j.progress.last_checkpoint_step}" if ck
                       else f"from job {j.spec.resume_source.job_id}'s shared checkpoint"
                       if j.spec.resume_source.uri
                       else "from the start (no durable checkpoint yet)"),
            details={"agent": inp.agent_id, "work_lost_s": f"{lost:.1f}", "resume_from": ck})
    if decision is not None:
        j.pending_reason = backoff.pending_note(j, now)
    return seal(tx, WakeScheduler())


def _note_refusal(tx: Tx, inp: AttemptLost, d: backoff.RefusalDecision) -> None:
    """Record a refused launch on the job; a distinct one (new agent or new reason) is
    also a ``launch_refused`` event, a repeat is not (the requeue event says it)."""
    j = tx.job
    backoff.record(j, inp.agent_id, j.placement.region, inp.reason, d, tx.now)
    if d.distinct:
        tx.note("launch_refused", reason=Cause.LAUNCH_REFUSED.value, actor=f"agent:{inp.agent_id}",
                message=f"agent {inp.agent_id} ({j.placement.region}) did not start attempt"
                        f" {j.attempt}: {inp.reason or 'no reason given'}",
                details={"agent": inp.agent_id, "region": j.placement.region,
                         "refusals": str(d.refusals), "avoid_s": f"{d.delay_s:.0f}",
                         "reason": inp.reason})


def stop_timed_out(job: pb.Job, inp: StopTimeout, now: float, config: BrokerConfig) -> Outcome | None:
    """The agent did not confirm a stop in time: finish it without the agent (the old
    attempt is fenced with a STALE_ATTEMPT stop)."""
    kind = StopKind.parse(job.stop_reason)
    if job.phase not in HOLDING or job.attempt != inp.attempt or kind is None:
        return None
    tx = begin(job, now)
    j = tx.job
    fence = _stop_of(job, None, False, 0.0)
    if kind is StopKind.CANCEL:
        tx.move(CANCELLED, "cancelled", reason="cancel_timeout", actor="broker",
                message="the agent did not confirm the stop in time; cancelled anyway")
        return seal(tx, fence, WakeScheduler())
    lost = tx.lose_work(kind.family)
    migration.stopped(j, now, saved=False, work_lost_s=lost)
    stopped_to_queue(tx, kind, actor="broker", saved=False, detail="no answer to the stop in time")
    return seal(tx, fence, WakeScheduler())


def stop_due(job: pb.Job, now: float, config: BrokerConfig) -> bool:
    """True when a stop or cancel in flight has waited past its limit."""
    kind = StopKind.parse(job.stop_reason)
    if kind is None or not job.stop_requested_time:
        return False
    limit = (config.cancel_timeout_s if kind is StopKind.CANCEL
             else config.preempt_grace_s + config.stop_timeout_s)
    return now - job.stop_requested_time > limit


def refusals_forgotten(job: pb.Job, agent_id: str, now: float, config: BrokerConfig) -> Outcome | None:
    """The agent that refused this job re-registered with a new configuration: it may be
    tried again at once (``backoff.forget``), said in one event."""
    if job.phase not in QUEUED:
        return None
    tx = begin(job, now)
    j = tx.job
    if not backoff.forget(j, agent_id, now):
        return None
    tx.note("refusal_cleared", reason="agent_reconfigured", actor=f"agent:{agent_id}",
            message=f"agent {agent_id} re-registered with a new configuration; it may take the"
                    " job again")
    j.pending_reason = backoff.pending_note(j, now) or "agent reconfigured: placing again"
    return seal(tx, WakeScheduler())


def exclusions_forgiven(job: pb.Job, nodes: tuple[str, ...], now: float,
                        config: BrokerConfig) -> Outcome | None:
    """Nodes avoided after a failure are all that could ever hold this job
    (broker/scheduling/exclusions.py): they may be tried again, said in one event. Any
    job waiting for placement: a moved gang (MIGRATING) whose avoided nodes and the
    reserved spares leave no pool big enough would otherwise wait forever (found by the
    fleet simulator, which runs this code)."""
    if job.phase not in QUEUED:
        return None
    keep = [n for n in job.excluded_nodes if n not in nodes]
    if len(keep) == len(job.excluded_nodes):
        return None
    tx = begin(job, now)
    j = tx.job
    del j.excluded_nodes[:]
    j.excluded_nodes.extend(keep)
    tx.note("exclusions_forgiven", reason="no_other_capacity", actor="scheduler",
            message=f"trying {', '.join(nodes)} again: avoided after a failure, but no other"
                    " connected capacity could ever hold this job")
    return seal(tx, WakeScheduler())


def set_pending_reason(job: pb.Job, reason: str, now: float, config: BrokerConfig) -> Outcome | None:
    """Why a PENDING job still waits (no event: it changes every pass)."""
    if job.phase != PENDING or job.pending_reason == reason:
        return None
    tx = begin(job, now)
    tx.job.pending_reason = reason
    return seal(tx)
