"""The tests' Kubernetes control plane is real, and the node fixture behaves as a kubelet
does where our executor depends on it. These are the fixture's own tests: if one fails,
every Kubernetes test after it means nothing."""

from __future__ import annotations

import os
import time

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec, ProcessKubelet
from tests.k8s.conftest import make_namespace

RESTRICTED = {
    "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SC = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _wait(pred, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def kubelet(cluster_a: ControlPlane, request):
    name = f"fx-{request.node.name[-20:].lower().replace('_', '-').strip('-')}"
    k = ProcessKubelet(cluster_a, [NodeSpec(name=name, gpus=2)]).start()
    try:
        yield k
    finally:
        k.stop()
        cluster_a.core().delete_node(name)


def test_api_server_is_real_and_enforces_rbac_and_pod_security(cluster_a: ControlPlane) -> None:
    core = cluster_a.core()
    v = client.VersionApi(cluster_a.api_client()).get_code()
    assert v.git_version.startswith("v1.")
    # RBAC: a service account without roles may not list pods
    ns = make_namespace(cluster_a)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "nobody"}})
    sa = cluster_a.core(cluster_a.kubeconfig_for_service_account(ns, "nobody"))
    with pytest.raises(ApiException) as e:
        sa.list_namespaced_pod(ns)
    assert e.value.status == 403
    # Pod Security admission: a root pod is refused in a restricted namespace
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(ns, {"metadata": {"name": "root"}, "spec": {
            "containers": [{"name": "c", "image": "x", "command": ["true"]}]}})
    assert e.value.status == 403 and "restricted" in e.value.body


def test_node_fixture_runs_a_pod_with_env_volumes_and_status(cluster_a, kubelet, tmp_path) -> None:
    core = cluster_a.core()
    ns = make_namespace(cluster_a)
    node = next(iter(kubelet.nodes))
    n = _wait(lambda: core.read_node(node), what="node")
    assert n.metadata.labels["topology.kubernetes.io/region"] == "us-east-2"
    assert n.status.allocatable["nvidia.com/gpu"] == "2"
    core.create_namespaced_secret(ns, {"metadata": {"name": "s"}, "string_data": {"tok": "sekret"}})
    script = ('import os,pathlib; p=pathlib.Path("/work/out.txt"); '
              'p.write_text(os.environ["POD"]+" "+os.environ["TOK"]+" "+os.environ["IDX"]+" "'
              '+str(os.getuid())); print("hello from", os.environ["POD"])')
    core.create_namespaced_pod(ns, {"metadata": {"name": "p", "annotations": {"idx": "3"}}, "spec": {
        "restartPolicy": "Never", "securityContext": RESTRICTED,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [{"name": "c", "image": "any", "securityContext": CONTAINER_SC,
                        "command": ["python", "-c", script],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "IDX", "valueFrom": {"fieldRef": {
                                    "fieldPath": "metadata.annotations['idx']"}}},
                                {"name": "TOK", "valueFrom": {"secretKeyRef": {"name": "s", "key": "tok"}}}],
                        "volumeMounts": [{"name": "w", "mountPath": "/work"}]}],
        "volumes": [{"name": "w", "emptyDir": {}}]}})
    pod = _wait(lambda: (p := core.read_namespaced_pod("p", ns)).status.phase in ("Succeeded", "Failed") and p,
                what="pod to finish")
    assert pod.status.phase == "Succeeded", kubelet.logs(ns, "p")
    assert pod.spec.node_name == node  # bound by the real scheduler
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 0
    out = next(kubelet.root.glob(f"pods/{ns}_p_*/volumes/w/out.txt")).read_text()
    # the pod's runAsUser as root; a normal user's own uid (user namespace: see kubelet.py)
    assert out == f"p sekret 3 {65534 if os.geteuid() == 0 else os.getuid()}"
    assert "hello from p" in kubelet.logs(ns, "p")


def test_pod_logs_go_through_the_api_server_to_the_node_log_endpoint(cluster_a, kubelet) -> None:
    """``kubectl logs`` (and any ``pods/log`` reader) reaches the node fixture's HTTPS
    log endpoint through the real API server: stdout and stderr interleaved, the
    kubelet's query parameters honoured, a follow that ends with the container, and
    RBAC on ``pods/log`` enforced by the API server."""
    core = cluster_a.core()
    ns = make_namespace(cluster_a)
    script = ("import sys,time\n"
              "for i in range(3):\n"
              "    print('out', i, flush=True); print('err', i, file=sys.stderr, flush=True)\n"
              "    time.sleep(0.3)\n"
              "time.sleep(1.5)\nprint('last', flush=True)\n")
    core.create_namespaced_pod(ns, {"metadata": {"name": "lg"}, "spec": {
        "restartPolicy": "Never", "securityContext": RESTRICTED,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [{"name": "c", "image": "any", "securityContext": CONTAINER_SC,
                        "command": ["python", "-c", script]}]}})
    _wait(lambda: (p := core.read_namespaced_pod("lg", ns)).status.container_statuses
          and p.status.container_statuses[0].state.running, what="container running")
    # follow from the start: every line, then the stream ends when the container does
    resp = core.read_namespaced_pod_log("lg", ns, container="c", follow=True, timestamps=True,
                                        _preload_content=False, _request_timeout=(10, 60))
    followed = resp.read().decode().splitlines()
    resp.release_conn()
    texts = [line.split(" ", 1)[1] for line in followed]
    # each stream in order; across the two, as their copiers got to them (as a runtime)
    assert [t for t in texts if not t.startswith("err")] == ["out 0", "out 1", "out 2",
                                                            "last"], followed
    assert [t for t in texts if t.startswith("err")] == ["err 0", "err 1", "err 2"], followed
    assert all(line.split(" ", 1)[0].endswith("Z") for line in followed)
    assert core.read_namespaced_pod("lg", ns).status.container_statuses[0].state.terminated
    # the same through kubectl, with the kubelet's own parameters
    assert cluster_a.kubectl("logs", "-n", ns, "lg", "--tail=2").stdout.splitlines() == texts[-2:]
    assert cluster_a.kubectl("logs", "-n", ns, "lg", "--limit-bytes=6").stdout == texts[0] + "\n"
    assert cluster_a.kubectl("logs", "-n", ns, "lg", "--since=1h").stdout.count("\n") == 7
    # pods/log is its own permission: pods get/list is not enough
    core.create_namespaced_service_account(ns, {"metadata": {"name": "reader"}})
    rbac = client.RbacAuthorizationV1Api(cluster_a.api_client())
    rbac.create_namespaced_role(ns, {"metadata": {"name": "pods"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]})
    reader = cluster_a.core(cluster_a.kubeconfig_for_service_account(ns, "reader"))
    assert reader.read_namespaced_pod("lg", ns).metadata.name == "lg"
    with pytest.raises(ApiException) as e:
        reader.read_namespaced_pod_log("lg", ns)
    assert e.value.status == 403 and "pods/log" in e.value.body


def test_node_fixture_honours_graceful_deletion(cluster_a, kubelet) -> None:
    """preStop first, then SIGTERM; SIGKILL only at the deadline."""
    core = cluster_a.core()
    ns = make_namespace(cluster_a)
    script = ("import signal,sys,time,pathlib\n"
              "def term(*a):\n"
              "    pathlib.Path('/work/term').write_text(str(pathlib.Path('/work/prestop').exists()))\n"
              "    sys.exit(75)\n"
              "signal.signal(signal.SIGTERM, term)\n"
              "print('ready', flush=True)\n"
              "time.sleep(600)\n")
    core.create_namespaced_pod(ns, {"metadata": {"name": "g", "finalizers": ["computebroker.io/test"]}, "spec": {
        "restartPolicy": "Never", "securityContext": RESTRICTED, "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "c", "image": "any", "securityContext": CONTAINER_SC,
                        "command": ["python", "-c", script],
                        "lifecycle": {"preStop": {"exec": {"command": ["python", "-c",
                                      "import pathlib; pathlib.Path('/work/prestop').write_text('x')"]}}},
                        "volumeMounts": [{"name": "w", "mountPath": "/work"}]}],
        "volumes": [{"name": "w", "emptyDir": {}}]}})
    _wait(lambda: core.read_namespaced_pod("g", ns).status.phase == "Running", what="running")
    _wait(lambda: "ready" in kubelet.logs(ns, "g"), what="ready line")
    t0 = time.monotonic()
    core.delete_namespaced_pod("g", ns, grace_period_seconds=30)
    # our finalizer keeps the object: the exit code is readable after the process ended
    pod = _wait(lambda: (p := core.read_namespaced_pod("g", ns)).status.container_statuses[0].state.terminated and p,
                what="terminated status")
    assert time.monotonic() - t0 < 25, "SIGTERM came at the deadline, not at once"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 75
    assert next(kubelet.root.glob(f"pods/{ns}_g_*/volumes/w/term")).read_text() == "True"
    core.patch_namespaced_pod("g", ns, {"metadata": {"finalizers": None}})
    _wait(lambda: not core.list_namespaced_pod(ns).items, what="pod gone")
