"""The call pipeline: who (auth), the edge (decode, limits, stream budget) and the
standby gate, composed around each RPC's handler ONCE, when the services register.

Why not ``grpc.ServerInterceptor``: each of our three layers decides per *method*,
not per call (which wrapper a method gets never changes; the standby gate's leader
check is one attribute read inside its wrapper), so the composition is built once, in
one place, in one stated order, for every service alike. As interceptors, two of them
kept per-method caches of their wrappers with rebuild logic, and the standby gate built
a refusing handler per call. It is not a speed-up by itself: three pass-through
interceptors on a bare server measured within noise of none (0.169-0.193 against
0.174-0.178 ms of CPU per 2 KB call, 16 clients). What the auth layer did per call was
the cost (broker/auth/audit.py ``target_of``).

A :class:`Layer` turns a method's handler into its wrapped handler (or returns it
unchanged: e.g. auth leaves the public health probe alone). :class:`LayeredServer`
stands in for the ``grpc.Server`` that the generated ``add_*Servicer_to_server``
functions (ours, health, reflection) register with, so every service, including those
we do not generate, gets the same layers, outermost first as listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import grpc


class Layer(Protocol):
    """One concern of every call; ``wrap`` runs once per method at registration."""

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """``handler`` for ``method`` (``/package.Service/Method``), wrapped or as is."""
        ...


class MethodTable(grpc.GenericRpcHandler):
    """The generic-handler lookup of a service's already wrapped handlers (``handlers``:
    full method name -> handler; broker/api/aio_server.py converts them again)."""

    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers = handlers

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handlers.get(handler_call_details.method)


class LayeredServer:
    """Registers services on ``server`` with ``layers`` (outermost first) around each
    method. Pass it where a generated ``add_XServicer_to_server(servicer, server)``
    expects the server."""

    def __init__(self, server: Any, layers: Sequence[Layer]) -> None:  # grpc.Server or LoopServer
        self.server = server
        self._layers = list(layers)
        self.methods: dict[str, grpc.RpcMethodHandler] = {}  # full name -> wrapped handler

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        for layer in reversed(self._layers):  # innermost first, so the first listed runs first
            handler = layer.wrap(handler, method)
        return handler

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        out: list[grpc.GenericRpcHandler] = []
        for h in generic_rpc_handlers:
            table = getattr(h, "_method_handlers", None)  # grpc's DictionaryGenericHandler
            if isinstance(table, dict):
                wrapped = {m: self._wrapped(m, hd) for m, hd in table.items()}
                out.append(MethodTable(wrapped))
            else:  # every generated add_*_to_server passes grpc's dictionary handler
                raise TypeError(f"{type(h).__name__} is not a method table the call pipeline"
                                " can wrap; register services through their generated"
                                " add_*Servicer_to_server functions")
        self.server.add_generic_rpc_handlers(tuple(out))

    def add_registered_method_handlers(self, service_name: str,
                                       method_handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        """gRPC's fast path (no generic-handler walk per call), with the same wrappers
        as the generic registration of the same service."""
        self.server.add_registered_method_handlers(service_name, {
            name: self._wrapped(f"/{service_name}/{name}", h) for name, h in method_handlers.items()})

    def _wrapped(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        hit = self.methods.get(method)
        if hit is None:
            hit = self.methods[method] = self.wrap(handler, method)
        return hit
