"""Trainer spans under the job's trace: ``train_attempt``, ``checkpoint_save``, ``checkpoint_load``.

The agent starts each rank with ``TRACEPARENT`` (the broker's ``launch`` span, carried in
``Launch.env``); when it is set *and* an exporter is configured (``CB_TRACE_FILE`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``), every rank records its attempt as a child of that span,
and checkpoint saves/loads as children of the attempt. Otherwise nothing here runs:
the hooks return at the first check.

Why a copy of the broker's small exporter instead of importing it: the trainer must
not import broker code (docs/contracts.md: it knows nothing of the agent or broker);
the contract between them is only the ``TRACEPARENT`` variable and the JSONL format.
Why explicit parents and start times: DCP's async save finishes on another thread, where
the attempt span is not the current context, and a save's start is only known there
as a ``perf_counter`` value.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

TRACEPARENT_ENV = "TRACEPARENT"
TRACE_FILE_ENV = "CB_TRACE_FILE"
OTLP_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")

_provider: Any = None
_parent: Any = None  # context of the train_attempt span: the parent of checkpoint spans
_rank = 0


def _span_record(span: Any, service: str) -> dict[str, Any]:
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "service": service,
        "kind": "internal",
        "attributes": dict(span.attributes or {}),
        "links": [],
        "status": span.status.status_code.name.lower(),
        "start": (span.start_time or 0) / 1e9,
        "end": (span.end_time or 0) / 1e9,
    }


def _setup(service: str) -> Any:
    """A private TracerProvider (not the global one: the trainer is a leaf process)."""
    path = os.environ.get(TRACE_FILE_ENV, "")
    endpoint = next((os.environ[k] for k in OTLP_ENV if os.environ.get(k)), "")
    if not path and not endpoint:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class JsonlSpanExporter(SpanExporter):
        """One JSON line per span, one O_APPEND write per batch (shared file is safe)."""

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            data = "".join(json.dumps(_span_record(s, service), default=str) + "\n"
                           for s in spans).encode()
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
            except OSError:
                return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    wired = False
    if path:
        provider.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter()))
        wired = True
    if endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            wired = True
        except ImportError:
            pass
    return provider if wired else None


def traced_attempt(train: Callable[..., int], *args: Any) -> int:
    """Run ``train(*args)`` (spec, env, flags) inside a ``train_attempt`` span, then flush:
    the trainer ends with ``os._exit``, which would drop buffered spans."""
    global _provider, _parent, _rank
    traceparent = os.environ.get(TRACEPARENT_ENV, "")
    if not traceparent:
        return train(*args)
    _provider = _setup("trainer")
    if _provider is None:
        return train(*args)
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    spec, env = args[0], args[1]
    _rank = int(os.environ.get("RANK", "0") or 0)
    attrs = {"cb.job.id": env.job_id, "cb.attempt": env.attempt, "cb.rank": _rank,
             "cb.world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
             "cb.total_steps": spec.total_steps, "cb.model": spec.model,
             "cb.resume_from": env.resume_from or ""}
    tracer = _provider.get_tracer("computebroker.trainer")
    try:
        with tracer.start_as_current_span("train_attempt", context=parent, attributes=attrs) as span:
            _parent = trace.set_span_in_context(span)
            try:
                code = train(*args)
            except SystemExit as exc:  # the library ends a run with RunExit(code)
                code = exc.code if isinstance(exc.code, int) else 1
            span.set_attribute("cb.exit_code", code)
            return code
    finally:
        _parent = None
        _provider.force_flush()


def record_span(name: str, t0_perf: float, **attributes: Any) -> None:
    """A finished span that began at ``t0_perf`` (a ``time.perf_counter()`` value) and
    ends now, under the current attempt; no-op when the attempt is not traced."""
    if _provider is None or _parent is None:
        return
    start_ns = time.time_ns() - int((time.perf_counter() - t0_perf) * 1e9)
    attributes.setdefault("cb.rank", _rank)
    span = _provider.get_tracer("computebroker.trainer").start_span(
        name, context=_parent, start_time=start_ns,
        attributes={k: v for k, v in attributes.items() if v is not None})
    span.end()


def checkpoint_loaded(t0_perf: float, manifest: dict[str, Any], uri: str) -> None:
    """``checkpoint_load`` span: step, bytes (from the manifest's file list), source."""
    if _provider is None:
        return
    nbytes = sum(int(f.get("size", 0)) for f in manifest.get("files", []))
    record_span("checkpoint_load", t0_perf, step=int(manifest.get("step", 0)), bytes=nbytes,
                uri=uri, saved_world_size=int(manifest.get("world_size", 0)))
