"""The agent streams read the jobs they run from memory (broker/jobs/hot_jobs.py), over
the real agent stream (mutual TLS) with a real broker and SQLite store.

What must hold: reports of a running attempt are answered without a store read of the
job; a write made behind the applier's back (an operator tool on the same file) is
never undone by a report judged on the older copy (the compare-and-set re-reads);
progress stays monotone; an end is still judged on the store and taken once."""

from __future__ import annotations

from pathlib import Path

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

RUNNING = apb.ATTEMPT_STATE_RUNNING


def start(tmp_path: Path) -> tuple[Broker, FakeAgent]:
    b = Broker(fast_config(tmp_path, progress_write_interval_s=0.0))
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", nodes_for("us-east-2", "a", 1, 8),
                      bucket="s3://cb-us-east-2")
    agent.connect()
    b.team()
    return b, agent


def _with_label(job: pb.Job, note: str) -> pb.Job:
    out = pb.Job()
    out.CopyFrom(job)
    out.spec.labels["ops-note"] = note
    return out


def test_reports_are_judged_from_memory_and_progress_stays_monotone(tmp_path: Path) -> None:
    b, agent = start(tmp_path)
    try:
        job = b.submit(spec("hot"))
        launch = agent.wait_launch(job.id)
        hot = b.ops.applier.hot
        agent.update(job.id, launch.attempt, RUNNING, step=10)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        hits = hot.hits
        acks = len(agent.update_acks)
        for step in (20, 30, 25, 40):  # 25: an older step after a newer one
            agent.update(job.id, launch.attempt, RUNNING, step=step)
        wait_until(lambda: len(agent.update_acks) >= acks + 4, 10, "the four reports acked")
        assert hot.hits >= hits + 4, "running reports still read the store"
        got = b.get(job.id)
        assert got.progress.step == 40
        seen = [int(e.details["step"]) for e in b.events(job.id)
                if e.type == "progress" and "step" in e.details]
        assert seen == sorted(seen), f"progress events went back: {seen}"
    finally:
        agent.close()
        b.stop()


def test_a_write_behind_the_appliers_back_is_kept(tmp_path: Path) -> None:
    """The memory copy is older than the store: the report's write conflicts, is
    re-run on the stored job, and both changes are there."""
    b, agent = start(tmp_path)
    try:
        job = b.submit(spec("behind"))
        launch = agent.wait_launch(job.id)
        agent.update(job.id, launch.attempt, RUNNING, step=10)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        wait_until(lambda: b.get(job.id).progress.step == 10, 10, "step 10 stored")
        stored = b.store.get_job(job.id)
        edited = pb.Job()
        edited.CopyFrom(stored)
        edited.spec.labels["ops-note"] = "edited by a tool"
        b.store.update_job(edited, stored.version)  # not through the applier
        cached = b.ops.applier.hot.get(job.id)
        assert cached is not None and cached.version == stored.version  # memory is behind
        acks = len(agent.update_acks)
        agent.update(job.id, launch.attempt, RUNNING, step=60)
        wait_until(lambda: len(agent.update_acks) > acks, 10, "step 60 acked")
        got = b.store.get_job(job.id)
        assert got.progress.step == 60
        assert got.spec.labels["ops-note"] == "edited by a tool"
        assert got.version >= stored.version + 2
        # The scheduler's read of the store (its safety re-read; here: forced) brings a
        # write behind the back into memory too.
        b.store.update_job(edited_again := _with_label(got, "second"), got.version)
        sched = b.server.leadership.scheduler
        sched.live.forget()
        sched.poke()
        wait_until(lambda: (c := b.ops.applier.hot.get(job.id)) is not None
                   and c.spec.labels["ops-note"] == "second", 10, "the re-read in memory")
        assert b.ops.applier.hot.get(job.id).version == edited_again.version + 1
        acks = len(agent.update_acks)
        agent.update(job.id, launch.attempt, RUNNING, step=70)
        wait_until(lambda: len(agent.update_acks) > acks, 10, "step 60 acked")
        got = b.store.get_job(job.id)
        assert got.progress.step == 70 and got.spec.labels["ops-note"] == "second"
    finally:
        agent.close()
        b.stop()


def test_an_end_is_taken_once_and_forgotten_by_memory(tmp_path: Path) -> None:
    b, agent = start(tmp_path)
    try:
        job = b.submit(spec("ends"))
        launch = agent.wait_launch(job.id)
        agent.update(job.id, launch.attempt, RUNNING, step=10)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        assert b.ops.applier.hot.get(job.id) is not None
        agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        b.wait_phase(job.id, pb.JOB_PHASE_SUCCEEDED)
        wait_until(lambda: agent.acked(job.id, apb.ATTEMPT_STATE_SUCCEEDED), 10, "the end acked")
        assert b.ops.applier.hot.get(job.id) is None
        # the agent re-sends the end (its ack lost): applied once, acked again
        before = [e.type for e in b.events(job.id)]
        agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        wait_until(lambda: sum(1 for a in agent.update_acks
                               if a.job_id == job.id and a.state == apb.ATTEMPT_STATE_SUCCEEDED) >= 2,
                   10, "the repeat acked")
        assert [e.type for e in b.events(job.id)] == before
    finally:
        agent.close()
        b.stop()
