"""API worker processes, the core's side: start them, follow them, hear their creations.

Why (issue 16, docs/architecture.md "API worker processes"): one broker process tops
out at about one core (the GIL) and ~1,000 SubmitJob/s, with the cost spread thin over
gRPC, TLS, authentication, validation and the store write. With ``api_workers`` = N,
N processes bind the public port together (SO_REUSEPORT: the kernel spreads incoming
connections over them) and each does that work on its own core. What lives in one
process's memory stays in this one, the *core*: the leader lease, the scheduler, agent
streams, the token cache. A worker:

* serves SubmitJob itself: validation, the team and request-id checks, and the job's
  creation in the shared store (group-committed with its audit record, as here), then
  reports the job over the link (``JobsCreated``) so the core's scheduler and watchers
  hear of it as of its own writes. A creation is the one job write made outside the
  core's applier: a new id conflicts with nobody, and every later write of the job is
  made by the core;
* serves reads (GetJob, ListJobs, GetJobEvents) from the store, WatchJob (woken by the
  ids of the jobs the core writes, sent down ``Follow``), workdir transfers and probes;
* forwards every other call to the core (broker/api/forwarding.py).

The link is a gRPC server on a Unix socket in a private directory (mode 0700), and every
call on it carries a per-run random key. Workers follow the core's role (``Follow``, a
heartbeat every second): a standby core's workers refuse calls UNAVAILABLE naming the
leader, so do the workers of a core silent for a lease, and with Redis they fence their
writes with the core's lease epoch. A worker that exits is started again
(1 s, doubling to 30 s between tries), and the scheduler then re-reads the live jobs,
so a creation whose report died with the worker is scheduled all the same. Workers die
with the core (PR_SET_PDEATHSIG) and stop when its link closes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from broker.api.forwarding import has_link_key
from broker.config import BrokerConfig
from broker.jobs.hub import EventHub
from broker.leadership import Leadership
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import worker_link_pb2 as wpb
from computebroker.v1 import worker_link_pb2_grpc as wgrpc

log = logging.getLogger(__name__)

FOLLOW_POLL_S = 0.2  # how soon workers hear of a role change (job changes: at once)
# The core speaks at least this often; a worker that has not heard it for a lease stops
# answering as the leader's (a frozen core may have lost its lease meanwhile).
FOLLOW_HEARTBEAT_S = 1.0
RESTART_FIRST_S, RESTART_MAX_S = 1.0, 30.0
# A worker reports at least every WORKER_BEAT_S (an empty JobsCreated when it created
# nothing). One silent for WORKER_SILENT_S while its process lives may be frozen between
# a job's commit and its report: the core's next pass then reads every live job from the
# store instead of waiting for its periodic full read (worker_process.CreationReports).
WORKER_BEAT_S = 1.0
WORKER_SILENT_S = 3.0
MAILBOX_LINGER_S, MAILBOX_BUSY_S = 0.005, 0.05  # job-change batching toward a worker


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def reserve_port(listen: str) -> tuple[socket.socket, int]:
    """A concrete port for ``listen`` (which may say port 0), held by a bound,
    never-listening SO_REUSEPORT socket so nobody else takes it before the workers
    bind it (gRPC's servers set SO_REUSEPORT too). Not listening, it gets no calls."""
    host, port = split_host_port(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))  # noqa: S104
    except OSError:
        sock.close()
        raise
    return sock, int(sock.getsockname()[1])


class _Mailbox:
    """Job ids the core wrote since a worker's last message (a set: a job written ten
    times meanwhile is one wake-up)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ids: set[str] = set()
        self._sent = 0.0

    def add(self, job_id: str) -> None:
        with self._cond:
            first = not self._ids
            self._ids.add(job_id)
            if first:
                self._cond.notify()

    def take(self, timeout: float) -> list[str]:
        """The ids gathered, waiting up to ``timeout`` for a first one; right after a
        send, ``MAILBOX_LINGER_S`` more for company (one message per write under a
        stream of writes cost each side ~0.1 ms)."""
        with self._cond:
            if not self._ids and timeout > 0:
                self._cond.wait(timeout)
            if not self._ids:
                return []
        if time.monotonic() - self._sent < MAILBOX_BUSY_S:
            time.sleep(MAILBOX_LINGER_S)
        with self._cond:
            ids, self._ids = self._ids, set()
        self._sent = time.monotonic()
        return sorted(ids)


class LinkService(wgrpc.WorkerLinkServicer):
    """The core's end of the link: role updates out, creations in."""

    def __init__(self, key: str, leadership: Leadership,
                 on_created: Callable[[list[pb.Job]], None], hub: EventHub,
                 on_silent: Callable[[int], None] = lambda slot: None) -> None:
        self.key = key
        self.leadership = leadership
        self.hub = hub
        self.on_created = on_created
        self.on_silent = on_silent  # (slot) a following worker stopped reporting
        self.stopping = threading.Event()
        self._cond = threading.Condition()
        self.following: dict[int, int] = {}  # slot -> pid of the worker following now
        self.ready: dict[int, int] = {}  # slot -> pid of the worker that said it serves
        self.heard: dict[int, float] = {}  # slot -> monotonic time of its last report
        self.silent: set[int] = set()  # slots already reported silent (once per silence)

    def watch_silence(self) -> None:
        """Until stopping: call ``on_silent(slot)`` once when a following worker has not
        reported for WORKER_SILENT_S (a frozen process: its pipe stays open)."""
        while not self.stopping.wait(WORKER_BEAT_S):
            now = time.monotonic()
            with self._cond:
                quiet = [s for s in self.following if s not in self.silent
                         and now - self.heard.get(s, now) > WORKER_SILENT_S]
                self.silent.update(quiet)
            for slot in quiet:
                log.warning("api worker %d has not reported for %.0f s (frozen?): the next"
                            " scheduler pass reads every live job from the store", slot,
                            now - self.heard.get(slot, now))
                with contextlib.suppress(Exception):
                    self.on_silent(slot)

    def wait_ready(self, slots: int, timeout: float) -> bool:
        """Until ``slots`` workers serve (they say so once their port is served and they
        hold the core's role): a start() that returned means the port answers."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.ready) >= slots, timeout)

    def _check(self, context: grpc.ServicerContext) -> None:
        if not has_link_key(context, self.key):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the worker link needs the core's link key")

    def _state(self) -> wpb.CoreState:
        lead = self.leadership
        if lead.is_leader:
            return wpb.CoreState(leading=True, fence_epoch=lead.epoch)
        return wpb.CoreState(leading=False, standby_message=lead.standby_message())

    def Follow(self, request: wpb.FollowRequest, context: grpc.ServicerContext) -> Iterator[wpb.CoreState]:
        self._check(context)
        box = _Mailbox()
        self.hub.tap(box.add)
        with self._cond:
            self.following[request.worker] = request.pid
            self.heard[request.worker] = time.monotonic()
            self.silent.discard(request.worker)
            self._cond.notify_all()
        try:
            last: wpb.CoreState | None = None
            told = sent = 0.0
            while not self.stopping.is_set() and context.is_active():
                lead = self.leadership
                # The standby message reads the store: at most every 2 s unless the role moved.
                moved = last is None or last.leading != lead.is_leader or (
                    lead.is_leader and last.fence_epoch != lead.epoch)
                if moved or (not lead.is_leader and time.monotonic() - told > 2.0):
                    told = time.monotonic()
                    state = self._state()
                    if state != last:
                        last = state
                        moved = True
                changed = box.take(0.0 if moved else FOLLOW_POLL_S)
                if moved or changed or time.monotonic() - sent >= FOLLOW_HEARTBEAT_S:
                    assert last is not None
                    out = wpb.CoreState()
                    out.CopyFrom(last)
                    out.changed_jobs.extend(changed)
                    yield out
                    sent = time.monotonic()
        finally:
            self.hub.untap(box.add)
            with self._cond:
                if self.following.get(request.worker) == request.pid:
                    del self.following[request.worker]
                if self.ready.get(request.worker) == request.pid:
                    del self.ready[request.worker]

    def Ready(self, request: wpb.FollowRequest, context: grpc.ServicerContext) -> wpb.ReadyResponse:
        self._check(context)
        with self._cond:
            self.ready[request.worker] = request.pid
            self._cond.notify_all()
        return wpb.ReadyResponse()

    def JobsCreated(self, request: wpb.JobsCreatedRequest,
                    context: grpc.ServicerContext) -> wpb.JobsCreatedResponse:
        self._check(context)
        with self._cond:
            self.heard[request.worker] = time.monotonic()
            if request.worker in self.silent:
                self.silent.discard(request.worker)
                log.info("api worker %d reports again", request.worker)
        if request.jobs:  # empty: the worker's beat (it created nothing meanwhile)
            self.on_created(list(request.jobs))
        return wpb.JobsCreatedResponse()


def _child_pythonpath() -> str:
    """The core's import path, so a worker imports the same code however the core was
    started (installed, ``python -m`` from a checkout, under pytest)."""
    parts = [p for p in sys.path if p and os.path.isdir(p)]
    extra = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(dict.fromkeys([*parts, *(extra.split(os.pathsep) if extra else [])]))


class WorkerPool:
    """Runs ``config.api_workers`` worker processes serving ``listen`` (already a
    concrete port) and restarts any that exits until :meth:`stop`."""

    def __init__(self, config: BrokerConfig, link_path: str, key: str,
                 on_exit: Callable[[int, int], None]) -> None:
        self.config = config
        self.link_path = link_path
        self.key = key
        self.on_exit = on_exit  # (slot, returncode) of a worker that went away
        self._stop = threading.Event()
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.restarts = 0

    def start(self) -> None:
        # Each slot's process is started (and restarted) by that slot's own thread, which
        # lives until stop(): PR_SET_PDEATHSIG fires when the *thread* that forked dies.
        for slot in range(self.config.api_workers):
            t = threading.Thread(target=self._run_slot, args=(slot,), name=f"api-worker-{slot}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def pids(self) -> dict[int, int]:
        with self._lock:
            return {s: p.pid for s, p in self._procs.items() if p.poll() is None}

    def _spawn(self, slot: int) -> subprocess.Popen[bytes]:
        env = dict(os.environ, CB_WORKER_CONFIG=self.config.model_dump_json(),
                   CB_LINK_SOCKET=self.link_path, CB_LINK_KEY=self.key,
                   CB_CORE_PID=str(os.getpid()), PYTHONPATH=_child_pythonpath())
        return subprocess.Popen([sys.executable, "-m", "broker.api.worker_process", str(slot)],
                                env=env, stdin=subprocess.DEVNULL)

    def _run_slot(self, slot: int) -> None:
        pause = RESTART_FIRST_S
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                proc = self._spawn(slot)
            except OSError as e:
                log.error("api worker %d could not start: %s", slot, e)
                if self._stop.wait(pause):
                    return
                pause = min(pause * 2, RESTART_MAX_S)
                continue
            with self._lock:
                self._procs[slot] = proc
            rc = proc.wait()
            if self._stop.is_set():
                return
            self.restarts += 1
            if time.monotonic() - started > 60:
                pause = RESTART_FIRST_S  # it had been running fine: no penalty
            log.warning("api worker %d (pid %d) exited with %s; starting it again in %.0f s",
                        slot, proc.pid, rc, pause)
            with contextlib.suppress(Exception):
                self.on_exit(slot, rc)
            if self._stop.wait(pause):
                return
            pause = min(pause * 2, RESTART_MAX_S)

    def stop(self, grace: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in self._threads:
            t.join(timeout=2)


class WorkerLink:
    """The private socket directory, the key, the link server's address."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="cb-link-")  # mode 0700: this user only
        self.path = os.path.join(self.dir, "link.sock")
        self.key = secrets.token_urlsafe(32)

    @property
    def address(self) -> str:
        return f"unix:{self.path}"

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
