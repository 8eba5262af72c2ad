"""Redis store: production / HA (several broker replicas, one leader by a lease).

Why it is built this way:
- **Every job write is one Lua script**, so the version check, the job write, the
  secondary-index moves and the event append happen atomically on the server: no
  other client can interleave, and a client dying mid-call leaves either all or none.
- **Events** live in a per-job list; an event's ``seq`` is its 1-based position,
  assigned inside the same script as ``LLEN + 1`` (the list length *is* the per-job
  counter, and it can only grow). Stored event bytes carry neither seq nor job_id;
  readers fill both in, so a stored event can never disagree with its position.
- **Indexes** are sorted sets with score 0, read with ``ZRANGEBYLEX``: ordered by id
  (ids sort by creation) for cheap cursor pagination. ``jobs`` holds every id, and
  ``team:<t>``, ``phase:<n>``, ``region:<r>`` are moved inside the write script when a
  job's team/phase/region changes. ``reqid`` (a hash) makes (team, client_request_id)
  unique inside the create script.
- **Retries** (tenacity, bounded) cover transient connection errors. A write that
  reached Redis but whose reply was lost would be unsafe to blindly repeat, so every
  write carries a random token; the script remembers each token's result for
  ``_TOKEN_TTL_S`` and a retried write returns that result instead of applying twice.
- **Durability** is the Redis server's job: run it with ``appendonly yes`` +
  ``appendfsync always`` (or replicas) to match SQLite's "lose nothing" guarantee.
- All keys live under ``<prefix>:`` (``?prefix=`` in the URL, default ``cb``) so
  several brokers/tests can share one server. Scripts build keys from the prefix, so
  this targets a single primary (with replicas/Sentinel), not Redis Cluster.
- **Failover** (``redis+sentinel://`` URLs, broker/store/redis_url.py): the pool asks
  the Sentinels for the primary on every new connection, and a write refused as
  READONLY (a demoted primary) drops the connection, so the retry loop lands on the
  promoted one. The retry budget then spans a Sentinel failover, not a blip.
- **Replica confirmation** (``min_replicas``): every acknowledged write to jobs, events,
  records and the lease is followed on the same connection by ``WAIT n ms``; fewer
  confirmations than ``n`` is :class:`StoreUnavailable` ("state store replica did not
  confirm"), so an acknowledged write is on every replica a failover could promote
  (``n`` from broker/store/replica_quorum.py: with Sentinels, by default, every
  replica they may promote; ``WAIT 1`` with two replicas let them promote the one that
  lacked the write). The write itself may have happened on the primary: it is simply not acknowledged, and
  every write is safe to retry (request tokens, client request ids).

Thread safety: ``redis.Redis`` over a ``ConnectionPool`` is thread-safe; each call
checks out its own connection, and all read-modify-write logic runs server-side.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

import redis
import redis.sentinel
from google.protobuf.message import Message
from tenacity import (
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from broker.store import redis_scripts as scripts
from broker.store.base import (
    AlreadyExists,
    CreateItem,
    Fenced,
    NotFound,
    Store,
    StoreError,
    StoreUnavailable,
    VersionConflict,
    decode,
    decode_each,
    job_columns,
    new_job_copy,
    numbered_events,
    riders_of,
    versioned_copy,
)
from broker.store.checkpoint_index import job_prefix_key
from broker.store.group_commit import GroupWriter
from broker.store.redis_logs import RedisLogs
from broker.store.redis_url import RedisTarget, parse_redis_url
from broker.store.replica_quorum import Answers, ReplicaQuorum, ReplicaRule
from computebroker.v1 import common_pb2 as pb

T = TypeVar("T")

_TOKEN_TTL_S = 600
_LIST_BATCH = 200

MAX_CONNECTIONS = 64  # per store object; each call holds one only for its round trip
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
# A Sentinel failover takes down-after-milliseconds plus an election (seconds): the
# retry loop of a Sentinel store waits that long before a call turns UNAVAILABLE.
_SENTINEL_RETRY_ATTEMPTS = 14
_SENTINEL_RETRY_MAX_DELAY_S = 30.0


_FIRST_RETRY_WAIT_S = 0.05  # wait_exponential(multiplier=0.05)'s first wait


def _rider_args(riders: Sequence[tuple[str, str, Message]]) -> list[object]:
    """The CREATE script's optional tail: n, then kind, key, data of each rider."""
    if not riders:
        return []
    return [len(riders), *(x for kind, key, m in riders for x in (kind, key, m.SerializeToString()))]


def _create_tail(stored: pb.Job, riders: Sequence[tuple[str, str, Message]]) -> list[object]:
    """The CREATE script's tail: the riders (count always given), then the job's
    checkpoint prefix key ('' = it chose none)."""
    return [*(_rider_args(riders) or [0]), job_prefix_key(stored.spec.checkpoint_uri)]


def _event_bytes(ev: pb.JobEvent) -> bytes:
    e = pb.JobEvent()
    e.CopyFrom(ev)
    e.ClearField("seq")
    e.ClearField("job_id")
    return e.SerializeToString()


class RedisStore(RedisLogs, Store):
    """Store in Redis (``redis://host:port/db?prefix=cb``)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str | None = None,
        retry_attempts: int | None = None,
        retry_max_delay_s: float | None = None,
        socket_timeout_s: float = 10.0,
    ) -> None:
        target = parse_redis_url(url)
        self.prefix = prefix or target.prefix
        self.target = target
        self._wait_ms = target.replica_wait_ms
        # A WAIT blocks the socket for up to replica_wait_ms: never time it out first.
        socket_timeout_s = max(socket_timeout_s, target.replica_wait_ms / 1000 + 5)
        self._pool = self._open_pool(target, socket_timeout_s)
        self._replicas = ReplicaQuorum(
            target.replica_rule, target.min_replicas,
            self._ask_sentinels if target.replica_rule is ReplicaRule.ALL else None)
        self._min_replicas = self._replicas.enabled  # confirm writes at all
        self._r = redis.Redis(connection_pool=self._pool)
        self._create = self._r.register_script(scripts.CREATE)
        self._update = self._r.register_script(scripts.UPDATE)
        self._append = self._r.register_script(scripts.APPEND)
        self._record = self._r.register_script(scripts.RECORD)
        self._lease = self._r.register_script(scripts.LEASE)
        self._fence: tuple[str, str] = ("", "")  # (epoch key, epoch) or off
        self._prefix_index_built = False  # <p>:ckpt checked (built once if missing)
        self._records: GroupWriter[list[object], None] = GroupWriter(self._put_records)
        if retry_attempts is None:
            retry_attempts = _SENTINEL_RETRY_ATTEMPTS if target.is_sentinel else 5
        if retry_max_delay_s is None:
            retry_max_delay_s = _SENTINEL_RETRY_MAX_DELAY_S if target.is_sentinel else 15.0
        # The first attempt runs bare (tenacity costs ~30 us a call, on every submit's
        # store calls); only a transient failure enters the retry loop for the rest.
        self._retry = retry(
            retry=retry_if_exception_type(_TRANSIENT),
            stop=stop_after_attempt(retry_attempts - 1) | stop_after_delay(retry_max_delay_s),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            reraise=True,
        ) if retry_attempts > 1 else None

    @staticmethod
    def _open_pool(target: RedisTarget, socket_timeout_s: float) -> redis.ConnectionPool:
        """One server: a bounded pool that makes a caller wait for a free connection (a
        thousand WatchJob threads waking at once would otherwise open a thousand
        connections in one burst; connect storms past the listen backlog read as
        "unavailable"). Sentinel: redis-py's Sentinel pool, which asks the Sentinels for
        the primary on each connect and refuses (transiently) past its bound."""
        common = dict(socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
                      health_check_interval=30, max_connections=MAX_CONNECTIONS)
        if not target.is_sentinel:
            return redis.BlockingConnectionPool.from_url(target.url, timeout=socket_timeout_s,
                                                         **common)
        sentinel = redis.sentinel.Sentinel(
            list(target.sentinels),
            sentinel_kwargs={"socket_timeout": 2.0, "socket_connect_timeout": 2.0},
        )
        return redis.sentinel.SentinelConnectionPool(target.service, sentinel, db=target.db,
                                                     **common)

    # ---- plumbing ------------------------------------------------------------------
    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` with bounded retries; a store still unreachable after them is
        :class:`StoreUnavailable` (UNAVAILABLE to API callers, never INTERNAL)."""
        try:
            try:
                return fn()
            except _TRANSIENT:
                if self._retry is None:
                    raise
            time.sleep(_FIRST_RETRY_WAIT_S)  # the backoff the retry loop would have waited
            return self._retry(fn)()
        except _TRANSIENT as e:
            raise StoreUnavailable(f"redis unavailable: {e}") from e

    def _write(self, queue: Callable[[object], object]) -> list[object]:
        """Run the write(s) ``queue`` adds to a client, then, when replicas must confirm,
        ``WAIT`` on the same connection (one pipeline: WAIT counts only this
        connection's writes). Returns the writes' replies."""
        needed = self.replicas_needed()

        def run() -> list[object]:
            pipe = self._r.pipeline(transaction=False)  # built per try: execute() empties it
            queue(pipe)
            if needed:
                pipe.execute_command("WAIT", needed, self._wait_ms)
            return pipe.execute()

        if not needed:
            return self._call(run)
        *replies, acks = self._call(run)
        if int(acks) < needed:
            self._replicas.stale()  # a replica flagged down since stops counting at once
            raise StoreUnavailable(
                f"state store replica did not confirm the write ({acks} of "
                f"{needed} within {self._wait_ms} ms); not acknowledged, retry later")
        return replies

    def replicas_needed(self) -> int:
        """How many replicas the next write waits for (0 = writes are not confirmed)."""
        return self._replicas.needed() if self._min_replicas else 0

    def _ask_sentinels(self) -> Answers:
        """Each answering Sentinel's primary and its list of the primary's replicas
        (``min_replicas=all``). Raises when none answers (the quorum keeps its count)."""
        manager = self._pool.sentinel_manager  # type: ignore[attr-defined]
        answers: Answers = []
        last: Exception | None = None
        for s in manager.sentinels:
            try:
                addr = s.sentinel_get_master_addr_by_name(self.target.service)
                host = addr[0].decode() if addr and isinstance(addr[0], bytes) else \
                    (addr[0] if addr else "")
                primary = f"{host}:{addr[1]}" if addr else ""
                answers.append((primary, s.sentinel_slaves(self.target.service)))
            except redis.RedisError as e:
                last = e
        if not answers and last is not None:
            raise last
        return answers

    def _write_one(self, script: redis.commands.core.Script, args: list[object],
                   keys: list[str] | None = None) -> object:
        """One script call, confirmed by replicas when configured."""
        if not self._min_replicas:
            return self._call(lambda: script(keys=keys, args=args))
        return self._write(lambda c: script(keys=keys, args=args, client=c))[0]

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _base_args(self) -> list[object]:
        return [self.prefix, uuid.uuid4().hex, _TOKEN_TTL_S, *self._fence]

    def _fenced(self) -> Fenced:
        return Fenced(f"leader epoch {self._fence[1]} is stale: another broker leads now")

    def _job_args(self, stored: pb.Job, events: Sequence[pb.JobEvent],
                  *checks: object) -> list[object]:
        """ARGV of the create/update scripts: fence, id, ``checks`` (update: the expected
        version), the index columns, the job, then the events."""
        return [
            *self._base_args(),
            stored.id,
            *checks,
            *job_columns(stored),
            stored.SerializeToString(),
            len(events),
            *(_event_bytes(e) for e in events),
        ]

    # ---- jobs ----------------------------------------------------------------------
    def create_job(self, job: pb.Job, events: Sequence[pb.JobEvent] = ()) -> pb.Job:
        stored = new_job_copy(job)
        args = self._job_args(stored, events) + _create_tail(stored, ())
        res = self._write_one(self._create, args)
        if res == -9:
            raise self._fenced()
        if res == -1:
            raise AlreadyExists(f"job {stored.id!r} already exists")
        if res == -2:
            raise AlreadyExists(
                f"request id ({stored.spec.team!r}, {stored.client_request_id!r}) already exists"
            )
        return stored

    def create_jobs(self, items: Sequence[CreateItem]) -> list[pb.Job | StoreError]:
        """The CREATE script once per member, all in one pipeline (one round trip).
        Each script is atomic and fenced on its own (a member's riders are written by
        its script, only with its job); a retried pipeline is safe because each member
        carries its own request token."""
        stored = [new_job_copy(item[0]) for item in items]
        argv = [self._job_args(st, item[1]) + _create_tail(st, riders_of(item))
                for st, item in zip(stored, items, strict=True)]

        def queue(pipe: object) -> None:
            for a in argv:
                self._create(args=a, client=pipe)

        res = self._write(queue) if argv else []
        out: list[pb.Job | StoreError] = []
        for st, r in zip(stored, res, strict=True):
            if r == -9:
                raise self._fenced()
            if r == -1:
                out.append(AlreadyExists(f"job {st.id!r} already exists"))
            elif r == -2:
                out.append(AlreadyExists(
                    f"request id ({st.spec.team!r}, {st.client_request_id!r}) already exists"))
            else:
                out.append(st)
        return out

    def get_job(self, job_id: str) -> pb.Job:
        data = self._call(lambda: self._r.hget(self._k("job", job_id), "d"))
        if data is None:
            raise NotFound(f"job {job_id!r} not found")
        return decode(pb.Job, data, f"job {job_id}")

    def get_job_confirmed(self, job_id: str) -> pb.Job:
        """The read, then a barrier write and ``WAIT`` on the same connection in one
        pipeline: the replicas' offset passing the barrier means they hold all the read
        saw (a write after the barrier is not in the read). A primary lost between the
        two fails the pipeline; the retry reads the promoted primary afresh."""
        if not self._min_replicas:
            return self.get_job(job_id)
        data, _ = self._write(lambda c: (c.hget(self._k("job", job_id), "d"),  # type: ignore[attr-defined]
                                         c.incr(self._k("barrier"))))  # type: ignore[attr-defined]
        if data is None:
            raise NotFound(f"job {job_id!r} not found")
        return decode(pb.Job, data, f"job {job_id}")

    def confirm_replicated(self) -> None:
        if self._min_replicas:
            self._write(lambda c: c.incr(self._k("barrier")))  # type: ignore[attr-defined]

    def checkpoint_prefix_jobs(self, keys: Sequence[str], inside: tuple[str, str] | None = None,
                               ) -> list[str]:
        self._ensure_prefix_index()
        zk = self._k("ckpt")

        def fetch() -> list[list[bytes]]:
            pipe = self._r.pipeline(transaction=False)
            for key in dict.fromkeys(keys):
                pipe.zrangebylex(zk, f"[{key}\0", f"({key}\x01")
            if inside is not None:
                pipe.zrangebylex(zk, f"[{inside[0]}", f"({inside[1]}")
            return pipe.execute()

        return sorted({m.rsplit(b"\0", 1)[1].decode() for batch in self._call(fetch) for m in batch})

    def _ensure_prefix_index(self) -> None:
        """Build ``<p>:ckpt`` once from the jobs stored before it existed (a marker key
        says it was built; jobs created since are indexed by the CREATE script)."""
        if self._prefix_index_built:
            return
        marker = self._k("ckpt", "built")
        if not self._call(lambda: self._r.exists(marker)):
            after = ""
            while ids := self._index_batch([self._k("jobs")], after, _LIST_BATCH):
                def fetch(ids: list[str] = ids) -> list[bytes | None]:
                    pipe = self._r.pipeline(transaction=False)
                    for i in ids:
                        pipe.hget(self._k("job", i), "d")
                    return pipe.execute()

                members = {}
                for i, data in zip(ids, self._call(fetch), strict=True):
                    if data is not None:
                        key = job_prefix_key(decode(pb.Job, data, f"job {i}").spec.checkpoint_uri)
                        if key:
                            members[f"{key}\0{i}"] = 0
                if members:
                    self._call(lambda m=members: self._r.zadd(self._k("ckpt"), m))
                after = ids[-1]
            self._call(lambda: self._r.set(marker, 1))
        self._prefix_index_built = True

    def find_job_by_request_id(self, team: str, client_request_id: str) -> pb.Job | None:
        if not client_request_id:
            return None
        field = f"{len(team.encode())}:{team}:{client_request_id}"
        job_id = self._call(lambda: self._r.hget(self._k("reqid"), field))
        if job_id is None:
            return None
        try:
            return self.get_job(job_id.decode())
        except NotFound:
            return None

    def update_job(
        self, job: pb.Job, expected_version: int, events: Sequence[pb.JobEvent] = ()
    ) -> pb.Job:
        stored = versioned_copy(job, expected_version + 1)
        args = self._job_args(stored, events, str(expected_version))
        code, value = self._write_one(self._update, args)  # type: ignore[misc]
        if code == -9:
            raise self._fenced()
        if code == -1:
            raise NotFound(f"job {stored.id!r} not found")
        if code == -2:
            raise VersionConflict(
                f"job {stored.id!r} is at version {value}, expected {expected_version}"
            )
        if code == -3:
            raise AlreadyExists(
                f"request id ({stored.spec.team!r}, {stored.client_request_id!r}) already used"
            )
        return stored

    def _index_batch(self, keys: list[str], after: str, n: int) -> list[str]:
        """Next ``n`` ids after ``after`` in the union of the index sets ``keys``."""
        lo = f"({after}" if after else "-"

        def fetch() -> list[list[bytes]]:
            pipe = self._r.pipeline(transaction=False)
            for k in keys:
                pipe.zrangebylex(k, lo, "+", start=0, num=n)
            return pipe.execute()

        ids = sorted({i.decode() for batch in self._call(fetch) for i in batch})
        return ids[:n]

    def list_jobs(
        self,
        *,
        team: str = "",
        phases: Sequence[int] = (),
        region: str = "",
        after_id: str = "",
        limit: int = 100,
    ) -> list[pb.Job]:
        # Walk the most selective index in id order; check the other filters on the
        # stored columns (also guards against a job moving between index and read).
        # A phase filter names live phases in practice (pending, running): their sets
        # hold only live jobs, while a team's or region's set holds its whole history.
        if phases:
            keys = [self._k("phase", str(int(p))) for p in set(phases)]
        elif team:
            keys = [self._k("team", team)]
        elif region:
            keys = [self._k("region", region)]
        else:
            keys = [self._k("jobs")]
        want_phases = {str(int(p)).encode() for p in phases}
        out: list[pb.Job] = []
        cursor = after_id
        batch_n = _LIST_BATCH if limit <= 0 else max(limit, 16)
        while True:
            ids = self._index_batch(keys, cursor, batch_n)
            if not ids:
                return out

            def fetch(ids: list[str] = ids) -> list[list[bytes | None]]:
                pipe = self._r.pipeline(transaction=False)
                for i in ids:
                    pipe.hmget(self._k("job", i), "team", "phase", "region", "d")
                return pipe.execute()

            for jteam, jphase, jregion, data in self._call(fetch):
                if data is None:
                    continue
                if team and jteam != team.encode():
                    continue
                if want_phases and jphase not in want_phases:
                    continue
                if region and jregion != region.encode():
                    continue
                out.extend(decode_each(pb.Job, [("job (listed)", data)]))
                if 0 < limit <= len(out):
                    return out
            cursor = ids[-1]

    def list_events(self, job_id: str, after_seq: int = 0, limit: int = 0) -> list[pb.JobEvent]:
        start = max(after_seq, 0)
        stop = start + limit - 1 if limit > 0 else -1
        raw = self._call(lambda: self._r.lrange(self._k("ev", job_id), start, stop))
        out = []
        for i, data in enumerate(raw):
            got = decode_each(pb.JobEvent, [(f"event {job_id}#{start + i + 1}", data)])
            if not got:
                continue
            e = got[0]
            e.job_id = job_id
            e.seq = start + i + 1
            out.append(e)
        return out

    def append_events(self, job_id: str, events: Sequence[pb.JobEvent]) -> list[pb.JobEvent]:
        args = [*self._base_args(), job_id, len(events), *(_event_bytes(e) for e in events)]
        start = self._write_one(self._append, args)
        if start == -9:
            raise self._fenced()
        if start == -1:
            raise NotFound(f"job {job_id!r} not found")
        return numbered_events(job_id, start, events)

    # ---- keyed records ---------------------------------------------------------------
    def _write_record(self, kind: str, key: str, data: bytes, delete: bool) -> int:
        args = [*self._base_args(), kind, key, data, "1" if delete else "0"]
        res = self._write_one(self._record, args)
        if res == -9:
            raise self._fenced()
        return int(res)

    def put_record(self, kind: str, key: str, message: Message) -> None:
        """Concurrent record writes share one pipeline (one round trip), each still
        its own fenced script (broker/store/group_commit.py)."""
        self._records.submit([*self._base_args(), kind, key, message.SerializeToString(), "0"])

    def _put_records(self, argvs: list[list[object]]) -> list[None | StoreError]:
        def queue(pipe: object) -> None:
            for a in argvs:
                self._record(args=a, client=pipe)

        return [self._fenced() if r == -9 else None for r in self._write(queue)]

    def get_record(self, kind: str, key: str, message_type: type[Message]) -> Message | None:
        data = self._call(lambda: self._r.hget(self._k("rec", kind), key))
        return None if data is None else decode(message_type, data, f"record:{kind} {key}")

    def list_records(self, kind: str, message_type: type[Message]) -> list[Message]:
        items = self._call(lambda: self._r.hgetall(self._k("rec", kind)))
        return decode_each(message_type, ((f"record:{kind} {k.decode() if isinstance(k, bytes) else k}",
                                           items[k]) for k in sorted(items)))

    def delete_record(self, kind: str, key: str) -> bool:
        return self._write_record(kind, key, b"", delete=True) > 0

    # ---- leadership ------------------------------------------------------------------
    def acquire_lease_epoch(self, name: str, holder: str, ttl_s: float) -> int:
        keys = [self._k("lease", name), self._k("lease", name, "epoch")]
        ttl_ms = max(1, int(ttl_s * 1000))
        # Confirmed too: an epoch grant lost in a failover would hand the same epoch twice.
        return int(self._write_one(self._lease, [holder, ttl_ms], keys))  # type: ignore[call-overload]

    def fence_writes(self, name: str, epoch: int | None) -> None:
        self._fence = ("", "") if epoch is None else (self._k("lease", name, "epoch"), str(epoch))

    # ---- the bus between replicas and front-ends (broker/api/store_bus.py) ----------
    def bus_channel(self, topic: str) -> str:
        """The pub/sub channel of ``topic`` under this store's prefix: brokers sharing a
        server under different prefixes never hear each other."""
        return self._k("bus", topic)

    def publish(self, topic: str, data: bytes) -> int:
        """Fire-and-forget ``data`` to ``topic``'s subscribers (how many heard it). Not a
        write: nothing durable rides on it (the store already holds what it announces)."""
        return int(self._call(lambda: self._r.publish(self.bus_channel(topic), data)))

    def subscriber(self) -> redis.client.PubSub:
        """A pub/sub connection from this store's pool (with Sentinel: the primary's)."""
        return self._r.pubsub()

    def primary_address(self) -> str | None:
        """``host:port`` of the primary the Sentinels name now; None for a one-server URL
        or when no Sentinel answers. A long-lived subscription compares it with its own
        server: pub/sub messages are only heard on the server they were published on."""
        if not self.target.is_sentinel:
            return None
        try:
            host, port = self._pool.get_master_address()  # type: ignore[attr-defined]
        except (redis.RedisError, OSError):
            return None
        return f"{host}:{port}"

    def close(self) -> None:
        # The record writer's thread (group_commit.GroupWriter) ends once its queue is
        # empty; without this every closed store would leave an idle thread behind.
        self._records.close()
        self._pool.disconnect()
