"""One mapping from exceptions to gRPC status codes, applied to every RPC.

Why a decorator and not try/except in each servicer: every RPC must turn bad
input into the right status with a human message and must never leak a traceback;
doing it in one place makes that impossible to forget.
"""

from __future__ import annotations

import functools
import inspect
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from broker.store.base import AlreadyExists as StoreAlreadyExists
from broker.store.base import CorruptRecord, Fenced, StoreError, StoreUnavailable
from broker.store.base import NotFound as StoreNotFound

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# Trailing metadata on UNAVAILABLE answers caused by the store: how long a client should
# wait before retrying (gRPC's own retry-pushback key, understood by grpc retry policies).
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
RETRY_PUSHBACK_MS = "1000"


class BrokerError(Exception):
    """An error meant for the caller: ``code`` + a message that says what to do."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(BrokerError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(BrokerError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(BrokerError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(BrokerError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(BrokerError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(BrokerError):
    code = grpc.StatusCode.UNAVAILABLE


class IllegalTransition(BrokerError):
    """A phase change broker/jobs/lifecycle.py does not allow (a broker bug or a race lost)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message a caller should see for ``exc``."""
    if isinstance(exc, BrokerError):
        return exc.code, exc.message
    if isinstance(exc, StoreNotFound):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, StoreAlreadyExists):
        return grpc.StatusCode.ALREADY_EXISTS, str(exc)
    if isinstance(exc, StoreUnavailable):
        log.warning("state store unavailable: %s", exc)
        return grpc.StatusCode.UNAVAILABLE, "state store unavailable, retry in a second"
    if isinstance(exc, Fenced):
        log.warning("write refused, this broker no longer leads: %s", exc)
        return grpc.StatusCode.UNAVAILABLE, "this broker no longer leads; retry (another leads)"
    if isinstance(exc, CorruptRecord):  # already logged (one line) where it was read
        return grpc.StatusCode.DATA_LOSS, str(exc)
    if isinstance(exc, StoreError):
        incident = uuid.uuid4().hex[:8]
        log.exception("store error (incident %s)", incident)
        return grpc.StatusCode.UNAVAILABLE, f"state store unavailable, retry later (incident {incident})"
    incident = uuid.uuid4().hex[:8]
    log.exception("internal error (incident %s)", incident)
    return grpc.StatusCode.INTERNAL, f"internal broker error (incident {incident}; see broker log)"


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    """Abort the RPC; UNAVAILABLE carries a retry hint (every UNAVAILABLE we send is
    transient: store down, or leadership moving)."""
    if code is grpc.StatusCode.UNAVAILABLE:
        context.set_trailing_metadata(((RETRY_PUSHBACK_KEY, RETRY_PUSHBACK_MS),))
    context.abort(code, message)


def rpc(func: F) -> F:
    """Wrap a servicer method (unary or server-streaming) with :func:`to_status`."""
    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def stream_wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from func(self, request, context)
                return
            except grpc.RpcError:
                if not context.is_active():
                    return  # the client went away mid-read (cancel, deadline): nobody to answer
                code, message = to_status(RuntimeError("request stream failed"))
            except Exception as exc:  # noqa: BLE001 - mapped below
                code, message = to_status(exc)
            _abort(context, code, message)

        return stream_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def unary_wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return func(self, request, context)
        except grpc.RpcError:
            if not context.is_active():
                return None  # the client went away mid-upload: nobody to answer
            code, message = to_status(RuntimeError("request stream failed"))
        except Exception as exc:  # noqa: BLE001 - mapped below
            code, message = to_status(exc)
        _abort(context, code, message)

    return unary_wrapper  # type: ignore[return-value]
