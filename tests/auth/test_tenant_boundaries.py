"""What a member or a team admin must not learn or gain about other teams, tried as
they would try it over the real API (real TLS, real tokens, a fake agent's real stream)."""

from __future__ import annotations

import grpc
import pytest

from broker.auth.identity import Role
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, FakeAgent, nodes_for, spec


def _error(call) -> grpc.RpcError:  # noqa: ANN001 - a zero-argument lambda
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_another_teams_job_id_looks_exactly_like_a_missing_one(tls_broker: Broker) -> None:
    b = tls_broker
    real = b.submit(spec("ml-secret-project"))
    bob = b.stubs_as("bob-probe", Role.MEMBER, "other")
    missing = "j-" + "0" * 17
    probes = {
        "GetJob": lambda j: bob.jobs.GetJob(jpb.GetJobRequest(job_id=j)),
        "CancelJob": lambda j: bob.jobs.CancelJob(jpb.CancelJobRequest(job_id=j)),
        "GetJobEvents": lambda j: bob.jobs.GetJobEvents(jpb.GetJobEventsRequest(job_id=j)),
        "WatchJob": lambda j: list(bob.jobs.WatchJob(jpb.WatchJobRequest(job_id=j), timeout=5)),
        "StreamJobLogs": lambda j: list(bob.jobs.StreamJobLogs(
            jpb.StreamJobLogsRequest(job_id=j), timeout=5)),
        "ListMigrations": lambda j: bob.jobs.ListMigrations(jpb.ListMigrationsRequest(job_id=j)),
    }
    for name, probe in probes.items():
        theirs, absent = _error(lambda p=probe: p(real.id)), _error(lambda p=probe: p(missing))
        assert theirs.code() is absent.code() is grpc.StatusCode.NOT_FOUND, (name, theirs.details())
        assert theirs.details().replace(real.id, "ID") == absent.details().replace(missing, "ID"), name
    assert b.get(real.id).phase != pb.JOB_PHASE_CANCELLED  # bob's cancel did nothing


def test_capacity_nodes_show_members_their_own_teams_job_ids_only(tls_broker: Broker) -> None:
    b = tls_broker
    agent = FakeAgent(b.address, "cap-agent", "ap-south-1", nodes_for("ap-south-1", "cap", 3, 8))
    agent.connect()
    try:
        mine = b.submit(spec("ml-job", gpus=8, allowed_regions=["ap-south-1"]))
        theirs = b.submit(spec("other-job", team="other", gpus=8, allowed_regions=["ap-south-1"]))
        for j in (mine, theirs):
            b.wait_phase(j.id, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)

        def ids(stubs) -> set[str]:  # noqa: ANN001
            resp = stubs.capacity.GetCapacity(cpb.GetCapacityRequest(region="ap-south-1",
                                                                     include_nodes=True))
            return {j for n in resp.nodes for j in n.job_ids}, sum(n.allocated_gpus for n in resp.nodes)

        member = b.stubs_as("cap-alice", Role.MEMBER, "ml")
        admin = b.stubs_as("cap-carol", Role.TEAM_ADMIN, "ml")
        for stubs in (member, admin):
            seen, allocated = ids(stubs)
            assert mine.id in seen and theirs.id not in seen
            assert allocated >= 16  # the numbers still count every team (both 8-GPU jobs)
        operator_seen, _ = ids(b)
        assert {mine.id, theirs.id} <= operator_seen
    finally:
        agent.close()


def test_team_admin_cannot_raise_its_fair_share_weight(tls_broker: Broker) -> None:
    b = tls_broker
    b.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=cpb.TeamQuota(
        team="fair", fair_share_weight=2.0, quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])))
    dana = b.stubs_as("dana", Role.TEAM_ADMIN, "fair")
    greedy = cpb.TeamQuota(team="fair", fair_share_weight=1e6, quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])
    e = _error(lambda: dana.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=greedy)))
    assert e.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "fair_share_weight 1e+06 exceeds the operators' grant of 2" in e.details()
    assert b.capacity.GetTeamQuota(cpb.GetTeamQuotaRequest(team="fair")).fair_share_weight == 2.0
    # Lower (or equal) is the admin's call.
    lower = cpb.TeamQuota(team="fair", fair_share_weight=1.5, quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])
    assert dana.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=lower)).fair_share_weight == 1.5
    # Unset (0) means 1.0, which is within a grant of 2; but not within a grant of 0.5.
    b.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=cpb.TeamQuota(
        team="fair", fair_share_weight=0.5, quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])))
    unset = cpb.TeamQuota(team="fair", quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])
    e = _error(lambda: dana.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=unset)))
    assert e.code() is grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("where", ["env", "command"])
def test_a_nul_in_what_reaches_execve_is_refused_at_submit(tls_broker: Broker, where: str) -> None:
    alice = tls_broker.stubs_as("nul-alice", Role.MEMBER, "ml")
    s = spec("nul")
    if where == "env":
        s.env["TOKEN"] = "abc\x00def"
    else:
        s.command.extend(["python", "-c", "print(1)\x00"])
    e = _error(lambda: alice.jobs.SubmitJob(jpb.SubmitJobRequest(spec=s)))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
    if where == "env":
        assert "spec.env['TOKEN']" in e.details() and "NUL character" in e.details()
    else:  # the submit checks' own message for arguments
        assert "spec.command" in e.details() and "\\x00" in e.details()
    assert not [j for j in tls_broker.jobs.ListJobs(jpb.ListJobsRequest(team="ml")).jobs if j.spec.name == "nul"]
