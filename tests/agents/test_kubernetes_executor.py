"""KubernetesExecutor: manifests built with the kubernetes client's own models, and the
create/watch/delete cycle against FakeKubeAPI (k8s_api_fixture.py) — a FIXTURE, not a
real API server: a tiny http.server answering the handful of endpoints we call."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client as k8s

from computebroker.v1 import agent_pb2, common_pb2
from region_agents.executors.base import AttemptSpec
from region_agents.executors.kubernetes import (
    KubernetesExecutor,
    build_manifests,
    resource_name,
)
from tests.agents.k8s_api_fixture import FakeKubeAPI

AS = agent_pb2.AttemptState


def k8s_node(name: str, ultra: str = "us-1", ready: bool = True, gpus: str = "8") -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/region": "us-east-2",
            "topology.kubernetes.io/zone": "us-east-2a",
            "node.kubernetes.io/instance-type": "p6e-gb200.36xlarge",
            "topology.k8s.aws/network-node-layer-3": "nn-3",
            "topology.k8s.aws/ultraserver-id": ultra,
            "karpenter.sh/capacity-type": "reserved"}},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": gpus, "vpc.amazonaws.com/efa": "16", "cpu": "144"},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def attempt(job="Job_ABC.1", n=2, command=(), ultra="us-1", attempt_no=3) -> AttemptSpec:
    spec = common_pb2.JobSpec(
        name="t", command=list(command), image="",
        resources=common_pb2.Resources(nodes=n, gpus_per_node=4),
        trainer=common_pb2.TrainerSpec(total_steps=100, model="tiny"),
        env={"USER_VAR": "1"})
    placement = common_pb2.Placement(region="us-east-2", world_size=n * 4, nodes=[
        common_pb2.NodeAssignment(node_id=f"node-{i}", gpus=4, ultraserver_id=ultra,
                                  network_layer_3="nn-3") for i in range(n)])
    return AttemptSpec(job_id=job, attempt=attempt_no, spec=spec, placement=placement,
                       checkpoint_uri="s3://cb/jobs/x", resume_from="s3://cb/jobs/x/step-000000010",
                       env={"TRACEPARENT": "00-abc"})


def test_manifests_round_trip_and_content():
    nodes = {"node-0": common_pb2.Node(id="node-0", efa=16), "node-1": common_pb2.Node(id="node-1", efa=16)}
    job, svc = build_manifests(attempt(), namespace="ml", image="repo/trainer:1", nodes=nodes)
    api = k8s.ApiClient()
    data = api.sanitize_for_serialization(job)
    again = api.deserialize(json.dumps(data), "V1Job", "application/json")
    assert api.sanitize_for_serialization(again) == data  # schema-valid round trip

    name = resource_name("Job_ABC.1", 3)
    assert name == "cb-job-abc-1-a3" and job.metadata.name == name == svc.metadata.name
    assert job.metadata.labels["computebroker.io/job-id"] == "Job_ABC.1"
    assert job.metadata.labels["computebroker.io/attempt"] == "3"
    s = data["spec"]
    assert s["completionMode"] == "Indexed" and s["completions"] == 2 and s["parallelism"] == 2
    assert s["backoffLimit"] == 0
    pod = s["template"]["spec"]
    assert pod["subdomain"] == name and pod["restartPolicy"] == "Never"
    c = pod["containers"][0]
    assert c["image"] == "repo/trainer:1"
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "16"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MASTER_ADDR"] == f"{name}-0.{name}" and env["WORLD_SIZE"] == "8"
    assert env["CB_JOB_ID"] == "Job_ABC.1" and env["CB_ATTEMPT"] == "3"
    assert env["CB_CHECKPOINT_URI"] == "s3://cb/jobs/x"
    assert env["CB_RESUME_FROM"].endswith("step-000000010")
    assert json.loads(env["CB_TRAINER_CONFIG"])["total_steps"] == 100
    assert env["USER_VAR"] == "1" and env["TRACEPARENT"] == "00-abc"
    node_rank = next(e for e in c["env"] if e["name"] == "NODE_RANK")
    assert "job-completion-index" in node_rank["valueFrom"]["fieldRef"]["fieldPath"]
    assert c["command"][:3] == ["torchrun", "--nnodes=2", "--nproc-per-node=4"]
    assert c["command"][-2:] == ["-m", "trainer"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exprs = {e["key"]: e["values"] for e in terms[0]["matchExpressions"]}
    assert exprs["kubernetes.io/hostname"] == ["node-0", "node-1"]
    assert exprs["topology.k8s.aws/ultraserver-id"] == ["us-1"]
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "topologyKey"] == "kubernetes.io/hostname"
    # The Stop's deadline: the preStop hook reads its own pod and writes the file.
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["python", "-m", "checkpoint_layout.pod_deadline"]
    assert env["CB_STOP_DEADLINE_FILE"] == "/var/run/computebroker/stop-deadline.json"
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert refs["CB_POD_NAME"] == "metadata.name" and refs["CB_POD_NAMESPACE"] == "metadata.namespace"
    assert "serviceAccountName" not in pod  # none given: the namespace's default
    job2, _ = build_manifests(attempt(), service_account="trainer")
    assert job2.spec.template.spec.service_account_name == "trainer"
    svc_data = api.sanitize_for_serialization(svc)
    assert svc_data["spec"]["clusterIP"] == "None"
    assert svc_data["spec"]["selector"] == {"computebroker.io/job-id": "Job_ABC.1",
                                            "computebroker.io/attempt": "3"}


def test_manifests_custom_command_and_layer3_affinity():
    job, _ = build_manifests(attempt(command=["python", "train.py"], ultra=""))
    c = job.spec.template.spec.containers[0]
    assert c.command == ["python", "train.py"] and "vpc.amazonaws.com/efa" not in c.resources.limits
    exprs = job.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
        .node_selector_terms[0].match_expressions
    assert [e.key for e in exprs] == ["kubernetes.io/hostname", "topology.k8s.aws/network-node-layer-3"]


@pytest.fixture
def kube():
    api = FakeKubeAPI([k8s_node("node-0"), k8s_node("node-1"), k8s_node("cpu-0", gpus="0")]).start()
    yield api
    api.stop()


@pytest.fixture
def executor(kube):
    cfg = k8s.Configuration()
    cfg.host = kube.host
    return KubernetesExecutor(namespace="ml", region="us-east-2", api_client=k8s.ApiClient(cfg))


def test_discover_nodes_from_labels(executor):
    nodes = executor.discover_nodes()
    assert [n.id for n in nodes] == ["node-0", "node-1"]  # GPU nodes only
    assert nodes[0].ultraserver_id == "us-1" and nodes[0].gpus == 8 and nodes[0].efa == 16
    assert nodes[0].capacity_type == common_pb2.CAPACITY_TYPE_RESERVED


def test_launch_watch_succeed(kube, executor):
    executor.discover_nodes()
    spec = attempt()
    executor.launch(spec)
    name = resource_name(spec.job_id, spec.attempt)
    assert name in kube.jobs and name in kube.services and len(kube.pods) == 2
    assert [e.state for e in executor.poll()] == [AS.ATTEMPT_STATE_STARTING]
    kube.set_running(name)
    assert [e.state for e in executor.poll()] == [AS.ATTEMPT_STATE_RUNNING]
    assert executor.running()[0].state == AS.ATTEMPT_STATE_RUNNING
    kube.terminate(name, 0, 0)
    assert executor.poll() == []  # one pod still running
    kube.terminate(name, 1, 0)
    (end,) = executor.poll()
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED and executor.running() == []
    assert name not in kube.jobs  # cleaned up


def test_pod_failure_fails_gang_and_blames_node(kube, executor):
    spec = attempt()
    executor.launch(spec)
    name = resource_name(spec.job_id, spec.attempt)
    kube.set_running(name)
    executor.poll()
    kube.terminate(name, 1, 3, "boom")
    (end,) = executor.poll()
    assert end.state == AS.ATTEMPT_STATE_FAILED and end.exit_code == 3
    assert end.failed_nodes == ["node-1"] and "boom" in end.message
    assert name not in kube.jobs and not kube.pods


def test_stop_gives_the_pods_the_stops_own_grace(kube, executor):
    """A drain's 600 s reach the pods (not their launch-time 120 s): the Job is orphaned so
    neither its controller nor the garbage collector deletes the pods with their default
    grace; the pods are deleted with the Stop's grace; the attempt stays CHECKPOINTING
    while they save, past the old 60 s vanish timeout, and ends CHECKPOINTED."""
    spec = attempt()
    executor.launch(spec)
    name = resource_name(spec.job_id, spec.attempt)
    kube.set_running(name)
    executor.poll()
    t0 = time.time()
    executor.stop(spec.job_id, spec.attempt, checkpoint_first=True, grace_s=599.2)
    path, body = next(d for d in kube.deleted if "/jobs/" in d[0])
    assert path.endswith(f"/jobs/{name}") and body["propagationPolicy"] == "Orphan"
    path, body = next(d for d in kube.deleted if d[0].endswith("/pods"))
    assert body["gracePeriodSeconds"] == 600  # rounded up: never less than the Stop allows
    assert name not in kube.jobs and name not in kube.services
    pods = [p for p in kube.pods.values() if p["metadata"]["labels"]["job-name"] == name]
    assert len(pods) == 2 and all(p["metadata"]["deletionGracePeriodSeconds"] == 600 for p in pods)
    assert [e.state for e in executor.poll()] == [AS.ATTEMPT_STATE_CHECKPOINTING]
    executor._attempts[(spec.job_id, spec.attempt)].stop_time = t0 - 90  # saving for 90 s
    assert executor.poll() == []  # still inside its 600 s: not given up
    for i in range(2):
        kube.terminate(name, i, 75)
    assert executor.poll() == []  # exited, not yet removed by the kubelet
    kube.reap()
    ends = executor.poll()
    assert [(e.state, e.exit_code) for e in ends] == [(AS.ATTEMPT_STATE_CHECKPOINTED, 75)]
    with pytest.raises(KeyError):
        executor.stop(spec.job_id, spec.attempt, checkpoint_first=False, grace_s=0)


def test_a_kill_stop_deletes_the_pods_at_once(kube, executor):
    spec = attempt()
    executor.launch(spec)
    executor.poll()
    executor.stop(spec.job_id, spec.attempt, checkpoint_first=False, grace_s=30)
    _, body = next(d for d in kube.deleted if d[0].endswith("/pods"))
    assert body["gracePeriodSeconds"] == 0


def test_the_prestop_hook_hands_the_pods_deadline_to_the_trainer(kube, executor, tmp_path):
    """checkpoint_layout/pod_deadline.py against the fixture: before the delete the pod
    shows no deadline (nothing written); after it, the file holds the pod's
    deletionTimestamp, which the trainer reads on SIGTERM (read_stop_deadline)."""
    from checkpoint_layout.pod_deadline import publish
    from checkpoint_layout.stop_deadline import read_stop_deadline

    spec = attempt()
    executor.launch(spec)
    name = resource_name(spec.job_id, spec.attempt)
    pod = f"{name}-0-abcde"
    out = tmp_path / "stop-deadline.json"
    args = dict(namespace="ml", name=pod, token="tok", ca_file=None, out=str(out))
    assert publish(kube.host, **args) is None and not out.exists()
    t0 = time.time()
    executor.stop(spec.job_id, spec.attempt, checkpoint_first=True, grace_s=300)
    sd = publish(kube.host, **args)
    assert sd is not None and sd.grace_s == 300 and t0 + 298 <= sd.deadline <= time.time() + 301
    assert read_stop_deadline(out) == sd
    assert kube.pod_gets[-1] == ("ml", pod, "Bearer tok")
    with pytest.raises(RuntimeError, match="could not read pod"):
        publish(kube.host, **{**args, "name": "no-such-pod"})


def test_the_prestop_hook_never_fails_the_termination(tmp_path):
    """Outside a cluster (or without permission) the hook says why and exits 0: the
    kubelet goes on to its SIGTERM and the trainer uses CB_GRACE_S."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(CB_STOP_DEADLINE_FILE=str(tmp_path / "sd.json"), CB_POD_NAME="p", CB_POD_NAMESPACE="ml")
    r = subprocess.run([sys.executable, "-m", "checkpoint_layout.pod_deadline"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "CB_GRACE_S applies" in r.stderr
    assert not (tmp_path / "sd.json").exists()


def test_adopt_existing_jobs_after_restart(kube, executor):
    spec = attempt()
    executor.launch(spec)
    cfg = k8s.Configuration()
    cfg.host = kube.host
    restarted = KubernetesExecutor(namespace="ml", region="us-east-2", api_client=k8s.ApiClient(cfg))
    running = restarted.adopt_existing()
    assert [(r.job_id, r.attempt) for r in running] == [("Job_ABC.1", 3)]


def test_api_errors_are_clear(kube, executor):
    executor.launch(attempt())
    with pytest.raises(ValueError, match="kubernetes rejected the job: 409"):
        executor.launch(attempt())


def test_pods_get_torchruns_thread_default_unless_the_spec_sets_it():
    def pod_env(spec: AttemptSpec) -> dict[str, str]:
        job, _ = build_manifests(spec)
        return {e.name: e.value for e in job.spec.template.spec.containers[0].env}

    env = pod_env(attempt(command=["python", "train.py"]))  # a user's command: no torchrun
    assert env["OMP_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"
    own = attempt()
    own.spec.env["OMP_NUM_THREADS"] = "6"
    own.env["MKL_NUM_THREADS"] = "2"  # a launch's env counts as set, too
    env = pod_env(own)
    assert env["OMP_NUM_THREADS"] == "6" and env["MKL_NUM_THREADS"] == "2"
