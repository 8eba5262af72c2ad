"""Rank logs in Redis (mixed into ``RedisStore``; see ``Store.append_logs``).

Keys (under the store prefix): ``logoff:<job>`` hash "attempt:rank:stream" -> stored
end offset; ``logmeta:<job>:<attempt>`` hash bytes / last_seq / dropped;
``loglines:<job>:<attempt>`` list of serialized ``LogLine`` (with seq). Seqs are
contiguous and only the head is ever trimmed, so the line with seq ``s`` sits at
index ``s - dropped - 1``.

Why an optimistic WATCH/MULTI transaction and not a Lua script like job writes: the
dedup and accounting rules live in Python (``logs_common``) shared with SQLite, and
an append is idempotent by construction (offset dedup), so the store's transient-error
retry may safely repeat it.

Leader fencing (docs/contracts.md §9): like every other store write, an append is
refused with ``Fenced`` once another broker was granted the lease. The lease's epoch key
is WATCHed with the log keys and compared inside the transaction, so a grant between
the check and EXEC aborts the EXEC (redis-py re-runs ``tx``, which then sees the new
epoch): a frozen old leader cannot add rank output after a standby took over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import redis

from broker.store import logs_common as lc
from computebroker.v1 import logs_pb2 as lpb

T = TypeVar("T")
_HEAD_BATCH = 256


class RedisLogs:
    """``append_logs`` / ``log_offsets`` / ``read_logs`` over the store's client."""

    _r: redis.Redis
    _k: Callable[..., str]
    _call: Callable[[Callable[[], Any]], Any]
    _fence: tuple[str, str]
    _fenced: Callable[[], Exception]

    def append_logs(self, job_id: str, chunk: lpb.LogChunk, max_bytes: int) -> int:
        off_k = self._k("logoff", job_id)
        meta_k = self._k("logmeta", job_id, str(chunk.attempt))
        list_k = self._k("loglines", job_id, str(chunk.attempt))
        field = lc.stream_key(chunk.attempt, chunk.rank, chunk.stream)
        result: list[int] = []
        fence_key, epoch = self._fence
        stale: list[bool] = []

        def tx(pipe: redis.client.Pipeline) -> None:
            if fence_key and (pipe.get(fence_key) or b"0").decode() != epoch:
                stale[:] = [True]
                return  # nothing queued: EXEC of an empty MULTI-less tx writes nothing
            raw_end = pipe.hget(off_k, field)
            stored_end = int(raw_end) if raw_end is not None else 0
            fresh = lc.fresh_lines(chunk, stored_end)
            result[:] = [fresh.end]
            if fresh.end == stored_end and not fresh.lines:
                return
            meta = pipe.hmget(meta_k, "bytes", "last_seq", "dropped")
            total, last_seq, dropped = (int(v) if v is not None else 0 for v in meta)
            last_seq = lc.number(fresh.lines, last_seq)
            total += sum(lc.line_cost(ln) for ln in fresh.lines)
            cut = 0
            while total > max_bytes:  # cost of the oldest stored lines, in batches
                head = pipe.lrange(list_k, cut, cut + _HEAD_BATCH - 1)
                if not head:
                    break
                for data in head:
                    if total <= max_bytes:
                        break
                    total -= lc.line_cost(lpb.LogLine.FromString(data))
                    cut += 1
                if len(head) < _HEAD_BATCH:
                    break
            pending = list(fresh.lines)
            while total > max_bytes and pending:  # a single chunk bigger than the bound
                total -= lc.line_cost(pending.pop(0))
                cut += 1
            stored_cut = min(cut, int(pipe.llen(list_k)))
            new_cut = cut - stored_cut
            pipe.multi()
            pipe.hset(off_k, field, fresh.end)
            if pending:
                pipe.rpush(list_k, *(ln.SerializeToString() for ln in pending))
            if stored_cut:
                pipe.ltrim(list_k, stored_cut, -1)
            pipe.hset(meta_k, mapping={"bytes": total, "last_seq": last_seq,
                                       "dropped": dropped + stored_cut + new_cut})

        watched = (off_k, meta_k, list_k, *((fence_key,) if fence_key else ()))
        self._call(lambda: self._r.transaction(tx, *watched))
        if stale:
            raise self._fenced()
        return result[0]

    def log_offsets(self, job_id: str) -> list[lpb.LogOffset]:
        raw = self._call(lambda: self._r.hgetall(self._k("logoff", job_id)))
        items = sorted((k.decode(), int(v)) for k, v in raw.items())
        return [lc.parse_stream_key(job_id, k, end) for k, end in items]

    def read_logs(self, job_id: str, attempt: int, after_seq: int = 0) -> tuple[list[lpb.LogLine], int]:
        meta_k = self._k("logmeta", job_id, str(attempt))
        list_k = self._k("loglines", job_id, str(attempt))
        guess = 0
        for _ in range(10):  # a trim between our two reads shifts indexes: read again
            start = max(0, after_seq - guess)

            def read(start: int = start) -> list[Any]:
                pipe = self._r.pipeline(transaction=True)
                pipe.hget(meta_k, "dropped")
                pipe.lrange(list_k, start, -1)
                return pipe.execute()

            raw_dropped, raw = self._call(read)
            dropped = int(raw_dropped) if raw_dropped is not None else 0
            if dropped == guess:
                lines = [lpb.LogLine.FromString(d) for d in raw]
                return [ln for ln in lines if ln.seq > after_seq], dropped
            guess = dropped
        raise redis.RedisError(f"logs of {job_id} attempt {attempt} keep being trimmed")
