"""Priority classes through CapacityService on a real broker: CRUD, errors, audit,
SubmitJob validation against the live set, and the scheduler ranking by a class that
was set (and changed) through the API."""

from __future__ import annotations

import grpc
import pytest

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import auth_pb2 as aupb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, spec, wait_until


def _set(b: Broker, name: str, value: int, description: str = "") -> cpb.PriorityClass:
    return b.capacity.SetPriorityClass(cpb.SetPriorityClassRequest(
        priority_class=cpb.PriorityClass(name=name, value=value, description=description)))


def _err(call, req) -> tuple[grpc.StatusCode, str]:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as info:
        call(req)
    return info.value.code(), info.value.details() or ""


def test_set_list_delete_and_their_errors(broker: Broker) -> None:
    b = broker
    listed = b.capacity.ListPriorityClasses(cpb.ListPriorityClassesRequest()).priority_classes
    assert [(pc.name, pc.value) for pc in listed] == [
        ("inference", 100), ("experimentation", 80), ("training", 70), ("fine-tuning", 50)]
    assert [pc.name for pc in listed if pc.is_default] == ["training"]
    assert _set(b, "urgent", 1000, "pager") == cpb.PriorityClass(name="urgent", value=1000, description="pager")
    assert _set(b, "inference", 90).value == 90  # update: the store wins over config
    names = [pc.name for pc in b.capacity.ListPriorityClasses(cpb.ListPriorityClassesRequest()).priority_classes]
    assert names == ["urgent", "inference", "experimentation", "training", "fine-tuning"]

    bad = cpb.SetPriorityClassRequest
    for req, needle in ((bad(), "priority_class is missing"),
                        (bad(priority_class=cpb.PriorityClass(value=1)), "name is empty"),
                        (bad(priority_class=cpb.PriorityClass(name="no spaces", value=1)), "no spaces"),
                        (bad(priority_class=cpb.PriorityClass(name="huge", value=2**31 - 1)), "value")):
        code, msg = _err(b.capacity.SetPriorityClass, req)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and needle in msg, msg

    code, msg = _err(b.capacity.DeletePriorityClass, cpb.DeletePriorityClassRequest(name="nope"))
    assert code is grpc.StatusCode.NOT_FOUND and "known: urgent, inference" in msg
    code, msg = _err(b.capacity.DeletePriorityClass, cpb.DeletePriorityClassRequest(name="training"))
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "default" in msg
    code, msg = _err(b.capacity.DeletePriorityClass, cpb.DeletePriorityClassRequest())
    assert code is grpc.StatusCode.INVALID_ARGUMENT

    # SubmitJob validates against the live set and names it (highest first).
    b.team()
    job = b.submit(spec("u", priority_class="urgent"))
    code, msg = _err(b.capacity.DeletePriorityClass, cpb.DeletePriorityClassRequest(name="urgent"))
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "used by 1 live job" in msg
    b.jobs.CancelJob(jpb.CancelJobRequest(job_id=job.id))
    b.wait_phase(job.id, pb.JOB_PHASE_CANCELLED)
    assert b.capacity.DeletePriorityClass(cpb.DeletePriorityClassRequest(name="urgent")).name == "urgent"
    code, msg = _err(b.jobs.SubmitJob, jpb.SubmitJobRequest(spec=spec("gone", priority_class="urgent")))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.priority_class 'urgent' is unknown; known classes: inference, experimentation" in msg

    # Each mutation left an audit record naming its class.
    audit = b.auth.ListAuditRecords(aupb.ListAuditRecordsRequest(limit=1000)).records
    targets = {(r.method.rsplit("/", 1)[-1], r.target, r.result) for r in audit}
    assert ("SetPriorityClass", "priority_class:urgent", "OK") in targets
    assert ("DeletePriorityClass", "urgent", "OK") in targets
    assert ("DeletePriorityClass", "urgent", "FAILED_PRECONDITION") in targets


def test_scheduler_ranks_by_a_class_set_through_the_api(broker: Broker, make_agent) -> None:  # noqa: ANN001
    b = broker
    b.team("ml", gpus=8)
    agent = make_agent(nodes=1, gpus=8)
    _set(b, "vip", 10, "below training for now")
    low = b.submit(spec("low", gpus=8))  # training = 70
    launch = agent.wait_launch(low.id)
    agent.update(low.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=1)
    b.wait_phase(low.id, pb.JOB_PHASE_RUNNING)
    high = b.submit(spec("high", gpus=8, priority_class="vip"))
    # A scheduler pass has looked at it (it says why it waits) and preempted nothing.
    wait_until(lambda: b.get(high.id).pending_reason, 20, "vip job's pending reason")
    assert not agent.commands("stop", low.id)
    # Raising the class through the API is seen at once: the running job is preempted.
    _set(b, "vip", 1000)
    stop = agent.wait_stop(low.id, apb.STOP_REASON_PREEMPT)
    assert stop.checkpoint_first
