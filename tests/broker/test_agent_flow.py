"""Broker <-> agent over the real AgentService stream (scripted fake agents):
launch and run to success, cancel running, auto-resume, config error, agent loss,
fencing, drain, capacity while running, broker restart."""

from __future__ import annotations

import threading
from pathlib import Path

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

RUNNING = apb.ATTEMPT_STATE_RUNNING


def start_running(broker: Broker, agent: FakeAgent, s: pb.JobSpec) -> tuple[pb.Job, apb.Launch]:
    job = broker.submit(s)
    launch = agent.wait_launch(job.id)
    agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_STARTING)
    agent.update(job.id, launch.attempt, RUNNING, step=1)
    broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    return job, launch


def test_launch_run_succeed_with_watch(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    agent = make_agent("us-east-2", nodes=2, gpus=8)
    job = broker.submit(spec("ok", nodes=2, gpus=4))
    watched: list[pb.JobEvent] = []
    done = threading.Event()

    def watch() -> None:
        for ev in broker.jobs.WatchJob(jpb.WatchJobRequest(job_id=job.id, include_progress=True), timeout=60):
            watched.append(ev)
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    launch = agent.wait_launch(job.id)
    assert launch.attempt == 1
    assert launch.checkpoint_uri == f"s3://cb-us-east-2/jobs/{job.id}/attempt-1"
    assert launch.resume_from == ""
    assert launch.placement.world_size == 8 and len(launch.placement.nodes) == 2
    assert launch.placement.agent_id == agent.agent_id
    assert broker.get(job.id).phase == pb.JOB_PHASE_LAUNCHING
    agent.update(job.id, 1, RUNNING, step=5)
    broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    uri = f"s3://cb-us-east-2/jobs/{job.id}/step-000000010"
    agent.update(job.id, 1, RUNNING, step=12, ckpt_step=10, ckpt_uri=uri)
    wait_until(lambda: broker.get(job.id).progress.last_checkpoint_step == 10, 10, "checkpoint stored")
    agent.update(job.id, 1, apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt_step=100, ckpt_uri=uri + "0")
    final = broker.wait_phase(job.id, pb.JOB_PHASE_SUCCEEDED)
    assert final.progress.step == 100 and final.finished_time > 0
    assert final.goodput.productive_s > 0 and final.goodput.wall_s >= final.goodput.productive_s
    assert done.wait(15)
    phases = [e.to_phase for e in watched if e.to_phase != e.from_phase]
    assert phases == [pb.JOB_PHASE_PENDING, pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_LAUNCHING,
                      pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_SUCCEEDED]
    types = [e.type for e in watched]
    assert "checkpoint" in types and "progress" in types
    assert all(e.region == "us-east-2" for e in watched if e.type == "launched")
    assert [e.seq for e in watched] == list(range(1, len(watched) + 1))


def test_cancel_running_job(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    agent = make_agent()
    job, launch = start_running(broker, agent, spec("c"))
    out = broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id, reason="stop it"))
    assert out.phase == pb.JOB_PHASE_RUNNING and out.stop_reason == "cancel"
    stop = agent.wait_stop(job.id, apb.STOP_REASON_CANCEL)
    assert stop.attempt == launch.attempt and not stop.checkpoint_first
    agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_STOPPED)
    broker.wait_phase(job.id, pb.JOB_PHASE_CANCELLED)
    # GPUs are free again.
    wait_until(lambda: all(r.allocated_gpus == 0 for r in
                           broker.capacity.ListRegions(cpb.ListRegionsRequest()).regions), 10, "free")


def test_cancel_completes_after_timeout_when_agent_silent(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, cancel_timeout_s=1.0))
    try:
        b.team()
        agent = FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 1, 8)).connect()
        job, _ = start_running(b, agent, spec("c"))
        b.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id))
        done = b.wait_phase(job.id, pb.JOB_PHASE_CANCELLED, timeout=20)
        assert b.events(job.id)[-1].reason == "cancel_timeout"
        assert done.phase == pb.JOB_PHASE_CANCELLED
        agent.close()
    finally:
        b.stop()


def test_failure_auto_resume_excludes_node_then_gives_up(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, max_restarts=1))
    try:
        b.team()
        agent = FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 2, 8)).connect()
        job, l1 = start_running(b, agent, spec("f"))
        failed_node = l1.placement.nodes[0].node_id
        agent.update(job.id, 1, apb.ATTEMPT_STATE_FAILED, exit_code=1, message="boom\nNCCL error",
                     failed_nodes=[failed_node])
        l2 = agent.wait_launch(job.id, attempt=2)
        assert failed_node not in [n.node_id for n in l2.placement.nodes]
        j = b.get(job.id)
        assert j.restarts == 1 and failed_node in j.excluded_nodes
        agent.update(job.id, 2, RUNNING, step=3)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        agent.update(job.id, 2, apb.ATTEMPT_STATE_FAILED, exit_code=1, message="boom again")
        final = b.wait_phase(job.id, pb.JOB_PHASE_FAILED)
        assert "giving up" in final.message
        assert b.events(job.id)[-1].reason == "max_restarts"
        agent.close()
    finally:
        b.stop()


def test_config_error_fails_without_retry(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    agent = make_agent()
    job, launch = start_running(broker, agent, spec("cfg"))
    agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_FAILED, exit_code=2,
                 message="unknown model 'huge'")
    final = broker.wait_phase(job.id, pb.JOB_PHASE_FAILED)
    assert final.restarts == 0 and "unknown model" in final.message
    assert broker.events(job.id)[-1].reason == "config_error"
    logs = broker.jobs.GetJobLogs(jpb.GetJobLogsRequest(job_id=job.id)).lines
    assert any("unknown model" in line for line in logs)


def test_missing_resume_checkpoint_is_relaunched_not_a_config_error(broker: Broker, make_agent) -> None:  # noqa: ANN001
    """Exit 77 (docs/contracts.md section 1): the resume checkpoint was gone (pruned by a
    still-running older attempt). Not terminal, unlike exit 2: the job is relaunched."""
    broker.team()
    agent = make_agent()
    job, launch = start_running(broker, agent, spec("gone"))
    agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_FAILED, exit_code=77,
                 message="resume checkpoint unavailable: step-000000010 is gone")
    l2 = agent.wait_launch(job.id, attempt=launch.attempt + 1)
    assert l2.attempt == launch.attempt + 1
    j = broker.get(job.id)
    assert j.phase != pb.JOB_PHASE_FAILED and j.restarts == 1
    reasons = [e.reason for e in broker.events(job.id)]
    assert "auto_resume" in reasons and "config_error" not in reasons


def test_agent_lost_relaunches_elsewhere_from_checkpoint(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    a1 = make_agent("us-east-2", agent_id="east", nodes=1, gpus=8)
    job, l1 = start_running(broker, a1, spec("move", allowed_regions=[]))
    ck = f"s3://cb-us-east-2/jobs/{job.id}/step-000000020"
    a1.update(job.id, 1, RUNNING, step=25, ckpt_step=20, ckpt_uri=ck)
    wait_until(lambda: broker.get(job.id).progress.last_checkpoint_uri == ck, 10, "ckpt")
    a2 = make_agent("eu-west-1", agent_id="west", nodes=1, gpus=8)
    a1.close()  # hard stop: no more heartbeats
    l2 = a2.wait_launch(job.id, timeout=30)
    assert l2.attempt == 2
    assert l2.resume_from == ck
    assert l2.checkpoint_uri == f"s3://cb-eu-west-1/jobs/{job.id}/attempt-2"
    j = broker.get(job.id)
    assert j.placement.region == "eu-west-1" and j.relaunches == 1
    evs = broker.events(job.id)
    lost = [e for e in evs if e.reason == "agent_lost"]
    assert lost and lost[0].to_phase == pb.JOB_PHASE_PENDING
    relaunch = [e for e in evs if e.to_phase == pb.JOB_PHASE_LAUNCHING][-1]
    assert relaunch.region == "eu-west-1" and relaunch.details["resume_from"] == ck
    # The old agent comes back still running attempt 1: it is told that attempt is stale.
    a1.running = {job.id: 1}
    a1.connect()
    assert job.id in a1.ack.stale_job_ids


def test_stale_attempt_update_is_fenced(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    agent = make_agent()
    job, launch = start_running(broker, agent, spec("s"))
    agent.update(job.id, launch.attempt + 5, RUNNING, step=99)
    stop = agent.wait_stop(job.id, apb.STOP_REASON_STALE_ATTEMPT)
    assert stop.attempt == launch.attempt + 5 and not stop.checkpoint_first
    j = broker.get(job.id)
    assert j.progress.step != 99 and j.phase == pb.JOB_PHASE_RUNNING


def test_reconnect_reconcile_keeps_known_and_relaunches_missing(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    agent = make_agent(nodes=2, gpus=8)
    keep, lk = start_running(broker, agent, spec("keep", gpus=8))
    gone, lg = start_running(broker, agent, spec("gone", gpus=8))
    agent.close()
    agent.running = {keep.id: lk.attempt}  # "gone" died while we were disconnected
    agent.connect()
    assert not agent.ack.stale_job_ids
    l2 = agent.wait_launch(gone.id, attempt=lg.attempt + 1, timeout=20)
    assert l2.attempt == 2
    assert broker.get(keep.id).phase == pb.JOB_PHASE_RUNNING
    assert any(e.reason == "attempt_missing" for e in broker.events(gone.id))


def test_drain_moves_job_to_other_region(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    east = make_agent("us-east-2", agent_id="east", nodes=1, gpus=8)
    job, l1 = start_running(broker, east, spec("d"))
    west = make_agent("eu-west-1", agent_id="west", nodes=1, gpus=8)
    resp = broker.capacity.DrainRegion(cpb.DrainRegionRequest(region="us-east-2", reason="maintenance"))
    assert resp.draining and list(resp.moved_job_ids) == [job.id]
    stop = east.wait_stop(job.id, apb.STOP_REASON_DRAIN)
    assert stop.checkpoint_first and stop.attempt == l1.attempt
    assert broker.get(job.id).phase == pb.JOB_PHASE_CHECKPOINTING
    ck = f"s3://cb-us-east-2/jobs/{job.id}/step-000000030"
    east.update(job.id, 1, apb.ATTEMPT_STATE_CHECKPOINTED, step=30, ckpt_step=30, ckpt_uri=ck)
    l2 = west.wait_launch(job.id)
    assert l2.attempt == 2 and l2.resume_from == ck
    phases = [e.to_phase for e in broker.events(job.id) if e.to_phase != e.from_phase]
    assert phases[-3:] == [pb.JOB_PHASE_CHECKPOINTING, pb.JOB_PHASE_MIGRATING, pb.JOB_PHASE_LAUNCHING]
    regions = {r.name: r for r in broker.capacity.ListRegions(cpb.ListRegionsRequest()).regions}
    assert regions["us-east-2"].draining and regions["us-east-2"].drain_reason == "maintenance"
    # Nothing new lands in a draining region.
    other = broker.submit(spec("new", allowed_regions=["us-east-2"]))
    wait_until(lambda: broker.get(other.id).pending_reason, 10, "pending reason")
    assert not east.commands("launch", other.id)
    broker.capacity.DrainRegion(cpb.DrainRegionRequest(region="us-east-2", undrain=True))
    east.wait_launch(other.id)
    assert broker.get(job.id).goodput.lost_migration_s >= 0


def test_capacity_and_team_usage_while_running(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team("ml", gpus=6)
    agent = make_agent("us-east-2", nodes=2, gpus=4)
    job, _ = start_running(broker, agent, spec("cap", gpus=3, nodes=2))
    rows = broker.capacity.GetCapacity(cpb.GetCapacityRequest(include_nodes=True, by_block=True))
    assert sum(r.total_gpus for r in rows.rows) == 8
    assert sum(r.allocated_gpus for r in rows.rows) == 6
    assert sum(r.free_gpus for r in rows.rows) == 2
    assert sum(r.borrowed_gpus for r in rows.rows) == 0  # 6 used, 6 guaranteed
    assert all(r.block for r in rows.rows)
    assert {j for n in rows.nodes for j in n.job_ids} == {job.id}
    team = broker.capacity.GetTeamQuota(cpb.GetTeamQuotaRequest(team="ml"))
    assert team.used_gpus == 6 and team.borrowed_gpus == 0 and team.running_jobs == 1
    region = broker.capacity.ListRegions(cpb.ListRegionsRequest()).regions[0]
    assert region.connected and region.total_gpus == 8 and region.allocated_gpus == 6
    assert region.running_jobs == 1 and region.checkpoint_bucket == "s3://cb-us-east-2"
    # Cordon: the free node's GPUs are no longer free.
    node = rows.nodes[0].node.id
    broker.capacity.CordonNode(cpb.CordonNodeRequest(node_id=node))
    rows2 = broker.capacity.GetCapacity(cpb.GetCapacityRequest(include_nodes=True))
    assert [n.node.cordoned for n in rows2.nodes if n.node.id == node] == [True]


def test_launch_refused_requeues(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    bad = make_agent("r1", agent_id="bad", nodes=1, gpus=8, refuse_launch=True)
    job = broker.submit(spec("r"))
    bad.wait_launch(job.id)
    wait_until(lambda: any(e.reason == "launch_refused" for e in broker.events(job.id)), 10,
               "launch_refused event")


def test_broker_restart_keeps_jobs_and_events(tmp_path: Path) -> None:
    cfg = fast_config(tmp_path, startup_grace_s=3.0)
    b = Broker(cfg)
    b.team()
    agent = FakeAgent(b.address, "a1", "r1", nodes_for("r1", "a1", 1, 8)).connect()
    running, launch = start_running(b, agent, spec("run"))
    waiting = b.submit(spec("wait", nodes=1, gpus=8))
    wait_until(lambda: b.get(waiting.id).pending_reason, 10, "pending reason")
    before = {j: len(b.events(j)) for j in (running.id, waiting.id)}
    agent.close()
    b.stop()
    b2 = Broker(cfg.model_copy(update={"listen": "127.0.0.1:0"}))
    try:
        for j, n in before.items():
            assert len(b2.events(j)) >= n
        assert b2.get(running.id).phase == pb.JOB_PHASE_RUNNING
        regions = b2.capacity.ListRegions(cpb.ListRegionsRequest()).regions
        assert regions[0].total_gpus == 8 and not regions[0].connected  # inventory survived
        agent2 = FakeAgent(b2.address, "a1", "r1", nodes_for("r1", "a1", 1, 8),
                           running={running.id: launch.attempt}).connect()
        assert not agent2.ack.stale_job_ids
        agent2.update(running.id, launch.attempt, apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        b2.wait_phase(running.id, pb.JOB_PHASE_SUCCEEDED)
        l2 = agent2.wait_launch(waiting.id)
        assert l2.attempt == 1
        seqs = [e.seq for e in b2.events(running.id)]
        assert seqs == list(range(1, len(seqs) + 1))
        assert not any(e.reason == "agent_lost" for e in b2.events(running.id))
        agent2.close()
    finally:
        b2.stop()


def test_a_finished_attempt_listed_in_register_is_not_taken_as_its_end(broker: Broker, make_agent) -> None:  # noqa: ANN001
    """Found by the fault campaign (benchmarks/chaos.py): an attempt that ended while its
    agent was down is listed in the restarted agent's Register (state FAILED, no exit
    code). The broker took that as the attempt's end with exit 0, which the restart policy
    read as "success", so the job went FAILED ("giving up") at once. Now the listing is
    not an end; the agent's full JobUpdate that follows is, and the job is relaunched."""
    broker.team()
    agent = make_agent(nodes=1, gpus=8)
    job, launch = start_running(broker, agent, spec("ended-while-away", gpus=8))
    agent.close()
    agent.states = {job.id: apb.ATTEMPT_STATE_FAILED}
    agent.connect()
    agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_FAILED, exit_code=78,
                 message="rank 0 exited with code 78")
    relaunch = agent.wait_launch(job.id, attempt=launch.attempt + 1)
    assert relaunch.attempt == 2
    got = broker.get(job.id)
    assert got.phase != pb.JOB_PHASE_FAILED and got.restarts == 1, got
    assert not any(e.reason == "max_restarts" for e in broker.events(job.id))
