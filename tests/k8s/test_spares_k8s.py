"""Spares on Kubernetes, end to end: an operator labels a Node ``computebroker.io/spare=true``,
the broker keeps it free, and a job that loses a node is replaced in place on it.

Real: the broker process (TLS, SQLite), a ``brokerctl agent --executor kubernetes``
process authenticated as deploy/k8s/agent.yaml's service account, the API server with
its scheduler and Job controller, the built-in trainer's gloo ranks in pods, the memory
keepers in pods of their own, moto's S3 server for the durable checkpoints. Simulated:
only the kubelet (tests/fixtures/k8s/kubelet.py).

Four 1-GPU nodes; ``sp-n0`` (the lowest name, which the broker's count-only choice would
never pick) is labelled a spare. The broker registers it as the pool's spare, `brokerctl
capacity` shows it, a 4-node job waits saying only reserved spares are free, a 3-node job
with the memory tier runs on the other three. HyperPod's health agent then marks one of
them ``UnschedulablePendingReplacement``: the agent fails the attempt blaming that node,
the broker replaces it in place with the labelled spare (the job's team has the quota
for it), the spare's keeper pod asks for the memory the ranks' snapshots need, and the
ranks restore from their peers' memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from region_agents.executors.k8s_keepers import keeper_selector
from region_agents.executors.k8s_nodes import HYPERPOD_HEALTH
from region_agents.labels import LABEL_SPARE
from tests.e2e.test_foundation import setup_team, spec
from tests.fixtures.cluster import Cluster, wait_until
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec, ProcessKubelet
from tests.k8s.agent_identity import TRAINER_SA, agent_kubeconfig
from tests.k8s.conftest import make_namespace
from tests.k8s.helpers import shared_dir

pytestmark = pytest.mark.slow

REGION = "us-east-2"
SPARE, NODES = "sp-n0", ["sp-n1", "sp-n2", "sp-n3"]
POOL = "p5"
STEPS, EVERY, SLEEP = 40, 10, 0.3


@pytest.fixture(scope="module")
def kubelet(cluster_b: ControlPlane) -> Iterator[ProcessKubelet]:
    names = [SPARE, *NODES]
    k = ProcessKubelet(cluster_b, [
        NodeSpec(name=n, region=REGION, gpus=1, cpu="8",
                 labels={"computebroker.io/pool": POOL, **({LABEL_SPARE: "true"} if n == SPARE else {})})
        for n in names]).start()
    try:
        yield k
    finally:
        k.stop()
        for n in names:
            cluster_b.core().delete_node(n)


@pytest.fixture(scope="module")
def fleet(cluster_b: ControlPlane, kubelet: ProcessKubelet, s3_server: Any) -> Iterator[tuple[Cluster, str]]:
    with shared_dir() as root:
        c = Cluster(root=root / "cb")
        c.extra_env = dict(s3_server.env)
        c.broker_args = ["--agent-timeout", "10", "--heartbeat-interval", "1"]
        bucket = s3_server.unique_bucket("cb-spares")
        ns = make_namespace(cluster_b, prefix="spares")
        try:
            c.start_broker()
            c.extra_env["KUBECONFIG"] = str(agent_kubeconfig(cluster_b, ns))
            c.start_agent(REGION, "--executor", "kubernetes", "--namespace", ns,
                          "--service-account", TRAINER_SA, checkpoint_bucket=f"s3://{bucket}")
            with c.client() as client:
                setup_team(client)
                wait_until(lambda: any(r.connected and r.total_gpus == 4 for r in client.regions()),
                           timeout=180, what=f"the Kubernetes region\n{c.logs()}")
            yield c, ns
        finally:
            c.stop()
            os.environ.pop("KUBECONFIG", None)


def cli(c: Cluster, *args: str, columns: str = "100") -> str:
    env = dict(c.env(), COLUMNS=columns, NO_COLOR="1")
    res = subprocess.run([sys.executable, "-m", "brokerctl", "--broker", c.address, *args],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, f"brokerctl {' '.join(args)}: {res.returncode}\n{res.stderr}"
    return res.stdout


def test_the_broker_sees_and_keeps_the_labelled_kubernetes_spare(fleet: tuple[Cluster, str]) -> None:
    c, _ = fleet
    nodes = cli(c, "capacity", "--nodes")
    spare_lines = [line for line in nodes.splitlines() if SPARE in line]
    assert spare_lines and "spare" in spare_lines[0], nodes
    assert not [line for n in NODES for line in nodes.splitlines() if n in line and "spare" in line], nodes
    summary = cli(c, "capacity", columns="80")
    assert "SPARE" in summary, summary
    with c.client() as client:
        handle = client.submit(spec("needs-four", nodes=4, gpus=1))
        reason = wait_until(lambda: handle.status().pending_reason, timeout=60,
                            what=f"a pending reason\n{c.logs()}")
        assert reason.startswith(f"only reserved spares are free in pool {POOL} of {REGION}/"), reason
        client.cancel(handle.id)


def test_a_lost_node_is_replaced_in_place_by_the_labelled_spare(
        fleet: tuple[Cluster, str], cluster_b: ControlPlane, s3_server: Any) -> None:
    c, ns = fleet
    with c.client() as client:
        s = spec("k8s-spare", steps=STEPS, every=EVERY, sleep=SLEEP, nodes=3, gpus=1)
        s.trainer.options["memory_every"] = "1"
        s.env.update(s3_server.env)  # the pods reach the store (a Secret, not inline)
        handle = client.submit(s)
        running = wait_until(
            lambda: (j := handle.status()).phase == pb.JOB_PHASE_RUNNING and j.progress.step >= 6 and j,
            timeout=420, what=f"running past step 6\n{c.logs()}")
        placed = [n.node_id for n in running.placement.nodes]
        assert sorted(placed) == NODES, placed  # never on the spare
        lost = placed[1]
        # HyperPod's health agent marks the node for replacement: the agent fails the
        # attempt blaming it (its node-unhealthy path), the broker decides the relaunch
        cluster_b.core().patch_node(lost, {"metadata": {"labels": {
            HYPERPOD_HEALTH: "UnschedulablePendingReplacement"}}})
        second = wait_until(lambda: (j := handle.status()).attempt >= 2 and j.placement.nodes and j,
                            timeout=300, what=f"attempt 2\n{c.logs()}")
        again = [n.node_id for n in second.placement.nodes]
        story = "\n".join(f"{e.type} {e.message}" for e in client.job(handle.id).events(follow=False))
        assert again == [SPARE if n == lost else n for n in placed], f"{again}\n{story}"
        assert second.node_recovery.plan == "replace_in_place", story
        # the spare's keeper asks for memory (the ranks reported their snapshot size)
        keepers = cluster_b.core().list_namespaced_pod(ns, label_selector=keeper_selector(handle.id)).items
        on_spare = [p for p in keepers if p.spec.node_name == SPARE]
        assert on_spare, [(p.spec.node_name, p.status.phase) for p in keepers]
        req = on_spare[0].spec.containers[0].resources
        assert req.requests["memory"] != "64Mi" and req.limits and req.limits["memory"], req
        done = handle.wait(timeout=600)
        story = "\n".join(f"{e.type} {e.message}" for e in client.job(handle.id).events(follow=False))
        assert done.phase == pb.JOB_PHASE_SUCCEEDED, f"{story}\n{c.logs()}"
        assert "recovered from memory" in story, story
        assert done.progress.step == STEPS
    out = cli(c, "job", handle.id)
    assert "replacing in place" in " ".join(out.split()), out
