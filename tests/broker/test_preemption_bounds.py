"""The live broker honours the preemption bounds (BrokerConfig.preempt_min_run_s and
preempt_budget), the same settings the fleet simulator's scenarios set."""

from __future__ import annotations

import time
from pathlib import Path

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until


def _run(b: Broker, agent: FakeAgent, job_id: str, attempt: int = 1) -> float:
    launch = agent.wait_launch(job_id, attempt=attempt)
    agent.update(job_id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=1)
    b.wait_phase(job_id, pb.JOB_PHASE_RUNNING)
    return b.get(job_id).attempt_started_time


def _broker(tmp_path: Path, **kw) -> tuple[Broker, FakeAgent]:  # noqa: ANN003
    b = Broker(fast_config(tmp_path, **kw))
    b.team("ml", gpus=8)
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", nodes_for("us-east-2", "us-east-2-a", 1, 8),
                      bucket="s3://cb-us-east-2")
    agent.connect()
    return b, agent


def test_a_job_is_not_preempted_before_its_minimum_run_time(tmp_path: Path) -> None:
    b, agent = _broker(tmp_path, preempt_min_run_s=2.0)
    try:
        low = b.submit(spec("low", gpus=8))  # training = 70
        started = _run(b, agent, low.id)
        high = b.submit(spec("high", gpus=8, priority_class="inference"))  # 100
        wait_until(lambda: b.get(high.id).pending_reason, 20, "the high job's pending reason")
        agent.wait_stop(low.id, apb.STOP_REASON_PREEMPT)
        stopping = b.get(low.id)
        # the broker asked for the stop only once the attempt had run its minimum time
        assert stopping.stop_requested_time >= started + 2.0
        assert stopping.preemptions == 1
        # the event says why once: the beneficiary (its team and class) and the work at risk
        ev = next(e for e in b.events(low.id) if e.type == "preempted")
        assert f"preempted by {high.id} (team ml, priority inference)" in ev.message, ev.message
        assert ev.message.count("GPU-s") == 1, ev.message
    finally:
        agent.close()
        b.stop()


def test_a_job_past_its_preemption_budget_is_never_a_victim_again(tmp_path: Path) -> None:
    b, agent = _broker(tmp_path, preempt_budget=1)
    try:
        low = b.submit(spec("low", gpus=8))
        _run(b, agent, low.id)
        high = b.submit(spec("high", gpus=8, priority_class="inference"))
        agent.wait_stop(low.id, apb.STOP_REASON_PREEMPT)
        agent.update(low.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, step=2, ckpt_step=2,
                     ckpt_uri=f"s3://cb-us-east-2/jobs/{low.id}/step-000000002")
        assert b.get(low.id).preemptions == 1
        _run(b, agent, high.id)
        agent.update(high.id, 1, apb.ATTEMPT_STATE_SUCCEEDED, step=3)
        _run(b, agent, low.id, attempt=2)
        again = b.submit(spec("again", gpus=8, priority_class="inference"))
        wait_until(lambda: b.get(again.id).pending_reason, 20, "the second high job's pending reason")
        time.sleep(1.0)  # about ten more passes (0.1 s interval): none may preempt it
        assert b.get(low.id).phase == pb.JOB_PHASE_RUNNING and b.get(low.id).preemptions == 1
        assert len(agent.commands("stop", low.id)) == 1
    finally:
        agent.close()
        b.stop()
