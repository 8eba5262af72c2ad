"""Lanes: one agent stream's job messages applied by a few threads, in order per job.

Why: a stream's messages used to be applied one after another by its reader thread,
and each JobUpdate and LogChunk waits for its store commit (with SQLite, an fsync).
With hundreds of attempts on one agent, a stream then carried at most one commit's
worth of reports per fsync and fell behind: acks a minute late, steps and log lines
piling up in the stream. In lanes, the reader hands each job's messages to the lane
of that job (a hash of the job id), so one stream has several writes in flight; they
share commits (the store's write group) while each job's messages stay in the order
the agent sent them (its last log lines before its end, a RUNNING before a SUCCEEDED).

What is not per job (heartbeats, a refused command) is a *barrier*
(:meth:`Lanes.barrier`): it runs once every lane has applied what was put before it,
and each lane's later messages wait until it has run, so it sees every earlier message
applied and no later one, as when the stream was applied in one thread. It used to be
waited for by the stream's reader (``drain``); with 10,000 running attempts and the
leader behind, a heartbeat's wait kept the reader from reading for 20 s, so the agent's
next messages were not even seen and the agent was declared lost (its 500 attempts
relaunched) while it was sending all along. The reader now only hands over. What bounds
the lanes instead is :data:`MAX_QUEUED`: with that many messages queued the reader waits
(``wait_below``), leaving the rest in the agent through gRPC's flow control, and keeps
the agent seen meanwhile (broker/api/agent_service.py ``_room``).
"""

from __future__ import annotations

import logging
import queue
import threading
import zlib
from collections.abc import Callable

log = logging.getLogger(__name__)

LANES = 8  # per agent stream
MAX_QUEUED = 2048  # messages a stream's lanes hold before its reader stops reading


class Lanes:
    """``put(key, item)`` runs ``run(item)`` on lane ``key`` (same key: in order)."""

    def __init__(self, run: Callable[[object], None], name: str, lanes: int = LANES) -> None:
        self._run = run
        self._queues: list[queue.SimpleQueue[object]] = [queue.SimpleQueue() for _ in range(lanes)]
        self._cv = threading.Condition()
        self._pending = 0
        self._threads = [threading.Thread(target=self._work, args=(q,), name=f"{name}-lane{i}", daemon=True)
                         for i, q in enumerate(self._queues)]
        for t in self._threads:
            t.start()

    def put(self, key: str, item: object) -> None:
        with self._cv:
            self._pending += 1
        self._queues[zlib.crc32(key.encode()) % len(self._queues)].put(item)

    def barrier(self, run: Callable[[], None]) -> None:
        """Run ``run()`` after everything put so far, before anything put after (on a
        lane thread; the caller does not wait)."""
        with self._cv:
            self._pending += 1
        b = _Barrier(run, len(self._queues))
        for q in self._queues:
            q.put(b)

    def wait_below(self, limit: int, timeout: float) -> bool:
        """Wait until fewer than ``limit`` messages are queued or running (True), or
        ``timeout`` (False). The reader's backpressure: a leader that is behind leaves
        the rest in the agent (gRPC flow control) instead of buffering all of it."""
        with self._cv:
            return self._cv.wait_for(lambda: self._pending < limit, timeout)

    def drain(self) -> None:
        """Return once everything put so far has run."""
        with self._cv:
            self._cv.wait_for(lambda: self._pending == 0)

    def close(self) -> None:
        """The lanes finish what was put, then their threads end."""
        for q in self._queues:
            q.put(_END)

    def _work(self, q: queue.SimpleQueue[object]) -> None:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Barrier):
                if item.arrive():
                    self._done()
                continue
            try:
                self._run(item)
            except Exception:  # noqa: BLE001 - run() reports its own errors; a lane must not die
                log.exception("agent stream lane: a message failed")
            finally:
                self._done()

    def _done(self) -> None:
        with self._cv:
            self._pending -= 1
            if self._pending == 0 or self._pending == MAX_QUEUED // 2:
                self._cv.notify_all()


class _Barrier:
    """Put in every lane: the last lane to reach it runs it, the others wait for that."""

    def __init__(self, run: Callable[[], None], lanes: int) -> None:
        self._run = run
        self._left = lanes
        self._lock = threading.Lock()
        self._ran = threading.Event()

    def arrive(self) -> bool:
        """Called by each lane on reaching it; True in the lane that ran it."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if not last:
            self._ran.wait()
            return False
        try:
            self._run()
        except Exception:  # noqa: BLE001 - run() reports its own errors; a lane must not die
            log.exception("agent stream lane: a message failed")
        finally:
            self._ran.set()
        return True


_END = object()
