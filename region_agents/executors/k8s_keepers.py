"""The in-memory recovery tier on Kubernetes: one keeper per (job, node), each a
one-pod Job of its own, kept across attempts (docs/recovery.md, docs/kubernetes.md).

Why a keeper Job per (job, node), and not a sidecar or a DaemonSet:

* A sidecar container in each rank pod dies with that pod, and a failed attempt's pods
  are all deleted (the gang is lost, survivors included): the survivors' memory would go
  with them, which is what the tier exists to keep. A keeper of its own outlives every
  rank pod of the job and dies only with its node (or the job's end).
* A DaemonSet runs on every node whether a job with the tier is there or not, serves
  every tenant from one process (one token for all, or the keeper holding many tenants'
  tokens), and its memory cannot be attributed to a job. A keeper per (job, node) holds
  one job's snapshots, is reachable only with that job's token, and goes when the job does.
* A Job and not a bare Pod: the agent's role may create Jobs and not Pods
  (deploy/k8s/agent.yaml), so the tier needs no new permission; ``backoffLimit: 0``: a
  keeper that died took its memory with it, and a restarted one is a new, empty keeper
  that the agent makes itself (a new name) when an attempt needs one on that node.

Where: node affinity to the Node by name (the scheduler places it, honouring taints
as for the rank pods). Bound to its own pod IP (``status.podIP``; never loopback: ranks
on other nodes must reach it), on a port derived from the job (:func:`keeper_port`; any
port does on a cluster, where each pod has its own network namespace; the tests' node
fixture shares one port space, as for ``rendezvous_port``). The token: one Secret per job
(``<job>-mk``) made by the agent, read by the keepers and the ranks through
``secretKeyRef`` -- never in a pod spec, an annotation or the agent's reads (the agent
creates Secrets and never reads them back).

The ranks get ``CB_MEMORY_EVERY``, ``CB_MEMORY_KEEPERS`` (``node=ip:port`` in placement
order: which node runs which index is the scheduler's choice, so a rank finds its own
keeper by its node's name, trainer/memtier.py) and the token. Lifetime: a job's keepers
go when an attempt of it succeeds, is stopped or checkpointed (the executor calls
:meth:`KeeperJobs.stop_job`), and when none of its attempts has run here for
``IDLE_S`` (a failed job the broker did not relaunch); a failed attempt keeps them for
its relaunch. Memory: each keeper holds at most ``trainer.memkeeper.KEEP`` snapshots of
each rank it serves, and its pod asks for that memory (:func:`keeper_resources`), so the
scheduler counts it on the node like the ranks' own.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import time
import zlib
from collections.abc import Callable, Mapping

from kubernetes import client as k8s

from checkpoint_layout import job_options
from region_agents import labels as L
from region_agents.executors.k8s_manifests import (
    ANNOTATION_JOB,
    DEFAULT_IMAGE,
    DEFAULT_UID,
    LABEL_JOB,
    LABEL_MANAGED,
    MANAGER,
    label_value,
    pinned_to_node,
)
from region_agents.executors.memory_keepers import memory_keep
from trainer.memkeeper import KEEP

log = logging.getLogger(__name__)

LABEL_ROLE = "computebroker.io/role"
ROLE = "memory-keeper"
ANNOTATION_NODE = "computebroker.io/keeper-node"  # the exact node name (labels may be sanitized)
TOKEN_KEY = "token"
CONTAINER = "keeper"
KEEPER_DIR = "/var/run/computebroker"
PORT_BASE = 30000  # above rendezvous_port's 20000-29999, below the ephemeral range
PORT_SPAN = 2000
START_TIMEOUT_S = 120.0  # scheduling, image pull, the keeper listening
IDLE_S = 900.0  # keepers of a job with no attempt here for this long are removed
# The keeper's memory (keeper_resources). Base: the keeper process holding nothing
# (Python, its sockets and threads; measured at about 17 MB RSS) with room to spare.
BASE_BYTES = 64 * 2**20
# Rank 0's snapshot size stands for every rank's: FSDP shards differ by a little (the
# last rank's may be shorter or padded), so the limit leaves this much room on top.
SLACK = 1.25
# A job may declare one rank's snapshot size before it has taken any (TrainerSpec
# option, MB): the first attempt's keepers are sized by it. Without it, they ask for the
# base only, and every keeper made after the ranks reported their size is sized by that.
SNAPSHOT_OPTION = "memory_snapshot_mb"


def keeper_port(job_id: str) -> int:
    """The port every keeper of ``job_id`` listens on (on its own pod IP)."""
    return PORT_BASE + zlib.crc32(f"keeper/{job_id}".encode()) % PORT_SPAN


def _base(job_id: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-") or "job"


def token_secret_name(job_id: str) -> str:
    """The job's keeper token Secret: ``cb-<job>-mk`` (unique per job id by a hash)."""
    h = f"{zlib.crc32(job_id.encode()):08x}"
    return f"cb-{_base(job_id)}"[:40].rstrip("-") + f"-{h}-mk"


def keeper_selector(job_id: str | None = None) -> str:
    s = f"{LABEL_MANAGED}={MANAGER},{LABEL_ROLE}={ROLE}"
    return s if job_id is None else f"{s},{LABEL_JOB}={label_value(job_id)}"


def is_keeper(obj: dict) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) == ROLE


def snapshot_bound(options: Mapping[str, str], reported: int) -> int:
    """One rank's snapshot bytes for sizing a keeper: the larger of what the ranks
    reported (``memory_tier.snapshot_bytes`` in their progress, trainer/memtier.py) and
    the job's declared ``memory_snapshot_mb`` (read through the one options table,
    checkpoint_layout/job_options.py, which bounds it; a bad value counts as undeclared);
    0 when neither is known."""
    declared = int(job_options.value(options, SNAPSHOT_OPTION, strict=False) * 1e6)
    return max(declared, max(0, int(reported)))


def _mib(n: int) -> str:
    return f"{-(-n // 2**20)}Mi"


def keeper_resources(snapshot_bytes: int, ranks_per_node: int, keep: int = KEEP) -> k8s.V1ResourceRequirements:
    """The keeper pod's memory, from the tier's own bound (docs/recovery.md): a keeper
    serves the ranks of its node and of its ward node (the ring's previous node), each
    rank's at most ``keep`` snapshots counting the one arriving (it makes room for a
    put before receiving it, trainer/memkeeper.py), so it holds at most ``keep x 2 x
    ranks_per_node x snapshot`` bytes: that (plus the base) is the request, and with
    :data:`SLACK` for ranks whose shards are larger than rank 0's the limit -- above it
    the tier's bound is broken and the kernel's OOM kill says so. Size unknown (0): the
    base request alone, no limit (a limit would be a guess)."""
    served = 2 * max(1, ranks_per_node)
    if snapshot_bytes <= 0:
        return k8s.V1ResourceRequirements(requests={"memory": _mib(BASE_BYTES)})
    request = BASE_BYTES + keep * served * snapshot_bytes
    limit = BASE_BYTES + int(keep * served * snapshot_bytes * SLACK)
    return k8s.V1ResourceRequirements(requests={"memory": _mib(request)}, limits={"memory": _mib(limit)})


def keeper_job(job_id: str, node: str, *, namespace: str, image: str = "",
               service_account: str = "", run_as_user: int = DEFAULT_UID,
               resources: k8s.V1ResourceRequirements | None = None,
               keep: int = KEEP) -> k8s.V1Job:
    """The one-pod Job of the keeper of ``job_id`` on ``node`` (restricted PSS, as the
    rank pods), holding ``keep`` steps per rank (the job's ``memory_keep``). Named by the API server (``generateName``): a keeper lost with its node
    may linger while its replacement on another node, or the same one back, is made."""
    labels = {LABEL_MANAGED: MANAGER, LABEL_ROLE: ROLE, LABEL_JOB: label_value(job_id),
              "app.kubernetes.io/name": "computebroker-memory-keeper"}
    annotations = {ANNOTATION_JOB: job_id, ANNOTATION_NODE: node}
    port = keeper_port(job_id)
    env = [k8s.V1EnvVar(name="POD_IP", value_from=k8s.V1EnvVarSource(
               field_ref=k8s.V1ObjectFieldSelector(field_path="status.podIP"))),
           k8s.V1EnvVar(name="CB_MEMORY_TOKEN", value_from=k8s.V1EnvVarSource(
               secret_key_ref=k8s.V1SecretKeySelector(name=token_secret_name(job_id),
                                                      key=TOKEN_KEY))),
           k8s.V1EnvVar(name="PYTHONUNBUFFERED", value="1")]
    container = k8s.V1Container(
        name=CONTAINER,
        image=image or DEFAULT_IMAGE,
        command=["python", "-m", "trainer.memkeeper", "--host", "$(POD_IP)",
                 "--port", str(port), "--port-file", f"{KEEPER_DIR}/keeper.port",
                 "--keep", str(keep)],
        env=env,
        ports=[k8s.V1ContainerPort(container_port=port, name="keeper")],
        readiness_probe=k8s.V1Probe(tcp_socket=k8s.V1TCPSocketAction(port=port),
                                    period_seconds=2),
        resources=resources or keeper_resources(0, 1),
        security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False, capabilities=k8s.V1Capabilities(drop=["ALL"])),
        volume_mounts=[k8s.V1VolumeMount(name="run", mount_path=KEEPER_DIR)],
    )
    affinity = pinned_to_node(node)
    pod_spec = k8s.V1PodSpec(
        containers=[container],
        restart_policy="Never",
        service_account_name=service_account or None,
        automount_service_account_token=False,  # it never talks to the API server
        termination_grace_period_seconds=5,
        affinity=affinity,
        tolerations=[k8s.V1Toleration(key=L.RESOURCE_GPU, operator="Exists", effect="NoSchedule")],
        security_context=k8s.V1PodSecurityContext(
            run_as_non_root=True, run_as_user=run_as_user, run_as_group=run_as_user,
            fs_group=run_as_user, seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault")),
        volumes=[k8s.V1Volume(name="run", empty_dir=k8s.V1EmptyDirVolumeSource())],
    )
    prefix = f"cb-{_base(job_id)}"[:40].rstrip("-") + "-mk-"
    return k8s.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=k8s.V1ObjectMeta(generate_name=prefix, namespace=namespace, labels=labels,
                                  annotations=dict(annotations)),
        spec=k8s.V1JobSpec(
            completions=1, parallelism=1, backoff_limit=0,
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels, annotations=dict(annotations)),
                spec=pod_spec)))


def token_secret(job_id: str, namespace: str) -> k8s.V1Secret:
    labels = {LABEL_MANAGED: MANAGER, LABEL_ROLE: ROLE, LABEL_JOB: label_value(job_id)}
    return k8s.V1Secret(
        api_version="v1", kind="Secret", type="Opaque",
        metadata=k8s.V1ObjectMeta(name=token_secret_name(job_id), namespace=namespace,
                                  labels=labels, annotations={ANNOTATION_JOB: job_id}),
        string_data={TOKEN_KEY: secrets.token_hex(16)})


def rank_env(every: int, keepers: list[tuple[str, str]], job_id: str) -> list[k8s.V1EnvVar]:
    """The ranks' CB_MEMORY_* variables: interval, named keepers, token by reference."""
    from trainer.memkeeper import TOKEN_ENV
    from trainer.memtier import EVERY_ENV, KEEPERS_ENV

    return [k8s.V1EnvVar(name=EVERY_ENV, value=str(every)),
            k8s.V1EnvVar(name=KEEPERS_ENV, value=",".join(f"{n}={a}" for n, a in keepers)),
            k8s.V1EnvVar(name=TOKEN_ENV, value_from=k8s.V1EnvVarSource(
                secret_key_ref=k8s.V1SecretKeySelector(name=token_secret_name(job_id),
                                                       key=TOKEN_KEY)))]


def _pod_ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _pod_gone(pod: dict) -> bool:
    """The keeper cannot serve any more: it ended, or it is being deleted."""
    status = pod.get("status") or {}
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")
                or status.get("phase") in ("Succeeded", "Failed"))


class KeeperError(Exception):
    """The keepers could not be made ready: the attempt runs without the memory tier."""


class KeeperJobs:
    """The keepers of a namespace's jobs, from the executor's pod cache (see the module
    doc). ``pods``: a callable returning the cached pods (name -> object) carrying our
    ``managed-by`` label; ``changed``: set when that cache changes."""

    def __init__(self, core: k8s.CoreV1Api, batch: k8s.BatchV1Api, namespace: str,
                 pods: Callable[[], dict[str, dict]], *, image: str = "",
                 service_account: str = "", run_as_user: int = DEFAULT_UID,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.core, self.batch, self.namespace = core, batch, namespace
        self.pods = pods
        self.image, self.service_account, self.run_as_user = image, service_account, run_as_user
        self.start_timeout_s = start_timeout_s
        # job id -> the largest snapshot of one rank its ranks reported (saw())
        self.reported: dict[str, int] = {}

    def saw(self, job_id: str, progress: dict) -> None:
        """A rank's progress file (its ``memory_tier`` report): remember the snapshot
        size, so keepers made later for the job (a spare's, on a relaunch) ask for the
        memory they will hold."""
        tier = progress.get("memory_tier") if isinstance(progress, dict) else None
        try:
            size = int((tier or {}).get("snapshot_bytes") or 0)
        except (TypeError, ValueError):
            return
        if size > self.reported.get(job_id, 0):
            self.reported[job_id] = size

    def keepers_of(self, job_id: str) -> dict[str, list[dict]]:
        """The job's keeper pods by node (all of them, ended ones too)."""
        out: dict[str, list[dict]] = {}
        for p in self.pods().values():
            meta = p.get("metadata") or {}
            ann = meta.get("annotations") or {}
            if is_keeper(p) and ann.get(ANNOTATION_JOB) == job_id and ann.get(ANNOTATION_NODE):
                out.setdefault(ann[ANNOTATION_NODE], []).append(p)
        return out

    def jobs_with_keepers(self) -> set[str]:
        return {((p.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_JOB, "")
                for p in self.pods().values() if is_keeper(p)} - {""}

    def ensure(self, job_id: str, nodes: list[str], every: int, image: str = "", *,
               options: dict[str, str] | None = None, ranks_per_node: int = 1) -> list[k8s.V1EnvVar]:
        """A ready keeper on each of ``nodes`` (made where there is none, or only a dead
        one, asking for the memory it will hold: :func:`keeper_resources` of
        :func:`snapshot_bound`), then the ranks' env. Blocks until they are ready: call
        it off the executor's lock. KeeperError when they do not get ready in time."""
        if not nodes:
            raise KeeperError("the placement names no nodes")
        self._ensure_secret(job_id)
        have = self.keepers_of(job_id)
        keep = memory_keep(options or {})
        resources = keeper_resources(snapshot_bound(options or {}, self.reported.get(job_id, 0)),
                                     ranks_per_node, keep)
        for node in nodes:
            if not any(not _pod_gone(p) for p in have.get(node, [])):
                self._create(job_id, node, image, resources, keep)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            have = self.keepers_of(job_id)
            ready: dict[str, str] = {}
            for node in nodes:
                for p in have.get(node, []):
                    if _pod_ready(p) and not _pod_gone(p):
                        ready[node] = p["status"]["podIP"]
            if len(ready) == len(nodes):
                port = keeper_port(job_id)
                log.info("%s: memory keepers ready on %s", job_id,
                         ", ".join(f"{n} ({ready[n]})" for n in nodes))
                return rank_env(every, [(n, f"{ready[n]}:{port}") for n in nodes], job_id)
            if time.monotonic() > deadline:
                missing = sorted(set(nodes) - set(ready))
                raise KeeperError(f"memory keepers on {', '.join(missing)} not ready "
                                  f"in {self.start_timeout_s:.0f} s")
            time.sleep(0.1)

    def _ensure_secret(self, job_id: str) -> None:
        try:
            self.core.create_namespaced_secret(self.namespace, token_secret(job_id, self.namespace))
        except k8s.ApiException as e:
            if e.status != 409:  # 409: the job's token exists (an earlier attempt's)
                raise KeeperError(f"cannot create the keepers' token Secret: {e.status} {e.reason}") from None

    def _create(self, job_id: str, node: str, image: str,
                resources: k8s.V1ResourceRequirements | None = None, keep: int = KEEP) -> None:
        body = keeper_job(job_id, node, namespace=self.namespace, image=image or self.image,
                          service_account=self.service_account, run_as_user=self.run_as_user,
                          resources=resources, keep=keep)
        try:
            self.batch.create_namespaced_job(self.namespace, body, _preload_content=False)
        except k8s.ApiException as e:
            raise KeeperError(f"cannot create the memory keeper on {node}: "
                              f"{e.status} {e.reason}") from None
        log.info("%s: memory keeper starting on %s", job_id, node)

    def stop_job(self, job_id: str) -> None:
        """Delete the job's keepers (their Jobs, pods with them) and its token Secret."""
        self.reported.pop(job_id, None)
        try:
            jobs = self.batch.list_namespaced_job(self.namespace,
                                                  label_selector=keeper_selector(job_id)).items
        except k8s.ApiException as e:
            log.warning("%s: cannot list its memory keepers: %s %s", job_id, e.status, e.reason)
            return
        for j in jobs:
            if (j.metadata.annotations or {}).get(ANNOTATION_JOB) != job_id:
                continue  # another job whose id sanitizes to the same label value
            with contextlib.suppress(k8s.ApiException):
                self.batch.delete_namespaced_job(j.metadata.name, self.namespace,
                                                 propagation_policy="Background",
                                                 grace_period_seconds=0)
        with contextlib.suppress(k8s.ApiException):
            self.core.delete_namespaced_secret(token_secret_name(job_id), self.namespace)
        if jobs:
            log.info("%s: memory keepers removed (%d)", job_id, len(jobs))
