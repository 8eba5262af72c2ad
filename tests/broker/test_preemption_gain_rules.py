"""preemption_rules.spared: the interval before a running job's stated end in which
preempting it would cost it more (move estimate + restore and re-queue) than the GPU
time it frees; the snapshot converter puts it on the engine's RunningJob."""

from __future__ import annotations

from broker.config import BrokerConfig
from broker.jobs.lifecycle import PENDING, RUNNING
from broker.scheduling import preemption_rules
from broker.scheduling.snapshot import running_job
from computebroker.v1 import common_pb2 as pb


def _job(phase: int = RUNNING, expected: float = 7200.0, productive: float = 1000.0) -> pb.Job:
    j = pb.Job(id="j", phase=phase, phase_time=10_000.0, attempt_started_time=10_000.0)
    j.spec.team = "t"
    j.spec.expected_duration_s = expected
    j.goodput.productive_s = productive
    j.placement.nodes.add(node_id="n1", gpus=8)
    return j


def test_spared_before_the_stated_end_by_factor_times_cost():
    cfg = BrokerConfig(preempt_gain_factor=1.0, preempt_requeue_s=600.0, plan_move_floor_s=120.0)
    rules = preemption_rules.from_config(cfg)
    end = 10_000.0 + 7200.0 - 1000.0
    cost = 120.0 + 600.0  # a job that never moved: the move floor, plus restore and re-queue
    assert preemption_rules.victim_cost_s(_job(), rules) == cost
    assert preemption_rules.spared(_job(), rules) == (end - cost, end)
    twice = preemption_rules.from_config(cfg.model_copy(update={"preempt_gain_factor": 2.0}))
    assert preemption_rules.spared(_job(), twice) == (end - 2 * cost, end)
    r = running_job(_job(), 0, rules)
    assert r.spared == (end - cost, end)
    assert r.victim_at(end - cost - 1) and not r.victim_at(end - 1) and r.victim_at(end)


def test_never_spared_when_off_unstated_or_not_running():
    on = preemption_rules.from_config(BrokerConfig(preempt_gain_factor=1.0))
    off = preemption_rules.from_config(BrokerConfig())
    assert preemption_rules.spared(_job(), off) == (0.0, 0.0)
    assert preemption_rules.spared(_job(expected=0.0), on) == (0.0, 0.0)
    assert preemption_rules.spared(_job(phase=PENDING), on) == (0.0, 0.0)
    assert running_job(_job(), 0, off).spared == (0.0, 0.0)
