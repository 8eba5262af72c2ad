"""Every RPC x every role over real TLS: allowed calls pass authorization (they may
still fail validation), refused ones answer PERMISSION_DENIED / UNAUTHENTICATED.

The expected matrix is written out here, independently of broker/auth/policy.py, so a
change of the policy table that is not also a change of intent fails this test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from broker.auth.identity import Role
from broker.auth.policy import METHODS
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import auth_pb2 as aupb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import workdir_pb2 as wpb
from tests.broker.harness import Broker, Stubs, spec

DENIED = {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
MEMBER, ADMIN, OPERATOR, AGENT, NOBODY = "member", "team-admin", "operator", "agent", "anonymous"
USERS = {MEMBER, ADMIN, OPERATOR}

# RPC -> roles allowed (intent, docs/operator/security.md roles table).
EXPECTED: dict[str, set[str]] = {
    "JobService/SubmitJob": USERS, "JobService/GetJob": USERS, "JobService/ListJobs": USERS,
    "JobService/CancelJob": USERS, "JobService/WatchJob": USERS,
    "JobService/GetJobEvents": USERS, "JobService/GetJobLogs": USERS,
    "JobService/ListMigrations": USERS, "JobService/StreamJobLogs": USERS,
    # the caller's own job (sharing someone else's is a per-job refusal: the owner or a
    # team admin; tests/broker/test_checkpoint_shares.py)
    "JobService/ShareCheckpoints": USERS, "JobService/RevokeCheckpointShare": USERS,
    "CapacityService/ListRegions": USERS, "CapacityService/GetCapacity": USERS,
    "CapacityService/ListTrainingPlans": USERS, "CapacityService/GetTeamQuota": USERS,
    "CapacityService/ListTeams": USERS, "CapacityService/GetUsageSeries": USERS,
    "CapacityService/CreateTrainingPlan": {OPERATOR},
    "CapacityService/CancelTrainingPlan": {OPERATOR},
    "CapacityService/SetTeamQuota": {ADMIN, OPERATOR},
    "CapacityService/DrainRegion": {OPERATOR}, "CapacityService/CordonNode": {OPERATOR},
    # Priority classes rank every team's jobs: only operators change them; all users read.
    "CapacityService/SetPriorityClass": {OPERATOR}, "CapacityService/DeletePriorityClass": {OPERATOR},
    "CapacityService/ListPriorityClasses": USERS,
    "WorkdirService/HasWorkdir": USERS, "WorkdirService/UploadWorkdir": USERS,
    "WorkdirService/FetchWorkdir": {OPERATOR, AGENT},
    "AgentService/Connect": {AGENT},
    "AuthService/WhoAmI": USERS | {AGENT},
    "AuthService/CreateToken": {OPERATOR}, "AuthService/ListTokens": {OPERATOR},
    "AuthService/RevokeToken": {OPERATOR}, "AuthService/RotateToken": {OPERATOR},
    "AuthService/ListAuditRecords": {OPERATOR},
}


def test_every_rpc_of_every_service_has_a_rule_and_an_expectation() -> None:
    from computebroker.v1 import agent_pb2, auth_pb2, capacity_pb2, jobs_pb2, workdir_pb2

    served = {f"{s.name}/{m.name}" for mod in (agent_pb2, auth_pb2, capacity_pb2, jobs_pb2, workdir_pb2)
              for s in mod.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert served == set(EXPECTED)
    assert {k.removeprefix("/computebroker.v1.") for k in METHODS} == served


def _calls(b: Broker, s: Stubs, job_id: str) -> dict[str, Callable[[], Any]]:
    """One minimal request per RPC, about team ml's job ``job_id`` where one is named."""
    t = 3.0

    def stream(it: Any) -> Any:
        try:
            return list(it)
        except grpc.RpcError as e:
            if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return []  # authorized, then kept open (a live watch): allowed
            raise

    def connect() -> Any:
        reg = apb.AgentMessage(register=apb.Register(agent_id="rbac-agent", region="rbac-region"))
        return stream(s.agent.Connect(iter([reg]), timeout=t))

    quota = cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=16)])

    def own_job() -> str:
        return s.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("r-own")), timeout=t).job.id
    return {
        "JobService/SubmitJob": lambda: s.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("r")), timeout=t),
        "JobService/GetJob": lambda: s.jobs.GetJob(jpb.GetJobRequest(job_id=job_id), timeout=t),
        "JobService/ListJobs": lambda: s.jobs.ListJobs(jpb.ListJobsRequest(), timeout=t),
        "JobService/CancelJob": lambda: s.jobs.CancelJob(jpb.CancelJobRequest(job_id=job_id), timeout=t),
        "JobService/WatchJob": lambda: stream(s.jobs.WatchJob(jpb.WatchJobRequest(job_id=job_id), timeout=1.0)),
        "JobService/GetJobEvents": lambda: s.jobs.GetJobEvents(jpb.GetJobEventsRequest(job_id=job_id), timeout=t),
        "JobService/GetJobLogs": lambda: s.jobs.GetJobLogs(jpb.GetJobLogsRequest(job_id=job_id), timeout=t),
        "JobService/ListMigrations": lambda: s.jobs.ListMigrations(jpb.ListMigrationsRequest(), timeout=t),
        "JobService/StreamJobLogs": lambda: stream(s.jobs.StreamJobLogs(
            jpb.StreamJobLogsRequest(job_id=job_id), timeout=t)),
        "JobService/ShareCheckpoints": lambda: s.jobs.ShareCheckpoints(
            jpb.ShareCheckpointsRequest(job_id=own_job()), timeout=t),
        "JobService/RevokeCheckpointShare": lambda: s.jobs.RevokeCheckpointShare(
            jpb.RevokeCheckpointShareRequest(job_id=own_job(), share_id="share-none"), timeout=t),
        "CapacityService/ListRegions": lambda: s.capacity.ListRegions(cpb.ListRegionsRequest(), timeout=t),
        "CapacityService/GetCapacity": lambda: s.capacity.GetCapacity(cpb.GetCapacityRequest(), timeout=t),
        "CapacityService/ListTrainingPlans": lambda: s.capacity.ListTrainingPlans(
            cpb.ListTrainingPlansRequest(), timeout=t),
        "CapacityService/GetTeamQuota": lambda: s.capacity.GetTeamQuota(
            cpb.GetTeamQuotaRequest(team="ml"), timeout=t),
        "CapacityService/ListTeams": lambda: s.capacity.ListTeams(cpb.ListTeamsRequest(), timeout=t),
        "CapacityService/GetUsageSeries": lambda: s.capacity.GetUsageSeries(
            cpb.GetUsageSeriesRequest(window_s=3600, team="ml"), timeout=t),
        "CapacityService/CreateTrainingPlan": lambda: s.capacity.CreateTrainingPlan(
            cpb.CreateTrainingPlanRequest(), timeout=t),
        "CapacityService/CancelTrainingPlan": lambda: s.capacity.CancelTrainingPlan(
            cpb.CancelTrainingPlanRequest(plan_id="p-none"), timeout=t),
        "CapacityService/SetTeamQuota": lambda: s.capacity.SetTeamQuota(
            cpb.SetTeamQuotaRequest(quota=quota), timeout=t),
        "CapacityService/DrainRegion": lambda: s.capacity.DrainRegion(
            cpb.DrainRegionRequest(region="nowhere", undrain=True), timeout=t),
        "CapacityService/CordonNode": lambda: s.capacity.CordonNode(
            cpb.CordonNodeRequest(node_id="no-node", uncordon=True), timeout=t),
        "CapacityService/SetPriorityClass": lambda: s.capacity.SetPriorityClass(
            cpb.SetPriorityClassRequest(priority_class=cpb.PriorityClass(name="rbac-made", value=5)),
            timeout=t),
        "CapacityService/ListPriorityClasses": lambda: s.capacity.ListPriorityClasses(
            cpb.ListPriorityClassesRequest(), timeout=t),
        "CapacityService/DeletePriorityClass": lambda: s.capacity.DeletePriorityClass(
            cpb.DeletePriorityClassRequest(name="no-such-class"), timeout=t),
        "WorkdirService/HasWorkdir": lambda: s.workdir.HasWorkdir(
            wpb.HasWorkdirRequest(digest="sha256:" + "0" * 64), timeout=t),
        "WorkdirService/UploadWorkdir": lambda: s.workdir.UploadWorkdir(iter([]), timeout=t),
        "WorkdirService/FetchWorkdir": lambda: stream(s.workdir.FetchWorkdir(
            wpb.FetchWorkdirRequest(digest="sha256:" + "1" * 64), timeout=t)),
        "AgentService/Connect": connect,
        "AuthService/WhoAmI": lambda: s.auth.WhoAmI(aupb.WhoAmIRequest(), timeout=t),
        "AuthService/CreateToken": lambda: s.auth.CreateToken(aupb.CreateTokenRequest(
            user="rbac-made", team="ml", role="member"), timeout=t),
        "AuthService/ListTokens": lambda: s.auth.ListTokens(aupb.ListTokensRequest(), timeout=t),
        "AuthService/RevokeToken": lambda: s.auth.RevokeToken(
            aupb.RevokeTokenRequest(token_id="000000000000"), timeout=t),
        "AuthService/RotateToken": lambda: s.auth.RotateToken(
            aupb.RotateTokenRequest(token_id="000000000000"), timeout=t),
        "AuthService/ListAuditRecords": lambda: s.auth.ListAuditRecords(
            aupb.ListAuditRecordsRequest(), timeout=t),
    }


def _stubs(b: Broker, role: str) -> Stubs:
    if role == MEMBER:
        return b.stubs_as("rbac-member", Role.MEMBER, "ml")
    if role == ADMIN:
        return b.stubs_as("rbac-admin", Role.TEAM_ADMIN, "ml")
    if role == OPERATOR:
        return b.stubs_as("rbac-op", Role.OPERATOR, "", cert=True)  # a certificate operator
    if role == AGENT:
        return Stubs.over(b.agent_channel("rbac-region", "rbac-agent"))
    return b.anonymous()


@pytest.mark.parametrize("role", [MEMBER, ADMIN, OPERATOR, AGENT, NOBODY])
def test_every_rpc_for_role(tls_broker: Broker, role: str) -> None:
    b = tls_broker
    s = _stubs(b, role)
    wrong: list[str] = []
    for method, call in _calls(b, s, b.submit(spec("rbac-target")).id).items():
        code = grpc.StatusCode.OK
        try:
            call()
        except grpc.RpcError as e:
            code = e.code()
        allowed = role in EXPECTED[method]
        if allowed and code in DENIED:
            wrong.append(f"{method}: {role} refused ({code.name})")
        if not allowed and code not in DENIED:
            wrong.append(f"{method}: {role} got {code.name}, expected a refusal")
        if role == NOBODY and code is not grpc.StatusCode.UNAUTHENTICATED:
            wrong.append(f"{method}: no credential answered {code.name}, not UNAUTHENTICATED")
    assert not wrong, "\n".join(wrong)


def test_other_teams_jobs_are_refused_and_not_listed(tls_broker: Broker) -> None:
    b = tls_broker
    ml_job = b.submit(spec("ml-only", env={"API_KEY": "s3cr3t"}))
    bob = b.stubs_as("bob", Role.MEMBER, "other")
    # Team-wide calls naming another team: PERMISSION_DENIED (team names are no secret).
    # Calls on another team's job by id: see test_tenant_boundaries (NOT_FOUND, as if absent).
    for call in (lambda: bob.jobs.ListJobs(jpb.ListJobsRequest(team="ml")),
                 lambda: bob.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("x", team="ml")))):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED, info.value.details()
        assert "team" in (info.value.details() or "")
    listed = bob.jobs.ListJobs(jpb.ListJobsRequest()).jobs
    assert all(j.spec.team == "other" for j in listed) and ml_job.id not in {j.id for j in listed}
    assert b.get(ml_job.id).phase != 0  # untouched by bob's cancel


def test_env_secrets_only_for_the_owning_team(tls_broker: Broker) -> None:
    b = tls_broker
    alice = b.stubs_as("alice", Role.MEMBER, "ml")
    job = alice.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("secret", env={"API_KEY": "s3cr3t"}))).job
    assert alice.jobs.GetJob(jpb.GetJobRequest(job_id=job.id)).spec.env["API_KEY"] == "s3cr3t"
    seen_by_op = b.get(job.id)  # operators: keys, values redacted
    assert dict(seen_by_op.spec.env) == {"API_KEY": "<redacted>"}
    for j in b.jobs.ListJobs(jpb.ListJobsRequest(team="ml")).jobs:
        assert "s3cr3t" not in j.SerializeToString().decode(errors="replace")


def test_team_admin_sets_quota_only_within_the_grant(tls_broker: Broker) -> None:
    b = tls_broker
    carol = b.stubs_as("carol", Role.TEAM_ADMIN, "ml")
    lower = cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])
    assert carol.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=lower)).quotas[0].guaranteed_gpus == 8
    for quota in (cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=17)]),
                  cpb.TeamQuota(team="other", quotas=[cpb.QuotaEntry(guaranteed_gpus=1)]),
                  cpb.TeamQuota(team="ml", cohort="elsewhere", quotas=[cpb.QuotaEntry(guaranteed_gpus=1)])):
        with pytest.raises(grpc.RpcError) as info:
            carol.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=quota))
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED, info.value.details()
    back = cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=16)])
    carol.capacity.SetTeamQuota(cpb.SetTeamQuotaRequest(quota=back))  # up to the grant again
