"""Node failures: the fleet-scaled rate, the two recovery tiers and in-place replacement.

Exact times: the failure is injected at a known time (the engine's own handler, as the
Poisson process would call it), everything else is the tiny scenario's exact arithmetic.
"""

from __future__ import annotations

import pytest
import yaml

from simulator import failure_study, node_recovery
from simulator.engine import NODE_REPLACED, T0, Simulation
from simulator.node_recovery import Kind, NodeFailures, Tier
from simulator.policies import TABLE, PolicyKind
from simulator.scenario import ScenarioError, parse
from simulator.trace import load
from tests.simulator.helpers import jct, scenario, simulate, write_trace


def _scn(**nf) -> dict:  # noqa: ANN003
    # three 8-GPU nodes in one UltraServer / layer-3 block; a 16-GPU job (16 GB of state)
    s = scenario(regions=[{"name": "r1", "pools": [
        {"kind": "on_demand", "nodes": 3, "price_per_gpu_hour": 2.0}]}],
        node_failures={"peer_gbps": 1.0, "rejoin_s": 20, "memory_snapshot_s": 60, **nf})
    return s


def _fail_at(tmp_path, scn: dict, t: float, which: int = 0, also_down: int | None = None) -> Simulation:  # noqa: ANN001
    trace = write_trace(tmp_path / "trace.csv", [("g", 0, 1000, 16, "t")])
    sim = Simulation(parse(yaml.safe_load(yaml.safe_dump(scn))), load(trace), TABLE[PolicyKind.OURS], 1,
                     check=True)
    sim.start()
    sim.advance(until=T0 + t)
    nodes = [n for n, _ in sim.sj["g"].alloc]
    if also_down is not None:  # the buddy is down already: both copies of the shard are gone
        sim.node[nodes[also_down]].node.healthy = False
    sim._node_fail(nodes[which])
    sim.advance()
    return sim


def test_memory_tier_replaces_in_place_and_loses_at_most_one_snapshot(tmp_path):
    # Runs from 10 (10 s start). Node fails at 400: last snapshot at 360 s of running
    # (370 wall), so 30 s of work are lost; the spare joins (20 s) and reads the failed
    # node's 8 GB shard from its buddy at 1 GB/s (8 s): running again at 428 with 640 s
    # of work left -> ends at 1068.
    sim = _fail_at(tmp_path, _scn(tier="memory", replace_in_place=True, spares_per_pool=1), 400)
    j = sim.sj["g"]
    assert jct(sim, "g") == pytest.approx(1068)
    assert j.recoveries == {Kind.REPLACE_MEMORY.value: 1}
    assert j.lost[NODE_REPLACED] == pytest.approx((30 + 28) * 16)
    assert j.job.attempt == 1  # the same attempt: no relaunch through the queue


def test_store_tier_replaces_in_place_from_the_last_periodic_checkpoint(tmp_path):
    # Same failure, store tier: back to the periodic checkpoint at 300 s of work (310 wall),
    # 90 s lost; spare joins (20 s), then every rank re-reads 16 GB at 1 GB/s (16 s):
    # running at 436 with 700 s left -> ends at 1136.
    sim = _fail_at(tmp_path, _scn(tier="store", replace_in_place=True, spares_per_pool=1), 400)
    assert jct(sim, "g") == pytest.approx(1136)
    assert sim.sj["g"].recoveries == {Kind.REPLACE_STORE.value: 1}
    assert sim.sj["g"].lost[NODE_REPLACED] == pytest.approx((90 + 36) * 16)


def test_memory_tier_falls_back_to_the_store_when_the_buddy_is_down(tmp_path):
    sim = _fail_at(tmp_path, _scn(tier="memory", replace_in_place=True, spares_per_pool=1), 400, also_down=1)
    assert sim.sj["g"].recoveries == {Kind.REPLACE_STORE.value: 1}
    assert jct(sim, "g") == pytest.approx(1136)


def test_without_replacement_the_attempt_fails_and_queues_again(tmp_path):
    # Today's path (store tier, no in-place replacement): the attempt fails, the broker
    # requeues the job away from the failed node; it restarts from the periodic checkpoint
    # (300 s of work) on the two other nodes: relaunched in the pass at 400, 16 s read +
    # 10 s start, 700 s left -> ends at 1126.
    sim = _fail_at(tmp_path, _scn(tier="store"), 400)
    j = sim.sj["g"]
    assert j.recoveries == {Kind.REQUEUE.value: 1}
    assert j.job.attempt == 2 and NODE_REPLACED not in j.lost
    assert jct(sim, "g") == pytest.approx(1126)


def test_a_reserved_spare_is_not_scheduled_and_the_repaired_node_becomes_the_spare(tmp_path):
    scn = _scn(tier="memory", replace_in_place=True, spares_per_pool=1)
    trace = write_trace(tmp_path / "trace.csv", [("g", 0, 1000, 16, "t"), ("late", 5000, 100, 8, "t")])
    sim = Simulation(parse(yaml.safe_load(yaml.safe_dump(scn))), load(trace), TABLE[PolicyKind.OURS], 1,
                     check=True)
    sim.start()
    pool = "r1-on_demand"
    spare = sim.spares[pool][0]
    assert spare not in sim.present and len(sim.present) == 2
    sim.advance(until=T0 + 400)
    failed = sim.sj["g"].alloc[0][0]
    sim._node_fail(failed)
    assert spare in sim.present and failed not in sim.present and sim.spares[pool] == []
    assert spare in {n for n, _ in sim.sj["g"].alloc}
    sim.advance()  # the repair (3600 s after the failure) comes before the last job ends
    assert sim.spares[pool] == [failed] and failed not in sim.present
    assert {n for n, _ in sim.sj["late"].alloc} == set() and sim.sj["late"].ended


def test_fleet_scaled_rate_and_errors():
    nf = NodeFailures(mttf_h_per_16k_gpus=1.8)
    assert nf.node_mtbf_h(8, 2000) == pytest.approx(1.8 * 16384 / 8)  # 3,686 h per 8-GPU node
    assert NodeFailures().node_mtbf_h(8, 2000) == 2000  # unset: the region's own MTBF
    with pytest.raises(ScenarioError, match="tier must be one of store, memory"):
        parse(scenario(node_failures={"tier": "disk"}))
    with pytest.raises(ScenarioError, match="unknown key"):
        parse(scenario(node_failures={"spare": 1}))
    assert node_recovery.plan(nf, spare=False, buddy_alive=True, ckpt_bytes=1e9, nodes=1).kind is Kind.REQUEUE
    mem = NodeFailures(tier=Tier.MEMORY, replace_in_place=True)
    assert node_recovery.plan(mem, spare=True, buddy_alive=False, ckpt_bytes=1e9, nodes=1).kind is Kind.REPLACE_STORE


def test_failure_study_is_deterministic_and_the_memory_tier_loses_less(tmp_path):
    from tests.simulator.helpers import busy_scenario, random_rows

    scn_path = tmp_path / "busy.yaml"
    scn_path.write_text(yaml.safe_dump(busy_scenario()))
    trace = write_trace(tmp_path / "t.csv", random_rows(150))
    # the study's own "none" and, at a rate this small fleet sees often, its two extremes
    hi = 0.01  # h per 16k GPUs: a 20 h MTBF per node
    some = (failure_study.VARIANTS[0],
            failure_study.Variant("10x-store", "store", NodeFailures(mttf_h_per_16k_gpus=hi)),
            failure_study.Variant("10x-memory-spares", "memory", NodeFailures(
                mttf_h_per_16k_gpus=hi, tier=Tier.MEMORY, replace_in_place=True, spares_per_pool=1)))
    a, _ = failure_study.run(str(trace), str(scn_path), None, 1, PolicyKind.OURS, some)
    b, _ = failure_study.run(str(trace), str(scn_path), None, 1, PolicyKind.OURS, some)
    assert a == b
    by = {v["name"]: v for v in a["variants"]}
    assert by["none"]["lost_gpu_h_node_failures"] == 0
    assert by["10x-store"]["failures_under_jobs"].get("requeue", 0) > 0
    assert by["10x-memory-spares"]["failures_under_jobs"].get("replace_memory", 0) > 0
    assert by["10x-memory-spares"]["lost_gpu_h_node_failures"] < by["10x-store"]["lost_gpu_h_node_failures"]


def test_conservation_holds_with_replacements(tmp_path):
    from tests.simulator.helpers import busy_scenario, random_rows

    scn = busy_scenario()
    scn["node_failures"] = {"mttf_h_per_16k_gpus": 0.02, "tier": "memory", "replace_in_place": True,
                            "spares_per_pool": 1}
    sim = simulate(tmp_path, scn, random_rows(150))  # check=True: no node over-allocated at any pass
    assert sum(j.recoveries.get(Kind.REPLACE_MEMORY.value, 0) for j in sim.sj.values()) > 0
    assert all(j.ended for j in sim.sj.values())
