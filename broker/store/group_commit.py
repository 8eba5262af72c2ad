"""Group commit of job creations: concurrent submits share one store write.

Why: with SQLite at synchronous=FULL every transaction ends in an fsync, so one
transaction per SubmitJob caps submits at the disk's fsync rate whatever the CPU
(Redis: one round trip per submit). Submits that arrive while a write is in flight
queue up, and the next write takes them all: one transaction (one fsync) or one
pipeline for the whole group. Nothing waits on a timer: a lone submit is written at
once, batches form only under load, exactly when they pay.

No extra thread either (no hand-off per submit): the first caller to find the store
idle becomes the *leader*, writes the queue (its own item first) and hands the
results back; when it is done and more items queued meanwhile, it promotes the
oldest waiter to lead the next group, and returns. Every caller gets its own
member's result: its stored job, or the error that member alone met (a duplicate
request id raises AlreadyExists for that member only, as ``Store.create_job``
would); a failure of the whole write (Fenced, StoreUnavailable) goes to every
member of that group. Leader fencing is kept: the store checks the lease epoch
inside each group's transaction / script.

Callers on an event loop (the API workers' grpc.aio server) must never block, so
they cannot lead: :meth:`GroupWriter.submit_soon` queues a member with a sink instead
of a lock, and a group whose oldest member is such a one is led by the writer's own
thread (started on first use). Members of the same group share the write whichever
way they came; results for loop callers go back one call per sink per group
(:class:`LoopSink`: one ``call_soon_threadsafe`` wake-up of the loop for the whole
group, not one per member).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from broker.store.base import CreateItem, Rider, Store
from computebroker.v1 import common_pb2 as pb

MAX_GROUP = 256  # members per write: bounds one transaction's time (and its latency)

T = TypeVar("T")
R = TypeVar("R")


class _Member(Generic[T, R]):
    """One queued write. ``done`` is a plain lock held from creation and released once
    to wake its caller: the cheapest wake-up CPython has (an Event is a Condition, a
    second lock and a waiter list; at thousands of submits a second that showed)."""

    __slots__ = ("item", "done", "result", "error", "lead", "sink", "future")

    def __init__(self, item: T, sink: LoopSink | None = None,
                 future: asyncio.Future | None = None) -> None:
        self.item = item
        self.sink = sink  # set: a loop caller (no lock; its result goes through the sink)
        self.future = future
        self.done = threading.Lock()
        if sink is None:
            self.done.acquire()
        self.result: R | None = None
        self.error: BaseException | None = None
        self.lead = False  # woken to lead the next group rather than with a result


class LoopSink:
    """Hands results to callers on one asyncio loop: one thread-safe wake-up per group."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def deliver(self, members: list[_Member]) -> None:
        self.loop.call_soon_threadsafe(_resolve, members)


def _resolve(members: list[_Member]) -> None:
    """On the loop: each member's future gets its result or its error."""
    for m in members:
        f = m.future
        if f is None or f.done():  # its caller was cancelled meanwhile: the write stands
            continue
        if m.error is not None:
            f.set_exception(m.error)
        else:
            f.set_result(m.result)


class GroupWriter(Generic[T, R]):
    """``submit(item)`` returns ``write(group)``'s result for that item, where
    ``write`` takes every item queued meanwhile in one call and returns one result
    per item, in order (an exception instance = that member's own error)."""

    def __init__(self, write: Callable[[list[T]], Sequence[R | BaseException]],
                 max_group: int = MAX_GROUP) -> None:
        self._write = write
        self.max_group = max_group
        self._lock = threading.Lock()
        self._queue: list[_Member[T, R]] = []
        self._busy = False
        self.groups = 0  # writes made (for tests and benchmarks)
        self.members = 0  # items written through them
        self._leader_wake: threading.Semaphore | None = None  # the writer thread's (submit_soon)

    def submit_soon(self, item: T, sink: LoopSink) -> asyncio.Future:
        """Queue ``item`` without blocking (call on ``sink``'s loop): the returned future
        gets ``write``'s result for it, or its error. If the writer is idle its own
        thread leads the group; else the item rides with the next group."""
        fut = sink.loop.create_future()
        me: _Member[T, R] = _Member(item, sink, fut)
        with self._lock:
            self._queue.append(me)
            lead = not self._busy
            self._busy = True
            if lead:
                self._writer_thread().release()
        return fut

    def _writer_thread(self) -> threading.Semaphore:
        """The thread that leads groups for loop callers (under ``_lock``)."""
        if self._leader_wake is None:
            self._leader_wake = threading.Semaphore(0)
            threading.Thread(target=self._lead_for_loops, args=(self._leader_wake,),
                             name="group-commit", daemon=True).start()
        return self._leader_wake

    def _lead_for_loops(self, wake: threading.Semaphore) -> None:
        while True:
            wake.acquire()
            self._lead()

    def submit(self, item: T) -> R:
        me: _Member[T, R] = _Member(item)
        with self._lock:
            self._queue.append(me)
            lead = not self._busy
            self._busy = True
        if not lead:
            me.done.acquire()  # released once: with our result, or to lead the next group
            if not me.lead:
                return self._result(me)
        self._lead()
        return self._result(me)

    def _lead(self) -> None:
        """Write one group (starting with the leader's own member), hand out results,
        then pass the lead to the oldest waiter, or go idle."""
        with self._lock:
            group = self._queue[: self.max_group]
            del self._queue[: len(group)]
        try:
            results = self._write([m.item for m in group])
            if len(results) != len(group):
                raise RuntimeError(f"store returned {len(results)} results for {len(group)} items")
            for m, r in zip(group, results, strict=True):
                if isinstance(r, BaseException):
                    m.error = r
                else:
                    m.result = r
        except BaseException as e:  # noqa: BLE001 - the whole write failed: every member hears it
            for m in group:
                if m.result is None and m.error is None:
                    m.error = e
        with self._lock:
            self.groups += 1
            self.members += len(group)
            nxt = self._queue[0] if self._queue else None
            if nxt is None:
                self._busy = False
            elif nxt.sink is not None:  # a loop caller cannot lead: the writer thread does
                self._writer_thread().release()
                nxt = None
            else:
                nxt.lead = True
        sinks: dict[int, tuple[LoopSink, list[_Member[T, R]]]] = {}
        for m in group:  # each lock is held here (the leader holds its own): one release each
            if m.sink is None:
                m.done.release()
            else:
                sinks.setdefault(id(m.sink), (m.sink, []))[1].append(m)
        for sink, members in sinks.values():
            sink.deliver(members)
        if nxt is not None:
            nxt.done.release()

    @staticmethod
    def _result(m: _Member[T, R]) -> R:
        if m.error is not None:
            raise m.error
        return m.result  # type: ignore[return-value]


class GroupCommit(GroupWriter[CreateItem, pb.Job]):
    """``create(job, events)``: ``store.create_job`` semantics, writes grouped
    through ``store.create_jobs``; ``riders`` are keyed records committed with the
    job (and only if it is written), e.g. the SubmitJob's audit record."""

    def __init__(self, store: Store, max_group: int = MAX_GROUP) -> None:
        super().__init__(store.create_jobs, max_group)
        self.store = store

    def create(self, job: pb.Job, events: Sequence[pb.JobEvent] = (),
               riders: Sequence[Rider] = ()) -> pb.Job:
        return self.submit((job, events, riders) if riders else (job, events))

    def create_soon(self, sink: LoopSink, job: pb.Job, events: Sequence[pb.JobEvent] = (),
                    riders: Sequence[Rider] = ()) -> asyncio.Future:
        """:meth:`create` for a caller on an event loop: await the future (the job as
        stored, once its group is committed)."""
        return self.submit_soon((job, events, riders) if riders else (job, events), sink)
