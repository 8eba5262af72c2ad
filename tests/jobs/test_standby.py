"""Make-before-break as pure transitions (broker/jobs/standby.py, broker/jobs/handoff.py).

Tables of (job, input) -> job + commands: the standby is reserved while the source
saves, is never the job's attempt before the go, goes only once the source's end is
written, resumes from the final checkpoint or the newest durable one, and is dropped
and fenced whenever its move is called off.
"""

from __future__ import annotations

import placement
from broker.jobs import standby, updates
from broker.jobs import transitions as t
from broker.jobs.handoff import GoAction, SourceEnd, decide
from broker.jobs.lifecycle import CHECKPOINTING, LAUNCHING, RUNNING
from broker.jobs.outcome import SendLaunch, SendStop
from broker.jobs.recovery import Trigger
from broker.scheduling.snapshot import build
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import CFG, must, running, stop, update

MBB = CFG.model_copy(update={"make_before_break": True})
DST = "eu-west-1-a"


def draining(now: float = 130.0, trigger: Trigger = Trigger.REGION_DRAIN) -> pb.Job:
    j = running(now - 10)
    # a durable periodic checkpoint at step 4 before the move
    j = must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=5, ckpt=4), now - 5, MBB))
    return must(t.request_stop(j, stop(trigger, j, now), now, MBB))


def reserve(job: pb.Job, now: float = 131.0):  # noqa: ANN201
    adm = placement.Admission(job_id=job.id, agent_id=DST, region="eu-west-1",
                              assignments=(("e0", 8),))
    return standby.reserve(job, standby.ReserveStandby(adm, {}, "s3://cb-eu-west-1"), now, MBB)


def test_handoff_decisions() -> None:
    assert decide(SourceEnd.RUNNING, final_uri="a", durable_uri="a").action is GoAction.WAIT
    assert decide(SourceEnd.FINISHED, final_uri="", durable_uri="a").action is GoAction.ABORT
    ok = decide(SourceEnd.CHECKPOINTED, final_uri="s3://x/step-9", durable_uri="s3://x/step-4")
    assert (ok.action, ok.resume_from) == (GoAction.GO, "s3://x/step-9")
    failed = decide(SourceEnd.FAILED, final_uri="", durable_uri="s3://x/step-4")
    assert (failed.action, failed.resume_from) == (GoAction.GO, "s3://x/step-4")
    lost = decide(SourceEnd.LOST, final_uri="", durable_uri="")
    assert (lost.action, lost.resume_from) == (GoAction.GO, "")


def test_reserve_starts_a_standby_while_the_source_saves() -> None:
    j = draining()
    assert j.phase == CHECKPOINTING and standby.wanted(j, MBB)
    out = reserve(j)
    assert out is not None
    sb = out.job.standby
    assert (out.job.attempt, sb.attempt, sb.source_attempt) == (1, 2, 1)  # not the job's attempt yet
    assert out.job.placement.agent_id != DST and sb.placement.agent_id == DST
    assert sb.checkpoint_uri.endswith("/attempt-2")
    (cmd,) = out.commands
    assert isinstance(cmd, SendLaunch) and cmd.agent_id == DST
    assert cmd.launch.standby and cmd.launch.attempt == 2 and cmd.launch.resume_from == ""
    assert cmd.launch.transfer_mode == "direct"
    m = out.job.migrations[-1]
    assert m.make_before_break and m.standby_launched_time == 131.0
    assert reserve(out.job) is None  # one standby per move
    assert "standby_launched" in [e.type for e in out.events]


def test_no_standby_when_off_or_not_a_move() -> None:
    j = draining()
    assert standby.reserve(j, standby.ReserveStandby(
        placement.Admission(job_id=j.id, agent_id=DST, region="eu-west-1", assignments=(("e0", 8),)),
        {}, "s3://b"), 131.0, CFG) is None  # make_before_break off
    pre = running()
    pre = must(t.request_stop(pre, stop(Trigger.PREEMPTED, pre, 130.0), 130.0, MBB))
    assert not standby.wanted(pre, MBB)  # a preemption is not a move


def test_source_checkpointed_then_the_standby_goes_from_its_final_checkpoint() -> None:
    j = must(reserve(draining()))
    ended = updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=6, ckpt=6), 140.0, MBB)
    assert ended is not None
    job = ended.job
    assert job.phase == LAUNCHING and job.attempt == 2 and job.placement.agent_id == DST
    gos = [c for c in ended.commands if isinstance(c, standby.SendGo)]
    assert len(gos) == 1 and gos[0].agent_id == DST and gos[0].attempt == 2
    assert gos[0].resume_from.endswith("/attempt-1/step-6")
    assert not any(isinstance(c, SendLaunch) for c in ended.commands)  # no second launch
    m = job.migrations[-1]
    # phases present and ordered
    assert 0 < m.started_time <= m.standby_launched_time <= m.checkpointed_time <= m.go_time
    assert m.launched_time == m.go_time and m.to_attempt == 2 and m.to_region == "eu-west-1"
    assert m.resume_from.endswith("/attempt-1/step-6")
    # the Go is re-sent until the attempt runs, then the standby record is gone
    assert standby.go_due(job, DST, 2) is not None and standby.go_due(job, DST, 1) is None
    run = must(updates.progress(job, update(job, apb.ATTEMPT_STATE_RUNNING, step=7, ckpt=6,
                                            agent=DST), 150.0, MBB))
    assert run.phase == RUNNING and not run.HasField("standby")
    m = run.migrations[-1]
    assert m.state == "done" and m.go_time <= m.running_time <= m.first_step_time


def test_failed_final_checkpoint_goes_from_the_newest_durable_one() -> None:
    j = must(reserve(draining()))
    # the final save failed: exit 1 while a drain was in flight
    u = update(j, apb.ATTEMPT_STATE_FAILED, exit_code=1)
    ended = must(updates.attempt_ended(j, u, 140.0, MBB))
    assert ended.phase == LAUNCHING and ended.attempt == 2
    go = standby.go_due(ended, DST, 2)
    assert go is not None and go.resume_from.endswith("/attempt-1/step-4")


def test_cancel_drops_and_fences_the_standby() -> None:
    j = must(reserve(draining()))
    out = t.cancel(j, t.Cancel(actor="u", reason="", agent_connected=True), 135.0, MBB)
    assert out is not None and not out.job.HasField("standby")
    fences = [c for c in out.commands if isinstance(c, SendStop) and c.agent_id == DST]
    assert fences and fences[0].attempt == 2 and fences[0].kind is None


def test_lost_source_drops_the_standby() -> None:
    j = must(reserve(draining()))
    from broker.jobs.recovery import RecoveryPolicy, Signal

    plan = RecoveryPolicy().plan(Signal(Trigger.AGENT_LOST), j, MBB, 136.0)
    assert plan is not None
    out = t.attempt_lost(j, t.AttemptLost(agent_id=j.placement.agent_id, plan=plan, message="lost"),
                         136.0, MBB)
    assert out is not None and not out.job.HasField("standby")
    assert any(isinstance(c, SendStop) and c.agent_id == DST and c.attempt == 2 for c in out.commands)


def test_standby_that_dies_before_its_go_is_dropped() -> None:
    j = must(reserve(draining()))
    u = apb.JobUpdate(job_id=j.id, attempt=2, state=apb.ATTEMPT_STATE_FAILED, exit_code=1, message="oom")
    assert standby.is_standby(j, DST, 2) and not standby.is_standby(j, DST, 1)
    out = standby.standby_ended(j, DST, u, 137.0)
    assert out is not None and not out.job.HasField("standby")
    assert out.job.phase == CHECKPOINTING and out.job.attempt == 1  # the source is untouched
    # the source's end is then an ordinary move (MIGRATING, placed again)
    ended = must(updates.attempt_ended(out.job, update(out.job, apb.ATTEMPT_STATE_CHECKPOINTED,
                                                       step=6, ckpt=6), 140.0, MBB))
    assert ended.phase == pb.JOB_PHASE_MIGRATING and ended.attempt == 1


def test_standby_missing_after_its_agent_restarted_is_dropped() -> None:
    j = must(reserve(draining()))
    assert standby.standby_missing(j, "other-agent", 137.0) is None
    out = standby.standby_missing(j, DST, 137.0)
    assert out is not None and not out.job.HasField("standby") and out.job.attempt == 1


def test_snapshot_reserves_standby_capacity_off_the_source_agent() -> None:


    class Agent:
        def __init__(self, agent_id: str, nodes: list[str], region: str) -> None:
            self.agent_id, self.region, self.connected = agent_id, region, True
            self.record = apb.Register(agent_id=agent_id, region=region)
            for n in nodes:
                self.record.nodes.add(id=n, gpus=8, region=region)

    src_agent = running().placement.agent_id
    agents = [Agent(src_agent, ["n0", "n1"], "us-east-2"), Agent(DST, ["e0"], "eu-west-1")]
    j = draining()
    snap = build(now=131.0, agents=agents, jobs=[j], teams=[], plans=[], draining=[],
                 priority_of=lambda s: 0, make_before_break=True)
    (req,) = snap.pending
    assert req.id == standby.request_id(j.id) and {"n0", "n1"} <= req.excluded_nodes
    held = must(reserve(j))
    snap = build(now=132.0, agents=agents, jobs=[held], teams=[], plans=[], draining=[],
                 priority_of=lambda s: 0, make_before_break=True)
    assert not snap.pending
    assert {r.id for r in snap.running} == {j.id, standby.request_id(j.id)}


def test_a_job_started_from_a_shared_checkpoint_moves_on_from_it() -> None:
    """Before it has a checkpoint of its own, a job started from another job's (a share)
    launches and hands a make-before-break move over from that one, never from scratch."""
    from tests.jobs.helpers import admission, spec, submitted

    shared = "s3://cb-us-east-2/jobs/j-src/attempt-1/step-000000010"
    s = spec()
    s.resume_from = "j-src"
    s.resume_source.CopyFrom(pb.ResumeSource(job_id="j-src", team="ml", uri=shared, share_id="share-1",
                                             prefix="s3://cb-us-east-2/jobs/j-src"))
    out = t.admit(submitted(s), admission(), 110.0, MBB)
    assert out is not None
    launch = next(c.launch for c in out.commands if isinstance(c, SendLaunch))
    assert launch.resume_from == shared and launch.checkpoint_uri.endswith("/jobs/j-1/attempt-1")
    j = must(updates.progress(out.job, update(out.job, apb.ATTEMPT_STATE_RUNNING, step=3), 120.0, MBB))
    assert not j.progress.last_checkpoint_uri
    j = must(t.request_stop(j, stop(Trigger.REGION_DRAIN, j, 130.0), 130.0, MBB))
    j = must(reserve(j))
    ended = must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_FAILED, exit_code=1), 140.0, MBB))
    go = standby.go_due(ended, DST, 2)
    assert go is not None and go.resume_from == shared
