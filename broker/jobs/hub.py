"""Wake-ups for WatchJob streams.

Why not poll the store per watcher: hundreds of watchers would hammer it. Every
committed job write calls :meth:`EventHub.notify`; a watcher sleeps on one shared
condition until its job's counter moves (or at most ``poll_s``, a safety net for
writes made by another broker replica) and only then reads the new events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

MAX_COUNTERS = 100_000
"""Jobs whose counters are kept before the idle ones are dropped. Why a bound: a counter
per job ever notified grew for the broker's whole life (one entry per submitted job)."""


class EventHub:
    """Per-job wake-ups: a write to one job wakes only that job's watchers.

    Why per job: with one shared condition every committed write woke every
    watcher of every job (each then re-checking its counter); a thousand watchers
    under a stream of submits meant a million wake-ups a second. A job's condition
    exists while someone waits on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, int] = {}
        # A dropped counter comes back at `_base`, above every value any job has shown
        # (each is at most `_notified`), so a watcher's old `seen` never matches again:
        # at worst it wakes once for nothing and re-reads.
        self._base = 0
        self._notified = 0
        self._conds: dict[str, tuple[threading.Condition, list[int]]] = {}  # job -> (cond, [waiters])
        self._closed = False
        # Told every notified job id (the API workers' link, broker/api/workers.py: the
        # watchers a worker serves wake on the core's writes too).
        # A tuple replaced on change: notify() reads it without a lock while a worker's
        # stream starts or ends, and never skips a tap that stays.
        self._taps: tuple[Callable[[str], None], ...] = ()

    def tap(self, fn: Callable[[str], None]) -> None:
        with self._lock:
            self._taps = (*self._taps, fn)

    def untap(self, fn: Callable[[str], None]) -> None:
        with self._lock:
            self._taps = tuple(t for t in self._taps if t != fn)  # bound methods: equal, not identical

    def notify(self, job_id: str, *, tap: bool = True) -> None:
        """Wake ``job_id``'s watchers; ``tap=False``: not the taps (a worker's own
        creation, which that worker has already told its watchers)."""
        with self._lock:
            self._notified += 1
            self._counters[job_id] = self._counters.get(job_id, self._base) + 1
            if len(self._counters) > MAX_COUNTERS:
                self._drop_idle()
            entry = self._conds.get(job_id)
            if entry is not None:
                entry[0].notify_all()
        if tap:
            for fn in self._taps:
                fn(job_id)

    def _drop_idle(self) -> None:
        """Forget the counters of jobs nobody waits on (lock held)."""
        self._base = self._notified + 1
        self._counters = {j: n for j, n in self._counters.items() if j in self._conds}

    def counter(self, job_id: str) -> int:
        with self._lock:
            return self._counters.get(job_id, self._base)

    def wait(self, job_id: str, seen: int, timeout: float) -> int:
        """Block until ``job_id``'s counter differs from ``seen`` or ``timeout``; return it."""
        with self._lock:
            entry = self._conds.get(job_id)
            if entry is None:
                entry = self._conds[job_id] = (threading.Condition(self._lock), [0])
            cond, waiters = entry
            waiters[0] += 1
            try:
                cond.wait_for(lambda: self._closed or self._counters.get(job_id, self._base) != seen,
                              timeout=timeout)
                return self._counters.get(job_id, self._base)
            finally:
                waiters[0] -= 1
                if not waiters[0]:
                    del self._conds[job_id]

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every watcher (broker shutdown)."""
        with self._lock:
            self._closed = True
            for cond, _ in self._conds.values():
                cond.notify_all()
