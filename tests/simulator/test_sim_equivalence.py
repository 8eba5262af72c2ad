"""The simulator and the live broker decide the same on the same state.

Mid-run, the simulator's incremental snapshot and the live builder
(``broker.scheduling.snapshot.build`` over connected AgentStates, the stored jobs, the
TeamQuota records) go through ``placement.schedule``: identical admissions, preemptions,
reservations and pending reasons.

Stop plans: the same trigger on the same job goes through the live broker's path
(``JobOps.trigger`` / ``JobOps.attempt_lost`` on a real Applier over an in-memory SQLite
store, with the job's agent registered and connected) and through the simulator's
(``Simulation.trigger`` / ``Simulation.lost``): both plan with ``recovery.plan_stop``
and apply ``transitions.request_stop`` / ``attempt_lost``, and must give the same
StopPlan (read back from what each path did: the Stop sent to the agent and the job
written) and the same job record, for every trigger kind and every simulated policy.
"""

from __future__ import annotations

import copy

import pytest

import placement
from broker.agents.registry import AgentRegistry
from broker.jobs.applier import Applier
from broker.jobs.causes import Cause, StopKind
from broker.jobs.hub import EventHub
from broker.jobs.lifecycle import HOLDING, RUNNING
from broker.jobs.ops import JobOps
from broker.jobs.outcome import Outcome, SendStop
from broker.jobs.recovery import Signal, StopPlan, Trigger
from broker.store import open_store
from broker.telemetry import BrokerTelemetry
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from simulator import fleet
from simulator.engine import T0, SimJob, Simulation
from simulator.policies import PolicyKind
from tests.simulator.helpers import busy_scenario, random_rows

ROWS = random_rows(220)


def _sim_at(tmp_path, policy: PolicyKind, t: float):
    import yaml

    from simulator.engine import Simulation
    from simulator.policies import TABLE
    from simulator.scenario import parse
    from simulator.trace import load
    from tests.simulator.helpers import write_trace

    trace = load(write_trace(tmp_path / "t.csv", ROWS))
    sim = Simulation(parse(yaml.safe_load(yaml.safe_dump(busy_scenario()))), trace, TABLE[policy], 1, check=True)
    sim.start()
    sim.advance(until=T0 + t)
    return sim


def _canon(d: placement.Decisions):
    return (sorted(d.admissions, key=lambda a: a.job_id), sorted(d.preemptions, key=lambda p: p.job_id),
            sorted(d.reservations, key=lambda r: r.job_id), dict(sorted(d.pending_reasons.items())))


@pytest.mark.parametrize("policy", [PolicyKind.OURS, PolicyKind.STATIC, PolicyKind.FAILOVER])
@pytest.mark.parametrize("t", [6 * 3600.0, 9 * 3600.0])
def test_same_snapshot_same_decisions(tmp_path, policy, t):
    sim = _sim_at(tmp_path, policy, t)
    assert sim.queued or sim.holding, "the scenario must be busy at this time"
    fast, live = sim.snapshot(), sim.live_snapshot()
    assert sorted(fast.nodes, key=lambda n: n.id) == sorted(live.nodes, key=lambda n: n.id)
    assert sorted(fast.running, key=lambda r: r.id) == sorted(live.running, key=lambda r: r.id)
    assert sorted(fast.pending, key=lambda r: r.id) == sorted(live.pending, key=lambda r: r.id)
    assert sorted(fast.teams, key=lambda q: q.team) == sorted(live.teams, key=lambda q: q.team)
    a, b = placement.schedule(fast), placement.schedule(live)
    assert _canon(a) == _canon(b)
    assert a.admissions or a.preemptions or a.pending_reasons


# Every trigger a servicer or the scheduler turns into a stop, with what the observer
# would know about this job (its nodes, a reclaim deadline, the time left on a plan).
STOP_TRIGGERS = (Trigger.SPOT_NOTICE, Trigger.PLAN_ENDING, Trigger.REGION_DRAIN, Trigger.NODE_UNHEALTHY,
                 Trigger.DEFRAGMENT, Trigger.BETTER_CAPACITY, Trigger.PREEMPTED, Trigger.HANG,
                 Trigger.GROW_BACK)
LOSS_TRIGGERS = (Trigger.AGENT_LOST, Trigger.ATTEMPT_MISSING, Trigger.LAUNCH_REFUSED)


def _signal(trigger: Trigger, sj: SimJob, now: float) -> Signal:
    nodes = tuple(sorted(n for n, _ in sj.alloc))
    return {
        Trigger.SPOT_NOTICE: Signal(trigger, nodes=nodes[:1], deadline=now + 120.0),
        Trigger.PLAN_ENDING: Signal(trigger, nodes=nodes, seconds_left=300.0),
        Trigger.NODE_UNHEALTHY: Signal(trigger, nodes=nodes[:1]),
        Trigger.DEFRAGMENT: Signal(trigger, nodes=nodes),
        Trigger.PREEMPTED: Signal(trigger, cause=Cause.RECLAIM_LENT_QUOTA),
        Trigger.HANG: Signal(trigger, nodes=nodes),
    }.get(trigger, Signal(trigger))


class Live:
    """The live broker's job path: a real Applier and JobOps over an in-memory SQLite
    store, every region's agent registered with its nodes and connected (its session
    queue is what the Connect stream would send)."""

    def __init__(self, sim: Simulation) -> None:
        self.store = open_store("sqlite:///:memory:")
        self.agents = AgentRegistry(self.store, clock=lambda: sim.now)
        self.sessions = {}
        for r in sim.scn.regions:
            nodes = [sim.node[n].node for n in sorted(sim.node) if sim.node[n].region.name == r.name]
            _, self.sessions[fleet.agent_of(r.name)] = self.agents.register(
                apb.Register(agent_id=fleet.agent_of(r.name), region=r.name, nodes=nodes))
        applier = Applier(self.store, EventHub(), self.agents, BrokerTelemetry(), sim.cfg, clock=lambda: sim.now)
        self.ops = JobOps(applier)

    def put(self, job: pb.Job) -> None:
        j = pb.Job()
        j.CopyFrom(job)
        j.ClearField("version")
        self.store.create_job(j, [])

    def sent_stops(self, agent_id: str) -> list[apb.Stop]:
        q, out = self.sessions[agent_id].out, []
        while not q.empty():
            msg = q.get_nowait()
            if msg is not None and msg.HasField("stop"):
                out.append(msg.stop)
        return out


def _plan(before: pb.Job, after: pb.Job, stop: tuple[str, int, bool, float]) -> StopPlan:
    """The StopPlan a path applied, read back from what it did: the Stop it sent
    (kind, checkpoint first, grace), the cause its move records, the nodes it added
    to the job's exclusions."""
    wire, _, ckpt, grace = stop
    kind = next(k for k in StopKind if k.wire == wire)
    cause = Cause(after.migrations[-1].cause) if after.migrations else Cause(after.requeue_cause)
    excluded = tuple(n for n in after.excluded_nodes if n not in before.excluded_nodes)
    return StopPlan(kind, cause, ckpt, grace, excluded)


def _canon_job(job: pb.Job, rotated: bool) -> pb.Job:
    j = pb.Job()
    j.CopyFrom(job)
    j.ClearField("version")
    if rotated:  # skypilot-failover also puts the next region first (a simulated policy choice)
        del j.spec.preferred_regions[:]
    return j


def _capture(sim: Simulation) -> list[Outcome]:
    seen: list[Outcome] = []
    real = sim.apply

    def apply(sj: SimJob, out: Outcome | None) -> bool:
        if out is not None:
            seen.append(out)
        return real(sj, out)

    sim.apply = apply  # type: ignore[method-assign]
    return seen


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> dict[PolicyKind, Simulation]:
    """Every simulated policy, advanced to a busy moment (6 h in), once for the module."""
    return {k: _sim_at(tmp_path_factory.mktemp(k.value), k, 6 * 3600.0) for k in PolicyKind}


def _holding(sim: Simulation) -> list[SimJob]:
    return [sim.sj[i] for i in sorted(sim.holding) if sim.sj[i].job.phase in HOLDING and not sim.sj[i].job.stop_reason]


@pytest.mark.parametrize("trigger", STOP_TRIGGERS, ids=lambda t: t.value)
@pytest.mark.parametrize("policy", list(PolicyKind), ids=lambda k: k.value)
def test_same_trigger_same_stop_plan(sims, policy, trigger):
    sim = copy.deepcopy(sims[policy])
    live = Live(sim)
    holding = _holding(sim)
    assert any(sj.job.phase == RUNNING for sj in holding), "need running jobs (checkpoint-first stops)"
    if trigger is Trigger.NODE_UNHEALTHY:
        # Only elastic jobs move off a sick node: make half of them elastic (the same
        # spec on both paths), so both the "stop" and the "leave it" answers are compared.
        for sj in holding[::2]:
            sj.job.spec.elasticity.min_nodes, sj.job.spec.elasticity.max_nodes = 1, sj.nodes + 1
    seen = _capture(sim)
    planned = 0
    for sj in holding:
        sim._note_checkpoint(sj)  # the simulated agent's last periodic report, as the live broker has it
        before = _canon_job(sj.job, False)
        live.put(before)
        sig = _signal(trigger, sj, sim.now)
        agent = sj.job.placement.agent_id

        live_job = live.ops.trigger(sj.tj.id, sig, actor="sim", message=trigger.value)
        n = len(seen)
        acted = sim.trigger(sj, sig)
        assert acted == (live_job is not None), (sj.tj.id, trigger)
        if live_job is None:
            assert live.sent_stops(agent) == [] and len(seen) == n
            continue
        planned += 1
        (out,) = seen[n:]
        (cmd,) = [c for c in out.commands if isinstance(c, SendStop)]
        (stop,) = live.sent_stops(agent)
        sim_stop = (cmd.kind.wire, cmd.attempt, cmd.checkpoint_first, cmd.grace_s)
        live_stop = (stop.reason, stop.attempt, stop.checkpoint_first, stop.grace_s)
        assert sim_stop == live_stop, (sj.tj.id, trigger)
        assert _plan(before, out.job, sim_stop) == _plan(before, live_job, live_stop)
        rotated = sim.policy.rotate_region_on_failure
        assert _canon_job(out.job, rotated) == _canon_job(live_job, rotated), (sj.tj.id, trigger)
    no_move = sim.policy.recovery.name == "no-migration" or sim.policy.recovery.name == "failover"
    if no_move and trigger in (Trigger.DEFRAGMENT, Trigger.BETTER_CAPACITY, Trigger.GROW_BACK):
        assert planned == 0  # policies without migration never move a job proactively (nor grow one)
    else:
        assert planned > 0, "the trigger must stop some job on both paths"


@pytest.mark.parametrize("trigger", LOSS_TRIGGERS, ids=lambda t: t.value)
@pytest.mark.parametrize("policy", [PolicyKind.OURS, PolicyKind.FAILOVER, PolicyKind.NO_MIGRATION],
                         ids=lambda k: k.value)
def test_same_loss_same_relaunch(sims, policy, trigger):
    """An attempt lost (agent gone, attempt missing, launch refused): the same plan and
    the same requeued job through ``JobOps.attempt_lost`` and ``Simulation.lost``."""
    sim = copy.deepcopy(sims[policy])
    live = Live(sim)
    holding = _holding(sim)
    assert holding
    seen = _capture(sim)
    for sj in holding:
        sim._note_checkpoint(sj)
        live.put(_canon_job(sj.job, False))
        agent = sj.job.placement.agent_id
        live_out = live.ops.attempt_lost(sj.tj.id, agent, trigger, message=Cause.SPOT_INTERRUPTION.text)
        n = len(seen)
        sim.lost(sj, trigger, Cause.SPOT_INTERRUPTION)
        assert live_out is not None
        (out,) = seen[n:]
        assert out.job.phase == live_out.job.phase and out.job.requeue_cause == live_out.job.requeue_cause
        assert _canon_job(out.job, False) == _canon_job(live_out.job, False), (sj.tj.id, trigger)
