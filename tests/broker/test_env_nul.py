"""An environment value holding NUL is refused at submit with a clear error: no process
environment can hold one (execve ends the string there), so before this check the job
was accepted and then every launch of it failed on every agent."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, fast_config, spec


@pytest.fixture
def broker(tmp_path: Path):
    b = Broker(fast_config(tmp_path))
    yield b
    b.stop()


def test_env_value_with_nul_is_refused_and_nothing_is_stored(broker: Broker) -> None:
    before = list(broker.jobs.ListJobs(jpb.ListJobsRequest()).jobs)
    with pytest.raises(grpc.RpcError) as e:
        broker.jobs.SubmitJob(jpb.SubmitJobRequest(
            spec=spec("nul", env={"OK": "fine", "HF_TOKEN": "abc\x00def"})))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.env['HF_TOKEN']" in e.value.details() and "NUL" in e.value.details()
    assert list(broker.jobs.ListJobs(jpb.ListJobsRequest()).jobs) == before
