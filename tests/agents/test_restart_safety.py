"""Issue 15, agent side: restart safety (defect 2), leader liveness (defect 3), acked
terminal updates (defect 6). Real rank processes (the fake trainer), real gRPC streams
against the scripted FakeBroker; the whole-system versions are in tests/ha/test_reliability.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from computebroker.v1 import agent_pb2
from region_agents.agent import AgentConfig, RegionAgent
from region_agents.executors import attempt_records as records
from region_agents.executors.local import LocalExecutor
from tests.agents.fake_broker import FakeBroker, wait_for
from tests.agents.test_agent_stream import LONG, launch_msg
from tests.agents.test_local_executor import Collector, make_spec

AS = agent_pb2.AttemptState


def executor(work: Path) -> LocalExecutor:
    return LocalExecutor(work, ranks_per_node=2, hang_timeout_s=120, starting_grace_s=1.0,
                         progress_interval_s=0.2)


def rank_pids(work: Path, job: str, attempt: int) -> list[int]:
    rec = records.AttemptRecord.load(work / "jobs" / job / f"attempt-{attempt}.json")
    assert rec is not None, "no durable record for the attempt"
    return rec.live_pids()


def test_restarted_executor_readopts_running_ranks_and_can_kill_them(tmp_path, fake_trainer):
    """Defect 2: a restarted agent registered `running 0` while the old ranks trained on.
    The durable record lets a new executor (a new agent process) find, watch and stop them."""
    work = tmp_path / "work"
    first = executor(work)
    first.launch(make_spec(fake_trainer, env=LONG))
    wait_for(lambda: len(rank_pids(work, "j-1", 1)) == 4, 30, what="4 ranks recorded")
    # The agent process "dies": `first` is abandoned, its ranks keep running.
    second = executor(work)
    assert second.recover() == []
    running = second.running()
    assert [(r.job_id, r.attempt) for r in running] == [("j-1", 1)]
    assert running[0].node_ids == ["t1-p5-000", "t1-p5-001"]
    col = Collector(second)
    wait_for(lambda: any(e.progress is not None and e.progress.step > 0 for e in col.pump()), 30,
             what="progress from the re-adopted attempt")
    second.stop("j-1", 1, checkpoint_first=False, grace_s=0)
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_STOPPED
    assert rank_pids(work, "j-1", 1) == []
    first.poll()  # reap the zombies of the abandoned executor
    second.shutdown(0)


def test_new_attempt_fences_and_kills_an_older_one_left_by_a_dead_agent(tmp_path, fake_trainer):
    """Defect 2: a new attempt must never take a step while an older one can still write.
    A fresh executor (no memory of attempt 1) kills it from its record before spawning."""
    work = tmp_path / "work"
    first = executor(work)
    first.launch(make_spec(fake_trainer, env=LONG))
    wait_for(lambda: len(rank_pids(work, "j-1", 1)) == 4, 30, what="attempt 1 ranks")
    second = executor(work)  # no recover(): only the durable record knows attempt 1
    assert second.known_attempts() == {"j-1": 1}
    second.launch(make_spec(fake_trainer, attempt=2, env=LONG))
    # By the time launch() returned, attempt 1 could not write any more.
    assert rank_pids(work, "j-1", 1) == []
    assert (work / "jobs" / "j-1" / "attempt-1" / records.FENCE_NAME).exists()
    assert len(rank_pids(work, "j-1", 2)) == 4
    assert not (work / "jobs" / "j-1" / "attempt-2" / records.FENCE_NAME).exists()
    first.poll()
    second.shutdown(0)


def test_attempt_that_finished_while_the_agent_was_down_is_reported(tmp_path, fake_trainer):
    """Defect 2: an attempt whose ranks exited while no agent watched is not lost: the
    restarted executor reports its outcome from the trainer's last progress word."""
    work = tmp_path / "work"
    first = executor(work)
    first.launch(make_spec(fake_trainer, env={"FAKE_STEPS": "3", "FAKE_STEP_S": "0.05"}))
    pids = wait_for(lambda: rank_pids(work, "j-1", 1) or None, 30, what="ranks")
    wait_for(lambda: not any(records.proc_start_ticks(p) for p in pids), 60, what="ranks exit")
    second = executor(work)
    second.recover()
    end = Collector(second).wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end
    # Its outcome is durable until the broker acknowledges it.
    third = executor(work)
    again = third.recover()
    assert [(e.job_id, e.attempt, e.state) for e in again] == [("j-1", 1, AS.ATTEMPT_STATE_SUCCEEDED)]
    third.acknowledged("j-1", 1)
    assert executor(work).recover() == []
    first.poll()


@pytest.fixture
def brokers():
    bs = [FakeBroker(heartbeat_interval_s=0.3), FakeBroker(heartbeat_interval_s=0.3)]
    for b in bs:
        b.start()
    yield bs
    for b in bs:
        b.stop()


def make_agent(address: str, inventory_file: Path, tmp_path: Path, **kw) -> RegionAgent:
    return RegionAgent(AgentConfig(allow_root_jobs=True, broker_address=address, inventory_path=str(inventory_file),
                                   work_dir=str(tmp_path / "work"), ranks_per_node=1,
                                   hang_timeout_s=120, max_backoff_s=1.0, **kw))


def test_hung_leader_makes_the_agent_rotate(brokers, inventory_file, tmp_path):
    """Defect 3: a SIGSTOPped leader keeps its socket open and says nothing; the agent
    stayed on it forever. Now silence past the leader timeout moves it to the next one."""
    hung, standby = brokers
    agent = make_agent(f"{hung.address},{standby.address}", inventory_file, tmp_path,
                       leader_timeout_s=2.0)
    agent.start()
    try:
        wait_for(lambda: hung.of("register"), 30, what="register with the first broker")
        wait_for(lambda: agent.connected, 30, what="connected")
        # Answered heartbeats keep the stream: still on the first broker a while later.
        wait_for(lambda: len(hung.of("heartbeat")) >= 12, 60, what="heartbeats")
        assert standby.connections == 0
        hung.mute = True  # frozen: no heartbeat acks, no commands
        wait_for(lambda: standby.of("register"), 60, what="agent moved to the standby")
        wait_for(lambda: agent.connected, 30, what="registered with the standby")
    finally:
        agent.stop()


def test_terminal_update_is_resent_until_acknowledged(brokers, inventory_file, tmp_path,
                                                      fake_trainer):
    """Defect 6: an update the broker could not commit (store down) was dropped. Now a
    terminal update is re-sent until the broker acknowledges it, and then no more."""
    broker = brokers[0]
    broker.ack_updates = False
    agent = make_agent(broker.address, inventory_file, tmp_path)
    agent.start()
    try:
        wait_for(lambda: agent.connected, 30, what="connected")
        broker.send(launch=launch_msg(fake_trainer, env={"FAKE_STEPS": "2", "FAKE_STEP_S": "0.05"}))

        def terminals() -> int:
            return sum(u.state == AS.ATTEMPT_STATE_SUCCEEDED for u in broker.updates("j-1", 1))

        wait_for(lambda: terminals() >= 2, 60, what="the unacked SUCCEEDED re-sent")
        broker.ack_updates = True
        wait_for(lambda: not agent._unacked, 60, what="ack received")
        n = terminals()
        rec = records.AttemptRecord.load(tmp_path / "work" / "jobs" / "j-1" / "attempt-1.json")
        assert rec is not None and rec.acked
        wait_for(lambda: len(broker.of("heartbeat")) >= 40, 60, what="time passes")
        assert terminals() == n, "re-sent after the ack"
    finally:
        agent.stop()


def test_a_reconnect_lists_an_unacknowledged_end_and_sends_it_again(brokers, inventory_file,
                                                                   tmp_path, fake_trainer):
    """What the broker's reconcile relies on (and tests/broker/harness.py's scripted agent
    now copies): an attempt whose end the broker has not acknowledged is still listed in
    the next Register, with its end state, and its JobUpdate follows the RegisterAck. An
    agent that left it out would have the broker relaunch the attempt as missing and then
    ignore the re-sent end as a superseded attempt's (the store-failover benchmark's
    scripted agent did, and read it as lost acknowledged updates)."""
    first, second = brokers
    first.ack_updates = False  # its store is down: the end is never acknowledged
    agent = make_agent(f"{first.address},{second.address}", inventory_file, tmp_path)
    agent.start()
    try:
        wait_for(lambda: agent.connected, 30, what="connected")
        first.send(launch=launch_msg(fake_trainer, env={"FAKE_STEPS": "2", "FAKE_STEP_S": "0.05"}))
        first.wait_terminal("j-1", 1)
        first.stop()  # the stream ends with the end unacknowledged; the agent dials the next
        regs = wait_for(lambda: second.of("register"), 60, what="Register with the second broker")
        listed = [(r.job_id, r.attempt, r.state) for r in regs[0].running]
        assert listed == [("j-1", 1, AS.ATTEMPT_STATE_SUCCEEDED)], listed
        end = second.wait_terminal("j-1", 1, timeout=30)
        assert end.state == AS.ATTEMPT_STATE_SUCCEEDED
        wait_for(lambda: not agent._unacked, 30, what="the second broker's ack received")
    finally:
        agent.stop()


def test_trainer_refuses_to_commit_a_checkpoint_once_fenced(tmp_path, monkeypatch):
    """Defect 2, trainer half of the fence contract (docs/contracts.md section 1): once
    the agent created CB_FENCE_FILE, the manifest commit path raises instead of writing."""
    from trainer.checkpoint import refuse_if_superseded
    from trainer.errors import CheckpointSaveError

    fence = tmp_path / records.FENCE_NAME
    monkeypatch.setenv("CB_FENCE_FILE", str(fence))
    refuse_if_superseded("step-000000010")  # not fenced: commits go ahead
    records.write_fence(tmp_path)
    with pytest.raises(CheckpointSaveError, match="superseded"):
        refuse_if_superseded("step-000000010")


def test_restarted_agent_reports_survivors_and_kills_the_ones_the_broker_calls_stale(
        brokers, inventory_file, tmp_path, fake_trainer):
    """Defect 2: the restarted agent lists the attempt a previous agent process left
    running in Register.running, and kills its process group when RegisterAck names it
    stale (here: the broker has moved the job on)."""
    broker = brokers[0]
    first = make_agent(broker.address, inventory_file, tmp_path)
    first.start()
    wait_for(lambda: first.connected, 30, what="connected")
    broker.send(launch=launch_msg(fake_trainer, env=LONG))
    work = tmp_path / "work"
    wait_for(lambda: len(records.scan(work)) == 1 and records.scan(work)[0].live_pids(), 30,
             what="ranks running")
    pids = records.scan(work)[0].live_pids()
    first.stop(kill_running=False)  # the daemon goes away, its ranks do not
    assert records.scan(work)[0].live_pids() == pids
    broker.stale_job_ids = ["j-1"]
    second = make_agent(broker.address, inventory_file, tmp_path)
    second.start()
    try:
        regs = wait_for(lambda: [r for r in broker.of("register") if r.running], 30,
                        what="a Register listing the survivor")
        assert [(r.job_id, r.attempt) for r in regs[0].running] == [("j-1", 1)]
        end = broker.wait_terminal("j-1", 1)
        assert end.state == AS.ATTEMPT_STATE_STOPPED
        assert records.scan(work)[0].live_pids() == []
        # A relaunch of the same (stale) attempt is refused: the record remembers it.
        cid = broker.send(launch=launch_msg(fake_trainer, env=LONG))
        assert not broker.wait_ack(cid).accepted
    finally:
        second.stop()


@pytest.mark.parametrize("written", [True, False], ids=["exit-file", "no-exit-file"])
def test_readopted_attempt_whose_rank0_ends_last_is_judged_by_the_ranks_own_exit_codes(
        tmp_path, fake_trainer, written):
    """Found by the 200-job fault campaign: after an agent restart, rank 1 of a finished
    attempt exited 0 while rank 0 was still in its final save ("checkpointing"). Not our
    child, its status was unknown and taken for a crash: rank 0 was killed, its node blamed
    and the job relaunched. With CB_EXIT_FILE (trainer.errors.record_exit) the ranks' own
    codes count; without it (a script that never writes it) the old, cautious reading stays."""
    work = tmp_path / "work"
    first = executor(work)
    env = {"FAKE_STEPS": "40", "FAKE_STEP_S": "0.05", "FAKE_RANK0_END_DELAY": "3"}
    if written:
        env["FAKE_WRITE_EXIT"] = "1"
    first.launch(make_spec(fake_trainer, env=env))
    wait_for(lambda: len(rank_pids(work, "j-1", 1)) == 4, 30, what="4 ranks recorded")
    second = executor(work)  # the agent restarted: the ranks are re-adopted
    assert second.recover() == []
    end = Collector(second).wait_terminal()
    adir = work / "jobs" / "j-1" / "attempt-1"
    if written:
        assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end.message
        assert sorted(p.name for p in adir.glob("rank-*.exit")) == [f"rank-{r}.exit" for r in range(4)]
    else:
        assert end.state == AS.ATTEMPT_STATE_FAILED
        assert not list(adir.glob("rank-*.exit"))
    first.poll()  # reap the zombies of the abandoned executor
    second.shutdown(0)


def test_trainer_writes_its_exit_code_for_a_restarted_agent(tmp_path):
    """trainer.parallel.shutdown_and_exit (every library exit path) leaves CB_EXIT_FILE."""
    import os
    import subprocess
    import sys

    path = tmp_path / "rank-0.exit"
    code = subprocess.run(
        [sys.executable, "-c", "from trainer.parallel import shutdown_and_exit; shutdown_and_exit(75)"],
        env={**os.environ, "CB_EXIT_FILE": str(path)}, timeout=120).returncode
    assert code == 75
    assert path.read_text().strip() == "75"
