"""Issue 12 part 2, "Limits and validation at the edge": one named regression per defect
reproduced against main, each over a real broker on loopback (tests/broker/harness.py).

Every refusal must be a clean gRPC status with a message naming the field, must change
nothing, and must leave no traceback in the broker's log.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.api.errors import InvalidArgument
from broker.api.limits import INT32_MAX
from broker.api.validation import check_message
from broker.store.base import CORRUPT, KIND_AGENT, CorruptRecord
from brokerctl.main import main as brokerctl_main
from brokerctl.render import escape_controls
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import agent_pb2_grpc
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

ESC = "\x1b"


@pytest.fixture
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail the test if the broker logged a traceback or gRPC's decode failure."""
    caplog.set_level(logging.INFO)
    yield
    for rec in caplog.records:
        assert rec.exc_info is None, f"traceback logged: {rec.getMessage()}"
        assert "Exception deserializing" not in rec.getMessage()


def refused(fn, request, **kw) -> grpc.RpcError:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as e:
        fn(request, timeout=10, **kw)
    return e.value


def job_ids(broker: Broker) -> list[str]:
    return [j.id for j in broker.jobs.ListJobs(jpb.ListJobsRequest(), timeout=10).jobs]


def register_over(broker: Broker, reg: apb.Register) -> grpc.RpcError | apb.BrokerMessage:
    """Open one Connect stream on an agent channel whose certificate names ``reg``'s region
    and agent id, send ``reg``, return the first answer (or the stream's error)."""
    stub = agent_pb2_grpc.AgentServiceStub(broker.agent_channel(reg.region, reg.agent_id))
    call = stub.Connect(iter([apb.AgentMessage(register=reg)]), timeout=10)
    try:
        return next(call)
    except grpc.RpcError as e:
        return e
    finally:
        call.cancel()


# ---- inventories ---------------------------------------------------------------------------
def test_capacity_type_99_node_is_refused_and_never_reaches_the_scheduler(
        broker: Broker, make_agent, no_tracebacks) -> None:  # noqa: ANN001
    broker.team()
    bad = nodes_for("us-east-2", "evil", 1, 8, capacity_type=99)
    e = register_over(broker, apb.Register(agent_id="evil", region="us-east-2", nodes=bad))
    assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "capacity_type = 99 is not a capacity type" in e.details()
    assert broker.store.get_record(KIND_AGENT, "evil", apb.Register) is None
    # The scheduler still places: a good region gets the job.
    make_agent("us-west-2")
    job = broker.submit(spec("after-evil"))
    broker.wait_phase(job.id, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)


def test_int32_gpu_nodes_refused_and_a_persisted_one_is_skipped(tmp_path: Path) -> None:
    cfg = fast_config(tmp_path)
    b = Broker(cfg)
    try:
        huge = nodes_for("us-east-2", "big", 2, 1)
        for n in huge:
            n.gpus = INT32_MAX
        e = register_over(b, apb.Register(agent_id="big", region="us-east-2", nodes=huge))
        assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "gpus = 2147483647 exceeds the maximum 1024" in e.details()
        # An inventory persisted by an older broker (no checks) must not poison reads.
        b.store.put_record(KIND_AGENT, "big", apb.Register(agent_id="big", region="us-east-2",
                                                          nodes=huge))
    finally:
        b.stop()
    before = CORRUPT["record:agent"]
    b = Broker(cfg)
    try:
        regions = b.capacity.ListRegions(cpb.ListRegionsRequest(), timeout=10).regions
        assert all(r.total_gpus >= 0 for r in regions)
        assert "big" not in [a for r in regions for a in r.agent_ids]
        b.capacity.GetCapacity(cpb.GetCapacityRequest(include_nodes=True), timeout=10)
        assert CORRUPT["record:agent"] > before  # counted (once per reload), and logged
    finally:
        b.stop()


def test_bad_agent_messages_are_dropped_and_the_stream_goes_on(
        broker: Broker, make_agent, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    caplog.set_level(logging.WARNING)
    broker.team()
    agent = make_agent("us-east-2")
    job = broker.submit(spec("runs"))
    launch = agent.wait_launch(job.id)
    node = launch.placement.nodes[0].node_id
    # A spot notice with a NaN deadline, an update with an unknown state, a 1 MB message:
    # each refused at the edge, logged on one line, and nothing applied.
    agent.send(apb.AgentMessage(heartbeat=apb.Heartbeat(
        time=1.0, spot_notices=[apb.SpotNotice(node_id=node, deadline_time=math.nan)])))
    agent.send(apb.AgentMessage(job_update=apb.JobUpdate(job_id=job.id, attempt=launch.attempt,
                                                         state=99)))
    agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_FAILED, message="x" * 1_000_000)
    wait_until(lambda: sum("refused" in r.getMessage() for r in caplog.records) >= 3, 20,
               "three refusals logged")
    assert all(r.exc_info is None for r in caplog.records)
    assert broker.get(job.id).phase in (pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
    # The same stream still works: a valid update is applied, and a diverged loss (NaN)
    # is a fact, not bad input: that update lands too.
    agent.send(apb.AgentMessage(job_update=apb.JobUpdate(
        job_id=job.id, attempt=launch.attempt, state=apb.ATTEMPT_STATE_RUNNING,
        progress=pb.Progress(step=3, total_steps=100, loss=math.nan))))
    broker.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
    assert math.isnan(wait_until(lambda: (j := broker.get(job.id)).progress.step == 3 and j,
                                 20, "progress applied").progress.loss)


def test_nan_and_inf_are_refused_everywhere(broker: Broker, no_tracebacks) -> None:  # noqa: ANN001
    broker.team()
    for value in (math.nan, math.inf, -math.inf):
        e = refused(broker.jobs.SubmitJob, jpb.SubmitJobRequest(
            spec=spec("nan", max_price_per_gpu_hour=value)))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "must be finite" in e.details()
        e = refused(broker.capacity.SetTeamQuota, cpb.SetTeamQuotaRequest(
            quota=cpb.TeamQuota(team="nan", fair_share_weight=value)))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "fair_share_weight" in e.details()
        node = nodes_for("us-east-2", "nan", 1, 8)[0]
        node.price_per_gpu_hour = value
        e = register_over(broker, apb.Register(agent_id="nan", region="us-east-2", nodes=[node]))
        assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert job_ids(broker) == []
    assert broker.store.get_record(KIND_AGENT, "nan", apb.Register) is None


# ---- free text and identifiers -------------------------------------------------------------
def test_huge_free_text_fields_are_refused_and_list_jobs_keeps_working(
        broker: Broker, no_tracebacks) -> None:  # noqa: ANN001
    broker.team()
    ok = broker.submit(spec("fine"))
    big = "x" * (24 * 1024 * 1024)
    e = refused(broker.jobs.SubmitJob, jpb.SubmitJobRequest(spec=spec("big", labels={"k": big})))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # over the message size cap
    e = refused(broker.jobs.SubmitJob, jpb.SubmitJobRequest(
        spec=spec("big", labels={"k": "x" * 100_000})))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.labels['k']" in e.details()
    e = refused(broker.jobs.SubmitJob, jpb.SubmitJobRequest(
        spec=spec("many", labels={f"k{i}": "v" for i in range(65)})))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 64" in e.details()
    e = refused(broker.jobs.SubmitJob, jpb.SubmitJobRequest(
        spec=spec("env", env={f"E{i}": "v" for i in range(129)})))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.env" in e.details()
    e = refused(broker.jobs.CancelJob, jpb.CancelJobRequest(job_id=ok.id, reason="r" * 5000))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "reason" in e.details()
    e = refused(broker.jobs.SubmitJob, jpb.SubmitJobRequest(spec=spec("n" * 300)))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 200" in e.details()
    assert job_ids(broker) == [ok.id]
    assert broker.get(ok.id).phase == pb.JOB_PHASE_PENDING


def test_control_characters_refused_in_identifiers(broker: Broker, no_tracebacks) -> None:  # noqa: ANN001
    broker.team()
    for kw in (dict(name=f"x{ESC}[2J"), dict(labels={"k": f"v{ESC}]8;;http://x{ESC}\\"}),
               dict(labels={"k\u202e": "v"}), dict(priority_class="training\x00")):
        e = refused(broker.jobs.SubmitJob, jpb.SubmitJobRequest(spec=spec(**{"name": "j", **kw})))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, kw
        assert "control character" in e.details(), e.details()
        assert ESC not in e.details()  # the message shows the value escaped
    e = refused(broker.jobs.GetJob, jpb.GetJobRequest(job_id=f"j-{ESC}[31m"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert job_ids(broker) == []


@pytest.mark.parametrize(("kw", "names"), [
    (dict(allowed_regions=["us-east-2", "eu\x07"]), "spec.allowed_regions[1]"),
    (dict(labels={"ok": "v", f"k{ESC}": "v"}), "spec.labels key"),
    (dict(labels={"ok": "v", "k": "é\u200b"}), "spec.labels['k']"),
    (dict(labels={"ok": "v", "k": "x" * 1025}), "spec.labels['k']"),
    (dict(env={"A": "fine\ttext\u202e", "B": "y" * (32 * 1024 + 1)}), "spec.env['B']"),
    (dict(command=["python", "-c", "x" * (32 * 1024 + 1)]), "spec.command[2]"),
])
def test_bulk_string_checks_name_the_first_bad_entry(kw, names) -> None:  # noqa: ANN001
    """Maps and repeated strings are checked in bulk; a refusal still names the entry."""
    with pytest.raises(InvalidArgument) as e:
        check_message(jpb.SubmitJobRequest(spec=spec(**{"name": "j", **kw})))
    assert names in e.value.message, e.value.message


def test_bulk_string_checks_pass_good_text() -> None:
    """Free text may hold any character (env values, argv); identifiers printable Unicode."""
    check_message(jpb.SubmitJobRequest(spec=spec(
        "j", env={"A": "tab\there\u202e", "B": "ü" * 100}, labels={"k": "ünï", "ké": "v"},
        command=["bash", "-c", "echo\x1b[1m hi"], allowed_regions=["us-east-2"])))


def test_brokerctl_job_escapes_control_characters(broker: Broker, make_agent,  # noqa: ANN001
                                                 capsys: pytest.CaptureFixture) -> None:
    broker.team()
    job = broker.submit(spec("esc"))
    # Free text may carry escapes (a cancel reason, a rank's stderr): stored, never printed raw.
    broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id, reason=f"bye{ESC}[2J{ESC}]0;pwned\a"),
                          timeout=10)
    broker.wait_phase(job.id, pb.JOB_PHASE_CANCELLED)
    assert ESC in "".join(e.message for e in broker.events(job.id))
    capsys.readouterr()
    for cmd in (["job", job.id], ["events", job.id], ["jobs"]):
        assert brokerctl_main(["--broker", broker.address, *cmd]) == 0
        out = capsys.readouterr().out
        assert ESC not in out and "\a" not in out, cmd
    assert escape_controls(f"a{ESC}[2Jb\u202ec\nd") == "a\\x1b[2Jb\\u202ec\nd"


# ---- checkpoint URIs -----------------------------------------------------------------------
def test_checkpoint_uri_escapes_refused(tmp_path: Path, no_tracebacks) -> None:  # noqa: ANN001
    root = tmp_path / "allowed"
    b = Broker(fast_config(tmp_path, checkpoint_allowed_roots=[str(root), "s3://team-ckpt/ml"]))
    try:
        b.team()
        for uri in ("/etc/cron.d", "file:///etc/passwd", f"{root}/../../etc", f"{root}/./x",
                    f"{root}-other/x", "s3://team-ckpt/other", "s3://team-ckpt/ml/../x"):
            e = refused(b.jobs.SubmitJob, jpb.SubmitJobRequest(spec=spec("c", checkpoint_uri=uri)))
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, uri
            assert uri in e.details() or repr(uri) in e.details(), e.details()
        assert job_ids(b) == []
        for uri in (f"{root}/mine", f"file://{root}/x", "s3://team-ckpt/ml/run1"):
            assert b.submit(spec("c", checkpoint_uri=uri)).phase == pb.JOB_PHASE_PENDING
        # A region's advertised roots count too.
        agent = FakeAgent(b.address, "r1", "eu-west-1", nodes_for("eu-west-1", "r1", 1, 8),
                          bucket="s3://cb-eu")
        agent.connect()
        try:
            assert b.submit(spec("c", checkpoint_uri="s3://cb-eu/mine")).phase == pb.JOB_PHASE_PENDING
        finally:
            agent.close()
    finally:
        b.stop()


# ---- undecodable bytes and bad store records ------------------------------------------------
def test_undecodable_requests_are_invalid_argument_without_traceback(
        broker: Broker, no_tracebacks) -> None:  # noqa: ANN001
    raw = broker.channel.unary_unary("/computebroker.v1.JobService/GetJob")
    for junk in (b"\xff\xff\xff\xff", b"\x0a\xff", b"\x08" + b"\xff" * 11):
        with pytest.raises(grpc.RpcError) as e:
            raw(junk, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid protobuf message" in e.value.details()
    stream = broker.agent_channel("us-east-2", "raw").stream_stream(
        "/computebroker.v1.AgentService/Connect")
    with pytest.raises(grpc.RpcError) as e:
        next(stream(iter([b"\xff\xff\xff"]), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert job_ids(broker) == []


def test_a_damaged_sqlite_record_breaks_no_read_and_no_pass(tmp_path: Path, no_tracebacks) -> None:  # noqa: ANN001
    broker = Broker(fast_config(tmp_path, metrics_listen="127.0.0.1:0"))
    agent = FakeAgent(broker.address, "a", "us-east-2", nodes_for("us-east-2", "a", 2, 8))
    try:
        damaged_record_scenario(broker, agent)
    finally:
        agent.close()
        broker.stop()


def damaged_record_scenario(broker: Broker, agent: FakeAgent) -> None:
    broker.team()
    agent.connect()
    good, bad = broker.submit(spec("good")), broker.submit(spec("bad"))
    # Damage a finished job: nothing writes it any more (a live one could be rewritten by
    # the scheduler between our damage and our reads).
    broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=bad.id), timeout=10)
    broker.wait_phase(bad.id, pb.JOB_PHASE_CANCELLED)
    db = broker.config.store.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE jobs SET data = ? WHERE id = ?", (b"\xff\xff\xff", bad.id))
        conn.execute("INSERT INTO records (kind, key, data) VALUES ('plan', 'junk', ?)",
                     (b"\x0a\xff\xff",))
    before = CORRUPT["job"]
    assert job_ids(broker) == [good.id]
    assert CORRUPT["job"] > before
    e = refused(broker.jobs.GetJob, jpb.GetJobRequest(job_id=bad.id))
    assert e.code() == grpc.StatusCode.DATA_LOSS and "damaged" in e.details()
    broker.capacity.ListTrainingPlans(cpb.ListTrainingPlansRequest(), timeout=10)
    broker.wait_phase(good.id, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
    fresh = broker.submit(spec("fresh"))  # later passes keep placing
    broker.wait_phase(fresh.id, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
    from tests.telemetry.test_metrics import scrape

    text = scrape(broker)
    assert 'computebroker_store_corrupt_records_total{kind="job",' in text, text[-2000:]


def test_a_damaged_redis_record_is_skipped(redis_store) -> None:  # noqa: ANN001
    from broker.store.base import KIND_PLAN

    j1, j2 = pb.Job(id="j-1", spec=pb.JobSpec(team="ml")), pb.Job(id="j-2", spec=pb.JobSpec(team="ml"))
    redis_store.create_job(j1, [pb.JobEvent(type="submitted")])
    redis_store.create_job(j2)
    r = redis_store._r
    r.hset(redis_store._k("job", "j-2"), "d", b"\xff\xff")
    r.rpush(redis_store._k("ev", "j-1"), b"\xff\xff")
    redis_store.put_record(KIND_PLAN, "ok", cpb.TrainingPlan(id="ok"))
    r.hset(redis_store._k("rec", KIND_PLAN), "junk", b"\x0a\xff\xff")
    assert [j.id for j in redis_store.list_jobs()] == ["j-1"]
    assert [e.type for e in redis_store.list_events("j-1")] == ["submitted"]
    assert [p.id for p in redis_store.list_records(KIND_PLAN, cpb.TrainingPlan)] == ["ok"]
    with pytest.raises(CorruptRecord):
        redis_store.get_job("j-2")


# ---- probes ----------------------------------------------------------------------------------
def test_health_service_and_reflection_only_with_the_flag(tmp_path: Path) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    def services(b: Broker) -> list[str]:
        stub = reflection_pb2_grpc.ServerReflectionStub(b.channel)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        resp = next(stub.ServerReflectionInfo(iter([req]), timeout=10))
        return [s.name for s in resp.list_services_response.service]

    for flag in (False, True):
        b = Broker(fast_config(tmp_path / str(flag), reflection=flag))
        try:
            health = health_pb2_grpc.HealthStub(b.channel)
            for svc in ("", "computebroker.v1.JobService", "computebroker.v1.AgentService"):
                status = health.Check(health_pb2.HealthCheckRequest(service=svc), timeout=10).status
                assert status == health_pb2.HealthCheckResponse.SERVING
            if flag:
                assert "computebroker.v1.JobService" in services(b)
            else:
                with pytest.raises(grpc.RpcError) as e:
                    services(b)
                assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            b.stop()


def test_unknown_fields_are_dropped_not_stored(broker: Broker) -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    broker.team()
    unknown = b"\xf8\x06\x2a" + b"\xfa\x06\x03abc"  # field 111 = 42, field 111 = "abc"
    inner = spec("unknown").SerializeToString() + unknown
    raw = b"\x0a" + _VarintBytes(len(inner)) + inner  # SubmitJobRequest.spec
    resp = jpb.SubmitJobResponse.FromString(
        broker.channel.unary_unary("/computebroker.v1.JobService/SubmitJob")(raw, timeout=10))
    stored = broker.store.get_job(resp.job.id)
    assert unknown not in stored.SerializeToString()
    assert stored.spec.name == "unknown"


def test_a_job_is_not_placed_where_its_checkpoint_uri_is_not_allowed(tmp_path: Path) -> None:
    """Regions whose agent names allowed roots get only jobs whose own checkpoint_uri
    lies under them (or under the region's store); the others go elsewhere."""
    b = Broker(fast_config(tmp_path))
    strict = FakeAgent(b.address, "strict", "us-east-2", nodes_for("us-east-2", "strict", 2, 8),
                       bucket="s3://cb-east", roots=["s3://team-east/ml"])
    lax = FakeAgent(b.address, "lax", "eu-west-1", nodes_for("eu-west-1", "lax", 2, 8),
                    bucket="s3://cb-eu")
    try:
        strict.connect()
        lax.connect()
        b.team()
        ok_there = b.submit(spec("east", checkpoint_uri="s3://team-east/ml/run",
                                 preferred_regions=["us-east-2"]))
        assert b.wait_phase(ok_there.id, pb.JOB_PHASE_LAUNCHING,
                            pb.JOB_PHASE_RUNNING).placement.region == "us-east-2"
        elsewhere = b.submit(spec("eu", checkpoint_uri="s3://cb-eu/mine", preferred_regions=["us-east-2"]))
        assert b.wait_phase(elsewhere.id, pb.JOB_PHASE_LAUNCHING,
                            pb.JOB_PHASE_RUNNING).placement.region == "eu-west-1"
    finally:
        strict.close()
        lax.close()
        b.stop()


@pytest.mark.parametrize("since", [1e300, -1.0])
def test_a_since_no_clock_can_print_is_refused(since: float) -> None:
    """`since` fields are printed as a time ("unreachable since 12:03 UTC"); one past
    time_t made the agent-update path raise OverflowError instead of refusing it."""
    u = apb.JobUpdate(job_id="j-1", attempt=1)
    u.store_wait.since, u.store_wait.message = since, "store down"
    with pytest.raises(InvalidArgument, match="since"):
        check_message(u)
    u.store_wait.since = 1_795_000_000.0
    check_message(u)  # a real time passes
