"""Wake-ups for WatchJob streams.

Why not poll the store per watcher: hundreds of watchers would hammer it. Every
committed job write calls :meth:`EventHub.notify`; a watcher sleeps on one shared
condition until its job's counter moves (or at most ``poll_s``, a safety net for
writes made by another broker replica) and only then reads the new events.
"""

from __future__ import annotations

import threading
from collections import defaultdict


class EventHub:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counters: dict[str, int] = defaultdict(int)
        self._closed = False

    def notify(self, job_id: str) -> None:
        with self._cond:
            self._counters[job_id] += 1
            self._cond.notify_all()

    def counter(self, job_id: str) -> int:
        with self._cond:
            return self._counters[job_id]

    def wait(self, job_id: str, seen: int, timeout: float) -> int:
        """Block until ``job_id``'s counter differs from ``seen`` or ``timeout``; return it."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._closed or self._counters[job_id] != seen, timeout=timeout
            )
            return self._counters[job_id]

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every watcher (broker shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
