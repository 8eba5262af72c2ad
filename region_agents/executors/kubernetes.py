"""Kubernetes executor (thin): one indexed ``batch/v1`` Job + a headless Service per attempt.

Why an indexed Job and not a PyTorchJob: it needs no operator in the cluster.
``completionMode: Indexed`` gives each pod a stable index (= node rank) and, with
the headless Service as ``subdomain``, a stable DNS name, so pod 0 is the
rendezvous (``<job>-0.<svc>``) exactly like torchrun's c10d master. One pod per
placed node (node affinity to the placed hostnames, plus the UltraServer /
network layer-3 label when the gang shares one), each running ``torchrun`` with
``nproc_per_node`` = the node's GPUs; the pod env follows docs/contracts.md.

Manifests are built with the ``kubernetes`` client's own models so the API
server's schema is honoured by construction. What is thin on purpose (see the
agent's report): progress is not read from pods (no shared progress file), hang
detection is not done here, and a checkpoint-first stop reports CHECKPOINTED only when
a pod was seen exiting 75.

A Stop's grace reaches the pods and their trainers: the Job is deleted with
``propagationPolicy: Orphan`` (its controller neither replaces the pods nor lets the
garbage collector delete them with their launch-time grace; the Job controller still
clears its ``batch.kubernetes.io/job-tracking`` finalizer from orphaned pods, since
Kubernetes 1.23: kubernetes/kubernetes#108752), then the attempt's pods are deleted with
the Stop's own grace (a first graceful delete may lengthen the pod's
terminationGracePeriodSeconds; a later one only shortens it), so the kubelet's SIGKILL
comes at the Stop's deadline (a drain's ten minutes, a spot notice's two). The container's ``preStop`` hook
(``python -m checkpoint_layout.pod_deadline``) reads that deadline from its own pod's
``deletionTimestamp`` and writes it to ``CB_STOP_DEADLINE_FILE`` before the SIGTERM, as
the local agent does; its service account (``--service-account``) needs ``get`` on pods.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field

from kubernetes import client as k8s

from checkpoint_layout.pod_deadline import POD_NAME_ENV, POD_NAMESPACE_ENV
from checkpoint_layout.stop_deadline import STOP_DEADLINE_ENV
from computebroker.v1 import common_pb2
from region_agents import labels as L
from region_agents.executors.base import (
    AS,
    EXIT_CHECKPOINTED,
    EXIT_OK,
    NOT_THE_NODE,
    AttemptEvent,
    AttemptSpec,
    Executor,
    RunningInfo,
    trainer_config_json,
)
from region_agents.executors.rank_threads import rank_thread_env

log = logging.getLogger(__name__)

LABEL_JOB = "computebroker.io/job-id"
LABEL_ATTEMPT = "computebroker.io/attempt"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGER = "computebroker-agent"
ANNOTATION_JOB = "computebroker.io/job-id"  # the exact id (label values may be sanitized)
MASTER_PORT = 29500
PROGRESS_FILE = "/var/run/computebroker/progress.json"
STOP_DEADLINE_FILE = "/var/run/computebroker/stop-deadline.json"  # written by the preStop hook
PRESTOP = ["python", "-m", "checkpoint_layout.pod_deadline"]
DEFAULT_IMAGE = "computebroker/trainer:latest"
VANISH_TIMEOUT_S = 60.0


def resource_name(job_id: str, attempt: int) -> str:
    """A DNS-1123 label (<= 63 chars) unique per job attempt: ``cb-<job>-a<attempt>``.

    Indexed pods are named ``<name>-<index>-<random>``, so leave room for that.
    """
    base = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-") or "job"
    suffix = f"-a{attempt}"
    return f"cb-{base}"[: 50 - len(suffix)].rstrip("-") + suffix


def build_manifests(
    spec: AttemptSpec,
    *,
    namespace: str = "default",
    image: str = "",
    nodes: dict[str, common_pb2.Node] | None = None,
    grace_s: int = 120,
    service_account: str = "",
) -> tuple[k8s.V1Job, k8s.V1Service]:
    """The Job and headless Service for one attempt (pure: no API calls).
    ``service_account``: the pods' (the preStop hook reads its own pod); "" = the
    namespace's default."""
    name = resource_name(spec.job_id, spec.attempt)
    nodes = nodes or {}
    placed = list(spec.placement.nodes)
    n_nodes = len(placed) or max(1, spec.spec.resources.nodes)
    gpus = (placed[0].gpus if placed else 0) or spec.spec.resources.gpus_per_node or 1
    labels = {LABEL_JOB: _label_value(spec.job_id), LABEL_ATTEMPT: str(spec.attempt),
              LABEL_MANAGED: MANAGER, "app.kubernetes.io/name": "computebroker-trainer"}
    master = f"{name}-0.{name}"

    env = {**dict(spec.spec.env), **spec.env}
    env.update(rank_thread_env(env))  # torchrun's 1 thread per rank unless the spec sets it
    env.update({
        "MASTER_ADDR": master,
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(n_nodes * gpus),
        "CB_JOB_ID": spec.job_id,
        "CB_ATTEMPT": str(spec.attempt),
        "CB_CHECKPOINT_URI": spec.checkpoint_uri or spec.spec.checkpoint_uri,
        "CB_RESUME_FROM": spec.resume_from,
        "CB_TRAINER_CONFIG": trainer_config_json(spec.spec.trainer),
        "CB_PROGRESS_FILE": PROGRESS_FILE,
        "CB_GRACE_S": str(grace_s),
        STOP_DEADLINE_ENV: STOP_DEADLINE_FILE,
    })
    env_vars = [k8s.V1EnvVar(name=k, value=v) for k, v in sorted(env.items())]
    # The pod's own name and namespace, for the preStop hook's GET of its pod.
    for var, path in ((POD_NAME_ENV, "metadata.name"), (POD_NAMESPACE_ENV, "metadata.namespace")):
        env_vars.append(k8s.V1EnvVar(name=var, value_from=k8s.V1EnvVarSource(
            field_ref=k8s.V1ObjectFieldSelector(field_path=path))))
    # The node rank is the pod's completion index (set by the Job controller).
    env_vars.append(k8s.V1EnvVar(name="NODE_RANK", value_from=k8s.V1EnvVarSource(
        field_ref=k8s.V1ObjectFieldSelector(
            field_path="metadata.annotations['batch.kubernetes.io/job-completion-index']"))))
    if spec.spec.command:
        command = list(spec.spec.command)
    else:
        command = ["torchrun", f"--nnodes={n_nodes}", f"--nproc-per-node={gpus}",
                   "--node-rank=$(NODE_RANK)", f"--master-addr={master}",
                   f"--master-port={MASTER_PORT}", "-m", "trainer"]

    limits = {L.RESOURCE_GPU: str(gpus)}
    efa = min((nodes[n.node_id].efa for n in placed if n.node_id in nodes), default=0)
    if efa > 0:
        limits[L.RESOURCE_EFA] = str(efa)

    container = k8s.V1Container(
        name="trainer",
        image=spec.spec.image or image or DEFAULT_IMAGE,
        command=command,
        env=env_vars,
        ports=[k8s.V1ContainerPort(container_port=MASTER_PORT, name="rendezvous")],
        resources=k8s.V1ResourceRequirements(limits=limits, requests=dict(limits)),
        lifecycle=k8s.V1Lifecycle(pre_stop=k8s.V1LifecycleHandler(
            _exec=k8s.V1ExecAction(command=list(PRESTOP)))),
        volume_mounts=[k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
                       k8s.V1VolumeMount(name="progress", mount_path="/var/run/computebroker")],
    )
    pod_spec = k8s.V1PodSpec(
        containers=[container],
        restart_policy="Never",
        subdomain=name,
        service_account_name=service_account or None,
        termination_grace_period_seconds=grace_s,
        affinity=_affinity(placed, labels),
        tolerations=[k8s.V1Toleration(key=L.RESOURCE_GPU, operator="Exists", effect="NoSchedule")],
        volumes=[k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory")),
                 k8s.V1Volume(name="progress", empty_dir=k8s.V1EmptyDirVolumeSource())],
    )
    job = k8s.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels,
                                  annotations={ANNOTATION_JOB: spec.job_id}),
        spec=k8s.V1JobSpec(
            completion_mode="Indexed",
            completions=n_nodes,
            parallelism=n_nodes,
            backoff_limit=0,  # gang: the broker relaunches (attempt+1), not the Job controller
            ttl_seconds_after_finished=3600,
            template=k8s.V1PodTemplateSpec(metadata=k8s.V1ObjectMeta(labels=labels), spec=pod_spec),
        ),
    )
    service = k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",  # headless: DNS records per pod, for rendezvous
            selector={LABEL_JOB: labels[LABEL_JOB], LABEL_ATTEMPT: labels[LABEL_ATTEMPT]},
            publish_not_ready_addresses=True,
            ports=[k8s.V1ServicePort(name="rendezvous", port=MASTER_PORT)],
        ),
    )
    return job, service


def _label_value(value: str) -> str:
    """Label values: <= 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends."""
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63]
    return v.strip("-_.") or "x"


def _affinity(placed: list[common_pb2.NodeAssignment], labels: dict[str, str]) -> k8s.V1Affinity:
    exprs: list[k8s.V1NodeSelectorRequirement] = []
    if placed:
        exprs.append(k8s.V1NodeSelectorRequirement(
            key=L.LABEL_HOSTNAME, operator="In", values=sorted({n.node_id for n in placed})))
        ultra = {n.ultraserver_id for n in placed}
        layer3 = {n.network_layer_3 for n in placed}
        if len(ultra) == 1 and "" not in ultra:
            exprs.append(k8s.V1NodeSelectorRequirement(
                key=L.LABEL_ULTRASERVER, operator="In", values=sorted(ultra)))
        elif len(layer3) == 1 and "" not in layer3:
            exprs.append(k8s.V1NodeSelectorRequirement(
                key=L.LABEL_LAYER_3, operator="In", values=sorted(layer3)))
    node_affinity = None
    if exprs:
        node_affinity = k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
                node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=exprs)]))
    # One pod per node: the gang is one pod per placed node.
    anti = k8s.V1PodAntiAffinity(required_during_scheduling_ignored_during_execution=[
        k8s.V1PodAffinityTerm(
            topology_key=L.LABEL_HOSTNAME,
            label_selector=k8s.V1LabelSelector(match_labels={
                LABEL_JOB: labels[LABEL_JOB], LABEL_ATTEMPT: labels[LABEL_ATTEMPT]}))])
    return k8s.V1Affinity(node_affinity=node_affinity, pod_anti_affinity=anti)


@dataclass
class _K8sAttempt:
    spec: AttemptSpec
    name: str
    state: int = AS.ATTEMPT_STATE_STARTING
    stop_mode: str = ""
    stop_time: float = 0.0
    stop_grace_s: int = 0  # the pods' deletion grace: they may save for this long
    failure: tuple[int, str, list[str]] | None = None
    exit_codes: dict[str, int] = field(default_factory=dict)  # pod name -> exit code


class KubernetesExecutor(Executor):
    """Creates, watches (by polling pods) and deletes one Job per attempt."""

    name = "kubernetes"

    def __init__(self, namespace: str = "default", region: str = "", image: str = "",
                 api_client: k8s.ApiClient | None = None, service_account: str = "") -> None:
        if api_client is None:
            from kubernetes import config as kconfig

            try:
                kconfig.load_incluster_config()
            except kconfig.ConfigException:
                kconfig.load_kube_config()
            api_client = k8s.ApiClient()
        self.namespace = namespace
        self.region = region
        self.image = image
        self.service_account = service_account
        self.core = k8s.CoreV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self._nodes: dict[str, common_pb2.Node] = {}
        self._attempts: dict[tuple[str, int], _K8sAttempt] = {}
        self._events: list[AttemptEvent] = []

    def discover_nodes(self) -> list[common_pb2.Node]:
        """Inventory from Node labels (GPU nodes only), through labels.py."""
        nodes = [L.node_from_k8s(n, region=self.region) for n in self.core.list_node().items]
        nodes = [n for n in nodes if n.gpus > 0]
        self._nodes = {n.id: n for n in nodes}
        return nodes

    def adopt_existing(self) -> list[RunningInfo]:
        """Re-adopt our Jobs still in the cluster (after an agent restart), so the
        next Register reports them and the broker keeps or stops them."""
        jobs = self.batch.list_namespaced_job(
            self.namespace, label_selector=f"{LABEL_MANAGED}={MANAGER}").items
        for job in jobs:
            meta = job.metadata
            job_id = (meta.annotations or {}).get(ANNOTATION_JOB) or meta.labels.get(LABEL_JOB, "")
            attempt = int(meta.labels.get(LABEL_ATTEMPT, "0") or 0)
            if not job_id or attempt <= 0 or (job_id, attempt) in self._attempts:
                continue
            if job.status and ((job.status.succeeded or 0) >= (job.spec.completions or 1)
                               or (job.status.failed or 0) > 0):
                continue  # finished: nothing to adopt
            spec = AttemptSpec(job_id=job_id, attempt=attempt, spec=common_pb2.JobSpec(
                resources=common_pb2.Resources(nodes=job.spec.completions or 1)),
                placement=common_pb2.Placement())
            self._attempts[(job_id, attempt)] = _K8sAttempt(spec=spec, name=meta.name,
                                                            state=AS.ATTEMPT_STATE_RUNNING)
        return self.running()

    def ranks(self, spec: AttemptSpec) -> int:
        """WORLD_SIZE of the pods (build_job): nodes x GPUs of the first placed node."""
        placed = list(spec.placement.nodes)
        n_nodes = len(placed) or max(1, spec.spec.resources.nodes)
        return n_nodes * ((placed[0].gpus if placed else 0) or spec.spec.resources.gpus_per_node or 1)

    def launch(self, spec: AttemptSpec) -> None:
        job, service = build_manifests(spec, namespace=self.namespace, image=self.image,
                                       nodes=self._nodes, service_account=self.service_account)
        try:
            self.core.create_namespaced_service(self.namespace, service)
            self.batch.create_namespaced_job(self.namespace, job)
        except k8s.ApiException as e:
            raise ValueError(f"kubernetes rejected the job: {e.status} {e.reason}") from None
        att = _K8sAttempt(spec=spec, name=job.metadata.name)
        self._attempts[(spec.job_id, spec.attempt)] = att
        self._events.append(AttemptEvent(spec.job_id, spec.attempt, AS.ATTEMPT_STATE_STARTING))

    def _delete(self, att: _K8sAttempt, grace_s: int) -> None:
        opts = k8s.V1DeleteOptions(propagation_policy="Background", grace_period_seconds=grace_s)
        for call in (self.batch.delete_namespaced_job, self.core.delete_namespaced_service):
            try:
                call(att.name, self.namespace, body=opts)
            except k8s.ApiException as e:
                if e.status != 404:
                    log.warning("delete %s: %s %s", att.name, e.status, e.reason)

    def _stop_pods(self, att: _K8sAttempt, grace_s: int) -> None:
        """Delete the attempt with ``grace_s`` for its pods (see the module doc): the Job
        orphaned first, so neither its controller nor the garbage collector touches the
        pods, then the pods with this grace (their deletionTimestamp is the deadline the
        preStop hook hands the trainer), then the Service."""
        orphan = k8s.V1DeleteOptions(propagation_policy="Orphan")
        try:
            self.batch.delete_namespaced_job(att.name, self.namespace, body=orphan)
        except k8s.ApiException as e:
            if e.status != 404:
                log.warning("delete job %s: %s %s", att.name, e.status, e.reason)
        try:
            self.core.delete_collection_namespaced_pod(
                self.namespace, label_selector=self._selector(att),
                body=k8s.V1DeleteOptions(grace_period_seconds=grace_s))
        except k8s.ApiException as e:
            log.warning("delete pods of %s: %s %s", att.name, e.status, e.reason)
        try:
            self.core.delete_namespaced_service(att.name, self.namespace)
        except k8s.ApiException as e:
            if e.status != 404:
                log.warning("delete service %s: %s %s", att.name, e.status, e.reason)

    @staticmethod
    def _selector(att: _K8sAttempt) -> str:
        return f"{LABEL_JOB}={_label_value(att.spec.job_id)},{LABEL_ATTEMPT}={att.spec.attempt}"

    def stop(self, job_id: str, attempt: int, checkpoint_first: bool, grace_s: float) -> None:
        att = self._attempts.get((job_id, attempt))
        if att is None:
            raise KeyError(f"{job_id} attempt {attempt} is not running here")
        att.stop_mode = "checkpoint" if checkpoint_first else "kill"
        att.stop_time = time.time()
        att.stop_grace_s = max(0, math.ceil(grace_s)) if checkpoint_first else 0
        self._stop_pods(att, att.stop_grace_s)
        if checkpoint_first:
            self._set(att, AS.ATTEMPT_STATE_CHECKPOINTING)

    def checkpoint(self, job_id: str, attempt: int) -> None:
        raise ValueError("CheckpointNow is not supported by the kubernetes executor yet")

    def fail(self, job_id: str, attempt: int, message: str, failed_nodes: list[str]) -> None:
        att = self._attempts.get((job_id, attempt))
        if att is None or att.failure:
            return
        att.failure = (-9, message, list(failed_nodes))
        self._delete(att, 0)

    def _set(self, att: _K8sAttempt, state: int, **kw: object) -> None:
        if att.state != state:
            att.state = state
            self._events.append(AttemptEvent(att.spec.job_id, att.spec.attempt, state, **kw))

    def poll(self) -> list[AttemptEvent]:
        for key, att in list(self._attempts.items()):
            self._poll_one(att)
            if att.state in (AS.ATTEMPT_STATE_SUCCEEDED, AS.ATTEMPT_STATE_FAILED,
                             AS.ATTEMPT_STATE_CHECKPOINTED, AS.ATTEMPT_STATE_STOPPED):
                del self._attempts[key]
        out, self._events = self._events, []
        return out

    def _poll_one(self, att: _K8sAttempt) -> None:
        try:
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=self._selector(att)).items
        except k8s.ApiException as e:
            log.warning("list pods of %s: %s %s", att.name, e.status, e.reason)
            return
        running = False
        for pod in pods:
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                term = cs.state.terminated if cs.state else None
                if term is not None:
                    att.exit_codes[pod.metadata.name] = term.exit_code
                    if term.exit_code not in (EXIT_OK, EXIT_CHECKPOINTED) and not att.failure \
                            and not att.stop_mode:
                        blamed = [] if term.exit_code in NOT_THE_NODE else [pod.spec.node_name or ""]
                        msg = f"pod {pod.metadata.name} exited {term.exit_code}: " \
                              f"{term.reason or ''} {term.message or ''}".strip()
                        att.failure = (term.exit_code, msg, [b for b in blamed if b])
                        self._delete(att, 0)
                elif cs.state and cs.state.running is not None:
                    running = True
        n = len(att.spec.placement.nodes) or max(1, att.spec.spec.resources.nodes)
        codes = list(att.exit_codes.values())
        if att.failure:
            code, msg, nodes = att.failure
            self._set(att, AS.ATTEMPT_STATE_FAILED, exit_code=code, message=msg, failed_nodes=nodes)
        elif att.stop_mode:
            # Pods may still be saving for their whole grace; after that (and a margin
            # for the kubelet) an attempt whose pods never vanish counts as stopped.
            gone = not pods or time.time() - att.stop_time > att.stop_grace_s + VANISH_TIMEOUT_S
            if gone:
                ok = att.stop_mode == "checkpoint" and codes and all(
                    c in (EXIT_OK, EXIT_CHECKPOINTED) for c in codes) and EXIT_CHECKPOINTED in codes
                if ok:
                    self._set(att, AS.ATTEMPT_STATE_CHECKPOINTED, exit_code=EXIT_CHECKPOINTED,
                              message="checkpointed")
                else:
                    self._set(att, AS.ATTEMPT_STATE_STOPPED, exit_code=-9,
                              message="job deleted on stop")
        elif len(codes) >= n and all(c == EXIT_OK for c in codes):
            self._set(att, AS.ATTEMPT_STATE_SUCCEEDED, exit_code=0, message="all pods exited 0")
            self._delete(att, 0)
        elif len(codes) >= n and all(c in (EXIT_OK, EXIT_CHECKPOINTED) for c in codes):
            self._set(att, AS.ATTEMPT_STATE_CHECKPOINTED, exit_code=EXIT_CHECKPOINTED,
                      message="checkpointed")
            self._delete(att, 0)
        elif running:
            self._set(att, AS.ATTEMPT_STATE_RUNNING)

    def running(self) -> list[RunningInfo]:
        return [RunningInfo(a.spec.job_id, a.spec.attempt, a.state, None, a.spec.node_ids())
                for a in self._attempts.values()]

    def shutdown(self, grace_s: float = 0.0) -> None:
        """The Jobs belong to the cluster, not to this process: leave them running.

        A restarted agent re-adopts them (:meth:`adopt_existing`) and reports them
        on Register; the broker keeps or stops them (RegisterAck.stale_job_ids).
        """
