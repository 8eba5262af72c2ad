"""Priority classes as API state (like Kueue's WorkloadPriorityClass), seeded from config.

Why an overlay and no seeding writes at start: the broker's config ``priority_classes``
are the defaults for every name that has no stored record; a stored record (set through
``SetPriorityClass``) wins, and a stored tombstone (``DeletePriorityClass``) hides the
config's class of that name. So the live set is "config, then the store on top", a
restart never re-creates a class an operator deleted, and a standby never writes
anything just by starting (writes are fenced to the leader; see broker/store/base.py).

Why a cache: the scheduler asks for a job's priority value for every job of every pass.
The set is read from the store at most once per :data:`REFRESH_S` and at once after a
change made through this object (the only writer in a broker process); the refresh
interval also picks up a change written by the previous leader after a failover.

Why a shared/exclusive lock: a delete counts the live jobs of the class, then writes the
tombstone; a submit validated against the old set could otherwise create a job of the
class in between. Submits hold :meth:`PriorityClasses.submitting` (shared: they run in
parallel), a delete holds it exclusively, so in the leader (the only process serving
writes) no job of a deleted class can appear.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from broker.api.errors import FailedPrecondition, NotFound
from broker.config import BrokerConfig
from broker.jobs.lifecycle import LIVE
from broker.store.base import KIND_PRIORITY_CLASS, KIND_PRIORITY_CLASS_DELETED, Store, StoreError
from broker.store.jobs_query import iter_jobs
from computebroker.v1 import capacity_pb2 as cpb

REFRESH_S = 5.0
log = logging.getLogger(__name__)


class SharedExclusive:
    """Many shared holders or one exclusive holder; a waiting exclusive holder goes
    before new shared ones (a stream of submits cannot starve a delete)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self.waiting_exclusive = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self.waiting_exclusive:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self.waiting_exclusive += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self.waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class PriorityClasses:
    """The live set of priority classes: read cheaply, changed through :meth:`set`/:meth:`delete`."""

    def __init__(self, store: Store, config: BrokerConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store, self._config, self._clock = store, config, clock
        self._lock = threading.Lock()
        self._cached: dict[str, cpb.PriorityClass] | None = None
        self._read_at = 0.0
        self.guard = SharedExclusive()  # submits shared, deletes exclusive (module docstring)

    # ---- reads ------------------------------------------------------------------------
    def _load(self) -> dict[str, cpb.PriorityClass]:
        out = {name: cpb.PriorityClass(name=name, value=value)
               for name, value in self._config.priority_classes.items()}
        for tomb in self._store.list_records(KIND_PRIORITY_CLASS_DELETED, cpb.PriorityClass):
            out.pop(tomb.name, None)  # type: ignore[attr-defined]
        for pc in self._store.list_records(KIND_PRIORITY_CLASS, cpb.PriorityClass):
            assert isinstance(pc, cpb.PriorityClass)
            out[pc.name] = pc
        default = self._config.default_priority_class
        if default in out:
            out[default].is_default = True
        return out

    def _current(self) -> dict[str, cpb.PriorityClass]:
        with self._lock:
            now = self._clock()
            if self._cached is None:
                self._cached, self._read_at = self._load(), now  # nothing to fall back on
            elif now - self._read_at >= REFRESH_S:
                try:
                    self._cached = self._load()
                except StoreError as e:
                    # A periodic refresh must not fail a scheduler pass: keep the last set.
                    log.warning("priority classes: refresh failed (%s); keeping the last set", e)
                self._read_at = now
            return self._cached

    def fresh(self) -> bool:
        """True when the next read is answered from the cache (no store read): a caller
        on an event loop reads the classes itself only then."""
        with self._lock:
            return self._cached is not None and self._clock() - self._read_at < REFRESH_S

    def values(self) -> dict[str, int]:
        """name -> value of every live class (what SubmitJob validates against)."""
        return {n: pc.value for n, pc in self._current().items()}

    def value_of(self, name: str) -> int:
        """A class's value; the default class for ``""``; 0 for a class that is gone."""
        pc = self._current().get(name or self._config.default_priority_class)
        return pc.value if pc is not None else 0

    def list(self) -> list[cpb.PriorityClass]:
        """Every live class, highest value first (then by name)."""
        return sorted(self._current().values(), key=lambda pc: (-pc.value, pc.name))

    def submitting(self) -> contextlib.AbstractContextManager[None]:
        """Held by a submit from validating its class until its job is stored."""
        return self.guard.shared()

    def invalidate(self) -> None:
        with self._lock:
            self._cached = None

    # ---- writes (the caller validated the message at the edge) ----------------------------
    def set(self, pc: cpb.PriorityClass) -> cpb.PriorityClass:
        """Create or update a class; returns it as stored (is_default filled)."""
        stored = cpb.PriorityClass(name=pc.name, value=pc.value, description=pc.description)
        self._store.put_record(KIND_PRIORITY_CLASS, pc.name, stored)
        self._store.delete_record(KIND_PRIORITY_CLASS_DELETED, pc.name)
        self.invalidate()
        return self._current()[pc.name]

    def delete(self, name: str) -> None:
        """Remove a class no live job uses; never the default class."""
        with self.guard.exclusive():
            self._delete(name)

    def _delete(self, name: str) -> None:
        known = self._current()
        if name not in known:
            raise NotFound(f"priority class {name!r} not found; known: {', '.join(known_names(known))}")
        if name == self._config.default_priority_class:
            raise FailedPrecondition(
                f"priority class {name!r} is the default for jobs that name none"
                " (broker config default_priority_class); it cannot be deleted")
        users = sum(1 for j in iter_jobs(self._store, phases=LIVE)
                    if (j.spec.priority_class or self._config.default_priority_class) == name)
        if users:
            raise FailedPrecondition(
                f"priority class {name!r} is used by {users} live job(s); cancel them or"
                " wait until they end, then delete it")
        self._store.put_record(KIND_PRIORITY_CLASS_DELETED, name, cpb.PriorityClass(name=name))
        self._store.delete_record(KIND_PRIORITY_CLASS, name)
        self.invalidate()


def known_names(classes: dict[str, cpb.PriorityClass]) -> list[str]:
    """Class names highest value first: how error messages list them."""
    return [pc.name for pc in sorted(classes.values(), key=lambda pc: (-pc.value, pc.name))]

