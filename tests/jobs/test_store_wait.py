"""A checkpoint store outage is waited out, not failed (broker/jobs/store_wait.py):
exit 81 spends no restart, requeues with backoff away from the region, says so in the
pending reason, and fails only past store_outage_max_s. Exit 2 still fails at once."""

from __future__ import annotations

import pytest

from broker.jobs import store_wait, updates
from broker.jobs import transitions as t
from broker.jobs.budgets import FAILURE_BUDGETS, Budget, FailureKind, classify
from broker.jobs.lifecycle import FAILED, PENDING, RUNNING
from broker.jobs.recovery import RecoveryPolicy, Restart
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import CFG, admission, launching, must, running, submitted, update

CONF = CFG.model_copy(update={"max_restarts": 2, "store_outage_backoff_base_s": 5.0,
                              "store_outage_backoff_max_s": 40.0, "store_outage_max_s": 3600.0})
DOWN = "checkpoint storage s3://cb-us-east-2 is unreachable: Could not connect to the endpoint URL"


def _fail(job, now: float, code: int = 81):  # noqa: ANN001, ANN202
    u = update(job, apb.ATTEMPT_STATE_FAILED, exit_code=code)
    u.update.message = DOWN
    return must(updates.attempt_ended(job, u, now, CONF))


def test_exit_decisions_are_data() -> None:
    assert classify(81, "", ()) is FailureKind.STORE_OUTAGE
    assert classify(81, "", ("n1",)) is FailureKind.STORE_OUTAGE  # even with a node blamed
    assert FAILURE_BUDGETS[FailureKind.STORE_OUTAGE] is Budget.STORE_WAIT
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


def _admit_in(job, region: str, agent: str, now: float):  # noqa: ANN001, ANN202
    import placement

    adm = placement.Admission(job_id=job.id, agent_id=agent, region=region, assignments=(("n0", 8),))
    return t.admit(job, t.Admit(admission=adm, nodes={}, checkpoint_bucket=f"s3://cb-{region}"),
                   now, CONF)


def _ran_in_eu_then_us_and_us_store_went_down() -> pb.Job:
    """Attempt 1 in eu-west-1 made step 20 durable there; attempt 2 in us-east-2 made
    step 40 durable there; then us-east-2's store went down (exit 81)."""
    j = must(t.submit(t.Submit(job_id="j-1", spec=running().spec, client_request_id="", actor="u",
                               regions_known=True), 90.0, CONF))
    j = must(_admit_in(j, "eu-west-1", "eu-west-1-a", 100.0))
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=22, ckpt=20,
                                        agent="eu-west-1-a"), 110.0, CONF))
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, step=22, ckpt=20,
                                             exit_code=1, agent="eu-west-1-a"), 120.0, CONF))
    j = must(t.admit(j, admission(), 130.0, CONF))
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=41, ckpt=40), 140.0, CONF))
    return _fail(j, 150.0)


MOVE = CONF.store_outage_move_after_s


def test_region_checkpoints_are_remembered() -> None:
    j = _ran_in_eu_then_us_and_us_store_went_down()
    got = {rc.region: (rc.step, rc.uri.rsplit("/", 2)[-2]) for rc in j.region_checkpoints}
    assert got == {"eu-west-1": (20, "attempt-1"), "us-east-2": (40, "attempt-2")}
    assert j.store_wait.region == "us-east-2" and j.store_wait.move_time == 150.0 + MOVE


def test_a_job_with_a_checkpoint_waits_for_its_region_then_may_move() -> None:
    j = _ran_in_eu_then_us_and_us_store_went_down()
    assert store_wait.allowed_regions(j, 160.0) == {"us-east-2"}
    assert store_wait.allowed_regions(j, 150.0 + MOVE) == {"us-east-2", "eu-west-1"}
    # before the deadline, a placement in eu-west-1 is no move (it would resume from 40)
    early = must(_admit_in(j, "eu-west-1", "eu-west-1-a", 160.0))
    assert early.progress.last_checkpoint_step == 40
    # past it: resume from the durable step 20 in eu-west-1, and the event says why
    out = _admit_in(j, "eu-west-1", "eu-west-1-a", 151.0 + MOVE)
    assert out is not None
    (moved,) = [e for e in out.events if e.type == "moved"]
    assert moved.reason == "store_outage"
    assert "checkpoint store of us-east-2 unreachable since" in moved.message
    assert "resuming in eu-west-1 from its durable checkpoint at step 20" in moved.message
    (launch,) = [c for c in out.commands if isinstance(c, t.SendLaunch)]
    assert launch.launch.resume_from.endswith("/attempt-1/step-20")
    assert out.job.progress.step == 20 and out.job.restarts == 1  # the exit-1 in eu-west-1 only
    # once it runs there, the wait is over
    run = must(updates.progress(out.job, update(out.job, apb.ATTEMPT_STATE_RUNNING, step=21,
                                                agent="eu-west-1-a"), 152.0 + MOVE, CONF))
    assert not run.HasField("store_wait")


def test_a_job_without_a_checkpoint_may_start_elsewhere_at_once() -> None:
    j = _fail(launching(190.0), 200.0)
    assert not j.progress.last_checkpoint_uri
    assert store_wait.allowed_regions(j, 201.0) is None
    assert store_wait.avoided_region(j, 201.0) == "us-east-2"


def test_zero_move_after_never_moves() -> None:
    conf = CONF.model_copy(update={"store_outage_move_after_s": 0.0})
    j = launching(190.0)
    j = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=81), 200.0, conf))
    assert j.store_wait.move_time == 0.0
    assert store_wait.move_source(j, "eu-west-1", 10**9) is None


class _Agent:
    """What the snapshot reads of a connected agent (broker/agents/registry.AgentState)."""

    def __init__(self, agent_id: str, nodes: list[str], region: str) -> None:
        self.agent_id, self.region, self.connected = agent_id, region, True
        self.record = apb.Register(agent_id=agent_id, region=region)
        for n in nodes:
            self.record.nodes.add(id=n, gpus=8, region=region)


def test_snapshot_applies_the_wait() -> None:
    """The scheduler's view: the region waited for is left out during the backoff, other
    regions while the job's checkpoint is only there, and a region holding an older
    checkpoint of the job is offered past the move time."""
    from broker.scheduling.snapshot import build

    agents = [_Agent("us-east-2-a", ["n0"], "us-east-2"), _Agent("eu-west-1-a", ["e0"], "eu-west-1"),
              _Agent("ap-south-1-a", ["a0"], "ap-south-1")]
    j = _ran_in_eu_then_us_and_us_store_went_down()

    def excluded(now: float) -> set[str]:
        snap = build(now=now, agents=agents, jobs=[j], teams=[], plans=[], draining=[],
                     priority_of=lambda s: 0)
        (req,) = snap.pending
        return set(req.excluded_nodes) & {"n0", "e0", "a0"}

    assert excluded(151.0) == {"n0", "e0", "a0"}  # backing off; the checkpoint is in us-east-2
    assert excluded(j.store_wait.until + 1) == {"e0", "a0"}  # retry us-east-2 only
    assert excluded(j.store_wait.move_time + 1) == {"a0"}  # eu-west-1 holds step 20
    fresh = _fail(launching(190.0), 200.0)  # no checkpoint: anywhere but the failing region
    snap = build(now=201.0, agents=agents, jobs=[fresh], teams=[], plans=[], draining=[],
                 priority_of=lambda s: 0)
    assert set(snap.pending[0].excluded_nodes) & {"n0", "e0", "a0"} == {"n0"}


def test_a_healthy_probe_after_the_last_failure_ends_the_backoff() -> None:
    j = _fail(launching(190.0), 200.0)
    assert j.store_wait.last_time == 200.0
    assert store_wait.avoided_region(j, 201.0) == "us-east-2"
    assert store_wait.avoided_region(j, 201.0, store_ok_since=150.0) == "us-east-2"  # before it
    assert store_wait.avoided_region(j, 201.0, store_ok_since=200.5) == ""  # the store is back


def test_launch_tells_the_ranks_how_long_they_may_wait_for_the_store() -> None:
    """CB_STORE_WAIT_S in the Launch: store_outage_attempt_wait_s, but never more than
    what is left of the job's store_outage_max_s budget (the wait in the attempt must not
    outlast the wait the broker allows)."""
    conf = CONF.model_copy(update={"store_outage_attempt_wait_s": 120.0})

    def env_of(job: pb.Job, now: float) -> str:
        out = t.admit(job, admission(), now, conf)
        assert out is not None
        launch = next(c.launch for c in out.commands if hasattr(c, "launch"))
        return launch.env[store_wait.STORE_WAIT_ENV]

    job = launching(100.0)
    assert job.attempt == 1
    fresh = t.admit(submitted(), admission(), 100.0, conf)  # a first launch: full wait
    assert fresh is not None
    assert next(c.launch for c in fresh.commands if hasattr(c, "launch")).env[
        store_wait.STORE_WAIT_ENV] == "120"
    job = _fail(job, 200.0)  # waiting for its store since 200
    assert env_of(job, job.store_wait.until + 1) == "120"
    assert env_of(job, 200.0 + 3600.0 - 30.0) == "30"  # 30 s of the budget left
    assert env_of(job, 200.0 + 3600.0 + 5.0) == "0"
    unlimited = conf.model_copy(update={"store_outage_max_s": 0.0})
    out = t.admit(job, admission(), 10**6, unlimited)
    assert out is not None
    assert next(c.launch for c in out.commands if hasattr(c, "launch")).env[
        store_wait.STORE_WAIT_ENV] == "120"


def test_once_the_store_answers_again_the_note_says_so_not_unreachable() -> None:
    """A job still pending after the outage's end (waiting for capacity in the region
    that holds its checkpoint) must not keep saying the store is unreachable."""
    job = _fail(launching(190.0), 200.0)
    w = job.store_wait
    assert "unreachable since" in store_wait.pending_note(job, 201.0)
    # a probe healthy since before the failed attempt says nothing about this outage
    assert "unreachable since" in store_wait.pending_note(job, 201.0, store_ok_since=w.last_time - 5)
    back = store_wait.pending_note(job, 260.0, store_ok_since=250.0)
    assert back.startswith("checkpoint store of us-east-2 answers again since "), back
    assert store_wait.clock(250.0) in back and store_wait.clock(w.since) in back, back
    assert "no restart counted" in back and "unreachable since" not in back, back
