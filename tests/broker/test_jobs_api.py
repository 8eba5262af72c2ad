"""JobService over a real gRPC server: submit/get/list/pagination/idempotency,
validation codes and messages, cancel of a pending job, WatchJob, events."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, fast_config, spec, wait_until


def code_of(fn, *args):  # noqa: ANN001, ANN201
    with pytest.raises(grpc.RpcError) as err:
        fn(*args)
    return err.value.code(), err.value.details()


def test_submit_get_and_pending_reason_without_regions(broker: Broker) -> None:
    broker.team()
    job = broker.submit(spec("first"))
    assert job.id.startswith("j-")
    assert job.phase == pb.JOB_PHASE_PENDING
    assert job.attempt == 0
    got = broker.get(job.id)
    assert got.spec.name == "first" and got.spec.priority_class == "training"
    assert "no regions registered yet" in got.pending_reason
    evs = broker.events(job.id)
    assert [e.type for e in evs] == ["submitted"]
    assert evs[0].to_phase == pb.JOB_PHASE_PENDING and evs[0].seq == 1
    code, msg = code_of(broker.jobs.GetJob, jpb.GetJobRequest(job_id="j-nope"))
    assert code == grpc.StatusCode.NOT_FOUND and "j-nope" in msg


def test_idempotent_submit(broker: Broker) -> None:
    broker.team()
    r1 = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("a"), client_request_id="req-1"))
    r2 = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("a"), client_request_id="req-1"))
    assert r1.created and not r2.created
    assert r1.job.id == r2.job.id
    r3 = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("a"), client_request_id="req-2"))
    assert r3.created and r3.job.id != r1.job.id


def test_a_repeat_answers_the_first_job_even_when_its_spec_no_longer_validates(broker: Broker) -> None:
    """Idempotency does not hang on today's validation: the first request made a job of
    priority class "burst"; the class is deleted; a retry of that request (a lost
    answer) gets the first job, not "unknown priority class"."""
    broker.team()
    broker.capacity.SetPriorityClass(cpb.SetPriorityClassRequest(
        priority_class=cpb.PriorityClass(name="burst", value=5)))
    s = spec("a")
    s.priority_class = "burst"
    first = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=s, client_request_id="req-b"))
    broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=first.job.id))
    broker.capacity.DeletePriorityClass(cpb.DeletePriorityClassRequest(name="burst"))
    again = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=s, client_request_id="req-b"))
    assert not again.created and again.job.id == first.job.id
    with pytest.raises(grpc.RpcError) as e:  # a new request with that spec is refused
        broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=s, client_request_id="req-c"))
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "burst" in (e.value.details() or "")


def test_list_filters_and_pagination(broker: Broker) -> None:
    broker.team("ml")
    broker.team("cv")
    ids = [broker.submit(spec(f"j{i}", team="ml" if i % 2 == 0 else "cv")).id for i in range(7)]
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        resp = broker.jobs.ListJobs(jpb.ListJobsRequest(page_size=3, page_token=token))
        seen += [j.id for j in resp.jobs]
        pages += 1
        token = resp.next_page_token
        if not token:
            break
    assert seen == ids and pages == 3
    ml = broker.jobs.ListJobs(jpb.ListJobsRequest(team="ml")).jobs
    assert [j.id for j in ml] == ids[0::2]
    pend = broker.jobs.ListJobs(jpb.ListJobsRequest(phases=[pb.JOB_PHASE_PENDING])).jobs
    assert len(pend) == 7
    assert not broker.jobs.ListJobs(jpb.ListJobsRequest(phases=[pb.JOB_PHASE_RUNNING])).jobs
    code, msg = code_of(broker.jobs.ListJobs, jpb.ListJobsRequest(page_size=1001))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "1000" in msg
    code, msg = code_of(broker.jobs.ListJobs, jpb.ListJobsRequest(page_token="garbage!"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in msg


INVALID = [
    (dict(name=""), "spec.name"),
    (dict(team=""), "spec.team"),
    (dict(team="bad team!"), "not a valid team name"),
    (dict(nodes=0), "nodes must be at least 1"),
    (dict(nodes=-2), "nodes must be at least 1"),
    (dict(gpus=0), "gpus_per_node must be at least 1"),
    (dict(priority_class="urgent"), "priority_class 'urgent' is unknown"),
    (dict(checkpoint_uri="gs://bucket/x"), "unsupported location"),
    (dict(checkpoint_uri="relative/path"), "unsupported location"),
    (dict(checkpoint_uri="file://relative"), "absolute path"),
    (dict(checkpoint_uri="s3://A_B/x"), "not a valid S3 bucket"),
    (dict(topology=pb.TopologyConstraint(required=42)), "not a topology level"),
    (dict(topology=pb.TopologyConstraint(required=pb.TOPOLOGY_LEVEL_LAYER_3,
                                         preferred=pb.TOPOLOGY_LEVEL_ZONE)), "looser than required"),
    (dict(elasticity=pb.Elasticity(min_nodes=3, max_nodes=2)), "greater than max_nodes"),
    (dict(nodes=4, elasticity=pb.Elasticity(min_nodes=1, max_nodes=2)), "within spec.elasticity"),
    (dict(allowed_regions=["a"], denied_regions=["a"]), "both allowed and denied"),
    (dict(max_price_per_gpu_hour=-1.0), "max_price_per_gpu_hour"),
    (dict(env={"CB_JOB_ID": "x"}), "CB_*"),
    (dict(trainer=pb.TrainerSpec(total_steps=0, global_batch_size=8)), "total_steps must be >= 1"),
    (dict(trainer=pb.TrainerSpec(total_steps=10, global_batch_size=0)), "global_batch_size must be >= 1"),
]


@pytest.mark.parametrize(("override", "needle"), INVALID)
def test_invalid_specs(broker: Broker, override: dict, needle: str) -> None:
    kw = dict(override)
    s = spec(kw.pop("name", "v"), team=kw.pop("team", "ml"), nodes=kw.pop("nodes", 1),
             gpus=kw.pop("gpus", 1), **kw)
    code, msg = code_of(broker.jobs.SubmitJob, jpb.SubmitJobRequest(spec=s))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, msg
    assert needle in msg, msg
    assert "Traceback" not in msg


def test_valid_checkpoint_uris_accepted(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, checkpoint_allowed_roots=["/abs", "s3://my-bucket",
                                                               "s3://whole-bucket"]))
    try:
        b.team()
        # each a prefix no other job has (a job writes only under its own)
        for uri in ("", "/abs/ckpt", "file:///abs/ckpt2", "s3://my-bucket/prefix/x",
                    "s3://whole-bucket"):
            assert b.submit(spec("ok", checkpoint_uri=uri)).phase == pb.JOB_PHASE_PENDING
        # the same place in another spelling is another job's
        code, msg = code_of(b.jobs.SubmitJob, jpb.SubmitJobRequest(
            spec=spec("again", checkpoint_uri="file:///abs/ckpt")))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "its own prefix" in msg, msg
    finally:
        b.stop()


def test_impossible_specs_are_failed_precondition(broker: Broker, make_agent) -> None:  # noqa: ANN001
    code, msg = code_of(broker.jobs.SubmitJob, jpb.SubmitJobRequest(spec=spec("x", team="ghost")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "brokerctl teams set ghost" in msg
    broker.team()
    # Before any agent registers, big jobs are accepted and wait.
    early = broker.submit(spec("big", nodes=50, gpus=8))
    assert early.phase == pb.JOB_PHASE_PENDING
    make_agent("us-east-2", nodes=2, gpus=8)
    code, msg = code_of(broker.jobs.SubmitJob, jpb.SubmitJobRequest(spec=spec("x", gpus=16)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "largest registered node" in msg
    code, msg = code_of(broker.jobs.SubmitJob, jpb.SubmitJobRequest(spec=spec("x", nodes=3, gpus=8)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "largest registered cluster" in msg
    s = spec("x")
    s.resources.accelerator = "tpu"
    code, msg = code_of(broker.jobs.SubmitJob, jpb.SubmitJobRequest(spec=s))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "accelerator 'tpu'" in msg


def test_cancel_pending_and_twice(broker: Broker) -> None:
    broker.team()
    job = broker.submit(spec("c"))
    out = broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id, reason="changed my mind"))
    assert out.phase == pb.JOB_PHASE_CANCELLED
    assert out.finished_time > 0
    evs = broker.events(job.id)
    assert evs[-1].type == "cancelled" and evs[-1].from_phase == pb.JOB_PHASE_PENDING
    assert "changed my mind" in evs[-1].message
    code, msg = code_of(broker.jobs.CancelJob, jpb.CancelJobRequest(job_id=job.id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "already finished" in msg
    code, _ = code_of(broker.jobs.CancelJob, jpb.CancelJobRequest(job_id="j-missing"))
    assert code == grpc.StatusCode.NOT_FOUND


def test_watch_streams_history_then_live_until_terminal(broker: Broker) -> None:
    broker.team()
    job = broker.submit(spec("w"))
    got: list[pb.JobEvent] = []
    done = threading.Event()

    def watch() -> None:
        for ev in broker.jobs.WatchJob(jpb.WatchJobRequest(job_id=job.id), timeout=30):
            got.append(ev)
        done.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    wait_until(lambda: len(got) >= 1, 10, "history event")
    broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id))
    assert done.wait(15), "WatchJob did not end at the terminal event"
    assert [e.type for e in got] == ["submitted", "cancelled"]
    # after_seq skips history; a finished job's watch ends immediately.
    rest = list(broker.jobs.WatchJob(jpb.WatchJobRequest(job_id=job.id, after_seq=1), timeout=10))
    assert [e.seq for e in rest] == [2]
    code, _ = code_of(lambda: list(broker.jobs.WatchJob(jpb.WatchJobRequest(job_id="j-x"))))
    assert code == grpc.StatusCode.NOT_FOUND


def test_events_limit_and_logs(broker: Broker) -> None:
    broker.team()
    job = broker.submit(spec("l"))
    broker.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id))
    one = broker.jobs.GetJobEvents(jpb.GetJobEventsRequest(job_id=job.id, limit=1)).events
    assert len(one) == 1
    logs = broker.jobs.GetJobLogs(jpb.GetJobLogsRequest(job_id=job.id)).lines
    assert any("submitted" in line for line in logs) and any("cancelled" in line for line in logs)
