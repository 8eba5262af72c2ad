"""Broker metrics on a real Prometheus endpoint, and trace context through a real broker.

A real broker (gRPC on 127.0.0.1:0, SQLite) with ``metrics_listen`` on a free port and a
scripted agent on the real AgentService stream (tests/broker/harness.py); the endpoint
is scraped over HTTP like Prometheus would. No tracer provider is installed in this
process: the broker must still carry a caller's trace context to the Launch.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.telemetry import METRIC_NAMES
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until


@pytest.fixture
def mbroker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(fast_config(tmp_path, metrics_listen="127.0.0.1:0"))
    yield b
    b.stop()


def scrape(broker: Broker) -> str:
    import ssl

    url = f"https://127.0.0.1:{broker.server.metrics_port}/metrics"  # the broker's TLS cert
    ctx = ssl.create_default_context(cafile=broker.pki.ca_file)
    with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
        assert resp.status == 200
        return resp.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """Value of the first sample of ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    return None


def test_prometheus_endpoint_serves_broker_metrics(mbroker: Broker) -> None:
    assert mbroker.server.metrics_port > 0
    mbroker.team("ml", gpus=8)
    agent = FakeAgent(mbroker.address, "use2-a", "us-east-2", nodes_for("us-east-2", "use2-a", 1, 8))
    agent.connect()
    try:
        low = mbroker.submit(spec("low", gpus=8, priority_class="fine-tuning"))
        launch = agent.wait_launch(low.id)
        agent.update(low.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=1)
        mbroker.wait_phase(low.id, pb.JOB_PHASE_RUNNING)
        # A higher-priority job for the same 8 GPUs: the scheduler preempts the low one.
        high = mbroker.submit(spec("high", gpus=8, priority_class="inference"))
        stop = agent.wait_stop(low.id, apb.STOP_REASON_PREEMPT)
        assert stop.checkpoint_first

        def scraped() -> str | None:
            text = scrape(mbroker)
            ok = (sample(text, "computebroker_preemptions_total", region="us-east-2")
                  and sample(text, "computebroker_jobs_pending", team="ml"))
            return text if ok else None

        text = wait_until(scraped, 20, "preemption and pending job in the scrape")
    finally:
        agent.close()

    for name in ("queue_wait", "placement"):
        base = METRIC_NAMES[name]
        assert f"# TYPE {base} histogram" in text, base
        assert (sample(text, f"{base}_count") or 0) >= 1, base
    assert sample(text, "computebroker_queue_wait_seconds_count", team="ml", cause="first") >= 1
    assert sample(text, "computebroker_admissions_total", region="us-east-2", cause="first") == 1
    assert sample(text, "computebroker_stops_total", reason="preempt", region="us-east-2") == 1
    assert sample(text, "computebroker_gpus_total", region="us-east-2") == 8
    assert sample(text, "computebroker_gpus_allocated", region="us-east-2", team="ml") == 8
    assert sample(text, "computebroker_jobs_running", region="us-east-2", team="ml") == 1
    assert sample(text, "computebroker_agents_connected") == 1
    assert high.id != low.id


def test_metrics_listen_off_by_default_and_validated(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path))
    try:
        assert b.server.metrics_port == 0
        assert not b.ops.telemetry.metrics_on
    finally:
        b.stop()
    with pytest.raises(ValueError, match="metrics_listen"):
        BrokerConfig(metrics_listen="9464")


def test_callers_trace_context_reaches_the_job_and_the_launch(mbroker: Broker) -> None:
    """SDK metadata -> Job.trace_parent -> Launch.env[TRACEPARENT], same trace id, even
    with no tracer provider in the broker (it forwards the context as is)."""
    mbroker.team("ml", gpus=8)
    agent = FakeAgent(mbroker.address, "use2-a", "us-east-2", nodes_for("us-east-2", "use2-a", 1, 8))
    agent.connect()
    try:
        trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        tp = f"00-{trace_id}-{span_id}-01"
        traced = mbroker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("traced", gpus=2)),
                                        metadata=[("traceparent", tp)]).job
        plain = mbroker.submit(spec("plain", gpus=2))
        assert traced.trace_parent.split("-")[1] == trace_id
        assert mbroker.get(traced.id).trace_parent == traced.trace_parent  # stored durably
        assert plain.trace_parent == ""  # nothing traces: nothing stored, nothing sent
        launch = agent.wait_launch(traced.id)
        assert launch.env["TRACEPARENT"].split("-")[1] == trace_id
        assert "TRACEPARENT" not in agent.wait_launch(plain.id).env
    finally:
        agent.close()


def test_job_span_opens_nothing_without_a_callers_trace() -> None:
    """With no tracer provider, a submit whose metadata holds no ``traceparent`` skips
    the span and the job gets no trace parent (the cheap path every untraced submit
    takes); one that holds it still gets the caller's trace. Upper-case keys count too
    (gRPC lower-cases them on the wire; an in-process caller may not)."""
    from opentelemetry import trace

    from broker.telemetry import BrokerTelemetry
    from broker.telemetry.tracing import carries_traceparent, tracing_on

    assert not tracing_on(), "this module's premise: no tracer provider in the process"
    tel = BrokerTelemetry()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    tp = f"00-{trace_id}-00f067aa0ba902b7-01"
    assert not carries_traceparent([("authorization", "Bearer x"), ("x-other", "1")])
    assert not carries_traceparent(None)
    assert carries_traceparent([("Traceparent", tp)])
    with tel.job_span([("authorization", "Bearer x")]):
        assert not trace.get_current_span().get_span_context().is_valid
        job = pb.Job(id="j-1")
        tel.stamp_job(job)
        assert job.trace_parent == ""
    with tel.job_span([("authorization", "Bearer x"), ("traceparent", tp)]):
        job = pb.Job(id="j-2")
        tel.stamp_job(job)
        assert job.trace_parent.split("-")[1] == trace_id
