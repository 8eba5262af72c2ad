"""A region agent refusing a Launch is not a crash loop (real broker, fake agents over
the real agent stream): the refusing agent is avoided for the job with an exponential
backoff, another region takes it at once, the refusal is the pending reason and one
event, and refusals in a row fail the job. Asserted by launch counts and state, never
by elapsed time: "no relaunch" is checked over many scheduler passes."""

from __future__ import annotations

from pathlib import Path

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until
from tests.telemetry.test_metrics import sample, scrape


def passes(b: Broker) -> int:
    s = b.server.scheduler
    return s.passes if s is not None else 0


def wait_passes(b: Broker, n: int) -> None:
    """Let the scheduler run ``n`` more passes (each one could have relaunched the job)."""
    start = passes(b)
    wait_until(lambda: passes(b) >= start + n, 30, f"{n} scheduler passes")


def refused_events(b: Broker, job_id: str) -> list[pb.JobEvent]:
    return [e for e in b.events(job_id) if e.type == "launch_refused"]


def test_refusing_agent_is_backed_off_not_relaunched(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, launch_backoff_base_s=600.0, launch_backoff_max_s=600.0))
    agent = None
    try:
        b.team()
        agent = FakeAgent(b.address, "bad", "r1", nodes_for("r1", "bad", 1, 8), refuse_launch=True).connect()
        job = b.submit(spec("refused"))
        agent.wait_launch(job.id)
        j = wait_until(lambda: (lambda x: x if "refused the launch" in x.pending_reason else None)(
            b.get(job.id)), 20, "the refusal as pending reason")
        assert j.phase == pb.JOB_PHASE_PENDING
        assert "bad (r1) refused the launch: refused by test" in j.pending_reason
        assert j.launch_refusals == 1 and [r.agent_id for r in j.refusals] == ["bad"]
        # The real agent also reports the refused attempt FAILED (exit -1) right after its
        # ack: a superseded attempt's end, which changes nothing (no restart is used up).
        agent.update(job.id, 1, apb.ATTEMPT_STATE_FAILED, exit_code=-1,
                     message="launch failed: checkpoint location refused")
        # Before the fix: hundreds of launches per second here. Now: none while backing off.
        wait_passes(b, 20)
        b.server.scheduler.poke()
        wait_passes(b, 5)
        assert len(agent.commands("launch", job.id)) == 1
        assert len(refused_events(b, job.id)) == 1
        after = b.get(job.id)
        assert after.phase == pb.JOB_PHASE_PENDING and after.restarts == 0 and after.attempt == 1
    finally:
        if agent is not None:
            agent.close()
        b.stop()


def test_refusal_moves_the_job_to_another_region_at_once(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, launch_backoff_base_s=600.0, launch_backoff_max_s=600.0))
    agents: list[FakeAgent] = []
    try:
        b.team()
        bad = FakeAgent(b.address, "bad", "r1", nodes_for("r1", "bad", 1, 8), refuse_launch=True).connect()
        agents.append(bad)
        job = b.submit(spec("moves", preferred_regions=["r1"]))
        bad.wait_launch(job.id)
        wait_until(lambda: b.get(job.id).launch_refusals == 1, 20, "refusal recorded")
        good = FakeAgent(b.address, "good", "r2", nodes_for("r2", "good", 1, 8)).connect()
        agents.append(good)
        launch = good.wait_launch(job.id)
        assert launch.attempt == 2 and launch.placement.region == "r2"
        good.update(job.id, 2, apb.ATTEMPT_STATE_RUNNING, step=1)
        run = b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        assert run.launch_refusals == 0  # running resets the count
        assert len(bad.commands("launch", job.id)) == 1
    finally:
        for a in agents:
            a.close()
        b.stop()


def test_refusals_in_a_row_fail_the_job_with_the_reason(tmp_path: Path) -> None:
    # A tiny backoff so the retries happen within the test; the limit ends them.
    b = Broker(fast_config(tmp_path, launch_backoff_base_s=0.05, launch_backoff_max_s=0.2,
                           launch_refusal_limit=3, metrics_listen="127.0.0.1:0"))
    agent = None
    try:
        b.team()
        agent = FakeAgent(b.address, "bad", "r1", nodes_for("r1", "bad", 1, 8), refuse_launch=True).connect()
        job = b.submit(spec("gives-up"))
        done = b.wait_phase(job.id, pb.JOB_PHASE_FAILED, timeout=30)
        assert "gave up after 3 refused launches in a row" in done.message
        assert "refused by test" in done.message
        wait_passes(b, 5)
        assert len(agent.commands("launch", job.id)) == 3
        assert len(refused_events(b, job.id)) == 1  # one distinct refusal, three retries
        assert [e.reason for e in b.events(job.id) if e.to_phase == pb.JOB_PHASE_FAILED] == ["launch_refused"]
        text = scrape(b)  # operators see the refusals as a rate, by region and outcome
        assert sample(text, "computebroker_launch_refusals_total", region="r1", outcome="requeued") == 2
        assert sample(text, "computebroker_launch_refusals_total", region="r1", outcome="gave_up") == 1
    finally:
        if agent is not None:
            agent.close()
        b.stop()


def test_a_reconfigured_agent_gets_the_job_without_waiting(tmp_path: Path) -> None:
    """An operator fixes the refusing agent (a new --checkpoint-root) and restarts it:
    its avoidance ends at once instead of after the (here 10-minute) backoff."""
    b = Broker(fast_config(tmp_path, launch_backoff_base_s=600.0, launch_backoff_max_s=600.0))
    agent = None
    try:
        b.team()
        agent = FakeAgent(b.address, "bad", "r1", nodes_for("r1", "bad", 1, 8), refuse_launch=True).connect()
        job = b.submit(spec("fixed"))
        agent.wait_launch(job.id, attempt=1)
        wait_until(lambda: b.get(job.id).launch_refusals == 1, 20, "refusal recorded")
        agent.close()
        agent.refuse_launch = False
        agent.connect()  # a plain reconnect (same configuration): still avoided
        wait_passes(b, 15)
        assert len(agent.commands("launch", job.id)) == 1
        agent.close()
        agent.roots = [str(tmp_path / "team-ckpt")]
        agent.connect()  # reconfigured
        launch = agent.wait_launch(job.id, attempt=2)
        assert launch.placement.agent_id == "bad"
        assert [e.reason for e in b.events(job.id) if e.type == "refusal_cleared"] == ["agent_reconfigured"]
        assert len(agent.commands("launch", job.id)) == 2
    finally:
        if agent is not None:
            agent.close()
        b.stop()


def test_an_attempt_the_agent_could_not_start_backs_off(tmp_path: Path) -> None:
    """Accepted, then FAILED with exit -1 before RUNNING (the agent's workdir fetch or
    checkpoint copy failed): the same backoff as a refusal, and no restart used up."""
    b = Broker(fast_config(tmp_path, launch_backoff_base_s=600.0, launch_backoff_max_s=600.0))
    agent = None
    try:
        b.team()
        agent = FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 1, 8)).connect()
        job = b.submit(spec("unstartable"))
        agent.wait_launch(job.id, attempt=1)
        agent.update(job.id, 1, apb.ATTEMPT_STATE_FAILED, exit_code=-1,
                     message="workdir fetch failed: cannot fetch workdir sha256:44: not stored")
        j = wait_until(lambda: (lambda x: x if x.launch_refusals == 1 else None)(b.get(job.id)), 20,
                       "the failed start recorded")
        assert j.phase == pb.JOB_PHASE_PENDING and j.restarts == 0
        assert "workdir fetch failed" in j.pending_reason
        wait_passes(b, 15)
        assert len(agent.commands("launch", job.id)) == 1
        assert len(refused_events(b, job.id)) == 1
    finally:
        if agent is not None:
            agent.close()
        b.stop()
