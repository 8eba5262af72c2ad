"""The edge: every request message of every RPC passes here before a servicer sees it.

One layer of the call pipeline (:class:`EdgeGate`, broker/api/pipeline.py) that, for
every method:

* decodes requests itself: bytes that are not a valid message become INVALID_ARGUMENT
  with a one-line message (gRPC's default is INTERNAL plus a logged traceback);
* applies the limits table (broker/api/limits.py via validation.check_message) to each
  decoded message, in both directions of the API: user RPCs and every message an agent
  sends on its Connect stream;
* admits streaming RPCs only within the :class:`~broker.api.streams.StreamBudget`
  (RESOURCE_EXHAUSTED beyond it), and cancels a request stream that stays silent for
  ``idle_timeout_s`` (a half-open agent stream must not hold its slot forever).

Why a layer around every method and not code in each servicer: a new RPC or a new
field is covered without anyone remembering to add a check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from broker.api.errors import BrokerError, InvalidArgument
from broker.api.streams import StreamBudget, stream_claim
from broker.api.validation import check_message

log = logging.getLogger(__name__)


class Refused:
    """What the safe deserializer returns instead of a message it will not hand on."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def safe_deserializer(deserialize: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    """Wrap a generated ``FromString``: never raises, returns a message or a Refused."""

    def decode(data: bytes) -> Any:
        try:
            msg = deserialize(data)
        except Exception as e:  # noqa: BLE001 - any decode failure is the caller's bad bytes
            return Refused(f"{method}: the request is not a valid protobuf message"
                           f" ({type(e).__name__}); check the client's API version")
        try:
            check_message(msg)
        except InvalidArgument as e:
            return Refused(e.message)
        return msg

    return decode


class CheckedRequests:
    """A request iterator that raises InvalidArgument for a refused message and keeps
    going after it (a class iterator, not a generator, so the caller may skip one bad
    agent message and read the next). Records when the last message arrived."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self._inner = inner
        self.last = time.monotonic()

    def __iter__(self) -> CheckedRequests:
        return self

    def __next__(self) -> Any:
        msg = next(self._inner)
        self.last = time.monotonic()
        if isinstance(msg, Refused):
            raise InvalidArgument(msg.message)
        return msg


class IdleWatch:
    """One thread for all request streams: cancels those silent for ``idle_s``."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._streams: dict[int, tuple[CheckedRequests, grpc.ServicerContext]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-idle", daemon=True)
        self._thread.start()

    def add(self, reqs: CheckedRequests, context: grpc.ServicerContext) -> int:
        with self._lock:
            self._streams[id(reqs)] = (reqs, context)
        return id(reqs)

    def remove(self, key: int) -> None:
        with self._lock:
            self._streams.pop(key, None)

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.idle_s / 4)):
            now = time.monotonic()
            with self._lock:
                idle = [(k, c) for k, (r, c) in self._streams.items() if now - r.last > self.idle_s]
                for k, _ in idle:
                    self._streams.pop(k, None)
            for _, ctx in idle:
                log.warning("request stream from %s silent for %.0fs: cancelled", ctx.peer(), self.idle_s)
                ctx.cancel()

    def close(self) -> None:
        self._stop.set()


def _abort(context: grpc.ServicerContext, exc: BrokerError) -> None:
    context.abort(exc.code, exc.message)


class EdgeGate:
    """See the module docstring. ``budget``: the stream caps; ``idle``: the idle watch;
    ``peer_known``: False on the API workers' private link, whose peer is a worker (the
    worker applied the per-address caps to the real caller)."""

    def __init__(self, budget: StreamBudget, idle: IdleWatch, *, peer_known: bool = True) -> None:
        self.budget = budget
        self.idle = idle
        self.peer_known = peer_known

    def wrap(self, handler: Any, method: str) -> Any:
        """``method``'s handler behind the edge (decode, limits, stream budget)."""
        if handler is None:
            return None
        return self._wrap(handler, method.rsplit("/", 1)[-1])

    def _wrap(self, handler: Any, method: str) -> Any:
        deser = handler.request_deserializer
        kw = {"request_deserializer": safe_deserializer(deser, method) if deser else None,
              "response_serializer": handler.response_serializer}
        budget, idle, peer_known = self.budget, self.idle, self.peer_known

        def admit(context: grpc.ServicerContext) -> Callable[[], None]:
            """Take a stream slot (or abort); the release runs once, whichever ends first."""
            claim = stream_claim(context, peer_known=peer_known)
            try:
                budget.acquire(claim, method)
            except BrokerError as e:
                _abort(context, e)
            done = threading.Event()

            def release() -> None:
                if not done.is_set():
                    done.set()
                    budget.release(claim)

            context.add_callback(release)
            return release

        if not handler.request_streaming and not handler.response_streaming:
            behavior = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                if isinstance(request, Refused):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                return behavior(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, **kw)

        if not handler.request_streaming:
            behavior = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                if isinstance(request, Refused):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                release = admit(context)
                try:
                    yield from behavior(request, context)
                finally:
                    release()

            return grpc.unary_stream_rpc_method_handler(unary_stream, **kw)

        def with_requests(inner: Callable[[Any, grpc.ServicerContext], Any],
                          streaming_out: bool) -> Callable[[Iterator[Any], grpc.ServicerContext], Any]:
            if streaming_out:
                def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
                    release = admit(context)
                    checked = CheckedRequests(requests)
                    key = idle.add(checked, context)
                    try:
                        yield from inner(checked, context)
                    finally:
                        idle.remove(key)
                        release()

                return stream_stream

            def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                release = admit(context)
                checked = CheckedRequests(requests)
                key = idle.add(checked, context)
                try:
                    return inner(checked, context)
                finally:
                    idle.remove(key)
                    release()

            return stream_unary

        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                with_requests(handler.stream_stream, True), **kw)
        return grpc.stream_unary_rpc_method_handler(with_requests(handler.stream_unary, False), **kw)
