"""labels.py: the one mapping from Kubernetes/EKS labels to computebroker.v1.Node."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from computebroker.v1 import common_pb2
from region_agents import labels as L

CT = common_pb2.CapacityType

EKS_LABELS = {
    "topology.kubernetes.io/region": "us-east-2",
    "topology.kubernetes.io/zone": "us-east-2a",
    "node.kubernetes.io/instance-type": "p5.48xlarge",
    "topology.k8s.aws/network-node-layer-1": "nn-1",
    "topology.k8s.aws/network-node-layer-2": "nn-2",
    "topology.k8s.aws/network-node-layer-3": "nn-3",
    "topology.k8s.aws/network-node-layer-4": "nn-4",
    "topology.k8s.aws/ultraserver-id": "us-0001",
    "eks.amazonaws.com/capacityType": "SPOT",
    "computebroker.io/price-per-gpu-hour": "2.5",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
}


def test_eks_labels_map_to_node_fields():
    node = L.node_from_labels("ip-10-0-0-1", EKS_LABELS, "8", efa="32")
    assert node.id == "ip-10-0-0-1"
    assert (node.region, node.zone, node.instance_type) == ("us-east-2", "us-east-2a", "p5.48xlarge")
    assert (node.network_layer_1, node.network_layer_2, node.network_layer_3) == ("nn-1", "nn-2", "nn-3")
    assert node.ultraserver_id == "us-0001"
    assert node.gpus == 8 and node.efa == 32
    assert node.capacity_type == CT.CAPACITY_TYPE_SPOT
    assert node.pool == "spot"
    assert node.price_per_gpu_hour == pytest.approx(2.5)
    # Layer 4 has no field of its own: it is kept in labels.
    assert node.labels["topology.k8s.aws/network-node-layer-4"] == "nn-4"
    assert node.accelerator == "nvidia-h100-80gb-hbm3"
    assert node.healthy


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("eks.amazonaws.com/capacityType", "ON_DEMAND", CT.CAPACITY_TYPE_ON_DEMAND),
        ("eks.amazonaws.com/capacityType", "SPOT", CT.CAPACITY_TYPE_SPOT),
        ("eks.amazonaws.com/capacityType", "CAPACITY_BLOCK", CT.CAPACITY_TYPE_TRAINING_PLAN),
        ("karpenter.sh/capacity-type", "on-demand", CT.CAPACITY_TYPE_ON_DEMAND),
        ("karpenter.sh/capacity-type", "spot", CT.CAPACITY_TYPE_SPOT),
        ("karpenter.sh/capacity-type", "reserved", CT.CAPACITY_TYPE_RESERVED),
        ("computebroker.io/capacity-type", "training_plan", CT.CAPACITY_TYPE_TRAINING_PLAN),
    ],
)
def test_capacity_type_labels(key, value, expected):
    assert L.node_from_labels("n", {key: value}, 4).capacity_type == expected


def test_no_capacity_label_is_on_demand_and_unknown_is_an_error():
    assert L.node_from_labels("n", {}, 4).capacity_type == CT.CAPACITY_TYPE_ON_DEMAND
    with pytest.raises(L.LabelError, match="unknown capacity type 'WEIRD'"):
        L.node_from_labels("n", {"eks.amazonaws.com/capacityType": "WEIRD"}, 4)


def test_training_plan_label_makes_plan_pool():
    node = L.node_from_labels("n", {"computebroker.io/training-plan": "tp-123"}, 8)
    assert node.capacity_type == CT.CAPACITY_TYPE_TRAINING_PLAN
    assert node.pool == "tp-123"
    explicit = L.node_from_labels("n", {"computebroker.io/pool": "team-a", "karpenter.sh/capacity-type": "spot"}, 8)
    assert explicit.pool == "team-a"


def test_bad_numbers_are_clear_errors():
    with pytest.raises(L.LabelError, match="price-per-gpu-hour"):
        L.node_from_labels("n", {"computebroker.io/price-per-gpu-hour": "cheap"}, 8)
    with pytest.raises(L.LabelError, match="nvidia.com/gpu of node n"):
        L.node_from_labels("n", {}, "eight")


def test_region_fallback_when_not_labelled():
    assert L.node_from_labels("n", {}, 1, region="eu-west-1").region == "eu-west-1"


def test_kubernetes_node_object_maps_through_the_same_function():
    v1 = k8s.V1Node(
        metadata=k8s.V1ObjectMeta(name="ip-10-0-0-2", labels=EKS_LABELS),
        spec=k8s.V1NodeSpec(unschedulable=True),
        status=k8s.V1NodeStatus(
            allocatable={"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "cpu": "192"},
            conditions=[k8s.V1NodeCondition(type="Ready", status="False")],
        ),
    )
    node = L.node_from_k8s(v1)
    assert node.id == "ip-10-0-0-2" and node.gpus == 8 and node.efa == 32
    assert node.cordoned and not node.healthy
    assert node == L.node_from_k8s(k8s.ApiClient().sanitize_for_serialization(v1))


def test_labels_for_node_round_trips():
    node = L.node_from_labels("n", EKS_LABELS, 8)
    again = L.node_from_labels("n", L.labels_for_node(node), 8)
    for f in ("region", "zone", "instance_type", "network_layer_1", "network_layer_3",
              "ultraserver_id", "capacity_type", "pool", "price_per_gpu_hour"):
        assert getattr(again, f) == getattr(node, f), f


def test_a_ready_node_still_carrying_a_lifecycle_taint_takes_no_new_placement():
    """kube-scheduler refuses pods on a node whose not-ready taint has not cleared yet, even
    after Ready turned True (seen at 2,000 KWOK nodes for minutes): cordoned, yet healthy."""
    def node(taints):
        return {"metadata": {"name": "n1", "labels": EKS_LABELS},
                "spec": {"taints": taints},
                "status": {"allocatable": {"nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}
    stale = L.node_from_k8s(node([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]))
    assert stale.healthy and stale.cordoned
    gone = L.node_from_k8s(node([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]))
    assert gone.cordoned
    other = L.node_from_k8s(node([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]))
    assert other.healthy and not other.cordoned
    assert not L.node_from_k8s(node([])).cordoned
