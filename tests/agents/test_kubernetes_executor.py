"""The Kubernetes executor's pure parts: manifests built with the kubernetes client's own
models (no API server), the pod supervisor's exit-code rule and Node health. Everything
that talks to Kubernetes is tested against a real API server in tests/k8s/."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from kubernetes import client as k8s

from checkpoint_layout.pod_supervisor import aggregate
from computebroker.v1 import agent_pb2, common_pb2
from region_agents.executors.base import AttemptSpec
from region_agents.executors.k8s_manifests import FINALIZER, decode_launch, rendezvous_port
from region_agents.executors.k8s_nodes import SPOT_TAINT, health_of, spot_tainted
from region_agents.executors.kubernetes import build_manifests, resource_name

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
    m = build_manifests(attempt(), namespace="ml", image="repo/trainer:1", nodes=nodes)
    svc = m.service
    api = k8s.ApiClient()
    assert len(m.pods) == 2  # one pod per placed node, made by the agent (no Job)
    data = api.sanitize_for_serialization(m.pods[0])
    again = api.deserialize(json.dumps(data), "V1Pod", "application/json")
    assert api.sanitize_for_serialization(again) == data  # schema-valid round trip

    name = resource_name("Job_ABC.1", 3)
    assert name == "cb-job-abc-1-a3" and m.name == name == svc.metadata.name
    assert [p.metadata.name for p in m.pods] == [f"{name}-0", f"{name}-1"]
    assert [p.metadata.annotations["computebroker.io/node-rank"] for p in m.pods] == ["0", "1"]
    assert data["metadata"]["labels"]["computebroker.io/job-id"] == "Job_ABC.1"
    assert data["metadata"]["labels"]["computebroker.io/attempt"] == "3"
    assert svc.metadata.annotations["computebroker.io/pods"] == "2"
    assert decode_launch(svc.metadata.annotations["computebroker.io/launch"]).attempt == 3
    pod = data["spec"]
    assert pod["subdomain"] == name and pod["restartPolicy"] == "Never"
    assert pod["hostname"] == f"{name}-0" and m.pods[1].spec.hostname == f"{name}-1"
    c = pod["containers"][0]
    assert c["image"] == "repo/trainer:1"
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "16"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MASTER_ADDR"] == f"{name}-0.{name}" and env["WORLD_SIZE"] == "8"
    assert env["CB_JOB_ID"] == "Job_ABC.1" and env["CB_ATTEMPT"] == "3"
    assert env["CB_CHECKPOINT_URI"] == "s3://cb/jobs/x"
    assert env["CB_RESUME_FROM"].endswith("step-000000010")
    assert json.loads(env["CB_TRAINER_CONFIG"])["total_steps"] == 100
    # the job's env is in the Secret, not inline (nor in the launch annotation)
    assert "USER_VAR" not in env and "TRACEPARENT" not in env
    assert m.secret.string_data == {"USER_VAR": "1", "TRACEPARENT": "00-abc"}
    assert c["envFrom"] == [{"secretRef": {"name": name}}]
    launch = decode_launch(data["metadata"]["annotations"]["computebroker.io/launch"])
    assert launch is not None and launch.job_id == "Job_ABC.1" and not launch.spec.env
    assert data["metadata"]["finalizers"] == [FINALIZER]
    port = rendezvous_port("Job_ABC.1", 3)
    assert env["MASTER_PORT"] == str(port) != str(rendezvous_port("Job_ABC.1", 4))
    assert env["OMP_NUM_THREADS"] == "1"
    node_rank = next(e for e in c["env"] if e["name"] == "NODE_RANK")
    assert "computebroker.io/node-rank" in node_rank["valueFrom"]["fieldRef"]["fieldPath"]
    assert c["command"] == ["python", "-m", "checkpoint_layout.pod_supervisor", "--ranks=4",
                            "--", "python", "-m", "trainer"]
    sc, psc = c["securityContext"], pod["securityContext"]  # restricted Pod Security
    assert sc == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    # each pod pinned to its own placed node: the scheduler checks fit, chooses nothing
    for i, p in enumerate(m.pods):
        terms = p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
            .node_selector_terms
        assert [(e.key, e.operator, e.values) for e in terms[0].match_fields] == [
            ("metadata.name", "In", [f"node-{i}"])]
        assert p.spec.affinity.pod_anti_affinity is None  # no inter-pod term to evaluate
    # The Stop's deadline: the preStop hook reads its own pod and writes the file.
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["python", "-m", "checkpoint_layout.pod_deadline"]
    assert env["CB_STOP_DEADLINE_FILE"] == "/var/run/computebroker/stop-deadline.json"
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert refs["CB_POD_NAME"] == "metadata.name" and refs["CB_POD_NAMESPACE"] == "metadata.namespace"
    assert "serviceAccountName" not in pod  # none given: the namespace's default
    pod2 = build_manifests(attempt(), service_account="trainer").pods[0]
    assert pod2.spec.service_account_name == "trainer"
    svc_data = api.sanitize_for_serialization(svc)
    assert svc_data["spec"]["clusterIP"] == "None"
    assert svc_data["spec"]["selector"] == {"computebroker.io/job-id": "Job_ABC.1",
                                            "computebroker.io/attempt": "3"}


def test_manifests_custom_command_and_a_gang_without_placement():
    pod = build_manifests(attempt(command=["python", "train.py"], ultra="")).pods[0]
    c = pod.spec.containers[0]
    assert c.command[-3:] == ["--", "python", "train.py"] and "--ranks=0" in c.command
    assert "vpc.amazonaws.com/efa" not in c.resources.limits
    bare = attempt()
    del bare.placement.nodes[:]  # never from the broker: the scheduler picks, kept apart
    m = build_manifests(bare)
    assert len(m.pods) == 2 and all(p.spec.affinity.node_affinity is None for p in m.pods)
    assert m.pods[0].spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution[
        0].topology_key == "kubernetes.io/hostname"


def test_the_pod_exit_code_is_the_gangs_truth():
    assert aggregate([0, 0]) == 0
    assert aggregate([75, 0]) == 75
    assert aggregate([0, 3, 143]) == 3


def test_the_pod_supervisor_passes_signals_and_keeps_exit_75(tmp_path):
    ranks = "import os,signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n" \
            "print(os.environ['RANK'], flush=True)\ntime.sleep(60)\n"
    env = {"PATH": "/usr/bin:/bin", "NODE_RANK": "1", "PYTHONPATH": ":".join(sys.path)}
    p = subprocess.Popen([sys.executable, "-m", "checkpoint_layout.pod_supervisor", "--ranks=2",
                          "--", sys.executable, "-c", ranks], env=env, stdout=subprocess.PIPE,
                         text=True)
    seen = sorted(p.stdout.readline().strip() for _ in range(2))
    # RANK = node rank x ranks per pod + local rank; each line carries it (rank_lines.py)
    assert seen == ["[rank 2] 2", "[rank 3] 3"]
    p.send_signal(signal.SIGTERM)  # the kubelet's, to the container's main process only
    assert p.wait(30) == 75
    crash = "import os,sys,time\nsys.exit(3) if os.environ['LOCAL_RANK']=='1' else time.sleep(60)"
    r = subprocess.run([sys.executable, "-m", "checkpoint_layout.pod_supervisor", "--ranks=2",
                        "--", sys.executable, "-c", crash], env=env, timeout=30)
    assert r.returncode == 3  # the crash, not the SIGKILL of its peer


def test_the_pod_supervisor_passes_an_early_checkpoint_now_to_ranks_that_hold_it(tmp_path):
    """A checkpoint-now set while the pod started (its downward-API file already holds a
    value) is passed on, and ranks started with SIGUSR1 blocked (held_signals.py) keep it
    pending until their handler is in: none dies of it."""
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "checkpoint-now").write_text("1700000000000000000")
    ranks = ("import signal,sys,time\n"
             "deadline = time.monotonic() + 60\n"
             "while signal.SIGUSR1 not in signal.sigpending():\n"
             "    if time.monotonic() > deadline: sys.exit(5)\n"
             "    time.sleep(0.01)\n"
             "got = []\n"
             "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
             "from checkpoint_layout.held_signals import release\n"
             "release()\n"
             "print('usr1' if got else 'lost', flush=True)\n")
    env = {"PATH": "/usr/bin:/bin", "NODE_RANK": "0", "PYTHONPATH": ":".join(sys.path),
           "CB_PODINFO_DIR": str(podinfo)}
    r = subprocess.run([sys.executable, "-m", "checkpoint_layout.pod_supervisor", "--ranks=2",
                        "--", sys.executable, "-c", ranks], env=env, capture_output=True,
                       text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.splitlines()) == ["[rank 0] usr1", "[rank 1] usr1"]


def test_node_health_and_spot_from_node_objects():
    ready = {"metadata": {"name": "n", "labels": {}}, "spec": {},
             "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert health_of(ready) == (True, "")
    bad = json.loads(json.dumps(ready))
    bad["status"]["conditions"][0].update(status="Unknown", reason="NodeStatusUnknown")
    assert health_of(bad) == (False, "Ready=Unknown: NodeStatusUnknown")
    hp = json.loads(json.dumps(ready))
    hp["metadata"]["labels"]["sagemaker.amazonaws.com/node-health-status"] = "UnschedulablePendingReboot"
    assert health_of(hp)[0] is False
    spot = json.loads(json.dumps(ready))
    spot["spec"]["taints"] = [{"key": SPOT_TAINT, "value": "x", "effect": "NoSchedule"}]
    assert spot_tainted(spot) and health_of(spot) == (True, "")  # a notice, not ill health
    # The lifecycle controller's not-ready taint lags a fresh Ready=True (a new node is
    # born with it): the condition wins. Without a Ready condition the taint stands.
    fresh = json.loads(json.dumps(ready))
    fresh["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    assert health_of(fresh) == (True, "")
    bare = {"metadata": {"name": "n"}, "spec": {"taints": fresh["spec"]["taints"]}, "status": {}}
    assert health_of(bare) == (False, "not ready (node lifecycle controller)")


def test_pods_get_torchruns_thread_default_unless_the_spec_sets_it():
    def pod_env(spec: AttemptSpec) -> tuple[dict[str, str], dict[str, str]]:
        m = build_manifests(spec)
        inline = {e.name: e.value for e in m.pods[0].spec.containers[0].env}
        return inline, dict(m.secret.string_data)

    env, _ = pod_env(attempt(command=["python", "train.py"]))  # a user's command: no torchrun
    assert env["OMP_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"
    own = attempt()
    own.spec.env["OMP_NUM_THREADS"] = "6"
    own.env["MKL_NUM_THREADS"] = "2"  # a launch's env counts as set, too
    env, secret = pod_env(own)  # the job's own values reach the pod (through its Secret)
    assert "OMP_NUM_THREADS" not in env and "MKL_NUM_THREADS" not in env
    assert secret["OMP_NUM_THREADS"] == "6" and secret["MKL_NUM_THREADS"] == "2"
