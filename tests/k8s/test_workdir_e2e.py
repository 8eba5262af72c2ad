"""End to end on a real Kubernetes control plane: `brokerctl submit --workdir DIR -- python
hello.py` runs the user's own code in a pod.

Real: the broker process (TLS, SQLite, its workdir store), `brokerctl submit` packing and
uploading the directory, a `brokerctl agent --executor kubernetes` process authenticated
as deploy/k8s/agent.yaml's service account (it fetches the workdir from the broker,
verifies it and puts it into the job's checkpoint location in moto's S3 server), the API
server enforcing the restricted Pod Security Standard, and the pod's supervisor fetching
the tarball from S3 with the job's own credentials, checking its digest and unpacking it.
Simulated: only the kubelet (tests/fixtures/k8s/kubelet.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_foundation import setup_team
from tests.fixtures.cluster import Cluster, wait_until
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import NodeSpec, ProcessKubelet
from tests.k8s.agent_identity import TRAINER_SA, agent_kubeconfig
from tests.k8s.conftest import make_namespace
from tests.k8s.helpers import shared_dir

pytestmark = pytest.mark.slow

REGION, NODES = "us-east-2", ["wde-n1"]
HELLO = """\
import json, os
out = {"cwd": os.getcwd(), "words": open("data/words.txt").read().strip(),
       "job": os.environ["CB_JOB_ID"], "ckpt": os.environ["CB_CHECKPOINT_URI"]}
with open(os.environ["MARKER"], "w") as f:
    json.dump(out, f)
print("hello from a pod")
"""


@pytest.fixture
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    k = ProcessKubelet(cluster_a, [NodeSpec(name=n, region=REGION, zone=f"{REGION}a", gpus=1,
                                            cpu="8") for n in NODES]).start()
    try:
        yield k
    finally:
        k.stop()
        for n in NODES:
            cluster_a.core().delete_node(n)


def test_brokerctl_submit_workdir_runs_the_users_code_in_a_pod(
        cluster_a: ControlPlane, kubelet: ProcessKubelet, s3_server: Any) -> None:
    with shared_dir() as root:
        code = root / "code"
        (code / "data").mkdir(parents=True)
        (code / "hello.py").write_text(HELLO)
        (code / "data" / "words.txt").write_text("my own code, in a pod\n")
        marker = root / "marker.json"
        c = Cluster(root=root / "cb")
        c.extra_env = dict(s3_server.env)  # the agent's store credentials
        bucket = s3_server.unique_bucket("cb-wd")
        try:
            c.start_broker()
            ns = make_namespace(cluster_a, prefix="train-wd")
            c.extra_env["KUBECONFIG"] = str(agent_kubeconfig(cluster_a, ns))
            c.start_agent(REGION, "--executor", "kubernetes", "--namespace", ns,
                          "--service-account", TRAINER_SA, checkpoint_bucket=f"s3://{bucket}")
            with c.client() as client:
                setup_team(client)
                wait_until(lambda: any(r.connected and r.total_gpus > 0 for r in client.regions()),
                           timeout=180, what=f"the Kubernetes region\n{c.logs()}")
                # the job's pods reach the store with the job's own credentials (a Secret)
                env = [f"--env={k}={v}" for k, v in sorted(s3_server.env.items())]
                res = subprocess.run(
                    [sys.executable, "-m", "brokerctl", "--broker", c.address, "submit",
                     "--name", "wd-e2e", "--team", "ml", "--nodes", "1", "--gpus-per-node", "1",
                     f"--env=MARKER={marker}", *env, "--workdir", str(code), "-o", "json",
                     "--", "python", "hello.py"],
                    capture_output=True, text=True, env=dict(c.env(), COLUMNS="100"),
                    cwd=root, timeout=120)
                assert res.returncode == 0, res.stderr
                job_id = json.loads(res.stdout)["id"]
                job = wait_until(lambda: (j := client.job(job_id).status()).phase in (
                    pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED) and j,
                    timeout=300, what=f"the workdir job to end\n{c.logs()}")
                pods = cluster_a.core().list_namespaced_pod(ns).items
                pod_logs = "\n".join(kubelet.logs(ns, p.metadata.name) for p in pods)
                assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{pod_logs}\n{c.logs()}"
            out = json.loads(marker.read_text())
            assert out["words"] == "my own code, in a pod"
            assert out["cwd"].endswith("/computebroker/workdir")
            assert out["job"] == job_id
            # the code travelled through the job's own prefix of the region's bucket
            keys = s3_server.list_keys(bucket, f"jobs/{job_id}/")
            digest = job.spec.workdir.digest.removeprefix("sha256:")
            assert [k for k in keys if k.endswith(f"/workdir/sha256-{digest}.tar")], keys
            assert out["ckpt"].startswith(f"s3://{bucket}/jobs/{job_id}/")
        finally:
            c.stop()
            os.environ.pop("KUBECONFIG", None)
