"""High availability: one active leader, hot standbys (docs/architecture.md "State and leadership").

Why this design: agent streams and the scheduler's view of connected agents live in
one broker process's memory, so two replicas serving at once would each see half the
agents. Instead exactly one replica *leads*: it holds the ``"leader"`` lease in the
store, accepts agent streams and RPCs and runs the scheduler. Every other replica is
a hot standby: it answers every API call with UNAVAILABLE naming the leader (clients
and agents given several addresses move on to the next one) and polls the lease.
When the leader dies its lease expires; a standby takes it, rebuilds the runtime
state from the store (which holds everything durable) and starts leading; agents
reconnect, re-register and are reconciled, and get ``startup_grace_s`` from the
promotion (not from process start) before their jobs are declared lost.

The lease:
- Redis (and any store): ``store.acquire_lease("leader", holder, ttl)``, renewed every
  ttl/3 by a background thread. A replica that fails to renew (another holder, or a
  store error) steps down at once; it also stops answering as leader the moment its
  lease may have expired, even while a renew call is still hanging.
- SQLite file: an exclusive ``flock`` on ``<db>.leader.lock``. SQLite is one host, and
  the kernel drops the lock the instant the holder dies, so a broker SIGKILLed and
  restarted leads again at once (a time lease would keep it standby for a whole ttl),
  and a second process on the same file stays standby, as with Redis.
- SQLite ``:memory:``: nobody else can share it, so the process always leads.

Fencing (issue 15 defect 7): each lease grant carries an epoch (a counter the store
increments per grant). On promotion the leader fences its store object with it, so
every later write checks, inside the store's atomic write, that the epoch is still
current: a leader frozen past its lease (SIGSTOP, long GC, partition) that wakes up
after a standby took over has every write refused (``Fenced``) and steps down. The
SQLite file lock needs no epoch: the kernel keeps the lock for a frozen holder, so
nobody else can lead while it lives.

Who leads is also written as a store record (kind ``"leader"``: holder + advertised
address) so standbys can point callers at it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import struct_pb2

from broker.jobs.ops import JobOps
from broker.jobs.views import JobsView, RecordsView
from broker.scheduling.loop import SchedulerLoop
from broker.store.base import Store, StoreError

log = logging.getLogger(__name__)

KIND_LEADER = "leader"  # google.protobuf.Struct {holder, address, since}, key "leader"
LEASE_NAME = "leader"
GATED_PREFIX = "/computebroker.v1."  # every JobService / CapacityService / AgentService call
_UNFENCED = -1  # "held" for leases that have no epoch (SQLite file lock, :memory:)


class _FileLock:
    """Non-blocking exclusive flock; released by close() or by the process dying."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _sqlite_path(store: Store) -> str | None:
    """The SQLite file behind ``store`` ("" for :memory:), None for other stores."""
    from broker.store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return "" if store.path == ":memory:" else store.path
    return None


class Leadership:
    """Holds (or waits for) the leader lease and switches the broker between roles.

    ``is_leader`` gates the API (see :class:`StandbyGate`). Promotion rebuilds the
    agent registry from the store, restarts the agent grace period and starts a fresh
    scheduler loop; step-down stops the loop and closes every agent stream.
    """

    def __init__(self, ops: JobOps, store: Store, holder: str, address: str, ttl_s: float) -> None:
        self.ops = ops
        self.store = store
        self.holder = holder
        self.address = address
        self.ttl_s = ttl_s
        self.scheduler: SchedulerLoop | None = None
        self._lock = threading.RLock()
        self._leader = False
        self._valid_until = 0.0  # monotonic: our lease may have expired after this
        self._epoch = 0  # the lease epoch we lead under (0 = not fenced: file lock/memory)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        path = _sqlite_path(self.store)
        self._file_lock = _FileLock(path + ".leader.lock") if path else None
        self._always = path == ""  # :memory: SQLite: nobody can share it

    # ---- state -----------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self._leader and time.monotonic() < self._valid_until

    @property
    def epoch(self) -> int:
        """The lease epoch this replica leads under; 0 when not leading or unfenced
        (file lock, :memory:). API workers fence their own writes with it."""
        return self._epoch if self.is_leader and self._epoch > 0 else 0

    def leader_info(self) -> dict[str, Any]:
        """The store's leader record ({} if none or unreadable)."""
        try:
            rec = self.store.get_record(KIND_LEADER, LEASE_NAME, struct_pb2.Struct)
        except Exception:  # noqa: BLE001 - only used for messages
            return {}
        return dict(rec.items()) if isinstance(rec, struct_pb2.Struct) else {}

    def standby_message(self) -> str:
        info = self.leader_info()
        holder = info.get("holder") or "unknown"
        address = info.get("address") or "address unknown"
        if holder == self.holder:  # our own stale record: the lease is in transit
            holder, address = "being elected", "retry shortly"
        return f"standby broker {self.holder}; the leader is {holder} ({address})"

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Try once synchronously (a lone broker leads as soon as start() returns),
        then keep renewing / polling in the background."""
        self._tick()
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Step down and release the lease, so a standby takes over without waiting."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s + 5)
        with self._lock:
            was_leader = self._leader
            self._step_down("broker stopping")
            if was_leader:
                self._release()

    def _run(self) -> None:
        while not self._stop.is_set():
            # Leaders renew every ttl/3; standbys poll a little more often, so a takeover
            # follows the old lease's expiry closely.
            period = self.ttl_s / 3 if self._leader else min(self.ttl_s / 3, 1.0)
            if self._stop.wait(period):
                return
            try:
                self._tick()
            except StoreError as e:  # the store is down: expected under faults, one line
                log.warning("leadership tick failed: %s: %s", type(e).__name__, e)
            except Exception:  # noqa: BLE001 - the thread must survive
                log.exception("leadership tick failed")

    def _tick(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            started = time.monotonic()
            try:
                epoch = self._acquire()
            except Exception as e:  # noqa: BLE001 - store down: we cannot know we lead
                log.warning("leader lease check failed: %s", e)
                if self._leader and time.monotonic() < self._valid_until:
                    # A store blip: our lease cannot have expired yet, and nobody can take
                    # it while the store is down. Keep leading (callers get UNAVAILABLE
                    # for the store) and stop only once the lease may have lapsed.
                    return
                epoch = 0
            held = epoch != 0
            if held and self._leader and epoch != self._epoch:
                # Our lease lapsed and was granted again: someone may have led meanwhile,
                # so our runtime state is stale. Rebuild it as a fresh promotion.
                self._step_down(f"lease epoch moved {self._epoch} -> {epoch}")
            if held:
                self._valid_until = started + self.ttl_s
                if not self._leader:
                    self._epoch = epoch
                    if epoch != _UNFENCED:
                        self.store.fence_writes(LEASE_NAME, epoch)
                    self._promote()
            elif self._leader:
                self._step_down("lost the leader lease")

    def _acquire(self) -> int:
        """The lease epoch we hold (0 = not held; _UNFENCED = held without an epoch)."""
        if self._always:
            return _UNFENCED
        if self._file_lock is not None:
            return _UNFENCED if self._file_lock.try_acquire() else 0
        return self.store.acquire_lease_epoch(LEASE_NAME, self.holder, self.ttl_s)

    def _release(self) -> None:
        if self._file_lock is not None:
            self._file_lock.release()
        elif not self._always:
            with contextlib.suppress(Exception):
                # A 1 ms renewal = release (the Store interface has no explicit release).
                self.store.acquire_lease(LEASE_NAME, self.holder, 0.001)

    # ---- transitions ---------------------------------------------------------------------
    def _promote(self) -> None:
        ops = self.ops
        with contextlib.suppress(Exception):
            self.store.put_record(KIND_LEADER, LEASE_NAME, struct_pb2.Struct(fields={
                "holder": struct_pb2.Value(string_value=self.holder),
                "address": struct_pb2.Value(string_value=self.address),
                "since": struct_pb2.Value(number_value=time.time()),
            }))
        # Runtime state from the store: every known agent is "disconnected, last seen
        # now" and gets the grace period from this moment (contracts, agent stream rule 2).
        ops.agents.reload()
        ops.started_time = ops.clock()
        ops.applier.hot.clear()  # the other leader wrote meanwhile: read the store again
        self.scheduler = SchedulerLoop(ops, JobsView(self.store, ops.applier.hub),
                                       RecordsView(self.store), self.store.acquire_lease, self.holder)
        self._leader = True
        self.scheduler.start()
        self.scheduler.poke()
        log.info("broker %s is now the LEADER (advertising %s)", self.holder, self.address)

    def _step_down(self, why: str) -> None:
        if not self._leader:
            return
        self._leader = False
        self._valid_until = 0.0
        log.warning("broker %s steps down to standby: %s", self.holder, why)
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None
        self.ops.applier.set_poke(lambda: None)
        self.ops.applier.hot.clear()
        for a in self.ops.agents.all():
            if a.session is not None:
                a.session.close()  # the agent reconnects, to the new leader


class StandbyGate:
    """Answers every API call with UNAVAILABLE while this replica is not the leader.
    A pipeline layer (broker/api/pipeline.py): the wrapper is built once per method and
    reads ``is_leader`` on each call, so a promotion or a demotion takes effect at once."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def wrap(self, handler: Any, method: str) -> Any:
        if handler is None or not method.startswith(GATED_PREFIX):
            return handler
        leadership = self.leadership

        def refuse(context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAVAILABLE, leadership.standby_message())

        def unary(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                if not leadership.is_leader:
                    refuse(context)
                return behavior(request, context)
            return call

        def streaming(behavior: Callable[[Any, Any], Iterator[Any]]) -> Callable[[Any, Any], Iterator[Any]]:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                if not leadership.is_leader:
                    refuse(context)
                yield from behavior(request, context)
            return call

        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), **kw)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **kw)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), **kw)
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **kw)


def advertised_address(listen: str, port: int, advertise: str = "") -> str:
    """What standbys tell callers: ``advertise`` if set, else listen's host + bound port
    (a wildcard host becomes this machine's hostname)."""
    if advertise:
        return advertise
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    if host in ("", "0.0.0.0", "[::]", "::"):
        import socket

        host = socket.gethostname()
    return f"{host}:{port}"
