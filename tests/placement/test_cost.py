"""Cost and locality: plan (prepaid) < spot (when allowed) < on-demand/reserved;
data egress, region lists, max price, excluded nodes, draining regions."""

from __future__ import annotations

from placement import CapacityType, schedule

from .helpers import admitted, job, node, snap

SPOT_OK = frozenset({CapacityType.SPOT, CapacityType.ON_DEMAND, CapacityType.TRAINING_PLAN})


def pools():
    return [
        node("od", agent="a1", capacity_type=CapacityType.ON_DEMAND, price_per_gpu_hour=4.0),
        node("spot", agent="a2", capacity_type=CapacityType.SPOT, price_per_gpu_hour=1.5, interruption_risk=0.1),
        node("plan", agent="a3", capacity_type=CapacityType.TRAINING_PLAN, pool="tp-1", price_per_gpu_hour=3.0,
             plan_start=0.0, plan_end=1e9),
    ]


def where(d, jid):
    return next(a for a in d.admissions if a.job_id == jid).assignments[0][0]


def test_training_plan_first_then_spot_then_on_demand():
    d = schedule(snap(pools(), [job("a", capacity_types=SPOT_OK), job("b", capacity_types=SPOT_OK),
                                job("c", capacity_types=SPOT_OK)]))
    assert [where(d, j) for j in "abc"] == ["plan", "spot", "od"]
    adm = {a.job_id: a for a in d.admissions}
    assert adm["a"].capacity_type == CapacityType.TRAINING_PLAN and "prepaid" in adm["a"].explanation


def test_spot_only_when_the_job_asks_for_it():
    d = schedule(snap(pools(), [job("a"), job("b"), job("c")]))
    assert where(d, "a") == "plan" and where(d, "b") == "od"
    assert "c" in d.pending_reasons


def test_data_locality_beats_preferred_region_and_price():
    nodes = [node("east", agent="e", region="us-east-2", price_per_gpu_hour=4.0),
             node("west", agent="w", region="us-west-2", price_per_gpu_hour=3.0)]
    d = schedule(snap(nodes, [job("j", dataset_region="us-east-2")]))
    assert where(d, "j") == "east" and "data local" in d.admissions[0].explanation
    d = schedule(snap(nodes, [job("j")]))
    assert where(d, "j") == "west"  # cheaper when data does not matter
    d = schedule(snap(nodes, [job("j", preferred_regions=("us-east-2",))]))
    assert where(d, "j") == "east"


def test_region_allow_deny_max_price_excluded_and_draining():
    nodes = [node("east", agent="e", region="us-east-2", price_per_gpu_hour=4.0),
             node("west", agent="w", region="us-west-2", price_per_gpu_hour=3.0)]
    assert where(schedule(snap(nodes, [job("j", allowed_regions=frozenset({"us-east-2"}))])), "j") == "east"
    assert where(schedule(snap(nodes, [job("j", denied_regions=frozenset({"us-west-2"}))])), "j") == "east"
    d = schedule(snap(nodes, [job("j", max_price_per_gpu_hour=2.0)]))
    assert "at most $2.00/GPU-h" in d.pending_reasons["j"]
    assert where(schedule(snap(nodes, [job("j", excluded_nodes=frozenset({"west"}))])), "j") == "east"
    d = schedule(snap(nodes, [job("j")], draining_regions=frozenset({"us-west-2"})))
    assert where(d, "j") == "east"


def test_unhealthy_cordoned_and_wrong_accelerator_never_used():
    nodes = [node("sick", healthy=False), node("cord", cordoned=True), node("a100", accelerator="a100"),
             node("h100", accelerator="h100")]
    d = schedule(snap(nodes, [job("x", accelerator="h100"), job("y", accelerator="h100")]))
    assert admitted(d) == {"x": (("h100", 8),)}
    assert "largest free block is 0 GPUs" in d.pending_reasons["y"]
