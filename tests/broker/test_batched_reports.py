"""The one batching loop API workers and front-ends announce their creations with."""

from __future__ import annotations

import threading
import time

from broker.api.batched_reports import BatchedReports
from computebroker.v1 import common_pb2 as pb


class Flaky(Exception):
    pass


class Recorder(BatchedReports):
    retryable = (Flaky,)

    def __init__(self, beat_s: float, fail_first: int = 0) -> None:
        super().__init__(beat_s)
        self.batches: list[list[str]] = []
        self.fail_left = fail_first
        self.dropped_batches: list[list[str]] = []

    def send(self, batch: list[pb.Job]) -> None:
        if self.fail_left:
            self.fail_left -= 1
            raise Flaky("receiver busy")
        self.batches.append([j.id for j in batch])

    def dropped(self, batch: list[pb.Job], error: BaseException) -> None:
        self.dropped_batches.append([j.id for j in batch])


def run(rep: Recorder) -> threading.Thread:
    t = threading.Thread(target=rep.run, daemon=True)
    t.start()
    return t


def wait_for(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_jobs_are_reported_once_each_and_an_idle_sender_beats():
    rep = Recorder(beat_s=0.2)
    t = run(rep)
    for i in range(50):
        rep.add(pb.Job(id=f"j{i}"))
    wait_for(lambda: rep.sent == 50)
    reported = [j for b in rep.batches for j in b]
    assert reported == [f"j{i}" for i in range(50)]  # each once, in order
    beats_before = sum(1 for b in rep.batches if not b)
    wait_for(lambda: sum(1 for b in rep.batches if not b) >= beats_before + 2)
    rep.close()
    t.join(5)
    assert not t.is_alive()


def test_a_busy_receiver_gets_the_batch_again_and_nothing_is_lost():
    rep = Recorder(beat_s=5.0, fail_first=2)
    t = run(rep)
    rep.add(pb.Job(id="a"))
    wait_for(lambda: rep.sent == 1)
    assert rep.batches == [["a"]] and rep.fail_left == 0
    rep.close()
    t.join(5)


def test_a_batch_that_cannot_be_sent_while_stopping_is_dropped_and_said():
    rep = Recorder(beat_s=5.0, fail_first=10**6)
    rep.add(pb.Job(id="x"))
    rep.close()  # closed before the loop runs: one try, then dropped
    t = run(rep)
    t.join(5)
    assert not t.is_alive()
    assert rep.dropped_batches == [["x"]] and rep.sent == 0
