"""THE one place that maps Kubernetes/EKS node labels to ``computebroker.v1.Node``.

Why one place: the local executor's inventory file and real Kubernetes ``Node``
objects use the *same* label names (the ones EKS / HyperPod / Karpenter set), so
both paths go through :func:`node_from_labels` and the broker sees identical
nodes whichever executor a region runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from computebroker.v1 import common_pb2

# Real label names, as EKS, HyperPod and Karpenter set them.
LABEL_LAYER_1 = "topology.k8s.aws/network-node-layer-1"
LABEL_LAYER_2 = "topology.k8s.aws/network-node-layer-2"
LABEL_LAYER_3 = "topology.k8s.aws/network-node-layer-3"
LABEL_LAYER_4 = "topology.k8s.aws/network-node-layer-4"  # kept in Node.labels only
LABEL_ULTRASERVER = "topology.k8s.aws/ultraserver-id"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_EKS_CAPACITY = "eks.amazonaws.com/capacityType"
LABEL_KARPENTER_CAPACITY = "karpenter.sh/capacity-type"
RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_EFA = "vpc.amazonaws.com/efa"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"

# Our own labels (an operator sets them on nodes / in the inventory file).
LABEL_POOL = "computebroker.io/pool"
LABEL_PRICE = "computebroker.io/price-per-gpu-hour"
LABEL_PLAN = "computebroker.io/training-plan"
LABEL_ACCELERATOR = "computebroker.io/accelerator"
LABEL_INTERRUPTION_RISK = "computebroker.io/interruption-risk"
LABEL_CAPACITY = "computebroker.io/capacity-type"
# An operator's spare (`kubectl label node N computebroker.io/spare=true`): kept free for
# replacing a lost node in place (Node.spare, Register.pool_spares, docs/recovery.md).
LABEL_SPARE = "computebroker.io/spare"

CT = common_pb2.CapacityType

# Every spelling we accept for a capacity type, lower-cased. EKS uses ON_DEMAND /
# SPOT / CAPACITY_BLOCK (a capacity block is a prepaid training plan), Karpenter
# on-demand / spot / reserved, our inventory file on_demand / spot / training_plan /
# reserved.
_CAPACITY_ALIASES: dict[str, int] = {
    "on_demand": CT.CAPACITY_TYPE_ON_DEMAND,
    "on-demand": CT.CAPACITY_TYPE_ON_DEMAND,
    "ondemand": CT.CAPACITY_TYPE_ON_DEMAND,
    "spot": CT.CAPACITY_TYPE_SPOT,
    "capacity_block": CT.CAPACITY_TYPE_TRAINING_PLAN,
    "capacity-block": CT.CAPACITY_TYPE_TRAINING_PLAN,
    "training_plan": CT.CAPACITY_TYPE_TRAINING_PLAN,
    "training-plan": CT.CAPACITY_TYPE_TRAINING_PLAN,
    "reserved": CT.CAPACITY_TYPE_RESERVED,
}

CAPACITY_TYPE_NAMES = ("on_demand", "spot", "training_plan", "reserved")


class LabelError(ValueError):
    """A label or field value that cannot be mapped (message says which and why)."""


def parse_capacity_type(value: str) -> int:
    """Map any accepted spelling of a capacity type to ``CapacityType``."""
    key = str(value).strip().lower()
    if key not in _CAPACITY_ALIASES:
        raise LabelError(
            f"unknown capacity type {value!r}; expected one of "
            f"{', '.join(CAPACITY_TYPE_NAMES)} (or EKS ON_DEMAND/SPOT/CAPACITY_BLOCK, "
            f"Karpenter on-demand/spot/reserved)"
        )
    return _CAPACITY_ALIASES[key]


def capacity_type_name(value: int) -> str:
    """Inverse of :func:`parse_capacity_type` for our own spelling (``on_demand``...)."""
    for name in CAPACITY_TYPE_NAMES:
        if _CAPACITY_ALIASES[name] == value:
            return name
    return ""


def _float(labels: Mapping[str, str], key: str, default: float = 0.0) -> float:
    raw = labels.get(key)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise LabelError(f"label {key}={raw!r} is not a number") from None


def _int(value: object, what: str) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        raise LabelError(f"{what}={value!r} is not an integer") from None


def capacity_type_from_labels(labels: Mapping[str, str]) -> int:
    """Our label wins, then EKS's, then Karpenter's; no label means on-demand."""
    for key in (LABEL_CAPACITY, LABEL_EKS_CAPACITY, LABEL_KARPENTER_CAPACITY):
        if labels.get(key):
            return parse_capacity_type(labels[key])
    return CT.CAPACITY_TYPE_ON_DEMAND


def node_from_labels(
    name: str,
    labels: Mapping[str, str],
    gpus: int | str | None,
    *,
    efa: int | str | None = 0,
    healthy: bool = True,
    cordoned: bool = False,
    region: str = "",
) -> common_pb2.Node:
    """Build a ``Node`` from a node's labels and its allocatable GPUs / EFA.

    ``region`` is a fallback for clusters (or inventory files) that do not label
    the region on each node. Every label is also copied into ``Node.labels`` so
    nothing is lost (e.g. network layer 4 has no field of its own).
    """
    labels = {str(k): str(v) for k, v in (labels or {}).items()}
    gpu_count = _int(gpus if gpus is not None else 0, f"{RESOURCE_GPU} of node {name}")
    capacity = capacity_type_from_labels(labels)
    pool = labels.get(LABEL_POOL, "")
    plan = labels.get(LABEL_PLAN, "")
    if plan and not pool:
        # A training plan's nodes form the plan's pool (the pool name is the plan id).
        pool = plan
    if plan and capacity == CT.CAPACITY_TYPE_ON_DEMAND and not labels.get(LABEL_CAPACITY):
        capacity = CT.CAPACITY_TYPE_TRAINING_PLAN
    if not pool:
        pool = capacity_type_name(capacity)
    accelerator = labels.get(LABEL_ACCELERATOR) or labels.get(LABEL_GPU_PRODUCT, "")
    return common_pb2.Node(
        id=name,
        region=labels.get(LABEL_REGION) or region,
        zone=labels.get(LABEL_ZONE, ""),
        instance_type=labels.get(LABEL_INSTANCE_TYPE, ""),
        accelerator=accelerator.lower(),
        gpus=gpu_count,
        efa=_int(efa if efa not in (None, "") else 0, f"{RESOURCE_EFA} of node {name}"),
        network_layer_1=labels.get(LABEL_LAYER_1, ""),
        network_layer_2=labels.get(LABEL_LAYER_2, ""),
        network_layer_3=labels.get(LABEL_LAYER_3, ""),
        ultraserver_id=labels.get(LABEL_ULTRASERVER, ""),
        capacity_type=capacity,
        pool=pool,
        price_per_gpu_hour=_float(labels, LABEL_PRICE),
        interruption_risk=_float(labels, LABEL_INTERRUPTION_RISK),
        healthy=healthy,
        cordoned=cordoned,
        labels=labels,
        spare=labels.get(LABEL_SPARE, "").strip().lower() == "true",
    )


def node_from_k8s(node: object, *, region: str = "") -> common_pb2.Node:
    """Map a ``kubernetes.client.V1Node`` (or its dict form) to a ``Node``.

    Health is the ``Ready`` condition; cordoned is ``spec.unschedulable`` or a lifecycle
    taint still on a node that is Ready again (the scheduler refuses it until it clears).
    """
    data = node if isinstance(node, dict) else _to_dict(node)
    meta = data.get("metadata") or {}
    status = data.get("status") or {}
    spec = data.get("spec") or {}
    allocatable = status.get("allocatable") or {}
    ready = True
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            ready = str(cond.get("status")) == "True"
    return node_from_labels(
        meta.get("name", ""),
        meta.get("labels") or {},
        allocatable.get(RESOURCE_GPU, 0),
        efa=allocatable.get(RESOURCE_EFA, 0),
        healthy=ready,
        cordoned=bool(spec.get("unschedulable")) or _scheduler_refuses(spec),
        region=region,
    )


# The node lifecycle controller's taints. It sets them from the Ready condition and
# clears them some time after Ready turns True -- at 2,000 nodes with a busy controller
# manager, minutes later. Until then kube-scheduler refuses every pod on the node (our
# pods do not tolerate them), so the node takes no new placement: cordoned, not unhealthy
# (running pods stay; a NoExecute copy is the controller's, which evicts them itself).
_LIFECYCLE_TAINT_KEYS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def _scheduler_refuses(spec: dict) -> bool:
    """Does a lifecycle taint still keep kube-scheduler from binding pods here?"""
    return any(t.get("key") in _LIFECYCLE_TAINT_KEYS
               and t.get("effect") in ("NoSchedule", "NoExecute")
               for t in spec.get("taints") or [])


def _to_dict(obj: object) -> dict:
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def labels_for_node(node: common_pb2.Node) -> dict[str, str]:
    """The labels a node carries (inverse mapping, used to render test clusters)."""
    out = dict(node.labels)
    pairs = {
        LABEL_REGION: node.region,
        LABEL_ZONE: node.zone,
        LABEL_INSTANCE_TYPE: node.instance_type,
        LABEL_LAYER_1: node.network_layer_1,
        LABEL_LAYER_2: node.network_layer_2,
        LABEL_LAYER_3: node.network_layer_3,
        LABEL_ULTRASERVER: node.ultraserver_id,
        LABEL_POOL: node.pool,
        LABEL_ACCELERATOR: node.accelerator,
    }
    out.update({k: v for k, v in pairs.items() if v})
    if node.capacity_type:
        out[LABEL_CAPACITY] = capacity_type_name(node.capacity_type)
    if node.price_per_gpu_hour:
        out[LABEL_PRICE] = repr(node.price_per_gpu_hour)
    return out
