"""Nodes, health and spot notices from Node objects; the agent's least privilege; and
deploy/k8s against the REAL API server (no pods run here: fast)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiException

from computebroker.v1 import common_pb2
from region_agents.agent import RegionAgent
from region_agents.config import AgentConfig
from region_agents.executors.k8s_nodes import HYPERPOD_HEALTH, SPOT_TAINT
from region_agents.inventory import Inventory
from tests.fixtures.k8s.controlplane import REPO, ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec, ProcessKubelet
from tests.k8s.agent_identity import AGENT_SA, agent_kubeconfig
from tests.k8s.conftest import make_namespace
from tests.k8s.helpers import executor_for, wait

CT = common_pb2.CapacityType
NODES = [
    NodeSpec(name="nd-spot", gpus=8, instance_type="p5.48xlarge", capacity_type="SPOT",
             zone="use2-az2", layers=("nn-a", "nn-b", "nn-c")),
    NodeSpec(name="nd-ultra", gpus=4, instance_type="p6e-gb200.36xlarge",
             capacity_type="CAPACITY_BLOCK", layers=("nn-x", "nn-y", "nn-z"),
             ultraserver="us-42"),
]


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    k = ProcessKubelet(cluster_a, list(NODES)).start()
    try:
        yield k
    finally:
        k.stop()
        for n in NODES:
            cluster_a.core().delete_node(n.name)


def test_nodes_and_topology_come_from_node_objects(cluster_a, kubelet) -> None:
    ex, _ = executor_for(cluster_a)
    try:
        nodes = {n.id: n for n in ex.discover_nodes()}
        spot, ultra = nodes["nd-spot"], nodes["nd-ultra"]
        assert (spot.instance_type, spot.gpus, spot.capacity_type, spot.zone, spot.region) == (
            "p5.48xlarge", 8, CT.CAPACITY_TYPE_SPOT, "use2-az2", "us-east-2")
        assert (spot.network_layer_1, spot.network_layer_2, spot.network_layer_3) == (
            "nn-a", "nn-b", "nn-c")
        assert ultra.ultraserver_id == "us-42" and ultra.gpus == 4
        assert ultra.capacity_type == CT.CAPACITY_TYPE_TRAINING_PLAN
        assert spot.healthy and ultra.healthy
    finally:
        ex.shutdown()


def _taint(cp: ControlPlane, node: str, taints: list[dict]) -> None:
    cp.core().patch_node(node, {"spec": {"taints": taints}})


def test_spot_taint_and_health_reach_the_agent_from_the_node_watch(cluster_a, kubelet,
                                                                   tmp_path) -> None:
    ex, _ = executor_for(cluster_a)
    inv = Inventory(region="us-east-2", agent_id="k8s-test", nodes=ex.discover_nodes())
    agent = RegionAgent(AgentConfig(broker_address="127.0.0.1:9", insecure=True,
                                    executor="kubernetes", region="us-east-2",
                                    work_dir=str(tmp_path)), executor=ex, inventory=inv)
    try:
        # The Node Termination Handler's taint (it also cordons the node)
        before = time.time()
        _taint(cluster_a, "nd-spot", [{"key": SPOT_TAINT, "value": "evt-1",
                                       "effect": "NoSchedule"}])
        cluster_a.core().patch_node("nd-spot", {"spec": {"unschedulable": True}})

        def spot_seen() -> dict:
            agent._tick()
            return agent.signals.active_spot_notices()
        notices = wait(spot_seen, what="spot notice from the taint")
        assert set(notices) == {"nd-spot"}
        assert before + 110 < notices["nd-spot"] <= time.time() + 121  # EC2's two minutes
        # HyperPod's health agent marks a node unhealthy: a NodeHealth for the broker
        cluster_a.core().patch_node("nd-ultra", {"metadata": {"labels": {
            HYPERPOD_HEALTH: "UnschedulablePendingReplacement"}}})

        def unhealthy() -> list:
            agent._tick()
            return [h for h in agent._pending_health if h.node_id == "nd-ultra" and not h.healthy]
        bad = wait(unhealthy, what="node health change")
        assert "UnschedulablePendingReplacement" in bad[0].reason
        assert agent.signals.healthy("nd-ultra") is False
        # the taint removed: the notice is withdrawn; the label cleared: healthy again
        _taint(cluster_a, "nd-spot", [])
        cluster_a.core().patch_node("nd-ultra", {"metadata": {"labels": {HYPERPOD_HEALTH: None}}})
        wait(lambda: (agent._tick(), not agent.signals.active_spot_notices()
                      and agent.signals.healthy("nd-ultra"))[1], what="signals cleared")
        # a node that joins later is in the next registration, and watched
        kubelet.register(NodeSpec(name="nd-late", gpus=2))
        wait(lambda: "nd-late" in [n.id for n in agent._register_msg().register.nodes],
             what="the new node registered")
        # (a new node is not-ready for a moment: the node lifecycle controller's taint)
        wait(lambda: (agent._tick(), agent.signals.healthy("nd-late"))[1], what="nd-late healthy")
    finally:
        cluster_a.core().patch_node("nd-spot", {"spec": {"unschedulable": False, "taints": []}})
        with contextlib.suppress(ApiException):
            kubelet.nodes.pop("nd-late", None)
            cluster_a.core().delete_node("nd-late")
        ex.shutdown()


def test_the_watch_cache_names_what_changed_since_it_was_last_asked(cluster_a) -> None:
    """The agent judges node health per tick from what changed (ObjectCache.take_changed),
    not from all nodes again: the cache must name every changed object, and say "all"
    after a (re)list. ConfigMaps stand in for nodes: nothing else writes them here."""
    from region_agents.executors.k8s_watch import ObjectCache

    ns = make_namespace(cluster_a)
    core = cluster_a.core()
    for name in ("a", "b", "c"):
        core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": {"v": "0"}})
    cache = ObjectCache(core.list_namespaced_config_map, what="configmaps", namespace=ns).start()
    try:
        assert cache.take_changed() is None  # the first answer: everything is new
        assert cache.take_changed() == set()
        core.patch_namespaced_config_map("b", ns, {"data": {"v": "1"}})
        core.delete_namespaced_config_map("c", ns)
        seen: set[str] = set()
        wait(lambda: (seen.update(cache.take_changed() or set()), seen == {"b", "c"})[1],
             what="the changes named")
        assert cache.get("b")["data"]["v"] == "1" and cache.get("c") is None
        assert cache.take_changed() == set()
    finally:
        cache.stop()


def test_a_stopped_kubelet_makes_the_node_unhealthy(cluster_a, kubelet) -> None:
    """Ready=Unknown, as the node lifecycle controller sets it for a silent kubelet."""
    ex, _ = executor_for(cluster_a)
    try:
        ex.discover_nodes()
        kubelet.dead.add("nd-ultra")  # its heartbeats stop (and the controller's would follow)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cluster_a.core().patch_node_status("nd-ultra", {"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": now,
            "lastTransitionTime": now}]}})
        health = wait(lambda: (h := ex.node_signals()[1]).get("nd-ultra", (True,))[0] is False
                      and h, what="unhealthy")
        assert "NodeStatusUnknown" in health["nd-ultra"][1]
    finally:
        kubelet.dead.discard("nd-ultra")
        ex.shutdown()


def test_the_agent_identity_has_no_more_than_its_manifest(cluster_a) -> None:
    """Least privilege: the token bound to deploy/k8s/agent.yaml's roles can run the
    executor (every other test here does) and can do nothing else of consequence."""
    ns = make_namespace(cluster_a)
    kc = agent_kubeconfig(cluster_a, ns)
    core = client.CoreV1Api(cluster_a.api_client(kc))
    batch = client.BatchV1Api(cluster_a.api_client(kc))
    other = make_namespace(cluster_a)
    forbidden = [
        lambda: core.list_namespaced_secret(ns),  # it writes Secrets, never reads them
        lambda: core.read_namespaced_secret("x", ns),
        lambda: core.delete_collection_namespaced_pod(ns),  # by name only, never a sweep
        lambda: core.patch_namespaced_service("s", ns, {"metadata": {"labels": {"x": "y"}}}),
        lambda: batch.patch_namespaced_job("j", ns, {"metadata": {"labels": {"x": "y"}}}),
        lambda: core.create_namespaced_pod(other, {"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "c", "image": "x"}]}}),  # pods in its namespace only
        lambda: core.list_namespaced_pod(other),  # only its training namespace
        lambda: core.delete_node("nd-spot"),
        lambda: core.patch_node("nd-spot", {"metadata": {"labels": {"x": "y"}}}),
        lambda: core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}}),
    ]
    for call in forbidden:
        with pytest.raises(ApiException) as e:
            call()
        assert e.value.status == 403
    assert core.list_namespaced_pod(ns).items == []  # and it may do its job
    assert core.list_node().items is not None
    assert AGENT_SA in kc.read_text() or "token" in kc.read_text()


def test_deploy_manifests_pass_server_side_dry_run(cluster_a) -> None:
    docs = []
    for path in sorted((REPO / "deploy" / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    assert {d["kind"] for d in docs} >= {"Namespace", "Deployment", "Role", "ClusterRole"}
    # the namespaces must exist for their objects to be admitted (a dry run creates none)
    cluster_a.apply_manifests([d for d in docs if d["kind"] == "Namespace"])
    out = cluster_a.apply_manifests(docs, dry_run=True)
    assert len(out) == len(docs)
    ns = cluster_a.core().read_namespace("training")
    assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"


RESTRICTED_POD = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "trainer", "image": "x", "command": ["true"],
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]}}}],
    "serviceAccountName": "trainer",
    # never scheduled (no node has this label): the pod objects are all this test needs
    "nodeSelector": {"computebroker.io/no-such-node": "x"},
}


def test_a_trainer_token_may_publish_progress_on_its_own_pod_only(cluster_a) -> None:
    """deploy/k8s/agent.yaml's admission policy: a token bound to pod A may set A's
    progress annotation, and nothing else: not A's labels or finalizers, not pod B."""
    ns = make_namespace(cluster_a)
    agent_kubeconfig(cluster_a, ns)  # applies the trainer service account, role and policy
    core = cluster_a.core()
    for name in ("a", "b"):
        core.create_namespaced_pod(ns, {"metadata": {
            "name": name, "labels": {"computebroker.io/attempt": "1"},
            "finalizers": ["computebroker.io/exit-code"]}, "spec": RESTRICTED_POD})
    pod_a = core.read_namespaced_pod("a", ns)
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=[], expiration_seconds=600, bound_object_ref=client.V1BoundObjectReference(
            kind="Pod", api_version="v1", name="a", uid=pod_a.metadata.uid)))
    token = core.create_namespaced_service_account_token("trainer", ns, req).status.token
    trainer = client.CoreV1Api(cluster_a.api_client(
        cluster_a.write_kubeconfig(f"trainer-{ns}", token=token)))
    progress = {"metadata": {"annotations": {"computebroker.io/progress": '{"step":1}'}}}
    try:
        # the admission policy may take a moment to be in force after its creation
        def allowed_once() -> bool:
            try:
                trainer.patch_namespaced_pod("b", ns, progress)
                return False
            except ApiException as e:
                return e.status in (403, 422) and "own pod" in e.body
        wait(allowed_once, timeout=30, what="the policy in force")
        trainer.patch_namespaced_pod("a", ns, progress)
        assert core.read_namespaced_pod("a", ns).metadata.annotations[
            "computebroker.io/progress"] == '{"step":1}'
        for bad in ({"metadata": {"labels": {"computebroker.io/attempt": "9"}}},
                    {"metadata": {"finalizers": None}},
                    {"metadata": {"annotations": {"computebroker.io/launch": "forged"}}}):
            with pytest.raises(ApiException) as e:
                trainer.patch_namespaced_pod("a", ns, bad)
            assert e.value.status in (403, 422), e.value.body
        with pytest.raises(ApiException) as e:
            trainer.delete_namespaced_pod("a", ns)
        assert e.value.status == 403
    finally:
        for name in ("a", "b"):
            core.patch_namespaced_pod(name, ns, {"metadata": {"finalizers": None}})
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
