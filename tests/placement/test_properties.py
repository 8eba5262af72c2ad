"""Property tests (hypothesis): no GPU double-allocated, `required` never violated,
guarantees always reclaimable, deterministic under input shuffling."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement import (
    CapacityType,
    JobRequest,
    NodeInfo,
    RunningJob,
    Snapshot,
    TeamQuota,
    TopologyLevel,
    schedule,
)
from placement.scheduler import safe_point_s

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LEVELS = [TopologyLevel.NONE, TopologyLevel.ULTRASERVER, TopologyLevel.LAYER_3, TopologyLevel.LAYER_2,
          TopologyLevel.LAYER_1, TopologyLevel.ZONE, TopologyLevel.REGION]
TEAMS = ["A", "B", "C"]


@st.composite
def snapshots(draw):
    nodes = []
    for a in range(draw(st.integers(1, 3))):
        for i in range(draw(st.integers(1, 14))):
            us = draw(st.sampled_from(["", "", f"us{a}-{i // 4}"]))
            nodes.append(NodeInfo(
                id=f"a{a}-n{i}", agent_id=f"a{a}", region=f"r{a % 2}", zone=f"z{i % 2}",
                gpus=4 if us else 8, layer1=f"l1-{i // 8}", layer2=f"l2-{i // 4}", layer3=f"l3-{i // 3}",
                ultraserver=us,
                capacity_type=draw(st.sampled_from([CapacityType.ON_DEMAND, CapacityType.SPOT,
                                                    CapacityType.RESERVED])),
                healthy=draw(st.booleans()) or draw(st.booleans()),
            ))
            if draw(st.integers(0, 4)) == 0:  # a training-plan node with some window
                start = draw(st.sampled_from([None, 0.0, 500.0, 2000.0, 5000.0]))
                end = draw(st.sampled_from([None, 900.0, 2500.0, 9000.0]))
                nodes[-1] = replace(nodes[-1], capacity_type=CapacityType.TRAINING_PLAN, plan_start=start,
                                    plan_end=end, available_before_plan=draw(st.booleans()))
    free = {n.id: n.gpus for n in nodes}
    running = []
    for k in range(draw(st.integers(0, 10))):
        n = draw(st.sampled_from(nodes))
        if free[n.id] == 0:
            continue
        g = draw(st.integers(1, free[n.id]))
        free[n.id] -= g
        running.append(RunningJob(id=f"r{k}", team=draw(st.sampled_from(TEAMS)), priority=draw(st.sampled_from([50, 70, 80, 100])),
                                  allocations=((n.id, g),), last_checkpoint_time=draw(st.floats(0, 1000))))
    pending = []
    for k in range(draw(st.integers(1, 12))):
        nn = draw(st.integers(1, 6))
        pending.append(JobRequest(
            id=f"j{k}", team=draw(st.sampled_from(TEAMS)), priority=draw(st.sampled_from([50, 70, 80, 100])),
            nodes=nn, gpus_per_node=draw(st.sampled_from([1, 2, 4, 8])),
            required=draw(st.sampled_from(LEVELS)), preferred=draw(st.sampled_from(LEVELS)),
            capacity_types=draw(st.sampled_from([frozenset(), frozenset({CapacityType.SPOT})])),
            min_nodes=draw(st.integers(0, nn)), submit_time=float(k),
            checkpoint_interval_s=draw(st.sampled_from([0.0, 300.0, 1200.0, 4000.0])),
            excluded_nodes=frozenset(draw(st.lists(st.sampled_from([n.id for n in nodes]), max_size=3))),
        ))
    teams = ()
    if draw(st.booleans()):
        teams = tuple(TeamQuota(team=t, cohort="c", guaranteed=(("", draw(st.integers(0, 64))),),
                                borrow_limit=draw(st.sampled_from([None, 8, 32])))
                      for t in TEAMS)
    return Snapshot(now=1000.0, nodes=tuple(nodes), running=tuple(running), pending=tuple(pending), teams=teams)


def domain_key(n: NodeInfo, level: TopologyLevel) -> tuple:
    path = (n.agent_id, n.zone, n.layer1, n.layer2, n.layer3, n.ultraserver)
    cut = {TopologyLevel.ULTRASERVER: 6, TopologyLevel.LAYER_3: 5, TopologyLevel.LAYER_2: 4,
           TopologyLevel.LAYER_1: 3, TopologyLevel.ZONE: 2}.get(level, 1)
    return path[:cut]


@SETTINGS
@given(snapshots())
def test_no_double_allocation_and_required_topology(s):
    d = schedule(s)
    nodes = {n.id: n for n in s.nodes}
    jobs = {j.id: j for j in s.pending}
    used = {n.id: 0 for n in s.nodes}
    for r in s.running:
        for nid, g in r.allocations:
            used[nid] += g
    for a in d.admissions:
        j = jobs[a.job_id]
        ns = [nodes[nid] for nid, _ in a.assignments]
        assert len({n.id for n in ns}) == len(ns)
        assert all(g == j.gpus_per_node for _, g in a.assignments)
        lo = j.min_nodes if 0 < j.min_nodes < j.nodes else j.nodes
        assert lo <= len(ns) <= j.nodes
        assert {n.agent_id for n in ns} == {a.agent_id}
        assert all(n.healthy and not n.cordoned for n in ns)
        if CapacityType.SPOT not in j.capacity_types:
            assert all(n.capacity_type != CapacityType.SPOT for n in ns)
        if len(ns) > 1 and j.required not in (TopologyLevel.NONE, TopologyLevel.REGION):
            assert len({domain_key(n, j.required) for n in ns}) == 1, (j.required, ns)
            if j.required == TopologyLevel.ULTRASERVER:
                assert ns[0].ultraserver
        assert not ({n.id for n in ns} & j.excluded_nodes)
        safe = safe_point_s(j)
        for n in ns:
            if n.plan_end is not None:
                assert s.now + safe <= n.plan_end
            if n.plan_start is not None and s.now < n.plan_start:
                assert n.available_before_plan and s.now + safe <= n.plan_start
        for nid, g in a.assignments:
            used[nid] += g
    assert all(used[n.id] <= n.gpus for n in s.nodes)
    reserved: dict[str, int] = {}
    for res in d.reservations:
        assert res.job_id in d.pending_reasons
        for nid, g in res.assignments:
            n = nodes[nid]
            assert n.plan_start is not None and n.plan_start > s.now and res.start_time == n.plan_start
            reserved[nid] = reserved.get(nid, 0) + g
            assert reserved[nid] <= n.gpus
    # every pending job not admitted has a reason
    assert set(jobs) == {a.job_id for a in d.admissions} | set(d.pending_reasons)


@SETTINGS
@given(snapshots(), st.randoms(use_true_random=False))
def test_deterministic_under_shuffled_inputs(s, rnd: random.Random):
    def shuffled(t):
        t = list(t)
        rnd.shuffle(t)
        return tuple(t)

    s2 = replace(s, nodes=shuffled(s.nodes), running=shuffled(s.running), pending=shuffled(s.pending),
                 teams=shuffled(s.teams))
    assert schedule(s) == schedule(s)
    assert schedule(s) == schedule(s2)


@st.composite
def governed(draw):
    """Uniform whole-node cluster whose size equals the sum of guarantees."""
    guar = {t: 8 * draw(st.integers(0, 3)) for t in TEAMS}
    total_nodes = sum(guar.values()) // 8
    nodes = [NodeInfo(id=f"n{i}", agent_id="a", region="r", zone="z", gpus=8) for i in range(total_nodes)]
    running = []
    for i, n in enumerate(nodes):
        if draw(st.booleans()):
            running.append(RunningJob(id=f"r{i}", team=draw(st.sampled_from(TEAMS)),
                                      priority=draw(st.sampled_from([50, 70, 100])), allocations=((n.id, 8),),
                                      last_checkpoint_time=float(draw(st.integers(0, 999)))))
    pending = [JobRequest(id=f"j{k}", team=draw(st.sampled_from(TEAMS)), priority=draw(st.sampled_from([50, 70, 100])),
                          nodes=draw(st.integers(1, 3)), gpus_per_node=8, submit_time=float(k))
               for k in range(draw(st.integers(1, 6)))]
    teams = tuple(TeamQuota(team=t, cohort="c", guaranteed=(("", g),)) for t, g in guar.items())
    return Snapshot(now=1000.0, nodes=tuple(nodes), running=tuple(running), pending=tuple(pending), teams=teams)


@SETTINGS
@given(governed())
def test_guaranteed_quota_is_always_reclaimable(s):
    d = schedule(s)
    guar = {t.team: t.guaranteed[0][1] for t in s.teams}
    used = {t: 0 for t in guar}
    for r in s.running:
        used[r.team] += r.gpus
    admitted = {a.job_id for a in d.admissions}
    waiting_for = {p.for_job_id for p in d.preemptions}
    first = {}
    for j in sorted(s.pending, key=lambda j: (-j.priority, j.submit_time, j.id)):
        first.setdefault(j.team, j)
    for team, j in first.items():
        if used[team] <= guar[team] and used[team] + j.gpus <= guar[team]:
            assert j.id in admitted or j.id in waiting_for, (j, d.pending_reasons.get(j.id))
