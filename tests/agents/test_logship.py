"""LogShipper unit tests: batching into line-aligned chunks, the rate and backlog
bounds, final flush with the partial last line, and resend from the broker's offset."""

from __future__ import annotations

from pathlib import Path

from computebroker.v1 import logs_pb2 as lpb
from region_agents.logship import LogShipper, LogSource


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def setup(tmp_path: Path, **kw) -> tuple[LogShipper, Path, Path, Clock]:
    clock = Clock()
    kw.setdefault("interval_s", 0.0)  # every poll reads, unless a test is about batching
    shipper = LogShipper(clock=clock, wall=lambda: 5.0, **kw)
    out, err = tmp_path / "rank-0.stdout", tmp_path / "rank-1.stderr"
    out.write_bytes(b"")
    err.write_bytes(b"")
    shipper.track("j-1", 2, [LogSource(0, "stdout", out), LogSource(1, "stderr", err)])
    return shipper, out, err, clock


def texts(chunks: list[lpb.LogChunk]) -> list[str]:
    return [line for c in chunks for line in c.lines]


def test_complete_lines_batched_with_offsets(tmp_path: Path) -> None:
    shipper, out, err, _ = setup(tmp_path)
    out.write_bytes(b"step 1\nstep 2\nhalf")
    err.write_bytes("é warn\n".encode())
    chunks = shipper.poll()
    assert [(c.rank, c.stream, c.offset, list(c.lines), list(c.sizes)) for c in chunks] == [
        (0, "stdout", 0, ["step 1", "step 2"], [7, 7]), (1, "stderr", 0, ["é warn"], [8])]
    assert all(c.job_id == "j-1" and c.attempt == 2 and c.time == 5.0 for c in chunks)
    assert shipper.poll() == []  # "half" waits for its newline
    with open(out, "ab") as f:
        f.write(b" done\n")
    (c,) = shipper.poll()
    assert (c.offset, list(c.lines)) == (14, ["half done"])


def test_flush_ships_partial_last_line_then_forgets_later(tmp_path: Path) -> None:
    shipper, out, _, clock = setup(tmp_path, keep_finished_s=10)
    out.write_bytes(b"a\nno newline")
    chunks = shipper.flush("j-1", 2)
    assert texts(chunks) == ["a", "no newline"]
    assert [list(c.sizes) for c in chunks] == [[2], [10]]  # the last one has no newline
    assert shipper.flush("j-1", 2) == [] and shipper.poll() == []
    clock.t += 11
    shipper.poll()
    assert shipper.tracked() == []


def test_rate_bound_spreads_a_noisy_rank_over_time(tmp_path: Path) -> None:
    shipper, out, _, clock = setup(tmp_path, rate_bytes_per_s=1000, max_chunk_bytes=500)
    out.write_bytes(b"".join(b"%09d\n" % i for i in range(1000)))  # 10 kB
    first = shipper.poll()
    shipped = sum(sum(c.sizes) for c in first)
    assert 2000 <= shipped <= 2500  # two seconds of burst, at most one chunk of debt
    assert all(sum(c.sizes) <= 500 for c in first)
    assert shipper.poll() == []  # no time passed: no budget
    clock.t += 1.0
    more = shipper.poll()
    assert 0 < sum(sum(c.sizes) for c in more) <= 1500
    chunks = first + more
    assert texts(chunks) == [f"{i:09d}" for i in range(len(texts(chunks)))]  # in order, whole
    rest = shipper.flush("j-1", 2)  # the end ignores the rate, never the order
    assert texts(chunks + rest) == [f"{i:09d}" for i in range(1000)]


def test_backlog_bound_skips_to_newest_whole_lines(tmp_path: Path) -> None:
    shipper, out, _, _ = setup(tmp_path, max_chunk_bytes=100, max_backlog_bytes=300)
    out.write_bytes(b"".join(b"%09d\n" % i for i in range(100)))  # 1000 bytes
    chunks = shipper.flush("j-1", 2)
    assert chunks[0].offset == 700
    assert texts(chunks) == [f"{i:09d}" for i in range(70, 100)]


def test_rewind_resends_from_the_brokers_offset(tmp_path: Path) -> None:
    shipper, out, err, _ = setup(tmp_path)
    out.write_bytes(b"one\ntwo\nthree\n")
    err.write_bytes(b"oops\n")
    assert texts(shipper.poll()) == ["one", "two", "three", "oops"]
    # Reconnect: the broker has stdout up to "two" and nothing of stderr.
    shipper.rewind([lpb.LogOffset(job_id="j-1", attempt=2, rank=0, stream="stdout", end_offset=8)])
    again = shipper.poll()
    assert sorted((c.stream, c.offset, tuple(c.lines)) for c in again) == [
        ("stderr", 0, ("oops",)), ("stdout", 8, ("three",))]


def test_long_line_without_newline_is_split_not_stuck(tmp_path: Path) -> None:
    shipper, out, _, _ = setup(tmp_path, max_chunk_bytes=100)
    out.write_bytes(b"x" * 250)
    chunks = shipper.poll()
    assert [sum(c.sizes) for c in chunks] == [100, 100]
    assert [c.offset for c in chunks] == [0, 100]


def test_running_attempts_are_read_once_per_interval(tmp_path: Path) -> None:
    shipper, out, _, clock = setup(tmp_path, interval_s=1.0)
    out.write_bytes(b"a\n")
    assert texts(shipper.poll()) == ["a"]
    with open(out, "ab") as f:
        f.write(b"b\n")
    clock.t += 0.5
    assert shipper.poll() == []  # batched until the interval is over
    clock.t += 0.5
    assert texts(shipper.poll()) == ["b"]
    with open(out, "ab") as f:
        f.write(b"c\n")
    assert texts(shipper.flush("j-1", 2)) == ["c"]  # the end does not wait


def test_notified_files_are_read_only_after_a_notify_and_nothing_is_lost(tmp_path: Path) -> None:
    """An executor whose own threads write the rank files (Kubernetes: the pod log
    readers) notifies; the shipper then never looks at an unchanged attempt's files, and
    every line still ships: the first read, each notify, the budget's remainder, a rewind."""
    clock = Clock()
    shipper = LogShipper(clock=clock, wall=lambda: 5.0, interval_s=1.0, rate_bytes_per_s=8)
    out = tmp_path / "rank-0.stdout"
    out.write_bytes(b"rebuilt\n")  # already there when tracked (an agent restart)
    shipper.track("j-1", 1, [LogSource(0, "stdout", out)], notified=True)
    assert texts(shipper.poll()) == ["rebuilt"]
    with open(out, "ab") as f:
        f.write(b"quiet\n")
    clock.t += 5
    assert shipper.poll() == []  # not notified: its files are not even looked at
    shipper.notify("j-1", 1)
    assert texts(shipper.poll()) == ["quiet"]
    with open(out, "ab") as f:  # more than the budget (16 bytes a turn): two turns
        f.write(b"aaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbb\nccc\n")
    shipper.notify("j-1", 1)
    clock.t += 5
    first = texts(shipper.poll())
    clock.t += 0.5
    assert shipper.poll() == []  # within its interval: it keeps its turn for later
    clock.t += 5
    second = texts(shipper.poll())
    clock.t += 5
    third = texts(shipper.poll())
    assert first + second + third == ["aaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbb", "ccc"], (first, second, third)
    clock.t += 5
    assert shipper.poll() == []  # all read: nothing without a new notify
    shipper.rewind([lpb.LogOffset(job_id="j-1", attempt=1, rank=0, stream="stdout", end_offset=8)])
    clock.t += 5
    assert texts(shipper.poll())[:1] == ["quiet"]  # resent from the broker's offset


def test_an_unnotified_attempt_is_read_every_interval(tmp_path: Path) -> None:
    """The local executor's ranks write their files themselves: looked at each interval."""
    shipper, out, _, clock = setup(tmp_path, interval_s=1.0)
    out.write_bytes(b"x\n")
    assert texts(shipper.poll()) == ["x"]
    with open(out, "ab") as f:
        f.write(b"y\n")
    clock.t += 1.0
    assert texts(shipper.poll()) == ["y"]
