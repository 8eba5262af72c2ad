"""Pre-copy for planned make-before-break moves, as pure transitions (broker/jobs/precopy.py).

(job, input) -> job + commands: a planned move of a job with a durable checkpoint holds
the source's Stop, the standby's Launch names that checkpoint to pre-copy, and the Stop
goes once the destination reports the copy ended, when the hold runs out, when the
standby dies, or at once when a spot notice comes. A spot notice never waits; the go
after a failed final save reads the pre-copied checkpoint in the destination's region.
"""

from __future__ import annotations

from broker.jobs import precopy, standby, updates
from broker.jobs import transitions as t
from broker.jobs.lifecycle import CHECKPOINTING, LAUNCHING
from broker.jobs.outcome import SendLaunch, SendStop
from broker.jobs.recovery import RecoveryPolicy, Signal, Trigger
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import AGENT, must, running, stop, update
from tests.jobs.test_standby import DST, MBB, draining, reserve

SRC_CKPT = "/attempt-1/step-4"


def stops(out: object) -> list[SendStop]:
    return [c for c in out.commands if isinstance(c, SendStop) and c.agent_id == AGENT]  # type: ignore[attr-defined]


def precopy_done(job: pb.Job, error: str = "") -> apb.JobUpdate:
    u = apb.JobUpdate(job_id=job.id, attempt=job.standby.attempt, state=apb.ATTEMPT_STATE_STARTING)
    u.transfer.CopyFrom(pb.TransferStats(
        src_uri=job.migrations[-1].precopy_from, dst_uri="s3://cb-eu-west-1/jobs/j-1/attempt-2/step-000000004",
        bytes_total=1000, bytes_done=0 if error else 1000, seconds=2.0, method="server-side-copy",
        done=not error, error=error))
    return u


def test_a_drain_holds_the_stop_and_the_standby_precopies_the_last_checkpoint() -> None:
    j = draining()
    m = j.migrations[-1]
    assert j.phase == CHECKPOINTING and precopy.held(j) is not None
    assert m.precopy_from.endswith(SRC_CKPT) and m.stop_held_until == 130.0 + MBB.precopy_wait_s
    assert not m.stop_sent_time and not j.stop_requested_time  # nothing asked of the source yet
    out = reserve(j)
    assert out is not None and not stops(out)
    (launch,) = [c for c in out.commands if isinstance(c, SendLaunch)]
    assert launch.launch.standby and launch.launch.precopy_from.endswith(SRC_CKPT)
    # the destination reports the copy: the held Stop goes now, with the drain's grace
    res = precopy.reported(out.job, precopy_done(out.job), 150.0, MBB)
    assert res is not None
    done = res.job
    (s,) = stops(res)
    assert s.checkpoint_first and s.attempt == 1 and s.grace_s == MBB.preempt_grace_s
    m = done.migrations[-1]
    assert m.precopy_done_time == 150.0 == m.stop_sent_time == done.stop_requested_time
    assert m.precopy_uri.endswith("/attempt-2/step-000000004") and m.precopy.done
    assert precopy.held(done) is None
    # the source trained while the Stop was held: productive, not lost to the move
    assert done.goodput.productive_s - out.job.goodput.productive_s == 150.0 - 130.0
    assert done.goodput.lost_migration_s == out.job.goodput.lost_migration_s
    assert precopy.reported(done, precopy_done(done), 151.0, MBB) is None  # once
    assert [e.type for e in res.events].index("precopied") < [e.type for e in res.events].index("stop_sent")


def test_the_go_after_a_failed_final_save_reads_the_precopied_checkpoint_locally() -> None:
    sb = must(reserve(draining()))
    j = must(precopy.reported(sb, precopy_done(sb), 150.0, MBB))
    ended = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=1), 160.0, MBB))
    assert ended.phase == LAUNCHING and ended.attempt == 2
    go = standby.go_due(ended, DST, 2)
    assert go is not None and go.resume_from == "s3://cb-eu-west-1/jobs/j-1/attempt-2/step-000000004"
    # ... while a durable final checkpoint is still read straight from the source's store
    ok = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=6, ckpt=6),
                                    160.0, MBB))
    go = standby.go_due(ok, DST, 2)
    assert go is not None and go.resume_from.endswith("/attempt-1/step-6")


def test_a_failed_precopy_releases_the_stop_too() -> None:
    j = must(reserve(draining()))
    out = precopy.reported(j, precopy_done(j, error="AccessDenied"), 150.0, MBB)
    assert out is not None and len(stops(out)) == 1
    m = out.job.migrations[-1]
    assert m.precopy.error == "AccessDenied" and not m.precopy_uri
    assert "precopy_failed" in [e.type for e in out.events]


def test_the_hold_runs_out_without_a_standby() -> None:
    j = draining()
    until = j.migrations[-1].stop_held_until
    assert not precopy.expired(j, until - 1) and precopy.release_expired(j, None, until - 1, MBB) is None
    out = precopy.release_expired(j, None, until, MBB)
    assert out is not None and len(stops(out)) == 1 and out.job.stop_requested_time == until
    assert not precopy.expired(out.job, until + 1)


def test_a_standby_that_dies_releases_the_held_stop() -> None:
    j = must(reserve(draining()))
    u = apb.JobUpdate(job_id=j.id, attempt=2, state=apb.ATTEMPT_STATE_FAILED, exit_code=1, message="oom")
    out = standby.standby_ended(j, DST, u, 140.0)
    assert out is not None and len(stops(out)) == 1 and not out.job.HasField("standby")


def test_a_spot_notice_during_the_hold_sends_the_stop_at_once_with_its_deadline() -> None:
    j = must(reserve(draining()))
    plan = RecoveryPolicy().plan(Signal(Trigger.SPOT_NOTICE, deadline=140.0 + 30.0), j, MBB, 140.0)
    assert plan is not None
    out = t.request_stop(j, t.StopRequest(plan=plan, actor="agent", message="spot"), 140.0, MBB)
    assert out is not None
    (s,) = stops(out)
    assert s.grace_s == 20.0 < MBB.preempt_grace_s  # the notice's deadline minus its margin
    assert out.job.standby.attempt == 2  # the standby stays: the move goes on


def test_no_hold_for_a_spot_notice_or_without_a_durable_checkpoint_or_when_off() -> None:
    spot = draining(trigger=Trigger.SPOT_NOTICE)
    assert precopy.held(spot) is None and spot.stop_requested_time == 130.0
    assert spot.migrations[-1].stop_sent_time == 130.0
    fresh = running()  # no durable checkpoint yet: nothing to pre-copy
    out = t.request_stop(fresh, stop(Trigger.REGION_DRAIN, fresh, 130.0), 130.0, MBB)
    assert out is not None and len(stops(out)) == 1
    off = MBB.model_copy(update={"precopy_wait_s": 0.0})
    j = running(120.0)
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=5, ckpt=4), 125.0, off))
    out = t.request_stop(j, stop(Trigger.REGION_DRAIN, j, 130.0), 130.0, off)
    assert out is not None and len(stops(out)) == 1 and precopy.held(out.job) is None
