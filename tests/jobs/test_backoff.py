"""Launch refusal backoff as pure decisions (broker/jobs/backoff.py) and the transition
that applies them (``transitions.attempt_lost`` with ``Cause.LAUNCH_REFUSED``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from broker.jobs import backoff, updates
from broker.jobs import transitions as t
from broker.jobs.backoff import RefusalAction
from broker.jobs.recovery import RecoveryPolicy, Signal, Trigger
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import AGENT, CFG, admission, launching, must, running, update

CONF = CFG.model_copy(update={"launch_backoff_base_s": 10.0, "launch_backoff_max_s": 60.0,
                              "launch_refusal_limit": 5})


@pytest.mark.parametrize(("n", "base", "cap", "want"), [
    (0, 10.0, 60.0, 0.0),     # no refusal: no backoff
    (1, 10.0, 60.0, 10.0),    # base
    (2, 10.0, 60.0, 20.0),    # doubles
    (3, 10.0, 60.0, 40.0),
    (4, 10.0, 60.0, 60.0),    # capped
    (40, 10.0, 60.0, 60.0),   # stays capped
    (500, 1.0, 3600.0, 3600.0),  # no overflow for huge counts
])
def test_backoff_delay(n: int, base: float, cap: float, want: float) -> None:
    assert backoff.backoff_delay(n, base, cap) == want


@dataclass(frozen=True)
class Row:
    name: str
    prior: int  # refusals in a row before this one
    entries: tuple[tuple[str, str], ...]  # (agent, message) already recorded
    agent: str
    reason: str
    limit: int
    action: RefusalAction
    refusals: int
    delay: float
    distinct: bool


ROWS = [
    Row("first refusal", 0, (), "a", "root", 5, RefusalAction.REQUEUE, 1, 10.0, True),
    Row("same agent, same reason: no new event", 1, (("a", "root"),), "a", "root", 5,
        RefusalAction.REQUEUE, 2, 20.0, False),
    Row("same agent, new reason: an event", 1, (("a", "root"),), "a", "user", 5,
        RefusalAction.REQUEUE, 2, 20.0, True),
    Row("another agent: an event", 1, (("a", "root"),), "b", "root", 5,
        RefusalAction.REQUEUE, 2, 20.0, True),
    Row("same reason quoting another attempt: no new event", 1,
        (("a", "'/x/attempt-1' is outside the allowed checkpoint roots"),), "a",
        "'/x/attempt-2' is outside the allowed checkpoint roots", 5, RefusalAction.REQUEUE, 2, 20.0, False),
    Row("capped", 3, (("a", "root"),), "a", "root", 5, RefusalAction.REQUEUE, 4, 60.0, False),
    Row("limit reached: give up", 4, (("a", "root"),), "a", "root", 5,
        RefusalAction.GIVE_UP, 5, 60.0, False),
    Row("limit 0: never give up", 40, (("a", "root"),), "a", "root", 0,
        RefusalAction.REQUEUE, 41, 60.0, False),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_refusal_decision_table(row: Row) -> None:
    job = pb.Job(id="j", launch_refusals=row.prior)
    for agent, msg in row.entries:
        job.refusals.add(agent_id=agent, message=msg, count=1, until=50.0)
    conf = CONF.model_copy(update={"launch_refusal_limit": row.limit})
    d = backoff.decide(job, row.agent, row.reason, 100.0, conf)
    assert (d.action, d.refusals, d.delay_s, d.until, d.distinct) == (
        row.action, row.refusals, row.delay, 100.0 + row.delay, row.distinct)


def test_avoided_agents_expire() -> None:
    job = pb.Job(id="j")
    job.refusals.add(agent_id="a", until=110.0)
    job.refusals.add(agent_id="b", until=130.0)
    assert backoff.avoided_agents(job, 100.0) == {"a", "b"}
    assert backoff.avoided_agents(job, 120.0) == {"b"}
    assert backoff.avoided_agents(job, 130.0) == frozenset()


def refuse(job: pb.Job, now: float, reason: str = "checkpoint location refused", agent: str = AGENT,
           conf=CONF):  # noqa: ANN001, ANN201
    plan = RecoveryPolicy().plan(Signal(Trigger.LAUNCH_REFUSED), job, conf, now)
    assert plan is not None
    return t.attempt_lost(job, t.AttemptLost(agent_id=agent, plan=plan, message=f"{agent} refused",
                                             attempt=job.attempt, reason=reason), now, conf)


def test_refused_launch_requeues_avoiding_the_agent_with_one_event_per_distinct_refusal() -> None:
    job = launching(110.0)
    out = must(refuse(job, 111.0))
    assert out.phase == pb.JOB_PHASE_PENDING and out.launch_refusals == 1
    [r] = out.refusals
    assert (r.agent_id, r.region, r.message, r.count, r.until) == (
        AGENT, "us-east-2", "checkpoint location refused", 1, 121.0)
    assert "refused the launch: checkpoint location refused" in out.pending_reason
    assert backoff.avoided_agents(out, 111.0) == {AGENT}
    # Same agent, same reason again (after the first backoff): no second launch_refused event.
    again = must(t.admit(out, admission(), 122.0, CONF))
    out2 = refuse(again, 123.0)
    assert out2 is not None
    assert [e.type for e in out2.events] == ["requeued"]
    assert out2.job.launch_refusals == 2 and out2.job.refusals[0].count == 2
    assert out2.job.refusals[0].until == 143.0  # 123 + 20: doubled
    # A new reason is a new event.
    third = refuse(must(t.admit(out2.job, admission(), 144.0, CONF)), 145.0, reason="no such user")
    assert third is not None and [e.type for e in third.events] == ["launch_refused", "requeued"]


def test_refusals_in_a_row_fail_the_job_with_the_reason() -> None:
    conf = CONF.model_copy(update={"launch_refusal_limit": 2})
    job = must(refuse(launching(110.0), 111.0, conf=conf))
    out = refuse(must(t.admit(job, admission(), 130.0, conf)), 131.0, conf=conf)
    assert out is not None and out.job.phase == pb.JOB_PHASE_FAILED
    assert "gave up after 2 refused launches in a row" in out.job.message
    assert "checkpoint location refused" in out.job.message
    assert out.events[-1].reason == "launch_refused"


def test_a_running_attempt_resets_the_count_but_keeps_the_avoidance() -> None:
    job = must(refuse(launching(110.0), 111.0))
    adm = admission(agent="other")
    run = must(t.admit(job, adm, 112.0, CONF))
    run = must(updates.progress(run, update(run, apb.ATTEMPT_STATE_RUNNING, step=1, agent="other"),
                                113.0, CONF))
    assert run.phase == pb.JOB_PHASE_RUNNING and run.launch_refusals == 0
    assert backoff.avoided_agents(run, 113.0) == {AGENT}


def test_other_losses_do_not_back_off() -> None:
    job = launching(110.0)
    plan = RecoveryPolicy().plan(Signal(Trigger.AGENT_LOST), job, CONF, 111.0)
    assert plan is not None
    out = must(t.attempt_lost(job, t.AttemptLost(agent_id=AGENT, plan=plan, message="lost"), 111.0, CONF))
    assert out.launch_refusals == 0 and not out.refusals


def test_admission_onto_an_avoided_agent_is_not_written() -> None:
    job = must(refuse(launching(110.0), 111.0))
    assert t.admit(job, admission(), 115.0, CONF) is None  # still avoided (until 121)
    assert t.admit(job, admission(agent="other"), 115.0, CONF) is not None
    assert t.admit(job, admission(), 121.0, CONF) is not None  # expired


def test_a_reconfigured_agent_is_tried_again_at_once_keeping_the_count() -> None:
    job = must(refuse(launching(110.0), 111.0))
    out = t.refusals_forgotten(job, AGENT, 112.0, CONF)
    assert out is not None and [e.type for e in out.events] == ["refusal_cleared"]
    assert backoff.avoided_agents(out.job, 112.0) == frozenset()
    assert out.job.launch_refusals == 1 and out.job.refusals[0].count == 1
    assert t.admit(out.job, admission(), 112.0, CONF) is not None
    assert t.refusals_forgotten(out.job, AGENT, 113.0, CONF) is None  # nothing left to forget
    assert t.refusals_forgotten(job, "other", 112.0, CONF) is None


def test_fingerprint_changes_with_roots_not_with_nodes() -> None:
    a = apb.Register(agent_id="a", checkpoint_roots=["/ckpt"], checkpoint_bucket="s3://b")
    b = apb.Register(agent_id="a", checkpoint_roots=["/ckpt"], checkpoint_bucket="s3://b")
    b.nodes.add(id="n1", gpus=8)
    assert backoff.fingerprint(a) == backoff.fingerprint(b)
    b.checkpoint_roots.append("/team")
    assert backoff.fingerprint(a) != backoff.fingerprint(b)


def test_an_attempt_the_agent_could_not_start_backs_off_like_a_refusal() -> None:
    """Exit -1 before RUNNING (staging, checkpoint copy, workdir fetch failed): the same
    backoff and avoidance, and no restart used up."""
    job = launching(110.0)
    u = update(job, apb.ATTEMPT_STATE_FAILED, exit_code=-1)
    u.update.message = "workdir fetch failed: digest sha256:ab not found"
    out = updates.attempt_ended(job, u, 111.0, CONF)
    assert out is not None and out.job.phase == pb.JOB_PHASE_PENDING
    assert out.job.restarts == 0 and out.job.launch_refusals == 1
    assert backoff.avoided_agents(out.job, 111.0) == {AGENT}
    assert out.job.refusals[0].message == "workdir fetch failed: digest sha256:ab not found"
    assert [e.type for e in out.events] == ["launch_refused", "requeued"]


def test_exit_minus_one_of_a_running_attempt_is_an_ordinary_failure() -> None:
    job = running(120.0)
    out = updates.attempt_ended(job, update(job, apb.ATTEMPT_STATE_FAILED, exit_code=-1), 121.0, CONF)
    assert out is not None and out.job.restarts == 1 and out.job.launch_refusals == 0
    assert not out.job.refusals
