"""Calls an API worker forwards to the core process, and who made them.

Why forward at all (docs/architecture.md "API worker processes"): a worker serves the
hot calls itself (SubmitJob, job reads, WatchJob, workdir transfers, probes), but
everything that acts on state living in the core's memory (cancels and other
transitions whose commands reach agent streams, capacity and quota changes the
scheduler caches, log follows fed by agent streams, tokens whose cache must drop at
once) runs in the one core process, as it does without workers. So the worker authenticates,
authorizes (the same policy table) and audits the call, then sends it on over the
private link with the caller's principal attached; the core trusts that principal
only with the link key (:class:`ForwardedAuthenticator`) and audits nothing again.

The principal travels as JSON in ``x-cb-principal``, never the caller's credential
(the core does not see tokens). Other caller metadata (trace context) passes through.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from broker.auth.identity import CredentialKind, Principal, Role
from broker.auth.policy import Unauthenticated

PRINCIPAL_KEY = "x-cb-principal"
LINK_KEY = "x-cb-link-key"
_DROPPED = {"authorization", PRINCIPAL_KEY, LINK_KEY, "user-agent"}


def encode_principal(p: Principal) -> str:
    return json.dumps([p.name, p.role.value, p.team, p.region, p.credential.value, p.token_id])


def decode_principal(text: str) -> Principal:
    name, role, team, region, credential, token_id = json.loads(text)
    return Principal(name=name, role=Role(role), team=team, region=region,
                     credential=CredentialKind(credential), token_id=token_id)


def link_metadata(key: str) -> tuple[tuple[str, str], ...]:
    return ((LINK_KEY, key),)


def has_link_key(context: grpc.ServicerContext, key: str) -> bool:
    for k, v in context.invocation_metadata() or ():
        if k == LINK_KEY and isinstance(v, str):
            return hmac.compare_digest(v.encode(), key.encode())
    return False


class ForwardedAuthenticator:
    """The core's authenticator on the link socket: the principal a worker vouches for,
    only with the link key (a same-user process that found the socket still needs it)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def authenticate(self, context: grpc.ServicerContext) -> Principal:
        key_ok, principal = False, ""
        for k, v in context.invocation_metadata() or ():
            if k == LINK_KEY and isinstance(v, str):
                key_ok = hmac.compare_digest(v.encode(), self.key.encode())
            elif k == PRINCIPAL_KEY and isinstance(v, str):
                principal = v
        if not key_ok:
            raise Unauthenticated("the worker link needs the core's link key")
        try:
            return decode_principal(principal)
        except (ValueError, TypeError) as e:
            raise Unauthenticated(f"forwarded call names no valid principal: {e}") from None


class Forwarder:
    """Builds servicer methods that send a call on to the core and relay its answer
    (status and message included), for unary and server-streaming methods."""

    def __init__(self, key: str) -> None:
        self.key = key

    def _metadata(self, context: Any) -> list[tuple[str, str]]:
        md = [(k, v) for k, v in context.invocation_metadata() or ()
              if k not in _DROPPED and not k.startswith(("grpc-", ":")) and isinstance(v, str)]
        md.append((PRINCIPAL_KEY, encode_principal(context.principal)))
        md.append((LINK_KEY, self.key))
        return md

    @staticmethod
    def _timeout(context: Any) -> float | None:
        """The caller's deadline, passed on; None when it set none (gRPC reports that
        as an infinite time remaining, which would not survive as a deadline)."""
        left = context.time_remaining()
        return left if left is not None and left < 1e8 else None

    def unary(self, call: grpc.UnaryUnaryMultiCallable) -> Callable[[Any, Any], Any]:
        def forward(request: Any, context: Any) -> Any:
            try:
                return call(request, metadata=self._metadata(context), timeout=self._timeout(context))
            except grpc.RpcError as e:
                context.abort(e.code(), e.details() or "")  # type: ignore[attr-defined]
        return forward

    def stream(self, call: grpc.UnaryStreamMultiCallable) -> Callable[[Any, Any], Iterator[Any]]:
        def forward(request: Any, context: Any) -> Iterator[Any]:
            upstream = call(request, metadata=self._metadata(context), timeout=self._timeout(context))
            context.add_callback(upstream.cancel)  # the caller left: end the core's stream too
            try:
                yield from upstream
            except grpc.RpcError as e:
                if e.code() is grpc.StatusCode.CANCELLED and not context.is_active():  # type: ignore[attr-defined]
                    return
                context.abort(e.code(), e.details() or "")  # type: ignore[attr-defined]
        return forward

    def servicer(self, service: Any, stub: Any, names: list[str] | None = None,
                 base: Any = None) -> Any:
        """``base`` (or an empty object) with ``names`` (default: every method of the
        service descriptor ``service``) replaced by forwarders through ``stub``."""
        target = base if base is not None else type(f"Forwarded{service.name}", (), {})()
        for m in service.methods:
            if names is not None and m.name not in names:
                continue
            if m.client_streaming:
                raise ValueError(f"{service.name}.{m.name}: request streams are not forwarded")
            mc = getattr(stub, m.name)
            setattr(target, m.name, self.stream(mc) if m.server_streaming else self.unary(mc))
        return target
