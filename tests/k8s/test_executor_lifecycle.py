"""The Kubernetes executor against the REAL API server (tests/fixtures/k8s/controlplane.py):
real trainer attempts (``torchrun -m trainer``, tiny model, gloo on the CPU) in pods the
real scheduler binds to Node objects, run by the process-backed node fixture (the one
simulated part, tests/fixtures/k8s/kubelet.py). The executor authenticates as the agent
service account of deploy/k8s/agent.yaml; the namespace enforces the *restricted* Pod
Security Standard."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest

from region_agents.executors.k8s_manifests import FINALIZER, resource_name
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import ProcessKubelet
from tests.k8s.helpers import (
    AS,
    executor_for,
    poll_until,
    process_nodes,
    shared_dir,
    state_of,
    steps_saved,
    terminal,
    trainer_attempt,
    wait,
)

NODES = ["lc-n1", "lc-n2"]


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


def test_one_pod_trainer_runs_to_success_in_a_restricted_namespace(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            spec = trainer_attempt("solo", NODES[:1], ckpt, steps=8, every=4,
                                   env={"API_TOKEN": "s3cr3t"})
            ex.launch(spec)
            ex.wait_created("solo", 1)  # launch() hands the API requests to a creator thread
            name = resource_name("solo", 1)
            pod = cluster_a.core().read_namespaced_pod(f"{name}-0", ns)  # made by the agent
            assert FINALIZER in pod.metadata.finalizers
            assert pod.metadata.annotations["computebroker.io/node-rank"] == "0"
            assert not pod.metadata.owner_references  # no Job controller in between
            pod_spec = pod.spec
            assert pod_spec.hostname == f"{name}-0" and pod_spec.subdomain == name
            # restricted PSS (the API server enforced it at pod creation; spelled out here)
            assert pod_spec.security_context.run_as_non_root is True
            assert pod_spec.security_context.run_as_user != 0
            assert pod_spec.security_context.seccomp_profile.type == "RuntimeDefault"
            c = pod_spec.containers[0]
            assert c.security_context.allow_privilege_escalation is False
            assert c.security_context.capabilities.drop == ["ALL"]
            # the job's env is in a Secret owned by the Service, never inline
            assert all(e.name != "API_TOKEN" for e in c.env)
            assert "s3cr3t" not in str(pod.to_dict())
            sec = cluster_a.core().read_namespaced_secret(name, ns)
            assert base64.b64decode(sec.data["API_TOKEN"]).decode() == "s3cr3t"
            svc = cluster_a.core().read_namespaced_service(name, ns)
            assert sec.metadata.owner_references[0].uid == svc.metadata.uid
            env = {e.name: e.value for e in c.env}
            assert env["OMP_NUM_THREADS"] == "1"
            events = poll_until(ex, terminal("solo"), what="solo to finish")
            end = state_of(events, "solo")
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, (end.message, kubelet.logs(ns, f"{name}-0"))
            assert AS.ATTEMPT_STATE_RUNNING in [e.state for e in events]
            assert steps_saved(ckpt)[-1] == 8
            logs = "".join(kubelet.logs(ns, p.metadata.name)
                           for p in cluster_a.core().list_namespaced_pod(ns).items)
            assert "s3cr3t" not in logs or "API_TOKEN" not in logs
        # our finalizer was released and the objects go away
        wait(lambda: not [p for p in cluster_a.core().list_namespaced_pod(ns).items
                          if FINALIZER in (p.metadata.finalizers or [])], what="finalizers released")
        wait(lambda: not cluster_a.core().list_namespaced_secret(
            ns, label_selector="app.kubernetes.io/managed-by=computebroker-agent").items,
             what="secret deleted")
    finally:
        ex.shutdown()


def test_two_pod_gang_rendezvous_through_the_headless_service(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            ex.discover_nodes()
            # slow steps: the pods must still be there when RUNNING is seen
            ex.launch(trainer_attempt("gang", NODES, ckpt, steps=8, every=4, sleep=1.0))
            name = resource_name("gang", 1)
            events = poll_until(ex, lambda evs: any(e.state == AS.ATTEMPT_STATE_RUNNING
                                                    for e in evs), what="gang to run")
            pods = cluster_a.core().list_namespaced_pod(ns).items
            # one pod per placed node, bound by the real scheduler
            assert sorted(p.spec.node_name for p in pods) == sorted(NODES)
            env = {e.name: e.value for e in pods[0].spec.containers[0].env if e.value}
            assert env["MASTER_ADDR"] == f"{name}-0.{name}"
            assert env["WORLD_SIZE"] == "2"
            events = poll_until(ex, terminal("gang"), what="gang to finish", events=events)
            end = state_of(events, "gang")
            logs = "\n".join(kubelet.logs(ns, p.metadata.name) for p in pods)
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, (end.message, logs)
            assert steps_saved(ckpt)[-1] == 8
    finally:
        ex.shutdown()


def test_a_crashed_pod_fails_the_gang_with_its_exit_code_and_node(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            crash = ("import os,sys,time\n"
                     "if os.environ['NODE_RANK'] == '1': sys.exit(3)\n"
                     "time.sleep(600)\n")
            ex.launch(trainer_attempt("crash", NODES, ckpt, command=("python", "-c", crash)))
            events = poll_until(ex, terminal("crash"), what="crash to be reported")
            end = state_of(events, "crash")
            assert end.state == AS.ATTEMPT_STATE_FAILED
            assert end.exit_code == 3, end.message
            pods = {p.metadata.annotations["computebroker.io/node-rank"]: p
                    for p in cluster_a.core().list_namespaced_pod(ns).items}
            if "1" in pods:
                assert end.failed_nodes == [pods["1"].spec.node_name]
            assert len(end.failed_nodes) == 1 and end.failed_nodes[0] in NODES
            # the other pod (sleeping) was killed: nothing of the gang runs on
            wait(lambda: not cluster_a.core().list_namespaced_pod(ns).items, what="pods gone")
    finally:
        ex.shutdown()


def test_checkpoint_first_stop_ends_checkpointed_with_exit_75(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            ex.launch(trainer_attempt("stopme", NODES, ckpt, steps=100000, every=5, sleep=0.2))
            wait(lambda: steps_saved(ckpt), timeout=240, what="a first checkpoint")
            events = poll_until(ex, lambda evs: any(e.state == AS.ATTEMPT_STATE_RUNNING
                                                    for e in evs), what="running")
            ex.stop("stopme", 1, checkpoint_first=True, grace_s=60)
            events = poll_until(ex, terminal("stopme"), what="stop to end", events=events)
            end = state_of(events, "stopme")
            assert end.state == AS.ATTEMPT_STATE_CHECKPOINTED, end.message
            assert end.exit_code == 75
            assert AS.ATTEMPT_STATE_CHECKPOINTING in [e.state for e in events]
            # the preStop hook handed the Stop's deadline (the pods' deletionTimestamp) over
            written = list(kubelet.root.glob(f"pods/{ns}_*/volumes/shared/stop-deadline.json"))
            assert len(written) == 2
            assert json.loads(written[0].read_text())["grace_s"] == 60
            wait(lambda: not cluster_a.core().list_namespaced_pod(ns).items, what="pods gone")
    finally:
        ex.shutdown()


def test_a_kill_stop_ends_stopped(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            ex.launch(trainer_attempt("killme", NODES[:1], ckpt,
                                      command=("python", "-c", "import time; time.sleep(600)")))
            poll_until(ex, lambda evs: any(e.state == AS.ATTEMPT_STATE_RUNNING for e in evs),
                       what="running")
            ex.stop("killme", 1, checkpoint_first=False, grace_s=0)
            end = state_of(poll_until(ex, terminal("killme"), what="stopped"), "killme")
            assert end.state == AS.ATTEMPT_STATE_STOPPED
            # grace 0: the kubelet's SIGTERM and SIGKILL come together; either ends it
            assert end.exit_code in (137, 143), end.message
    finally:
        ex.shutdown()


def test_an_attempt_the_api_server_refuses_ends_failed_with_its_message(cluster_a, kubelet) -> None:
    """launch() returns before the API requests are made (a creator thread makes them):
    a refusal (here: a Secret of that name already exists, 409) is reported through
    poll() as FAILED with the API server's words, and nothing of the attempt is left."""
    ex, ns = executor_for(cluster_a)
    name = resource_name("taken", 1)
    cluster_a.core().create_namespaced_secret(ns, {"metadata": {"name": name},
                                                   "stringData": {"x": "y"}})
    try:
        with shared_dir() as ckpt:
            ex.launch(trainer_attempt("taken", NODES[:1], ckpt, steps=2))
            end = state_of(poll_until(ex, terminal("taken"), what="refusal reported"), "taken")
            assert end.state == AS.ATTEMPT_STATE_FAILED
            assert end.exit_code == -1
            assert "kubernetes refused the attempt: 409" in end.message, end.message
            wait(lambda: not cluster_a.core().list_namespaced_pod(ns).items, what="pods deleted")
            assert not cluster_a.core().list_namespaced_service(ns).items
    finally:
        ex.shutdown()
        cluster_a.core().delete_namespaced_secret(name, ns)


def test_a_stop_while_the_objects_are_being_created_still_stops_the_attempt(cluster_a,
                                                                           kubelet) -> None:
    """A Stop that arrives before the creator thread has made the pods is applied by it:
    the attempt ends STOPPED and none of its pods keeps running."""
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            ex.launch(trainer_attempt("early", NODES[:1], ckpt,
                                      command=("python", "-c", "import time; time.sleep(600)")))
            ex.stop("early", 1, checkpoint_first=False, grace_s=0)
            end = state_of(poll_until(ex, terminal("early"), what="stopped"), "early")
            assert end.state == AS.ATTEMPT_STATE_STOPPED, end.message
            wait(lambda: not cluster_a.core().list_namespaced_pod(ns).items, what="pods gone")
    finally:
        ex.shutdown()
