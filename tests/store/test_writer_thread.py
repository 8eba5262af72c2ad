"""The group writer's own thread (broker/store/group_commit.py): once a group is being
written, everything that queues meanwhile is written by the writer thread, which keeps
writing while the queue is non-empty; no member thread is ever handed the lead; nothing
is answered before its write returned; a member's own error stays its own.

Deterministic: the first write is held on an event until the others have queued, never
timed; each test takes well under a second."""

from __future__ import annotations

import threading
import time

from broker.store.group_commit import GroupWriter

WAIT_S = 30.0


class Recorder:
    """``write`` for a GroupWriter: records each group and the thread that wrote it;
    the first group is held until ``release`` is set (so the others queue behind it)."""

    def __init__(self, hold_first: bool = True) -> None:
        self.groups: list[tuple[str, list[int]]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.hold_first = hold_first
        self.returned: set[int] = set()  # items whose write has returned
        self.lock = threading.Lock()

    def __call__(self, items: list[int]) -> list[object]:
        first = not self.groups
        self.groups.append((threading.current_thread().name, list(items)))
        if first and self.hold_first:
            self.entered.set()
            assert self.release.wait(WAIT_S)
        out: list[object] = [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]
        with self.lock:
            self.returned.update(items)
        return out


def _queue_len(w: GroupWriter) -> int:
    with w._lock:  # noqa: SLF001 - the test's view of the queue
        return len(w._queue)  # noqa: SLF001


def _wait(cond, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


def test_what_queues_during_a_write_is_written_by_the_writer_thread_in_one_group() -> None:
    rec = Recorder()
    w: GroupWriter[int, int] = GroupWriter(rec, name="test-writer")
    results: dict[int, object] = {}
    seen_before_return: list[int] = []

    def caller(i: int) -> None:
        try:
            results[i] = w.submit(i)
        except ValueError as e:
            results[i] = e
        with rec.lock:
            if i not in rec.returned:
                seen_before_return.append(i)

    first = threading.Thread(target=caller, args=(0,), name="caller-0")
    first.start()
    assert rec.entered.wait(WAIT_S)
    others = [threading.Thread(target=caller, args=(i,), name=f"caller-{i}") for i in range(1, 21)]
    for t in others:
        t.start()
    _wait(lambda: _queue_len(w) == 20, "the other callers never queued")
    rec.release.set()
    for t in [first, *others]:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in [first, *others])
    # the idle writer's first caller wrote its own group; the rest went to the writer
    # thread as one group (no member was handed the lead)
    assert rec.groups[0] == ("caller-0", [0])
    assert rec.groups[1] == ("test-writer", list(range(1, 21)))
    assert len(rec.groups) == 2 and w.groups == 2 and w.thread_groups == 1 and w.members == 21
    assert not seen_before_return  # nobody was answered before its write returned
    for i in range(21):  # each member its own result or its own error
        if i % 2:
            assert isinstance(results[i], ValueError) and str(results[i]) == f"odd {i}"
        else:
            assert results[i] == i * 10
    w.close()


def test_the_writer_thread_keeps_writing_while_writes_keep_queueing() -> None:
    """Groups are written back to back by the one thread: members that queue while the
    thread writes a group go in its next group, still on the thread."""
    w: GroupWriter[int, int]
    more = threading.Event()
    extra: list[threading.Thread] = []
    results: dict[int, object] = {}

    def write(items: list[int]) -> list[object]:
        names.append((threading.current_thread().name, list(items)))
        if items == list(range(1, 6)):  # the thread's first group: more queue meanwhile
            for i in range(100, 105):
                t = threading.Thread(target=lambda i=i: results.__setitem__(i, w.submit(i)))
                t.start()
                extra.append(t)
            _wait(lambda: len(w._queue) == 5, "the extra writes never queued")  # noqa: SLF001
        if items == [0]:
            assert more.wait(WAIT_S)
        return [i for i in items]

    names: list[tuple[str, list[int]]] = []
    w = GroupWriter(write, name="test-writer")
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, w.submit(i))) for i in range(6)]
    threads[0].start()
    _wait(lambda: names, "the first write never started")
    for t in threads[1:]:
        t.start()
    _wait(lambda: _queue_len(w) == 5, "the callers never queued")
    more.set()
    for t in threads:
        t.join(WAIT_S)
    _wait(lambda: len(extra) == 5, "the extra threads never started")
    for t in extra:
        t.join(WAIT_S)
    assert [n for n, _ in names] == [names[0][0], "test-writer", "test-writer"]
    assert [g for _, g in names] == [[0], [1, 2, 3, 4, 5], [100, 101, 102, 103, 104]]
    assert results == {i: i for i in [*range(6), *range(100, 105)]}
    w.close()


def test_a_whole_write_failing_reaches_every_member_of_that_group_only() -> None:
    calls = 0
    gate = threading.Event()

    def write(items: list[int]) -> list[object]:
        nonlocal calls
        calls += 1
        if calls == 1:
            assert gate.wait(WAIT_S)
            return list(items)
        if calls == 2:
            raise OSError("disk gone")
        return list(items)

    w: GroupWriter[int, int] = GroupWriter(write, name="test-writer")
    out: dict[int, object] = {}

    def caller(i: int) -> None:
        try:
            out[i] = w.submit(i)
        except OSError as e:
            out[i] = e

    ts = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    ts[0].start()
    _wait(lambda: calls == 1, "the first write never started")
    for t in ts[1:]:
        t.start()
    _wait(lambda: _queue_len(w) == 3, "the callers never queued")
    gate.set()
    for t in ts:
        t.join(WAIT_S)
    assert out[0] == 0
    assert all(isinstance(out[i], OSError) for i in (1, 2, 3))
    assert w.submit(7) == 7  # the writer is idle again and works
    w.close()


def test_close_ends_the_writer_thread_and_a_later_write_still_works() -> None:
    gate = threading.Event()

    def write(items: list[int]) -> list[object]:
        if items == [0]:
            assert gate.wait(WAIT_S)
        return list(items)

    w: GroupWriter[int, int] = GroupWriter(write, name="test-writer-close")
    first = threading.Thread(target=w.submit, args=(0,))
    first.start()
    _wait(lambda: _queue_len(w) == 0 and w._busy, "the first write never started")  # noqa: SLF001
    second = threading.Thread(target=w.submit, args=(1,))
    second.start()
    _wait(lambda: _queue_len(w) == 1, "the second write never queued")
    gate.set()
    first.join(WAIT_S)
    second.join(WAIT_S)

    def writer_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "test-writer-close"]

    _wait(lambda: len(writer_threads()) == 1 and not w._busy, "the writer thread never started")  # noqa: SLF001
    w.close()
    _wait(lambda: not writer_threads(), "close() did not end the writer thread")
    assert w.submit(2) == 2


def test_groups_are_bounded_and_nothing_is_lost() -> None:
    n = 300
    sizes: list[int] = []
    gate = threading.Event()

    def write(items: list[int]) -> list[object]:
        if not sizes:
            assert gate.wait(WAIT_S)
        sizes.append(len(items))
        return list(items)

    w: GroupWriter[int, int] = GroupWriter(write, max_group=64, name="test-writer")
    out: list[int] = []
    lock = threading.Lock()

    def caller(i: int) -> None:
        r = w.submit(i)
        with lock:
            out.append(r)

    ts = [threading.Thread(target=caller, args=(i,)) for i in range(n)]
    ts[0].start()
    _wait(lambda: w._busy, "the first write never started")  # noqa: SLF001
    for t in ts[1:]:
        t.start()
    _wait(lambda: _queue_len(w) == n - 1, "the callers never queued")
    gate.set()
    for t in ts:
        t.join(WAIT_S)
    assert sorted(out) == list(range(n))
    assert sizes[0] == 1 and max(sizes) == 64 and sum(sizes) == n
    w.close()
