"""The applier: a lost compare-and-set re-runs the transition on the fresh job, and the
commands run once, only after the write committed (an in-memory SQLite store, a
recording agent registry; no sockets, no threads)."""

from __future__ import annotations

from typing import Any

from broker.jobs import transitions as t
from broker.jobs.applier import Applier
from broker.jobs.hub import EventHub
from broker.jobs.outcome import Outcome
from broker.jobs.recovery import Trigger
from broker.store import open_store
from broker.telemetry import BrokerTelemetry
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import CFG, running, stop


class Agents:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def send(self, agent_id: str, msg: Any, kind: str, job_id: str = "", attempt: int = 0) -> bool:
        self.sent.append((kind, msg))
        return True

    def get(self, agent_id: str) -> None:
        return None


def test_a_lost_race_reruns_the_transition_and_sends_once() -> None:
    store = open_store("sqlite:///:memory:")
    agents = Agents()
    hub = EventHub()
    applier = Applier(store, hub, agents, BrokerTelemetry(), CFG, clock=lambda: 500.0)  # type: ignore[arg-type]
    job = running()
    job.ClearField("version")
    store.create_job(job, [])
    calls: list[int] = []

    def step(current: pb.Job, now: float) -> Outcome | None:
        calls.append(current.version)
        if len(calls) == 1:  # someone else writes first: our CAS must lose
            other = pb.Job()
            other.CopyFrom(current)
            other.message = "written meanwhile"
            store.update_job(other, current.version, [])
            assert agents.sent == []  # nothing went out for the losing attempt
        return t.request_stop(current, stop(Trigger.REGION_DRAIN, current, now), now, CFG)

    out = applier.apply(job.id, step)
    assert out is not None and calls == [1, 2]
    assert out.job.version == 3 and out.job.message == "region_drain"
    assert [k for k, _ in agents.sent] == ["stop"]
    assert agents.sent[0][1].stop.checkpoint_first
    assert store.get_job(job.id).phase == pb.JOB_PHASE_CHECKPOINTING
    assert hub.counter(job.id) == 1
    assert applier.apply(job.id, step) is None  # already stopping: nothing written or sent
    assert len(agents.sent) == 1
