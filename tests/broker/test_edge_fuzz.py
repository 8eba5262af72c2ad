"""Property tests over every RPC's request messages (issue 12 "Proof").

Messages are generated from the protobuf descriptors (any message type, recursively):
random field values plus the nasty ones (huge strings, control characters, ``..``
paths, NaN/inf, int32/int64 extremes, unknown enum values), and raw random bytes.
Properties, against one real broker on loopback:

* every answer is OK or a clean client-side status (never INTERNAL/UNKNOWN);
* a refused request changes nothing (jobs, events and records are as before);
* the broker stays up (reads answer after the run) and logs no traceback.

Agent streams get the same treatment: random AgentMessage sequences on Connect.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.store.base import KIND_AGENT, KIND_PLAN, KIND_REGION, KIND_TEAM
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2, jobs_pb2, workdir_pb2
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, fast_config, spec

CLEAN = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
         grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
         grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE,
         grpc.StatusCode.PERMISSION_DENIED}  # e.g. a Register naming another agent than the certificate
NASTY_STRINGS = ["", "a", "\x1b[2J\x1b]0;x\a", "a\x00b", "\u202e\u200b", "..", "../../etc",
                 "/etc/cron.d", "file:///etc/passwd", "s3://b/../x", "ml", "training",
                 "x" * 5000, "y" * 300_000]
INT_EXTREMES = [0, 1, -1, 2**31 - 1, -(2**31), 1024, 1025]
INT64_EXTREMES = [*INT_EXTREMES, 2**63 - 1, -(2**63), 2**53 + 1]
INT_RANGES = {FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
              FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1)}

UNARY = [(jobs_pb2, "JobService"), (capacity_pb2, "CapacityService"),
         (workdir_pb2, "WorkdirService")]


def scalar(fd: FieldDescriptor) -> st.SearchStrategy:
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(NASTY_STRINGS), st.text(max_size=30))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e308]),
                         st.floats(allow_nan=True, allow_infinity=True))
    if t == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in fd.enum_type.values]),
                         st.integers(-3, 120))
    lo, hi = INT_RANGES.get(t, (-(2**31), 2**31 - 1))
    extremes = INT64_EXTREMES if t == FieldDescriptor.TYPE_INT64 else INT_EXTREMES
    return st.one_of(st.sampled_from(extremes), st.integers(lo, hi))


@st.composite
def messages(draw: st.DrawFn, desc: Descriptor, depth: int = 0) -> Message:
    msg = message_factory.GetMessageClass(desc)()
    for fd in desc.fields:
        if not draw(st.booleans()):
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            kfd, vfd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            count = draw(st.sampled_from([0, 1, 2, 70, 200]))
            for _ in range(count):
                key = draw(scalar(kfd))
                if vfd.message_type is None:
                    getattr(msg, fd.name)[key] = draw(scalar(vfd))
            continue
        if fd.message_type is not None:
            if depth >= 3:
                continue
            sub = messages(fd.message_type, depth + 1)
            if fd.is_repeated:
                getattr(msg, fd.name).extend(draw(st.lists(sub, max_size=2)))
            else:
                getattr(msg, fd.name).CopyFrom(draw(sub))
            continue
        if fd.is_repeated:
            getattr(msg, fd.name).extend(draw(st.lists(scalar(fd), max_size=3)))
        else:
            setattr(msg, fd.name, draw(scalar(fd)))
    return msg


def unary_methods() -> list[tuple[str, Descriptor, Descriptor]]:
    out = []
    for mod, name in UNARY:
        svc = mod.DESCRIPTOR.services_by_name[name]
        for m in svc.methods:
            if not m.client_streaming:
                out.append((f"/{svc.full_name}/{m.name}", m.input_type, m.output_type))
    return out


METHODS = unary_methods()


def snapshot(b: Broker) -> tuple:
    store = b.store
    jobs = store.list_jobs(limit=0)
    return (
        [(j.id, j.version) for j in jobs],
        [len(store.list_events(j.id)) for j in jobs],
        [r.SerializeToString(deterministic=True) for r in store.list_records(KIND_TEAM, capacity_pb2.TeamQuota)],
        [r.SerializeToString(deterministic=True) for r in store.list_records(KIND_PLAN, capacity_pb2.TrainingPlan)],
        [r.SerializeToString(deterministic=True) for r in store.list_records(KIND_REGION, capacity_pb2.RegionInfo)],
        [r.agent_id for r in store.list_records(KIND_AGENT, apb.Register)],
    )


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(fast_config(Path(tmp_path_factory.mktemp("fuzz")), auto_create_teams=True))
    b.team()
    b.submit(spec("seed"))
    yield b
    b.stop()


@pytest.fixture
def log_check(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.WARNING)
    yield
    bad = [r.getMessage() for r in caplog.records
           if r.exc_info is not None or "Exception deserializing" in r.getMessage()]
    assert not bad, bad[:3]


def call(b: Broker, path: str, payload: bytes, streaming: bool) -> grpc.StatusCode:
    try:
        if streaming:
            it = b.channel.unary_stream(path)(payload, timeout=10)
            for _ in zip(range(3), it, strict=False):  # history, then stop (a live watch idles)
                pass
            it.cancel()
        else:
            b.channel.unary_unary(path)(payload, timeout=10)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED:
            return grpc.StatusCode.OK  # our own cancel of a live stream
        return e.code()
    return grpc.StatusCode.OK


FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@pytest.mark.parametrize("path,input_type,_out", METHODS, ids=[m[0].rsplit("/", 1)[-1] for m in METHODS])
def test_every_rpc_answers_cleanly(fuzzed: Broker, log_check, path: str,  # noqa: ANN001
                                   input_type: Descriptor, _out: Descriptor) -> None:
    streaming = path.endswith(("/WatchJob", "/StreamJobLogs", "/FetchWorkdir"))

    @FUZZ
    @given(msg=messages(input_type))
    def check(msg: Message) -> None:
        before = snapshot(fuzzed)
        code = call(fuzzed, path, msg.SerializeToString(), streaming)
        assert code in CLEAN, f"{path}: {code} for {msg}"
        if code != grpc.StatusCode.OK:
            assert snapshot(fuzzed) == before, f"{path} was refused ({code}) but changed state"

    check()
    assert fuzzed.jobs.ListJobs(jpb.ListJobsRequest(), timeout=10).jobs  # still up


@FUZZ
@given(junk=st.binary(max_size=200))
def test_raw_bytes_on_every_rpc(fuzzed: Broker, log_check, junk: bytes) -> None:  # noqa: ANN001
    for path, _, _ in METHODS:
        code = call(fuzzed, path, junk, path.endswith(("/WatchJob", "/StreamJobLogs", "/FetchWorkdir")))
        assert code in CLEAN, f"{path}: {code} for {junk!r}"


@FUZZ
@given(msgs=st.lists(messages(apb.AgentMessage.DESCRIPTOR), min_size=1, max_size=3))
def test_agent_stream_messages(fuzzed: Broker, log_check, msgs: list[Message]) -> None:  # noqa: ANN001
    stream = fuzzed.agent_channel("us-east-2", "fuzz").stream_stream(
        "/computebroker.v1.AgentService/Connect")
    before = snapshot(fuzzed)
    it = stream(iter([m.SerializeToString() for m in msgs]), timeout=10)
    registered = False
    try:
        for raw in it:
            if apb.BrokerMessage.FromString(raw).WhichOneof("cmd") == "registered":
                registered = True
            break
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    finally:
        it.cancel()
    assert code in CLEAN, f"Connect: {code} for {msgs}"
    if not registered:
        assert snapshot(fuzzed)[-1] == before[-1], "a refused Register was stored"
    assert fuzzed.jobs.ListJobs(jpb.ListJobsRequest(), timeout=10).jobs


def spec_fields() -> list[tuple[str, FieldDescriptor]]:
    """(path to the message inside a JobSpec, field) for every field a spec holds."""
    from computebroker.v1 import common_pb2 as pb

    out = [("", fd) for fd in pb.JobSpec.DESCRIPTOR.fields if fd.message_type is None
           or fd.message_type.GetOptions().map_entry]
    for sub in ("resources", "trainer", "elasticity", "topology", "workdir"):
        desc = pb.JobSpec.DESCRIPTOR.fields_by_name[sub].message_type
        out += [(sub, fd) for fd in desc.fields if fd.message_type is None
                or fd.message_type.GetOptions().map_entry]
    return out


SPEC_FIELDS = spec_fields()


@settings(FUZZ, max_examples=80)
@given(data=st.data())
def test_one_bad_field_in_a_valid_spec(fuzzed: Broker, log_check, data: st.DataObject) -> None:  # noqa: ANN001
    """A valid submit with one field set to a drawn (often nasty) value: only clean
    statuses, and a refused submit creates nothing."""
    s = spec("mutant")
    where, fd = data.draw(st.sampled_from(SPEC_FIELDS))
    target = getattr(s, where) if where else s
    if fd.message_type is not None:  # a map
        kfd, vfd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        getattr(target, fd.name)[data.draw(scalar(kfd))] = data.draw(scalar(vfd))
    elif fd.is_repeated:
        getattr(target, fd.name).append(data.draw(scalar(fd)))
    else:
        setattr(target, fd.name, data.draw(scalar(fd)))
    before = snapshot(fuzzed)
    code = call(fuzzed, "/computebroker.v1.JobService/SubmitJob",
                jpb.SubmitJobRequest(spec=s).SerializeToString(), False)
    assert code in CLEAN, f"{where}.{fd.name}: {code}"
    if code != grpc.StatusCode.OK:
        assert snapshot(fuzzed) == before
