"""RegionAgent with a job's workdir: fetched off the agent's lock before the ranks start,
unpacked as their cwd; an unknown digest fails the attempt with a clear message.

The agent stream is the scripted FakeBroker; the workdir bytes come from a real broker
(in-process, loopback gRPC) holding an upload made with the SDK.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from brokersdk.client import BrokerClient
from computebroker.v1 import agent_pb2, common_pb2
from region_agents.agent import AgentConfig, RegionAgent
from tests.agents.fake_broker import FakeBroker, wait_for
from tests.broker.harness import Broker, fast_config

AS = agent_pb2.AttemptState


def launch(job: str, digest: str) -> agent_pb2.Launch:
    check = "import pathlib, sys; sys.exit(0 if pathlib.Path('m.txt').read_text() == 'x' else 3)"
    return agent_pb2.Launch(
        job_id=job, attempt=1,
        spec=common_pb2.JobSpec(name=job, command=[sys.executable, "-c", check],
                                workdir=common_pb2.WorkdirRef(digest=digest),
                                resources=common_pb2.Resources(nodes=1, gpus_per_node=8)),
        placement=common_pb2.Placement(region="test-1", world_size=1, nodes=[
            common_pb2.NodeAssignment(node_id="t1-p5-000", gpus=8)]))


@pytest.fixture
def real_broker(tmp_path: Path):
    b = Broker(fast_config(tmp_path / "real"))
    yield b
    b.stop()


def test_agent_runs_workdir_and_fails_unknown_digest(real_broker: Broker, inventory_file: Path,
                                                     tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "m.txt").write_text("x")
    with BrokerClient(real_broker.address) as c:
        ref = c.upload_workdir(str(code))
    fake = FakeBroker(heartbeat_interval_s=0.3)
    fake.start()
    agent = RegionAgent(AgentConfig(allow_root_jobs=True, broker_address=fake.address, inventory_path=str(inventory_file),
                                    work_dir=str(tmp_path / "work"), ranks_per_node=1))
    agent.workdirs.broker_address = lambda: real_broker.agent_address  # mTLS, agent's cert
    agent.start()
    try:
        reg = wait_for(lambda: fake.of("register"), 30, what="register")[0]
        assert reg.checkpoint_store_error == "" and Path(reg.checkpoint_bucket).is_absolute()
        fake.wait_ack(fake.send(launch=launch("j-wd", ref.digest)))
        done = fake.wait_terminal("j-wd", 1)
        assert done.state == AS.ATTEMPT_STATE_SUCCEEDED, done.message
        assert (tmp_path / "work" / "jobs" / "j-wd" / "attempt-1" / "workdir" / "m.txt").exists()
        assert agent.workdirs.cached(ref.digest)
        # No checkpoint copy happened: no transfer stats were reported for the fetch.
        assert not any(u.HasField("transfer") for u in fake.updates("j-wd"))

        fake.wait_ack(fake.send(launch=launch("j-missing", "sha256:" + "4" * 64)))
        failed = fake.wait_terminal("j-missing", 1)
        assert failed.state == AS.ATTEMPT_STATE_FAILED
        assert failed.message.startswith("workdir fetch failed: cannot fetch workdir sha256:4444")
        assert "not stored" in failed.message
    finally:
        agent.stop()
        fake.stop()
