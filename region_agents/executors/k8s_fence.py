"""Launches held back until every pod of the job's older attempts has ended (the fence),
waited for on one thread of its own instead of inside ``launch()``.

Why a thread: ``launch()`` runs on the thread that reads the broker's stream, with the
agent's lock held. It used to wait there (up to a minute) for the older attempt's pods
to end. After a mass kill (an agent's self-fence, nodes going NotReady) the broker
relaunches hundreds of jobs at once, each fenced on pods whose node may be gone (such a
pod ends for us only a minute after its deletion deadline): the stream stopped being
read for minutes, the broker's heartbeat answers queued unread, and the agent, hearing
nothing, self-fenced again -- the scale benchmark's runs collapsed that way. Now
``launch()`` only kills the older pods and registers a :class:`Fence`; this module's
thread looks at the fenced pods in the watch cache (no request) and hands the attempt
to the creator threads the moment all of them have ended. The guarantee is unchanged:
no pod of attempt N is created while a pod of an older attempt can still run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CHECK_S = 0.1  # how often pending fences are looked at (watch-cache reads only)


def _made_already() -> tuple[bool, bool]:
    return True, True


@dataclass
class FenceWait:
    """One pod a fenced launch waits for, by its (fixed) name.

    ``creation``: for a pod of an older attempt whose objects may still be being made,
    ``(its creation is over, this pod was made)``; a pod found in the watch cache
    already was made (the default)."""

    name: str
    creation: Callable[[], tuple[bool, bool]] = _made_already


@dataclass
class Fence:
    """A launch waiting for ``waits``; ``go()`` when all of them have ended,
    ``give_up()`` once ``timeout_s`` passed first. Both are called on the fence thread."""

    what: str
    waits: list[FenceWait]
    go: Callable[[], None]
    give_up: Callable[[], None]
    timeout_s: float
    started: float = field(default_factory=time.monotonic)
    seen: set[str] = field(default_factory=set)  # names once in the cache


class Fences:
    """The pending fences and the thread that clears them.

    ``get_pod(name)`` reads the pod watch cache; ``ended(pod)`` says whether nothing of
    a pod can still run. A pod counts as ended when the cache shows it ended, when it
    was in the cache and is gone (deleted), or when its attempt's creation is over and
    it was never made."""

    def __init__(self, get_pod: Callable[[str], dict | None], ended: Callable[[dict], bool]) -> None:
        self.get_pod = get_pod
        self.ended = ended
        self._pending: list[Fence] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, fence: Fence) -> None:
        with self._lock:
            self._pending.append(fence)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="k8s-fence", daemon=True)
                self._thread.start()
        self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _clear(self, f: Fence) -> bool:
        for w in f.waits:
            pod = self.get_pod(w.name)
            if pod is not None:
                f.seen.add(w.name)
                if not self.ended(pod):
                    return False
                continue
            if w.name in f.seen:
                continue  # deleted (our finalizer was released: its end was read)
            done, made = w.creation()
            if not done or made:
                return False  # still being made, or made and not yet in the cache
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                todo = list(self._pending)
            now = time.monotonic()
            finished: list[tuple[Fence, bool]] = []
            for f in todo:
                if self._clear(f):
                    finished.append((f, True))
                elif now - f.started > f.timeout_s:
                    finished.append((f, False))
            if finished:
                with self._lock:
                    gone = {id(f) for f, _ in finished}
                    self._pending = [f for f in self._pending if id(f) not in gone]
            for f, ok in finished:
                try:
                    f.go() if ok else f.give_up()
                except Exception:  # noqa: BLE001 - one launch's trouble must not stop the others
                    log.exception("fence of %s", f.what)
            self._wake.wait(CHECK_S if todo else 5.0)
            self._wake.clear()
