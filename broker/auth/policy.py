"""Who may do what: the ONE decision table, applied in one place.

Why data, not ``if`` chains in servicers: the whole policy is reviewable here, the
interceptor (broker/auth/interceptor.py) applies :data:`METHODS` to every RPC before
any servicer runs, and tests/auth/test_rbac.py walks the same tables. Servicers only
add the team scope (which team a request touches is in the request) through
:func:`authorize`, the same function the interceptor uses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc

from broker.api.errors import BrokerError
from broker.auth.identity import CredentialKind, Principal, Role


class Permission(enum.Enum):
    WHOAMI = "whoami"
    JOBS_SUBMIT = "jobs.submit"
    JOBS_READ = "jobs.read"
    JOBS_CANCEL = "jobs.cancel"
    CAPACITY_READ = "capacity.read"
    QUOTA_SET = "quota.set"
    PLANS_WRITE = "plans.write"
    PRIORITIES_WRITE = "priorities.write"  # priority classes: every team's jobs rank by them
    REGIONS_ADMIN = "regions.admin"  # drain, cordon
    USERS_ADMIN = "users.admin"  # tokens
    AUDIT_READ = "audit.read"
    WORKDIR_UPLOAD = "workdir.upload"
    WORKDIR_FETCH = "workdir.fetch"
    AGENT_CONNECT = "agent.connect"


class PermissionDenied(BrokerError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(BrokerError):
    code = grpc.StatusCode.UNAUTHENTICATED


_MEMBER = frozenset({
    Permission.WHOAMI, Permission.JOBS_SUBMIT, Permission.JOBS_READ, Permission.JOBS_CANCEL,
    Permission.CAPACITY_READ, Permission.WORKDIR_UPLOAD,
})

# Role -> what it may do. Operators may do everything users may, for every team.
ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.MEMBER: _MEMBER,
    Role.TEAM_ADMIN: _MEMBER | {Permission.QUOTA_SET},
    Role.OPERATOR: frozenset(Permission) - {Permission.AGENT_CONNECT},
    Role.AGENT: frozenset({Permission.WHOAMI, Permission.AGENT_CONNECT, Permission.WORKDIR_FETCH}),
}

# Permissions whose requests name a team: members and team admins act on their own only.
TEAM_SCOPED = frozenset({Permission.JOBS_SUBMIT, Permission.JOBS_READ, Permission.JOBS_CANCEL,
                         Permission.QUOTA_SET})


@dataclass(frozen=True)
class MethodRule:
    permission: Permission
    mutation: bool  # written to the audit log


_J, _C, _A = "/computebroker.v1.JobService/", "/computebroker.v1.CapacityService/", \
    "/computebroker.v1.AuthService/"
_W = "/computebroker.v1.WorkdirService/"

# Every RPC the broker serves -> the permission it needs. An RPC missing here is refused
# (PERMISSION_DENIED) for everyone: a new RPC must be added on purpose.
METHODS: dict[str, MethodRule] = {
    _J + "SubmitJob": MethodRule(Permission.JOBS_SUBMIT, True),
    _J + "GetJob": MethodRule(Permission.JOBS_READ, False),
    _J + "ListJobs": MethodRule(Permission.JOBS_READ, False),
    _J + "CancelJob": MethodRule(Permission.JOBS_CANCEL, True),
    _J + "WatchJob": MethodRule(Permission.JOBS_READ, False),
    _J + "GetJobEvents": MethodRule(Permission.JOBS_READ, False),
    _J + "GetJobLogs": MethodRule(Permission.JOBS_READ, False),
    _J + "ListMigrations": MethodRule(Permission.JOBS_READ, False),
    _J + "StreamJobLogs": MethodRule(Permission.JOBS_READ, False),
    # who may share (the owner, a team admin across teams) is decided per job:
    # broker/jobs/checkpoint_shares.py
    _J + "ShareCheckpoints": MethodRule(Permission.JOBS_SUBMIT, True),
    _J + "RevokeCheckpointShare": MethodRule(Permission.JOBS_SUBMIT, True),
    _C + "ListRegions": MethodRule(Permission.CAPACITY_READ, False),
    _C + "GetCapacity": MethodRule(Permission.CAPACITY_READ, False),
    _C + "CreateTrainingPlan": MethodRule(Permission.PLANS_WRITE, True),
    _C + "ListTrainingPlans": MethodRule(Permission.CAPACITY_READ, False),
    _C + "CancelTrainingPlan": MethodRule(Permission.PLANS_WRITE, True),
    _C + "SetTeamQuota": MethodRule(Permission.QUOTA_SET, True),
    _C + "GetTeamQuota": MethodRule(Permission.CAPACITY_READ, False),
    _C + "ListTeams": MethodRule(Permission.CAPACITY_READ, False),
    _C + "SetPriorityClass": MethodRule(Permission.PRIORITIES_WRITE, True),
    _C + "ListPriorityClasses": MethodRule(Permission.CAPACITY_READ, False),
    _C + "DeletePriorityClass": MethodRule(Permission.PRIORITIES_WRITE, True),
    _C + "GetUsageSeries": MethodRule(Permission.JOBS_READ, False),
    _C + "DrainRegion": MethodRule(Permission.REGIONS_ADMIN, True),
    _C + "CordonNode": MethodRule(Permission.REGIONS_ADMIN, True),
    _W + "HasWorkdir": MethodRule(Permission.WORKDIR_UPLOAD, False),
    _W + "UploadWorkdir": MethodRule(Permission.WORKDIR_UPLOAD, True),
    _W + "FetchWorkdir": MethodRule(Permission.WORKDIR_FETCH, False),
    "/computebroker.v1.AgentService/Connect": MethodRule(Permission.AGENT_CONNECT, True),
    _A + "WhoAmI": MethodRule(Permission.WHOAMI, False),
    _A + "CreateToken": MethodRule(Permission.USERS_ADMIN, True),
    _A + "ListTokens": MethodRule(Permission.USERS_ADMIN, False),
    _A + "RevokeToken": MethodRule(Permission.USERS_ADMIN, True),
    _A + "RotateToken": MethodRule(Permission.USERS_ADMIN, True),
    _A + "ListAuditRecords": MethodRule(Permission.AUDIT_READ, False),
}

# Not subject to auth: standard gRPC infrastructure services (health probes).
# Health answers probes; reflection (the API's shape, no data) is served only when an
# operator turned it on (BrokerConfig.reflection), so it needs no credential either.
PUBLIC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def allowed(principal: Principal, permission: Permission, team: str | None = None) -> bool:
    """The decision itself (no exception): role grants the permission, and for
    team-scoped permissions a non-operator acts only on its own team. ``team=None``:
    the role check only (the interceptor, before the request says which team)."""
    if principal.credential is CredentialKind.INSECURE_DEV:
        return True  # the one local operator of a loopback dev broker
    if permission not in ROLE_PERMISSIONS[principal.role]:
        return False
    if team is not None and permission in TEAM_SCOPED and principal.role is not Role.OPERATOR:
        return bool(team) and team == principal.team
    return True


def authorize(principal: Principal, permission: Permission, team: str | None = None) -> None:
    """Raise PERMISSION_DENIED (one clear line) unless ``principal`` may do this."""
    if allowed(principal, permission, team):
        return
    who = f"{principal.actor} ({principal.role.value}" + (
        f" of team {principal.team})" if principal.team else ")")
    if permission not in ROLE_PERMISSIONS[principal.role]:
        raise PermissionDenied(f"{who} may not {permission.value}; ask an operator")
    raise PermissionDenied(f"{who} may not {permission.value} for team {team or '(none)'}:"
                           f" only for its own team")


def sees_all_teams(principal: Principal) -> bool:
    """Operators (and the local operator of an insecure dev broker) see every team's job
    ids; members and team admins see their own team's only."""
    return principal.credential is CredentialKind.INSECURE_DEV or principal.role is Role.OPERATOR


def sees_secrets(principal: Principal, team: str) -> bool:
    """Env values of a job are returned to its own team only (and the single local
    operator of an insecure dev broker); operators see the keys, values redacted."""
    return principal.credential is CredentialKind.INSECURE_DEV or (
        bool(team) and principal.team == team)
