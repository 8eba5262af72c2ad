"""An API front-end's calls for the leader: sent on to whichever replica leads, as the caller.

Why proxy rather than refuse (docs/operator/frontends.md): an operator who points
``brokerctl`` or the SDK at the load balancer in front of the front-ends expects
``brokerctl cancel``, quotas and tokens to work there too, without knowing which host
leads right now or keeping a second address list. What those calls act on lives in the
leader's memory (commands to agent streams, the scheduler's quota cache, the token
cache), so the front-end cannot serve them itself; it sends them on.

Whose call it is: the **caller's**. The front-end holds no credential of its own towards
the leader. It authenticates the caller as usual (an anonymous or invalid call never
leaves the front-end), then forwards the call with the caller's own metadata (its
bearer token, its trace context) over TLS to the leader's advertised address, where the
leader authenticates and authorizes that token itself, with the same policy table and
team checks as a direct call, and writes the audit record (the front-end does not audit
these calls, so each call has one record; its peer is the front-end). A token revoked
on the leader is refused there at once, whatever the front-end's cache says.

Where the leader is: the store's leader record (``LeaderPointer``, re-read at most every
2 s, at once after the leader did not answer). A call that finds no leader, or a leader
that does not answer, is UNAVAILABLE: the caller retries, as it would against a leader
failing over. Request-streaming calls (only agents' Connect) are never forwarded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from broker.api.forwarding import LINK_KEY, PRINCIPAL_KEY
from broker.config import BrokerConfig

log = logging.getLogger(__name__)

# Not passed on: gRPC's own and transport headers, and the private worker-link keys
# (meaningless off a host's link socket; never let a caller's copy travel further).
_DROPPED = {"user-agent", PRINCIPAL_KEY, LINK_KEY}


class LeaderChannel:
    """One channel to the leader of the moment, replaced when the leader changes.
    ``address()``: the leader's advertised ``host:port`` ("" = none known)."""

    def __init__(self, config: BrokerConfig, address: Callable[[], str]) -> None:
        self.config, self.address = config, address
        self._lock = threading.Lock()
        self._at = ""
        self._channel: grpc.Channel | None = None
        self._stubs: dict[type, Any] = {}

    def stub(self, stub_cls: type) -> tuple[Any, str] | None:
        """(a ``stub_cls`` on the leader's channel, its address), or None when no leader
        is known."""
        address = self.address()
        if not address:
            return None
        with self._lock:
            if address != self._at or self._channel is None:
                if self._channel is not None:
                    self._channel.close()
                self._channel, self._at, self._stubs = self._open(address), address, {}
            stub = self._stubs.get(stub_cls)
            if stub is None:
                stub = self._stubs[stub_cls] = stub_cls(self._channel)
            return stub, address

    def _open(self, address: str) -> grpc.Channel:
        cfg = self.config
        if cfg.insecure_dev:
            return grpc.insecure_channel(address)
        ca = Path(cfg.tls_ca).read_bytes() if cfg.tls_ca else None
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca))

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel, self._at, self._stubs = None, "", {}


def forwarded_metadata(context: Any) -> list[tuple[str, str]]:
    """The caller's metadata as the leader should see it: its credential and trace
    context, without transport headers and private link keys."""
    return [(k, v) for k, v in context.invocation_metadata() or ()
            if k not in _DROPPED and not k.startswith(("grpc-", ":")) and isinstance(v, str)]


def _timeout(context: Any) -> float | None:
    left = context.time_remaining()
    return left if left is not None and left < 1e8 else None


class LeaderProxy:
    """Servicer methods that send a call on to the leader and relay its answer.

    ``unknown(full method)``: the message when no leader is known; ``outcome(code)``: told
    each forwarded call's final status (the front-end's metrics); ``stale()``: the leader
    did not answer, so the pointer should be read again."""

    def __init__(self, leader: LeaderChannel, unknown: Callable[[str], str],
                 outcome: Callable[[grpc.StatusCode], None], stale: Callable[[], None]) -> None:
        self.leader, self.unknown, self.outcome, self.stale = leader, unknown, outcome, stale

    def _failed(self, e: grpc.RpcError, address: str, context: Any) -> None:
        code = e.code()
        self.outcome(code)
        details = e.details() or ""
        if code is grpc.StatusCode.UNAVAILABLE:
            self.stale()  # a failover, a dead leader: the next call reads the record again
            details = f"{details} (sent on by an API front-end to the leader at {address})"
        context.abort(code, details)

    def servicer(self, service: Any, names: list[str], stub_cls: type, base: Any = None) -> Any:
        """``base`` (or an empty object) with ``names`` (methods of the service descriptor
        ``service``) forwarded to the leader through ``stub_cls``."""
        target = base if base is not None else type(f"Proxied{service.name}", (), {})()
        for m in service.methods:
            if m.name not in names:
                continue
            if m.client_streaming:
                raise ValueError(f"{service.name}.{m.name}: request streams are not forwarded")
            full = f"{service.name}.{m.name}"
            setattr(target, m.name, (self._stream if m.server_streaming else self._unary)(
                stub_cls, m.name, full))
        return target

    def _unary(self, stub_cls: type, name: str, full: str) -> Callable[[Any, Any], Any]:
        def call(request: Any, context: Any) -> Any:
            found = self.leader.stub(stub_cls)
            if found is None:
                context.abort(grpc.StatusCode.UNAVAILABLE, self.unknown(full))
            stub, address = found  # type: ignore[misc]
            try:
                out = getattr(stub, name)(request, metadata=forwarded_metadata(context),
                                          timeout=_timeout(context))
            except grpc.RpcError as e:
                self._failed(e, address, context)
            self.outcome(grpc.StatusCode.OK)
            return out
        return call

    def _stream(self, stub_cls: type, name: str, full: str) -> Callable[[Any, Any], Iterator[Any]]:
        def call(request: Any, context: Any) -> Iterator[Any]:
            found = self.leader.stub(stub_cls)
            if found is None:
                context.abort(grpc.StatusCode.UNAVAILABLE, self.unknown(full))
            stub, address = found  # type: ignore[misc]
            upstream = getattr(stub, name)(request, metadata=forwarded_metadata(context),
                                           timeout=_timeout(context))
            context.add_callback(upstream.cancel)  # the caller left: end the leader's stream too
            try:
                yield from upstream
            except grpc.RpcError as e:
                if e.code() is grpc.StatusCode.CANCELLED and not context.is_active():
                    return
                self._failed(e, address, context)
            self.outcome(grpc.StatusCode.OK)
        return call
