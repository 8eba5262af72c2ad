"""Node failures: the fleet-scaled rate, the memory tier, spares, and how a job that lost a
node comes back -- decided by the live broker's code (``replacements.relaunch_lost``,
``RecoveryPolicy.relaunch`` and its ``RELAUNCH_RULES``, ``node_recovery.decide``), the
spares chosen by the live ``spares.reserved``.

Exact times: the failure is injected at a known time (the engine's own handler, as the
Poisson process would call it), everything else is the tiny scenario's exact arithmetic.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from broker.jobs.recovery import Blocker, Relaunch
from broker.scheduling import replacements
from simulator import failure_study
from simulator.engine import NODE_REPAIR, NODE_REPLACED, T0, Simulation
from simulator.node_recovery import NodeFailures, Tier
from simulator.policies import TABLE, PolicyKind
from simulator.scenario import ScenarioError, parse
from simulator.trace import load
from tests.simulator.helpers import jct, scenario, simulate, write_trace

IN_PLACE = Blocker.NONE.value


def _scn(nodes: int = 3, **nf) -> dict:  # noqa: ANN003
    # three 8-GPU nodes in one UltraServer / layer-3 block; a 16-GPU job (16 GB of state)
    s = scenario(regions=[{"name": "r1", "pools": [
        {"kind": "on_demand", "nodes": nodes, "price_per_gpu_hour": 2.0}]}],
        node_failures={"peer_gbps": 1.0, "rejoin_s": 20, "memory_snapshot_s": 60, **nf})
    return s


def _fail_at(tmp_path, scn: dict, t: float, which: int = 0, also_down: int | None = None,  # noqa: ANN001
             rows: list | None = None, policy: PolicyKind = PolicyKind.OURS, job: str = "g") -> Simulation:
    trace = write_trace(tmp_path / "trace.csv", rows or [("g", 0, 1000, 16, "t")])
    sim = Simulation(parse(yaml.safe_load(yaml.safe_dump(scn))), load(trace), TABLE[policy], 1, check=True)
    sim.start()
    sim.advance(until=T0 + t)
    nodes = [n for n, _ in sim.sj[job].alloc]
    if also_down is not None:  # a survivor is down already (back in an hour)
        sim._set_node(nodes[also_down], healthy=False)
        sim.push(sim.now + 3600, NODE_REPAIR, nodes[also_down])
    sim._node_fail(nodes[which])
    sim.advance()
    return sim


def test_memory_tier_and_a_spare_replace_in_place_losing_at_most_one_snapshot(tmp_path):
    # The spare is the pool's highest node id (the live choice); the job runs on the other
    # two from 10 (10 s start). Node fails at 400: the attempt fails, the pass at 400 asks
    # the policy: in place. Last snapshot at 360 s of running (370 wall), so 30 s of work
    # are lost; the spare joins (20 s) and reads the failed node's 8 GB shard from its
    # buddy at 1 GB/s (8 s): running again at 428 with 640 s of work left -> ends at 1068.
    sim = _fail_at(tmp_path, _scn(tier="memory", spares_per_pool=1), 400)
    j = sim.sj["g"]
    assert jct(sim, "g") == pytest.approx(1068)
    assert j.recoveries == {IN_PLACE: 1}
    assert j.lost[NODE_REPLACED] == pytest.approx((30 + 28) * 16)
    assert j.lost.get("auto_resume", 0.0) == pytest.approx(0.0)  # charged back when it resumed from memory
    rec = j.job.node_recovery
    assert rec.plan == Relaunch.REPLACE_IN_PLACE.value and dict(rec.replaced) == {
        rec.lost_nodes[0]: "r1-n0002"}
    assert j.job.attempt == 2  # relaunched on the survivors plus the spare


def test_store_tier_goes_back_through_the_queue(tmp_path):
    # No memory tier: RELAUNCH_RULES says from the store. The job is placed again in the
    # pass at 400 on the survivor and the third node (no spares reserved), resumes from the
    # periodic checkpoint (300 s of work): 16 s read + 10 s start, 700 s left -> 1126.
    sim = _fail_at(tmp_path, _scn(tier="store"), 400)
    j = sim.sj["g"]
    assert j.recoveries == {Blocker.MEMORY_TIER_OFF.value: 1}
    assert j.job.attempt == 2 and NODE_REPLACED not in j.lost
    assert jct(sim, "g") == pytest.approx(1126)


def test_memory_tier_without_a_reserved_spare_goes_through_the_queue(tmp_path):
    # An idle node is not a spare: only the pool's reserved spares replace in place (live
    # rule), so with none the job takes the store path (same times as the store tier).
    sim = _fail_at(tmp_path, _scn(tier="memory"), 400)
    assert sim.sj["g"].recoveries == {Blocker.NO_SPARE.value: 1}
    assert jct(sim, "g") == pytest.approx(1126)


def test_a_survivor_down_or_a_one_node_job_or_a_policy_without_spares_takes_the_store_path(tmp_path):
    # four nodes: one the spare, the failed one excluded by the job, two to run it again
    sim = _fail_at(tmp_path, _scn(4, tier="memory", spares_per_pool=1), 400, also_down=1)
    assert sim.sj["g"].recoveries == {Blocker.SURVIVOR_GONE.value: 1} and sim.sj["g"].ended
    one = _fail_at(tmp_path, _scn(tier="memory", spares_per_pool=1), 400, rows=[("s", 0, 1000, 8, "t")],
                   job="s")
    assert one.sj["s"].recoveries == {Blocker.ALL_NODES_LOST.value: 1}
    fo = _fail_at(tmp_path, _scn(4, tier="memory", spares_per_pool=1), 400, policy=PolicyKind.FAILOVER)
    assert fo.sj["g"].recoveries == {Blocker.POLICY.value: 1}


def test_a_survivor_is_never_its_own_spare(tmp_path):
    # The pool's spare (n2) is down; then n0 fails under the gang. Its survivor n1 is the
    # only free healthy node, but a job waiting for its relaunch plan holds its nodes: no
    # spare, so the job takes the store path (before, the survivor was offered as the
    # spare of its own lost node and the node was allocated twice).
    scn = _scn(tier="memory", spares_per_pool=1)
    trace = write_trace(tmp_path / "trace.csv", [("g", 0, 1000, 16, "t")])
    sim = Simulation(parse(yaml.safe_load(yaml.safe_dump(scn))), load(trace), TABLE[PolicyKind.OURS], 1,
                     check=True)
    sim.start()
    sim.advance(until=T0 + 100)
    assert {n for n, _ in sim.sj["g"].alloc} == {"r1-n0000", "r1-n0001"}
    sim._node_fail("r1-n0002")
    sim.advance(until=T0 + 400)
    sim._node_fail("r1-n0000")
    sim.advance()
    assert sim.sj["g"].recoveries == {Blocker.NO_SPARE.value: 1} and sim.sj["g"].ended


def test_the_spare_is_the_live_brokers_and_is_never_scheduled(tmp_path):
    scn = _scn(tier="memory", spares_per_pool=1)
    trace = write_trace(tmp_path / "trace.csv", [("g", 0, 1000, 16, "t"), ("late", 5, 100, 8, "t")])
    sim = Simulation(parse(yaml.safe_load(yaml.safe_dump(scn))), load(trace), TABLE[PolicyKind.OURS], 1,
                     check=True)
    sim.start()
    sim.advance(until=T0 + 100)
    snap, live = sim.snapshot(), sim.live_snapshot()
    assert snap.spares == live.spares == frozenset({"r1-n0002"})
    assert sorted(snap.nodes, key=lambda n: n.id) == sorted(live.nodes, key=lambda n: n.id)
    assert "r1-n0002" not in {n for sj in sim.holding.values() for n, _ in sj.alloc}
    assert "late" in sim.queued  # 8 free GPUs exist, but they are the spare's
    sim.advance()
    assert sim.sj["late"].ended and sim.sj["late"].finish_t >= 1010  # after g freed its nodes


def test_the_simulators_relaunch_plans_are_the_live_brokers(tmp_path):
    """At every pass with jobs that lost nodes, the plans the simulation applied equal the
    ones ``relaunch_lost`` gives on the live builder's snapshot of the same state (agents
    registering their nodes and spares, the jobs as stored)."""
    from tests.simulator.helpers import busy_scenario, random_rows

    scn = busy_scenario()
    scn["node_failures"] = {"mttf_h_per_16k_gpus": 0.02, "tier": "memory", "spares_per_pool": 1}
    trace = write_trace(tmp_path / "trace.csv", random_rows(150))
    sim = Simulation(parse(yaml.safe_load(yaml.safe_dump(scn))), load(trace), TABLE[PolicyKind.OURS], 1,
                     check=True)
    compared, kinds = 0, set()
    real = sim._relaunch_lost
    applied = {}
    apply_plan = sim.relaunch_after_node_loss

    def recorded(job_id, plan, admission, spare_nodes=()):  # noqa: ANN001, ANN202
        applied[job_id] = (plan.kind, plan.blocker, plan.swaps)
        return apply_plan(job_id, plan, admission, spare_nodes)

    sim.relaunch_after_node_loss = recorded

    class Recorder:
        def __init__(self, config) -> None:  # noqa: ANN001
            self.config, self.plans = config, {}

        def relaunch_after_node_loss(self, job_id, plan, admission, spare_nodes=()):  # noqa: ANN001, ANN201
            self.plans[job_id] = (plan.kind, plan.blocker, plan.swaps)
            return None

    def checked() -> None:
        nonlocal compared
        jobs = [copy.deepcopy(sim.sj[j].job) for j in sorted(sim.undecided)]
        live = Recorder(sim.cfg)
        replacements.relaunch_lost(live, jobs, sim.live_snapshot())
        applied.clear()
        real()
        assert applied == live.plans  # the same plan, blocker and spare for every job
        kinds.update(kind for kind, _, _ in applied.values())
        compared += len(applied)

    sim._relaunch_lost = checked
    sim.run()
    assert compared > 5 and kinds == {Relaunch.REPLACE_IN_PLACE, Relaunch.FROM_STORE}


def test_fleet_scaled_rate_and_errors():
    nf = NodeFailures(mttf_h_per_16k_gpus=1.8)
    assert nf.node_mtbf_h(8, 2000) == pytest.approx(1.8 * 16384 / 8)  # 3,686 h per 8-GPU node
    assert NodeFailures().node_mtbf_h(8, 2000) == 2000  # unset: the region's own MTBF
    assert NodeFailures().memory_every == 0 and NodeFailures(tier=Tier.MEMORY).memory_every == 60
    with pytest.raises(ScenarioError, match="tier must be one of store, memory"):
        parse(scenario(node_failures={"tier": "disk"}))
    with pytest.raises(ScenarioError, match="unknown key"):
        parse(scenario(node_failures={"spare": 1}))
    with pytest.raises(ScenarioError, match="recovery policy replaces a lost node in place"):
        parse(scenario(node_failures={"replace_in_place": True}))


def test_failure_study_is_deterministic_and_the_memory_tier_loses_less(tmp_path):
    from tests.simulator.helpers import busy_scenario, random_rows

    scn_path = tmp_path / "busy.yaml"
    scn_path.write_text(yaml.safe_dump(busy_scenario()))
    trace = write_trace(tmp_path / "t.csv", random_rows(150))
    # the study's own "none" and, at a rate this small fleet sees often, its two extremes
    hi = 0.015  # h per 16k GPUs: a 31 h MTBF per node
    some = (failure_study.VARIANTS[0],
            failure_study.Variant("10x-store", "store", NodeFailures(mttf_h_per_16k_gpus=hi)),
            failure_study.Variant("10x-memory-spares", "memory", NodeFailures(
                mttf_h_per_16k_gpus=hi, tier=Tier.MEMORY, spares_per_pool=1)))
    a, _ = failure_study.run(str(trace), str(scn_path), None, 1, PolicyKind.OURS, some)
    b, _ = failure_study.run(str(trace), str(scn_path), None, 1, PolicyKind.OURS, some)
    assert a == b
    by = {v["name"]: v for v in a["variants"]}
    assert by["none"]["lost_gpu_h_node_failures"] == 0
    assert by["10x-store"]["failures_under_jobs"].get(Blocker.MEMORY_TIER_OFF.value, 0) > 0
    assert by["10x-memory-spares"]["failures_under_jobs"].get(IN_PLACE, 0) > 0
    assert by["10x-memory-spares"]["lost_gpu_h_node_failures"] < by["10x-store"]["lost_gpu_h_node_failures"]


def test_conservation_holds_with_replacements(tmp_path):
    from tests.simulator.helpers import busy_scenario, random_rows

    scn = busy_scenario()
    scn["node_failures"] = {"mttf_h_per_16k_gpus": 0.02, "tier": "memory", "spares_per_pool": 1}
    sim = simulate(tmp_path, scn, random_rows(150))  # check=True: no node over-allocated at any pass
    assert sum(j.recoveries.get(IN_PLACE, 0) for j in sim.sj.values()) > 0
    assert all(j.ended for j in sim.sj.values())
