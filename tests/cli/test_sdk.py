"""The SDK (brokersdk.client) against a real broker on loopback."""

from __future__ import annotations

import uuid

import grpc
import pytest

from brokersdk.client import (
    BrokerClient,
    BrokerUnavailable,
    InvalidJobSpec,
    JobNotFound,
    JobSpec,
    PreconditionFailed,
    TrainerSpec,
)
from computebroker.v1 import common_pb2 as pb
from tests.cli.conftest import TEAM


def small(name: str, **kw: object) -> JobSpec:
    return JobSpec(name=name, team=TEAM, trainer=TrainerSpec(total_steps=10, checkpoint_every=5),
                   **kw)


def test_jobspec_defaults_and_to_proto() -> None:
    spec = JobSpec(name="x", spot_ok=True, topology_required="layer-3",
                   allowed_regions=["us-east-2"], min_nodes=1, max_nodes=2)
    p = spec.to_proto()
    assert p.resources.nodes == 1 and p.resources.gpus_per_node == 1
    assert p.priority_class == "training"
    assert p.trainer.model == "tiny"
    assert p.trainer.global_batch_size >= 1 and p.trainer.total_steps >= 1  # the trainer needs both
    assert p.topology.required == pb.TOPOLOGY_LEVEL_LAYER_3
    assert pb.CAPACITY_TYPE_SPOT in p.capacity_types
    assert list(p.allowed_regions) == ["us-east-2"]
    assert (p.elasticity.min_nodes, p.elasticity.max_nodes) == (1, 2)


def test_jobspec_rejects_unknown_fields_and_levels() -> None:
    with pytest.raises(InvalidJobSpec, match="nodez"):
        JobSpec.from_dict({"name": "x", "nodez": 2})
    with pytest.raises(InvalidJobSpec, match="ultraserver"):
        JobSpec(name="x", topology_required="rack").to_proto()
    api_form = JobSpec.from_dict({"name": "x", "resources": {"nodes": 2, "gpusPerNode": 4}})
    assert isinstance(api_form, pb.JobSpec) and api_form.resources.gpus_per_node == 4


def test_submit_status_and_events(client: BrokerClient) -> None:
    handle = client.submit(small("sdk-basic", nodes=1, gpus_per_node=2))
    assert handle.id and handle.created is True
    job = handle.status()
    assert job.id == handle.id
    assert job.spec.name == "sdk-basic"
    assert job.spec.resources.gpus_per_node == 2
    assert job.phase == pb.JOB_PHASE_PENDING
    events = list(handle.events(follow=False))
    assert events and events[0].seq == 1
    assert client.job(handle.id).id == handle.id


def test_submit_is_idempotent_on_request_id(client: BrokerClient) -> None:
    rid = str(uuid.uuid4())
    first = client.submit(small("sdk-idem"), client_request_id=rid)
    second = client.submit(small("sdk-idem"), client_request_id=rid)
    assert first.created is True
    assert second.created is False
    assert second.id == first.id
    assert sum(1 for j in client.jobs(team=TEAM) if j.client_request_id == rid) == 1


def test_submit_accepts_raw_proto(client: BrokerClient) -> None:
    raw = pb.JobSpec(name="sdk-raw", team=TEAM, resources=pb.Resources(nodes=1, gpus_per_node=1),
                     trainer=pb.TrainerSpec(total_steps=5, checkpoint_every=5, model="tiny",
                                            global_batch_size=8))
    handle = client.submit(raw)
    assert handle.status().spec.name == "sdk-raw"
    # A raw spec skips the SDK's defaults; the broker still refuses what the trainer would.
    raw.trainer.global_batch_size = 0
    with pytest.raises(InvalidJobSpec) as err:
        client.submit(raw)
    assert "global_batch_size" in err.value.message


def test_wait_on_cancelled_job(client: BrokerClient) -> None:
    handle = client.submit(small("sdk-cancel"))
    handle.cancel("test")
    job = handle.wait(timeout=60)
    assert job.phase == pb.JOB_PHASE_CANCELLED
    # Cancelling a finished job is a precondition failure with the server's message.
    with pytest.raises(PreconditionFailed) as err:
        handle.cancel("again")
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.message


def test_wait_times_out_on_pending_job(client: BrokerClient) -> None:
    handle = client.submit(small("sdk-pending"))  # no agents: stays pending
    with pytest.raises(TimeoutError, match=handle.id):
        handle.wait(timeout=1.5, poll=0.2)
    handle.cancel("cleanup")


def test_list_jobs_pages(client: BrokerClient) -> None:
    ids = {client.submit(small(f"sdk-page-{i}")).id for i in range(3)}
    listed = {j.id for j in client.jobs(team=TEAM, page_size=2)}
    assert ids <= listed
    pending = list(client.jobs(team=TEAM, phases=["pending"]))
    assert all(j.phase == pb.JOB_PHASE_PENDING for j in pending)
    assert list(client.jobs(team=TEAM, limit=1)).__len__() == 1


def test_errors_carry_code_and_message(client: BrokerClient) -> None:
    with pytest.raises(JobNotFound) as err:
        client.job("j-does-not-exist")
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(InvalidJobSpec) as err2:
        client.submit(small("sdk-bad", gpus_per_node=0))
    assert err2.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "gpus_per_node" in err2.value.message


def test_teams_and_capacity_views(client: BrokerClient) -> None:
    q = client.set_team_quota("sdk-team", cohort="c", guaranteed={"h100": 8}, borrow_limit=4,
                              strategy="lend")
    assert q.team == "sdk-team" and q.quotas[0].guaranteed_gpus == 8
    assert any(t.team == "sdk-team" for t in client.teams())
    assert client.team("sdk-team").cohort == "c"
    assert isinstance(client.regions(), list)
    assert client.capacity().rows is not None


def test_broker_down_is_a_clear_error(dead_address: str) -> None:
    with BrokerClient(dead_address, timeout=2, retries=1) as c, pytest.raises(
        BrokerUnavailable
    ) as err:
        c.submit(small("nowhere"))
    assert dead_address in err.value.message
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


def test_wait_follows_the_watch_stream_until_cancelled(client: BrokerClient) -> None:
    """wait() blocks on WatchJob while the job is pending; a cancel from elsewhere ends it."""
    import threading

    handle = client.submit(small("sdk-wait-stream"))
    result: dict[str, object] = {}

    def waiter() -> None:
        try:
            result["job"] = handle.wait(timeout=120)
        except BaseException as e:  # surfaced by the assertion below
            result["error"] = e

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    # Cancel only once the waiter is inside wait(): the event stream must deliver it.
    events = handle.client.watch(handle.id, timeout=1)
    with pytest.raises(TimeoutError):
        list(events)  # the stream is open and quiet while pending
    client.cancel(handle.id, "from another client")
    t.join(timeout=120)
    assert not t.is_alive()
    assert "error" not in result, result.get("error")
    job = result["job"]
    assert isinstance(job, pb.Job) and job.phase == pb.JOB_PHASE_CANCELLED
    live = [e for e in handle.events(follow=True)]  # terminal: history then end of stream
    assert live[-1].to_phase == pb.JOB_PHASE_CANCELLED
