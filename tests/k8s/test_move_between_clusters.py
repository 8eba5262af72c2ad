"""End to end on two real Kubernetes control planes (two regions): a job on 2 pods in
cluster A gets the AWS Node Termination Handler's spot-interruption taint on its nodes,
checkpoints, moves to cluster B on 1 pod and resumes at exactly the next sample.

Real: the broker process (TLS, SQLite), two ``brokerctl agent --executor kubernetes``
processes authenticated as deploy/k8s/agent.yaml's service account, two API servers
with etcd, controller manager and scheduler, the built-in trainer's gloo ranks in pods
that pass the restricted Pod Security Standard, and moto's S3 HTTP server with one
checkpoint bucket per region. Simulated: only the kubelets (tests/fixtures/k8s/kubelet.py).

Asserted as in tests/e2e/test_migration.py: per-step sample ids and losses equal an
uninterrupted run, the resumed attempt starts at the step after the checkpoint it resumed
from, the Migration record says spot interruption 2 -> 1 from A's bucket to B's,
`brokerctl logs` shows every attempt's lines (read by each agent from its cluster's
``pods/log``), and `brokerctl job` tells the story.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from region_agents.executors.k8s_nodes import SPOT_TAINT
from tests.e2e.test_foundation import setup_team, spec
from tests.e2e.test_logs import sections
from tests.e2e.test_migration import assert_equivalent, final_samples, manifests
from tests.fixtures.cluster import Cluster, wait_until
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec, ProcessKubelet
from tests.k8s.agent_identity import TRAINER_SA, agent_kubeconfig
from tests.k8s.conftest import make_namespace
from tests.k8s.helpers import shared_dir
from tests.trainer.launch import launch, read_log

pytestmark = pytest.mark.slow

A, B = "us-east-2", "eu-west-1"
A_NODES, B_NODES = ["a-spot-1", "a-spot-2"], ["b-od-1"]
STEPS, EVERY, SLEEP = 30, 5, 0.3


def trainer_spec(log: Path) -> dict[str, Any]:
    return {"total_steps": STEPS, "checkpoint_every": EVERY, "global_batch_size": 8, "seed": 7,
            "model": "tiny", "step_sleep_s": 0.0, "options": {"sample_log": str(log)}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The same training, uninterrupted, on 2 ranks started directly (no broker)."""
    work = tmp_path_factory.mktemp("k8s-reference")
    log = work / "samples.jsonl"
    run = launch(work / "run", 2, trainer_spec(log), str(work / "ckpt"), job_id="j-ref")
    codes = run.wait(300)
    assert codes == [0, 0], run.output()
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    return records


@pytest.fixture
def kubelets(cluster_a: ControlPlane, cluster_b: ControlPlane) -> Iterator[None]:
    ka = ProcessKubelet(cluster_a, [NodeSpec(name=n, region=A, zone=f"{A}a", gpus=1, cpu="8",
                                             capacity_type="SPOT") for n in A_NODES]).start()
    kb = ProcessKubelet(cluster_b, [NodeSpec(name=n, region=B, zone=f"{B}a", gpus=1, cpu="8")
                                    for n in B_NODES]).start()
    try:
        yield
    finally:
        ka.stop()
        kb.stop()
        for cp, names in ((cluster_a, A_NODES), (cluster_b, B_NODES)):
            for n in names:
                cp.core().delete_node(n)


def cli(c: Cluster, *args: str) -> str:
    env = dict(c.env(), COLUMNS="100", NO_COLOR="1")
    res = subprocess.run([sys.executable, "-m", "brokerctl", "--broker", c.address, *args],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, f"brokerctl {' '.join(args)}: {res.returncode}\n{res.stderr}"
    return res.stdout


def test_spot_taint_moves_a_job_from_cluster_a_on_2_pods_to_cluster_b_on_1_pod(
        cluster_a: ControlPlane, cluster_b: ControlPlane, kubelets: None, s3_server: Any,
        reference: list[dict[str, Any]]) -> None:
    with shared_dir() as root:
        c = Cluster(root=root / "cb")
        c.extra_env = dict(s3_server.env)
        c.broker_args = ["--agent-timeout", "10", "--heartbeat-interval", "1"]
        buckets = {r: s3_server.unique_bucket(f"cb-{r}") for r in (A, B)}
        try:
            c.start_broker()
            for cp, region, price in ((cluster_a, A, 1.0), (cluster_b, B, 3.0)):
                ns = make_namespace(cp, prefix=f"train-{region}")
                c.extra_env["KUBECONFIG"] = str(agent_kubeconfig(cp, ns))
                c.start_agent(region, "--executor", "kubernetes", "--namespace", ns,
                              "--service-account", TRAINER_SA, price=price,
                              checkpoint_bucket=f"s3://{buckets[region]}")
            log = root / "samples.jsonl"
            with c.client() as client:
                setup_team(client)
                wait_until(lambda: sum(r.connected and r.total_gpus > 0
                                       for r in client.regions()) == 2,
                           timeout=180, what=f"two Kubernetes regions\n{c.logs()}")
                s = spec("k8s-move", steps=STEPS, every=EVERY, sleep=SLEEP, nodes=2, gpus=1)
                s.trainer.options["sample_log"] = str(log)
                s.trainer.options["log_every"] = "1"  # a line per step in `brokerctl logs`
                s.elasticity.min_nodes, s.elasticity.max_nodes = 1, 2
                s.capacity_types.extend([pb.CAPACITY_TYPE_SPOT, pb.CAPACITY_TYPE_ON_DEMAND])
                s.env.update(s3_server.env)  # the pods reach the store (a Secret, not inline)
                handle = client.submit(s)
                before = wait_until(
                    lambda: (j := handle.status()).phase == pb.JOB_PHASE_RUNNING
                    and j.placement.region == A and j.progress.last_checkpoint_step >= EVERY
                    and j, timeout=300, what=f"running in {A} with a checkpoint\n{c.logs()}")
                assert before.placement.world_size == 2
                assert {n.node_id for n in before.placement.nodes} == set(A_NODES)
                for n in A_NODES:  # the Node Termination Handler marks the whole spot pool
                    cluster_a.core().patch_node(n, {"spec": {"taints": [
                        {"key": SPOT_TAINT, "value": "itn", "effect": "NoSchedule"}]}})
                job = handle.wait(timeout=420)
                assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{c.logs()}"
                story = "\n".join(f"{e.type} {e.message}" for e in client.job(job.id).events(follow=False))
                assert (job.attempt, job.placement.region, job.placement.world_size) == (2, B, 1), \
                    f"{story}\n{c.logs()}"
                assert job.progress.step == STEPS
                migs = client.migrations(job_id=job.id)
                assert [(m.cause, m.state, m.from_region, m.to_region, m.from_world_size,
                         m.to_world_size) for m in migs] == [
                    ("spot_interruption", "done", A, B, 2, 1)], migs
                m = migs[0]
                assert m.checkpoint_uri.startswith(f"s3://{buckets[A]}/jobs/{job.id}/"), m
                assert m.resume_from.startswith(f"s3://{buckets[B]}/jobs/{job.id}/"), m
                done = manifests(s3_server, buckets[B], f"jobs/{job.id}/attempt-2/")
                assert any(mf["step"] == STEPS for mf in done.values()), done

            records = read_log(log)
            assert_equivalent(final_samples(log), reference)
            second = [r for r in records if r["attempt"] == 2]
            assert second and second[0]["step"] == m.checkpoint_step + 1, (m, second[:1])
            assert {r["world_size"] for r in second} == {1}
            assert {r["world_size"] for r in records if r["attempt"] == 1} == {2}
            story = cli(c, "job", job.id)
            assert B in story and A in story, story
            assert_logs(cli(c, "logs", job.id), m.checkpoint_step)
        finally:
            c.stop()
            os.environ.pop("KUBECONFIG", None)


def assert_logs(out: str, checkpoint_step: int) -> None:
    """Both attempts' lines, each under its header: attempt 1's two pods' ranks with
    ``(rank N)`` (the supervisor's prefix stripped), attempt 2's one rank plain."""
    parts = sections(out)
    assert [sep.split(" · ")[0] for sep, _ in parts] == ["── attempt 1", "── attempt 2"], out
    for (sep, _), region, ranks in zip(parts, (A, B), ("2 ranks", "1 rank"), strict=True):
        assert re.fullmatch(rf"── attempt \d · {region} · {ranks} · started \d\d:\d\d:\d\d ──",
                            sep), sep
    first, second = parts[0][1], parts[1][1]
    assert "[rank " not in out, out  # the pods' prefixes became LogChunk ranks
    assert any(re.search(rf"^\(rank 0\) trainer: step \d+/{STEPS} loss", x) for x in first), out
    assert any("trainer: resumed from" in x for x in second), out
    assert any(f"trainer: done: {STEPS} steps" in x for x in second), out
    assert not any(x.startswith("(rank") for x in second), out
    for lines, start in ((first, 1), (second, checkpoint_step + 1)):
        steps = [int(m.group(1)) for x in lines if (m := re.search(rf"trainer: step (\d+)/{STEPS}", x))]
        assert steps and steps[0] == start and steps == sorted(set(steps)), (steps, out)
    assert steps[-1] == STEPS
