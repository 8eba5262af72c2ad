"""Lanes: one agent stream's job messages applied by a few threads, in order per job.

Why: a stream's messages used to be applied one after another by its reader thread,
and each JobUpdate and LogChunk waits for its store commit (with SQLite, an fsync).
With hundreds of attempts on one agent, a stream then carried at most one commit's
worth of reports per fsync and fell behind: acks a minute late, steps and log lines
piling up in the stream. In lanes, the reader hands each job's messages to the lane
of that job (a hash of the job id), so one stream has several writes in flight; they
share commits (the store's write group) while each job's messages stay in the order
the agent sent them (its last log lines before its end, a RUNNING before a SUCCEEDED).

What is not per job (heartbeats, a refused command) waits for the lanes to drain
first (:meth:`Lanes.drain`), so it sees every earlier message applied, as before.
"""

from __future__ import annotations

import logging
import queue
import threading
import zlib
from collections.abc import Callable

log = logging.getLogger(__name__)

LANES = 8  # per agent stream


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
            try:
                self._run(item)
            except Exception:  # noqa: BLE001 - run() reports its own errors; a lane must not die
                log.exception("agent stream lane: a message failed")
            finally:
                with self._cv:
                    self._pending -= 1
                    if self._pending == 0:
                        self._cv.notify_all()


_END = object()
