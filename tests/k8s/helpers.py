"""Shared pieces of the executor tests on the real API server."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from computebroker.v1 import agent_pb2, common_pb2
from region_agents.executors.base import AttemptEvent, AttemptSpec
from region_agents.executors.kubernetes import KubernetesExecutor
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec, ProcessKubelet
from tests.k8s.agent_identity import TRAINER_SA, agent_kubeconfig
from tests.k8s.conftest import make_namespace

AS = agent_pb2.AttemptState


@contextmanager
def shared_dir() -> Iterator[Path]:
    """A checkpoint directory the pods' non-root user can write (pytest's tmp_path is
    private to root): the fixture's pods see the host's file system."""
    d = Path(tempfile.mkdtemp(prefix="cb-k8s-ckpt-", dir="/tmp"))
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def executor_for(cp: ControlPlane, region: str = "us-east-2") -> tuple[KubernetesExecutor, str]:
    """A fresh restricted namespace and an executor in it, authenticated as the agent's
    service account of deploy/k8s/agent.yaml (and nothing more); it reads its pods'
    output through pods/log as the agent's does (into a fresh directory)."""
    ns = make_namespace(cp)
    kubeconfig = agent_kubeconfig(cp, ns)
    ex = KubernetesExecutor(namespace=ns, region=region, api_client=cp.api_client(kubeconfig),
                            service_account=TRAINER_SA, grace_s=30,
                            log_dir=tempfile.mkdtemp(prefix="cb-k8s-logs-"))
    return ex, ns


def trainer_attempt(job: str, nodes: list[str], ckpt: Path, *, attempt: int = 1, steps: int = 12,
                    sleep: float = 0.0, command: tuple[str, ...] = (), every: int = 4,
                    env: dict[str, str] | None = None, standby: bool = False) -> AttemptSpec:
    spec = common_pb2.JobSpec(
        name=job, command=list(command),
        resources=common_pb2.Resources(nodes=len(nodes), gpus_per_node=1),
        trainer=common_pb2.TrainerSpec(total_steps=steps, checkpoint_every=every, model="tiny",
                                       global_batch_size=4, seed=7, step_sleep_s=sleep),
        env=env or {})
    placement = common_pb2.Placement(region="us-east-2", world_size=len(nodes), nodes=[
        common_pb2.NodeAssignment(node_id=n, gpus=1) for n in nodes])
    return AttemptSpec(job_id=job, attempt=attempt, spec=spec, placement=placement,
                       checkpoint_uri=str(ckpt), standby=standby)


def poll_until(ex: KubernetesExecutor, pred: Callable[[list[AttemptEvent]], bool],
               timeout: float = 240.0, what: str = "events",
               events: list[AttemptEvent] | None = None) -> list[AttemptEvent]:
    """Poll the executor (as the agent's ticker does) until ``pred(all events)``."""
    events = events if events is not None else []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events.extend(ex.poll())
        if pred(events):
            return events
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; events: "
                         f"{[(e.job_id, e.attempt, AS.Name(e.state), e.exit_code, e.message) for e in events]}")


def terminal(job: str, attempt: int = 1) -> Callable[[list[AttemptEvent]], bool]:
    return lambda evs: any(e.job_id == job and e.attempt == attempt and e.terminal for e in evs)


def state_of(events: list[AttemptEvent], job: str, attempt: int = 1) -> AttemptEvent:
    return [e for e in events if e.job_id == job and e.attempt == attempt][-1]


def steps_saved(ckpt: Path) -> list[int]:
    """Complete checkpoints (a manifest present) in a job's checkpoint directory."""
    return sorted(int(p.name.split("-")[1]) for p in ckpt.glob("step-*")
                  if (p / "manifest.json").exists() or any(p.glob("*manifest*")))


def wait(pred: Callable[[], object], timeout: float = 60.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def our_pods(cp: ControlPlane, ns: str) -> list:
    return cp.core().list_namespaced_pod(ns).items


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def end_everything(cp: ControlPlane, ns: str, kubelet: object, timeout: float = 60.0) -> None:
    """After a test (also a failed one): delete every Job and pod of ``ns`` at once and
    wait until the node fixture has no process of them left, so nothing outlives the
    test (a pod started while the fixture stops could otherwise be missed by it)."""
    from kubernetes import client

    batch = client.BatchV1Api(cp.api_client())
    for j in batch.list_namespaced_job(ns).items:
        batch.delete_namespaced_job(j.metadata.name, ns, propagation_policy="Background",
                                    grace_period_seconds=0)
    cp.core().delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    pods = kubelet.pods  # type: ignore[attr-defined]

    def ended() -> bool:
        mine = [p for key, p in list(pods.items()) if key.startswith(f"{ns}/")]
        return all(p.done or (p.containers and all(
            c.proc is not None and c.proc.poll() is not None for c in p.containers))
            for p in mine)
    try:
        wait(ended, timeout=timeout, what=f"the pods of {ns} to end")
    except AssertionError as e:  # say it, without hiding the test's own outcome
        import logging

        logging.getLogger(__name__).warning("%s", e)


@contextmanager
def process_nodes(cp: ControlPlane, names: list[str]) -> Iterator[ProcessKubelet]:
    """Nodes NAMES (1 GPU, 8 CPUs each) on CP, run by the process-backed kubelet (the one
    simulated part, tests/fixtures/k8s/kubelet.py); their Node objects are deleted after,
    so the next module's nodes are the only ones the scheduler sees."""
    k = ProcessKubelet(cp, [NodeSpec(name=n, gpus=1, cpu="8") for n in names]).start()
    try:
        yield k
    finally:
        k.stop()
        for n in names:
            cp.core().delete_node(n)
