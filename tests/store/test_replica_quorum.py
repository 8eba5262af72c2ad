"""Which replicas must confirm a write (broker/store/replica_quorum.py): the counting rule
row by row on Sentinel answers in the shape ``SENTINEL REPLICAS`` gives, and when the
count is asked again. The real Sentinels' side is tests/store/test_store_failover.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from broker.store.replica_quorum import (
    REFRESH_S,
    Answers,
    ReplicaQuorum,
    ReplicaRule,
    current_views,
    promotable,
)

P = "10.0.0.1:9"  # the primary


def _r(port: int, flags: str = "slave") -> dict[str, Any]:
    return {"ip": "10.0.0.1", "port": port, "flags": flags}


@pytest.mark.parametrize(("views", "expected"), [
    # two healthy replicas: both may be promoted, both must confirm
    ([[_r(1), _r(2)]], {"10.0.0.1:1", "10.0.0.1:2"}),
    # the old primary after a failover: flagged down by every Sentinel, cannot be promoted
    ([[_r(1), _r(2), _r(3, "s_down,slave,disconnected")]] * 3, {"10.0.0.1:1", "10.0.0.1:2"}),
    # one Sentinel still sees a replica up: it could promote it, so it counts
    ([[_r(1), _r(2, "s_down,slave")], [_r(1), _r(2)]], {"10.0.0.1:1", "10.0.0.1:2"}),
    # a replica only one Sentinel knows about counts too
    ([[_r(1)], [_r(1), _r(2)]], {"10.0.0.1:1", "10.0.0.1:2"}),
    # flags as redis-py may hand them over (bytes)
    ([[{"ip": "h", "port": 7, "flags": b"slave,o_down"}, {"ip": "h", "port": 8, "flags": b"slave"}]],
     {"h:8"}),
    ([], set()),
])
def test_promotable_replicas(views: list[Sequence[Mapping[str, Any]]], expected: set[str]) -> None:
    assert promotable(views) == expected


def test_only_sentinels_naming_the_primary_count_and_never_the_primary_itself() -> None:
    # Just after a failover: two Sentinels follow the promoted 10.0.0.1:1 (the old
    # primary :9 now a replica, flagged down); one still names :9 and lists :1 and :2.
    new = "10.0.0.1:1"
    answers: Answers = [
        (new, [_r(2), _r(9, "s_down,slave,disconnected")]),
        (new, [_r(2), _r(9, "slave,disconnected")]),
        (P, [_r(1), _r(2)]),
    ]
    views = current_views(answers)
    assert len(views) == 2
    assert promotable(views) == {"10.0.0.1:2"}
    assert current_views([(new, [_r(1), _r(2)])]) == [[_r(2)]]
    assert current_views([("", [_r(1)])]) == []


class _Sentinels:
    """Scripted replica lists of Sentinels that all name ``P``, and how often asked."""

    def __init__(self, *answers: list[Sequence[Mapping[str, Any]]] | Exception) -> None:
        self.answers = list(answers)
        self.asked = 0

    def __call__(self) -> Answers:
        self.asked += 1
        a = self.answers[min(self.asked, len(self.answers)) - 1]
        if isinstance(a, Exception):
            raise a
        return [(P, view) for view in a]


def test_all_asks_at_most_once_a_second_and_again_after_a_shortfall() -> None:
    now = [100.0]
    ask = _Sentinels([[_r(1), _r(2)]], [[_r(1), _r(2, "s_down,slave")]])
    q = ReplicaQuorum(ReplicaRule.ALL, 1, ask, clock=lambda: now[0])
    assert (q.needed(), q.needed(), ask.asked) == (2, 2, 1)
    q.stale()  # a write fell short: the next one asks again
    assert (q.needed(), ask.asked) == (1, 2)
    now[0] += REFRESH_S
    assert q.needed() == 1 and ask.asked == 3


def test_all_never_asks_less_than_one_and_keeps_its_count_when_no_sentinel_answers() -> None:
    ask = _Sentinels([[_r(1, "s_down,slave"), _r(2, "s_down,slave")]], [[_r(1), _r(2)]],
                     ConnectionError("no Sentinel"), [])
    now = [0.0]
    q = ReplicaQuorum(ReplicaRule.ALL, 1, ask, clock=lambda: now[0])
    assert q.needed() == 1  # every replica down: still one (never the primary alone)
    now[0] += REFRESH_S
    assert q.needed() == 2
    now[0] += REFRESH_S
    assert q.needed() == 2  # the Sentinels did not answer: the last count stands
    now[0] += REFRESH_S
    assert q.needed() == 2  # an empty answer says nothing either


def test_fixed_counts_never_ask_and_all_needs_sentinels() -> None:
    assert ReplicaQuorum(ReplicaRule.FIXED, 2).needed() == 2
    assert not ReplicaQuorum(ReplicaRule.FIXED, 0).enabled
    assert ReplicaQuorum(ReplicaRule.ALL, 1, _Sentinels([])).enabled
    with pytest.raises(ValueError, match="needs Sentinels"):
        ReplicaQuorum(ReplicaRule.ALL, 1)


def test_while_one_write_asks_the_sentinels_the_others_use_the_last_count() -> None:
    """Slow Sentinels hold up the one write that asks, not every write meanwhile."""
    import threading

    now = [0.0]
    release, asking = threading.Event(), threading.Event()
    answers = iter([[[_r(1), _r(2)]], [[_r(1)]]])

    def ask() -> Answers:
        view = next(answers)
        if now[0] > 0:  # the second ask blocks until released
            asking.set()
            release.wait(10)
        return [(P, v) for v in view]

    q = ReplicaQuorum(ReplicaRule.ALL, 1, ask, clock=lambda: now[0])
    assert q.needed() == 2
    now[0] += REFRESH_S
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(q.needed()))
    t.start()
    assert asking.wait(10)
    assert q.needed() == 2  # not blocked: the last count
    release.set()
    t.join(10)
    assert got == [1] and q.needed() == 1
