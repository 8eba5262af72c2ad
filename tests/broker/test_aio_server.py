"""The API workers' grpc.aio server host (broker/api/aio_server.py) over a real gRPC
server: synchronous handlers on the pool keep the synchronous server's context
behaviour (abort, trailing metadata, is_active, end callbacks, generator clean-up),
and a slow handler on the pool never delays a handler on the loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from broker.api.aio_server import LoopServer
from broker.api.errors import RETRY_PUSHBACK_KEY, Unavailable, rpc

SERVICE = "test.Probe"


def _ident(b: bytes) -> bytes:
    return b


class _Probe:
    def __init__(self) -> None:
        self.stream_ended = threading.Event()
        self.callback_fired = threading.Event()
        self.saw_inactive = threading.Event()

    def abort(self, request: bytes, context: Any) -> bytes:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no: " + request.decode())
        raise AssertionError("abort returned")

    @rpc
    def unavailable(self, request: bytes, context: Any) -> bytes:
        raise Unavailable("the store is down")

    def slow(self, request: bytes, context: Any) -> bytes:
        time.sleep(1.0)
        return b"slow"

    def watch(self, request: bytes, context: Any) -> Iterator[bytes]:
        context.add_callback(self.callback_fired.set)
        try:
            while context.is_active():
                yield b"tick"
                time.sleep(0.05)
            self.saw_inactive.set()
        finally:
            self.stream_ended.set()


async def _fast(request: bytes, context: Any) -> bytes:
    return b"fast"


@pytest.fixture
def served() -> Iterator[tuple[grpc.Channel, _Probe]]:
    pool = futures.ThreadPoolExecutor(max_workers=4)
    server = LoopServer([], pool)
    probe = _Probe()
    h = grpc.unary_unary_rpc_method_handler
    server.on_loop[f"/{SERVICE}/Fast"] = lambda layered: grpc.unary_unary_rpc_method_handler(
        _fast, request_deserializer=layered.request_deserializer,
        response_serializer=layered.response_serializer)
    server.add_registered_method_handlers(SERVICE, {
        "Abort": h(probe.abort, _ident, _ident),
        "Unavailable": h(probe.unavailable, _ident, _ident),
        "Slow": h(probe.slow, _ident, _ident),
        "Fast": h(probe.slow, _ident, _ident),  # replaced by the loop handler above
        "Watch": grpc.unary_stream_rpc_method_handler(probe.watch, _ident, _ident),
    })
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, probe
    finally:
        channel.close()
        assert server.stop(0).wait(10)
        pool.shutdown(wait=False, cancel_futures=True)


def test_abort_on_the_pool_sends_its_code_and_message(served: tuple[grpc.Channel, _Probe]) -> None:
    channel, _ = served
    with pytest.raises(grpc.RpcError) as e:
        channel.unary_unary(f"/{SERVICE}/Abort")(b"why", timeout=10)
    assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details() == "no: why"


def test_an_unavailable_answer_keeps_its_retry_hint(served: tuple[grpc.Channel, _Probe]) -> None:
    channel, _ = served
    with pytest.raises(grpc.RpcError) as e:
        channel.unary_unary(f"/{SERVICE}/Unavailable")(b"", timeout=10)
    assert e.value.code() is grpc.StatusCode.UNAVAILABLE
    assert e.value.details() == "the store is down"
    assert dict(e.value.trailing_metadata() or ()).get(RETRY_PUSHBACK_KEY) == "1000"


def test_a_cancelled_stream_ends_on_the_pool_with_its_callbacks(served: tuple[grpc.Channel, _Probe]) -> None:
    channel, probe = served
    call = channel.unary_stream(f"/{SERVICE}/Watch")(b"", timeout=30)
    assert next(call) == b"tick"
    call.cancel()
    assert probe.callback_fired.wait(10), "the RPC's end callback did not run"
    assert probe.stream_ended.wait(10), "the generator's finally did not run"


def test_a_slow_call_on_the_pool_never_delays_a_call_on_the_loop(
        served: tuple[grpc.Channel, _Probe]) -> None:
    channel, _ = served
    slow = [channel.unary_unary(f"/{SERVICE}/Slow").future(b"", timeout=30) for _ in range(4)]
    time.sleep(0.1)  # every pool thread is busy now
    t0 = time.monotonic()
    assert channel.unary_unary(f"/{SERVICE}/Fast")(b"", timeout=10) == b"fast"
    assert time.monotonic() - t0 < 0.5
    assert [f.result() for f in slow] == [b"slow"] * 4
