"""The call pipeline (broker/api/pipeline.py) on a real gRPC server: every service,
registered through the generated code, gets the layers in order, on both of gRPC's
lookup paths; the standby gate decides per call, so leadership changes apply at once."""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from broker.api.pipeline import LayeredServer
from broker.leadership import StandbyGate
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import jobs_pb2_grpc


class Recording:
    """A layer that records the methods it wrapped and the calls that went through it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log
        self.wrapped: list[str] = []

    def wrap(self, handler: Any, method: str) -> Any:
        self.wrapped.append(method)
        if handler.request_streaming or handler.response_streaming:
            return handler
        inner, name, log = handler.unary_unary, self.name, self.log

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            log.append(f"{name}:{method.rsplit('/', 1)[-1]}")
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


class Jobs(jobs_pb2_grpc.JobServiceServicer):
    def GetJob(self, request: jpb.GetJobRequest, context: grpc.ServicerContext) -> Any:
        from computebroker.v1 import common_pb2 as pb

        return pb.Job(id=request.job_id)


class Leader:
    is_leader = True

    @staticmethod
    def standby_message() -> str:
        return "this broker is a standby; the leader is at leader:1"


@pytest.fixture
def served():
    log: list[str] = []
    outer, inner = Recording("outer", log), Recording("inner", log)
    leader = Leader()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    layered = LayeredServer(server, [outer, inner, StandbyGate(leader)])  # type: ignore[arg-type]
    jobs_pb2_grpc.add_JobServiceServicer_to_server(Jobs(), layered)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), layered)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield channel, log, outer, inner, leader, layered
    channel.close()
    server.stop(0)


def test_every_method_is_wrapped_once_and_layers_run_outermost_first(served) -> None:
    channel, log, outer, inner, _leader, layered = served
    stub = jobs_pb2_grpc.JobServiceStub(channel)
    for _ in range(3):
        assert stub.GetJob(jpb.GetJobRequest(job_id="j-1")).id == "j-1"
    assert log == ["outer:GetJob", "inner:GetJob"] * 3
    # wrapped at registration, once per method (the generic and the registered path share it)
    assert outer.wrapped.count("/computebroker.v1.JobService/GetJob") == 1
    assert inner.wrapped.count("/computebroker.v1.JobService/GetJob") == 1
    assert "/grpc.health.v1.Health/Check" in outer.wrapped  # services we do not generate too
    assert "/computebroker.v1.JobService/SubmitJob" in layered.methods


def test_health_goes_through_the_layers(served) -> None:
    channel, log, *_ = served
    out = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert out.status == health_pb2.HealthCheckResponse.SERVING
    assert log == ["outer:Check", "inner:Check"]


def test_standby_gate_reads_leadership_on_every_call(served) -> None:
    channel, _log, _o, _i, leader, _l = served
    stub = jobs_pb2_grpc.JobServiceStub(channel)
    assert stub.GetJob(jpb.GetJobRequest(job_id="j-1")).id == "j-1"
    leader.is_leader = False  # demoted: the very next call is refused, naming the leader
    with pytest.raises(grpc.RpcError) as e:
        stub.GetJob(jpb.GetJobRequest(job_id="j-1"))
    assert e.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "leader:1" in e.value.details()
    # the health probe is not gated: a standby answers it
    assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()).status == \
        health_pb2.HealthCheckResponse.SERVING
    leader.is_leader = True  # promoted: served again at once
    assert stub.GetJob(jpb.GetJobRequest(job_id="j-2")).id == "j-2"


def test_a_handler_the_pipeline_cannot_see_into_is_refused_at_registration() -> None:
    class Opaque(grpc.GenericRpcHandler):
        def service(self, handler_call_details: Any) -> Any:
            return None

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    with pytest.raises(TypeError, match="generated add_"):
        LayeredServer(server, []).add_generic_rpc_handlers((Opaque(),))
    server.stop(0)
