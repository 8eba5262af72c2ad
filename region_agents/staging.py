"""Bring a migrated job's checkpoint into this region before its attempt starts.

Why here, in the agent, and before the trainer starts: a job moved from region A to
region B resumes from a checkpoint in A's store. Copying it once into B's store (with
the mover in :mod:`region_agents.transfer`: server-side S3 copy or a streamed copy,
retries, per-file verification, manifest last) makes the trainer's load a local,
fast read, and the copy's progress is visible to the broker while it runs (JobUpdate
``transfer``), not hidden inside a slow trainer start. A copy that fails leaves no
manifest at the destination, so the attempt can never resume from a partial copy;
the attempt is reported FAILED and the broker relaunches it (auto-resume) from the
source checkpoint, which is untouched. ``Launch.transfer_mode = "direct"`` skips the
copy: the trainer then reads the other region's store itself.

A job with a workdir is staged too: its code is fetched from the broker (by digest,
verified, cached) before anything else, off the agent's lock (``workdir_fetch``).

A same-region relaunch copies nothing but is staged too (``copies=False``): the resume
point is resolved once, off the agent's lock, before the ranks start
(``checkpoint_layout.resolve_resume``: the exact checkpoint, else the newest complete one
of the same attempt directory that is at least as new, docs/contracts.md section 3), so
a checkpoint pruned by a still-running older attempt never reaches the trainer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from checkpoint_layout import (
    LayoutError,
    check_scheme,
    normalize,
    parse_step,
    resolve_resume,
    split_step_uri,
)
from checkpoint_layout.faults import is_outage
from computebroker.v1 import agent_pb2, common_pb2

log = logging.getLogger(__name__)


def under(uri: str, base: str) -> bool:
    """Is ``uri`` inside the store rooted at ``base`` (an s3:// prefix or a directory)?"""
    if not uri or not base:
        return False
    u, b = normalize(uri), normalize(base)
    if uri.startswith("s3://") != base.startswith("s3://"):
        return False
    return u == b or u.startswith(b + "/")


def plan_transfer(launch: agent_pb2.Launch, bucket: str) -> tuple[str, str] | None:
    """(src, dst) when ``launch.resume_from`` lives outside this region's store and the
    attempt writes inside it; the copy goes into the attempt's own checkpoint directory
    (``<checkpoint_uri>/step-N``), so it is also the attempt's "latest complete"."""
    src = launch.resume_from
    if not src or launch.transfer_mode == "direct":
        return None
    if not under(launch.checkpoint_uri, bucket) or under(src, bucket):
        return None
    name = src.rstrip("/").rpartition("/")[2]
    return src, f"{launch.checkpoint_uri.rstrip('/')}/{name}"


def plan_staging(launch: agent_pb2.Launch, bucket: str) -> Staging | None:
    """What must happen before this attempt's ranks start: a copy into this region's
    store (``plan_transfer``), else resolving ``resume_from`` where it is, else nothing.

    A ``resume_from`` that is not a checkpoint URI at all is left to the trainer, which
    rejects it as a configuration error (exit 2): resolving cannot fix it."""
    move = plan_transfer(launch, bucket)
    if move is not None:
        return Staging(launch, *move)
    if not launch.resume_from:
        return None
    try:
        split_step_uri(launch.resume_from)
        check_scheme(launch.resume_from)
    except LayoutError:
        return None
    return Staging(launch, launch.resume_from, "", copies=False)


_client_lock = threading.Lock()
_clients: dict[str, Any] = {}


def s3_client() -> Any:
    """One cached S3 client per endpoint: building one (botocore loads its service model)
    takes a few hundred ms, which would otherwise sit inside every migration."""
    from checkpoint_layout import make_s3_client

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    with _client_lock:
        if endpoint not in _clients:
            # make_s3_client asks every CopyObject for a fresh full-object checksum.
            _clients[endpoint] = make_s3_client(endpoint or None)
        return _clients[endpoint]


def warm() -> None:
    """Import the mover and build the S3 client ahead of the first migration (agent start)."""
    try:
        s3_client()
    except Exception:  # noqa: BLE001 - only an optimisation; the copy itself reports errors
        log.debug("could not pre-build the S3 client", exc_info=True)


SERVER_COPY_PART = 5 * 1024**3  # S3's CopyObject limit and its largest part


def drop_if_superseded(dst_dir: str, name: str, client: Any = None) -> bool:
    """After a background durability copy of ``name`` into ``dst_dir`` (the attempt's own
    checkpoint directory): delete the copy if a newer complete checkpoint is already there.

    Why: the attempt trains while the copy runs, and its trainer prunes that directory
    after each commit; a step directory still being copied (no manifest yet, older than
    the commit) is what pruning deletes as abandoned, so files vanish mid-copy and the
    copier's final manifest can then name files that are gone. Once a newer checkpoint
    is complete the copy has no purpose left (a resume takes the newest complete one), so
    it is removed, manifest first (never "complete" while half deleted). If none is
    newer, nothing was pruned: pruning only removes what is older than a commit."""
    from checkpoint_layout import list_steps
    from checkpoint_layout.manifest import MANIFEST
    from region_agents.checkpoint_dirs import place

    step = parse_step(name)
    if step is None:
        return False
    if client is None and dst_dir.startswith("s3://"):
        client = s3_client()
    steps = list_steps(dst_dir, s3_client=client)
    if not any(ok and s > step for s, ok in steps.items()):
        return False
    d = place(f"{dst_dir.rstrip('/')}/{name}", client)
    d.delete([MANIFEST])
    d.cleanup()
    return True


def copy_tuning(src: str, dst: str) -> dict[str, int]:
    """Server-side copies (S3 -> S3 on one endpoint): one CopyObject per file up to 5 GiB,
    5 GiB UploadPartCopy parts above. Why: no bytes pass through the agent either way,
    so small parts only add requests; and S3-compatible stores that serve each part copy
    by reading the whole source object (moto does) turn 16 MiB parts into O(size^2)
    work. Files still move in parallel (``workers``). Other routes keep the mover's
    defaults (parallel ranged parts through this host). The agent's make-before-break
    pre-copy and background durability copy use it too."""
    if src.startswith("s3://") and dst.startswith("s3://"):
        return {"multipart_threshold": SERVER_COPY_PART, "part_size": SERVER_COPY_PART}
    return {}


def _client_for(*uris: str) -> Any:
    return s3_client() if any(u.startswith("s3://") for u in uris) else None


@dataclass
class Staging:
    """One attempt's resume point being prepared before its ranks start (a background
    thread): copied into this region's store (``copies``), or only resolved (``dst`` is
    then the checkpoint to load, known once ``finished`` is set without an error)."""

    launch: agent_pb2.Launch
    src: str
    dst: str
    copies: bool = True
    # Users' code: fetch the job's workdir first (region_agents/workdir.py), off the
    # agent's lock; src is "" when that is all there is to do.
    workdir_fetch: Callable[[], object] | None = None
    fetch_error: str = ""
    # The copy/resolve failed because a store is down (checkpoint_layout/faults.py), not
    # because the checkpoint is bad: reported as EXIT_STORE_UNAVAILABLE (the broker waits).
    store_outage: bool = False
    stats: common_pb2.TransferStats = field(default_factory=common_pb2.TransferStats)
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    last_sent: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self.stats.src_uri, self.stats.dst_uri = self.src, self.dst
        self.stats.start_time = time.time()
        threading.Thread(target=self._run, name=f"stage-{self.launch.job_id}", daemon=True).start()

    def snapshot(self) -> common_pb2.TransferStats:
        with self._lock:
            out = common_pb2.TransferStats()
            out.CopyFrom(self.stats)
            if not out.done and not out.error:
                out.seconds = time.time() - out.start_time
            return out

    def transfer(self) -> common_pb2.TransferStats | None:
        """What the agent's updates carry: copy stats, or nothing for a resolve-only step."""
        return self.snapshot() if self.copies and self.src else None

    def failure(self) -> str:
        """'' or why the attempt cannot start (the update's message)."""
        if self.fetch_error:
            return f"workdir fetch failed: {self.fetch_error}"
        err = self.snapshot().error
        if not err:
            return ""
        if self.copies:
            return f"checkpoint transfer failed: {err}"
        return f"resume checkpoint unavailable: {err}"

    def _progress(self, done: int, total: int) -> None:
        with self._lock:
            self.stats.bytes_done, self.stats.bytes_total = done, total

    def _copy(self) -> Any:
        """Copy ``src``; if it is gone or incomplete, copy the newest complete checkpoint
        of the same attempt directory that is at least as new (and retry a few times).

        Why: the attempt that wrote ``src`` may still be alive on a partitioned agent
        (declared lost, not yet told to stop). It keeps training *and pruning* its own
        directory (keep_last), so the checkpoint the broker last heard of can vanish.
        Its newer checkpoints are complete, consistent points of the same run (the data
        order is deterministic), so resuming from one loses less work; they are only
        ever read, never written, by the new attempt (fencing is by directory)."""
        from checkpoint_layout import CheckpointMissing
        from region_agents.transfer import TransferError, copy_checkpoint

        src = self.src
        for attempt in range(4):
            try:
                return copy_checkpoint(src, self.dst, progress=self._progress,
                                       s3_client=_client_for(src, self.dst),
                                       **copy_tuning(src, self.dst))
            except TransferError as exc:
                if attempt == 3:
                    raise
                try:
                    newest = resolve_resume(self.src, s3_client=_client_for(self.src)).uri
                except CheckpointMissing:
                    raise exc from None
                if parse_step(newest.rpartition("/")[2]) == parse_step(src.rpartition("/")[2]):
                    continue  # the same checkpoint is still complete: try the copy again
                log.warning("%s: %s is gone or incomplete (its writer may still be pruning); "
                            "copying the newer complete %s instead", self.launch.job_id, src, newest)
                src = newest
                self.src = src
                self.dst = f"{self.dst.rstrip('/').rpartition('/')[0]}/{newest.rpartition('/')[2]}"
                with self._lock:
                    self.stats.src_uri, self.stats.dst_uri = self.src, self.dst
        raise AssertionError("unreachable")

    def _resolve(self) -> None:
        point = resolve_resume(self.src, s3_client=_client_for(self.src))
        if point.fell_back:
            log.warning("%s attempt %d: %s is gone or incomplete (its writer may still be "
                        "pruning); resuming from the newer complete %s instead",
                        self.launch.job_id, self.launch.attempt, self.src, point.uri)
        with self._lock:
            self.dst = point.uri
            self.stats.done = True

    def _run(self) -> None:
        if self.workdir_fetch is not None:
            try:
                self.workdir_fetch()
            except Exception as e:  # noqa: BLE001 - reported as the attempt's failure
                log.warning("%s attempt %d: workdir fetch failed: %s", self.launch.job_id,
                            self.launch.attempt, e)
                self.fetch_error = str(e)[:1000] or type(e).__name__
                self.finished.set()
                return
        if not self.src:  # only the workdir to fetch
            self.finished.set()
            return
        if not self.copies:
            try:
                self._resolve()
            except Exception as e:  # noqa: BLE001 - reported as the attempt's failure
                log.warning("%s attempt %d: cannot resume: %s", self.launch.job_id,
                            self.launch.attempt, e)
                self.store_outage = is_outage(e)
                with self._lock:
                    self.stats.error = str(e)[:1000] or type(e).__name__
            finally:
                self.finished.set()
            return
        try:
            res = self._copy()
            with self._lock:
                s = self.stats
                s.bytes_total = s.bytes_done = res.bytes
                s.seconds, s.mb_per_s, s.method, s.retries = res.seconds, res.mb_per_s, res.method, res.retries
                s.end_time = time.time()
                s.done = True
            log.info("%s attempt %d: copied %s -> %s (%.1f MB in %.2fs, %.0f MB/s, %s)",
                     self.launch.job_id, self.launch.attempt, self.src, self.dst, res.bytes / 1e6,
                     res.seconds, res.mb_per_s, res.method)
        except Exception as e:  # noqa: BLE001 - reported as the attempt's failure
            log.warning("%s attempt %d: checkpoint transfer failed: %s", self.launch.job_id,
                        self.launch.attempt, e)
            self.store_outage = is_outage(e)
            with self._lock:
                self.stats.error = str(e)[:1000] or type(e).__name__
                self.stats.end_time = time.time()
                self.stats.seconds = self.stats.end_time - self.stats.start_time
        finally:
            self.finished.set()
