"""Restart safety on the REAL API server: an agent process that dies (no shutdown, no
cleanup: the executor object is dropped, as a SIGKILL would leave it) and a new one
started in its place re-adopt the attempts from the cluster; the pods' finalizer keeps
their exit codes for it; a newer attempt of a job never starts while an older one can
still write."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from region_agents.executors.k8s_manifests import FINALIZER
from region_agents.executors.kubernetes import pod_ended
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import ProcessKubelet
from tests.k8s.agent_identity import TRAINER_SA
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

NODES = ["rs-n1", "rs-n2"]


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


def _successor(ex):
    """A new agent process's executor: same identity, nothing shared but the cluster."""
    from region_agents.executors.kubernetes import KubernetesExecutor

    ex.shutdown()  # only its watch threads: a SIGKILLed agent leaves the cluster as it is
    return KubernetesExecutor(namespace=ex.namespace, region=ex.region,
                              api_client=ex.core.api_client, service_account=TRAINER_SA,
                              grace_s=30, log_dir=str(ex.pod_logs.root) if ex.pod_logs else "")


def test_a_restarted_agent_readopts_and_fences_before_the_next_attempt(cluster_a, kubelet) -> None:
    first, ns = executor_for(cluster_a)
    ex = first
    try:
        with shared_dir() as ckpt:
            first.launch(trainer_attempt("adopt", NODES, ckpt, steps=100000, every=4, sleep=0.3))
            poll_until(first, lambda evs: any(e.state == AS.ATTEMPT_STATE_RUNNING for e in evs),
                       what="running")
            ex = _successor(first)
            ex.recover()
            assert ex.known_attempts() == {"adopt": 1}
            (info,) = ex.running()
            assert (info.job_id, info.attempt) == ("adopt", 1)
            assert info.state == AS.ATTEMPT_STATE_RUNNING
            assert sorted(info.node_ids) == sorted(NODES)  # the Launch, from the annotation
            wait(lambda: steps_saved(ckpt), timeout=120, what="the adopted attempt to save")
            # the broker relaunches (attempt 2) while attempt 1 still trains: it is fenced
            ex.launch(trainer_attempt("adopt", NODES[:1], ckpt, attempt=2, steps=100000,
                                      every=100000, sleep=0.3))
            # launch() returns at once (the fence waits on a thread of its own); once
            # attempt 2's pods exist, every pod of attempt 1 had ended
            assert ex.known_attempts()["adopt"] == 2
            ex.wait_created("adopt", 2, timeout=150)
            new = [p for p in cluster_a.core().list_namespaced_pod(ns).items
                   if p.metadata.labels["computebroker.io/attempt"] == "2"]
            assert new, "attempt 2's pods were made"
            old = [p for p in cluster_a.core().list_namespaced_pod(ns).items
                   if p.metadata.labels["computebroker.io/attempt"] == "1"]
            for p in old:  # every pod of attempt 1 had ended before attempt 2 existed
                obj = cluster_a.api_client().sanitize_for_serialization(p)
                assert pod_ended(obj, 0.0), obj["status"]
            events = poll_until(ex, terminal("adopt", 1), what="attempt 1's end")
            one = state_of(events, "adopt", 1)
            assert one.state == AS.ATTEMPT_STATE_STOPPED and one.exit_code == 137, one.message
            ex.stop("adopt", 2, checkpoint_first=False, grace_s=0)
            poll_until(ex, terminal("adopt", 2), what="attempt 2 stopped", events=events)
    finally:
        ex.shutdown()


def test_a_stop_begun_by_a_dead_agent_is_reported_truthfully_by_its_successor(cluster_a,
                                                                            kubelet) -> None:
    first, ns = executor_for(cluster_a)
    ex = first
    try:
        with shared_dir() as ckpt:
            first.launch(trainer_attempt("truth", NODES, ckpt, steps=100000, every=5, sleep=0.2))
            wait(lambda: steps_saved(ckpt), timeout=240, what="a first checkpoint")
            first.stop("truth", 1, checkpoint_first=True, grace_s=60)
            ex = _successor(first)  # died right after deleting the pods
            ex.recover()
            assert [(r.job_id, r.attempt) for r in ex.running()] == [("truth", 1)]
            events = poll_until(ex, terminal("truth"), what="the stop's end")
            end = state_of(events, "truth")
            assert end.state == AS.ATTEMPT_STATE_CHECKPOINTED, end.message
            assert end.exit_code == 75
            wait(lambda: not [p for p in cluster_a.core().list_namespaced_pod(ns).items
                              if FINALIZER in (p.metadata.finalizers or [])],
                 what="finalizers released")
    finally:
        ex.shutdown()


def test_a_gang_half_made_by_a_dead_agent_is_completed_by_its_successor(cluster_a,
                                                                         kubelet) -> None:
    """The agent makes a gang's pods itself (no Job controller finishes what it began):
    an agent that died after the Service, the Secret and pod 0 leaves an attempt whose
    successor makes pod 1 (the same manifest, from the Launch on the Service and pod 0)
    and runs it to its end; one that died after the Service alone leaves an attempt its
    successor reports FAILED (the env in the Secret may never have been written) and
    cleans up."""
    from region_agents.executors.k8s_manifests import build_manifests, owner_reference

    ex, ns = executor_for(cluster_a)  # the dead agent: what it left is made by hand below
    admin = cluster_a.core()
    api = cluster_a.api_client()
    successor = None
    try:
        with shared_dir() as ckpt:
            half = build_manifests(trainer_attempt("half", NODES, ckpt, steps=8, every=4),
                                   namespace=ns, service_account=TRAINER_SA, grace_s=30)
            svc = api.sanitize_for_serialization(admin.create_namespaced_service(ns, half.service))
            half.secret.metadata.owner_references = [owner_reference(svc)]
            admin.create_namespaced_secret(ns, half.secret)
            admin.create_namespaced_pod(ns, half.pods[0])
            bare = build_manifests(trainer_attempt("bare", NODES[:1], ckpt), namespace=ns)
            admin.create_namespaced_service(ns, bare.service)

            successor = _successor(ex)
            successor.recover()
            assert sorted((r.job_id, r.attempt) for r in successor.running()) == [
                ("bare", 1), ("half", 1)]
            events = poll_until(successor, lambda evs: terminal("half")(evs)
                                and terminal("bare")(evs), what="both ends", timeout=240)
            end = state_of(events, "half")
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end.message
            assert steps_saved(ckpt)[-1] == 8
            lost = state_of(events, "bare")
            assert lost.state == AS.ATTEMPT_STATE_FAILED and lost.exit_code == -1
            assert "before any pod" in lost.message
            wait(lambda: not admin.list_namespaced_service(ns).items
                 and not admin.list_namespaced_pod(ns).items, what="both cleaned up")
            assert not admin.list_namespaced_secret(
                ns, label_selector="app.kubernetes.io/managed-by=computebroker-agent").items
    finally:
        if successor is not None:
            successor.shutdown()
