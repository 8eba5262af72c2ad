"""The broker's tracing: one process-wide TracerProvider, the JSONL/OTLP exporters, and
W3C trace-context propagation (``traceparent``) in and out.

Only the OpenTelemetry *API* is imported at module load; the SDK and exporters load in
:func:`setup_tracing`, when a trace file or an OTLP endpoint asks for them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)

TRACEPARENT_ENV = "TRACEPARENT"  # the OTel convention for trace context in an env var
TRACE_FILE_ENV = "CB_TRACE_FILE"
OTLP_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACER_NAME = "computebroker"

_PROPAGATOR = TraceContextTextMapPropagator()
_setup_lock = threading.Lock()
_provider: Any = None  # the SDK TracerProvider this module installed, if any


# ---------------------------------------------------------------- exporting spans
def span_record(span: Any, service: str) -> dict[str, Any]:
    """One finished span as a flat JSON object (the ``CB_TRACE_FILE`` line format)."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "service": service,
        "kind": span.kind.name.lower() if span.kind is not None else "internal",
        "attributes": {k: (list(v) if isinstance(v, tuple) else v)
                       for k, v in (span.attributes or {}).items()},
        "links": [{"trace_id": f"{lk.context.trace_id:032x}",
                   "span_id": f"{lk.context.span_id:016x}"} for lk in span.links],
        "status": span.status.status_code.name.lower(),
        "start": (span.start_time or 0) / 1e9,
        "end": (span.end_time or 0) / 1e9,
    }


def _jsonl_exporter_class() -> type:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonlSpanExporter(SpanExporter):
        """One JSON line per span, appended with a single ``write`` on an O_APPEND fd, so
        the SDK, broker, agent and every trainer rank can share one file safely."""

        def __init__(self, path: str, service: str) -> None:
            self.path = path
            self.service = service

        def export(self, spans: Sequence[Any]) -> Any:
            data = "".join(json.dumps(span_record(s, self.service), default=str) + "\n"
                           for s in spans).encode()
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("trace file %s: %s", self.path, exc)
                return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

    return JsonlSpanExporter


def _otlp_span_exporter() -> Any | None:
    """The OTLP exporter when one is installed (grpc first, then http/protobuf)."""
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,  # type: ignore[assignment]
            )
        except ImportError:
            log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but no OTLP exporter is installed"
                        " (pip install opentelemetry-exporter-otlp); traces stay off")
            return None
    return OTLPSpanExporter()


def setup_tracing(service_name: str) -> bool:
    """Install a TracerProvider for this process when asked for; True when tracing is on.

    ``CB_TRACE_FILE=/path.jsonl``: one JSON line per span (synchronous export: cheap at
    our span rate, and nothing is lost when a process ends with ``os._exit``).
    ``OTEL_EXPORTER_OTLP_ENDPOINT``: OTLP (batched), if the exporter is installed.
    Neither: nothing is installed and the API stays a no-op. A provider someone else
    already installed is respected. Idempotent.
    """
    global _provider
    with _setup_lock:
        if _provider is not None:
            return True
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider

        if isinstance(trace.get_tracer_provider(), SdkProvider):
            return True
        path = os.environ.get(TRACE_FILE_ENV, "")
        endpoint = next((os.environ[k] for k in OTLP_ENV if os.environ.get(k)), "")
        if not path and not endpoint:
            return False
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        provider = SdkProvider(resource=Resource.create({"service.name": service_name}))
        wired = False
        if path:
            provider.add_span_processor(SimpleSpanProcessor(_jsonl_exporter_class()(path, service_name)))
            wired = True
        if endpoint:
            otlp = _otlp_span_exporter()
            if otlp is not None:
                provider.add_span_processor(BatchSpanProcessor(otlp))
                wired = True
        if not wired:
            return False
        trace.set_tracer_provider(provider)
        _provider = provider
        return True


def flush_tracing() -> None:
    """Export what is buffered (before an ``os._exit``, or at the end of a test)."""
    if _provider is not None:
        _provider.force_flush()


def tracing_on() -> bool:
    return _provider is not None or not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider)


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


# ------------------------------------------------------------------ propagation
def traceparent_of_current() -> str:
    """The current span's ``traceparent`` ("" when there is no valid span context)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


def context_from_traceparent(traceparent: str) -> otel_context.Context | None:
    if not traceparent:
        return None
    return _PROPAGATOR.extract({"traceparent": traceparent})


def carries_traceparent(metadata: Sequence[tuple[str, Any]] | None) -> bool:
    """Whether gRPC ``metadata`` holds a W3C ``traceparent`` (the one key
    :func:`context_from_metadata` can find a parent in)."""
    return any(k.lower() == "traceparent" for k, _ in metadata or ())


def context_from_metadata(metadata: Sequence[tuple[str, Any]] | None) -> otel_context.Context:
    carrier = {k.lower(): v for k, v in (metadata or ()) if isinstance(v, str)}
    return _PROPAGATOR.extract(carrier)


def set_attributes(**attributes: Any) -> None:
    """Annotate the current span (no-op when it does not record)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
