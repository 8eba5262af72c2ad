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
from broker.auth.identity import Role

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


def test_a_caller_that_leaves_mid_write_still_has_its_job_reported_and_audited(tmp_path) -> None:  # noqa: ANN001
    """The sync server finished a submit whose caller had left; so must the loop: the
    job is committed with its audit record and the core hears of it (the listener)."""
    import asyncio

    from broker.agents.registry import AgentRegistry
    from broker.auth.audit import KIND_AUDIT, PendingAudit
    from broker.auth.identity import Principal
    from broker.config import BrokerConfig
    from broker.jobs.applier import Applier
    from broker.jobs.hub import EventHub
    from broker.jobs.outcome import Outcome
    from broker.store import open_store
    from broker.store.group_commit import LoopSink
    from broker.telemetry import BrokerTelemetry
    from computebroker.v1 import auth_pb2 as aupb
    from tests.store.test_conformance import ev, make_job
    from tests.store.test_group_commit_loop import _SlowStore

    store = open_store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    try:
        slow = _SlowStore(store, 0.4)
        applier = Applier(slow, EventHub(), AgentRegistry(store), BrokerTelemetry(),  # type: ignore[arg-type]
                          BrokerConfig(checkpoint_root=str(tmp_path / "ckpt")))
        heard: list[str] = []
        applier.add_listener(lambda job: heard.append(job.id))
        pending = PendingAudit(Principal("erin", Role.MEMBER, team="a"),
                               "/computebroker.v1.JobService/SubmitJob", "spec:n-j-left", "ipv4:127.0.0.1:1")
        out = Outcome(job=make_job("j-left", team="a", crid="r-left"), events=(ev("submitted"),))

        async def main() -> None:
            task = asyncio.create_task(applier.create_soon(out, pending, LoopSink(asyncio.get_running_loop())))
            await asyncio.sleep(0.1)
            task.cancel()  # the caller's deadline passed, mid-write
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if heard:
                    break
                await asyncio.sleep(0.05)

        asyncio.run(main())
        assert heard == ["j-left"]
        assert pending.written
        assert store.get_job("j-left").client_request_id == "r-left"
        records = store.list_records(KIND_AUDIT, aupb.AuditRecord)
        assert [r.target for r in records] == ["spec:n-j-left"]
    finally:
        store.close()
