"""Proactive moves in the live broker: move a running job nobody forces to move.

Why a separate step: :mod:`broker.jobs.proactive` decides, as pure functions, which
running jobs to move to free prepaid capacity (``better-capacity``) or out of a block a
waiting gang needs (``defragment``); the fleet simulator has always called them. This
module is the live broker's side: which jobs consent (their recovery policy names the
trigger: ``RecoveryPolicy.proactive``), what a move costs and what is left of the job,
learned from the job's own record, and the limits that keep moves from churning. Each
proposal then goes through ``JobOps.trigger`` like any other trigger, so a proactive
move is a planned move: checkpoint first, pre-copy and make-before-break when enabled.

Estimates (both from the job record, nothing asked of the trainer):

* move time: :func:`broker.jobs.migration.estimate_move_s`, the same lead time a plan
  end uses (the job's last checkpoint and transfer times x margin, at least the floor);
* remaining time (:func:`expected_remaining_s`): steps left x productive seconds per
  step so far; else ``expected_duration_s`` less the productive time; else 0, and a job
  that says nothing about its length is never moved for a saving it cannot show.

Limits: a check runs at most every ``proactive_interval_s``; a job is left alone in its
first ``proactive_min_dwell_s`` on its capacity (a move must pay off before the next);
at most ``proactive_max_moves`` proactive moves are in flight; defragmentation frees one
block at a time, and whole: a proposal the in-flight limit would cut is not made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import placement
from broker.jobs import migration, proactive
from broker.jobs.causes import Cause
from broker.jobs.lifecycle import RUNNING
from broker.jobs.ops import JobOps
from broker.jobs.recovery import Trigger, policy_for
from broker.scheduling.snapshot import job_request
from computebroker.v1 import common_pb2 as pb
from placement.firstfit import node_fits_job

log = logging.getLogger(__name__)

# The causes a proactive trigger's move is recorded under (counted against the limit).
PROACTIVE_CAUSES = frozenset({Cause.BETTER_CAPACITY.value, Cause.DEFRAGMENT.value})


def expected_remaining_s(job: pb.Job, now: float) -> float:
    """Seconds of work the job has left (0 = unknown; see the module doc)."""
    done = job.goodput.productive_s
    if job.phase == RUNNING and job.phase_time:
        done += max(0.0, now - job.phase_time)
    p = job.progress
    total = job.spec.trainer.total_steps or p.total_steps
    if total and p.step >= total:
        return 0.0  # finishing
    if total and p.step > 0 and done > 0:
        return (total - p.step) * done / p.step
    if job.spec.expected_duration_s:
        return max(0.0, job.spec.expected_duration_s - done)
    return 0.0


def in_flight(live: Iterable[pb.Job]) -> dict[str, str]:
    """Job id -> cause, for the jobs whose open move a proactive trigger started."""
    out = {}
    for job in live:
        m = migration.open_migration(job)
        if m is not None and m.cause in PROACTIVE_CAUSES:
            out[job.id] = m.cause
    return out


class ProactiveWatch:
    """Runs the proactive rules after a scheduler pass, at most every interval."""

    def __init__(self, ops: JobOps, monotonic=time.monotonic) -> None:  # noqa: ANN001
        self.ops = ops
        self._monotonic = monotonic
        self._last = float("-inf")

    def check(self, live: list[pb.Job], snap: placement.Snapshot,
              dec: placement.Decisions) -> list[pb.Job]:
        """Trigger the moves the rules propose; returns the jobs as written."""
        cfg = self.ops.config
        if not cfg.proactive_interval_s or not snap.running:
            return []
        t = self._monotonic()
        if t - self._last < cfg.proactive_interval_s:
            return []
        self._last = t
        now = snap.now
        consent: dict[Trigger, dict[str, pb.Job]] = {Trigger.BETTER_CAPACITY: {}, Trigger.DEFRAGMENT: {}}
        victims = {p.job_id for p in dec.preemptions}  # this pass already stops them
        for job in live:
            if job.phase != RUNNING or job.stop_reason or job.id in victims:
                continue
            wants = policy_for(job, cfg).proactive
            if not wants:
                continue
            since = job.attempt_started_time or job.started_time
            if since and now - since < cfg.proactive_min_dwell_s:
                continue
            for trig in wants:
                consent.setdefault(trig, {})[job.id] = job
        if not any(consent.values()):
            return []
        moving = in_flight(live)
        budget = cfg.proactive_max_moves - len(moving)
        if budget <= 0:
            return []
        jobs = {j.id: j for js in consent.values() for j in js.values()}
        requests: dict[str, placement.JobRequest] = {}

        def fits(r: placement.RunningJob, node: placement.NodeInfo) -> bool:
            req = requests.get(r.id)
            if req is None:
                req = requests[r.id] = job_request(jobs[r.id], r.priority)
            return node_fits_job(node, req, snap.draining_regions)

        def move_s(r: placement.RunningJob) -> float:
            return migration.estimate_move_s(jobs[r.id], floor_s=cfg.plan_move_floor_s,
                                             margin=cfg.plan_move_margin)

        def remaining_s(r: placement.RunningJob) -> float:
            return expected_remaining_s(jobs[r.id], now)

        busy = frozenset(moving)
        props: list[proactive.Proposal] = []
        better = consent[Trigger.BETTER_CAPACITY]
        if better:
            props += proactive.better_capacity(snap, dec, move_s=move_s, remaining_s=remaining_s,
                                               max_moves=budget, busy=busy,
                                               may_move=lambda r: r.id in better, fits=fits)
        defrag = consent[Trigger.DEFRAGMENT]
        if defrag and len(props) < budget:
            taken = {p.job_id for p in props}
            block = proactive.defragment(
                snap, dec, move_s=move_s, remaining_s=remaining_s,
                movable_gpus=cfg.proactive_movable_gpus,
                busy=frozenset(j for j, c in moving.items() if c == Cause.DEFRAGMENT.value),
                may_move=lambda r: r.id in defrag and r.id not in taken, fits=fits)
            if len(props) + len(block) <= budget:  # a block is freed whole or not at all
                props += block
        written = []
        for p in props[:budget]:
            stored = self.ops.trigger(
                p.job_id, p.signal, actor="broker", message=p.message,
                details={"rule": p.signal.trigger.value, "gain": f"{p.gain:.2f}",
                         "cost": f"{p.cost:.2f}",
                         "remaining_s": f"{expected_remaining_s(jobs[p.job_id], now):.0f}"})
            if stored is not None:
                log.info("job %s: proactive move (%s): %s", p.job_id, p.signal.trigger.value, p.message)
                written.append(stored)
        return written
