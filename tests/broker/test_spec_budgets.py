"""A job's restart budgets (max_node_failures, node_failure_window_s) are checked at
submit through the real broker: bad values are INVALID_ARGUMENT naming the field, the
value and the range, and nothing is stored; good ones are kept on the job; the SDK's
spec refuses what the wire cannot say (not an integer, a string, a bool)."""

from __future__ import annotations

import math

import grpc
import pytest

from brokersdk.errors import InvalidJobSpec
from brokersdk.spec import JobSpec
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, fast_config, spec


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    b = Broker(fast_config(tmp_path_factory.mktemp("budgets"), auto_create_teams=True))
    yield b
    b.stop()


@pytest.mark.parametrize(("field", "value", "words"), [
    ("max_node_failures", -1, "below the minimum 0"),
    ("max_node_failures", 10_001, "exceeds the maximum 10000"),
    ("max_node_failures", 2**31 - 1, "exceeds the maximum 10000"),
    ("node_failure_window_s", -5.0, "below the minimum 0"),
    ("node_failure_window_s", 1e12, "exceeds the maximum"),
    ("node_failure_window_s", math.nan, "must be finite"),
    ("node_failure_window_s", math.inf, "must be finite"),
])
def test_bad_budget_is_refused_and_nothing_stored(broker: Broker, field: str, value: float,
                                                  words: str) -> None:
    before = list(broker.jobs.ListJobs(jpb.ListJobsRequest()).jobs)
    s = spec("budget")
    setattr(s, field, value)
    with pytest.raises(grpc.RpcError) as e:
        broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=s))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.value.details() and words in e.value.details(), e.value.details()
    assert list(broker.jobs.ListJobs(jpb.ListJobsRequest()).jobs) == before


def test_good_budget_is_kept(broker: Broker) -> None:
    s = spec("budget-ok")
    s.max_node_failures, s.node_failure_window_s = 0, 0.0  # set to zero: not "unset"
    job = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=s)).job
    got = broker.jobs.GetJob(jpb.GetJobRequest(job_id=job.id))
    assert got.spec.HasField("max_node_failures") and got.spec.max_node_failures == 0
    assert got.spec.HasField("node_failure_window_s")
    other = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec("unset"))).job
    assert not broker.jobs.GetJob(jpb.GetJobRequest(job_id=other.id)).spec.HasField(
        "max_node_failures")


@pytest.mark.parametrize("value", [2.5, "3", True, math.inf, 1e400, -1, 10**12])
def test_sdk_refuses_a_bad_count(value: object) -> None:
    with pytest.raises(InvalidJobSpec, match="max_node_failures"):
        JobSpec.from_dict({"name": "x", "max_node_failures": value})


def test_api_form_refuses_a_fraction() -> None:
    with pytest.raises(InvalidJobSpec, match="max_node_failures|maxNodeFailures"):
        JobSpec.from_dict({"name": "x", "resources": {"nodes": 1, "gpusPerNode": 1},
                           "maxNodeFailures": 2.5})
