"""Agents over mutual TLS: a certificate speaks for its own region and agent id only,
and a JobUpdate about someone else's attempt changes nothing."""

from __future__ import annotations

import grpc
import pytest

from broker.auth.identity import Role
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, FakeAgent, nodes_for, spec, wait_until


def _agent(b: Broker, region: str, agent_id: str, identity: tuple[str, str] | None = None,
           prefix: str | None = None) -> FakeAgent:
    return FakeAgent(b.address, agent_id, region, nodes_for(region, prefix or agent_id, 1, 8),
                     identity=identity)


def test_certificate_for_region_a_cannot_register_in_region_b(tls_broker: Broker) -> None:
    spoof = _agent(tls_broker, "region-b", "b-agent", identity=("region-a", "b-agent"))
    with pytest.raises(grpc.RpcError) as info:
        spoof.connect()
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "region 'region-a'" in (info.value.details() or "")
    regions = tls_broker.capacity.ListRegions(cpb.ListRegionsRequest()).regions
    assert "region-b" not in {r.name for r in regions}


def test_a_live_agent_id_cannot_be_taken_over(tls_broker: Broker) -> None:
    real = _agent(tls_broker, "region-t", "t-agent").connect()
    try:
        thief = _agent(tls_broker, "region-t", "t-agent", identity=("region-t", "other-agent"),
                       prefix="thief")
        with pytest.raises(grpc.RpcError) as info:
            thief.connect()
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "may not register as agent 't-agent'" in (info.value.details() or "")
        # The real agent's stream is untouched: it still gets commands.
        tls_broker.team("t-team", gpus=8)
        job = tls_broker.submit(spec("t", team="t-team", gpus=8, allowed_regions=["region-t"]))
        real.wait_launch(job.id)
    finally:
        real.close()


def test_a_node_claiming_another_region_is_refused(tls_broker: Broker) -> None:
    agent = FakeAgent(tls_broker.address, "n-agent", "region-n", nodes_for("region-x", "n", 1, 8))
    with pytest.raises(grpc.RpcError) as info:
        agent.connect()
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_users_cannot_open_agent_streams(tls_broker: Broker) -> None:
    op = tls_broker.stubs_as("agent-wannabe", Role.OPERATOR, "")
    reg = apb.AgentMessage(register=apb.Register(agent_id="x", region="y"))
    with pytest.raises(grpc.RpcError) as info:
        list(op.agent.Connect(iter([reg]), timeout=5))
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_forged_job_update_from_another_agent_changes_nothing(tls_broker: Broker) -> None:
    b = tls_broker
    b.team("f-team", gpus=16)
    victim = _agent(b, "region-v", "v-agent").connect()
    forger = _agent(b, "region-f", "f-agent").connect()
    try:
        job = b.submit(spec("victim", team="f-team", gpus=8, allowed_regions=["region-v"]))
        launch = victim.wait_launch(job.id)
        victim.update(job.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=5)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        before = b.events(job.id)
        forger.update(job.id, launch.attempt, apb.ATTEMPT_STATE_FAILED, exit_code=1,
                      message="forged failure")
        forger.update(job.id, launch.attempt, apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt_step=100,
                      ckpt_uri=f"s3://x/jobs/{job.id}/attempt-{launch.attempt}/step-100")
        forger.update(job.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=99)
        # Handled in order on the forger's stream; the last one is only answered with a
        # Stop to the forger itself. Then: nothing changed.
        wait_until(lambda: forger.commands("stop", job.id), 20, "the forger told to stop")
        victim.update(job.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=6)
        wait_until(lambda: b.get(job.id).progress.step == 6, 20, "the victim's own update applied")
        after = b.get(job.id)
        assert after.phase == pb.JOB_PHASE_RUNNING and after.placement.agent_id == "v-agent"
        assert not victim.commands("stop", job.id)
        new = b.events(job.id)[len(before):]
        assert not any("f-agent" in e.actor or "forged" in e.message for e in new)
    finally:
        victim.close()
        forger.close()
