"""Rank output of Kubernetes attempts: read from the API server's ``pods/log``, split by
rank into the files :mod:`region_agents.logship` tails.

How lines leave a pod: the pod's supervisor prefixes each rank's lines
(:mod:`checkpoint_layout.rank_lines`), the container runtime keeps them in the node's
container log, and this module reads that log the way ``kubectl logs -f`` does: one
``follow=true&timestamps=true`` stream per running pod through the API server, which
authorizes it (RBAC ``pods/log`` ``get``) and proxies it to the node's kubelet. No side
channel, nothing the pod must reach: whatever a cluster admin sees with ``kubectl logs``
is what ``brokerctl logs`` shows.

Why files in between (``<work>/k8s-logs/<job>/a<attempt>/``): the agent's log shipper
already gives rank files everything needed -- per-(rank, stream) byte offsets the broker
dedups by, a resend from the broker's own offset after a reconnect, rate limits, a final
flush before the terminal update. Writing a pod's lines into ``rank-<r>.stdout`` /
``rank-<r>.stderr`` reuses all of it unchanged (the local executor's ranks write the
same names).

Exactly once across restarts and broken streams: every line read is first appended to
the pod's *journal* (``pods/<pod>.log``: ``<time ns> <rank> <o|e> <text>``), then to its
rank file. The journal is the truth: on start, every rank file of an attempt is rebuilt
from the journals (the same bytes at the same offsets, so anything resent is dropped by
the broker), and each pod's stream resumes after the last journalled line: it asks for
``sinceSeconds`` reaching a margin before that line's kubelet timestamp and skips lines
up to that very line (the n-th line with its nanosecond timestamp: times need not
rise down a log, see :class:`_Cursor`). ``sinceSeconds`` and not ``sinceTime``:
the API server passes ``sinceTime`` on at one-second precision and the generated Python
client does not offer it; the margin (``SINCE_MARGIN_S``) covers clock skew between this
agent and the kubelet. A pod's stream that ends while its container still runs (a
broken connection, a restarted API server) is resumed the same way.

Cost: one HTTP stream per running pod, read by a pool of at most ``max_streams``
threads (started as needed) -- for hundreds of pods, a stream and a thread each. Beyond
``max_streams`` pods the streams take turns (each holds its reader ``SLICE_S`` while
others wait, then resumes later from its journal, losing nothing): connections and
threads stay bounded at thousands of pods, at the price of lines arriving up to about
``pods / max_streams * SLICE_S`` late. A pod whose log cannot be read (an error from the
API server or the kubelet) is retried with exponential backoff; after ``PARK_AFTER``
failed reads in a row its stream is parked while the container runs: read again when
the container has ended (the rest of its log, before the attempt's end is reported) or
every ``PARKED_S``. A node that serves no logs at all (KWOK's fake nodes; a virtual
kubelet) then costs a few requests per pod, not one a minute for the pod's whole life
(71,000 failed reads in one run of the scale benchmark). What can be lost: lines the kubelet no
longer has (log rotation while a pod waited, a node gone before its log was read),
as with ``kubectl logs``.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import os
import re
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client as k8s

from checkpoint_layout import rank_lines
from region_agents.logship import LogSource

log = logging.getLogger(__name__)

DEFAULT_MAX_STREAMS = 512
SLICE_S = 30.0  # a stream's turn when others wait for a slot
SINCE_MARGIN_S = 120  # resume this far before the last journalled line (clock skew)
READ_TIMEOUT_S = 300.0  # a silent stream is re-opened after this (a half-dead connection)
RETRY_S = 1.0  # a stream that ended while its container runs is re-opened after this
BACKOFF_MAX_S = 60.0  # a failing pod's retries back off up to this
PARK_AFTER = 4  # failed reads in a row (1 + 2 + 4 s of backoff) that park a running pod's stream
PARKED_S = 600.0  # a parked stream is tried again this often, or when its container ends
KEEP_S = 600.0  # an ended attempt's files stay this long (the shipper resends for 120 s)
# Files of attempts no agent wrote for this long are removed at start-up (attempts that
# ended while no agent ran). Should one still run, its stream starts over from the
# kubelet's beginning and recreates the same bytes: nothing is shipped twice.
STALE_S = 86400.0
_STREAM_CODE = {rank_lines.STDOUT: b"o", rank_lines.STDERR: b"e"}
_CODE_STREAM = {v: k for k, v in _STREAM_CODE.items()}
_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def time_ns(stamp: str) -> int:
    """An RFC 3339 time (the kubelet's RFC3339Nano, trailing zeros trimmed) in ns."""
    from datetime import datetime

    m = _TIME.match(stamp)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    base = datetime.fromisoformat(m.group(1) + m.group(3).replace("Z", "+00:00"))
    return int(base.timestamp()) * 1_000_000_000 + int((m.group(2) or "0").ljust(9, "0"))


@dataclass(frozen=True)
class PodRanks:
    """The global ranks whose lines one pod may carry: ``first .. first+count-1``.
    Lines without a prefix, or claiming a rank not of this pod, are ``first``'s."""

    first: int
    count: int

    def place(self, line: bytes) -> tuple[int, str, bytes]:
        rank, stream, text = rank_lines.parse(line)
        if rank is None or not self.first <= rank < self.first + self.count:
            return self.first, rank_lines.STDOUT, line
        return rank, stream, text


class _Cursor:
    """Where a pod's journal ends: its last line's kubelet time and how many journalled
    lines carry exactly that time (recent lines counted per time).

    Why not "skip every line older than the last one": a container runtime stamps
    stdout and stderr in separate threads, so times need not rise down the log (a
    stderr line may follow a stdout line stamped a microsecond later). A resumed stream
    therefore skips until it meets the journal's last line itself -- the ``ties``-th
    line stamped ``ns`` -- and takes everything after it, whatever its time."""

    RECENT = 4096

    def __init__(self) -> None:
        self.ns = -1
        self.ties = 0
        self._recent: deque[int] = deque()
        self._count: Counter[int] = Counter()

    def take(self, ns: int) -> None:
        self._recent.append(ns)
        self._count[ns] += 1
        if len(self._recent) > self.RECENT:
            old = self._recent.popleft()
            self._count[old] -= 1
            if self._count[old] <= 0:
                del self._count[old]
        self.ns, self.ties = ns, self._count[ns]


class _Resume:
    """One stream's search for the journal's last line (see :class:`_Cursor`)."""

    GIVE_UP_NS = 5_000_000_000  # a line this much newer and no match: the log changed

    def __init__(self, cursor: _Cursor) -> None:
        self.ns, self.ties = cursor.ns, cursor.ties
        self.found = cursor.ns < 0  # nothing journalled: take everything
        self.seen = 0
        self.gave_up = False

    def new(self, ns: int) -> bool:
        """Is this line (in stream order) after the journal's end?"""
        if self.found:
            return True
        if ns == self.ns:
            self.seen += 1
            if self.seen >= self.ties:
                self.found = True
            return False
        if ns > self.ns + self.GIVE_UP_NS:
            # The journal's last line is not in the kubelet's log any more (rotated):
            # take from here rather than skip forever.
            self.found = self.gave_up = True
            return True
        return False


@dataclass
class _Attempt:
    dir: Path
    key: tuple[str, int] = ("", 0)  # (job id, attempt): what on_write names
    lock: threading.Lock = field(default_factory=threading.Lock)
    pods: dict[str, _PodStream] = field(default_factory=dict)
    ended: float = 0.0  # monotonic time the executor reported its end (0: running)


class PodLogs:
    """The pods' log streams of every attempt the executor watches (see the module doc).

    The executor calls :meth:`sync` with an attempt's pods on each pass, asks
    :meth:`drained` before reporting the attempt's end, and :meth:`ended` after."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str, root: Path, container: str,
                 max_streams: int = DEFAULT_MAX_STREAMS,
                 on_done: Callable[[], None] = lambda: None) -> None:
        self.core = core
        self.on_done = on_done  # a pod's log is read to its end (the executor's wake-up)
        # called (job id, attempt) after lines were appended to an attempt's rank files:
        # the agent's log shipper then reads only attempts that grew (set_on_write)
        self.on_write: Callable[[str, int], None] = lambda job_id, attempt: None
        self.namespace = namespace
        self.root = Path(root)
        self.container = container
        self.max_streams = max(1, max_streams)
        self.slice_s = SLICE_S
        # The readers' queue: (not before, seq, stream); a pool of reader threads.
        self._ready = threading.Condition()
        self._queue: list[tuple[float, int, _PodStream, int]] = []  # (due, seq, stream, its gen)
        self._seq = itertools.count()
        self._readers = 0
        self._idle = 0
        self._lock = threading.Lock()
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._stop = threading.Event()
        _sweep_stale(self.root)

    # ---- files ---------------------------------------------------------------------
    def _dir(self, job_id: str, attempt: int) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", job_id)[:100] or "job"
        return self.root / safe / f"a{attempt}"

    def _attempt(self, job_id: str, attempt: int) -> _Attempt:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                att = _Attempt(self._dir(job_id, attempt), (job_id, attempt))
                _rebuild(att.dir)  # before any stream appends: journals are the truth
                self._attempts[(job_id, attempt)] = att
            return att

    def sources(self, job_id: str, attempt: int, ranks: int) -> list[LogSource]:
        """The rank files of an attempt with ``ranks`` ranks (written as lines arrive)."""
        att = self._attempt(job_id, attempt)
        return [LogSource(r, s, att.dir / f"rank-{r}.{s}")
                for r in range(max(1, ranks)) for s in (rank_lines.STDOUT, rank_lines.STDERR)]

    # ---- driven by the executor's passes ------------------------------------------------
    def sync(self, job_id: str, attempt: int, pods: list[dict],
             ranks_of: Callable[[dict], PodRanks | None]) -> None:
        """Start reading every pod whose container has started (running or ended): a
        container still waiting has no log yet (the kubelet answers 400)."""
        att = self._attempt(job_id, attempt)
        for pod in pods:
            meta = pod.get("metadata") or {}
            name = meta.get("name", "")
            if not name or name in att.pods or not _started(pod, self.container):
                continue
            where = ranks_of(pod)
            if where is None:
                continue
            ps = _PodStream(self, att, name, where, _ended(pod, self.container))
            att.pods[name] = ps
            ps.prepare()
            self._enqueue(ps, 0.0)
        for pod in pods:  # a stream must know its container ended (EOF is then final)
            ps = att.pods.get((pod.get("metadata") or {}).get("name", ""))
            if ps is not None and _ended(pod, self.container) and not ps.container_ended.is_set():
                ps.container_ended.set()
                self._unpark(ps)

    def _unpark(self, ps: _PodStream) -> None:
        """A parked stream's container ended: its turn is now (the rest of its log is
        read before the attempt's end is reported). Its parked entry in the queue is
        made stale (``gen``), so one stream never has two turns at once."""
        with self._ready:
            if not ps.parked:
                return  # not waiting out a park (reading, or due soon): it sees the end itself
            ps.parked = False
            ps.gen += 1
            heapq.heappush(self._queue, (time.monotonic(), next(self._seq), ps, ps.gen))
            self._ready.notify()

    # ---- the reader pool ---------------------------------------------------------------
    def _enqueue(self, ps: _PodStream, delay: float) -> None:
        with self._ready:
            if delay >= PARKED_S and ps.container_ended.is_set():
                delay = 0.0  # it ended while its reader was parking it: read the rest now
            ps.parked = delay >= PARKED_S
            heapq.heappush(self._queue, (time.monotonic() + delay, next(self._seq), ps, ps.gen))
            if self._idle == 0 and self._readers < self.max_streams:
                self._readers += 1
                self._idle += 1  # it starts idle: a burst of pods starts no more readers than due
                threading.Thread(target=self._reader, daemon=True,
                                 name=f"podlog-reader-{self._readers}").start()
            else:
                self._ready.notify()

    def contended(self) -> bool:
        """A pod is due and no reader is free: a reader should end its turn."""
        with self._ready:
            return (self._idle == 0 and self._readers >= self.max_streams and bool(self._queue)
                    and self._queue[0][0] <= time.monotonic())

    def _reader(self) -> None:
        while not self._stop.is_set():
            with self._ready:
                while not self._stop.is_set():
                    now = time.monotonic()
                    while self._queue and self._queue[0][3] != self._queue[0][2].gen:
                        heapq.heappop(self._queue)  # a stale turn (its stream was unparked)
                    if self._queue and self._queue[0][0] <= now:
                        break
                    self._ready.wait(min(5.0, self._queue[0][0] - now) if self._queue else 5.0)
                self._idle -= 1
                if self._stop.is_set():
                    return
                ps = heapq.heappop(self._queue)[2]
                ps.parked = False
            delay = ps.turn()
            with self._ready:
                self._idle += 1
            if delay is None:
                if not ps.cancel.is_set():
                    ps.done.set()
                    self.on_done()
            elif not ps.cancel.is_set():
                self._enqueue(ps, delay)

    def drained(self, job_id: str, attempt: int) -> bool:
        """Every started pod's log is read to its end (the attempt's end may be reported)."""
        att = self._attempts.get((job_id, attempt))
        return att is None or all(ps.done.is_set() for ps in att.pods.values())

    def ended(self, job_id: str, attempt: int) -> None:
        """The attempt's end is reported: stop its streams; its files go after KEEP_S."""
        att = self._attempts.get((job_id, attempt))
        if att is None:
            return
        att.ended = time.monotonic()
        for ps in att.pods.values():
            ps.cancel.set()
        self._sweep()

    def _sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            old = [k for k, a in self._attempts.items() if a.ended and now - a.ended > KEEP_S]
            for k in old:
                shutil.rmtree(self._attempts.pop(k).dir, ignore_errors=True)

    def stop(self) -> None:
        self._stop.set()
        with self._ready:
            self._ready.notify_all()
        with self._lock:
            atts = list(self._attempts.values())
        for att in atts:
            for ps in att.pods.values():
                ps.cancel.set()


def _sweep_stale(root: Path) -> None:
    now = time.time()
    for d in root.glob("*/a*"):
        try:
            newest = max((f.stat().st_mtime for f in [d, *d.rglob("*")]), default=now)
        except OSError:
            continue
        if now - newest > STALE_S:
            shutil.rmtree(d, ignore_errors=True)


def _container_state(pod: dict, container: str) -> dict:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            return cs.get("state") or {}
    return {}


def _started(pod: dict, container: str) -> bool:
    st = _container_state(pod, container)
    return bool(st.get("running") or st.get("terminated"))


def _ended(pod: dict, container: str) -> bool:
    return bool(_container_state(pod, container).get("terminated"))


def _rebuild(d: Path) -> None:
    """Rewrite the rank files from the journals (after an agent restart; a no-op for a
    new attempt). A journal's torn last line (a crash mid-write) is cut off first."""
    journals = sorted((d / "pods").glob("*.log")) if (d / "pods").is_dir() else []
    if not journals:
        d.mkdir(parents=True, exist_ok=True)
        return
    files: dict[str, bytearray] = {}
    for j in journals:
        data = j.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut < len(data):
            with open(j, "r+b") as f:
                f.truncate(cut)
            data = data[:cut]
        for line in data.splitlines():
            parsed = _journal_line(line)
            if parsed is not None:
                _ns, rank, stream, text = parsed
                files.setdefault(f"rank-{rank}.{stream}", bytearray()).extend(text + b"\n")
    for name, data in files.items():
        tmp = d / f".{name}.tmp"
        tmp.write_bytes(bytes(data))
        os.replace(tmp, d / name)


def _journal_line(line: bytes) -> tuple[int, int, str, bytes] | None:
    parts = line.split(b" ", 3)
    if len(parts) < 3 or parts[2] not in _CODE_STREAM:
        return None
    try:
        return int(parts[0]), int(parts[1]), _CODE_STREAM[parts[2]], (parts[3] if len(parts) > 3 else b"")
    except ValueError:
        return None


class _PodStream:
    """Reads one pod's container log into its journal and rank files (a thread)."""

    def __init__(self, owner: PodLogs, att: _Attempt, name: str, ranks: PodRanks,
                 ended: bool) -> None:
        self.owner, self.att, self.name, self.ranks = owner, att, name, ranks
        self.journal = att.dir / "pods" / f"{name}.log"
        self.cursor = _Cursor()
        self.done = threading.Event()  # read to the end of an ended container
        self.cancel = threading.Event()
        self.container_ended = threading.Event()
        if ended:
            self.container_ended.set()
        self.opens = 0  # streams opened (tests: resumes)
        self.failures = 0  # failed opens in a row (the backoff)
        self.parked = False  # queued PARKED_S ahead (PodLogs._ready guards it)
        self.gen = 0  # its valid entry in the readers' queue (older ones are stale)

    def prepare(self) -> None:
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        self._load_cursor()

    def _load_cursor(self) -> None:
        try:
            data = self.journal.read_bytes()
        except OSError:
            return
        for line in data.splitlines():
            parsed = _journal_line(line)
            if parsed is not None:
                self.cursor.take(parsed[0])

    def turn(self) -> float | None:
        """One turn of a reader: None when the log is read to its end (or the pod is
        gone), else the delay before the next turn."""
        if self.cancel.is_set() or self.owner._stop.is_set():
            return 0.0
        try:
            finished = self._one_turn()
        except Exception as e:  # noqa: BLE001 - a broken stream is resumed
            if isinstance(e, k8s.ApiException) and e.status == 404:
                log.info("log of pod %s: %s (the pod is gone)", self.name, _why(e))
                return None
            self.failures += 1
            delay = min(BACKOFF_MAX_S, RETRY_S * 2 ** (self.failures - 1))
            if self.failures >= PARK_AFTER and not self.container_ended.is_set():
                delay = PARKED_S  # until its container ends (PodLogs._unpark) or PARKED_S
                if self.failures == PARK_AFTER:
                    log.info("log of pod %s: %s, %d times in a row: read again when its"
                             " container ends (or in %.0f s)", self.name, _why(e),
                             self.failures, delay)
                return delay
            log.debug("log of pod %s: %s (again in %.0f s)", self.name, _why(e), delay)
            return delay
        if finished:
            return None
        return 0.0 if self.owner.contended() else RETRY_S

    def _one_turn(self) -> bool:
        """Stream from the cursor until the end (True), a broken stream or the end of
        this stream's turn (False)."""
        o = self.owner
        ended_before = self.container_ended.is_set()
        since = None
        if self.cursor.ns >= 0:
            since = max(1, math.ceil(time.time() - self.cursor.ns / 1e9) + SINCE_MARGIN_S)
        self.opens += 1
        resp = o.core.read_namespaced_pod_log(
            self.name, o.namespace, container=o.container, follow=True, timestamps=True,
            since_seconds=since, _preload_content=False,
            _request_timeout=(10, READ_TIMEOUT_S))
        began = time.monotonic()
        self.failures = 0
        resume = _Resume(self.cursor)
        buf = b""
        clean_end = False
        try:
            while True:
                if self.cancel.is_set() or o._stop.is_set():
                    return False
                chunk = resp.read1(64 * 1024) if hasattr(resp, "read1") else resp.read(64 * 1024)
                if not chunk:
                    clean_end = True
                    break
                buf += chunk
                cut = buf.rfind(b"\n") + 1
                if cut:
                    self._take(buf[:cut].split(b"\n")[:-1], resume)
                    buf = buf[cut:]
                if time.monotonic() - began > o.slice_s and o.contended():
                    return False  # others wait for a reader: resume later from the cursor
        finally:
            with contextlib.suppress(Exception):
                resp.close()
                resp.release_conn()
        if clean_end and (ended_before or self.container_ended.is_set()):
            if buf:  # the container's last line, written without a newline
                self._take([buf], resume)
            return True
        return False

    def _take(self, raw: list[bytes], resume: _Resume) -> None:
        """Journal the new lines of a batch, then append them to their rank files."""
        journal = bytearray()
        per_file: dict[str, bytearray] = {}
        for line in raw:
            stamp, _, rest = line.partition(b" ")
            try:
                ns = time_ns(stamp.decode())
            except (ValueError, UnicodeDecodeError):
                continue  # not a log line (the kubelet stamps every line)
            if not resume.new(ns):
                continue  # journalled already (this stream is a resume)
            if resume.gave_up:
                resume.gave_up = False
                log.warning("log of pod %s: its last journalled line is gone from the"
                            " kubelet's log (rotated?); lines may be missing", self.name)
            self.cursor.take(ns)
            rank, stream, text = self.ranks.place(rest.rstrip(b"\r"))
            journal += b"%d %d %s " % (ns, rank, _STREAM_CODE[stream]) + text + b"\n"
            per_file.setdefault(f"rank-{rank}.{stream}", bytearray()).extend(text + b"\n")
        if not journal:
            return
        with self.att.lock:
            if self.cancel.is_set():
                return  # stopped (an agent shutting down): a successor resumes from the journal
            with open(self.journal, "ab") as f:
                f.write(journal)
            for name, data in per_file.items():
                with open(self.att.dir / name, "ab") as f:
                    f.write(data)
        self.owner.on_write(*self.att.key)


def _why(e: Exception) -> str:
    if isinstance(e, k8s.ApiException):
        return f"{e.status} {e.reason}"
    return f"{type(e).__name__}: {e}"
