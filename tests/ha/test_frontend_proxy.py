"""Calls for the leader made on an API front-end are sent on to it, as the caller
(broker/api/leader_proxy.py).

A real leader and a real front-end (gRPC over TLS, in this process) on one real
redis-server. Every client here talks to the front-end only, with real tokens:

* the SDK (what ``brokerctl`` uses) pointed at the front-end alone sets a quota, cancels
  a job and reads it back: it just works;
* whose call it is: the leader authorizes the *caller*. A member of another team cannot
  cancel the job (the leader's tenancy answer comes back), a member cannot set quotas,
  and the leader's audit log names the caller, once (the front-end does not audit what
  it sends on), never the front-end;
* an anonymous call is refused by the front-end and never reaches the leader; a token
  revoked on the leader is refused for the leader's calls at once, whatever the
  front-end's token cache still says;
* with the leader gone, such a call is UNAVAILABLE (retried by clients), saying so.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from broker.api.frontend import FrontendServer
from broker.auth.identity import Role
from brokersdk.client import BrokerClient
from brokersdk.credentials import ClientCredentials, make_channel
from computebroker.v1 import auth_pb2 as aupb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import capacity_pb2_grpc, jobs_pb2_grpc
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, fast_config, spec, wait_until
from tests.fixtures.pki import session_pki
from tests.fixtures.redis_server import RedisServer

CANCEL = "/computebroker.v1.JobService/CancelJob"


def test_calls_for_the_leader_are_sent_on_as_the_caller(tmp_path: Path,
                                                        redis_server: RedisServer) -> None:
    url = f"{redis_server.url}?prefix=px{uuid.uuid4().hex[:8]}"
    shared = dict(store=url, workdir_store=str(tmp_path / "workdirs"))
    leader = Broker(fast_config(tmp_path / "leader", broker_id="px-leader", **shared))
    fe = FrontendServer(fast_config(tmp_path / "fe", frontend=True, frontend_id=9,
                                    broker_id="px-fe", agent_listen="", **shared))
    pki = session_pki()
    channels: list[grpc.Channel] = []
    stopped: list[Broker] = []

    def jobs_as(creds: ClientCredentials) -> jobs_pb2_grpc.JobServiceStub:
        ch = make_channel(f"127.0.0.1:{fe.port}", creds)
        channels.append(ch)
        return jobs_pb2_grpc.JobServiceStub(ch)

    try:
        fe.start()
        wait_until(lambda: fe.bus.connected, timeout=30, what="the front-end's store bus")
        fe_addr = f"127.0.0.1:{fe.port}"
        # The SDK (brokerctl's client) given the front-end's address only.
        with BrokerClient(fe_addr, timeout=15, credentials=pki.operator()) as admin:
            admin.set_team_quota(team="ml", guaranteed_gpus=8)
            admin.set_team_quota(team="other", guaranteed_gpus=8)
        assert leader.capacity.GetTeamQuota(cpb.GetTeamQuotaRequest(team="ml")).quotas[0] \
            .guaranteed_gpus == 8  # set on the leader, through the front-end

        alice_token = leader.token_for("alice", Role.MEMBER, "ml")
        alice = jobs_as(pki.token_credentials(alice_token))
        bob = jobs_as(pki.token_credentials(leader.token_for("bob", Role.MEMBER, "other")))
        job = alice.SubmitJob(jpb.SubmitJobRequest(spec=spec("proxied")), timeout=30).job

        # Another team's member: the leader's tenancy answer, and the job is untouched.
        with pytest.raises(grpc.RpcError) as other:
            bob.CancelJob(jpb.CancelJobRequest(job_id=job.id), timeout=15)
        assert other.value.code() in (grpc.StatusCode.NOT_FOUND,
                                      grpc.StatusCode.PERMISSION_DENIED), other.value.details()
        assert leader.get(job.id).phase != pb.JOB_PHASE_CANCELLED
        # A member cannot set quotas (refused for the caller, not done as the front-end).
        ch = make_channel(fe_addr, pki.token_credentials(alice_token))
        channels.append(ch)
        with pytest.raises(grpc.RpcError) as quota:
            capacity_pb2_grpc.CapacityServiceStub(ch).SetTeamQuota(cpb.SetTeamQuotaRequest(
                quota=cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=64)])),
                timeout=15)
        assert quota.value.code() is grpc.StatusCode.PERMISSION_DENIED, quota.value.details()
        # Anonymous: refused by the front-end, never sent on.
        with pytest.raises(grpc.RpcError) as anon:
            jobs_as(ClientCredentials(ca=pki.ca_file)).CancelJob(
                jpb.CancelJobRequest(job_id=job.id), timeout=15)
        assert anon.value.code() is grpc.StatusCode.UNAUTHENTICATED

        # The owner cancels through the front-end: done by the leader, as alice.
        cancelled = alice.CancelJob(jpb.CancelJobRequest(job_id=job.id, reason="proxied"),
                                    timeout=15)
        assert cancelled.id == job.id
        leader.wait_phase(job.id, pb.JOB_PHASE_CANCELLED, timeout=30)
        records = [r for r in leader.auth.ListAuditRecords(aupb.ListAuditRecordsRequest(
            limit=1000)).records if r.method == CANCEL and r.target == job.id]
        by = sorted((r.actor, r.result) for r in records)
        assert ("user:alice", "OK") in by, by
        assert by.count(("user:alice", "OK")) == 1, f"audited twice: {by}"
        assert all(r.actor in ("user:alice", "user:bob") for r in records), by

        # Revoked on the leader: its own calls are refused at once, through the front-end.
        alice_id = next(t.id for t in leader.auth.ListTokens(aupb.ListTokensRequest()).tokens
                        if t.user == "alice")
        leader.auth.RevokeToken(aupb.RevokeTokenRequest(token_id=alice_id))
        with pytest.raises(grpc.RpcError) as revoked:
            alice.CancelJob(jpb.CancelJobRequest(job_id=job.id), timeout=15)
        assert revoked.value.code() is grpc.StatusCode.UNAUTHENTICATED, revoked.value.details()
        assert fe.counters.proxied.get("OK", 0) >= 3  # two quotas and the cancel

        # No leader at all: UNAVAILABLE (the client retries, as during a failover).
        leader.stop()
        stopped.append(leader)
        op = jobs_as(pki.operator())
        with pytest.raises(grpc.RpcError) as gone:
            op.CancelJob(jpb.CancelJobRequest(job_id=job.id), timeout=15)
        assert gone.value.code() is grpc.StatusCode.UNAVAILABLE, gone.value.details()
        assert "leader" in gone.value.details()
        assert fe.counters.proxied.get("UNAVAILABLE", 0) + sum(fe.counters.refusals.values()) >= 1
    finally:
        for c in channels:
            c.close()
        fe.stop(0.5)
        if not stopped:
            leader.stop()
