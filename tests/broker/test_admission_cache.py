"""The live scheduler decides on its admission cache exactly as a from-scratch pass would.

Two levels:

* Random sequences of what a broker sees between passes (submits, admissions turning
  into running jobs, preemptions and their victims going back to the queue, finished
  attempts, nodes turned unhealthy or cordoned *in place* in the agent's record as the
  registry does, agents disconnecting and coming back, quota changes, the clock
  crossing a training plan's start) are turned into snapshots by the live builder
  (``snapshot.build``) with its memos, and decided by ``LiveAdmission``; every pass
  must equal ``placement.schedule`` on a snapshot built without any memo.
* A real broker over gRPC with scripted agents, its scheduler loop checking every
  pass it runs against a from-scratch pass (``LiveAdmission(verify=True)``).
"""

from __future__ import annotations

import random

import pytest

import placement
from broker.agents.registry import AgentSession, AgentState
from broker.jobs import standby
from broker.jobs.lifecycle import CHECKPOINTING, PENDING, RUNNING, SUCCEEDED
from broker.scheduling import snapshot as snap
from broker.scheduling.admission import LiveAdmission
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from tests.broker.harness import Broker, spec, wait_until
from tests.placement.test_perf_equivalence import as_json

T0 = 1_800_000_000.0
PRIORITY = {"high": 100, "training": 50, "low": 10}
PLAN_START = T0 + 3 * 600 + 1  # crossed at the fourth step


def _agent(agent_id: str, region: str, nodes: list[pb.Node]) -> AgentState:
    rec = apb.Register(agent_id=agent_id, region=region, nodes=nodes)
    return AgentState(agent_id, rec, last_seen=T0, session=AgentSession(agent_id))


def _nodes(prefix: str, region: str, count: int, *, block: int = 4, **kw) -> list[pb.Node]:  # noqa: ANN003
    return [pb.Node(id=f"{prefix}-n{i:02d}", region=region, zone=f"{region}-az1", gpus=8, accelerator="h100",
                    instance_type="p5.48xlarge", healthy=True, network_layer_1="l1", network_layer_2="l2",
                    network_layer_3=f"{prefix}-b{i // block}",
                    capacity_type=kw.get("capacity_type", pb.CAPACITY_TYPE_ON_DEMAND), pool=kw.get("pool", ""),
                    price_per_gpu_hour=kw.get("price", 4.0))
            for i in range(count)]


def _fleet() -> list[AgentState]:
    west = _nodes("west", "us-west-2", 6, capacity_type=pb.CAPACITY_TYPE_SPOT, price=1.5)
    west += _nodes("plan", "us-west-2", 4, capacity_type=pb.CAPACITY_TYPE_TRAINING_PLAN, pool="tp1")
    return [_agent("east", "us-east-2", _nodes("east", "us-east-2", 12)),
            _agent("west", "us-west-2", west),
            _agent("eu", "eu-west-1", _nodes("eu", "eu-west-1", 6, price=4.6))]


def _quota(team: str, gpus: int, **kw) -> cpb.TeamQuota:  # noqa: ANN003
    return cpb.TeamQuota(team=team, cohort="c", quotas=[cpb.QuotaEntry(guaranteed_gpus=gpus)], **kw)


def _job(i: int, rng: random.Random, now: float) -> pb.Job:
    nodes = rng.choice([1, 1, 1, 2, 2, 4, 6])
    s = pb.JobSpec(name=f"j{i}", team=rng.choice(["ml", "cv", "nlp"]),
                   priority_class=rng.choice(list(PRIORITY)),
                   resources=pb.Resources(nodes=nodes, gpus_per_node=rng.choice([1, 4, 8]) if nodes == 1 else 8),
                   trainer=pb.TrainerSpec(total_steps=100, checkpoint_every=10, step_sleep_s=rng.choice([0, 6])),
                   expected_duration_s=rng.choice([0.0, 600.0, 7200.0]))
    if nodes >= 4 and rng.random() < 0.5:
        s.elasticity.min_nodes, s.elasticity.max_nodes = nodes // 2, nodes
    if nodes >= 2 and rng.random() < 0.4:
        s.topology.required = pb.TOPOLOGY_LEVEL_LAYER_3
    if rng.random() < 0.4:
        s.capacity_types.extend([pb.CAPACITY_TYPE_SPOT, pb.CAPACITY_TYPE_ON_DEMAND,
                                 pb.CAPACITY_TYPE_TRAINING_PLAN])
    if rng.random() < 0.2:
        s.dataset_region = "eu-west-1"
    return pb.Job(id=f"job-{i:04d}", spec=s, phase=PENDING, version=1, created_time=now + i * 1e-3)


def _bump(job: pb.Job) -> None:
    job.version += 1


def _run_sequence(seed: int, steps: int = 30, mbb: bool = False) -> tuple[dict[str, int], LiveAdmission,
                                                                          snap.NodeMemo]:
    """Counts of what happened (admitted, preempted, standbys reserved), the cache, the node memo."""
    rng = random.Random(seed)
    agents = _fleet()
    plans = [cpb.TrainingPlan(id="tp1", name="tp1", region="us-west-2", start_time=PLAN_START,
                              end_time=PLAN_START + 86400, instance_count=4)]
    teams = {"ml": _quota("ml", 64), "cv": _quota("cv", 48), "nlp": _quota("nlp", 32)}
    jobs: dict[str, pb.Job] = {}
    memo, node_memo, live = snap.SnapshotMemo(), snap.NodeMemo(), LiveAdmission()
    now, nxt = T0, 0
    counts = {"admitted": 0, "preempted": 0, "standbys": 0}
    for step in range(steps):
        for _ in range(rng.randint(1, 8)):  # submits
            j = _job(nxt, rng, now)
            jobs[j.id] = j
            nxt += 1
        kw = dict(now=now, agents=agents, jobs=list(jobs.values()), teams=list(teams.values()), plans=plans,
                  draining=[], priority_of=lambda s: PRIORITY[s.priority_class], make_before_break=mbb)
        cached = snap.build(**kw, memo=memo, node_memo=node_memo)
        scratch = snap.build(**kw)
        assert cached == scratch, f"seed {seed} step {step}: the memoised snapshot differs"
        got = live.decide(cached)
        want = placement.schedule(scratch)
        assert as_json(got) == as_json(want), f"seed {seed} step {step}: cached decisions differ"
        # Apply as the broker does: admissions run, victims stop and go back to the queue.
        for a in got.admissions:
            moving = standby.job_of(a.job_id)
            if moving is not None:  # make-before-break: the destination is reserved
                j = jobs[moving]
                j.standby.attempt = 2
                j.standby.placement.CopyFrom(pb.Placement(agent_id=a.agent_id, region=a.region, nodes=[
                    pb.NodeAssignment(node_id=n, gpus=g) for n, g in a.assignments]))
                _bump(j)
                counts["standbys"] += 1
                continue
            j = jobs[a.job_id]
            j.phase = RUNNING
            j.placement.CopyFrom(pb.Placement(agent_id=a.agent_id, region=a.region, nodes=[
                pb.NodeAssignment(node_id=n, gpus=g) for n, g in a.assignments]))
            j.attempt_started_time = now
            _bump(j)
            counts["admitted"] += 1
        for p in got.preemptions:
            j = jobs[p.job_id]
            j.phase, j.stop_reason = CHECKPOINTING, "preempt"
            _bump(j)
            counts["preempted"] += 1
        for j in list(jobs.values()):
            if j.HasField("standby") and rng.random() < 0.5:  # the source saved: the standby goes
                j.phase, j.stop_reason = RUNNING, ""
                j.placement.CopyFrom(j.standby.placement)
                j.ClearField("standby")
                _bump(j)
            elif mbb and j.phase == RUNNING and rng.random() < 0.05:  # a move starts (drain, migrate)
                j.phase, j.stop_reason = CHECKPOINTING, rng.choice(["drain", "migrate"])
                _bump(j)
        for j in list(jobs.values()):  # last pass's victims have checkpointed
            if j.phase == CHECKPOINTING and not j.HasField("standby") and j.version > 2 and rng.random() < 0.7:
                j.phase, j.stop_reason = PENDING, ""
                j.ClearField("placement")
                _bump(j)
        running = sorted(j.id for j in jobs.values() if j.phase == RUNNING)
        for jid in rng.sample(running, k=min(len(running), rng.randint(0, 3))):  # attempts finish
            jobs[jid].phase = SUCCEEDED
            _bump(jobs[jid])
        roll = rng.random()  # the fleet and the operators
        agent = rng.choice(agents)
        node = rng.choice(agent.record.nodes)
        if roll < 0.15:
            node.healthy = not node.healthy  # in place, as AgentRegistry.update_nodes does
        elif roll < 0.25:
            node.cordoned = not node.cordoned
        elif roll < 0.33:
            agent.session = None if agent.session is not None else AgentSession(agent.agent_id)
        elif roll < 0.40:
            t = rng.choice(sorted(teams))
            teams[t] = _quota(t, rng.choice([16, 32, 64]))
        elif roll < 0.45:
            j = rng.choice(list(jobs.values()))
            j.spec.priority_class = rng.choice(list(PRIORITY))
            _bump(j)
        now += 600
    return counts, live, node_memo


@pytest.mark.parametrize("seed,mbb", [(1, False), (2, False), (3, True), (4, True)])
def test_live_admission_cache_decides_like_a_from_scratch_pass(seed: int, mbb: bool) -> None:
    """Make-before-break adds standby requests and reserved standbys holding GPUs."""
    counts, live, node_memo = _run_sequence(seed, mbb=mbb)
    assert counts["admitted"] > 0
    st = live.stats
    assert not st.from_scratch, st.from_scratch  # the cache decided every pass itself
    assert 1 <= st.index_rebuilds < st.passes  # rebuilt on fleet changes, kept otherwise
    assert st.running_changes > 0
    assert node_memo.builds < st.passes  # an unchanged fleet is not converted again


def test_sequences_preempt_reserve_standbys_and_cross_the_plan_start() -> None:
    assert sum(_run_sequence(seed)[0]["preempted"] for seed in (1, 2, 3, 4)) > 0
    assert sum(_run_sequence(seed, mbb=True)[0]["standbys"] for seed in (3, 4)) > 0
    assert T0 < PLAN_START < T0 + 30 * 600


def test_a_duplicate_running_id_is_decided_from_scratch() -> None:
    node = placement.NodeInfo(id="n1", agent_id="a", region="r", zone="z", gpus=8)
    r = placement.RunningJob(id="x", team="t", priority=1, allocations=(("n1", 4),))
    s = placement.Snapshot(now=T0, nodes=(node,), running=(r, r), pending=(
        placement.JobRequest(id="p", team="t", priority=1, nodes=1, gpus_per_node=4),))
    live = LiveAdmission()
    got = live.decide(s)
    assert as_json(got) == as_json(placement.schedule(s))
    assert live.stats.from_scratch


def test_the_live_loop_checks_every_pass_against_scratch(broker: Broker, make_agent) -> None:  # noqa: ANN001
    """A real broker: submits, launches, a finished attempt, a node reported unhealthy,
    an agent lost and back. Every pass the loop runs is also decided from scratch."""
    loop = broker.server.scheduler
    assert loop is not None
    loop.admission.verify = True
    broker.team(gpus=64)
    east = make_agent("us-east-2", nodes=4)
    west = make_agent("us-west-2", nodes=2)
    ids = [broker.submit(spec(f"j{i}", gpus=8 if i % 2 else 4)).id for i in range(6)]
    launched = {}
    for jid in ids:
        launched[jid] = wait_until(lambda jid=jid: next((a for a in (east, west) if a.commands("launch", jid)), None),
                                   30, f"a launch of {jid}")
    for jid, agent in launched.items():
        agent.update(jid, 1, apb.ATTEMPT_STATE_RUNNING, step=1)
    first = ids[0]
    broker.wait_phase(first, pb.JOB_PHASE_RUNNING)
    launched[first].update(first, 1, apb.ATTEMPT_STATE_SUCCEEDED, step=100)
    broker.wait_phase(first, pb.JOB_PHASE_SUCCEEDED)
    more = [broker.submit(spec(f"k{i}", gpus=8)).id for i in range(4)]
    registry = loop.ops.agents
    west.close()  # its nodes leave the snapshot: the index is rebuilt
    wait_until(lambda: not registry.get(west.agent_id).connected, 30, "the broker to see the agent go")
    passes = loop.passes
    wait_until(lambda: loop.passes > passes + 2, 30, "passes after the agent left")
    west.connect()
    wait_until(lambda: registry.get(west.agent_id).connected, 30, "the broker to see the agent back")
    passes = loop.passes
    wait_until(lambda: loop.passes > passes + 2, 30, "passes after the agent came back")
    assert loop.admission.mismatches == []
    st = loop.admission.stats
    assert st.passes >= 5 and not st.from_scratch
    assert st.index_rebuilds >= 3  # the first build, the agent gone, the agent back
    assert st.index_rebuilds < st.passes
    assert all(broker.get(j).phase != pb.JOB_PHASE_FAILED for j in ids + more)
