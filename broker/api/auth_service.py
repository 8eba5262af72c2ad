"""AuthService: WhoAmI, operators' user tokens, the audit log (``brokerctl users/audit``).

Authorization happened before this runs (broker/auth/interceptor.py, policy.METHODS)."""

from __future__ import annotations

import grpc

from broker.api.errors import InvalidArgument, NotFound, rpc
from broker.auth.audit import AuditLog
from broker.auth.identity import Role
from broker.auth.interceptor import principal_of
from broker.auth.tokens import TokenManager
from computebroker.v1 import auth_pb2 as apb
from computebroker.v1 import auth_pb2_grpc


class AuthService(auth_pb2_grpc.AuthServiceServicer):
    def __init__(self, tokens: TokenManager, audit: AuditLog) -> None:
        self.tokens = tokens
        self.audit = audit

    @rpc
    def WhoAmI(self, request: apb.WhoAmIRequest, context: grpc.ServicerContext) -> apb.Principal:
        p = principal_of(context)
        return apb.Principal(name=p.name, team=p.team, role=p.role.value, region=p.region,
                             credential=f"token:{p.token_id}" if p.token_id else p.credential.value)

    @rpc
    def CreateToken(self, request: apb.CreateTokenRequest, context: grpc.ServicerContext) -> apb.IssuedToken:
        try:
            role = Role.parse(request.role or "member")
            return self.tokens.create(request.user, request.team, role, principal_of(context).actor,
                                      ttl_s=request.ttl_s)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None

    @rpc
    def ListTokens(self, request: apb.ListTokensRequest, context: grpc.ServicerContext) -> apb.ListTokensResponse:
        return apb.ListTokensResponse(tokens=self.tokens.list(request.user, request.include_revoked))

    @rpc
    def RevokeToken(self, request: apb.RevokeTokenRequest, context: grpc.ServicerContext) -> apb.ApiToken:
        try:
            return self.tokens.revoke(request.token_id)
        except KeyError:
            raise NotFound(f"token {request.token_id!r} not found (`brokerctl users list`)") from None
        except ValueError as e:
            raise InvalidArgument(str(e)) from None

    @rpc
    def RotateToken(self, request: apb.RotateTokenRequest, context: grpc.ServicerContext) -> apb.IssuedToken:
        try:
            return self.tokens.rotate(request.token_id)
        except KeyError:
            raise NotFound(f"token {request.token_id!r} not found (`brokerctl users list`)") from None
        except ValueError as e:
            raise InvalidArgument(str(e)) from None

    @rpc
    def ListAuditRecords(self, request: apb.ListAuditRecordsRequest,
                         context: grpc.ServicerContext) -> apb.ListAuditRecordsResponse:
        limit = request.limit or 100
        if limit < 0 or limit > 10_000:
            raise InvalidArgument("limit must be between 1 and 10000")
        return apb.ListAuditRecordsResponse(
            records=self.audit.query(request.actor, request.since, limit))
