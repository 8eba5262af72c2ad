"""Budget of long-lived streams (WatchJob, StreamJobLogs, agent Connect, workdir
transfers): a cap per identity and in total.

Why: the gRPC server is synchronous, one thread per running RPC. Before issue 12 every
stream held a thread of the one shared pool, so 270 idle WatchJob or Connect streams
starved every other RPC. Now streams are admitted only while the budget holds (beyond
it: RESOURCE_EXHAUSTED with a message that says which cap and what to do), and the
server's pool is sized ``max_streams + max_workers`` (broker/server.py), so unary RPCs
(reads, submits) always find one of their ``max_workers`` threads.
"""

from __future__ import annotations

import threading
from collections import Counter

import grpc

from broker.api.errors import ResourceExhausted


def stream_owner(context: grpc.ServicerContext) -> str:
    """Who a stream counts against for the per-identity cap: the one seam for identity.

    The authenticated principal (broker/auth/interceptor.py wraps the context before the
    edge sees it); without one (a public method such as health Watch), the caller's
    peer host, port stripped, so one client's connections count together. Never a
    header: a header names whoever the caller claims to be.
    """
    principal = getattr(context, "principal", None)
    name = getattr(principal, "name", "")
    if name:
        role = getattr(getattr(principal, "role", None), "value", "")
        return f"{role}:{name}" if role else name
    peer = context.peer() or "unknown"
    host = peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer
    return f"peer:{host}"


class StreamBudget:
    """Counts open streams; :meth:`acquire` admits or raises ResourceExhausted."""

    def __init__(self, total: int, per_identity: int) -> None:
        self.total = total
        self.per_identity = per_identity
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self.refused = 0  # streams refused since start (metrics, tests)

    @property
    def open(self) -> int:
        with self._lock:
            return sum(self._open.values())

    def acquire(self, owner: str, method: str) -> None:
        with self._lock:
            in_use = sum(self._open.values())
            if in_use >= self.total:
                self.refused += 1
                raise ResourceExhausted(
                    f"{method}: the broker serves at most {self.total} open streams and all are"
                    " in use; retry later (an operator can raise max_streams)")
            if self._open[owner] >= self.per_identity:
                self.refused += 1
                raise ResourceExhausted(
                    f"{method}: {owner} already has {self._open[owner]} open streams, the"
                    f" per-identity limit (max_streams_per_identity={self.per_identity});"
                    " close some (e.g. finished watches) and retry")
            self._open[owner] += 1

    def release(self, owner: str) -> None:
        with self._lock:
            self._open[owner] -= 1
            if self._open[owner] <= 0:
                del self._open[owner]
