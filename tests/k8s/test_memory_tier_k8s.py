"""The in-memory tier on Kubernetes: a node lost, the gang relaunched in place, every rank
restored from the keepers' memory.

Real: the API server (the namespace enforces the restricted Pod Security Standard), its
Job controller (the keepers are one-pod Jobs) and scheduler, the executor authenticated as
deploy/k8s/agent.yaml's
service account, the built-in trainer's gloo ranks in pods and the keepers in pods of
their own (region_agents/executors/k8s_keepers.py). Simulated: only the kubelet
(tests/fixtures/k8s/kubelet.py; each pod has its own 127.x.y.z address).

A 3-node job with ``memory_every=1`` gets a keeper per node, bound to its pod IP, its
token only in a Secret. Node ``mk-n1`` is lost mid-run (its rank pod and its keeper are
SIGKILLed, its heartbeats stop) and the agent's node-unhealthy path fails the attempt.
Attempt 2 on the survivors plus a spare restores from memory (the spare's rank from a
survivor's buddy copy), loses at most one step, and ends with an uninterrupted run's
samples and losses; the keepers go when the job succeeds.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from computebroker.v1 import common_pb2
from region_agents.executors.base import AttemptSpec
from region_agents.executors.k8s_keepers import (
    ANNOTATION_NODE,
    keeper_port,
    keeper_selector,
    token_secret_name,
)
from region_agents.executors.k8s_manifests import ANNOTATION_NODE_RANK, resource_name
from tests.e2e.test_migration import assert_equivalent, final_samples
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec, ProcessKubelet
from tests.k8s.helpers import (
    AS,
    end_everything,
    executor_for,
    poll_until,
    shared_dir,
    state_of,
    terminal,
    wait,
)
from tests.trainer.launch import launch, read_log

pytestmark = pytest.mark.slow

NODES = ["mk-n0", "mk-n1", "mk-n2"]
SPARE = "mk-spare"
STEPS, EVERY = 24, 5
JOB = "mk-job"


def trainer(log: Path, sleep: float, memory: bool = True) -> common_pb2.TrainerSpec:
    options = {"sample_log": str(log)}
    if memory:
        options["memory_every"] = "1"
    return common_pb2.TrainerSpec(total_steps=STEPS, checkpoint_every=EVERY, model="tiny",
                                  global_batch_size=6, seed=7, step_sleep_s=sleep,
                                  options=options)


def attempt(nodes: list[str], n: int, log: Path, ckpt: Path, sleep: float) -> AttemptSpec:
    spec = common_pb2.JobSpec(name=JOB, resources=common_pb2.Resources(nodes=3, gpus_per_node=1),
                              trainer=trainer(log, sleep))
    placement = common_pb2.Placement(region="us-east-2", world_size=3, nodes=[
        common_pb2.NodeAssignment(node_id=x, gpus=1) for x in nodes])
    return AttemptSpec(job_id=JOB, attempt=n, spec=spec, placement=placement,
                       checkpoint_uri=str(ckpt))


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    k = ProcessKubelet(cluster_a, [NodeSpec(name=n, gpus=1, cpu="8")
                                   for n in [*NODES, SPARE]]).start()
    try:
        yield k
    finally:
        k.stop()
        for n in [*NODES, SPARE]:
            cluster_a.core().delete_node(n)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The same training, uninterrupted, on 3 ranks started directly."""
    from google.protobuf.json_format import MessageToDict

    work = tmp_path_factory.mktemp("mk-reference")
    log = work / "samples.jsonl"
    spec = MessageToDict(trainer(log, 0.0, memory=False), preserving_proto_field_name=True)
    run = launch(work / "run", 3, spec, str(work / "ckpt"), job_id="j-ref")
    assert run.wait(300) == [0, 0, 0], run.output()
    return final_samples(log)


def keeper_pods(cp: ControlPlane, ns: str) -> list[Any]:
    return cp.core().list_namespaced_pod(ns, label_selector=keeper_selector(JOB)).items


def live_keepers(cp: ControlPlane, ns: str) -> dict[str, Any]:
    """node -> its keeper pod, running and ready."""
    out = {}
    for p in keeper_pods(cp, ns):
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp:
            out[p.metadata.annotations[ANNOTATION_NODE]] = p
    return out


def test_lost_node_replaced_in_place_restores_from_peer_memory_on_kubernetes(
        cluster_a: ControlPlane, kubelet: ProcessKubelet,
        reference: list[dict[str, Any]]) -> None:
    ex, ns = executor_for(cluster_a)
    batch = client.BatchV1Api(cluster_a.api_client())
    try:
        with shared_dir() as root:
            log, ckpt = root / "samples.jsonl", root / "ckpt"
            ckpt.mkdir()
            ckpt.chmod(0o777)
            ex.launch(attempt(NODES, 1, log, ckpt, sleep=0.3))
            ex.wait_created(JOB, 1, timeout=180)  # the keepers are made ready first

            # a keeper per node, each on its node, bound to its own pod IP
            keepers = live_keepers(cluster_a, ns)
            assert set(keepers) == set(NODES), [  # the keeper pods as they are, if not
                (p.status.phase, p.metadata.annotations) for p in keeper_pods(cluster_a, ns)]
            port = keeper_port(JOB)
            for node, p in keepers.items():
                assert p.spec.node_name == node
                assert p.status.pod_ip and not p.status.pod_ip.startswith("127.0.0.")
                c = p.spec.containers[0]
                assert "$(POD_IP)" in c.command and str(port) in c.command
                # restricted PSS (the API server enforced it at creation; spelled out)
                assert p.spec.security_context.run_as_non_root is True
                assert p.spec.security_context.seccomp_profile.type == "RuntimeDefault"
                assert c.security_context.allow_privilege_escalation is False
                assert c.security_context.capabilities.drop == ["ALL"]
            # the ranks get the keepers by node name, the token only by reference
            job = cluster_a.core().read_namespaced_pod(f"{resource_name(JOB, 1)}-0", ns)
            env = {e.name: e for e in job.spec.containers[0].env}
            assert env["CB_MEMORY_EVERY"].value == "1"
            assert env["CB_MEMORY_KEEPERS"].value == ",".join(
                f"{n}={keepers[n].status.pod_ip}:{port}" for n in NODES)
            ref = env["CB_MEMORY_TOKEN"].value_from.secret_key_ref
            assert env["CB_MEMORY_TOKEN"].value is None and ref.name == token_secret_name(JOB)
            token = base64.b64decode(
                cluster_a.core().read_namespaced_secret(ref.name, ns).data[ref.key]).decode()
            for p in keepers.values():
                assert token not in json.dumps(client.ApiClient().sanitize_for_serialization(p))
            assert token not in json.dumps(client.ApiClient().sanitize_for_serialization(job))
            survivors = {n: keepers[n].metadata.uid for n in ("mk-n0", "mk-n2")}

            events = poll_until(ex, lambda evs: log.exists() and len(read_log(log)) >= 12,
                                timeout=300, what="step 12")
            # node mk-n1 is lost: its rank pod and its keeper die, its heartbeats stop,
            # and the agent's node-unhealthy path fails the attempt blaming it
            kubelet.fail_node("mk-n1")
            ex.fail(JOB, 1, "node mk-n1 unhealthy: lost", ["mk-n1"])
            poll_until(ex, terminal(JOB, 1), what="attempt 1 to fail", events=events)
            end = state_of(events, JOB, 1)
            assert end.state == AS.ATTEMPT_STATE_FAILED and end.failed_nodes == ["mk-n1"]
            last = read_log(log)[-1]["step"]
            # a failed attempt keeps the survivors' keepers (their memory is the point)
            still = live_keepers(cluster_a, ns)
            assert {n: still[n].metadata.uid for n in survivors if n in still} == survivors

            ex.launch(attempt(["mk-n0", SPARE, "mk-n2"], 2, log, ckpt, sleep=0.0))
            where: dict[int, str] = {}

            def done(evs: list) -> bool:
                for p in ex.pods.snapshot().values():
                    meta = p["metadata"]
                    if meta.get("labels", {}).get("computebroker.io/attempt") == "2" \
                            and p["spec"].get("nodeName"):
                        where[int(meta["annotations"][ANNOTATION_NODE_RANK])] = p["spec"]["nodeName"]
                return terminal(JOB, 2)(evs)

            poll_until(ex, done, timeout=300, what="attempt 2 to end", events=events)
            end2 = state_of(events, JOB, 2)
            assert end2.state == AS.ATTEMPT_STATE_SUCCEEDED, end2.message
            assert sorted(where.values()) == sorted(["mk-n0", SPARE, "mk-n2"]), where

            rank0 = list(kubelet.root.glob(
                f"pods/{ns}_{resource_name(JOB, 2)}-0_*/volumes/shared/progress.json"))
            assert len(rank0) == 1, rank0
            prog = json.loads(rank0[0].read_text())
            assert prog["resume_tier"] == "memory", prog
            assert last - 1 <= prog["resumed_step"] <= last, (last, prog["resumed_step"])
            on_spare = [i for i, n in where.items() if n == SPARE]
            assert set(on_spare) <= set(prog["restored_from_peer"]), (where, prog)
            assert prog["memory_tier"]["taken"] > 0, prog

            samples = final_samples(log)
            assert [r["step"] for r in samples] == list(range(1, STEPS + 1))
            assert_equivalent(samples, reference)

            # the job succeeded: its keepers and their token go
            wait(lambda: (ex.poll() is not None and not batch.list_namespaced_job(
                ns, label_selector=keeper_selector(JOB)).items), timeout=60,
                 what="keeper Jobs removed")
            wait(lambda: not [s for s in cluster_a.core().list_namespaced_secret(ns).items
                              if s.metadata.name == token_secret_name(JOB)],
                 timeout=60, what="token Secret removed")
    finally:
        ex.shutdown()
        end_everything(cluster_a, ns, kubelet)
