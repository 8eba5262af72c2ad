"""Bounds on preemption: a minimum run time between preemptions and a per-job budget.

Why: without them a cheap victim (a 1-GPU job just started) is the cheapest choice pass
after pass, and one job can be checkpointed and requeued dozens of times. Real
schedulers bound this (Slurm ``PreemptExemptTime``, Kueue's minimum-runtime proposals).

A third rule, preemption only when it pays (:func:`spared`): a victim pays its
checkpoint, its transfer, its restore and the wait to run again; what a preemption gains
is the victim's GPUs sooner than the victim would give them back by itself, i.e. its
expected remaining time. So a job is spared while its stated expected end is nearer than
``gain_factor`` x its cost: the GPUs are nearly free anyway. The cost is the job's own
move estimate (:func:`broker.jobs.migration.estimate_move_s`: its last checkpoint and
transfer times, at least the floor, the lead time a plan end uses) plus ``requeue_s``
(the restore and the re-queue, a setting). The window ends at the stated end: a job
running past its own estimate has said nothing about what is left and is a victim like
any other, so understating a duration buys no protection.

Why as data on the running job: :func:`protected_until` turns the first two settings into
one time, after which the job may be a victim again (``math.inf``: never again), and
:func:`spared` the third into one interval; the placement engine compares them with the
pass's clock. Both depend only on the job record and the settings, so snapshot memos
keyed by the job's version stay valid. The live broker (``BrokerConfig``) and the fleet
simulator (the scenario's same settings) build the rules with :func:`from_config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.jobs.lifecycle import RUNNING
from broker.jobs.migration import estimate_move_s
from computebroker.v1 import common_pb2 as pb


@dataclass(frozen=True, slots=True)
class PreemptionRules:
    min_run_s: float = 0.0  # an attempt runs this long before it may be preempted
    budget: int = 0  # preemptions per job after which it is never a victim (0 = no limit)
    gain_factor: float = 0.0  # spared while its expected end is nearer than this x its cost (0 = off)
    requeue_s: float = 600.0  # a victim's restore and wait to run again, part of its cost
    move_floor_s: float = 120.0  # estimate_move_s's floor and margin (the plan-end settings)
    move_margin: float = 1.5


NONE = PreemptionRules()


def from_config(config) -> PreemptionRules:  # noqa: ANN001 - BrokerConfig (no import cycle)
    return PreemptionRules(min_run_s=config.preempt_min_run_s, budget=config.preempt_budget,
                           gain_factor=config.preempt_gain_factor, requeue_s=config.preempt_requeue_s,
                           move_floor_s=config.plan_move_floor_s, move_margin=config.plan_move_margin)


def protected_until(job: pb.Job, rules: PreemptionRules) -> float:
    """When ``job`` may next be chosen as a preemption victim (0 = now)."""
    if rules.budget and job.preemptions >= rules.budget:
        return math.inf
    if rules.min_run_s > 0 and job.attempt_started_time > 0:
        return job.attempt_started_time + rules.min_run_s
    return 0.0


def victim_cost_s(job: pb.Job, rules: PreemptionRules) -> float:
    """Seconds of its own GPUs a preemption costs ``job``: checkpoint and transfer (its
    move estimate), restore and re-queue (``requeue_s``)."""
    return estimate_move_s(job, floor_s=rules.move_floor_s, margin=rules.move_margin) + rules.requeue_s


def spared(job: pb.Job, rules: PreemptionRules) -> tuple[float, float]:
    """[from, until): the interval in which ``job`` is not a victim because preempting it
    would not pay (module doc); (0, 0) = never spared by this rule. Only a running job
    that states an expected duration: its stated end is the attempt's start plus the
    expected duration less the work done before the attempt."""
    if rules.gain_factor <= 0 or job.phase != RUNNING or not job.phase_time:
        return (0.0, 0.0)
    expected = job.spec.expected_duration_s
    if expected <= 0:
        return (0.0, 0.0)
    end = job.phase_time + max(0.0, expected - job.goodput.productive_s)
    return (end - rules.gain_factor * victim_cost_s(job, rules), end)
