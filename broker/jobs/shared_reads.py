"""One store read shared by every WatchJob stream of a job (fan-out).

Why: a write to a watched job wakes all its watchers at once, and each used to
read the job's new events from the store itself: a thousand watchers, a thousand
identical reads in the same millisecond, queued on the store (Redis: a connection
each). Here concurrent identical reads are made once (*single flight*) and the
result is kept while the job's hub counter is unchanged, for at most ``ttl_s``
(writes by another broker replica do not move the counter; the watchers' periodic
re-read still sees them within that time).

Only WatchJob reads through this; every other read goes to the store directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

TTL_S = 0.25


class _Flight:
    __slots__ = ("done", "value", "error", "at")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.at = 0.0


class SharedReads:
    def __init__(self, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._flights: dict[tuple, _Flight] = {}
        self.reads = 0  # store reads actually made (tests)

    def get(self, key: tuple, fetch: Callable[[], Any]) -> Any:
        """``fetch()``'s result for ``key`` (which must name the hub counter the
        caller saw), made once for all concurrent callers, reused up to ``ttl_s``."""
        now = self._clock()
        with self._lock:
            f = self._flights.get(key)
            if f is not None and f.done.is_set() and (f.error is not None or now - f.at > self.ttl_s):
                f = None
            lead = f is None
            if lead:
                f = self._flights[key] = _Flight()
                if len(self._flights) > 4096:  # drop finished, expired entries
                    for k in [k for k, v in self._flights.items()
                              if v.done.is_set() and now - v.at > self.ttl_s]:
                        del self._flights[k]
        assert f is not None
        if lead:
            try:
                f.value = fetch()
                self.reads += 1
            except BaseException as e:
                f.error = e
            f.at = self._clock()
            f.done.set()
        else:
            f.done.wait()
        if f.error is not None:
            raise f.error
        return f.value
