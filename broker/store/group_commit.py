"""Group commit: concurrent writes share one store write (one transaction, one fsync).

Why: with SQLite at synchronous=FULL every transaction ends in an fsync, so one
transaction per write caps writes at the disk's fsync rate whatever the CPU (Redis: one
round trip per write). Writes that arrive while a write is in flight queue up, and the
next write takes them all: one transaction (one fsync) or one pipeline for the whole
group. Nothing waits on a timer: a lone write is written at once, batches form only
under load, exactly when they pay.

Who writes: a caller that finds the writer idle writes its own group at once, in its
own thread (no hand-off: a lone submit costs no thread switch). Everything queued
while a group is being written is written by the writer's own thread (one per
``GroupWriter``, started on first use), which keeps writing groups while the queue is
non-empty and then goes idle. Leadership never passes from member to member: that
hand-off (waking the oldest waiter to lead, which then had to win the interpreter
lock back among a hundred threads just woken with their results) was where a leader
with 10,000 running attempts spent its time between commits
(benchmarks/bench_running.py). The writer thread takes the next group the moment it
has handed out the last one's results, so the group that queued during a COMMIT's
fsync goes in the next transaction, without anyone waiting to be chosen.

Every caller gets its own member's result: its stored job, or the error that member
alone met (a duplicate request id raises AlreadyExists for that member only, as
``Store.create_job`` would); a failure of the whole write (Fenced, StoreUnavailable)
goes to every member of that group. Nothing is answered before the write returned
(for SQLite: its COMMIT). Leader fencing is kept: the store checks the lease epoch
inside each group's transaction / script.

Callers on an event loop (the API workers' grpc.aio server) must never block, so
they never write: :meth:`GroupWriter.submit_soon` queues a member with a sink instead
of a lock, and the writer thread writes it. Members of the same group share the write
whichever way they came; results for loop callers go back one call per sink per group
(:class:`LoopSink`: one ``call_soon_threadsafe`` wake-up of the loop for the whole
group, not one per member).

The interface, for any store (SQLite's write group and job creations use it; Redis's
record puts too): ``GroupWriter(write)`` where ``write(items) -> results`` writes a
list of items in one go and returns one result per item (an exception instance: that
member's own error); then ``submit(item)`` from any thread (blocks until written),
``submit_soon(item, sink)`` from an event loop (a future), ``close()`` to stop the
writer thread once the queue is empty.
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

    __slots__ = ("item", "done", "result", "error", "sink", "future")

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
                 max_group: int = MAX_GROUP, name: str = "group-commit") -> None:
        self._write = write
        self.max_group = max_group
        self.name = name
        self._lock = threading.Lock()
        self._queue: list[_Member[T, R]] = []
        self._busy = False  # a group is being written (by a caller or the writer thread)
        self._closing = False
        self.groups = 0  # writes made (for tests and benchmarks)
        self.members = 0  # items written through them
        self.thread_groups = 0  # of them, written by the writer thread
        self._wake: threading.Semaphore | None = None  # the writer thread's (None: not started)

    def submit(self, item: T) -> R:
        """Queue ``item`` and return its result once its group is written (or raise
        its error). Writes it at once in this thread if the writer is idle."""
        me: _Member[T, R] = _Member(item)
        with self._lock:
            self._queue.append(me)
            lead = not self._busy
            self._busy = True
        if lead:
            self._write_group(on_thread=False)
            self._after_own_group()
        else:
            me.done.acquire()  # released once, by the writer, with our result
        return self._result(me)

    def submit_soon(self, item: T, sink: LoopSink) -> asyncio.Future:
        """Queue ``item`` without blocking (call on ``sink``'s loop): the returned future
        gets ``write``'s result for it, or its error. The writer thread writes it (at
        once if idle, else with the next group)."""
        fut = sink.loop.create_future()
        me: _Member[T, R] = _Member(item, sink, fut)
        with self._lock:
            self._queue.append(me)
            if not self._busy:
                self._busy = True
                self._writer().release()
        return fut

    def close(self) -> None:
        """Stop the writer thread once the queue is empty (a store closing). A later
        submit still works: it writes itself or starts the thread again."""
        with self._lock:
            self._closing = True
            if self._wake is not None and not self._busy:
                self._busy = True  # the thread's to clear: it finds the queue empty and ends
                self._wake.release()

    def _after_own_group(self) -> None:
        """A caller wrote its own group: what queued meanwhile goes to the writer
        thread (never to another caller), or the writer goes idle."""
        with self._lock:
            if self._queue or (self._closing and self._wake is not None):
                self._writer().release()  # _busy stays set: the thread's now
            else:
                self._busy = False

    def _writer(self) -> threading.Semaphore:
        """The writer thread's wake-up (started on first use; call under ``_lock``)."""
        if self._wake is None:
            self._wake = threading.Semaphore(0)
            self._closing = False
            threading.Thread(target=self._run, args=(self._wake,), name=self.name,
                             daemon=True).start()
        return self._wake

    def _run(self, wake: threading.Semaphore) -> None:
        """The writer thread: woken with the queue non-empty (``_busy`` set for it), it
        writes groups until the queue is empty, then goes idle and waits."""
        while True:
            wake.acquire()
            while self._write_group(on_thread=True):
                pass
            with self._lock:
                if self._queue:  # queued after the last take: still ours (_busy stays set)
                    wake.release()
                    continue
                self._busy = False
                if self._closing:
                    self._wake = None
                    return

    def _write_group(self, on_thread: bool) -> bool:
        """Write one group from the head of the queue and hand out its results; False
        (writing nothing) when the queue is empty."""
        with self._lock:
            group = self._queue[: self.max_group]
            del self._queue[: len(group)]
        if not group:
            return False
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
            self.thread_groups += on_thread
        sinks: dict[int, tuple[LoopSink, list[_Member[T, R]]]] = {}
        for m in group:  # each thread member's lock is held (a writing caller's: by itself)
            if m.sink is None:
                m.done.release()
            else:
                sinks.setdefault(id(m.sink), (m.sink, []))[1].append(m)
        for sink, members in sinks.values():
            sink.deliver(members)
        return True

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
