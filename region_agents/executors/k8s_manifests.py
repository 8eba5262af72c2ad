"""The Kubernetes objects of one attempt (pure: no API calls): one pod per placed node,
the gang's headless Service and a Secret holding the job's own environment.

Why pods made by the agent and not a ``batch/v1`` Job (or a PyTorchJob): the broker has
already placed the gang on named nodes, and the Job controller only stood between the
agent and the pods it wanted. At 2,000 nodes it was most of the Launch -> bound time
(tens of seconds: one sync loop for every Job of the namespace), and it added nothing the
agent does not do itself: ``backoffLimit: 0`` (the broker relaunches), an index per pod
and a stable hostname. The Kubeflow and HyperPod training operators create their pods
directly too (docs/kubernetes.md weighs it). Each pod is named ``<name>-<index>`` (the
index = node rank), with ``hostname: <name>-<index>`` and the headless Service as
``subdomain``, so pod 0 is the rendezvous (``<name>-0.<name>``) exactly like torchrun's
c10d master; and the names being fixed makes a repeated create harmless (409). Each pod
is pinned to its own placed node by node affinity on the hostname: the real scheduler
still binds it (and checks that the GPUs are free and the taints tolerated) but has
nothing left to choose, and no inter-pod anti-affinity is needed to keep a gang apart.
Each pod runs a rank per GPU under :mod:`checkpoint_layout.pod_supervisor` (not
torchrun: it would hide the ranks' exit 75); the env follows docs/contracts.md.

Why a Secret: a job's ``env`` may carry credentials (tokens, keys). Inline in the pod spec
they would be readable by anyone who may ``get`` pods; in a Secret they are readable only
by who may read Secrets (the agent creates it and never reads it back). The Secret is
owned by the attempt's Service (ownerReference, set at creation), so the garbage
collector removes it with the Service wherever the agent does not. The Service also
carries the Launch, so a restarted agent finds an attempt whose pods were never made.

Why the restricted Pod Security Standard: trainer namespaces enforce it
(deploy/k8s/namespace.yaml), and a cluster admin can trust that a job's code runs as a
non-root user, without privilege escalation, with the runtime's seccomp profile and no
Linux capabilities. Every pod we build passes it (the tests create them in a namespace
where the real API server enforces it).

Why a finalizer of ours on every pod (``FINALIZER``): the API server must not forget a
pod before the agent has read how its container ended. Without it a Stop's pod is
deleted the moment the kubelet reports its exit, and a watch that lags (or an agent that
restarts) would never see exit 75, reporting STOPPED for a trainer that did checkpoint.
The agent removes the finalizer right after reading the terminated state
(region_agents/executors/kubernetes.py).
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass

from kubernetes import client as k8s

from checkpoint_layout import workdir_store
from checkpoint_layout.pod_deadline import POD_NAME_ENV, POD_NAMESPACE_ENV
from checkpoint_layout.pod_supervisor import (
    CHECKPOINT_NOW_ANNOTATION,
    PODINFO_ENV,
    PROGRESS_ANNOTATION,
    TERMINATION_LOG,
)
from checkpoint_layout.standby_go import GO_ENV
from checkpoint_layout.stop_deadline import STOP_DEADLINE_ENV
from computebroker.v1 import agent_pb2, common_pb2
from region_agents import labels as L
from region_agents.executors.base import AttemptSpec, trainer_config_json
from region_agents.executors.rank_threads import rank_thread_env

LABEL_JOB = "computebroker.io/job-id"
LABEL_ATTEMPT = "computebroker.io/attempt"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGER = "computebroker-agent"
ANNOTATION_JOB = "computebroker.io/job-id"  # the exact id (label values may be sanitized)
ANNOTATION_LAUNCH = "computebroker.io/launch"  # the Launch, for re-adoption after a restart
ANNOTATION_GO = "computebroker.io/standby-go"  # make-before-break: the Go, as JSON
ANNOTATION_PROGRESS = PROGRESS_ANNOTATION  # published by the pod (pod_supervisor.py)
ANNOTATION_CHECKPOINT_NOW = CHECKPOINT_NOW_ANNOTATION  # set by the agent: SIGUSR1 the ranks
FINALIZER = "computebroker.io/exit-code"  # see the module doc
ANNOTATION_NODE_RANK = "computebroker.io/node-rank"  # the pod's index in the gang
ANNOTATION_GANG_SIZE = "computebroker.io/pods"  # on the Service: how many pods it has
# The index of pods an earlier version of the agent had a Job controller make (read only,
# so an upgraded agent still knows the ranks of such a pod it re-adopts).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
SHARED_DIR = "/var/run/computebroker"  # an emptyDir: progress, stop deadline, workdir
PODINFO_DIR = "/etc/computebroker/podinfo"  # a downward-API volume (annotations, refreshed)
PROGRESS_FILE = f"{SHARED_DIR}/progress.json"
STOP_DEADLINE_FILE = f"{SHARED_DIR}/stop-deadline.json"  # written by the preStop hook
GO_FILE = f"{PODINFO_DIR}/standby-go"  # the Go annotation, projected by the downward API
PRESTOP = ["python", "-m", "checkpoint_layout.pod_deadline"]
# The container's main process: starts the pod's ranks, exits with their aggregated
# code (torchrun would turn a 75 into 1), publishes progress (pod_supervisor.py says why).
SUPERVISOR = ["python", "-m", "checkpoint_layout.pod_supervisor"]
DEFAULT_IMAGE = "computebroker/trainer:latest"
# The distroless "nonroot" uid: no user of a typical host or image has it, and the
# restricted standard forbids 0. An image with its own trainer user sets --run-as-user.
DEFAULT_UID = 65532
PORT_BASE = 20000
PORT_SPAN = 10000


def resource_name(job_id: str, attempt: int) -> str:
    """A DNS-1123 label (<= 63 chars) unique per job attempt: ``cb-<job>-a<attempt>``.

    Its pods are named ``<name>-<index>`` (and hostnames must be labels too), so leave
    room for that.
    """
    base = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-") or "job"
    suffix = f"-a{attempt}"
    return f"cb-{base}"[: 50 - len(suffix)].rstrip("-") + suffix


def label_value(value: str) -> str:
    """Label values: <= 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends."""
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63]
    return v.strip("-_.") or "x"


def selector(job_id: str, attempt: int | None = None) -> str:
    """The label selector of one attempt's objects (or of every attempt of a job)."""
    s = f"{LABEL_MANAGED}={MANAGER},{LABEL_JOB}={label_value(job_id)}"
    return s if attempt is None else f"{s},{LABEL_ATTEMPT}={attempt}"


def rendezvous_port(job_id: str, attempt: int) -> int:
    """The attempt's ``MASTER_PORT``: derived from (job, attempt), not a fixed 29500.

    Why: on a real cluster every pod has its own network namespace, so any fixed port
    would do (and this one is as good). The tests' node fixture runs pods as processes
    sharing the host's one port space, where two attempts (of one job during a
    make-before-break move, or of two jobs) on a fixed port would collide. A port per
    attempt, stable across agent restarts (derived, not stored), below the ephemeral
    range (never an outgoing connection's local port): harmless on a cluster,
    necessary in the fixture."""
    return PORT_BASE + zlib.crc32(f"{job_id}/{attempt}".encode()) % PORT_SPAN


def launch_of(spec: AttemptSpec) -> agent_pb2.Launch:
    """The Launch an AttemptSpec came from (stored on the objects for re-adoption)."""
    return agent_pb2.Launch(job_id=spec.job_id, attempt=spec.attempt, spec=spec.spec,
                            placement=spec.placement, checkpoint_uri=spec.checkpoint_uri,
                            resume_from=spec.resume_from, standby=spec.standby)


def encode_launch(spec: AttemptSpec) -> str:
    """The Launch without any env (the job's env goes to the Secret only: an annotation
    is readable by whoever may read pods), base64 for an annotation."""
    launch = launch_of(spec)
    launch.spec.env.clear()
    launch.env.clear()
    return base64.b64encode(launch.SerializeToString()).decode()


def decode_launch(text: str) -> AttemptSpec | None:
    try:
        return AttemptSpec.from_launch(agent_pb2.Launch.FromString(base64.b64decode(text)))
    except Exception:  # noqa: BLE001 - a foreign or damaged annotation: not adoptable
        return None


@dataclass
class Manifests:
    """An attempt's objects, in the order they are created: the Service (it carries the
    Launch, and owns the Secret), the Secret (before any pod that reads it), the pods."""

    service: k8s.V1Service
    secret: k8s.V1Secret
    pods: list[k8s.V1Pod]

    @property
    def name(self) -> str:
        return str(self.service.metadata.name)


def pod_name(name: str, index: int) -> str:
    """The gang's pod ``index`` (= its node rank): fixed, so it is also its hostname."""
    return f"{name}-{index}"


def _field_env(name: str, path: str) -> k8s.V1EnvVar:
    return k8s.V1EnvVar(name=name, value_from=k8s.V1EnvVarSource(
        field_ref=k8s.V1ObjectFieldSelector(field_path=path)))


def build_manifests(
    spec: AttemptSpec,
    *,
    namespace: str = "default",
    image: str = "",
    nodes: dict[str, common_pb2.Node] | None = None,
    grace_s: int = 120,
    service_account: str = "",
    run_as_user: int = DEFAULT_UID,
) -> Manifests:
    """The pods, headless Service and env Secret for one attempt.
    ``service_account``: the pods' (the preStop hook reads its own pod); "" = the
    namespace's default."""
    name = resource_name(spec.job_id, spec.attempt)
    nodes = nodes or {}
    placed = list(spec.placement.nodes)
    n_nodes = len(placed) or max(1, spec.spec.resources.nodes)
    gpus = (placed[0].gpus if placed else 0) or spec.spec.resources.gpus_per_node or 1
    labels = {LABEL_JOB: label_value(spec.job_id), LABEL_ATTEMPT: str(spec.attempt),
              LABEL_MANAGED: MANAGER, "app.kubernetes.io/name": "computebroker-trainer"}
    master = f"{name}-0.{name}"
    port = rendezvous_port(spec.job_id, spec.attempt)

    user_env = {**dict(spec.spec.env), **spec.env}
    env = {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(n_nodes * gpus),
        "CB_JOB_ID": spec.job_id,
        "CB_ATTEMPT": str(spec.attempt),
        "CB_CHECKPOINT_URI": spec.checkpoint_uri or spec.spec.checkpoint_uri,
        "CB_RESUME_FROM": spec.resume_from,
        "CB_TRAINER_CONFIG": trainer_config_json(spec.spec.trainer),
        "CB_PROGRESS_FILE": PROGRESS_FILE,
        "CB_GRACE_S": str(grace_s),
        STOP_DEADLINE_ENV: STOP_DEADLINE_FILE,
        "PYTHONUNBUFFERED": "1",
        PODINFO_ENV: PODINFO_DIR,
    }
    if spec.standby:
        env[GO_ENV] = GO_FILE
    if spec.spec.HasField("workdir"):  # users' code: the supervisor fetches and unpacks it
        env.update(workdir_env(spec))
    # torchrun's 1 thread per rank unless the job's env sets it (rank_threads.py: why)
    env.update(rank_thread_env(user_env))
    # Our variables are inline (env wins over envFrom), the job's come from the Secret.
    env_vars = [k8s.V1EnvVar(name=k, value=v) for k, v in sorted(env.items())]
    env_vars += [_field_env(POD_NAME_ENV, "metadata.name"),
                 _field_env(POD_NAMESPACE_ENV, "metadata.namespace"),
                 _field_env("CB_NODE_ID", "spec.nodeName"),
                 _field_env("NODE_RANK", f"metadata.annotations['{ANNOTATION_NODE_RANK}']")]
    if spec.spec.command:  # the job's own command, once per pod (it may run torchrun)
        command = [*SUPERVISOR, "--ranks=0", "--", *spec.spec.command]
    else:  # a rank per GPU, static rendezvous at pod 0 (as the local executor's ranks)
        command = [*SUPERVISOR, f"--ranks={gpus}", "--", "python", "-m", "trainer"]

    limits = {L.RESOURCE_GPU: str(gpus)}
    efa = min((nodes[n.node_id].efa for n in placed if n.node_id in nodes), default=0)
    if efa > 0:
        limits[L.RESOURCE_EFA] = str(efa)

    mounts = [k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
              k8s.V1VolumeMount(name="shared", mount_path=SHARED_DIR),
              k8s.V1VolumeMount(name="podinfo", mount_path=PODINFO_DIR, read_only=True)]
    container = k8s.V1Container(
        name="trainer",
        image=spec.spec.image or image or DEFAULT_IMAGE,
        command=command,
        env=env_vars,
        env_from=[k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=name))],
        ports=[k8s.V1ContainerPort(container_port=port, name="rendezvous")],
        resources=k8s.V1ResourceRequirements(limits=limits, requests=dict(limits)),
        lifecycle=k8s.V1Lifecycle(pre_stop=k8s.V1LifecycleHandler(
            _exec=k8s.V1ExecAction(command=list(PRESTOP)))),
        security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False,
            capabilities=k8s.V1Capabilities(drop=["ALL"])),
        volume_mounts=mounts,
        # the supervisor's word when it refuses to start (a workdir that fails its checks)
        termination_message_path=TERMINATION_LOG,
    )
    # Annotations the agent sets on a running pod, refreshed in the container by the
    # kubelet (the downward API's volumes follow changes; its env vars do not).
    podinfo = k8s.V1DownwardAPIVolumeSource(items=[
        k8s.V1DownwardAPIVolumeFile(path=path, field_ref=k8s.V1ObjectFieldSelector(
            field_path=f"metadata.annotations['{key}']"))
        for path, key in (("standby-go", ANNOTATION_GO),
                          ("checkpoint-now", ANNOTATION_CHECKPOINT_NOW))])
    annotations = {ANNOTATION_JOB: spec.job_id, ANNOTATION_LAUNCH: encode_launch(spec)}
    pods = []
    for index in range(n_nodes):
        pname = pod_name(name, index)
        pod_spec = k8s.V1PodSpec(
            containers=[container],
            restart_policy="Never",
            hostname=pname,
            subdomain=name,
            service_account_name=service_account or None,
            termination_grace_period_seconds=grace_s,
            affinity=_affinity(placed[index].node_id if index < len(placed) else "", labels),
            tolerations=[k8s.V1Toleration(key=L.RESOURCE_GPU, operator="Exists",
                                          effect="NoSchedule")],
            security_context=k8s.V1PodSecurityContext(
                run_as_non_root=True, run_as_user=run_as_user, run_as_group=run_as_user,
                fs_group=run_as_user, seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault")),
            volumes=[k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory")),
                     k8s.V1Volume(name="shared", empty_dir=k8s.V1EmptyDirVolumeSource()),
                     k8s.V1Volume(name="podinfo", downward_api=podinfo)],
        )
        pods.append(k8s.V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=k8s.V1ObjectMeta(
                name=pname, namespace=namespace, labels=dict(labels),
                annotations={**annotations, ANNOTATION_NODE_RANK: str(index)},
                finalizers=[FINALIZER]),
            spec=pod_spec))
    service = k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels,
                                  annotations={**annotations,
                                               ANNOTATION_GANG_SIZE: str(n_nodes)}),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",  # headless: DNS records per pod, for rendezvous
            selector={LABEL_JOB: labels[LABEL_JOB], LABEL_ATTEMPT: labels[LABEL_ATTEMPT]},
            publish_not_ready_addresses=True,
            ports=[k8s.V1ServicePort(name="rendezvous", port=port)],
        ),
    )
    secret = k8s.V1Secret(
        api_version="v1",
        kind="Secret",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        type="Opaque",
        string_data=dict(sorted(user_env.items())),
    )
    return Manifests(service, secret, pods)


def workdir_env(spec: AttemptSpec) -> dict[str, str]:
    """Where the pod finds the job's workdir and what it must be (workdir_store.py):
    inside the attempt's own checkpoint location, named by its digest, with its size.
    WorkdirRefused when the attempt has no checkpoint store to carry it."""
    ref = spec.spec.workdir
    ckpt = spec.checkpoint_uri or spec.spec.checkpoint_uri
    size = spec.workdir_size or ref.size_bytes  # the agent's verified tar's, when known
    if size <= 0:
        raise workdir_store.WorkdirRefused(f"the size of workdir {ref.digest} is unknown")
    return {workdir_store.URI_ENV: workdir_store.workdir_uri(ckpt, ref.digest),
            workdir_store.DIGEST_ENV: ref.digest,
            workdir_store.SIZE_ENV: str(size),
            # as under the local executor: the workdir is <CB_WORK_DIR>/workdir
            workdir_store.WORK_DIR_ENV: SHARED_DIR}


def owner_reference(service: dict) -> dict:
    """Makes an object the attempt's Service's dependent (garbage-collected with it).
    ``service`` is the created Service as the API server returned it (JSON)."""
    return {"apiVersion": "v1", "kind": "Service", "name": service["metadata"]["name"],
            "uid": service["metadata"]["uid"], "blockOwnerDeletion": False}


def pinned_to_node(node: str) -> k8s.V1Affinity:
    """Required node affinity to exactly one Node, by ``matchFields`` on
    ``metadata.name`` (how DaemonSet pods are pinned): the agent's node ids are Node names,
    and a field term lets the scheduler narrow to that one node before it filters, where a
    label term (``kubernetes.io/hostname``) makes it evaluate every node for every pod --
    the stage that held Launch -> bound at 2,000 nodes (docs/kubernetes.md, "At scale")."""
    return k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
            node_selector_terms=[k8s.V1NodeSelectorTerm(match_fields=[
                k8s.V1NodeSelectorRequirement(key="metadata.name", operator="In",
                                              values=[node])])])))


def _affinity(node: str, labels: dict[str, str]) -> k8s.V1Affinity:
    """Pinned to its placed node (the broker placed the gang, topology included), by node
    affinity rather than ``nodeName``: the scheduler still checks that the GPUs are free
    and the node's taints tolerated (docs/kubernetes.md). Without a placement (never from
    the broker), anti-affinity keeps two pods of a gang apart instead."""
    if node:
        return pinned_to_node(node)
    anti = k8s.V1PodAntiAffinity(required_during_scheduling_ignored_during_execution=[
        k8s.V1PodAffinityTerm(
            topology_key=L.LABEL_HOSTNAME,
            label_selector=k8s.V1LabelSelector(match_labels={
                LABEL_JOB: labels[LABEL_JOB], LABEL_ATTEMPT: labels[LABEL_ATTEMPT]}))])
    return k8s.V1Affinity(pod_anti_affinity=anti)
