"""Which restart budget a failed attempt spends (broker/jobs/budgets.py), row by row.

Each row of FAILURE_BUDGETS has a test through the live recovery policy and the pure
transition the broker runs for an attempt's end (updates.attempt_ended): the kind it is
classified as, what it spends, and how the job ends when that budget runs out. The
docs' table (docs/recovery.md "Restart budgets") is checked against the code's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.jobs import budgets, updates
from broker.jobs.budgets import FAILURE_BUDGETS, Budget, FailureKind, classify
from broker.jobs.lifecycle import FAILED, PENDING
from broker.jobs.recovery import RecoveryPolicy, Restart
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import CFG, admission, must, running, spec, update

ROOT = Path(__file__).resolve().parents[2]
CONF = CFG.model_copy(update={"max_restarts": 2, "max_node_failures": 3,
                              "node_failure_window_s": 3600.0})


def fail(job: pb.Job, now: float, code: int, nodes: tuple[str, ...] = (), message: str = ""
         ) -> tuple[pb.Job, list[pb.JobEvent]]:
    u = update(job, apb.ATTEMPT_STATE_FAILED, exit_code=code, failed=nodes)
    u.update.message = message
    out = updates.attempt_ended(job, u, now, CONF)
    assert out is not None
    return out.job, list(out.events)


def relaunch(job: pb.Job, now: float) -> pb.Job:
    """Placed and running again (the relaunch after a requeue)."""
    from broker.jobs import transitions as t

    j = must(t.admit(job, admission(), now, CONF))
    return must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=1), now + 1, CONF))


# ---- the table, as data --------------------------------------------------------------------
def test_every_failure_kind_has_one_budget() -> None:
    assert set(FAILURE_BUDGETS) == set(FailureKind)


@pytest.mark.parametrize(("code", "nodes", "message", "kind"), [
    (2, (), "", FailureKind.CONFIG_ERROR),
    (2, ("n0",), "", FailureKind.CONFIG_ERROR),
    (1, (), "Traceback...\nModuleNotFoundError: No module named 'x'", FailureKind.DETERMINISTIC_ERROR),
    (81, ("n0",), "", FailureKind.STORE_OUTAGE),
    (-9, ("n0",), "", FailureKind.NODE_LOST),  # Popen: killed by SIGKILL
    (137, ("n0",), "", FailureKind.NODE_LOST),  # a container / shell: 128 + 9
    (-1, ("n0",), "", FailureKind.NODE_LOST),  # a pod that could not start on its node
    (1, ("n0",), "RuntimeError: loss is nan", FailureKind.JOB_ERROR),  # its own exception
    (-9, (), "", FailureKind.JOB_ERROR),  # a signal, no node blamed
    (76, ("n0",), "", FailureKind.JOB_ERROR),
    (0, ("n0",), "", FailureKind.JOB_ERROR),  # code unknown
])
def test_classify(code: int, nodes: tuple[str, ...], message: str, kind: FailureKind) -> None:
    assert classify(code, message, nodes) is kind


def test_docs_table_matches_the_code() -> None:
    """docs/recovery.md's table names every kind and the budget the code gives it."""
    text = (ROOT / "docs" / "recovery.md").read_text()
    section = text.split("## Restart budgets", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|[^|]*\|[^|]*\| `(\w+)` \|", section, re.M)
    assert {FailureKind(k): Budget(b) for k, b in rows} == FAILURE_BUDGETS


# ---- one test per row ----------------------------------------------------------------------
def test_row_config_error_fails_at_once() -> None:
    job, events = fail(running(), 200.0, 2, ("n0",))
    assert job.phase == FAILED and events[-1].reason == "config_error"
    assert (job.restarts, job.node_failures) == (0, 0)


def test_row_deterministic_error_fails_at_once() -> None:
    job, events = fail(running(), 200.0, 1, (), "ImportError: cannot import name 'x'")
    assert job.phase == FAILED and events[-1].reason == "config_error"
    assert "deterministic error" in events[-1].message


def test_row_store_outage_spends_nothing() -> None:
    job = running()
    for i in range(5):
        job, _ = fail(job, 200.0 + i, 81, ("n0",))
        assert job.phase == PENDING
        job = relaunch(job, 300.0 + i * 100)
    assert (job.restarts, job.node_failures) == (0, 0)


def test_row_node_lost_spends_node_failures_never_max_restarts() -> None:
    """More node losses than max_restarts (2): still relaunched; restarts stays 0; the
    4th within the hour (max_node_failures 3) fails the job, naming the budget."""
    job, now = running(), 200.0
    for i in range(3):
        job, events = fail(job, now, -9, ("n0",))
        assert job.phase == PENDING, events[-1].message
        assert (job.restarts, job.node_failures) == (0, i + 1)
        assert f"relaunching (node failure {i + 1}/3 within 1h)" in events[-1].message
        assert events[-1].details["budget"] == Restart.RETRY_NODE.value
        job = relaunch(job, now + 10)
        now += 60
    job, events = fail(job, now, -9, ("n0",))
    assert job.phase == FAILED
    ev = events[-1]
    assert ev.reason == "max_node_failures"
    assert "lost nodes 3 time(s) within 1h (max_node_failures 3)" in ev.message, ev.message
    assert (ev.details["node_failures"], ev.details["max_node_failures"]) == ("3", "3")


def test_row_node_lost_window_forgets_old_losses() -> None:
    """Losses older than the window no longer count: a long job that loses a node every
    40 minutes is never failed by 3 per hour."""
    job, now = running(), 200.0
    for _ in range(8):
        job, events = fail(job, now, -9, ("n0",))
        assert job.phase == PENDING, events[-1].message
        job = relaunch(job, now + 10)
        now += 40 * 60
    assert job.node_failures == 8 and job.restarts == 0
    assert len(job.node_failure_times) <= 2  # only the recent ones are kept


def test_row_job_error_spends_max_restarts_even_with_a_node_blamed() -> None:
    """A crash-looping script (exit 1 on a blamed node) ends FAILED at max_restarts."""
    job, now = running(), 200.0
    for i in range(2):
        job, events = fail(job, now, 1, ("n0",), "RuntimeError: boom")
        assert job.phase == PENDING and job.restarts == i + 1
        assert f"relaunching (restart {i + 1}/2)" in events[-1].message
        job = relaunch(job, now + 10)
        now += 5
    job, events = fail(job, now, 1, ("n0",), "RuntimeError: boom")
    assert job.phase == FAILED and events[-1].reason == "max_restarts"
    assert "(max_restarts 2)" in events[-1].message and job.node_failures == 0


# ---- the spec's own budget -----------------------------------------------------------------
def test_spec_overrides_the_broker_budget() -> None:
    s = spec()
    s.max_node_failures = 0  # set, so it wins over the broker's 3: the first loss fails
    job, events = fail(running(s=s), 200.0, -9, ("n0",))
    assert job.phase == FAILED and events[-1].reason == "max_node_failures"
    s = spec()
    s.max_node_failures, s.node_failure_window_s = 1, 0.0  # 1 over the job's whole life
    job = running(s=s)
    assert RecoveryPolicy().restart(-9, job, CONF, "", ("n0",), 1e9) is Restart.RETRY_NODE
    job.node_failures, job.node_failure_times[:] = 1, [10.0]
    assert RecoveryPolicy().restart(-9, job, CONF, "", ("n0",), 1e9) is Restart.GIVE_UP_NODES
    assert budgets.node_budget_text(job, CONF, 1e9) == "1/1 over the job's life"
