"""Memory keeper pods ask for the memory they will hold, and the real scheduler counts it.

Real: the API server (restricted Pod Security), its Job controller and scheduler, the
executor's keeper code authenticated as deploy/k8s/agent.yaml's service account, the
keeper process in its pod. Simulated: only the kubelet (tests/fixtures/k8s/kubelet.py).

One node with 2 GiB of memory. Once the ranks reported a 100 MiB snapshot (the progress
file's ``memory_tier``, as the executor reads it), a keeper for a job with 2 ranks per
node asks for ``64Mi + 2 x 4 x 100Mi`` and gets a limit above it: it is scheduled and
serves. A job whose ranks reported 400 MiB would need 3.2 GiB: the scheduler leaves its
keeper unschedulable for insufficient memory, and the executor says so instead of
starting the ranks against a keeper that is not there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from region_agents.executors.k8s_keepers import KeeperError, keeper_selector
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec, ProcessKubelet
from tests.k8s.helpers import end_everything, executor_for, wait

NODE = "km-n0"
MIB = 2**20


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    k = ProcessKubelet(cluster_a, [NodeSpec(name=NODE, gpus=2, cpu="8", memory="2Gi")]).start()
    try:
        yield k
    finally:
        k.stop()
        cluster_a.core().delete_node(NODE)


def test_keeper_pods_request_their_bounded_memory_and_the_scheduler_counts_it(
        cluster_a: ControlPlane, kubelet: ProcessKubelet) -> None:
    ex, ns = executor_for(cluster_a)
    core = cluster_a.core()
    try:
        keepers = ex.keepers
        keepers.start_timeout_s = 60.0
        keepers.saw("km-fits", {"memory_tier": {"snapshot_bytes": 100 * MIB}})
        keepers.ensure("km-fits", [NODE], 1, ranks_per_node=2)
        pod = core.list_namespaced_pod(ns, label_selector=keeper_selector("km-fits")).items[0]
        res = pod.spec.containers[0].resources
        assert res.requests == {"memory": "864Mi"}  # 64Mi + KEEP(2) x 2 nodes' x 2 ranks x 100Mi
        # the arriving snapshot is within KEEP (the keeper drops to the newest complete
        # step first); x 1.25 for ranks whose shards are larger than rank 0's
        assert res.limits == {"memory": "1064Mi"}  # 64Mi + 800Mi x 1.25
        assert pod.spec.node_name == NODE and pod.status.phase == "Running"

        keepers.start_timeout_s = 15.0
        keepers.saw("km-big", {"memory_tier": {"snapshot_bytes": 400 * MIB}})
        with pytest.raises(KeeperError, match="memory keepers on km-n0 not ready"):
            keepers.ensure("km-big", [NODE], 1, ranks_per_node=2)
        big = core.list_namespaced_pod(ns, label_selector=keeper_selector("km-big")).items[0]
        assert big.spec.containers[0].resources.requests == {"memory": "3264Mi"}
        assert not big.spec.node_name

        def unschedulable() -> str:
            p = core.read_namespaced_pod(big.metadata.name, ns)
            cond = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
            return cond[0].message if cond and cond[0].reason == "Unschedulable" else ""

        message = wait(unschedulable, timeout=60, what="the scheduler's verdict")
        assert "Insufficient memory" in message, message
    finally:
        ex.shutdown()
        end_everything(cluster_a, ns, kubelet)
