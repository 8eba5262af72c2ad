"""Bounds on preemption: a minimum run time between preemptions and a per-job budget.

Why: without them a cheap victim (a 1-GPU job just started) is the cheapest choice pass
after pass, and one job can be checkpointed and requeued dozens of times. Real
schedulers bound this (Slurm ``PreemptExemptTime``, Kueue's minimum-runtime proposals).

Why as data on the running job: :func:`protected_until` turns the two settings into one
time, after which the job may be a victim again (``math.inf``: never again). The
placement engine compares it with the pass's clock; the value depends only on the job
record and the settings, so snapshot memos keyed by the job's version stay valid. The
live broker (``BrokerConfig``) and the fleet simulator (the scenario's same two settings)
build the rules with :func:`from_config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from computebroker.v1 import common_pb2 as pb


@dataclass(frozen=True, slots=True)
class PreemptionRules:
    min_run_s: float = 0.0  # an attempt runs this long before it may be preempted
    budget: int = 0  # preemptions per job after which it is never a victim (0 = no limit)


NONE = PreemptionRules()


def from_config(config) -> PreemptionRules:  # noqa: ANN001 - BrokerConfig (no import cycle)
    return PreemptionRules(min_run_s=config.preempt_min_run_s, budget=config.preempt_budget)


def protected_until(job: pb.Job, rules: PreemptionRules) -> float:
    """When ``job`` may next be chosen as a preemption victim (0 = now)."""
    if rules.budget and job.preemptions >= rules.budget:
        return math.inf
    if rules.min_run_s > 0 and job.attempt_started_time > 0:
        return job.attempt_started_time + rules.min_run_s
    return 0.0
