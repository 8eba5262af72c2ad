"""RegionAgent over a real gRPC stream, against the scripted FakeBroker (fake_broker.py).

Covers docs/contracts.md section 6 "Agent stream semantics": register contents, heartbeats, launch/stop
with acks, fencing, reconnect (processes survive and are re-registered), stale
attempts from RegisterAck, spot notices and health flips.
"""

from __future__ import annotations

import os
import time

import pytest

from computebroker.v1 import agent_pb2, common_pb2
from region_agents.agent import main
from tests.agents.fake_broker import wait_for

AS = agent_pb2.AttemptState
LONG = {"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.05"}


def launch_msg(command, job="j-1", attempt=1, env=None, nodes=("t1-p5-000",)):
    return agent_pb2.Launch(
        job_id=job, attempt=attempt, checkpoint_uri="",
        spec=common_pb2.JobSpec(name=job, command=command, env=env or {},
                                resources=common_pb2.Resources(nodes=len(nodes), gpus_per_node=8)),
        placement=common_pb2.Placement(
            region="test-1", world_size=8 * len(nodes),
            nodes=[common_pb2.NodeAssignment(node_id=n, gpus=8) for n in nodes]),
    )


def test_register_contents_and_heartbeats(broker, agent):
    reg = wait_for(lambda: broker.of("register"), 30, what="register")[0]
    assert reg.agent_id == "test-1-a" and reg.region == "test-1" and reg.executor == "local"
    assert [n.id for n in reg.nodes] == ["t1-p5-000", "t1-p5-001", "t1-spot-000"]
    assert reg.nodes[0].gpus == 8 and reg.nodes[2].capacity_type == common_pb2.CAPACITY_TYPE_SPOT
    assert reg.checkpoint_bucket.endswith("ckpt") and not reg.running
    # Register is the first message of the stream; heartbeats follow at the acked interval.
    assert broker.messages[0][1].WhichOneof("msg") == "register"
    wait_for(lambda: len(broker.of("heartbeat")) >= 3, 30, what="3 heartbeats")
    assert agent.heartbeat_interval_s == pytest.approx(0.3)
    assert all(hb.time > 0 for hb in broker.of("heartbeat"))


def test_launch_runs_and_reports_lifecycle(broker, agent, fake_trainer):
    wait_for(lambda: agent.connected, 30, what="connected")
    cid = broker.send(launch=launch_msg(fake_trainer, env={"FAKE_STEPS": "10", "FAKE_STEP_S": "0.1"}))
    assert broker.wait_ack(cid).accepted
    end = broker.wait_terminal("j-1", 1)
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED and end.exit_code == 0
    assert end.progress.step == 10
    states = broker.states("j-1", 1)
    assert states[0] == AS.ATTEMPT_STATE_STARTING and AS.ATTEMPT_STATE_RUNNING in states
    assert states[-1] == AS.ATTEMPT_STATE_SUCCEEDED
    assert sum(u.state in (4, 5, 6, 7) for u in broker.updates("j-1", 1)) == 1
    # While running, heartbeats list it.
    assert any(r.job_id == "j-1" for hb in broker.of("heartbeat") for r in hb.running)


def test_stop_checkpoint_and_kill_and_checkpoint_now(broker, agent, fake_trainer):
    wait_for(lambda: agent.connected, 30, what="connected")
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, job="a", env=LONG)))
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, job="b", env=LONG, nodes=("t1-p5-001",))))
    wait_for(lambda: AS.ATTEMPT_STATE_RUNNING in broker.states("a"), 60, what="a running")
    ack = broker.wait_ack(broker.send(checkpoint=agent_pb2.CheckpointNow(job_id="a", attempt=1)))
    assert ack.accepted
    wait_for(lambda: any(u.progress.last_checkpoint_step > 0 for u in broker.updates("a")), 60,
             what="checkpoint progress")
    ack = broker.wait_ack(broker.send(stop=agent_pb2.Stop(job_id="a", attempt=1, checkpoint_first=True,
                                                          grace_s=60, reason=agent_pb2.STOP_REASON_PREEMPT)))
    assert ack.accepted
    end = broker.wait_terminal("a", 1)
    assert end.state == AS.ATTEMPT_STATE_CHECKPOINTED and end.exit_code == 75
    ack = broker.wait_ack(broker.send(stop=agent_pb2.Stop(job_id="b", attempt=1, checkpoint_first=False)))
    assert ack.accepted
    assert broker.wait_terminal("b", 1).state == AS.ATTEMPT_STATE_STOPPED


def test_fencing(broker, agent, fake_trainer):
    wait_for(lambda: agent.connected, 30, what="connected")
    assert broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, attempt=2, env=LONG))).accepted
    # Lower attempt than seen: refused.
    stale = broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, attempt=1, env=LONG)))
    assert not stale.accepted and "stale attempt 1" in stale.message
    # Stop for an attempt it is not running: refused; for an unknown job: refused.
    bad = broker.wait_ack(broker.send(stop=agent_pb2.Stop(job_id="j-1", attempt=1)))
    assert not bad.accepted and "runs attempt 2" in bad.message
    assert not broker.wait_ack(broker.send(stop=agent_pb2.Stop(job_id="nope", attempt=1))).accepted
    # Duplicate launch of the running attempt: acked, not started twice.
    assert broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, attempt=2, env=LONG))).accepted
    assert len(agent.executor.running()) == 1
    # A higher attempt kills the older one first.
    assert broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, attempt=3, env=LONG))).accepted
    assert broker.wait_terminal("j-1", 2).state == AS.ATTEMPT_STATE_STOPPED
    wait_for(lambda: [(r.job_id, r.attempt) for r in agent.executor.running()] == [("j-1", 3)], 30,
             what="only attempt 3 running")
    # Placement naming a node this agent does not have: refused and reported FAILED.
    bad = broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, job="x", nodes=("ghost",))))
    assert not bad.accepted and "ghost" in bad.message
    assert broker.wait_terminal("x", 1).state == AS.ATTEMPT_STATE_FAILED


def test_reconnect_processes_survive_and_reregister(broker, agent, fake_trainer):
    wait_for(lambda: agent.connected, 30, what="connected")
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, env=LONG)))
    wait_for(lambda: AS.ATTEMPT_STATE_RUNNING in broker.states("j-1"), 60, what="running")
    pids = [r.proc.pid for r in agent.executor.get("j-1", 1).ranks]
    port = broker.port
    broker.stop()
    wait_for(lambda: not agent.connected, 30, what="agent notices the disconnect")
    time.sleep(1.0)  # let it fail a few reconnect attempts (backoff), not a timing assertion
    for pid in pids:
        os.kill(pid, 0)  # still alive: raises if the trainer died with the stream
    broker.start(port)
    wait_for(lambda: len(broker.of("register")) >= 2, 60, what="re-register")
    reg = broker.of("register")[-1]
    assert [(r.job_id, r.attempt) for r in reg.running] == [("j-1", 1)]
    assert reg.running[0].state == AS.ATTEMPT_STATE_RUNNING and reg.running[0].progress.step > 0
    # And the stream works again: a stop goes through.
    wait_for(lambda: agent.connected, 30, what="reconnected")
    assert broker.wait_ack(broker.send(stop=agent_pb2.Stop(job_id="j-1", attempt=1))).accepted
    assert broker.wait_terminal("j-1", 1).state == AS.ATTEMPT_STATE_STOPPED


def test_terminal_update_while_disconnected_is_reported_on_reregister(broker, agent, fake_trainer):
    wait_for(lambda: agent.connected, 30, what="connected")
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, env={"FAKE_STEPS": "30", "FAKE_STEP_S": "0.1"})))
    wait_for(lambda: AS.ATTEMPT_STATE_RUNNING in broker.states("j-1"), 60, what="running")
    port = broker.port
    broker.stop()
    wait_for(lambda: not agent.executor.running(), 90, what="attempt finishes while disconnected")
    broker.messages.clear()
    broker.start(port)
    reg = wait_for(lambda: broker.of("register"), 60, what="re-register")[0]
    assert [(r.job_id, r.state) for r in reg.running] == [("j-1", AS.ATTEMPT_STATE_SUCCEEDED)]
    assert broker.wait_terminal("j-1", 1).state == AS.ATTEMPT_STATE_SUCCEEDED


def test_stale_job_ids_in_register_ack_are_killed(broker, agent, fake_trainer):
    wait_for(lambda: agent.connected, 30, what="connected")
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, env=LONG)))
    wait_for(lambda: AS.ATTEMPT_STATE_RUNNING in broker.states("j-1"), 60, what="running")
    port = broker.port
    broker.stop()
    broker.stale_job_ids = ["j-1"]
    broker.start(port)
    assert broker.wait_terminal("j-1", 1).state == AS.ATTEMPT_STATE_STOPPED
    assert agent.executor.running() == []


def test_spot_notice_and_health_flip_reach_the_broker(broker, agent, fake_trainer, tmp_path):
    wait_for(lambda: agent.connected, 30, what="connected")
    # File-based spot notice (the simulated cluster's metadata service).
    (tmp_path / "work" / "spot-notices" / "t1-spot-000").write_text("90")
    notice = wait_for(lambda: [n for hb in broker.of("heartbeat") for n in hb.spot_notices], 30,
                      what="spot notice")[0]
    assert notice.node_id == "t1-spot-000" and notice.deadline_time > 0
    # In-process injection.
    agent.inject_spot_notice("t1-p5-001")
    wait_for(lambda: any(n.node_id == "t1-p5-001" for hb in broker.of("heartbeat") for n in hb.spot_notices),
             30, what="injected spot notice")
    # Every heartbeat lists every active notice (absence is withdrawal at the broker).
    n_before = len(broker.of("heartbeat"))
    wait_for(lambda: len(broker.of("heartbeat")) >= n_before + 2, 30, what="two more heartbeats")
    ids = {n.node_id for hb in broker.of("heartbeat") for n in hb.spot_notices}
    assert ids == {"t1-p5-001", "t1-spot-000"}
    for hb in broker.of("heartbeat")[n_before:]:
        assert {n.node_id for n in hb.spot_notices} == {"t1-p5-001", "t1-spot-000"}
    # A node going unhealthy: NodeHealth in a heartbeat, and its attempt fails blaming it.
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, env=LONG)))
    wait_for(lambda: AS.ATTEMPT_STATE_RUNNING in broker.states("j-1"), 60, what="running")
    (tmp_path / "work" / "node-health" / "t1-p5-000").write_text("unhealthy: xid 79")
    h = wait_for(lambda: [x for hb in broker.of("heartbeat") for x in hb.node_health], 30,
                 what="node health")[0]
    assert (h.node_id, h.healthy, h.reason) == ("t1-p5-000", False, "xid 79")
    end = broker.wait_terminal("j-1", 1)
    assert end.state == AS.ATTEMPT_STATE_FAILED and list(end.failed_nodes) == ["t1-p5-000"]
    # Healthy again: reported; and a re-register carries the current health.
    agent.set_node_health("t1-p5-000", True)
    wait_for(lambda: any(x.healthy for hb in broker.of("heartbeat") for x in hb.node_health), 30,
             what="healthy again")


def test_main_rejects_bad_arguments(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("region: r\nnodes:\n  - name: a\n    gpus: 0\n")
    assert main(["--allow-root-jobs", "--broker", "127.0.0.1:1", "--inventory", str(bad)]) == 2
    assert "'gpus' must be a positive integer" in capsys.readouterr().err
    assert main(["--allow-root-jobs", "--broker", "127.0.0.1:1"]) == 2
    assert "needs an inventory file" in capsys.readouterr().err
    good = tmp_path / "good.yaml"
    good.write_text("region: r\nnodes:\n  - name: a\n    gpus: 1\n")
    assert main(["--allow-root-jobs", "--broker", "127.0.0.1:1", "--inventory", str(good), "--region", "other"]) == 2
    assert "does not match" in capsys.readouterr().err


def test_spot_deadline_reclaims_the_node(broker, agent, fake_trainer):
    wait_for(lambda: agent.connected, 30, what="connected")
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, env=LONG, nodes=("t1-spot-000",))))
    wait_for(lambda: AS.ATTEMPT_STATE_RUNNING in broker.states("j-1"), 60, what="running")
    agent.inject_spot_notice("t1-spot-000", seconds=0.5)
    end = broker.wait_terminal("j-1", 1)  # nobody stopped it in time: the node is gone
    assert end.state == AS.ATTEMPT_STATE_FAILED and list(end.failed_nodes) == ["t1-spot-000"]
    assert "spot capacity reclaimed" in end.message
    h = [x for hb in broker.of("heartbeat") for x in hb.node_health if x.node_id == "t1-spot-000"]
    assert h and not h[0].healthy


def test_reregister_lists_only_the_newest_attempt_of_a_job(broker, agent, fake_trainer):
    wait_for(lambda: agent.connected, 30, what="connected")
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, attempt=1, env=LONG)))
    wait_for(lambda: AS.ATTEMPT_STATE_RUNNING in broker.states("j-1", 1), 60, what="running")
    broker.wait_ack(broker.send(stop=agent_pb2.Stop(job_id="j-1", attempt=1, checkpoint_first=True, grace_s=60)))
    assert broker.wait_terminal("j-1", 1).state == AS.ATTEMPT_STATE_CHECKPOINTED
    broker.wait_ack(broker.send(launch=launch_msg(fake_trainer, attempt=2, env=LONG)))
    port = broker.port
    broker.stop()
    broker.messages.clear()
    broker.start(port)
    reg = wait_for(lambda: broker.of("register"), 60, what="re-register")[0]
    # Listing attempt 1 too could make the broker name j-1 stale and kill attempt 2.
    assert [(r.job_id, r.attempt) for r in reg.running] == [("j-1", 2)]


def test_heartbeat_acks_are_credited_while_commands_wait_for_the_agent(broker, agent, fake_trainer):
    """A burst of commands waits for the agent's lock (at scale the ticker holds it for a
    pass over thousands of attempts); the broker's heartbeat answers behind them in the
    stream are credited at once, so the agent does not self-fence while its broker is
    answering (it did in the Kubernetes scale benchmark)."""
    wait_for(lambda: agent.connected, 30, what="connected")
    with agent._lock:  # a slow tick
        cid = broker.send(launch=launch_msg(fake_trainer, env=LONG))
        time.sleep(0.3)  # the Launch is read and waits for the lock
        sent = time.monotonic()
        agent.contact.heartbeat_sent(sent)
        agent._session.send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(time=time.time())))
        wait_for(lambda: agent.contact.last >= sent, 10, what="the ack credited behind the Launch")
        assert broker.ack(cid) is None  # the Launch itself still waits for the lock
    assert broker.wait_ack(cid).accepted  # and is applied once the tick is over
    broker.send(stop=agent_pb2.Stop(job_id="j-1", attempt=1, checkpoint_first=False, grace_s=0))
    broker.wait_terminal("j-1", 1)
