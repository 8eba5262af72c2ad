"""Reports that change nothing write nothing (broker/jobs/updates.py tells_nothing_new).

Why: every agent heartbeat re-lists each running attempt with its progress. Written
each time (one store write, one fsync each) they were most of a leader's writes with
thousands of attempts running, and each reset the progress throttle, so the next
report with a new step was held back until a later heartbeat: seconds before a user
saw it. Over the real agent stream (mutual TLS) with a real broker and store."""

from __future__ import annotations

import time
from pathlib import Path

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

RUNNING = apb.ATTEMPT_STATE_RUNNING
THROTTLE_S = 0.5


def heartbeat_with(agent: FakeAgent, job_id: str, attempt: int, step: int) -> None:
    """A heartbeat listing the attempt with its progress, as the real agent sends it."""
    agent.send(apb.AgentMessage(heartbeat=apb.Heartbeat(time=time.time(), running=[
        apb.RunningAttempt(job_id=job_id, attempt=attempt, state=RUNNING,
                           progress=pb.Progress(step=step, total_steps=100))])))


def test_repeated_progress_is_not_rewritten_and_does_not_hold_back_the_next_step(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, progress_write_interval_s=THROTTLE_S))
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", nodes_for("us-east-2", "a", 1, 8),
                      bucket="s3://cb-us-east-2")
    try:
        agent.connect()
        b.team()
        job = b.submit(spec("steady"))
        launch = agent.wait_launch(job.id)
        agent.update(job.id, launch.attempt, RUNNING, step=10)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        wait_until(lambda: b.get(job.id).progress.step == 10, 10, "step 10 stored")
        time.sleep(THROTTLE_S * 1.5)  # the throttle would let a write through now
        version = b.get(job.id).version
        acks = len(agent.update_acks)
        for _ in range(5):
            heartbeat_with(agent, job.id, launch.attempt, 10)  # nothing new
        agent.update(job.id, launch.attempt, RUNNING, step=10)  # nothing new either
        wait_until(lambda: len(agent.update_acks) > acks, 10, "the repeat acked")
        assert b.get(job.id).version == version, "unchanged progress was written again"
        # The next real step is written at once: the repeats did not use up the throttle.
        agent.update(job.id, launch.attempt, RUNNING, step=11)
        wait_until(lambda: len(agent.update_acks) > acks + 1, 10, "step 11 acked")
        got = b.get(job.id)
        assert got.progress.step == 11 and got.version == version + 1
        # A heartbeat whose progress is new is still taken (it may be the only news).
        time.sleep(THROTTLE_S * 1.5)
        heartbeat_with(agent, job.id, launch.attempt, 12)
        wait_until(lambda: b.get(job.id).progress.step == 12, 10, "the heartbeat's new step stored")
    finally:
        agent.close()
        b.stop()


def test_a_report_of_the_start_is_written_even_with_the_stored_progress(tmp_path: Path) -> None:
    """LAUNCHING -> RUNNING is news whatever the progress says (the resume step that
    the job already shows, as after a relaunch)."""
    b = Broker(fast_config(tmp_path, progress_write_interval_s=THROTTLE_S))
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", nodes_for("us-east-2", "a", 1, 8),
                      bucket="s3://cb-us-east-2")
    try:
        agent.connect()
        b.team()
        job = b.submit(spec("start"))
        launch = agent.wait_launch(job.id)
        assert b.get(job.id).phase == pb.JOB_PHASE_LAUNCHING
        agent.update(job.id, launch.attempt, RUNNING, step=0)  # same step as stored (0)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    finally:
        agent.close()
        b.stop()


def test_unchanged_heartbeat_entries_skip_the_store_but_a_lost_stop_is_still_caught(
        tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A heartbeat entry identical to the last one for a plainly running job costs no
    store read, except on every DRIFT_FULL_EVERY-th heartbeat, which still fences an
    attempt the broker no longer wants (here: the job moved on behind the agent's back,
    as if its Stop were lost)."""
    from broker.api import agent_service
    from broker.jobs.views import JobsView

    b = Broker(fast_config(tmp_path))
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", nodes_for("us-east-2", "a", 1, 8),
                      bucket="s3://cb-us-east-2")
    try:
        agent.connect()
        b.team()
        job = b.submit(spec("listed"))
        launch = agent.wait_launch(job.id)
        agent.update(job.id, launch.attempt, RUNNING, step=10)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        wait_until(lambda: b.get(job.id).progress.step == 10, 10, "step 10 stored")
        reads: list[str] = []
        real_find = JobsView.find

        def counting_find(self: JobsView, job_id: str) -> pb.Job | None:
            reads.append(job_id)
            return real_find(self, job_id)

        def beat(n: int) -> None:
            for _ in range(n):
                heartbeat_with(agent, job.id, launch.attempt, 10)
            # a JobUpdate after them on the same stream: once acked, they were handled
            acks = len(agent.update_acks)
            agent.update(job.id, launch.attempt, RUNNING, step=10)
            wait_until(lambda: len(agent.update_acks) > acks, 10, "the heartbeats handled")

        agent.heartbeat = False  # only our heartbeats from here (the harness's list no progress)
        agent._stop.set()  # noqa: SLF001 - ends the harness's heartbeat thread
        time.sleep(0.5)
        agent._stop.clear()  # noqa: SLF001
        beat(1)  # the entry as listed is now remembered
        monkeypatch.setattr(JobsView, "find", counting_find)
        beat(2 * agent_service.DRIFT_FULL_EVERY)
        listed = [r for r in reads if r == job.id]
        # the JobUpdates read it once each (two); the heartbeats: only the full checks
        assert len(listed) <= 2 + 2, f"{len(listed)} store reads for {2 * agent_service.DRIFT_FULL_EVERY}" \
                                     " unchanged heartbeat entries"
        # The job moves on without the agent hearing it (a lost Stop): written behind
        # the broker's back; the next full check fences the attempt the agent still lists.
        stored = b.store.get_job(job.id)
        moved = pb.Job()
        moved.CopyFrom(stored)
        moved.attempt = launch.attempt + 1
        b.store.update_job(moved, stored.version)
        # The streams judge running jobs on the leader's memory copies (broker/jobs/
        # hot_jobs.py), which learn a write behind the applier's back from the
        # scheduler's next read of the store (its safety re-read; here: forced). A Stop
        # this broker sent and the agent lost is in memory at once (its own write).
        sched = b.server.leadership.scheduler
        sched.live.forget()
        sched.poke()
        wait_until(lambda: (c := b.ops.applier.hot.get(job.id)) is None or c.attempt == moved.attempt,
                   10, "the scheduler's re-read")
        for _ in range(agent_service.DRIFT_FULL_EVERY):
            heartbeat_with(agent, job.id, launch.attempt, 10)
        stop = agent.wait_stop(job.id, apb.STOP_REASON_STALE_ATTEMPT, timeout=10)
        assert stop.attempt == launch.attempt
    finally:
        agent.close()
        b.stop()


def test_a_listing_differing_only_in_its_time_is_unchanged_and_no_progress_stays_none() -> None:
    """The heartbeat entry's signature (agent_service._progress_sig): an agent stamping
    each listing with the time it made it does not make every entry news; an entry that
    lists no progress is not given one by being looked at (a step 0 would be written)."""
    from broker.api.agent_service import _progress_sig

    a = apb.RunningAttempt(job_id="j", attempt=1, state=RUNNING,
                           progress=pb.Progress(step=5, loss=1.5, updated_time=100.0))
    b = apb.RunningAttempt(job_id="j", attempt=1, state=RUNNING,
                           progress=pb.Progress(step=5, loss=1.5, updated_time=200.0))
    assert _progress_sig(a) == _progress_sig(b)
    assert a.progress.updated_time == 100.0 and b.progress.updated_time == 200.0
    c = apb.RunningAttempt(job_id="j", attempt=1, state=RUNNING, progress=pb.Progress(step=6))
    assert _progress_sig(c) != _progress_sig(a)
    bare = apb.RunningAttempt(job_id="j", attempt=1, state=RUNNING)
    assert _progress_sig(bare) is None
    assert not bare.HasField("progress")
