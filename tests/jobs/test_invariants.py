"""Property test: any sequence of inputs keeps the job's invariants.

- at most one live attempt: a Launch is only ever sent when every earlier attempt
  has ended, been killed, been fenced or been declared lost;
- attempt numbers only grow;
- terminal is terminal: nothing changes a finished job;
- goodput parts sum to wall time (plus the time in the current, uncharged phase);
- the recorded resume checkpoint never goes back (a superseded attempt's late end
  may move it forward, issue 15 defect 3).

Pure: the transitions are driven directly with a model of the agent; no broker.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.api.errors import FailedPrecondition
from broker.jobs import backoff, updates
from broker.jobs import transitions as t
from broker.jobs.lifecycle import TERMINAL
from broker.jobs.outcome import Outcome, SendLaunch, SendStop
from broker.jobs.recovery import Signal, Trigger, policy_for
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from tests.jobs.helpers import AGENT, CFG, admission, spec, submitted, update

ACTIONS = ["admit", "running", "progress", "checkpoint", "succeeded", "failed", "config_error", "launch_failed",
           "stopped", "checkpointed", "lost", "missing", "refused", "cancel", "cancel_offline", "timeout",
           "stale", "late_succeeded", "late_stopped", *[f"trigger:{tr.name}" for tr in Trigger if tr not in (
               Trigger.AGENT_LOST, Trigger.ATTEMPT_MISSING, Trigger.LAUNCH_REFUSED,
               Trigger.ATTEMPT_FAILED)]]


def step(job: pb.Job, action: str, now: float, ckpt: int) -> Outcome | None:
    S = apb
    if action == "admit":
        return t.admit(job, admission(), now, CFG)
    if action in ("running", "progress", "checkpoint"):
        u = update(job, S.ATTEMPT_STATE_RUNNING, step=ckpt + 1, ckpt=ckpt if action == "checkpoint" else 0)
        return updates.progress(job, u, now, CFG)
    ends = {"succeeded": (S.ATTEMPT_STATE_SUCCEEDED, 0), "failed": (S.ATTEMPT_STATE_FAILED, 1),
            "config_error": (S.ATTEMPT_STATE_FAILED, 2), "launch_failed": (S.ATTEMPT_STATE_FAILED, -1), "stopped": (S.ATTEMPT_STATE_STOPPED, 137),
            "checkpointed": (S.ATTEMPT_STATE_CHECKPOINTED, 75)}
    if action in ends:
        state, code = ends[action]
        return updates.attempt_ended(job, update(job, state, exit_code=code, step=ckpt, ckpt=ckpt), now, CFG)
    if action == "stale":
        return updates.attempt_ended(job, update(job, S.ATTEMPT_STATE_FAILED, exit_code=1,
                                                 attempt=job.attempt - 1), now, CFG)
    if action.startswith("late_"):  # the previous attempt's end, with its later checkpoint
        old = job.attempt - 1
        u = apb.JobUpdate(job_id=job.id, attempt=old, state=S.ATTEMPT_STATE_SUCCEEDED
                          if action == "late_succeeded" else S.ATTEMPT_STATE_STOPPED)
        done = 100 if action == "late_succeeded" else ckpt + 3
        u.progress.step, u.progress.total_steps = done, 100
        u.progress.last_checkpoint_step = done
        u.progress.last_checkpoint_uri = f"s3://cb/jobs/{job.id}/attempt-{old}/step-{done}"
        return updates.attempt_ended(job, updates.AgentUpdate(agent_id=AGENT, update=u), now, CFG)
    if action in ("lost", "missing", "refused"):
        trig = {"lost": Trigger.AGENT_LOST, "missing": Trigger.ATTEMPT_MISSING,
                "refused": Trigger.LAUNCH_REFUSED}[action]
        plan = policy_for(job, CFG).plan(Signal(trig), job, CFG, now)
        assert plan is not None
        return t.attempt_lost(job, t.AttemptLost(agent_id=AGENT, plan=plan, message="x",
                                                 reason="refused"), now, CFG)
    if action.startswith("cancel"):
        return t.cancel(job, t.Cancel(actor="u", reason="", agent_connected=action == "cancel"), now, CFG)
    if action == "timeout":
        return t.stop_timed_out(job, t.StopTimeout(job.attempt), now, CFG)
    trig = Trigger[action.split(":")[1]]
    plan = policy_for(job, CFG).plan(Signal(trig, nodes=("n0",), deadline=now + 60, seconds_left=60),
                                     job, CFG, now)
    if plan is None:
        return None
    return t.request_stop(job, t.StopRequest(plan=plan, actor="test", message="m"), now, CFG)


def charged(job: pb.Job, now: float) -> float:
    g = job.goodput
    parts = (g.productive_s + g.queued_s + g.starting_s + g.lost_failure_s + g.lost_preemption_s
             + g.lost_migration_s)
    return parts + (0.0 if job.phase in TERMINAL else max(0.0, now - job.phase_time))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ACTIONS), st.floats(0.0, 50.0), st.booleans()),
                max_size=40),
       st.booleans())
def test_any_input_sequence_keeps_the_invariants(seq: list[tuple[str, float, bool]], elastic: bool) -> None:
    now = 100.0
    job = submitted(spec(nodes=2, elastic=(1, 2) if elastic else None), now)
    live: set[int] = set()  # attempts the agent may still be running
    ckpt = 0
    for action, dt, _ in seq:
        now += dt
        if action == "checkpoint":
            ckpt += 5
        attempt_before = job.attempt
        was_terminal = job.phase in TERMINAL
        try:
            out = step(job, action, now, ckpt)
        except FailedPrecondition:
            assert was_terminal and action.startswith("cancel")
            continue
        if action in ("succeeded", "failed", "config_error", "launch_failed", "stopped", "checkpointed"):
            live.discard(job.attempt)  # the agent reported the attempt's end
        if out is None:
            continue
        assert not was_terminal, f"{action} changed a finished job"
        new = out.job
        assert new.attempt >= attempt_before
        assert new.progress.last_checkpoint_step >= job.progress.last_checkpoint_step
        if action in ("lost", "missing", "refused"):
            live.discard(attempt_before)
        for cmd in out.commands:
            if isinstance(cmd, SendLaunch):
                assert not live, f"launch of attempt {cmd.launch.attempt} while {live} still live"
                assert cmd.agent_id not in backoff.avoided_agents(job, now), "launch onto a refusing agent"
                live.add(cmd.launch.attempt)
            elif isinstance(cmd, SendStop) and not cmd.checkpoint_first:
                live.discard(cmd.attempt)  # killed or fenced
        assert math.isclose(charged(new, now), new.goodput.wall_s, abs_tol=1e-6), (action, new.goodput)
        assert new.goodput.wall_s == (new.finished_time or now) - new.created_time
        job = new
