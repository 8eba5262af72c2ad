"""Authentication, authorization and audit for every RPC: the outermost layer of the
call pipeline (broker/api/pipeline.py), composed around each method once.

Why wrap the handler rather than decide before it: only the servicer context carries
the verified TLS peer (``auth_context()``), so the decision runs as the first step of
the wrapped handler. Servicers receive an :class:`AuthedContext`
(the real context plus ``principal``) and read it with :func:`principal_of`.

Identity comes only from a credential: a bearer token (``authorization: Bearer
cbt_...``, verified by broker/auth/tokens.py) or a client certificate verified by the
TLS layer against the broker's CA (broker/auth/identity.py names). No header names a
user. In insecure dev mode (loopback only) every caller is the one local operator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from broker.api.errors import to_status
from broker.api.peer_gate import real_peer
from broker.auth.audit import AuditLog, PendingAudit, target_of
from broker.auth.identity import (
    INSECURE_DEV_PRINCIPAL,
    CredentialKind,
    Principal,
    principal_from_uri,
)
from broker.auth.policy import (
    METHODS,
    PUBLIC_PREFIXES,
    PermissionDenied,
    Unauthenticated,
    authorize,
)
from broker.auth.revocation import CertRevocations
from broker.auth.tokens import TokenError, TokenManager

log = logging.getLogger(__name__)

LOGIN_HINT = ("not logged in: set CB_TOKEN (a token from `brokerctl users create`) or use a"
              " context from `brokerctl dev-ca` (CB_CONFIG)")


class AuthedContext:
    """The servicer context plus the caller's principal; records the status code an
    aborted call ends with (for the audit record). Everything else is delegated."""

    def __init__(self, context: grpc.ServicerContext, principal: Principal) -> None:
        self._ctx = context
        self.principal = principal
        self.final_code: grpc.StatusCode | None = None
        self._peer: str | None = None

    def peer(self) -> str:
        """The caller's address, asked of gRPC once (the audit record and its log line
        both name it; each ask is a call into gRPC's core)."""
        if self._peer is None:
            self._peer = real_peer(self._ctx.peer())  # the client's, through a gate too
        return self._peer

    def abort(self, code: grpc.StatusCode, details: str) -> Any:
        self.final_code = code
        return self._ctx.abort(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.final_code = code
        self._ctx.set_code(code)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def principal_of(context: Any) -> Principal:
    """The authenticated caller of an RPC (set by :class:`AuthInterceptor`)."""
    p = getattr(context, "principal", None)
    if not isinstance(p, Principal):
        raise Unauthenticated("no authenticated caller (the auth interceptor is not installed)")
    return p


class Authenticator:
    """Credential -> principal (no policy here)."""

    def __init__(self, tokens: TokenManager | None, insecure_dev: bool,
                 revocations: CertRevocations | None = None) -> None:
        self.tokens = tokens
        self.insecure_dev = insecure_dev
        self.revocations = revocations

    def cert_refusal(self, context: grpc.ServicerContext) -> str:
        """Why the caller's verified client certificate is no longer trusted ("" = it is,
        or there is none)."""
        if self.revocations is None or not self.revocations.enabled:
            return ""
        pems = (context.auth_context() or {}).get("x509_pem_cert") or []
        return self.revocations.refusal(pems[0]) if pems else ""

    def authenticate(self, context: grpc.ServicerContext) -> Principal:
        if self.insecure_dev:
            return INSECURE_DEV_PRINCIPAL
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, rest = value.partition(" ")
                if scheme.lower() == "bearer":
                    token = rest.strip()
        if token:
            if self.tokens is None:
                raise Unauthenticated("this broker accepts no tokens")
            try:
                return self.tokens.verify(token)
            except TokenError as e:
                raise Unauthenticated(f"{e}; ask an operator for a new token") from None
        auth = context.auth_context() or {}
        uris = auth.get("peer_uri") or auth.get("x509_subject_alternative_name") or []
        for raw in uris:
            p = principal_from_uri(raw.decode(errors="replace"))
            if p is not None:
                why = self.cert_refusal(context)
                if why:
                    raise Unauthenticated(f"{why}; ask an operator for a new certificate")
                return p
        if uris or auth.get("x509_common_name"):
            raise Unauthenticated("the client certificate names no compute-broker identity"
                                  " (expected a spiffe://compute-broker/... URI SAN)")
        raise Unauthenticated(LOGIN_HINT)


def _target(ctx: AuthedContext, method: str, request: Any) -> str:
    """What an audited call acts on (an agent's own calls: the agent)."""
    return target_of(request) or (ctx.principal.name if "AgentService" in method else "")


class AuthInterceptor:
    """Authenticate, authorize by :data:`broker.auth.policy.METHODS`, audit mutations.
    A pipeline :class:`~broker.api.pipeline.Layer` (the name is from when it was a gRPC
    interceptor)."""

    def __init__(self, authenticator: Authenticator, audit: AuditLog | None,
                 unaudited: frozenset[str] = frozenset()) -> None:
        """``unaudited``: full method names whose calls this process authenticates but
        does not audit, because another process that audits them serves them (an API
        front-end sends those on to the leader: broker/api/leader_proxy.py)."""
        self.authn = authenticator
        self.audit = audit
        self.unaudited = unaudited

    def wrap(self, handler: Any, method: str) -> Any:
        """``method``'s handler behind authentication; public probes are left as is."""
        if handler is None or method.startswith(PUBLIC_PREFIXES):
            return handler
        return self._wrap(handler, method)

    def _wrap(self, handler: Any, method: str) -> Any:
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(handler.stream_stream, method), **kw)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, method), **kw)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(handler.unary_stream, method), **kw)
        return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, method), **kw)

    # ---- the one check ------------------------------------------------------------
    def _admit(self, method: str, context: grpc.ServicerContext) -> tuple[AuthedContext, bool]:
        """(wrapped context, audit this call?) or abort UNAUTHENTICATED/PERMISSION_DENIED."""
        rule = METHODS.get(method)
        principal: Principal | None = None
        try:
            principal = self.authn.authenticate(context)
            if rule is None:
                raise PermissionDenied(f"{method} is not an RPC this broker authorizes")
            authorize(principal, rule.permission)
        except (Unauthenticated, PermissionDenied) as e:
            if self.audit is not None and (rule is None or rule.mutation):
                self.audit.record(principal, method, "", real_peer(context.peer()), e.code.name,
                                  e.message)
            context.abort(e.code, e.message)
        except Exception as e:  # noqa: BLE001 - e.g. the store is down: UNAVAILABLE, retry
            code, message = to_status(e)
            context.abort(code, message)
        assert principal is not None and rule is not None
        # No audit log (a core serving calls its API workers forwarded, which audited
        # them): nothing to record, and no record to ride along a write.
        return AuthedContext(context, principal), (rule.mutation and self.audit is not None
                                                   and method not in self.unaudited)

    def _finish(self, ctx: AuthedContext, method: str, request: Any, failed: bool) -> None:
        if self.audit is None:
            return
        code = ctx.final_code or (grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK)
        if code is grpc.StatusCode.UNAVAILABLE:
            return  # a standby's refusal or a store outage: nothing happened, the caller retries
        self.audit.record(ctx.principal, method, _target(ctx, method, request), ctx.peer(), code.name)

    def _unary(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            ctx, audited = self._admit(method, context)
            if not audited:
                return behavior(request, ctx)
            failed = True
            # A job creation commits this record with the job (audit.PendingAudit).
            pending = PendingAudit(ctx.principal, method, _target(ctx, method, request), ctx.peer())
            token = AuditLog.begin(pending)
            try:
                out = behavior(request, ctx)
                failed = False
                return out
            finally:
                AuditLog.end(token)
                if not pending.written:
                    self._finish(ctx, method, request, failed)

        return call

    def _revocable(self, requests: Any, ctx: AuthedContext) -> Any:
        """A request stream of a certificate caller, cancelled at its next message once
        the certificate is revoked (an agent's Connect lives for days; a revocation must
        not wait for its reconnect)."""
        check = getattr(self.authn, "cert_refusal", None)
        revocations = getattr(self.authn, "revocations", None)
        if (check is None or revocations is None or not revocations.enabled
                or ctx.principal.credential is not CredentialKind.CERT
                or not isinstance(requests, Iterator)):
            return requests  # nothing can be revoked: no per-message hop

        def checked() -> Iterator[Any]:
            for msg in requests:
                why = check(ctx)
                if why:
                    log.warning("%s: %s; its stream is cancelled", ctx.principal.actor, why)
                    ctx.cancel()
                    return
                yield msg

        return checked()

    def _stream(self, behavior: Callable[..., Any], method: str) -> Callable[..., Iterator[Any]]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            ctx, audited = self._admit(method, context)
            request = self._revocable(request, ctx)
            if not audited:
                yield from behavior(request, ctx)
                return
            failed = True
            try:
                yield from behavior(request, ctx)
                failed = False
            finally:
                self._finish(ctx, method, request, failed)

        return call
