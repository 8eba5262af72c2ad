"""Which Kubernetes attempts a pass by time looks at (``KubernetesExecutor._due_by_time``).

The pod watch wakes a pass over the attempts whose pods changed; every second a pass
looks only at attempts whose state time alone can change. An attempt missing from that
set would wait for the 30 s pass over everything (a hang, a vanished node's pod, an end
waiting for its logs, progress held back by the rate limit, reported that much later)."""

from __future__ import annotations

from concurrent.futures import Future

from computebroker.v1 import common_pb2 as pb
from region_agents.executors.base import AttemptSpec
from region_agents.executors.kubernetes import KubernetesExecutor, _K8sAttempt
from region_agents.progress import ProgressSnapshot

NOW = 1_000_000.0


def attempt(**kw: object) -> _K8sAttempt:
    spec = AttemptSpec(job_id="j-1", attempt=1, spec=pb.JobSpec(name="x"), placement=pb.Placement())
    att = _K8sAttempt(spec=spec, name="cb-j-1-a1", expected=2, state=1)
    for k, v in kw.items():
        setattr(att, k, v)
    return att


def due(att: _K8sAttempt) -> bool:
    return KubernetesExecutor._due_by_time(att, NOW)


def test_a_quiet_running_attempt_is_not_looked_at() -> None:
    assert not due(attempt(running_since=NOW - 100, hang_timeout_s=600.0))
    # running for longer than the hang timeout, but the trainer's heartbeat is fresh
    beat = ProgressSnapshot.__new__(ProgressSnapshot)
    object.__setattr__(beat, "heartbeat", NOW - 5)
    assert not due(attempt(running_since=NOW - 1000, hang_timeout_s=600.0, last=beat))
    object.__setattr__(beat, "heartbeat", NOW - 700)
    assert due(attempt(running_since=NOW - 1000, hang_timeout_s=600.0, last=beat))
    assert not due(attempt(running_since=NOW - 100, hang_timeout_s=0.0))


def test_what_time_alone_changes_is_looked_at() -> None:
    assert due(attempt(running_since=NOW - 601, hang_timeout_s=600.0))  # hung
    assert due(attempt(stop_mode="checkpoint"))  # pods may still be saving
    assert due(attempt(failure=(1, "crashed", [])))  # the gang's pods end
    assert due(attempt(drain_since=NOW - 1))  # its end waits for the pods' logs
    assert due(attempt(ends_by_time=True))  # a pod deleted on a node that may be gone
    assert due(attempt(progress_unsent=True))  # held back by the rate limit


def test_an_attempt_being_created_is_left_to_its_creator() -> None:
    assert not due(attempt(created=Future(), stop_mode="kill", running_since=NOW - 601))
