"""KWOK on the real control plane: fake GPU nodes with the real labels stay Ready and
the real scheduler binds pods to them (the scale benchmark's ground)."""

from __future__ import annotations

import time

import pytest
from kubernetes.client import ApiException

from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec
from tests.fixtures.k8s.kwok import Kwok
from tests.k8s.conftest import make_namespace


def test_kwok_nodes_are_ready_and_take_pods(cluster_b: ControlPlane) -> None:
    kwok = Kwok(cluster_b).start()
    try:
        kwok.add_nodes([NodeSpec(name=f"kwok-gpu-{i}", gpus=8, ultraserver=f"u{i // 2}")
                        for i in range(4)])
        core = cluster_b.core()
        deadline = time.monotonic() + 60
        ready: set[str] = set()
        while time.monotonic() < deadline and len(ready) < 4:
            for n in core.list_node(label_selector="kwok.x-k8s.io/node=fake").items:
                if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []):
                    ready.add(n.metadata.name)
            time.sleep(0.5)
        assert len(ready) == 4, kwok.tail()
        ns = make_namespace(cluster_b, restricted=False)
        core.create_namespaced_pod(ns, {"metadata": {"name": "p"}, "spec": {
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [{"name": "c", "image": "fake",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
        deadline = time.monotonic() + 60
        pod = None
        while time.monotonic() < deadline:
            pod = core.read_namespaced_pod("p", ns)
            if pod.status.phase == "Running":
                break
            time.sleep(0.5)
        assert pod is not None and pod.status.phase == "Running", kwok.tail()
        assert pod.spec.node_name in ready
        # KWOK's nodes serve no container logs here: the agent's pods/log read of a KWOK
        # pod fails (and backs off), which the scale benchmark's numbers include
        with pytest.raises(ApiException) as e:
            core.read_namespaced_pod_log("p", ns, _request_timeout=30)
        assert e.value.status >= 400, e.value
        for n in kwok.nodes:
            core.delete_node(n)
    finally:
        kwok.stop()
