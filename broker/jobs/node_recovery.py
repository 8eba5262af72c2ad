"""A job that lost nodes: the record of its recovery, and the transitions that write it.

Why a record on the job (``Job.node_recovery``): the three moments of one recovery
happen in different places. The failed attempt's update (broker/jobs/updates.py) knows
which nodes were lost; only the scheduler's next pass knows whether the pool has a
ready spare, so that is where the recovery policy chooses the plan
(broker/scheduling/replacements.py, :meth:`broker.jobs.recovery.RecoveryPolicy.relaunch`);
and only the relaunched attempt's first progress report says which tier its state
came from. The record carries what each moment needs from the one before, survives a
broker restart, and lets the events say "recovered from memory (step S, lost L steps)".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.jobs import grow_back, transitions
from broker.jobs.lifecycle import QUEUED
from broker.jobs.outcome import Outcome, WakeScheduler, begin, seal
from broker.jobs.recovery import Relaunch, RelaunchPlan
from checkpoint_layout import job_options

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.jobs.lifecycle import Tx
    from computebroker.v1 import common_pb2 as pb

MEMORY_OPTION = "memory_every"  # TrainerSpec.options key (trainer/memtier.py)
TIER_MEMORY = "memory"
TIER_STORE = "store"


def memory_every(job: pb.Job) -> int:
    """The job's snapshot interval K (0 = its memory tier is off), read through the one
    options table (checkpoint_layout/job_options.py; SubmitJob refused a bad value)."""
    return job_options.value(job.spec.trainer.options, MEMORY_OPTION, strict=False)


def lost(job: pb.Job, failed_nodes: tuple[str, ...]) -> None:
    """A failed attempt being requeued: record the nodes its agent blamed (the relaunch
    is then decided by the scheduler's pass), or forget an older recovery."""
    job.ClearField("node_recovery")
    if not failed_nodes:
        return
    rec = job.node_recovery
    rec.failed_attempt = job.attempt
    rec.lost_nodes.extend(failed_nodes)
    rec.survivors.extend(n.node_id for n in job.placement.nodes if n.node_id not in failed_nodes)
    rec.step_at_failure = job.progress.step


def undecided(job: pb.Job) -> bool:
    """A queued job whose relaunch after a node loss the policy has not chosen yet."""
    rec = job.node_recovery
    return job.phase in QUEUED and bool(rec.failed_attempt) and not rec.plan


@dataclass(frozen=True)
class Decided:
    """A NODE_LOST plan the scheduler's pass applies (with its admission when in place)."""

    plan: RelaunchPlan
    admit: transitions.Admit | None = None


def decide(job: pb.Job, inp: Decided, now: float, config: BrokerConfig) -> Outcome | None:
    """Write the policy's plan. REPLACE_IN_PLACE admits the job at once on the survivors
    plus the spares (same world size, same node order: each spare in its lost node's
    slot); SHRINK_IN_PLACE at once on the survivors alone (fewer ranks: they reshard
    from memory); FROM_STORE leaves it queued for ordinary placement, as before."""
    if not undecided(job):
        return None
    tx = begin(job, now)
    rec = tx.job.node_recovery
    rec.plan = inp.plan.kind.value
    rec.why = inp.plan.why
    lost_text = ", ".join(rec.lost_nodes)
    details = {"plan": rec.plan, "blocker": inp.plan.blocker.value, "lost_nodes": lost_text,
               "survivors": ",".join(rec.survivors)}
    if inp.plan.kind.in_place and inp.admit is None:
        rec.plan, rec.why = Relaunch.FROM_STORE.value, "its agent is not connected"
        details["plan"] = rec.plan
    if inp.plan.kind.in_place and inp.admit is not None:
        for node, spare in inp.plan.swaps:
            rec.replaced[node] = spare
        rec.relaunch_attempt = tx.job.attempt + 1
        if inp.plan.swaps:
            details["replaced"] = ",".join(f"{n}={s}" for n, s in inp.plan.swaps)
        doing = ("replacing in place" if inp.plan.kind is Relaunch.REPLACE_IN_PLACE
                 else "shrinking in place")
        tx.note("node_recovery", reason=rec.plan, actor="scheduler",
                message=f"attempt {rec.failed_attempt} lost {lost_text}: {doing}"
                        f" ({inp.plan.why})", details=details)
        out = transitions.admit(tx.job, inp.admit, now, config)
        if out is not None:
            if inp.plan.kind is Relaunch.SHRINK_IN_PLACE:  # to grow back once capacity returns
                grow_back.shrank(out.job, tuple(rec.survivors), tuple(rec.lost_nodes),
                                 inp.plan.why, now)
            return Outcome(job=out.job, events=(*tx.events, *out.events), commands=out.commands)
        # its agent refuses this job lately (backoff.py): the ordinary path instead
        tx = begin(job, now)
        rec = tx.job.node_recovery
        rec.plan, rec.why = Relaunch.FROM_STORE.value, "its agent refused this job's launches lately"
        details["plan"] = rec.plan
    tx.note("node_recovery", reason=rec.plan, actor="scheduler",
            message=f"attempt {rec.failed_attempt} lost {lost_text}: relaunching from the store"
                    f" ({rec.why})", details=details)
    return seal(tx, WakeScheduler())


def resumed(tx: Tx, attempt: int, progress: pb.Progress, actor: str) -> None:
    """The first resume report of the attempt that relaunched a node loss: say which tier
    its state came from, the step and the steps lost."""
    job = tx.job
    rec = job.node_recovery
    if not rec.failed_attempt or rec.tier or not rec.plan or attempt <= rec.failed_attempt:
        return
    tier = progress.resume.tier
    if tier not in (TIER_MEMORY, TIER_STORE):
        return
    rec.tier = tier
    rec.relaunch_attempt = rec.relaunch_attempt or attempt
    if tier == TIER_MEMORY:
        step = progress.resume.step
        lost_steps = max(0, rec.step_at_failure - step)
        world = ""
        saved, now_world = progress.resumed_from_world_size, progress.world_size
        if saved and now_world and saved != now_world:
            world = f", world {saved} -> {now_world}"
        message = f"recovered from memory (step {step}, lost {lost_steps} steps{world})"
        if progress.resume.restored_from_peer:
            ranks = ", ".join(str(r) for r in progress.resume.restored_from_peer)
            message += f"; rank(s) {ranks} restored from another node's copy"
    else:
        # the durable checkpoint it was launched from: the job's (never behind the
        # report's; the first report after a store resume may not name it yet)
        step = progress.resume.step or max(progress.last_checkpoint_step,
                                           job.progress.last_checkpoint_step)
        lost_steps = max(0, rec.step_at_failure - step)
        why = (rec.why if rec.plan == Relaunch.FROM_STORE.value else
               "the memory keepers held no step of every rank's shard at or after the"
               " durable checkpoint")
        message = f"recovered from store (step {step}, lost {lost_steps} steps): {why}"
    tx.note("recovered", reason=f"{tier}_tier", actor=actor, message=message,
            details={"tier": tier, "step": str(step), "lost_steps": str(lost_steps),
                     "failed_attempt": str(rec.failed_attempt), "plan": rec.plan})
