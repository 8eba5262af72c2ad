"""KWOK on the real control plane: fake GPU nodes with the real labels stay Ready and
the real scheduler binds pods to them (the scale benchmark's ground)."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
from kubernetes.client import ApiException

from region_agents.executors import k8s_logs
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec
from tests.fixtures.k8s.kwok import Kwok
from tests.k8s.conftest import make_namespace


def test_kwok_nodes_are_ready_and_take_pods(cluster_b: ControlPlane, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
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
        _log_reader_parks_then_reads_at_the_end(cluster_b, ns, monkeypatch, tmp_path)
        for n in kwok.nodes:
            core.delete_node(n)
    finally:
        kwok.stop()


def _log_reader_parks_then_reads_at_the_end(cp: ControlPlane, ns: str,
                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The agent's reader of a pod whose log cannot be read (here: a KWOK pod, the real
    API server answering 500) stops after ``PARK_AFTER`` failed reads in a row instead
    of retrying for the pod's whole life, and reads once more when the container ends
    (the rest of its log comes before the attempt's end is reported)."""
    monkeypatch.setattr(k8s_logs, "RETRY_S", 0.05)  # the backoff's first steps, shortened
    logs = k8s_logs.PodLogs(cp.core(), ns, tmp_path, "c")
    try:
        pod = cp.api_client().sanitize_for_serialization(cp.core().read_namespaced_pod("p", ns))
        logs.sync("j", 1, [pod], lambda _p: k8s_logs.PodRanks(0, 1))
        ps = logs._attempts[("j", 1)].pods["p"]
        deadline = time.monotonic() + 30
        while not ps.parked and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ps.parked and ps.opens == k8s_logs.PARK_AFTER, (ps.parked, ps.opens)
        time.sleep(1.0)
        assert ps.opens == k8s_logs.PARK_AFTER  # parked: no read while the container runs
        ended = copy.deepcopy(pod)
        ended["status"]["containerStatuses"][0]["state"] = {
            "terminated": {"exitCode": 0, "reason": "Completed"}}
        logs.sync("j", 1, [ended], lambda _p: k8s_logs.PodRanks(0, 1))
        deadline = time.monotonic() + 30
        while ps.opens == k8s_logs.PARK_AFTER and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ps.opens > k8s_logs.PARK_AFTER and not ps.parked  # read again at its end
        assert not logs.drained("j", 1)  # nothing could be read: the executor's drain limit decides
    finally:
        logs.stop()
