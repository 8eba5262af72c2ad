"""The wake-ups between API front-ends on other hosts and the leader, over the Redis store.

Why a bus on the store and not the worker link over TLS (docs/architecture.md "API
front-ends"): API worker processes reach their core over a private Unix socket, which
only works on one host and only to one core. A front-end on another host must wake
*whichever replica leads*, and keep doing so across a leader failover without being
told where the new leader is. Every replica and every front-end already holds a
connection to the one shared store, so the store's pub/sub is the rendezvous: the
leader of the moment subscribes, a standby that is promoted is already subscribed, and
a front-end never needs the leader's address to wake it.

Two topics (channels ``<prefix>:bus:<topic>``):

* ``created`` (front-ends -> the leader): the jobs a front-end committed, batched as
  ``JobsCreatedRequest`` (the worker link's message, ``sender`` naming the front-end).
  The leader hands them to its scheduler and watchers exactly as an API worker's
  (``Applier.created_elsewhere``). An empty message is the front-end's beat (every
  second).
* ``changed`` (the leader -> front-ends): the ids of the jobs the leader wrote, batched
  (``CoreState.changed_jobs``), so a WatchJob served by a front-end wakes at once.
  Published only while some front-end has been heard in the last few seconds: a broker
  without front-ends pays nothing for it.

Pub/sub is fire-and-forget, so nothing durable rides on it: a job is committed before
it is announced, and a lost announcement only delays its scheduling. Where one can be
lost, the leader reads every live job from the store instead: on every (re)subscription
(a Redis restart or failover drops subscribers), when a front-end it heard falls silent
for ``SILENT_S`` (frozen or killed between a commit and its report), and, as ever, on
promotion and every 30 s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from broker.api.batched_reports import BatchedReports
from broker.api.workers import _Mailbox
from broker.jobs.hub import EventHub
from broker.store.base import StoreError
from broker.store.redis import RedisStore
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import worker_link_pb2 as wpb

log = logging.getLogger(__name__)

TOPIC_CREATED = "created"
TOPIC_CHANGED = "changed"
BEAT_S = 1.0  # a front-end reports at least this often (an empty message: its beat)
SILENT_S = 3.0  # a front-end heard before and silent this long: the leader re-reads
FORGET_S = 60.0  # a front-end silent this long is gone: no longer tracked
FRONTENDS_RECENT_S = 5.0  # the leader publishes changes only while a front-end was heard
PRIMARY_CHECK_S = 2.0  # with Sentinels: how often a subscription checks it is on the primary


class BusListener:
    """One subscription, kept: reconnects after any error, and calls ``on_subscribed``
    each time the subscription is (re)established (announcements made meanwhile may be
    lost, so the caller re-reads what they would have told).

    With Sentinels it also checks, every ``PRIMARY_CHECK_S``, that the server it is
    subscribed on is still the primary they name: messages are published on the primary,
    and a subscription left on a server that is no longer it (cut off rather than
    killed, so its socket never closes) would hear nothing while looking healthy."""

    def __init__(self, store: RedisStore, topic: str, on_message: Callable[[bytes], None],
                 on_subscribed: Callable[[], None]) -> None:
        self.store, self.topic = store, topic
        self.on_message, self.on_subscribed = on_message, on_subscribed
        self.connected = threading.Event()
        self.subscriptions = 0  # subscriptions established (the first, then each re-subscription)
        self.address = ""  # "host:port" of the server subscribed on ("" while not)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"bus-{topic}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def reconnects(self) -> int:
        """Re-subscriptions after the first (a Redis restart, a failover, a dropped link)."""
        return max(0, self.subscriptions - 1)

    def _run(self) -> None:
        pause = 0.1
        while not self._stop.is_set():
            sub = None
            try:
                sub = self.store.subscriber()
                sub.subscribe(self.store.bus_channel(self.topic))
                checked = time.monotonic()
                while not self._stop.is_set():
                    msg = sub.get_message(timeout=0.5)
                    if time.monotonic() - checked >= PRIMARY_CHECK_S:
                        checked = time.monotonic()
                        self._check_primary(sub)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":  # also after redis-py's own reconnects
                        conn = sub.connection
                        self.address = f"{conn.host}:{conn.port}" if conn is not None else ""
                        self.subscriptions += 1
                        self.connected.set()
                        pause = 0.1
                        self.on_subscribed()
                    elif msg["type"] == "message":
                        self.on_message(msg["data"])
            except Exception as e:  # noqa: BLE001 - the store is down or failing over: retry
                if self.connected.is_set():
                    log.warning("store bus %s: subscription lost: %s", self.topic, e)
                self.connected.clear()
                self.address = ""
            finally:
                if sub is not None:
                    with contextlib.suppress(Exception):
                        sub.close()
            if self._stop.wait(pause):
                return
            pause = min(pause * 2, 2.0)
        self.connected.clear()

    def _check_primary(self, sub: object) -> None:
        """Raise (so the loop subscribes again, on the primary) when the Sentinels name a
        primary other than the server this subscription is on."""
        if not self.connected.is_set():
            return
        primary = self.store.primary_address()
        if primary is None or not self.address:
            return  # one server, or no Sentinel answered: nothing to compare with
        if primary != self.address:
            raise ConnectionError(f"subscribed on {self.address}, but the Sentinels name"
                                  f" {primary} the primary")


class LeaderBus:
    """A broker replica's end: creations in (acted on only while leading), changes out.

    ``is_leader``: whether this replica leads now; ``created``: the applier's
    ``created_elsewhere``; ``reread``: make the next scheduler pass read every live job
    from the store (no-op on a standby: a promotion reads them anyway)."""

    def __init__(self, store: RedisStore, hub: EventHub, is_leader: Callable[[], bool],
                 created: Callable[[list[pb.Job]], None], reread: Callable[[], None]) -> None:
        self.store, self.hub = store, hub
        self.is_leader, self.created, self.reread = is_leader, created, reread
        self.listener = BusListener(store, TOPIC_CREATED, self._on_created, self._on_subscribed)
        self.heard: dict[str, float] = {}  # front-end name -> monotonic time of its last report
        self.silent: set[str] = set()
        self.received = 0  # jobs announced by front-ends (counted while leading)
        self._lock = threading.Lock()
        self._box = _Mailbox()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._publish_changes, name="bus-changes", daemon=True),
                         threading.Thread(target=self._watch_silence, name="bus-silence", daemon=True)]

    def start(self) -> None:
        self.hub.tap(self._box.add)
        self.listener.start()
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self.hub.untap(self._box.add)
        self._box.add("")  # wake the publisher
        self.listener.stop()
        for t in self._threads:
            t.join(timeout=5)

    def frontends(self) -> list[str]:
        """Front-ends heard within FRONTENDS_RECENT_S."""
        now = time.monotonic()
        with self._lock:
            return sorted(n for n, t in self.heard.items() if now - t < FRONTENDS_RECENT_S)

    def _on_subscribed(self) -> None:
        if self.is_leader():
            self.reread()  # announcements made while unsubscribed are lost

    def _on_created(self, data: bytes) -> None:
        try:
            req = wpb.JobsCreatedRequest.FromString(data)
        except Exception as e:  # noqa: BLE001 - a stray publisher must not stop the bus
            log.warning("store bus: an undecodable creation report (%d bytes): %s", len(data), e)
            return
        with self._lock:
            self.heard[req.sender] = time.monotonic()
            back = req.sender in self.silent
            self.silent.discard(req.sender)
        if back:
            log.info("API front-end %s reports again", req.sender)
        if req.jobs and self.is_leader():
            self.received += len(req.jobs)
            self.created(list(req.jobs))

    def _watch_silence(self) -> None:
        while not self._stop.wait(BEAT_S):
            now = time.monotonic()
            with self._lock:
                quiet = [n for n, t in self.heard.items()
                         if n not in self.silent and now - t > SILENT_S]
                self.silent.update(quiet)
                for n in [n for n, t in self.heard.items() if now - t > FORGET_S]:
                    del self.heard[n]
                    self.silent.discard(n)
            if quiet and self.is_leader():
                log.warning("API front-end(s) %s silent for %.0f s (frozen or gone?): the next"
                            " scheduler pass reads every live job from the store",
                            ", ".join(quiet), SILENT_S)
                self.reread()

    def _publish_changes(self) -> None:
        while not self._stop.is_set():
            ids = [i for i in self._box.take(1.0) if i]
            if not ids or not self.is_leader() or not self.frontends():
                continue
            try:
                self.store.publish(TOPIC_CHANGED, wpb.CoreState(
                    leading=True, changed_jobs=ids).SerializeToString())
            except StoreError as e:  # watchers on front-ends wake at their next poll
                log.warning("store bus: job changes not announced: %s", e)


class _BusReports(BatchedReports):
    """A front-end's creations, published on the store's pub/sub for the leader."""

    retryable = (StoreError,)

    def __init__(self, store: RedisStore, name: str, frontend_id: int) -> None:
        super().__init__(BEAT_S)
        self.store, self.name, self.frontend_id = store, name, frontend_id

    def send(self, batch: list[pb.Job]) -> None:
        self.store.publish(TOPIC_CREATED, wpb.JobsCreatedRequest(
            worker=self.frontend_id, sender=self.name, jobs=batch).SerializeToString())

    def dropped(self, batch: list[pb.Job], error: BaseException) -> None:
        # stopping: the leader re-reads the store when this front-end falls silent
        log.warning("front-end: %d creation report(s) not sent: %s", len(batch), error)


class FrontendBus:
    """A front-end's end: its creations out (batched, with a beat), the leader's job
    changes in (waking this process's watchers)."""

    def __init__(self, store: RedisStore, name: str, frontend_id: int, hub: EventHub) -> None:
        self.store, self.name, self.frontend_id, self.hub = store, name, frontend_id, hub
        self.listener = BusListener(store, TOPIC_CHANGED, self._on_changed, lambda: None)
        self.reports = _BusReports(store, name, frontend_id)
        self._thread = threading.Thread(target=self.reports.run, name="bus-reports", daemon=True)

    @property
    def sent(self) -> int:
        return self.reports.sent

    @property
    def messages(self) -> int:
        return self.reports.messages

    @property
    def connected(self) -> bool:
        return self.listener.connected.is_set()

    def start(self) -> None:
        self.listener.start()
        self._thread.start()

    def add(self, job: pb.Job) -> None:
        """The applier's listener: a job this front-end committed."""
        self.reports.add(job)

    def close(self) -> None:
        self.reports.close()
        self._thread.join(timeout=10)
        self.listener.stop()

    def _on_changed(self, data: bytes) -> None:
        try:
            ids = wpb.CoreState.FromString(data).changed_jobs
        except Exception:  # noqa: BLE001 - a stray publisher must not stop the bus
            return
        for job_id in ids:
            self.hub.notify(job_id)

