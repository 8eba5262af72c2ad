"""The Redis store's write group (broker/store/redis_batch.py) on a real primary with a
real replica: concurrent writes share one pipeline and ONE ``WAIT`` (counted by the
server's own ``INFO commandstats``), a member whose script fails fails alone, a replica
that stops acknowledging makes the whole group UNAVAILABLE with nothing acknowledged,
and concurrent writers keep each job's order.

How a group is formed on purpose: ``CLIENT PAUSE ... WRITE`` on the primary holds the
first writer's pipeline on the server; writers that come meanwhile queue behind it and
go out together, as one group, once the pause is lifted.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from broker.store.base import AlreadyExists, NotFound, StoreUnavailable, VersionConflict
from broker.store.redis import RedisStore
from broker.store.sqlite import SQLiteStore
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import logs_pb2 as lpb
from tests.fixtures.redis_server import RedisServer, start_redis, stop_redis


@dataclass
class Pair:
    primary: RedisServer
    replica: RedisServer

    def url(self, **options: object) -> str:
        opts = {"prefix": f"g{uuid.uuid4().hex[:10]}", **options}
        return self.primary.url + "?" + "&".join(f"{k}={v}" for k, v in opts.items())


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("redis-pair")
    primary = start_redis(work, extra_args=("--repl-diskless-sync-delay", "0"))
    replica = start_redis(work, extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
    try:
        r = redis.Redis(port=replica.port)
        deadline = time.monotonic() + 30
        while r.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        r.close()
        yield Pair(primary, replica)
    finally:
        stop_redis(replica)
        stop_redis(primary)


def _waits(port: int) -> int:
    """WAIT commands the server ran (its own count)."""
    stats = redis.Redis(port=port).info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def _job(job_id: str) -> pb.Job:
    return pb.Job(id=job_id, spec=pb.JobSpec(team="ml", name=job_id))


def _ev(text: str) -> pb.JobEvent:
    return pb.JobEvent(type="progress", message=text)


def _one_group(port: int, first: Callable[[], object],
               rest: list[Callable[[], object]]) -> list[object]:
    """Run ``first`` while the primary holds writes, queue ``rest`` behind it, lift the
    pause: ``rest`` goes out as one group. Returns each call's result or exception."""
    admin = redis.Redis(port=port)
    results: list[object] = [None] * (1 + len(rest))

    def run(i: int, fn: Callable[[], object]) -> None:
        try:
            results[i] = fn()
        except Exception as e:  # noqa: BLE001 - the test reads each member's outcome
            results[i] = e

    admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
    threads = [threading.Thread(target=run, args=(0, first))]
    threads[0].start()
    time.sleep(0.2)  # the first pipeline is on the server, held
    for i, fn in enumerate(rest, 1):
        t = threading.Thread(target=run, args=(i, fn))
        t.start()
        threads.append(t)
        time.sleep(0.02)  # queue order = list order
    time.sleep(0.3)
    admin.execute_command("CLIENT", "UNPAUSE")
    for t in threads:
        t.join(30)
    admin.close()
    return results


def test_members_fail_alone_and_the_group_waits_once(pair: Pair) -> None:
    store = RedisStore(pair.url(min_replicas=1, replica_wait_ms=2000))
    try:
        a = store.create_job(_job("a"))
        b = store.create_job(_job("b"))
        before_waits, before_groups = _waits(pair.primary.port), store._writes.groups
        res = _one_group(pair.primary.port, lambda: store.update_job(a, 1, [_ev("a1")]), [
            lambda: store.update_job(a, 1),  # a is at 2 by then: a conflict, alone
            lambda: store.update_job(_job("nope"), 1),  # no such job, alone
            lambda: store.update_job(b, 1, [_ev("b1")]),
            lambda: store.append_events("b", [_ev("b2")]),
            lambda: store.append_events("nope", [_ev("x")]),
            lambda: store.put_record("note", "k", _ev("rec")),
            lambda: store.create_job(_job("a")),  # a duplicate id, alone
            lambda: store.create_job(_job("c"), [_ev("c1")]),
        ])
        assert isinstance(res[0], pb.Job) and res[0].version == 2
        assert isinstance(res[1], VersionConflict)
        assert isinstance(res[2], NotFound)
        assert isinstance(res[3], pb.Job) and res[3].version == 2
        assert [e.seq for e in res[4]] == [2]  # type: ignore[union-attr]
        assert isinstance(res[5], NotFound)
        assert res[6] is None
        assert isinstance(res[7], AlreadyExists)
        assert isinstance(res[8], pb.Job) and res[8].version == 1
        # two pipelines (the held one, then the other eight together), one WAIT each
        assert store._writes.groups - before_groups == 2
        assert _waits(pair.primary.port) - before_waits == 2
        # what was acknowledged is on the replica
        rep = RedisStore(f"redis://127.0.0.1:{pair.replica.port}/0?prefix={store.prefix}")
        try:
            assert rep.get_job("b").version == 2
            assert [e.message for e in rep.list_events("b")] == ["b1", "b2"]
            assert rep.get_job("c").version == 1
            assert rep.get_record("note", "k", pb.JobEvent).message == "rec"  # type: ignore[union-attr]
        finally:
            rep.close()
    finally:
        store.close()


def test_a_replica_that_stops_acknowledging_fails_the_whole_group(pair: Pair) -> None:
    store = RedisStore(pair.url(min_replicas=1, replica_wait_ms=300))
    try:
        jobs = [store.create_job(_job(f"j{i}")) for i in range(6)]
        os.kill(pair.replica.proc.pid, signal.SIGSTOP)
        try:
            before_groups = store._writes.groups
            res = _one_group(pair.primary.port, lambda: store.update_job(jobs[0], 1), [
                *(lambda j=j: store.update_job(j, 1, [_ev("end")]) for j in jobs[1:]),
                lambda: store.update_job(jobs[0], 7),  # would be a conflict: still UNAVAILABLE
                lambda: store.put_record("note", "k", _ev("rec")),
                lambda: store.create_job(_job("new")),
                lambda: store.confirm_replicated(),
            ])
            # nothing acknowledged: every member of both groups is UNAVAILABLE
            assert all(isinstance(r, StoreUnavailable) for r in res), res
            assert all("replica did not confirm" in str(r) for r in res)
            assert store._writes.groups - before_groups == 2
        finally:
            os.kill(pair.replica.proc.pid, signal.SIGCONT)
        # With the replica back, writes are acknowledged again (a retried update re-reads).
        deadline = time.monotonic() + 30
        while True:
            try:
                cur = store.get_job("j1")
                assert store.update_job(cur, cur.version).version == cur.version + 1
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        store.close()


def test_concurrent_writers_keep_each_jobs_order(pair: Pair) -> None:
    """8 writers each updating their own job 25 times (an event each), 8 more racing on
    one shared job with compare-and-set retries: every job's versions and events are in
    the order they were acknowledged, and every group waited once."""
    store = RedisStore(pair.url(min_replicas=1, replica_wait_ms=5000))
    try:
        own = [store.create_job(_job(f"own{i}")) for i in range(8)]
        store.create_job(_job("shared"))
        before_waits, before_groups = _waits(pair.primary.port), store._writes.groups
        acked: dict[str, list[int]] = {"shared": []}
        lock = threading.Lock()
        errors: list[BaseException] = []

        def mine(job: pb.Job) -> None:
            for n in range(25):
                job = store.update_job(job, job.version, [_ev(f"{job.id}:{n}")])

        def shared(w: int) -> None:
            for _ in range(8):
                while True:
                    cur = store.get_job("shared")
                    try:
                        stored = store.update_job(cur, cur.version, [_ev(f"v{cur.version + 1}")])
                    except VersionConflict:
                        continue
                    with lock:
                        acked["shared"].append(stored.version)
                    break

        def guard(fn: Callable[[], None]) -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=guard, args=(lambda j=j: mine(j),)) for j in own]
        threads += [threading.Thread(target=guard, args=(lambda w=w: shared(w),)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for j in own:
            assert store.get_job(j.id).version == 26
            assert [e.message for e in store.list_events(j.id)] == [f"{j.id}:{n}" for n in range(25)]
            assert [e.seq for e in store.list_events(j.id)] == list(range(1, 26))
        assert sorted(acked["shared"]) == list(range(2, 66))  # 64 acknowledged, none twice
        assert store.get_job("shared").version == 65
        assert [e.message for e in store.list_events("shared")] == [f"v{v}" for v in range(2, 66)]
        groups = store._writes.groups - before_groups
        assert _waits(pair.primary.port) - before_waits == groups  # one WAIT a group
        assert groups <= 8 * 25 + 64  # never more than one a write
    finally:
        store.close()


def test_without_replicas_a_group_is_one_round_trip_and_no_wait(redis_server: RedisServer,
                                                                tmp_path: Path) -> None:
    store = RedisStore(f"{redis_server.url}?prefix=n{uuid.uuid4().hex[:10]}")
    try:
        a = store.create_job(_job("a"))
        before = _waits(redis_server.port)
        res = _one_group(redis_server.port, lambda: store.update_job(a, 1), [
            lambda: store.update_job(a, 1),
            lambda: store.create_job(_job("b")),
        ])
        assert isinstance(res[0], pb.Job) and isinstance(res[1], VersionConflict)
        assert isinstance(res[2], pb.Job)
        assert _waits(redis_server.port) == before and store._writes.waits == 0
    finally:
        store.close()


def test_a_server_without_the_scripts_loads_them_and_writes_once(redis_server: RedisServer) -> None:
    """NOSCRIPT (a restarted or promoted server has an empty script cache): the members
    that met it are sent again after loading; each is written once."""
    store = RedisStore(f"{redis_server.url}?prefix=s{uuid.uuid4().hex[:10]}")
    try:
        a = store.create_job(_job("a"), [_ev("e1")])
        redis.Redis(port=redis_server.port).script_flush()
        assert store.update_job(a, 1, [_ev("e2")]).version == 2
        assert [e.message for e in store.list_events("a")] == ["e1", "e2"]
        assert store.get_job("a").version == 2
    finally:
        store.close()


def _chunk(rank: int, offset: int, lines: list[str], attempt: int = 1) -> lpb.LogChunk:
    return lpb.LogChunk(job_id="L", attempt=attempt, rank=rank, stream="stdout", offset=offset,
                        lines=lines, sizes=[len(x.encode()) + 1 for x in lines])


# (chunk, bound): continuing offsets, a resend, a gap, another rank, another attempt, and
# chunks that push attempt 1 over its bound (trimmed the careful way) with one after them
_CHUNKS = [
    (_chunk(0, 0, ["a1", "a2"]), 1 << 20),
    (_chunk(0, 6, ["a3"]), 1 << 20),
    (_chunk(0, 0, ["a1", "a2", "a3", "a4"]), 1 << 20),  # a resend: only a4 is new
    (_chunk(1, 0, ["b1"]), 1 << 20),
    (_chunk(0, 20, ["a6"]), 1 << 20),  # a gap: marked
    (_chunk(0, 0, ["x1"], attempt=2), 1 << 20),
    (_chunk(1, 3, ["b2" * 20]), 40),  # over the bound: the oldest lines go
    (_chunk(1, 44, ["b3"]), 40),
]


def _logs_of(store: object) -> tuple:
    out = []
    for attempt in (1, 2):
        lines, dropped = store.read_logs("L", attempt)  # type: ignore[attr-defined]
        out.append(([(ln.seq, ln.rank, ln.text) for ln in lines], dropped))
    offs = [(o.attempt, o.rank, o.stream, o.end_offset) for o in store.log_offsets("L")]  # type: ignore[attr-defined]
    return tuple(out), offs


def test_log_chunks_in_one_group_store_what_one_at_a_time_does(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """The group's log chunks are planned together (later chunks of an attempt see what
    earlier ones will write) and must store exactly what SQLite, one chunk at a time,
    stores: the same lines, seqs, dropped counts and offsets, the same ends returned."""
    ref = SQLiteStore(str(tmp_path / "ref.sqlite"))
    store = RedisStore(f"{redis_server.url}?prefix=l{uuid.uuid4().hex[:10]}")
    try:
        want_ends = [ref.append_logs("L", c, bound) for c, bound in _CHUNKS]
        first, *rest = [lambda c=c, b=b: store.append_logs("L", c, b) for c, b in _CHUNKS]
        before = store._writes.groups
        got_ends = _one_group(redis_server.port, first, rest)
        assert store._writes.groups - before == 2
        assert got_ends == want_ends
        assert _logs_of(store) == _logs_of(ref)
    finally:
        store.close()
        ref.close()


def test_a_log_chunk_whose_stream_moved_after_its_plan_is_written_the_careful_way(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another writer appends between the group's read and its write: the chunk's
    LOGPUT refuses (the offsets moved) and the chunk is written again from what is
    stored, so each line is still stored once."""
    url = f"{redis_server.url}?prefix=m{uuid.uuid4().hex[:10]}"
    store, other = RedisStore(url), RedisStore(url)
    ref = SQLiteStore(str(tmp_path / "ref.sqlite"))
    try:
        plan = store._writes._plan
        interloped: list[int] = []

        def plan_then_interlope(group: list) -> list:
            commands = plan(group)
            if not interloped:  # the other store writes the stream after our read
                interloped.append(other.append_logs("L", _chunk(0, 0, ["a1", "a2", "a3"]), 1 << 20))
            return commands

        monkeypatch.setattr(store._writes, "_plan", plan_then_interlope)
        assert store.append_logs("L", _chunk(0, 0, ["a1", "a2"]), 1 << 20) == 9  # a1+a2+a3 stored
        assert interloped == [9]
        for c in (_chunk(0, 0, ["a1", "a2", "a3"]),):
            ref.append_logs("L", c, 1 << 20)
        assert _logs_of(store) == _logs_of(ref)
    finally:
        store.close()
        other.close()
        ref.close()


def test_log_chunks_are_not_failed_by_a_short_wait(pair: Pair) -> None:
    """Rank log lines were never confirmed by the replicas (agents re-send from their
    offsets): in a group whose WAIT falls short the job writes are UNAVAILABLE and the
    chunks are stored and acknowledged."""
    store = RedisStore(pair.url(min_replicas=1, replica_wait_ms=300))
    try:
        job = store.create_job(_job("L"))
        os.kill(pair.replica.proc.pid, signal.SIGSTOP)
        try:
            res = _one_group(pair.primary.port, lambda: store.update_job(job, 1), [
                lambda: store.append_logs("L", _chunk(0, 0, ["a1"]), 1 << 20),
                lambda: store.update_job(_job("L"), 2),
                lambda: store.append_logs("L", _chunk(0, 3, ["a2"]), 1 << 20),
            ])
        finally:
            os.kill(pair.replica.proc.pid, signal.SIGCONT)
        assert isinstance(res[0], StoreUnavailable) and isinstance(res[2], StoreUnavailable)
        assert res[1] == 3 and res[3] == 6
        assert [ln.text for ln in store.read_logs("L", 1)[0]] == ["a1", "a2"]
        # a group of log chunks alone sends no WAIT at all
        waits = store._writes.waits
        assert store.append_logs("L", _chunk(0, 6, ["a3"]), 1 << 20) == 9
        assert store._writes.waits == waits
    finally:
        store.close()
