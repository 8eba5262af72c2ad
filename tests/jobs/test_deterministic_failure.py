"""A failure no retry can fix (the program cannot even import) fails the job at once;
anything else is retried as before (broker/jobs/recovery.py ``deterministic_failure``)."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.jobs import updates
from broker.jobs.recovery import deterministic_failure
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

AGENT = "a"
TRACEBACK = """Traceback (most recent call last):
  File "/w/train.py", line 3, in <module>
    import flash_attn
ModuleNotFoundError: No module named 'flash_attn'
"""


@pytest.mark.parametrize("exit_code, message, want", [
    (1, TRACEBACK, "ModuleNotFoundError: No module named 'flash_attn'"),
    (1, "(rank 0) ImportError: cannot import name 'X' from 'y'", "ImportError: cannot import name 'X' from 'y'"),
    (1, '  File "t.py", line 1\n    def (:\nSyntaxError: invalid syntax', "SyntaxError: invalid syntax"),
    (1, "RuntimeError: NCCL timeout", ""),
    (1, "MyImportError: custom", ""),  # a name that merely ends like one
    (137, TRACEBACK, ""),  # killed: not the program's own exit
    (0, "", ""),
])
def test_which_failures_are_deterministic(exit_code: int, message: str, want: str) -> None:
    assert deterministic_failure(exit_code, message) == want


def running() -> pb.Job:
    return pb.Job(id="j-1", phase=pb.JOB_PHASE_RUNNING, attempt=1, created_time=1.0, phase_time=2.0,
                  spec=pb.JobSpec(name="r", team="ml", command=["python", "train.py"],
                                  resources=pb.Resources(nodes=1, gpus_per_node=1)),
                  placement=pb.Placement(region="r1", agent_id=AGENT, world_size=1))


def ended(message: str) -> pb.Job:
    u = apb.JobUpdate(job_id="j-1", attempt=1, state=apb.ATTEMPT_STATE_FAILED, exit_code=1,
                      message=message)
    out = updates.attempt_ended(running(), updates.AgentUpdate(agent_id=AGENT, update=u), 10.0,
                                BrokerConfig())
    assert out is not None
    return out.job


def test_an_import_error_fails_the_job_without_a_retry() -> None:
    job = ended(TRACEBACK)
    assert job.phase == pb.JOB_PHASE_FAILED and job.restarts == 0
    assert "deterministic error (ModuleNotFoundError" in job.message, job.message


def test_another_error_is_still_retried() -> None:
    job = ended("RuntimeError: NCCL watchdog timeout")
    assert job.phase != pb.JOB_PHASE_FAILED and job.restarts == 1, job
