"""Which agent nodes are a training plan's capacity (broker/scheduling/plan_binding.py):
by id, by name, or adopted by a live plan of the region up to its instance count."""

from __future__ import annotations

from broker.scheduling.plan_binding import BindRule, bind
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

NOW = 1_000_000.0
PLAN_T = pb.CAPACITY_TYPE_TRAINING_PLAN


def node(i: str, pool: str = "training_plan", ctype: int = PLAN_T, itype: str = "p5.48xlarge",
         zone: str = "usw2-az1") -> tuple[str, pb.Node]:
    return "us-west-2", pb.Node(id=i, pool=pool, capacity_type=ctype, instance_type=itype,
                                zone=zone, accelerator="h100", gpus=8)


def plan(pid: str, name: str = "", count: int = 2, start: float = NOW - 60, end: float = NOW + 3600,
         region: str = "us-west-2", itype: str = "p5.48xlarge", **kw: object) -> cpb.TrainingPlan:
    return cpb.TrainingPlan(id=pid, name=name or pid, region=region, instance_type=itype,
                            instance_count=count, start_time=start, end_time=end, **kw)


def rules(out: dict) -> dict[str, tuple[str, BindRule]]:
    return {n: (p.id, r) for n, (p, r) in out.items()}


def test_by_id_then_name_then_adoption_up_to_the_count() -> None:
    nodes = [node("a", pool="tp-1"), node("b", pool="p5-week"), node("c"), node("d"), node("e"),
             node("od", pool="on_demand", ctype=pb.CAPACITY_TYPE_ON_DEMAND)]
    plans = [plan("tp-1", count=1), plan("tp-2", name="p5-week", count=3)]
    assert rules(bind(nodes, plans, NOW)) == {
        "a": ("tp-1", BindRule.ID), "b": ("tp-2", BindRule.NAME),
        "c": ("tp-2", BindRule.ADOPT), "d": ("tp-2", BindRule.ADOPT),  # 3 = b + c + d
    }


def test_adoption_needs_the_same_region_instance_type_zone_and_a_live_plan() -> None:
    nodes = [node("x", itype="p4d.24xlarge"), node("y", zone="usw2-az9"), node("z")]
    plans = [plan("other-region", region="eu-west-1"), plan("p4", itype="p4d.24xlarge", count=1),
             plan("zoned", zone="usw2-az1", count=1),
             plan("ended", start=NOW - 7200, end=NOW - 60),
             plan("cancelled", state=cpb.PLAN_STATE_CANCELLED)]
    assert rules(bind(nodes, plans, NOW)) == {"x": ("p4", BindRule.ADOPT), "z": ("zoned", BindRule.ADOPT)}


def test_no_plan_binds_nothing() -> None:
    assert bind([node("a"), node("b", pool="tp-9")], [], NOW) == {}
