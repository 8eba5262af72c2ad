"""What a Node object says about health and spot interruptions (pure functions).

The same things the local agent learns from ``<work_dir>/node-health/`` and
``<work_dir>/spot-notices/`` (region_agents/signals.py), read from the cluster:

* **Spot interruption**: the AWS Node Termination Handler, on an EC2 spot
  interruption warning, taints the node ``aws-node-termination-handler/spot-itn``
  (and cordons it). EC2 gives two minutes from the warning; the taint carries no
  deadline (only NoExecute taints get ``timeAdded``), so the deadline is when the agent
  first saw the taint plus two minutes -- never later than the real one.
* **Health**: the ``Ready`` condition (False/Unknown: the kubelet stopped reporting or
  reports a failure), the node lifecycle controller's ``not-ready``/``unreachable``
  taints, and HyperPod's health-monitoring agent, which labels a faulty node
  ``sagemaker.amazonaws.com/node-health-status=Unschedulable*`` and taints it with the
  same key. A cordon alone (``spec.unschedulable``) is not ill health: it is reported as
  ``cordoned`` through the inventory (labels.node_from_k8s).
"""

from __future__ import annotations

SPOT_TAINT = "aws-node-termination-handler/spot-itn"
# NTH's other interruption taints: a rebalance recommendation is not a reclaim
# (no deadline), but ASG lifecycle / scheduled events / spot ITN all end the node.
NTH_TAINTS_ENDING = frozenset({
    SPOT_TAINT,
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/scheduled-maintenance",
})
HYPERPOD_HEALTH = "sagemaker.amazonaws.com/node-health-status"
HYPERPOD_BAD_PREFIX = "Unschedulable"
UNHEALTHY_TAINTS = {
    "node.kubernetes.io/not-ready": "not ready (node lifecycle controller)",
    "node.kubernetes.io/unreachable": "unreachable (node lifecycle controller)",
}


def spot_tainted(node: dict) -> bool:
    """Does the node carry the Node Termination Handler's spot-interruption taint?"""
    return any(t.get("key") == SPOT_TAINT for t in (node.get("spec") or {}).get("taints") or [])


LIFECYCLE_TAINTS = frozenset(UNHEALTHY_TAINTS)  # the lifecycle controller's copies of Ready


def health_of(node: dict) -> tuple[bool, str]:
    """(healthy, reason) of a Node object (a dict as the API server sends it)."""
    status = node.get("status") or {}
    ready = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            ready = str(cond.get("status")) == "True"
            if not ready:
                why = cond.get("reason") or cond.get("message") or "not ready"
                return False, f"Ready={cond.get('status')}: {why}"
    labels = (node.get("metadata") or {}).get("labels") or {}
    hp = labels.get(HYPERPOD_HEALTH, "")
    if hp.startswith(HYPERPOD_BAD_PREFIX):
        return False, f"HyperPod health agent: {hp}"
    for t in (node.get("spec") or {}).get("taints") or []:
        key = t.get("key", "")
        if key in LIFECYCLE_TAINTS and ready:
            # The lifecycle controller sets these from the Ready condition and clears
            # them a moment after it turns True (a new node is born with not-ready):
            # with a fresh Ready=True in hand, the taint is the stale copy.
            continue
        if key in UNHEALTHY_TAINTS:
            return False, UNHEALTHY_TAINTS[key]
        if key == HYPERPOD_HEALTH and str(t.get("value", "")).startswith(HYPERPOD_BAD_PREFIX):
            return False, f"HyperPod health agent: {t.get('value')}"
    return True, ""
