"""Rank-log storage, the same on SQLite and Redis (Store.append_logs / read_logs).

Pins what the broker and agent rely on: offset dedup (a resend stores nothing twice),
gaps marked, per-attempt seq order, the size bound dropping oldest lines with a count,
and offsets surviving a reopened store (a broker restart).
"""

from __future__ import annotations

from broker.store import Store
from computebroker.v1 import logs_pb2 as lpb

BIG = 1 << 20


def chunk(lines: list[str], offset: int, attempt: int = 1, rank: int = 0,
          stream: str = "stdout") -> lpb.LogChunk:
    return lpb.LogChunk(job_id="j-1", attempt=attempt, rank=rank, stream=stream, offset=offset,
                        lines=lines, sizes=[len(x.encode()) + 1 for x in lines], time=5.0)


def texts(store: Store, attempt: int = 1, after: int = 0) -> list[str]:
    return [ln.text for ln in store.read_logs("j-1", attempt, after)[0]]


def test_append_read_in_order_with_seq(store: Store) -> None:
    assert store.append_logs("j-1", chunk(["a", "bb"], 0), BIG) == 5
    assert store.append_logs("j-1", chunk(["x"], 0, rank=1, stream="stderr"), BIG) == 2
    assert store.append_logs("j-1", chunk(["ccc"], 5), BIG) == 9
    lines, dropped = store.read_logs("j-1", 1)
    assert [(ln.seq, ln.rank, ln.stream, ln.text) for ln in lines] == [
        (1, 0, "stdout", "a"), (2, 0, "stdout", "bb"), (3, 1, "stderr", "x"), (4, 0, "stdout", "ccc")]
    assert dropped == 0 and lines[0].attempt == 1 and lines[0].time == 5.0
    assert texts(store, after=2) == ["x", "ccc"]
    assert store.read_logs("j-1", 2) == ([], 0)


def test_resend_is_deduplicated_by_offset(store: Store) -> None:
    store.append_logs("j-1", chunk(["a", "bb"], 0), BIG)
    assert store.append_logs("j-1", chunk(["a", "bb"], 0), BIG) == 5  # exact resend
    assert store.append_logs("j-1", chunk(["bb", "ccc"], 2), BIG) == 9  # overlapping resend
    assert texts(store) == ["a", "bb", "ccc"]


def test_gap_is_marked(store: Store) -> None:
    store.append_logs("j-1", chunk(["a"], 0), BIG)
    store.append_logs("j-1", chunk(["z"], 100), BIG)
    assert texts(store) == ["a", "… 98 bytes not shipped (agent backlog bound)", "z"]


def test_offsets_per_stream_and_survive_reopen(store_factory) -> None:
    first = store_factory()
    first.append_logs("j-1", chunk(["a"], 0), BIG)
    first.append_logs("j-1", chunk(["xyz"], 0, attempt=2, rank=1, stream="stderr"), BIG)
    again = store_factory()
    got = {(o.attempt, o.rank, o.stream): o.end_offset for o in again.log_offsets("j-1")}
    assert got == {(1, 0, "stdout"): 2, (2, 1, "stderr"): 4}
    assert all(o.job_id == "j-1" for o in again.log_offsets("j-1"))
    assert again.log_offsets("j-other") == []
    assert texts(again, attempt=2) == ["xyz"]


def test_bound_drops_oldest_lines_and_counts_them(store: Store) -> None:
    line = "x" * 99  # costs 100 bytes
    for i in range(10):
        store.append_logs("j-1", chunk([line[:-1] + str(i)], i * 100), 350)
    lines, dropped = store.read_logs("j-1", 1)
    assert dropped == 7
    assert [ln.text[-1] for ln in lines] == ["7", "8", "9"]
    assert [ln.seq for ln in lines] == [8, 9, 10]
    assert [ln.seq for ln in store.read_logs("j-1", 1, after_seq=8)[0]] == [9, 10]
    assert store.read_logs("j-1", 1, after_seq=2)[0][0].seq == 8  # dropped ones are gone
    # One chunk larger than the bound keeps only its newest lines.
    store.append_logs("j-1", chunk([line] * 5, 0, attempt=2), 250)
    lines, dropped = store.read_logs("j-1", 2)
    assert (len(lines), dropped) == (2, 3)
    assert store.read_logs("j-1", 1)[1] == 7  # attempts are bounded separately


def test_log_appends_of_a_replaced_leader_are_fenced(store_factory) -> None:
    """Issue 15 gap: rank-log writes were not epoch-fenced on Redis (a WATCH/MULTI append
    outside the fenced Lua scripts), so a frozen old leader could still add output after a
    standby took over. Now an append checks the lease epoch inside its transaction."""
    import time

    import pytest

    from broker.store.base import Fenced

    old, new = store_factory(), store_factory()
    e_old = old.acquire_lease_epoch("leader", "old", ttl_s=0.3)
    old.fence_writes("leader", e_old)
    assert old.append_logs("j-1", chunk(["a"], 0), BIG) == 2  # while it leads: stored
    deadline = time.monotonic() + 30
    while not (e_new := new.acquire_lease_epoch("leader", "new", ttl_s=30)):
        assert time.monotonic() < deadline, "lease never expired"
        time.sleep(0.05)
    new.fence_writes("leader", e_new)
    with pytest.raises(Fenced):
        old.append_logs("j-1", chunk(["late"], 2), BIG)
    assert texts(new) == ["a"]
    assert {o.end_offset for o in new.log_offsets("j-1")} == {2}
    assert new.append_logs("j-1", chunk(["b"], 2), BIG) == 4  # the new leader appends
    assert texts(new) == ["a", "b"]
