"""Jobs created outside the leader's process, announced to it in batches.

An API worker (over the worker link) and an API front-end on another host (over the
store's pub/sub) both commit jobs the leader's scheduler has not heard of. Each tells the
leader in batches -- one message per batch, not per job -- and sends an empty batch as a
beat when it created nothing for a while, so the leader takes a silent sender as frozen
and re-reads the store rather than waiting for its periodic full read. This is the one
loop both use; they differ only in how a batch travels (``send``) and which of its
errors mean "try again" (``retryable``).

Nothing durable depends on a report: the jobs are already stored. A report that cannot
be sent while stopping is logged and dropped; a leader starting up, or hearing a silent
sender, reads every live job from the store.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod

from computebroker.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

# A report waits this long for company: each report costs the leader's one GIL about
# 0.15 ms whatever it carries (at one job per report that was 0.2 ms of the core per
# submit). Only under a stream of submits (the previous report went out less than
# REPORT_BUSY_S ago): a lone submit is reported at once, so a quiet broker admits it
# without the delay; in a storm the scheduler paces its passes far slower anyway.
REPORT_LINGER_S = 0.02
REPORT_BUSY_S = 0.1


class BatchedReports(ABC):
    """A sender's creation reports: ``add`` from the applier, ``run`` on its own thread."""

    # The errors of ``send`` that a retry may cure (a frozen or busy leader, a store
    # that is failing over); any other error is a bug and propagates.
    retryable: tuple[type[BaseException], ...] = ()

    def __init__(self, beat_s: float) -> None:
        self.beat_s = beat_s
        self._cond = threading.Condition()
        self._queue: list[pb.Job] = []
        self._closed = False
        self.sent = 0  # jobs reported
        self.messages = 0  # batches sent, beats included

    @abstractmethod
    def send(self, batch: list[pb.Job]) -> None:
        """Deliver one batch (empty: a beat); raise one of ``retryable`` to try again."""

    def dropped(self, batch: list[pb.Job], error: BaseException) -> None:
        """A batch given up while stopping (the leader re-reads the store)."""
        log.warning("%d creation report(s) not delivered: %s", len(batch), error)

    def add(self, job: pb.Job) -> None:
        """The applier's listener: a job this process committed."""
        with self._cond:
            self._queue.append(job)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def run(self) -> None:
        last = 0.0  # monotonic time of the previous message
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed,
                                    timeout=max(0.0, last + self.beat_s - time.monotonic()))
            if self._queue and not self._closed and time.monotonic() - last < REPORT_BUSY_S:
                time.sleep(REPORT_LINGER_S)
            with self._cond:
                batch, self._queue = self._queue, []
                if not batch and self._closed:
                    return
            if not batch and time.monotonic() - last < self.beat_s:
                continue
            last = time.monotonic()
            self._deliver(batch)

    def _deliver(self, batch: list[pb.Job]) -> None:
        pause = 0.2
        while True:
            try:
                self.send(batch)
            except self.retryable as e:
                if not batch:
                    return  # a beat: the next one follows
                if self._closed:
                    self.dropped(batch, e)
                    return
                # A frozen or busy receiver: keep the batch until it answers (the jobs
                # are stored; only the scheduler's hearing of them waits).
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
                continue
            self.sent += len(batch)
            self.messages += 1
            return
