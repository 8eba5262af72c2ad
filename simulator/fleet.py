"""The simulated fleet: node records (the same ``pb.Node`` an agent registers), one
cluster (agent) per region, with UltraServer / layer-3 / layer-2 labels by position.

Why ``pb.Node`` and not ``placement.NodeInfo`` directly: the simulator converts nodes
with the broker's own :func:`broker.scheduling.snapshot.node_info`, so what the engine
sees is what the live broker would build from the same agent registration.
"""

from __future__ import annotations

from dataclasses import dataclass

from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from simulator.scenario import Pool, PoolKind, Region, Scenario

_CT = {PoolKind.ON_DEMAND: pb.CAPACITY_TYPE_ON_DEMAND, PoolKind.SPOT: pb.CAPACITY_TYPE_SPOT,
       PoolKind.TRAINING_PLAN: pb.CAPACITY_TYPE_TRAINING_PLAN}


@dataclass
class SimNode:
    node: pb.Node
    region: Region
    pool: Pool
    agent_id: str


def agent_of(region: str) -> str:
    return f"agent-{region}"


def build(scn: Scenario, t0: float = 0.0) -> tuple[list[SimNode], list[cpb.TrainingPlan]]:
    """All nodes in a stable order, and one TrainingPlan record per plan pool (times from ``t0``)."""
    nodes: list[SimNode] = []
    plans: list[cpb.TrainingPlan] = []
    for r in scn.regions:
        i = 0  # position in the region: topology blocks are contiguous
        for p in r.pools:
            pool_name = p.name or f"{r.name}-{p.kind.value}"
            if p.kind is PoolKind.TRAINING_PLAN:
                plans.append(cpb.TrainingPlan(
                    id=pool_name, name=pool_name, region=r.name, zone=f"{r.name}a",
                    accelerator=r.accelerator, instance_count=p.nodes, gpus_per_instance=r.gpus_per_node,
                    start_time=t0 + p.start_s, end_time=t0 + p.end_s, state=cpb.PLAN_STATE_SCHEDULED,
                    price_per_gpu_hour=p.price_per_gpu_hour))
            for _ in range(p.nodes):
                n = pb.Node(
                    id=f"{r.name}-n{i:04d}", region=r.name, zone=f"{r.name}a", instance_type="sim",
                    accelerator=r.accelerator, gpus=r.gpus_per_node,
                    network_layer_1=f"{r.name}-l1",
                    network_layer_2=f"{r.name}-l2-{i // max(1, r.layer2_nodes)}",
                    network_layer_3=f"{r.name}-l3-{i // max(1, r.layer3_nodes)}",
                    ultraserver_id=f"{r.name}-us-{i // max(1, r.ultraserver_nodes)}",
                    capacity_type=_CT[p.kind], pool=pool_name, price_per_gpu_hour=p.price_per_gpu_hour,
                    interruption_risk=min(1.0, p.interruptions_per_node_hour), healthy=True)
                nodes.append(SimNode(n, r, p, agent_of(r.name)))
                i += 1
    return nodes, plans
