"""Pure builders for transition tests: jobs in a given phase, made by the transitions
themselves (so every field a real job would have is set), and the inputs to apply."""

from __future__ import annotations

from typing import Any

import placement
from broker.config import BrokerConfig
from broker.jobs import transitions as t
from broker.jobs import updates
from broker.jobs.outcome import Outcome
from broker.jobs.recovery import RecoveryPolicy, Signal, Trigger
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

AGENT = "us-east-2-a"
CFG = BrokerConfig(store="sqlite:///:memory:", max_restarts=2, preempt_grace_s=60.0,
                   stop_timeout_s=30.0, cancel_timeout_s=30.0, checkpoint_root="s3://root")


def spec(nodes: int = 1, elastic: tuple[int, int] | None = None, **labels: str) -> pb.JobSpec:
    s = pb.JobSpec(name="j", team="ml", resources=pb.Resources(nodes=nodes, gpus_per_node=8))
    if elastic:
        s.elasticity.min_nodes, s.elasticity.max_nodes = elastic
    for k, v in labels.items():
        s.labels[k.replace("_", "-")] = v
    return s


def submitted(s: pb.JobSpec | None = None, now: float = 100.0) -> pb.Job:
    return t.submit(t.Submit(job_id="j-1", spec=s or spec(), client_request_id="", actor="user",
                             regions_known=True), now, CFG).job


def admission(nodes: int = 1, agent: str = AGENT) -> t.Admit:
    adm = placement.Admission(job_id="j-1", agent_id=agent, region="us-east-2",
                              assignments=tuple((f"n{i}", 8) for i in range(nodes)))
    return t.Admit(admission=adm, nodes={}, checkpoint_bucket="s3://cb-us-east-2")


def update(job: pb.Job, state: int, *, step: int = 0, ckpt: int = 0, exit_code: int = 0,
           failed: tuple[str, ...] = (), agent: str = AGENT, attempt: int | None = None) -> updates.AgentUpdate:
    u = apb.JobUpdate(job_id=job.id, attempt=job.attempt if attempt is None else attempt, state=state,
                      exit_code=exit_code, failed_nodes=list(failed))
    if step or ckpt:
        u.progress.step = step
        u.progress.total_steps = 100
        if ckpt:
            u.progress.last_checkpoint_step = ckpt
            u.progress.last_checkpoint_uri = f"s3://cb/jobs/{job.id}/attempt-{job.attempt}/step-{ckpt}"
    return updates.AgentUpdate(agent_id=agent, update=u)


def stop(trigger: Trigger, job: pb.Job, now: float, **kw: Any) -> t.StopRequest:
    plan = RecoveryPolicy().plan(Signal(trigger, **kw), job, CFG, now)
    assert plan is not None
    return t.StopRequest(plan=plan, actor="test", message=f"{trigger.value}")


def must(out: Outcome | None) -> pb.Job:
    assert out is not None
    return out.job


def launching(now: float = 110.0, s: pb.JobSpec | None = None) -> pb.Job:
    return must(t.admit(submitted(s), admission(), now, CFG))


def running(now: float = 120.0, s: pb.JobSpec | None = None) -> pb.Job:
    j = launching(now - 10, s)
    return must(updates.progress(j, update(j, apb.ATTEMPT_STATE_RUNNING, step=1), now, CFG))


def checkpointing(now: float = 130.0, trigger: Trigger = Trigger.SPOT_NOTICE) -> pb.Job:
    j = running(now - 10)
    return must(t.request_stop(j, stop(trigger, j, now), now, CFG))


def migrating(now: float = 140.0) -> pb.Job:
    j = checkpointing(now - 10)
    return must(updates.attempt_ended(j, update(j, apb.ATTEMPT_STATE_CHECKPOINTED, step=5, ckpt=5),
                                      now, CFG))
