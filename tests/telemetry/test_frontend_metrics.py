"""An API front-end's Prometheus endpoint (broker/api/frontend_metrics.py), scraped over
HTTPS like Prometheus would, with a real leader and a real front-end (gRPC over TLS, in
this process) on their own real redis-server.

What is counted is made to happen for real: submits (a new job and a retried request
id), calls sent on to the leader (counted by the leader's answer), the store bus dropped
by the server (a re-subscription), and the store gone (calls refused, the bus gauge at 0). The scheduler's gauges are not reported by a
process that never schedules.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from broker.api.frontend import FrontendServer
from broker.api.frontend_metrics import METRIC_NAMES
from broker.store.redis import RedisStore
from brokersdk.credentials import make_channel
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import capacity_pb2_grpc, jobs_pb2_grpc
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, fast_config, spec, wait_until
from tests.fixtures.pki import session_pki
from tests.fixtures.redis_server import start_redis, stop_redis
from tests.telemetry.test_metrics import sample


def scrape(port: int) -> str:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=session_pki().ca_file)  # the front-end's TLS cert
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10,
                                context=ctx) as resp:
        assert resp.status == 200
        return resp.read().decode()


def test_frontend_metrics_count_submits_refusals_and_bus_reconnects(tmp_path: Path) -> None:
    own = start_redis(tmp_path)  # its own server: the test drops its subscribers and stops it
    url = f"{own.url}?prefix=fm{uuid.uuid4().hex[:8]}"
    shared = dict(store=url, workdir_store=str(tmp_path / "workdirs"))
    leader = Broker(fast_config(tmp_path / "leader", broker_id="m-leader", **shared))
    fe = FrontendServer(fast_config(tmp_path / "fe", frontend=True, frontend_id=7, broker_id="m-fe",
                                    agent_listen="", metrics_listen="127.0.0.1:0", **shared))
    channels: list[grpc.Channel] = []
    stopped: list[Broker] = []
    try:
        fe.start()
        assert fe.metrics_port > 0
        leader.team(gpus=8)
        ch = make_channel(f"127.0.0.1:{fe.port}", session_pki().operator())
        channels.append(ch)
        stub = jobs_pb2_grpc.JobServiceStub(ch)

        text = scrape(fe.metrics_port)
        assert sample(text, METRIC_NAMES["bus_connected"]) == 1
        assert sample(text, METRIC_NAMES["submits"], outcome="created") == 0
        assert sample(text, "computebroker_agents_connected") is None  # never schedules

        req = jpb.SubmitJobRequest(spec=spec("counted"), client_request_id="counted-once")
        assert stub.SubmitJob(req, timeout=30).created
        assert not stub.SubmitJob(req, timeout=30).created  # the retry: the first job
        # A call for the leader, sent on as the caller: the leader's answer comes back.
        with pytest.raises(grpc.RpcError) as cancel:
            stub.CancelJob(jpb.CancelJobRequest(job_id="j-none"), timeout=10)
        assert cancel.value.code() is grpc.StatusCode.NOT_FOUND, cancel.value.details()
        quota = capacity_pb2_grpc.CapacityServiceStub(ch).GetTeamQuota(
            cpb.GetTeamQuotaRequest(team="ml"), timeout=10)
        assert quota.quotas[0].guaranteed_gpus == 8

        # The server drops every subscriber (as a restart or a failover does): the bus
        # subscribes again, and says so.
        admin = RedisStore(own.url)
        try:
            admin._r.client_kill_filter(_type="pubsub")
        finally:
            admin.close()
        wait_until(lambda: fe.bus.listener.reconnects >= 1 and fe.bus.connected, timeout=20,
                   what="the front-end's bus subscribed again")
        text = scrape(fe.metrics_port)
        assert sample(text, METRIC_NAMES["submits"], outcome="created") == 1
        assert sample(text, METRIC_NAMES["submits"], outcome="existing") == 1
        assert sample(text, METRIC_NAMES["proxied"], code="NOT_FOUND") == 1
        assert sample(text, METRIC_NAMES["proxied"], code="OK") == 1
        assert sample(text, METRIC_NAMES["refusals"], reason="leader_unknown") == 0
        assert sample(text, METRIC_NAMES["bus_reconnects"], topic="changed") >= 1

        # The store is gone: the bus is down and calls are refused, counted as such.
        leader.stop()  # first: a broker stopping with no store waits out its retries
        stopped.append(leader)
        stop_redis(own)
        wait_until(lambda: not fe.bus.connected, timeout=20, what="the bus notices the store is gone")
        with pytest.raises(grpc.RpcError) as down:
            stub.GetJob(jpb.GetJobRequest(job_id="j-none"), timeout=10)
        assert down.value.code() is grpc.StatusCode.UNAVAILABLE
        text = scrape(fe.metrics_port)
        assert sample(text, METRIC_NAMES["bus_connected"]) == 0
        assert sample(text, METRIC_NAMES["refusals"], reason="store_unreachable") >= 1
    finally:
        for c in channels:
            c.close()
        fe.stop(0.5)
        if not stopped:
            leader.stop()
        if own.proc.poll() is None:
            stop_redis(own)
