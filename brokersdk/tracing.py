"""The SDK's own small tracing helper: a client span around an RPC, W3C context out.

Why here and not the broker's telemetry: the SDK must import nothing of the server
(it is installed on laptops and notebooks that never run a broker). Only the
OpenTelemetry *API* is used: with no tracer provider configured by the application,
spans are non-recording and this costs next to nothing. The broker reads the
``traceparent`` metadata this sends and makes the job's trace a child of the span.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER_NAME = "computebroker.sdk"
_PROPAGATOR = TraceContextTextMapPropagator()


@contextlib.contextmanager
def client_span(name: str, **attributes: Any) -> Iterator[list[tuple[str, str]]]:
    """A client span around one RPC; yields the gRPC metadata to send with it
    (``traceparent``/``tracestate``; empty when nothing traces)."""
    with trace.get_tracer(TRACER_NAME).start_as_current_span(
            name, kind=trace.SpanKind.CLIENT, attributes=attributes or None):
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        yield sorted(carrier.items())


def set_attributes(**attributes: Any) -> None:
    """Annotate the current span (no-op when it does not record)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
