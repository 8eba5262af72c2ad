"""The store-independent half of ``Store.append_logs``: what of a chunk is new.

Why shared: SQLite and Redis must agree exactly on dedup and accounting, or the
conformance tests (and a broker moved from one store to the other) would see
different lines. Each store only supplies atomic read-modify-write around these.
"""

from __future__ import annotations

from dataclasses import dataclass

from computebroker.v1 import logs_pb2 as lpb


def line_cost(line: lpb.LogLine) -> int:
    """Bytes a stored line counts against the per-attempt bound (its text + newline)."""
    return len(line.text.encode("utf-8")) + 1


def stream_key(attempt: int, rank: int, stream: str) -> str:
    """One (attempt, rank, stream) as a flat key: ``"3:0:stdout"``."""
    return f"{attempt}:{rank}:{stream}"


def parse_stream_key(job_id: str, key: str, end: int) -> lpb.LogOffset:
    attempt, rank, stream = key.split(":", 2)
    return lpb.LogOffset(job_id=job_id, attempt=int(attempt), rank=int(rank), stream=stream,
                         end_offset=end)


@dataclass
class Fresh:
    """The lines of a chunk to store (without seq) and the stream's new end offset."""

    lines: list[lpb.LogLine]
    end: int


def fresh_lines(chunk: lpb.LogChunk, stored_end: int) -> Fresh:
    """Skip lines the store already has (offset dedup); mark a gap if bytes are missing."""
    out: list[lpb.LogLine] = []
    pos = chunk.offset
    if pos > stored_end:
        out.append(lpb.LogLine(
            attempt=chunk.attempt, rank=chunk.rank, stream=chunk.stream, time=chunk.time,
            text=f"… {pos - stored_end} bytes not shipped (agent backlog bound)"))
    end = stored_end
    for i, text in enumerate(chunk.lines):
        size = chunk.sizes[i] if i < len(chunk.sizes) else len(text.encode("utf-8")) + 1
        line_end = pos + max(0, size)
        if line_end > end:
            if pos >= end:
                out.append(lpb.LogLine(attempt=chunk.attempt, rank=chunk.rank,
                                       stream=chunk.stream, time=chunk.time, text=text))
            end = line_end
        pos = line_end
    return Fresh(out, end)


def number(lines: list[lpb.LogLine], last_seq: int) -> int:
    """Give ``lines`` the seqs after ``last_seq``; return the new last seq."""
    for line in lines:
        last_seq += 1
        line.seq = last_seq
    return last_seq
