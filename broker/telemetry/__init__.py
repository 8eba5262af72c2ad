"""OpenTelemetry for the broker and its SDK: one trace per job, and broker metrics.

Why this shape:

* **Off means free.** Nothing is configured unless asked for (``CB_TRACE_FILE``,
  ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``BrokerConfig.metrics_listen``). With no tracer
  provider the OpenTelemetry API hands out non-recording spans, and every hook here
  returns early when there is neither a provider nor a trace context to carry.
* **One trace per job across processes.** The SDK injects W3C ``traceparent`` into the
  SubmitJob gRPC metadata; the broker makes a ``job`` span under it and stores that
  span's traceparent on the job (``Job.trace_parent``, durable: a relaunch a day later
  after a broker restart still joins the same trace). Launch, stop and migration spans
  are children of it, and the Launch carries ``TRACEPARENT`` in its env so the
  trainer's spans (``trainer/telemetry.py``) hang under the launch that started them.
  Even a broker without a tracer provider forwards the caller's context unchanged.
* **Metrics are per broker server** (own MeterProvider and Prometheus registry), so
  tests can run several brokers in one process; traces use the process-wide provider
  that :func:`setup_tracing` installs once.
* Only the OpenTelemetry *API* is imported at module load (the broker starts light;
  ``brokersdk`` has its own small tracing helper); the OTel SDK and exporters load when
  enabled.

Modules: ``tracing.py`` (the process-wide provider, exporters, propagation) and
``metrics.py`` (``BrokerTelemetry``: per-server metrics and the job span hooks); their
public names are re-exported here.
"""

from broker.telemetry.metrics import METRIC_NAMES, BrokerTelemetry
from broker.telemetry.tracing import (
    OTLP_ENV,
    TRACE_FILE_ENV,
    TRACEPARENT_ENV,
    TRACER_NAME,
    context_from_traceparent,
    flush_tracing,
    set_attributes,
    setup_tracing,
    span_record,
    traceparent_of_current,
    tracer,
    tracing_on,
)

__all__ = [
    "METRIC_NAMES",
    "OTLP_ENV",
    "TRACEPARENT_ENV",
    "TRACER_NAME",
    "TRACE_FILE_ENV",
    "BrokerTelemetry",
    "context_from_traceparent",
    "flush_tracing",
    "set_attributes",
    "setup_tracing",
    "span_record",
    "traceparent_of_current",
    "tracer",
    "tracing_on",
]
