"""Kubernetes executor: a headless Service, an env Secret and one pod per placed node
per attempt (region_agents/executors/k8s_manifests.py), watched through the API server.

How it maps to Kubernetes (docs/kubernetes.md says more):

* **Launch**: Service, Secret (owned by the Service), then the gang's pods, made by the
  agent itself: no Job controller between the Launch and the scheduler (at 2,000 nodes
  it was most of the Launch -> bound time; k8s_manifests.py says why). Before any pod
  of attempt N exists, every pod of an older attempt of the job still running is
  killed and its end awaited (on a thread of its own, k8s_fence.py: never on the
  broker's stream): no two attempts of a job can write at once, also when the older
  one was started by a previous agent process. The fencing and the
  manifests happen in ``launch()``; the API requests happen on a small pool of creator
  threads (``launch_workers``), so ``launch()`` returns at once: the agent calls it on
  the thread that reads the broker's stream and with its lock held, and at tens of
  Launches a second several sequential requests each would back that stream up (the
  broker's heartbeat answers queue behind the Launches and the agent self-fences). A
  refusal by the API server comes out of ``poll()`` as FAILED (exit -1, its message).
* **Observe**: two watches (:mod:`region_agents.executors.k8s_watch`): our pods in the
  namespace (by label) and the cluster's Nodes. ``poll()`` reads only the caches and
  returns the events accumulated since the last call; the only requests it makes are
  the ones that change something (finalizer release, deletes).
* **Truthful ends**: every pod carries our finalizer, so the API server keeps it until
  this executor has read how its container ended. An attempt is terminal once every
  pod of it has ended; then the finalizers go. Exit 75 from every pod that ran =
  CHECKPOINTED, all 0 = SUCCEEDED, a crash = FAILED with the pod's exit code and its
  node blamed (unless the code blames no node); of several crashes seen at once, the
  one :mod:`checkpoint_layout.crash_blame` picks, as the local executor does.
* **Stop**: the attempt's pods are deleted with the Stop's own grace (by name, off
  the lock: ``_kill``; no controller replaces them), so the kubelet's SIGKILL comes
  at the Stop's deadline. The
  container's ``preStop`` hook (``python -m checkpoint_layout.pod_deadline``) reads that
  deadline from its pod's ``deletionTimestamp`` and hands it to the trainer.
* **Restart safety**: nothing lives only in this process. :meth:`recover` re-adopts
  every attempt whose Service or pods exist (the Launch is an annotation on both),
  including one stopped half-way (pods terminating) and one whose pods were being made
  when the agent died (the missing ones are made); pods whose attempt ended while no
  agent ran still hold our finalizer, so their exit codes are read and reported.
* **Nodes**: inventory, health and spot notices from the Node watch
  (:mod:`region_agents.executors.k8s_nodes`, labels through region_agents/labels.py).
* **Rank output**: read from ``pods/log`` into per-rank files the agent's log shipper
  tails (:mod:`region_agents.executors.k8s_logs`); an attempt's end is reported once
  its pods' logs are read to the end (at most ``LOG_DRAIN_S`` later).
* **Memory tier**: a job with the trainer option ``memory_every`` gets a keeper per
  (job, node), a one-pod Job of its own kept across attempts
  (:mod:`region_agents.executors.k8s_keepers`); the creator thread makes them ready
  before the attempt's Job, whose ranks get their addresses.
* **Off the lock**: every request that ends something (the kill of an attempt's pods,
  the cleanup of an ended one, a job's keepers) runs on a small pool of its own, never
  under the lock: a slow or stuck API server must not hold up ``poll()``, Launches or
  another attempt's stop while a node's attempts are being killed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from checkpoint_layout import job_options, workdir_store
from checkpoint_layout.crash_blame import culprit
from checkpoint_layout.standby_go import Go
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
)
from region_agents.executors.k8s_fence import Fence, Fences, FenceWait
from region_agents.executors.k8s_keepers import IDLE_S as KEEPER_IDLE_S
from region_agents.executors.k8s_keepers import KeeperJobs
from region_agents.executors.k8s_logs import DEFAULT_MAX_STREAMS, PodLogs, PodRanks
from region_agents.executors.k8s_manifests import (
    ANNOTATION_CHECKPOINT_NOW,
    ANNOTATION_GANG_SIZE,
    ANNOTATION_GO,
    ANNOTATION_JOB,
    ANNOTATION_LAUNCH,
    ANNOTATION_NODE_RANK,
    ANNOTATION_PROGRESS,
    COMPLETION_INDEX,
    DEFAULT_IMAGE,
    DEFAULT_UID,
    FINALIZER,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_MANAGED,
    MANAGER,
    PROGRESS_FILE,
    Manifests,
    build_manifests,
    decode_launch,
    label_value,
    owner_reference,
    pod_name,
    rendezvous_port,
    resource_name,
)
from region_agents.executors.k8s_nodes import health_of, spot_tainted
from region_agents.executors.k8s_watch import ObjectCache
from region_agents.executors.memory_keepers import memory_every
from region_agents.logship import LogSource
from region_agents.progress import ProgressSnapshot, parse_progress
from region_agents.resume_views import OwnerBook, check_named_owners
from region_agents.signals import SPOT_WARNING_S

__all__ = ["DEFAULT_IMAGE", "PROGRESS_FILE", "KubernetesExecutor", "Manifests",
           "build_manifests", "rendezvous_port", "resource_name"]

log = logging.getLogger(__name__)

# A pod whose deletion deadline passed this long ago without a terminated container
# (its node is gone or its kubelet dead) has ended for us: nothing of it can still
# write once its node is reclaimed, and the node is reported unhealthy separately.
VANISH_TIMEOUT_S = 60.0
# a Launch waits this long for an older attempt's pods to end (k8s_fence.py), longer
# than a pod on a lost node takes to count as ended (VANISH_TIMEOUT_S)
FENCE_TIMEOUT_S = VANISH_TIMEOUT_S + 30.0
TIME_PASS_S = 1.0  # poll() looks at attempts whose state time alone changes this often
# ... and at every attempt and pod this often, whatever the watches said (a safety net:
# what the pod watch and the time checks see is judged at once, so this should find
# nothing new)
FULL_PASS_S = 30.0
LOG_DRAIN_S = 20.0  # an ended attempt waits at most this long for its pods' last lines
CONTAINER = "trainer"
# attempts whose API objects are created at once (and as many pod creates beside them:
# a gang's pods are made in parallel once its Secret exists). Each attempt is three
# round trips, each waiting on the API server, not on us: with 6 in flight the creators
# were the queue of the scale benchmark (a Launch waited up to 54 s for a free thread
# while the API server answered each request in under a second), so there are enough
# for tens of Launches a second at a second per round trip. The executor's own client
# has a connection for each of those, the deleters, the two watches and the poller (the
# kubernetes client's default, 5 per CPU, would make the rest open and drop a TLS
# connection per request); pods' logs are read through a client of their own, so that
# hundreds of log streams (or, on KWOK's nodes, failing reads) never hold the
# connections launches need.
LAUNCH_WORKERS = 32
END_WORKERS = 6  # threads making the requests that end things (kills, cleanups)
KILL_WORKERS = 2  # at least this many enders, whatever launch_workers says
KILL_AGAIN_S = 10.0  # a kill repeated sooner than this adds no request (see stop())
KEEPER_SWEEP_S = 10.0  # how often poll() looks for keepers of jobs no attempt uses
TERMINAL = (AS.ATTEMPT_STATE_SUCCEEDED, AS.ATTEMPT_STATE_FAILED,
            AS.ATTEMPT_STATE_CHECKPOINTED, AS.ATTEMPT_STATE_STOPPED)


def _parse_time(stamp: str | None) -> float:
    from datetime import datetime

    if not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def pod_outcome(pod: dict, now: float) -> tuple[int | None, str]:
    """How a pod ended: (exit code, why), or (None, "") while it may still run.

    The trainer container's terminated state is the truth. A pod deleted before it was
    ever bound (no node) never ran: code ``None`` but ended (why = "never ran"). A pod
    whose start failed (phase Failed, no container state) ended with -1."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != CONTAINER:
            continue
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:  # the termination message says more than the reason
            why = str(term.get("message") or "").strip()[:1000] or str(term.get("reason") or "")
            return int(term.get("exitCode", -1)), why
    if status.get("phase") == "Failed":
        return -1, str(status.get("message") or status.get("reason") or "pod failed")
    return None, ""


def pod_ended(pod: dict, now: float) -> bool:
    """Nothing of this pod can run any more (see :func:`pod_outcome`)."""
    code, _ = pod_outcome(pod, now)
    if code is not None:
        return True
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if meta.get("deletionTimestamp"):
        if not spec.get("nodeName"):
            return True  # deleted before it was scheduled: never ran
        return now > _parse_time(meta["deletionTimestamp"]) + VANISH_TIMEOUT_S
    return False


def pod_running(pod: dict) -> bool:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER and (cs.get("state") or {}).get("running") is not None:
            return True
    return False


def pod_index(pod: dict) -> int | None:
    """The pod's index in its gang (= its node rank) from the annotation it was made with
    (or a Job's completion index); None: not a pod of a gang of ours."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        return int(ann.get(ANNOTATION_NODE_RANK) or ann.get(COMPLETION_INDEX))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _or_last(index: int | None) -> int:
    return index if index is not None else 1 << 30


def pod_key(pod: dict) -> tuple[str, int] | None:
    meta = pod.get("metadata") or {}
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    job_id = ann.get(ANNOTATION_JOB) or labels.get(LABEL_JOB, "")
    try:
        attempt = int(labels.get(LABEL_ATTEMPT, "0"))
    except ValueError:
        return None
    return (job_id, attempt) if job_id and attempt > 0 else None


@dataclass
class _K8sAttempt:
    spec: AttemptSpec
    name: str
    expected: int  # pods of the gang
    state: int = AS.ATTEMPT_STATE_STARTING
    stop_mode: str = ""  # "" | "checkpoint" | "kill"
    stop_time: float = 0.0
    stop_grace_s: int = 0  # the pods' deletion grace: they may save for this long
    failure: tuple[int, str, list[str]] | None = None
    exit_codes: dict[str, int] = field(default_factory=dict)  # pod name -> exit code
    seen: set[str] = field(default_factory=set)  # pod names ever seen
    adopted: bool = False
    last: ProgressSnapshot | None = None  # the trainer's word, from the pod annotation
    last_raw: str = ""
    last_sent_sig: tuple | None = None
    last_sent_time: float = 0.0
    running_since: float = 0.0  # all pods' containers running (the hang clock's start)
    drain_since: float = 0.0  # when its end was known, while its pods' logs are read
    progress_unsent: bool = False  # ``last`` is newer than what was reported (rate limit)
    # one of its pods is being deleted and still counts as running: it ends by time
    # (its node gone: VANISH_TIMEOUT_S after its deadline), with no watch event to say so
    ends_by_time: bool = False
    hang_timeout_s: float = 600.0
    # annotations every pod of the attempt must carry (set on pods created later too)
    wanted: dict[str, str] = field(default_factory=dict)
    # its Service/Secret/pods are still being created (a creator thread): poll() leaves
    # it alone, and a stop or failure meanwhile is applied by the creator (no more pods)
    created: Future | None = None
    # False when its creation was refused or abandoned (what it had made is undone): the
    # names may be someone else's objects, which the cleanup must not delete
    owns_objects: bool = True
    made: set[str] = field(default_factory=set)  # pods its creator made (a fence reads it)
    # when launch() took the Launch (monotonic): the "launched" log line says how long it
    # then waited (a fence, a free creator thread) and how long the API server's answers
    # took, so a slow Launch -> pods shows which of the agent's stages held it
    received: float = field(default_factory=time.monotonic)


class KubernetesExecutor(Executor):
    """Creates, watches and deletes each attempt's pods; see the module docstring."""

    name = "kubernetes"

    def __init__(self, namespace: str = "default", region: str = "", image: str = "",
                 api_client: k8s.ApiClient | None = None, service_account: str = "",
                 run_as_user: int = DEFAULT_UID, grace_s: int = 120,
                 hang_timeout_s: float = 600.0, progress_interval_s: float = 1.0,
                 log_dir: str = "", max_log_streams: int = DEFAULT_MAX_STREAMS,
                 launch_workers: int = LAUNCH_WORKERS, owners_path: str = "") -> None:
        """``log_dir``: where pods' output is kept for the agent's log shipper
        (k8s_logs.py); "" = pods' output is not read. ``owners_path``: the agent's record
        of which job claimed each checkpoint prefix (resume_views.check_named_owners);
        "" = none kept (tests of other parts)."""
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
        self.run_as_user = run_as_user
        self.grace_s = grace_s
        self.hang_timeout_s = hang_timeout_s
        self.progress_interval_s = progress_interval_s
        workers = max(1, launch_workers)
        enders = max(KILL_WORKERS, min(workers, END_WORKERS))
        self.core = k8s.CoreV1Api(_sized_client(api_client, 2 * workers + enders + 8))
        self.batch = k8s.BatchV1Api(self.core.api_client)  # the memory keepers' Jobs
        self._lock = threading.RLock()
        self._nodes: dict[str, common_pb2.Node] = {}
        self._attempts: dict[tuple[str, int], _K8sAttempt] = {}
        self._events: list[AttemptEvent] = []
        self._released: dict[str, float] = {}  # pod uid -> when its finalizer was released
        self._spot_seen: dict[str, float] = {}  # node -> when its spot taint was first seen
        self.changed = threading.Event()  # set by the watches: something may have changed
        self._creator = ThreadPoolExecutor(workers, thread_name_prefix="k8s-create")
        self._pod_creator = ThreadPoolExecutor(workers, thread_name_prefix="k8s-create-pod")
        # kills, cleanups (a request per pod, by name) and keepers' ends, off the lock
        self._ender = ThreadPoolExecutor(enders, thread_name_prefix="k8s-end")
        self._last_pass = 0.0  # the last pass over every attempt (FULL_PASS_S)
        self._last_time_pass = 0.0  # the last look at attempts due by time (TIME_PASS_S)
        # The pod watch's changes wake a pass over only the attempts whose pods changed
        # (self.changed, set by everything else, wakes a pass over all of them). Why: at
        # 2,500 running attempts a pass over every one each second was a tenth of a core.
        self.pods_changed = threading.Event()
        self._pods_of_key: dict[tuple[str, int], dict[str, dict]] = {}  # attempt -> its pods
        self._key_of: dict[str, tuple[str, int]] = {}  # pod name -> its attempt
        self.pods = ObjectCache(self.core.list_namespaced_pod, what="pods",
                                on_change=self.pods_changed.set, namespace=namespace,
                                label_selector=f"{LABEL_MANAGED}={MANAGER}").start()
        # Node changes do not wake the pod pass: nothing in it reads nodes (a pod on a
        # lost node ends by its deletion, judged by time), and 2,000 nodes' status
        # updates would make that pass over every pod run at every tick.
        self.node_cache = ObjectCache(self.core.list_node, what="nodes").start()
        self._node_health: dict[str, tuple[bool, str]] = {}  # known node -> health_of
        self._node_spot: set[str] = set()  # known nodes carrying the spot taint
        self.fences = Fences(self.pods.get, lambda p: pod_ended(p, time.time()))
        self.owners = OwnerBook(owners_path) if owners_path else None
        logs_core = k8s.CoreV1Api(_sized_client(api_client, max_log_streams + 4))
        self.pod_logs = (PodLogs(logs_core, namespace, Path(log_dir), CONTAINER,
                                 max_streams=max_log_streams, on_done=self.changed.set)
                         if log_dir else None)
        # keeper pods carry our managed-by label: the pod watch above sees them too
        self.keepers = KeeperJobs(self.core, self.batch, namespace, self.pods.snapshot,
                                  image=image, service_account=service_account,
                                  run_as_user=run_as_user)
        self.keeper_idle_s = KEEPER_IDLE_S
        self._keeper_idle: dict[str, float] = {}  # job -> since when no attempt used its keepers
        self._last_sweep = 0.0

    # ---- nodes ------------------------------------------------------------------
    def discover_nodes(self) -> list[common_pb2.Node]:
        """Inventory from the watched Node objects (GPU nodes only), via labels.py."""
        nodes = []
        for obj in self.node_cache.snapshot().values():
            try:
                n = L.node_from_k8s(obj, region=self.region)
            except L.LabelError as e:
                log.warning("node %s left out: %s", obj["metadata"]["name"], e)
                continue
            if n.gpus > 0:
                n.healthy = n.healthy and health_of(obj)[0]
                nodes.append(n)
        with self._lock:
            self._nodes = {n.id: n for n in nodes}
        return sorted(nodes, key=lambda n: n.id)

    def node_signals(self) -> tuple[dict[str, float], dict[str, tuple[bool, str]]]:
        """(spot notices: node -> reclaim deadline, health: node -> (healthy, reason))
        of the known GPU nodes, from the Node watch. A node whose object is gone is
        unhealthy. The agent merges them with its own notice path (signals.py).

        Called at every agent tick: only nodes whose object changed since the previous
        call (or that joined the known set) are judged again."""
        changed = self.node_cache.take_changed()
        now = time.time()
        with self._lock:
            known = set(self._nodes)
        health, spotted = self._node_health, self._node_spot
        for name in [n for n in health if n not in known]:  # left the inventory
            del health[name]
            spotted.discard(name)
            self._spot_seen.pop(name, None)
        todo = known if changed is None else (changed & known) | (known - health.keys())
        for name in todo:
            obj = self.node_cache.get(name)
            if obj is None:
                health[name] = (False, "Node object deleted")
                spotted.discard(name)
                continue
            health[name] = health_of(obj)
            if spot_tainted(obj):
                spotted.add(name)
                self._spot_seen.setdefault(name, now)
            else:
                spotted.discard(name)
                self._spot_seen.pop(name, None)
        spot = {name: self._spot_seen[name] + SPOT_WARNING_S for name in spotted}
        return spot, dict(health)

    # ---- launch ------------------------------------------------------------------
    def ranks(self, spec: AttemptSpec) -> int:
        """WORLD_SIZE of the pods (build_manifests): nodes x GPUs of the first placed node."""
        placed = list(spec.placement.nodes)
        n_nodes = len(placed) or max(1, spec.spec.resources.nodes)
        return n_nodes * ((placed[0].gpus if placed else 0) or spec.spec.resources.gpus_per_node or 1)

    # ---- users' code --------------------------------------------------------------
    ships_workdir = True  # the pods are not on the agent's machine

    def prepare(self, spec: AttemptSpec) -> None:
        """Refuse at once what could never start: a workdir without a store to carry it,
        or a checkpoint prefix or resume point of another job (by name)."""
        if self.owners is not None:
            check_named_owners(self.owners, spec)
        if spec.spec.HasField("workdir"):
            workdir_store.workdir_uri(spec.checkpoint_uri or spec.spec.checkpoint_uri,
                                      spec.spec.workdir.digest)

    def stage_workdir(self, spec: AttemptSpec, tar: str) -> None:
        """Put the verified tarball into the attempt's checkpoint location, where its pods'
        supervisor fetches, verifies and unpacks it (checkpoint_layout/workdir_store.py).
        Runs in the staging thread, off the agent's lock."""
        uri = workdir_store.workdir_uri(spec.checkpoint_uri or spec.spec.checkpoint_uri,
                                        spec.spec.workdir.digest)
        client = None
        if uri.startswith("s3://"):
            from region_agents.staging import s3_client

            client = s3_client()
        try:
            wrote = workdir_store.publish(tar, uri, os.path.getsize(tar), s3_client=client,
                                          owner=(self.run_as_user, self.run_as_user))
        except Exception as e:  # noqa: BLE001 - the store's words, for the attempt's failure
            raise ValueError(f"cannot put the workdir into the job's store at {uri}: {e}") from None
        log.info("%s attempt %d: workdir %s %s", spec.job_id, spec.attempt,
                 "put at" if wrote else "already at", uri)

    def launch(self, spec: AttemptSpec) -> None:
        if spec.attempt <= 0:
            raise ValueError(f"attempt must be >= 1, got {spec.attempt}")
        with self._lock:
            waits = self._fence_older(spec.job_id, spec.attempt)
            m = build_manifests(spec, namespace=self.namespace, image=self.image,
                                nodes=self._nodes, service_account=self.service_account,
                                run_as_user=self.run_as_user, grace_s=self.grace_s)
            att = _K8sAttempt(spec=spec, name=m.name, expected=len(m.pods),
                              hang_timeout_s=self._hang_timeout(spec))
            self._attempts[(spec.job_id, spec.attempt)] = att
            self._events.append(AttemptEvent(spec.job_id, spec.attempt, AS.ATTEMPT_STATE_STARTING))
            if not waits:
                att.created = self._creator.submit(self._create, att, m)
                return
            # the older pods end first (k8s_fence.py): held here, off the broker's stream
            att.created = Future()
            self.fences.add(Fence(f"{spec.job_id} attempt {spec.attempt}", waits,
                                  go=lambda: self._fence_cleared(att, m),
                                  give_up=lambda: self._fence_failed(att),
                                  timeout_s=FENCE_TIMEOUT_S))

    def _fence_cleared(self, att: _K8sAttempt, m: Manifests) -> None:
        """The fence thread: every older pod has ended; the attempt's objects are made."""
        with self._lock:
            held, att.created = att.created, self._creator.submit(self._create, att, m)
        if held is not None and not held.done():
            held.set_result(None)

    def _fence_failed(self, att: _K8sAttempt) -> None:
        """The fence thread: an older attempt's pods did not end in time: this attempt
        fails (nothing of it was made), as a refused Launch did before."""
        with self._lock:
            held = att.created
            att.failure = att.failure or (
                -1, f"an older attempt of {att.spec.job_id} could not be stopped in"
                    f" {FENCE_TIMEOUT_S:g} s", [])
            att.created, att.owns_objects = None, False
            self.changed.set()
        log.warning("%s attempt %d: an older attempt's pods did not end in %.0f s",
                    att.spec.job_id, att.spec.attempt, FENCE_TIMEOUT_S)
        if held is not None and not held.done():
            held.set_result(None)

    def _create(self, att: _K8sAttempt, m: Manifests, adopted: bool = False) -> None:
        """A creator thread: the attempt's API objects (see the module doc), no lock held
        while the requests are in flight. ``adopted``: finishing what a previous agent
        process began (its Service and Secret exist; pods already there are kept)."""
        created: list[tuple[str, str]] = []
        core, ns = self.core, self.namespace
        began = time.monotonic()
        every = memory_every(dict(att.spec.spec.trainer.options))
        if every:
            self._with_keepers(att, m, every)
        try:
            if not adopted:
                service = json.loads(_raw(core.create_namespaced_service, ns, m.service))
                created.append(("service", m.name))
                m.secret.metadata.owner_references = [owner_reference(service)]
                _raw(core.create_namespaced_secret, ns, m.secret)
                created.append(("secret", m.name))
            with self._lock:
                stopped = bool(att.stop_mode or att.failure)
            if not stopped and m.pods:  # (stopped before its pods exist: make none)
                # in parallel: a gang's pods are independent (the Secret exists)
                others = [self._pod_creator.submit(self._create_pod, p, adopted)
                          for p in m.pods[1:]]
                errors = []
                for pod, fut in zip(m.pods, [None, *others], strict=True):
                    try:
                        self._create_pod(pod, adopted) if fut is None else fut.result()
                        created.append(("pod", pod.metadata.name))
                        att.made.add(pod.metadata.name)
                    except Exception as e:  # noqa: BLE001 - every create is waited for
                        errors.append(e)
                if errors:
                    raise errors[0]
        except Exception as e:  # noqa: BLE001 - any refusal ends the attempt as FAILED
            why = _api_error(e) if isinstance(e, k8s.ApiException) else f"{type(e).__name__}: {e}"
            self._undo(att, created)
            with self._lock:
                att.failure = att.failure or (-1, f"kubernetes refused the attempt: {why}", [])
                att.created, att.owns_objects = None, adopted
                self.changed.set()
            log.warning("%s attempt %d: kubernetes refused it: %s", att.spec.job_id,
                        att.spec.attempt, why)
            return
        with self._lock:
            att.created = None
            if att.stop_mode or att.failure:  # stopped while its objects were being made
                self._kill(att.name, att.spec.job_id, att.spec.attempt, att.stop_grace_s)
            self.changed.set()
        done = time.monotonic()
        log.info("launched %s attempt %d: %s/%s, %d pod(s) (waited %.3f s, API requests"
                 " %.3f s)", att.spec.job_id, att.spec.attempt, self.namespace, att.name,
                 att.expected, began - att.received, done - began)

    def _with_keepers(self, att: _K8sAttempt, m: Manifests, every: int) -> None:
        """A creator thread: ready keepers on the attempt's nodes, their addresses and
        token reference into the rank pods' env; without them the attempt runs on the
        store tier alone (said in the log), as the local executor does."""
        nodes = [n.node_id for n in att.spec.placement.nodes]
        try:
            placed = att.spec.placement.nodes
            env = self.keepers.ensure(att.spec.job_id, nodes, every, image=att.spec.spec.image,
                                      options=dict(att.spec.spec.trainer.options),
                                      ranks_per_node=(placed[0].gpus if placed else 0)
                                      or att.spec.spec.resources.gpus_per_node or 1)
        except Exception as e:  # noqa: BLE001 - KeeperError, or the API server unreachable
            log.warning("%s attempt %d: memory tier off for this attempt: %s",
                        att.spec.job_id, att.spec.attempt, e)
            return
        # the gang's pods share one container spec (build_manifests): extend each once
        for container in {id(c): c for p in m.pods for c in p.spec.containers[:1]}.values():
            container.env = [*(container.env or []), *env]

    def _create_pod(self, pod: k8s.V1Pod, adopted: bool) -> None:
        try:
            _raw(self.core.create_namespaced_pod, self.namespace, pod)
        except k8s.ApiException as e:
            if not (adopted and e.status == 409):  # 409 when adopted: made before the restart
                raise

    def wait_created(self, job_id: str, attempt: int, timeout: float = 60.0) -> None:
        """Until the attempt's API objects exist (or were refused): for callers that read
        them right after ``launch()``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            att = self._attempts.get((job_id, attempt))
        while att is not None:
            with self._lock:
                fut = att.created
            if fut is None:
                return
            fut.result(max(0.0, deadline - time.monotonic()))  # a fence's, then the creator's
            if fut.done() and att.created is fut:
                return

    def _undo(self, att: _K8sAttempt, created: list[tuple[str, str]]) -> None:
        """Delete what a refused creation had made (its pods never ran: grace 0)."""
        self._delete_pods(att.name, [n for kind, n in created if kind == "pod"], 0)
        kinds = {kind for kind, _ in created}
        with contextlib.suppress(k8s.ApiException):
            if "secret" in kinds:
                self.core.delete_namespaced_secret(att.name, self.namespace)
            if "service" in kinds:
                self.core.delete_namespaced_service(att.name, self.namespace)

    def _fence_older(self, job_id: str, attempt: int) -> list[FenceWait]:
        """Kill every pod of an older attempt of ``job_id`` that may still run (ours or
        a previous agent process's, or one still being made) and return the pods the
        new attempt must see end first (k8s_fence.py); [] when there is none. Attempt
        1 has none (and is most Launches: no pass over every pod of the namespace)."""
        if attempt <= 1:
            return []
        now = time.time()
        live = [p for p in self.pods.snapshot().values()
                if (k := pod_key(p)) and k[0] == job_id and k[1] < attempt
                and not pod_ended(p, now)]
        making = [a for (j, n), a in self._attempts.items()
                  if j == job_id and n < attempt and a.created is not None]
        if not live and not making:
            return []
        for a in sorted({pod_key(p)[1] for p in live} | {a.spec.attempt for a in making}):  # type: ignore[index]
            log.warning("%s attempt %d supersedes attempt %d, still running: killing it",
                        job_id, attempt, a)
            att = self._attempts.get((job_id, a))
            if att is not None:
                att.stop_mode = att.stop_mode or "kill"
                att.stop_time = att.stop_time or time.time()
            self._kill(resource_name(job_id, a), job_id, a, 0)
        waits = {p["metadata"]["name"]: FenceWait(p["metadata"]["name"]) for p in live}
        for a in making:  # its pods may not exist yet, or not be in the cache yet
            for i in range(a.expected):
                name = pod_name(a.name, i)
                waits.setdefault(name, FenceWait(
                    name, lambda a=a, n=name: (a.created is None, n in a.made)))
        return list(waits.values())

    # ---- control -----------------------------------------------------------------
    def _kill(self, name: str, job_id: str, attempt: int, grace_s: int) -> None:
        """Delete the attempt's pods with ``grace_s`` (see the module doc), one request
        per pod by name, on the deleter threads: callers hold the executor's lock, which
        the broker stream's Launches wait for, and a delete may take long on a busy API
        server. Not ``deletecollection``: the API server reads every pod of the namespace
        for each one (thousands, at scale) to find the attempt's two."""
        self.changed.set()  # the next poll() looks at the attempt again
        self._ender.submit(self._delete_pods, name, self._pod_names(name, job_id, attempt),
                             grace_s)

    def _pod_names(self, name: str, job_id: str, attempt: int) -> list[str]:
        """The attempt's pods: their fixed names (``pod_name``), and for an adopted
        attempt (made by an older agent, perhaps through a Job) the names in the cache."""
        att = self._attempts.get((job_id, attempt))
        names = {pod_name(name, i) for i in range(att.expected if att is not None else 0)}
        if att is None or att.adopted:
            names |= {n for n, p in self.pods.snapshot().items() if pod_key(p) == (job_id, attempt)}
        return sorted(names)

    def _delete_pods(self, name: str, pods: list[str], grace_s: int) -> None:
        for pod in pods:
            try:
                self.core.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=grace_s,
                                                _preload_content=False)
            except k8s.ApiException as e:
                if e.status != 404:
                    log.warning("delete pod %s of %s: %s", pod, name, _api_error(e))

    def _cleanup(self, att: _K8sAttempt) -> None:
        """After the end: Service and Secret, then the pods (ended, read and released).
        In this order, a Service without pods is always an attempt whose pods were never
        made (recover() relies on it), and released pods are always an attempt already
        reported."""
        self._delete_objects(att.name, att.spec.job_id, att.spec.attempt)

    def _delete_objects(self, name: str, job_id: str, attempt: int) -> None:
        """Service, Secret, then pods, in that order, on a deleter thread (see _kill)."""
        pods = self._pod_names(name, job_id, attempt)

        def delete() -> None:
            for call in (self.core.delete_namespaced_service, self.core.delete_namespaced_secret):
                try:
                    call(name, self.namespace, propagation_policy="Background",
                         _preload_content=False)
                except k8s.ApiException as e:
                    if e.status != 404:
                        log.warning("delete %s: %s", name, _api_error(e))
            self._delete_pods(name, pods, 0)
        self._ender.submit(delete)

    def _keepers_done(self, att: _K8sAttempt, state: int) -> None:
        """A job that succeeded, stopped or checkpointed needs its memory no more (a
        failed attempt's relaunch does); unless another attempt of it runs here (a
        make-before-break standby keeps the keepers it started)."""
        job = att.spec.job_id
        if state == AS.ATTEMPT_STATE_FAILED or not memory_every(dict(att.spec.spec.trainer.options)):
            return
        if any(j == job and a != att.spec.attempt for j, a in self._attempts):
            return
        self._ender.submit(self.keepers.stop_job, job)

    def _sweep_keepers(self, now: float) -> None:
        """Keepers of a job none of whose attempts ran here for ``keeper_idle_s`` go
        (a job that failed and was not relaunched here, or ended while no agent ran)."""
        if now - self._last_sweep < KEEPER_SWEEP_S:
            return
        self._last_sweep = now
        live = {j for j, _ in self._attempts}
        for job in self.keepers.jobs_with_keepers():
            if job in live:
                self._keeper_idle.pop(job, None)
                continue
            since = self._keeper_idle.setdefault(job, now)
            if now - since > self.keeper_idle_s:
                del self._keeper_idle[job]
                log.info("%s: no attempt for %.0f s: removing its memory keepers", job, now - since)
                self._ender.submit(self.keepers.stop_job, job)

    def stop(self, job_id: str, attempt: int, checkpoint_first: bool, grace_s: float) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise KeyError(f"{job_id} attempt {attempt} is not running here")
            if checkpoint_first:
                if att.stop_mode:
                    return  # already stopping: the first deadline stands
                att.stop_mode = "checkpoint"
                att.stop_grace_s = max(0, math.ceil(grace_s))
            else:
                if att.stop_mode == "kill" and time.time() - att.stop_time < KILL_AGAIN_S:
                    return  # its pods' deletes were just asked for (a self-fence repeats
                    # the kill every tick while the broker is silent: thousands of
                    # DELETEs a second at scale)
                att.stop_mode = "kill"
                att.stop_grace_s = 0
            att.stop_time = time.time()
            self._kill(att.name, job_id, attempt, att.stop_grace_s)
            if checkpoint_first:
                self._set(att, AS.ATTEMPT_STATE_CHECKPOINTING)

    def _hang_timeout(self, spec: AttemptSpec) -> float:
        """The job's option ``hang_timeout_s`` (checkpoint_layout/job_options.py), else ours."""
        return job_options.value(spec.spec.trainer.options, "hang_timeout_s", self.hang_timeout_s,
                                 strict=False)

    def checkpoint(self, job_id: str, attempt: int) -> None:
        """Checkpoint-now: a new value of the pods' checkpoint-now annotation; the pod's
        supervisor sees it in its downward-API file and SIGUSR1s the ranks."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise KeyError(f"{job_id} attempt {attempt} is not running here")
            att.wanted[ANNOTATION_CHECKPOINT_NOW] = str(time.time_ns())
            self._apply_wanted(att, self._pods_of(att))

    supports_standby = True

    def go(self, job_id: str, attempt: int, go: Go) -> None:
        """Release (or abort) a standby: the Go as an annotation of its pods, which the
        trainer reads from its downward-API file (trainer/standby.py waits for it)."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise KeyError(f"{job_id} attempt {attempt} is not running here")
            att.wanted[ANNOTATION_GO] = go.to_json()
            self._apply_wanted(att, self._pods_of(att))

    def parked(self, job_id: str, attempt: int) -> bool | None:
        """The standby's own word (progress state ``standby``), from its pod."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                return None
            self._read_progress(att, self._pods_of(att))
            return att.last is not None and att.last.state == "standby"

    def _pods_of(self, att: _K8sAttempt) -> list[dict]:
        key = (att.spec.job_id, att.spec.attempt)
        return [p for p in self.pods.snapshot().values() if pod_key(p) == key]

    def _apply_wanted(self, att: _K8sAttempt, pods: list[dict]) -> None:
        for p in pods:
            meta = p["metadata"]
            ann = meta.get("annotations") or {}
            todo = {k: v for k, v in att.wanted.items() if ann.get(k) != v}
            if not todo or meta.get("deletionTimestamp"):
                continue
            try:
                self.core.patch_namespaced_pod(meta["name"], self.namespace,
                                               {"metadata": {"annotations": todo}})
            except k8s.ApiException as e:
                if e.status != 404:
                    log.warning("annotate %s: %s", meta["name"], _api_error(e))

    def _read_progress(self, att: _K8sAttempt, pods: list[dict]) -> None:
        for p in pods:
            raw = ((p["metadata"].get("annotations") or {}).get(ANNOTATION_PROGRESS)) or ""
            if raw and raw != att.last_raw:
                att.last_raw = raw
                with contextlib.suppress(ValueError):
                    snap = parse_progress(json.loads(raw))
                    if snap is not None:
                        att.last = snap
                        att.progress_unsent = True
                        self.keepers.saw(att.spec.job_id, snap.raw)  # sizes later keepers

    def fail(self, job_id: str, attempt: int, message: str, failed_nodes: list[str]) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None or att.failure:
                return
            att.failure = (-9, message, list(failed_nodes))
            self._kill(att.name, job_id, attempt, 0)

    # ---- observation ----------------------------------------------------------------
    def _set(self, att: _K8sAttempt, state: int, **kw: object) -> None:
        if att.state != state:
            att.state = state
            progress = att.last.progress if att.last is not None else None
            wait = att.last.store_wait() if att.last is not None else None
            self._events.append(AttemptEvent(att.spec.job_id, att.spec.attempt, state,
                                             progress, store_wait=wait,
                                             **kw))  # type: ignore[arg-type]

    def _send_progress(self, att: _K8sAttempt, snap: ProgressSnapshot, now: float) -> None:
        """Report ``snap`` when it is new, at most every progress_interval_s (a change of
        the ranks' store wait is news at once)."""
        sig = snap.signature()
        if sig == att.last_sent_sig:
            att.progress_unsent = False
            return
        waits = (att.last_sent_sig or ())[-1:] != sig[-1:]
        if not waits and now - att.last_sent_time < self.progress_interval_s:
            return  # progress_unsent stays: a pass by time sends it
        att.last_sent_sig, att.last_sent_time = sig, now
        att.progress_unsent = False
        self._events.append(AttemptEvent(att.spec.job_id, att.spec.attempt, att.state,
                                         snap.progress, store_wait=snap.store_wait()))

    def poll(self) -> list[AttemptEvent]:
        """The attempts' news since the last call. Called ~5 times a second by the agent.

        Three kinds of pass, each judging an attempt by the same rules (``_judge``):
        * every attempt, when something other than the pod watch asked (a launch done, a
          stop, a kill, a pod's log read to its end), after a relist of the pods, and
          every ``FULL_PASS_S`` whatever happened;
        * the attempts whose pods the watch changed, as soon as it did;
        * every ``TIME_PASS_S``, the attempts whose state time alone can change: the hang
          detector's deadline passed, pods being deleted on a node that may be gone,
          an end waiting for its pods' logs, progress held back by the rate limit."""
        with self._lock:
            now = time.time()
            if self.changed.is_set() or now - self._last_pass >= FULL_PASS_S:
                self.changed.clear()
                self.pods_changed.clear()
                self._last_pass = self._last_time_pass = now
                self.pods.take_changed()  # everything is read below
                self._index_all()
                self._judge(list(self._attempts), set(self._pods_of_key), now)
            else:
                keys: set[tuple[str, int]] = set()
                if self.pods_changed.is_set():
                    self.pods_changed.clear()
                    changed = self.pods.take_changed()
                    if changed is None:  # relisted: every pod may differ
                        self._index_all()
                        keys = set(self._attempts) | set(self._pods_of_key)
                    else:
                        keys = self._index(changed)
                if now - self._last_time_pass >= TIME_PASS_S:
                    self._last_time_pass = now
                    keys.update(k for k, a in self._attempts.items() if self._due_by_time(a, now))
                if keys:
                    self._judge([k for k in keys if k in self._attempts], keys, now)
            self._sweep_keepers(now)
            out, self._events = self._events, []
            return out

    def _index_all(self) -> None:
        """Group every watched pod by its attempt, from scratch."""
        self._pods_of_key, self._key_of = defaultdict(dict), {}
        for name, p in self.pods.snapshot().items():
            k = pod_key(p)
            if k is not None:
                self._pods_of_key[k][name] = p
                self._key_of[name] = k
        self._pods_of_key = dict(self._pods_of_key)

    def _index(self, names: set[str]) -> set[tuple[str, int]]:
        """Apply the watch's changes to pods ``names``; the attempts they touched."""
        touched: set[tuple[str, int]] = set()
        for name in names:
            old = self._key_of.pop(name, None)
            if old is not None:
                touched.add(old)
                group = self._pods_of_key.get(old)
                if group is not None:
                    group.pop(name, None)
                    if not group:
                        del self._pods_of_key[old]
            p = self.pods.get(name)
            k = pod_key(p) if p is not None else None
            if k is not None:
                self._pods_of_key.setdefault(k, {})[name] = p
                self._key_of[name] = k
                touched.add(k)
        return touched

    @staticmethod
    def _due_by_time(att: _K8sAttempt, now: float) -> bool:
        """Can time alone have changed what ``_poll_one`` would decide for ``att``?"""
        if att.created is not None:
            return False
        if att.stop_mode or att.failure or att.drain_since or att.ends_by_time or att.progress_unsent:
            return True
        if att.running_since and att.hang_timeout_s > 0:
            beat = max(att.last.heartbeat if att.last else 0.0, att.running_since)
            return now - beat > att.hang_timeout_s
        return False

    def _judge(self, attempts: list[tuple[str, int]], pod_keys: set[tuple[str, int]],
               now: float) -> None:
        """Judge ``attempts`` on their pods; release the ended pods of attempts among
        ``pod_keys`` that are no longer ours (ended and reported, or a stranger's)."""
        for key in attempts:
            att = self._attempts.get(key)
            if att is None or att.created is not None:
                continue  # its objects are being made: nothing to judge yet
            pods = [p for _, p in sorted(self._pods_of_key.get(key, {}).items())]
            if self.pod_logs is not None:
                self.pod_logs.sync(*key, pods, self._pod_ranks(att))
            self._poll_one(att, pods, now)
            if att.state in TERMINAL:
                del self._attempts[key]
        for key in pod_keys:
            if key not in self._attempts:
                for p in list(self._pods_of_key.get(key, {}).values()):
                    if pod_ended(p, now):
                        self._release(p)

    def _poll_one(self, att: _K8sAttempt, pods: list[dict], now: float) -> None:
        self._read_progress(att, pods)
        att.ends_by_time = any((p.get("metadata") or {}).get("deletionTimestamp")
                               and not pod_ended(p, now) for p in pods)
        crashed: list[tuple[dict, int, str]] = []  # (pod, exit code, why) newly seen
        for pod in pods:
            name = pod["metadata"]["name"]
            att.seen.add(name)
            code, why = pod_outcome(pod, now)
            if code is None or name in att.exit_codes:
                continue
            att.exit_codes[name] = code
            if code not in (EXIT_OK, EXIT_CHECKPOINTED):
                crashed.append((pod, code, why))
        if crashed and not att.failure and not att.stop_mode:
            # One pass may find several: a lost node's pod (killed by a signal, 128+N) and
            # peers that then failed their collective. The rule every executor shares
            # (crash_blame.py) says which is blamed: the killed one, then the lowest index.
            pod, code, why = culprit(crashed, code=lambda c: c[1],
                                     order=lambda c: _or_last(pod_index(c[0])))
            name, node = pod["metadata"]["name"], (pod.get("spec") or {}).get("nodeName") or ""
            blamed = [] if code in NOT_THE_NODE or not node else [node]
            msg = f"pod {name} on node {node or '?'} exited with code {code}"
            if why:
                msg += f" ({why})"
            att.failure = (code, msg, blamed)
            self._kill(att.name, att.spec.job_id, att.spec.attempt, 0)  # the gang is lost

        ended = all(pod_ended(p, now) for p in pods)
        codes = list(att.exit_codes.values())
        if att.failure or att.stop_mode:
            # Pods may still be saving for their whole grace. No controller makes new
            # ones; once none can run, the attempt is over.
            if not ended:
                return
            if att.failure:
                code, msg, nodes = att.failure
                self._finish(att, pods, AS.ATTEMPT_STATE_FAILED, code, msg, nodes)
            elif (att.stop_mode == "checkpoint" and EXIT_CHECKPOINTED in codes
                  and all(c in (EXIT_OK, EXIT_CHECKPOINTED) for c in codes)):
                self._finish(att, pods, AS.ATTEMPT_STATE_CHECKPOINTED, EXIT_CHECKPOINTED,
                             "checkpointed")
            else:
                why = ("killed on stop" if att.stop_mode == "kill"
                       else "stopped: no checkpoint within grace")
                bad = [c for c in codes if c not in (EXIT_OK, EXIT_CHECKPOINTED)]
                self._finish(att, pods, AS.ATTEMPT_STATE_STOPPED, bad[0] if bad else -9, why)
            return
        if ended and len(codes) >= att.expected:
            if all(c == EXIT_OK for c in codes):
                self._finish(att, pods, AS.ATTEMPT_STATE_SUCCEEDED, EXIT_OK, "all pods exited 0")
            else:  # every pod exited 0 or 75 (a crash is a failure above)
                self._finish(att, pods, AS.ATTEMPT_STATE_CHECKPOINTED, EXIT_CHECKPOINTED,
                             "checkpointed")
            return
        self._running_updates(att, pods, now)

    def _running_updates(self, att: _K8sAttempt, pods: list[dict], now: float) -> None:
        """RUNNING when the trainer says so (as the local executor: a stop reaching a
        trainer still starting would save nothing real), progress at most every
        ``progress_interval_s``, and the hang detector."""
        all_running = bool(pods) and len(pods) >= att.expected and all(map(pod_running, pods))
        if all_running and not att.running_since:
            att.running_since = now
        if att.wanted:
            self._apply_wanted(att, pods)
        snap = att.last
        if att.state == AS.ATTEMPT_STATE_STARTING:
            said = snap is not None and snap.state in ("running", "checkpointing", "done")
            # a job's own command may not publish progress: its pods running is all we know
            if all_running and (said or att.spec.spec.command):
                self._set(att, AS.ATTEMPT_STATE_RUNNING)
            elif snap is not None and snap.store_wait() is not None:
                self._send_progress(att, snap, now)  # starting, waiting for the store
        elif snap is not None:
            self._send_progress(att, snap, now)
        if att.running_since and att.hang_timeout_s > 0:
            # The trainer's heartbeat (its clock; pods and agent keep NTP time) or, before
            # its first word, when its pods started running (image pulls do not count).
            beat = max(snap.heartbeat if snap else 0.0, att.running_since)
            if now - beat > att.hang_timeout_s:
                att.failure = (-9, f"hang: no progress for {int(now - beat)} s", [])
                self._kill(att.name, att.spec.job_id, att.spec.attempt, 0)

    def _finish(self, att: _K8sAttempt, pods: list[dict], state: int, code: int, msg: str,
                failed_nodes: list[str] | None = None) -> None:
        """Report the end, then let the pods go (their exit codes are read) and clean up.

        A gang whose every pod ran to exit 0 or 75 did run, even when it was over before a
        poll saw it running (a short attempt on a fast node, or a slow agent pass): report
        RUNNING first, so the broker and its events never see an attempt skip it."""
        if not self._logs_read(att):
            return  # the next pass reports it (the pods and their finalizers stay)
        if att.state == AS.ATTEMPT_STATE_STARTING and state in (AS.ATTEMPT_STATE_SUCCEEDED,
                                                                AS.ATTEMPT_STATE_CHECKPOINTED):
            self._set(att, AS.ATTEMPT_STATE_RUNNING)
        self._set(att, state, exit_code=int(code), message=msg, failed_nodes=list(failed_nodes or []))
        log.info("%s attempt %d finished: %s (%s)", att.spec.job_id, att.spec.attempt, msg, code)
        for p in pods:
            self._release(p)
        if att.owns_objects:
            self._cleanup(att)
            self._keepers_done(att, state)
        if self.pod_logs is not None:
            self.pod_logs.ended(att.spec.job_id, att.spec.attempt)

    def _logs_read(self, att: _K8sAttempt) -> bool:
        """Every pod's output is read to its end, or ``LOG_DRAIN_S`` passed since the
        attempt's end was known (a node gone with its log must not hold the end)."""
        if self.pod_logs is None or self.pod_logs.drained(att.spec.job_id, att.spec.attempt):
            return True
        now = time.time()
        att.drain_since = att.drain_since or now
        if now - att.drain_since < LOG_DRAIN_S:
            return False
        log.warning("%s attempt %d: its pods' output was not read to the end in %.0f s;"
                    " reporting its end without the rest", att.spec.job_id, att.spec.attempt,
                    LOG_DRAIN_S)
        return True

    # ---- rank output ------------------------------------------------------------------
    def notify_log_writes(self, fn: Callable[[str, int], None]) -> bool:
        """The pods' lines are appended by our own readers (k8s_logs.py): they say when."""
        if self.pod_logs is None:
            return False
        self.pod_logs.on_write = fn
        return True

    def log_sources(self, job_id: str, attempt: int) -> list[LogSource]:
        """Per-rank files filled from the pods' logs (k8s_logs.py)."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None or self.pod_logs is None:
                return []
            return self.pod_logs.sources(job_id, attempt, self.ranks(att.spec))

    def _pod_ranks(self, att: _K8sAttempt):  # noqa: ANN202 - Callable[[dict], PodRanks | None]
        """Which global ranks a pod of ``att`` runs: its completion index (= node rank)
        times the ranks per pod; a job's own command runs once per pod (the node rank)."""
        per_pod = max(1, self.ranks(att.spec) // max(1, att.expected))
        own_command = bool(att.spec.spec.command)

        def of(pod: dict) -> PodRanks | None:
            index = pod_index(pod)
            if index is None:
                return None  # not a pod of a gang of ours
            return PodRanks(index, 1) if own_command else PodRanks(index * per_pod, per_pod)
        return of

    def _release(self, pod: dict) -> None:
        """Remove our finalizer (the pod's end is read): a JSON patch that tests the
        finalizer is still where we saw it, so no one else's finalizer is touched."""
        meta = pod["metadata"]
        fins = meta.get("finalizers") or []
        uid = meta.get("uid", "")
        if FINALIZER not in fins or uid in self._released:
            return
        i = fins.index(FINALIZER)
        body = [{"op": "test", "path": f"/metadata/finalizers/{i}", "value": FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{i}"}]
        try:
            self.core.patch_namespaced_pod(meta["name"], self.namespace, body)
        except k8s.ApiException as e:
            if e.status != 404:  # moved meanwhile (422): next poll, with the fresh object
                log.info("release %s: %s", meta["name"], _api_error(e))
                return
        self._released[uid] = time.time()
        if len(self._released) > 10000:
            cutoff = time.time() - 600
            self._released = {u: t for u, t in self._released.items() if t > cutoff}

    def running(self) -> list[RunningInfo]:
        with self._lock:
            return [RunningInfo(a.spec.job_id, a.spec.attempt, a.state,
                                a.last.progress if a.last else None, a.spec.node_ids())
                    for a in self._attempts.values()]

    def shutdown(self, grace_s: float = 0.0) -> None:
        """The attempts belong to the cluster, not to this process: they keep running.
        A restarted agent re-adopts them (:meth:`recover`) and reports them on Register;
        the broker keeps or stops them (RegisterAck.stale_job_ids)."""
        self.fences.stop()  # a held Launch is not made: a successor's recover() sees no pod of it
        self._creator.shutdown(wait=True, cancel_futures=True)
        self._pod_creator.shutdown(wait=True, cancel_futures=True)
        self._ender.shutdown(wait=True)  # the kills and cleanups asked for are made
        self.pods.stop()
        self.node_cache.stop()
        if self.pod_logs is not None:
            self.pod_logs.stop()

    # ---- restart safety ----------------------------------------------------------
    def recover(self) -> list[AttemptEvent]:
        """Re-adopt every attempt whose Service or pods are in the cluster; their outcomes
        come out of ``poll()`` like those of attempts this process launched. An attempt
        whose pods were being made when the previous process died gets the missing ones
        (their names are fixed, so a pod made meanwhile is not made twice); one with a
        Service but no pod at all is reported FAILED (its Secret may never have been
        made, and the job's env is nowhere else)."""
        with self._lock:
            now = time.time()
            found: dict[tuple[str, int], dict] = {}
            try:
                services = json.loads(self.core.list_namespaced_service(
                    self.namespace, label_selector=f"{LABEL_MANAGED}={MANAGER}",
                    _preload_content=False).data).get("items") or []
            except k8s.ApiException as e:
                raise ValueError(f"cannot list services: {_api_error(e)}") from None
            for obj in services:
                k = pod_key(obj)
                if k is not None:
                    found[k] = {"service": obj, "pods": []}
            for p in self.pods.snapshot().values():
                k = pod_key(p)
                if k is not None:
                    found.setdefault(k, {"service": None, "pods": []})["pods"].append(p)
            for k, what in found.items():
                if k in self._attempts:
                    continue
                service, pods = what["service"], what["pods"]
                if pods and all(pod_ended(p, now) and FINALIZER not in
                                (p["metadata"].get("finalizers") or []) for p in pods):
                    # released: its end was reported; the previous agent died cleaning up
                    self._delete_objects(resource_name(*k), *k)
                    continue
                source = pods[0] if pods else service
                ann = source["metadata"].get("annotations") or {}
                spec = decode_launch(ann.get(ANNOTATION_LAUNCH, ""))
                if spec is None:
                    log.warning("%s attempt %d: no readable launch annotation; adopted bare", *k)
                    spec = AttemptSpec(job_id=k[0], attempt=k[1], spec=common_pb2.JobSpec(),
                                       placement=common_pb2.Placement())
                sann = (service or {}).get("metadata", {}).get("annotations") or {}
                try:
                    expected = int(sann.get(ANNOTATION_GANG_SIZE) or 0)
                except ValueError:
                    expected = 0
                expected = expected or len(spec.placement.nodes) or len(pods) or 1
                att = _K8sAttempt(spec=spec, name=resource_name(*k), expected=expected,
                                  adopted=True, hang_timeout_s=self._hang_timeout(spec))
                self._read_progress(att, pods)
                if pods and all(map(pod_running, pods)):
                    att.running_since = now
                if pods and all(pod_running(p) for p in pods) and len(pods) >= att.expected:
                    att.state = AS.ATTEMPT_STATE_RUNNING
                deleting = [p for p in pods if p["metadata"].get("deletionTimestamp")]
                if deleting:  # a stop (or a failure) the previous agent began
                    graces = [int(p["metadata"].get("deletionGracePeriodSeconds") or 0)
                              for p in deleting]
                    att.stop_mode = "checkpoint" if any(graces) else "kill"
                    att.stop_grace_s = max(graces, default=0)
                    att.stop_time = now
                    if len(deleting) < len(pods):  # finish the stop
                        self._kill(att.name, k[0], k[1], att.stop_grace_s)
                elif not pods:
                    att.failure = (-1, "the agent restarted before any pod of the attempt"
                                       " was made", [])
                elif len(pods) < expected and service is not None and not any(
                        pod_ended(p, now) for p in pods):
                    self._complete_gang(att, spec, {p["metadata"]["name"] for p in pods})
                self._attempts[k] = att
                log.info("re-adopted %s attempt %d (%d pod(s), %s)", k[0], k[1], len(pods),
                         att.stop_mode or ("failed" if att.failure else "running"))
        return []

    def _complete_gang(self, att: _K8sAttempt, spec: AttemptSpec, have: set[str]) -> None:
        """Make the pods of an adopted attempt that its previous agent had not made yet
        (the same manifests: the env is in the Secret, which exists once any pod does)."""
        try:
            m = build_manifests(spec, namespace=self.namespace, image=self.image,
                                nodes=self._nodes, service_account=self.service_account,
                                run_as_user=self.run_as_user, grace_s=self.grace_s)
        except Exception as e:  # noqa: BLE001 - cannot rebuild: the gang is lost
            att.failure = (-1, f"the attempt's missing pods cannot be made: {e}", [])
            self._kill(att.name, spec.job_id, spec.attempt, 0)
            return
        m.pods = [p for p in m.pods if p.metadata.name not in have]
        log.warning("%s attempt %d: making its %d missing pod(s)", spec.job_id, spec.attempt,
                    len(m.pods))
        att.created = self._creator.submit(self._create, att, m, True)

    def adopt_existing(self) -> list[RunningInfo]:
        """Compatibility: :meth:`recover`, then what runs."""
        self.recover()
        return self.running()

    def known_attempts(self) -> dict[str, int]:
        """Highest attempt per job with pods (or an attempt) here."""
        out: dict[str, int] = {}
        for p in self.pods.snapshot().values():
            k = pod_key(p)
            if k is not None:
                out[k[0]] = max(out.get(k[0], 0), k[1])
        with self._lock:
            for j, a in self._attempts:
                out[j] = max(out.get(j, 0), a)
        return out


def _sized_client(api_client: k8s.ApiClient, connections: int) -> k8s.ApiClient:
    """A client with the same cluster and credentials as ``api_client`` and a connection
    pool of its own, of ``connections`` (see LAUNCH_WORKERS)."""
    import copy

    cfg = copy.deepcopy(api_client.configuration)
    cfg.connection_pool_maxsize = max(connections, cfg.connection_pool_maxsize or 0)
    return k8s.ApiClient(cfg)


def _raw(call: Callable[..., Any], *args: Any) -> bytes:
    """A client call whose answer stays JSON bytes: turning each created object into the
    client's models is most of a request's CPU, and only the Service's uid is ever read.
    Reading the body also hands the connection back to the pool."""
    return call(*args, _preload_content=False).data


def _api_error(e: k8s.ApiException) -> str:
    """``403 Forbidden: <the API server's message>`` (the message names the missing verb)."""
    import json

    text = f"{e.status} {e.reason}"
    try:
        msg = json.loads(e.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        msg = ""
    return f"{text}: {msg}" if msg else text


# Kept for callers that built label values through this module.
_label_value = label_value
