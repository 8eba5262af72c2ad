"""BrokerTelemetry: one broker server's metrics (own MeterProvider, Prometheus endpoint)
and the span hooks of its job operations (job, launch, stop, schedule pass).

One class on purpose: the span hooks and the metric instruments share one set of
job/attempt attributes and one start/close lifecycle per broker server. The process-wide tracing setup and propagation are in ``tracing.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from broker.jobs.causes import Family, MoveState
from broker.telemetry.series import UsageSeries
from broker.telemetry.tracing import (
    TRACEPARENT_ENV,
    TRACER_NAME,
    carries_traceparent,
    context_from_metadata,
    context_from_traceparent,
    set_attributes,
    traceparent_of_current,
    tracer,
    tracing_on,
)

if TYPE_CHECKING:
    import placement
    from computebroker.v1 import agent_pb2 as apb
    from computebroker.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

# Instrument names (OpenTelemetry) -> Prometheus names (the exporter adds unit/_total):
METRIC_NAMES = {
    "queue_wait": "computebroker_queue_wait_seconds",
    "placement": "computebroker_placement_seconds",
    "admissions": "computebroker_admissions_total",
    "preemptions": "computebroker_preemptions_total",
    "migrations": "computebroker_migrations_total",
    "stops": "computebroker_stops_total",
    "launch_refusals": "computebroker_launch_refusals_total",
    "migration_duration": "computebroker_migration_seconds",
    "transfer_rate": "computebroker_checkpoint_transfer_rate_bytes_per_second",
    "transfer_bytes": "computebroker_checkpoint_transfer_bytes_total",
    "gpus_allocated": "computebroker_gpus_allocated",
    "gpus_total": "computebroker_gpus_total",
    "jobs_pending": "computebroker_jobs_pending",
    "jobs_running": "computebroker_jobs_running",
    "agents_connected": "computebroker_agents_connected",
}
_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
                    300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
_RATE_BUCKETS = tuple(float(2 ** i) * 1e6 for i in range(0, 14))  # 1 MB/s .. 8 GB/s


def _corrupt_callback(_options: Any) -> list[Any]:
    """Skipped store records (broker/store/base.py CORRUPT): an operator alert, since a
    damaged record is otherwise only a WARNING line (issue 12)."""
    from opentelemetry.metrics import Observation

    from broker.store.base import CORRUPT

    return [Observation(n, {"kind": kind}) for kind, n in list(CORRUPT.items())]


def _split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics_listen {listen!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Pass:
    """Counts of one scheduler pass (attributes of its ``schedule_pass`` span)."""

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.admitted = 0
        self.preempted = 0


class BrokerTelemetry:
    """The broker's hooks: spans for job operations, and metrics once started.

    ``BrokerServer`` makes one (``JobOps.telemetry``) and calls
    :meth:`start_metrics` with ``BrokerConfig.metrics_listen`` and :meth:`close`.
    """

    def __init__(self) -> None:
        self.metrics_on = False
        self.metrics_port = 0
        self._provider: Any = None
        self._http: Any = None
        self._lock = threading.Lock()
        self._gauges: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self._seen_moves: dict[tuple[str, int], str] = {}  # (job, seq) -> last state recorded
        self._pass: _Pass | None = None
        self._inst: dict[str, Any] = {}
        # Usage over time for the console and `brokerctl usage` (series.py): fed by the
        # scheduler pass, served by GetUsageSeries; outlives a leader's scheduler loop.
        self.series = UsageSeries()

    # ---- metrics plumbing ----------------------------------------------------------
    def start_metrics(self, listen: str, tls: tuple[str, str] | None = None, *,
                      scheduler: bool = True, extra: Callable[[Any], None] | None = None) -> int:
        """Serve Prometheus text on ``listen`` ("host:port"; port 0 = free); "" = off.
        ``tls`` = (cert file, key file): HTTPS (the broker's own certificate).
        ``scheduler=False`` (an API front-end): no ``agents_connected`` 0 before the first
        pass, which a process that never schedules would report for ever. ``extra``:
        called with the meter to add a role's own instruments."""
        if not listen:
            return 0
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from prometheus_client import CollectorRegistry, start_http_server

        host, port = _split_listen(listen)
        registry = CollectorRegistry(auto_describe=True)
        readers: list[Any] = [PrometheusMetricReader(disable_target_info=True, registry=registry)]
        otlp = self._otlp_metric_reader()
        if otlp is not None:
            readers.append(otlp)
        self._provider = MeterProvider(
            metric_readers=readers,
            resource=Resource.create({"service.name": "compute-broker"}))
        meter = self._provider.get_meter(TRACER_NAME)
        self._build_instruments(meter)
        if extra is not None:
            extra(meter)
        if scheduler:
            with self._lock:  # a scrape before the first scheduler pass: no agent yet, not "no series"
                self._gauges.setdefault("agents_connected", {(): 0})
        certfile, keyfile = tls if tls else (None, None)
        server, _thread = start_http_server(port, addr=host, registry=registry,
                                            certfile=certfile, keyfile=keyfile)
        self._http = server
        self.metrics_port = int(server.server_port)
        self.metrics_on = True
        log.info("metrics on %s://%s:%d/metrics", "https" if tls else "http", host,
                 self.metrics_port)
        return self.metrics_port

    @staticmethod
    def _otlp_metric_reader() -> Any | None:
        if not any(os.environ.get(k) for k in ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                                               "OTEL_EXPORTER_OTLP_ENDPOINT")):
            return None
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        except ImportError:
            return None
        return PeriodicExportingMetricReader(OTLPMetricExporter())

    def _build_instruments(self, meter: Any) -> None:
        i = self._inst
        i["queue_wait"] = meter.create_histogram(
            "computebroker.queue_wait", unit="s", explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
            description="time a job waited in the queue before a launch (per attempt)")
        i["placement"] = meter.create_histogram(
            "computebroker.placement", unit="s", explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
            description="latency of one placement computation (placement.schedule)")
        i["admissions"] = meter.create_counter(
            "computebroker.admissions", description="attempts launched, by region and cause")
        i["preemptions"] = meter.create_counter(
            "computebroker.preemptions", description="running jobs preempted, by region and reason")
        i["migrations"] = meter.create_counter(
            "computebroker.migrations",
            description="jobs relaunched on new capacity after a move, by cause and regions")
        i["stops"] = meter.create_counter(
            "computebroker.stops", description="Stop commands sent, by reason and region")
        i["launch_refusals"] = meter.create_counter(
            "computebroker.launch_refusals",
            description="Launches an agent refused, by region and outcome (requeued | gave_up)")
        i["migration_duration"] = meter.create_histogram(
            "computebroker.migration", unit="s", explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
            description="a finished move: stop requested -> first step after the resume")
        i["transfer_rate"] = meter.create_histogram(
            "computebroker.checkpoint.transfer_rate", unit="By/s",
            explicit_bucket_boundaries_advisory=_RATE_BUCKETS,
            description="checkpoint copy throughput between region stores")
        i["transfer_bytes"] = meter.create_counter(
            "computebroker.checkpoint.transfer", unit="By",
            description="checkpoint bytes copied between region stores")
        for key, name, desc in (
            ("gpus_allocated", "computebroker.gpus.allocated", "GPUs held by jobs, per team and region"),
            ("gpus_total", "computebroker.gpus.total", "GPUs of connected, healthy nodes per region"),
            ("jobs_pending", "computebroker.jobs.pending", "jobs waiting for capacity, per team"),
            ("jobs_running", "computebroker.jobs.running", "jobs holding capacity, per team and region"),
            ("agents_connected", "computebroker.agents.connected", "connected region agents"),
        ):
            meter.create_observable_gauge(name, callbacks=[self._gauge_callback(key)],
                                          description=desc)

        meter.create_observable_counter(
            "computebroker.store.corrupt_records", callbacks=[_corrupt_callback],
            description="stored records that did not decode or validate and were skipped, by kind")

    def _gauge_callback(self, key: str) -> Any:
        from opentelemetry.metrics import Observation

        def cb(_options: Any) -> list[Any]:
            with self._lock:
                values = dict(self._gauges.get(key, {}))
            return [Observation(v, dict(attrs)) for attrs, v in values.items()]

        return cb

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
        self.metrics_on = False

    def _add(self, key: str, value: float, **attrs: str) -> None:
        if self.metrics_on:
            self._inst[key].add(value, attrs)

    def _record(self, key: str, value: float, **attrs: str) -> None:
        if self.metrics_on:
            self._inst[key].record(value, attrs)

    # ---- job spans (hooks in JobOps / JobService) -------------------------------
    @contextlib.contextmanager
    def job_span(self, invocation_metadata: Sequence[tuple[str, Any]] | None) -> Iterator[None]:
        """SubmitJob: the ``job`` span, a child of the caller's (from gRPC metadata).
        Inside it, :meth:`stamp_job` records its traceparent on the new job.

        Why the metadata is scanned first: with tracing off and no ``traceparent``
        from the caller (nearly every submit) there is no span to open, and building
        the propagator's carrier and extracting an empty context was ~10 us of a
        submit's own CPU under 16 concurrent callers (benchmarks/bench_submit_stages.py)."""
        if not tracing_on() and not carries_traceparent(invocation_metadata):
            yield
            return
        parent = context_from_metadata(invocation_metadata)
        if not tracing_on() and not trace.get_current_span(parent).get_span_context().is_valid:
            yield
            return
        with tracer().start_as_current_span("job", context=parent, kind=trace.SpanKind.SERVER):
            yield

    @staticmethod
    def stamp_job(job: pb.Job) -> None:
        """Store the current span's traceparent on a job being created (durably)."""
        tp = traceparent_of_current()
        if tp:
            job.trace_parent = tp
            set_attributes(**{"cb.job.id": job.id, "cb.team": job.spec.team,
                              "cb.job.name": job.spec.name,
                              "cb.priority_class": job.spec.priority_class,
                              "cb.gpus": job.spec.resources.nodes * job.spec.resources.gpus_per_node})

    def launched(self, job: pb.Job, launch: apb.Launch) -> None:
        """Launch about to be sent: a ``launch`` span under the job's trace (linked to the
        scheduler pass) and ``TRACEPARENT`` in the Launch env for the trainer."""
        if not job.trace_parent and not tracing_on():
            return
        current = trace.get_current_span().get_span_context()
        links = [trace.Link(current)] if current.is_valid else None
        attrs = {"cb.job.id": job.id, "cb.attempt": job.attempt, "cb.region": job.placement.region,
                 "cb.agent": job.placement.agent_id, "cb.world_size": job.placement.world_size,
                 "cb.checkpoint_uri": launch.checkpoint_uri, "cb.resume_from": launch.resume_from,
                 "cb.requeue_cause": job.requeue_cause or "first"}
        with tracer().start_as_current_span(
                "launch", context=context_from_traceparent(job.trace_parent) or otel_context.Context(),
                kind=trace.SpanKind.PRODUCER, links=links, attributes=attrs):
            tp = traceparent_of_current() or job.trace_parent
            if tp:
                launch.env[TRACEPARENT_ENV] = tp

    def stop_sent(self, job: pb.Job, why: str, *, checkpoint_first: bool, grace_s: float) -> None:
        """A Stop for ``why`` (preempt | migrate | drain | cancel): a span and a count."""
        self._add("stops", 1, reason=why or "unspecified", region=job.placement.region)
        if not job.trace_parent and not tracing_on():
            return
        attrs = {"cb.job.id": job.id, "cb.attempt": job.attempt, "cb.region": job.placement.region,
                 "cb.stop.reason": why, "cb.stop.checkpoint_first": checkpoint_first,
                 "cb.stop.grace_s": grace_s}
        parent = context_from_traceparent(job.trace_parent) or otel_context.Context()
        span = tracer().start_span(why or "stop", context=parent, kind=trace.SpanKind.PRODUCER,
                                   attributes=attrs)
        span.end()

    def launch_refused(self, region: str, *, gave_up: bool) -> None:
        """An agent refused a Launch (broker/jobs/backoff.py): a steady rate means a region
        misconfigured for the jobs sent to it."""
        self._add("launch_refusals", 1, region=region or "unknown",
                  outcome="gave_up" if gave_up else "requeued")

    # ---- scheduler pass (hooks in SchedulerLoop) ------------------------------------
    @contextlib.contextmanager
    def schedule_pass(self, snapshot: placement.Snapshot) -> Iterator[_Pass]:
        """One placement pass: the ``schedule_pass`` span; counts set on exit."""
        with tracer().start_as_current_span("schedule_pass", context=otel_context.Context()) as span:
            rec = _Pass(span)
            self._pass = rec
            try:
                yield rec
            finally:
                self._pass = None
                if span.is_recording():
                    span.set_attributes({"cb.pending": len(snapshot.pending),
                                         "cb.running": len(snapshot.running),
                                         "cb.nodes": len(snapshot.nodes),
                                         "cb.admitted": rec.admitted,
                                         "cb.preempted": rec.preempted})

    def placed(self, seconds: float) -> None:
        self._record("placement", seconds)

    def admitted(self, job: pb.Job | None, admission: placement.Admission, now: float) -> None:
        """A launch went out for ``job`` (as it was while queued)."""
        if self._pass is not None:
            self._pass.admitted += 1
        if job is None:
            return
        cause = job.requeue_cause or "first"
        self._add("admissions", 1, region=admission.region, cause=cause)
        since = job.phase_time or job.created_time
        if since:
            self._record("queue_wait", max(0.0, now - since), team=job.spec.team, cause=cause)
        if job.migrations and cause != Family.PREEMPTION:
            m = job.migrations[-1]
            if m.state in (MoveState.QUEUED, MoveState.CHECKPOINTING):
                self._add("migrations", 1, cause=m.cause or "unspecified",
                          from_region=m.from_region, to_region=admission.region)

    def preempted(self, victim: pb.Job, reason: str) -> None:
        if self._pass is not None:
            self._pass.preempted += 1
        self._add("preemptions", 1, region=victim.placement.region, reason=reason or "unspecified")

    def observe(self, snapshot: placement.Snapshot, live: list[pb.Job], agents: list[Any]) -> None:
        """After each pass: gauges from the snapshot, and finished moves from the jobs."""
        if not self.metrics_on:
            return
        region_of = {n.id: n.region for n in snapshot.nodes}
        total: dict[tuple[tuple[str, str], ...], float] = {}
        for n in snapshot.nodes:
            if n.healthy:
                key = (("region", n.region),)
                total[key] = total.get(key, 0) + n.gpus
        alloc: dict[tuple[tuple[str, str], ...], float] = {}
        running: dict[tuple[tuple[str, str], ...], float] = {}
        for r in snapshot.running:
            regions = {region_of.get(node, "") for node, _ in r.allocations}
            for node, gpus in r.allocations:
                key = (("region", region_of.get(node, "")), ("team", r.team))
                alloc[key] = alloc.get(key, 0) + gpus
            for region in regions:
                key = (("region", region), ("team", r.team))
                running[key] = running.get(key, 0) + 1
        pending: dict[tuple[tuple[str, str], ...], float] = {}
        for p in snapshot.pending:
            key = (("team", p.team),)
            pending[key] = pending.get(key, 0) + 1
        connected = sum(1 for a in agents if getattr(a, "connected", False))
        with self._lock:
            self._gauges = {"gpus_total": total, "gpus_allocated": alloc, "jobs_running": running,
                            "jobs_pending": pending, "agents_connected": {(): connected}}
        self._observe_moves(live)

    def _observe_moves(self, live: list[pb.Job]) -> None:
        """Transfers and moves finish inside agent updates; the pass reads their records
        off the jobs (each record once), which needs no hook on the update path."""
        for job in live:
            for m in job.migrations[-2:]:
                key = (job.id, m.seq)
                seen = self._seen_moves.get(key, "")
                t = m.transfer
                if t.done and not t.error and "t" not in seen:
                    if t.seconds > 0 and t.bytes_total:
                        self._record("transfer_rate", t.bytes_total / t.seconds,
                                     method=t.method or "unknown", to_region=m.to_region)
                    self._add("transfer_bytes", t.bytes_total, method=t.method or "unknown",
                              to_region=m.to_region)
                    seen += "t"
                if m.state == MoveState.DONE and m.total_s and "d" not in seen:
                    self._record("migration_duration", m.total_s, cause=m.cause or "unspecified")
                    seen += "d"
                if seen:
                    self._seen_moves[key] = seen
        if len(self._seen_moves) > 50_000:
            live_ids = {j.id for j in live}
            self._seen_moves = {k: v for k, v in self._seen_moves.items() if k[0] in live_ids}
