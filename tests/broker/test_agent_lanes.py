"""Lanes (broker/api/agent_lanes.py): one agent stream's job messages in flight at once,
in the order sent per job; drain() waits for all of them; close() loses nothing.

Why: each job message waits for its store commit; applied one at a time per stream a
busy agent's reports fell a minute behind (benchmarks/bench_running.py). Real threads,
a real slow "commit" (a sleep standing in for the fsync), no mocks of the lanes."""

from __future__ import annotations

import threading
import time

from broker.api.agent_lanes import Lanes


def test_messages_of_one_job_stay_in_order_while_jobs_overlap() -> None:
    done: dict[str, list[int]] = {}
    lock = threading.Lock()
    in_flight = 0
    most = 0

    def run(item: object) -> None:
        nonlocal in_flight, most
        job, n = item  # type: ignore[misc]
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.01)  # a commit
        with lock:
            in_flight -= 1
            done.setdefault(job, []).append(n)

    lanes = Lanes(run, "test", lanes=8)
    t0 = time.monotonic()
    for n in range(10):
        for j in range(16):
            lanes.put(f"job-{j}", (f"job-{j}", n))
    lanes.drain()
    took = time.monotonic() - t0
    assert set(done) == {f"job-{j}" for j in range(16)}
    assert all(v == list(range(10)) for v in done.values()), done  # per job: as sent
    assert most > 1  # jobs overlapped ...
    assert took < 160 * 0.01  # ... so 160 commits took less than one after another
    lanes.close()


def test_drain_waits_and_close_finishes_what_was_put() -> None:
    ran: list[int] = []
    gate = threading.Event()

    def run(item: object) -> None:
        gate.wait(10)
        ran.append(item)  # type: ignore[arg-type]

    lanes = Lanes(run, "test", lanes=2)
    for i in range(4):
        lanes.put("one-job", i)
    waiter = threading.Thread(target=lanes.drain)
    waiter.start()
    time.sleep(0.1)
    assert waiter.is_alive() and ran == []  # drain() waits for the four
    gate.set()
    waiter.join(10)
    assert not waiter.is_alive() and ran == [0, 1, 2, 3]
    lanes.put("one-job", 4)
    lanes.close()  # after close, what was put still runs
    deadline = time.monotonic() + 10
    while ran != [0, 1, 2, 3, 4] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [0, 1, 2, 3, 4]


def test_a_failing_message_does_not_stop_its_lane() -> None:
    ran: list[int] = []

    def run(item: object) -> None:
        if item == 1:
            raise RuntimeError("one bad message")
        ran.append(item)  # type: ignore[arg-type]

    lanes = Lanes(run, "test", lanes=1)
    for i in range(3):
        lanes.put("j", i)
    lanes.drain()
    assert ran == [0, 2]
    lanes.close()


def test_a_barrier_sees_every_earlier_message_and_no_later_one_and_does_not_block_the_caller() -> None:
    """A heartbeat is a barrier: applied after all that came before it and before all
    that came after it, in every lane; the stream's reader hands it over and reads on
    (waiting for the lanes had the leader declare a busy agent lost)."""
    applied: list[tuple[str, int]] = []
    lock = threading.Lock()
    gate = threading.Event()

    def run(item: object) -> None:
        job, n = item  # type: ignore[misc]
        if n == 0:
            gate.wait(10)  # the first commit is slow: every lane backs up behind it
        with lock:
            applied.append((job, n))

    lanes = Lanes(run, "test", lanes=4)
    for j in range(8):
        lanes.put(f"job-{j}", (f"job-{j}", 0))
    seen_at_barrier: list[tuple[str, int]] = []

    def heartbeat() -> None:
        with lock:
            seen_at_barrier.extend(applied)

    t0 = time.monotonic()
    lanes.barrier(heartbeat)
    for j in range(8):
        lanes.put(f"job-{j}", (f"job-{j}", 1))
    assert time.monotonic() - t0 < 0.5, "the caller waited for the lanes"
    time.sleep(0.1)
    assert not seen_at_barrier and not applied  # still held behind the slow commits
    gate.set()
    lanes.drain()
    assert sorted(seen_at_barrier) == [(f"job-{j}", 0) for j in range(8)]  # all before, none after
    assert sorted(applied) == sorted([(f"job-{j}", n) for j in range(8) for n in (0, 1)])
    lanes.close()


def test_a_failing_barrier_does_not_stop_the_lanes() -> None:
    ran: list[int] = []

    def boom() -> None:
        raise RuntimeError("bad heartbeat")

    lanes = Lanes(lambda item: ran.append(item), "test", lanes=3)  # type: ignore[arg-type, func-returns-value]
    lanes.put("a", 1)
    lanes.barrier(boom)
    lanes.put("a", 2)
    lanes.barrier(lambda: ran.append(3))
    lanes.drain()
    assert ran == [1, 2, 3]
    lanes.close()


def test_wait_below_is_the_readers_backpressure() -> None:
    """A leader behind on its writes stops reading (gRPC flow control keeps the rest in
    the agent) rather than buffering a whole fleet's reports in memory."""
    gate = threading.Event()
    lanes = Lanes(lambda item: gate.wait(10), "test", lanes=2)
    for i in range(6):
        lanes.put(f"job-{i}", i)
    t0 = time.monotonic()
    assert not lanes.wait_below(4, 0.2)  # full: the reader would wait (and keep the agent seen)
    assert time.monotonic() - t0 >= 0.2
    assert lanes.wait_below(10, 0.2)  # room
    gate.set()
    assert lanes.wait_below(1, 5.0)
    lanes.close()
