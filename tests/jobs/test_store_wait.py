"""A checkpoint store outage is waited out, not failed (broker/jobs/store_wait.py):
exit 81 spends no restart, requeues with backoff away from the region, says so in the
pending reason, and fails only past store_outage_max_s. Exit 2 still fails at once."""

from __future__ import annotations

import pytest

from broker.jobs import store_wait, updates
from broker.jobs import transitions as t
from broker.jobs.lifecycle import FAILED, PENDING, RUNNING
from broker.jobs.recovery import EXIT_DECISIONS, RecoveryPolicy, Restart
from computebroker.v1 import agent_pb2 as apb
from tests.jobs.helpers import CFG, admission, launching, must, running, update

CONF = CFG.model_copy(update={"max_restarts": 2, "store_outage_backoff_base_s": 5.0,
                              "store_outage_backoff_max_s": 40.0, "store_outage_max_s": 3600.0})
DOWN = "checkpoint storage s3://cb-us-east-2 is unreachable: Could not connect to the endpoint URL"


def _fail(job, now: float, code: int = 81):  # noqa: ANN001, ANN202
    u = update(job, apb.ATTEMPT_STATE_FAILED, exit_code=code)
    u.update.message = DOWN
    return must(updates.attempt_ended(job, u, now, CONF))


def test_exit_decisions_are_data() -> None:
    assert EXIT_DECISIONS == {2: Restart.FAIL_CONFIG, 81: Restart.WAIT_STORE}
    job = running()
    job.restarts = 99  # even with the budget spent: an outage is waited out
    assert RecoveryPolicy().restart(81, job, CONF) is Restart.WAIT_STORE


def test_outages_spend_no_restart_and_back_off() -> None:
    """Five outages in a row (more than max_restarts): still PENDING, restarts 0, the
    region left out for 5, 10, 20, 40, 40 s, one 'since' for the whole outage."""
    now = 200.0
    job = launching(now - 10)
    delays = []
    for i in range(5):
        job = _fail(job, now)
        assert job.phase == PENDING and job.restarts == 0
        w = job.store_wait
        assert w.count == i + 1 and w.since == 200.0 and w.region == "us-east-2"
        delays.append(w.until - now)
        assert store_wait.avoided_region(job, now) == "us-east-2"
        assert store_wait.avoided_region(job, w.until + 0.1) == ""
        assert "checkpoint store of us-east-2 unreachable since" in job.pending_reason
        assert "no restart counted" in job.pending_reason
        now = w.until + 1
        job = must(t.admit(job, admission(), now, CONF))
    assert delays == [5.0, 10.0, 20.0, 40.0, 40.0]


def test_outage_event_and_running_clears_the_wait() -> None:
    job = launching(190.0)
    u = update(job, apb.ATTEMPT_STATE_FAILED, exit_code=81)
    u.update.message = DOWN
    out = updates.attempt_ended(job, u, 200.0, CONF)
    assert out is not None
    ev = [e for e in out.events if e.reason == "store_outage"]
    assert len(ev) == 1 and "no restart counted" in ev[0].message and ev[0].to_phase == PENDING
    job = must(t.admit(out.job, admission(), 300.0, CONF))
    job = must(updates.progress(job, update(job, apb.ATTEMPT_STATE_RUNNING, step=1), 310.0, CONF))
    assert job.phase == RUNNING and not job.HasField("store_wait") and job.restarts == 0


def test_outage_longer_than_the_limit_fails_saying_so() -> None:
    job = _fail(launching(190.0), 200.0)
    job = must(t.admit(job, admission(), 3700.0, CONF))
    job = _fail(job, 3801.0)  # 3601 s after the outage began
    assert job.phase == FAILED and "longer than store_outage_max_s" in job.message
    assert job.restarts == 0


def test_zero_limit_waits_for_ever() -> None:
    conf = CONF.model_copy(update={"store_outage_max_s": 0.0})
    job = launching(190.0)
    u = update(job, apb.ATTEMPT_STATE_FAILED, exit_code=81)
    job = must(updates.attempt_ended(job, u, 200.0, conf))
    job = must(t.admit(job, admission(), 10**6, conf))
    job = must(updates.attempt_ended(job, update(job, apb.ATTEMPT_STATE_FAILED, exit_code=81),
                                     10**6 + 1, conf))
    assert job.phase == PENDING


@pytest.mark.parametrize(("code", "phase", "restarts"), [
    (2, FAILED, 0),    # the job's own configuration: fails at once
    (77, PENDING, 1),  # resume checkpoint gone (not an outage): a restart spent
    (81, PENDING, 0),  # store outage: waited out
])
def test_exit_codes_route(code: int, phase: int, restarts: int) -> None:
    job = _fail(launching(190.0), 200.0, code)
    assert (job.phase, job.restarts) == (phase, restarts)
    assert job.HasField("store_wait") is (code == 81)
