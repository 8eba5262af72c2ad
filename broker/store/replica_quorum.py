"""How many replicas must confirm a write before the broker acknowledges it.

Why not a fixed ``WAIT 1``: with two replicas, ``WAIT 1`` returns once *either* replica
has the write. If the primary then dies, the Sentinels may promote the *other* one (a
lower ``replica-priority``, or the one that had it lost as well), and the write the
client was told succeeded is gone. An acknowledged write is only safe when it is on
every replica the Sentinels may promote.

Which replicas may a Sentinel promote? Its choice (``sentinelSelectSlave`` in Redis)
skips a replica that it flags down (``s_down``/``o_down``), whose link it lost
(``disconnected``), or that has ``replica-priority 0``; among the rest it prefers the
lowest priority value, then the highest replication offset. So the rule
(:attr:`ReplicaRule.ALL`, the default with a Sentinel URL) is: **every replica the
Sentinels list for the primary, except one that every Sentinel that answered flags down
or disconnected** (replicas with priority 0 are counted too: over-counting only asks
more of ``WAIT``, never less). Counting, not naming, is enough because ``WAIT n`` is
satisfied only by ``n`` distinct replicas and the count includes every candidate.

What it costs, said in the operator guide: while a replica is unreachable but not yet
flagged down (the Sentinels' ``down-after-milliseconds``), writes wait for it and answer
UNAVAILABLE; once the Sentinels flag it, it cannot be promoted and writes go on without
it. The old primary after a failover is such a flagged replica, so a failover does not
stop writes while two replicas remain. At least one replica is always required (the
same floor as ``min_replicas=1``): a write only the primary holds is never acknowledged.

The count is asked of the Sentinels at most once a second (a Sentinel round trip per
write would double the write's cost) and again after any write that fell short, so a
replica the Sentinels have just flagged down stops holding writes up within a second.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

REFRESH_S = 1.0
# each answering Sentinel's (primary ip:port, SENTINEL REPLICAS list)
Answers = list[tuple[str, Sequence[Mapping[str, Any]]]]
_DOWN_FLAGS = frozenset({"s_down", "o_down", "disconnected"})


class ReplicaRule(enum.Enum):
    """What ``min_replicas`` in the store URL asks for."""

    FIXED = "fixed"  # a number of replicas (0 = no confirmation)
    ALL = "all"  # every replica the Sentinels may promote (at least one)


def replica_key(entry: Mapping[str, Any]) -> str:
    """``ip:port`` of one replica in a ``SENTINEL REPLICAS`` answer."""
    ip = entry.get("ip")
    return f"{ip.decode() if isinstance(ip, bytes) else ip}:{entry.get('port')}"


def _flags(entry: Mapping[str, Any]) -> frozenset[str]:
    raw = entry.get("flags", "")
    if isinstance(raw, bytes):
        raw = raw.decode()
    if isinstance(raw, str):
        return frozenset(f for f in raw.split(",") if f)
    return frozenset(str(f) for f in raw)


def promotable(views: Iterable[Sequence[Mapping[str, Any]]]) -> set[str]:
    """The replicas a Sentinel may promote, given each answering Sentinel's
    ``SENTINEL REPLICAS`` list: every replica any Sentinel lists, unless every Sentinel
    that lists it flags it down or disconnected (a pure function: tested row by row)."""
    up: set[str] = set()
    for view in views:
        up.update(replica_key(e) for e in view if not (_flags(e) & _DOWN_FLAGS))
    return up


def current_views(answers: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
                  ) -> list[Sequence[Mapping[str, Any]]]:
    """The replica lists to count from, given each answering Sentinel's (primary
    ``ip:port``, replica list): only those of Sentinels naming the primary most of them
    name, without that primary. Why: right after a failover a Sentinel not yet
    reconfigured still lists the old primary's replicas, the promoted one among them
    (counted, it would have the new primary wait for a confirmation from itself)."""
    votes: dict[str, int] = {}
    for primary, _ in answers:
        if primary:
            votes[primary] = votes.get(primary, 0) + 1
    if not votes:
        return []
    primary = max(votes.items(), key=lambda kv: kv[1])[0]
    return [[e for e in view if replica_key(e) != primary]
            for named, view in answers if named == primary]


class ReplicaQuorum:
    """``needed()``: the number for ``WAIT``. ``FIXED`` answers its number; ``ALL``
    asks ``ask_sentinels`` (each answering Sentinel's primary and replica list; raises
    when none answers) at most every :data:`REFRESH_S` and after :meth:`stale`."""

    def __init__(self, rule: ReplicaRule, fixed: int,
                 ask_sentinels: Callable[[], Answers] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rule is ReplicaRule.ALL and ask_sentinels is None:
            raise ValueError("min_replicas=all needs Sentinels to ask (a redis+sentinel:// URL)")
        self.rule = rule
        self._fixed = fixed
        self._ask = ask_sentinels
        self._clock = clock
        self._lock = threading.Lock()
        self._count = 0  # ALL: the last count (0 = never asked)
        self._at = -1e18
        self._asking = False

    @property
    def enabled(self) -> bool:
        """Whether writes are confirmed at all (``min_replicas=0`` turns it off)."""
        return self.rule is ReplicaRule.ALL or self._fixed > 0

    def needed(self) -> int:
        if self.rule is ReplicaRule.FIXED:
            return self._fixed
        now = self._clock()
        with self._lock:
            # fresh, or another thread is asking (Sentinels slow to answer hold up one
            # write a second, not every write): the last count
            if self._count and (now - self._at < REFRESH_S or self._asking):
                return self._count
            self._asking = True
        try:
            count = self._resolve()
        finally:
            with self._lock:
                self._asking = False
        with self._lock:
            self._count, self._at = count, now
        return count

    def stale(self) -> None:
        """A write fell short: ask the Sentinels again before the next one."""
        with self._lock:
            self._at = -1e18

    def _resolve(self) -> int:
        assert self._ask is not None
        try:
            views = self._ask()
        except Exception as e:  # noqa: BLE001 - no Sentinel answered: keep the last count
            log.warning("could not ask the Sentinels for the replicas (%s); keeping %d",
                        e, self._count or 1)
            return self._count or 1
        views = current_views(views)
        if not views:
            return self._count or 1
        return max(1, len(promotable(views)))
