"""Checkpoint mover: copy one complete checkpoint between region stores (local dir or S3).

Used when the broker moves a job to another region (DESIGN "Capacity shifts and
cross-region migration"): the job's latest complete checkpoint is copied from the old
region's store (`s3://cb-<region>/jobs/<id>/step-NNNNNNNNN` or a local dir) into the new
region's store, and the trainer resumes from the copy. A cross-region read at resume time
is the alternative (`plan_move(..., mode="direct")`): no copy, slower/egress-priced loads.

Why the protocol looks like this (docs/contracts.md section 3: a checkpoint is complete
iff its `manifest.json` exists, and the manifest lists every file with its size):
* only manifest-listed files are copied, in parallel (a ThreadPoolExecutor of `workers`
  files; each large file itself moves in parallel parts through one shared s3transfer
  manager, as `aws s3 cp` does);
* every file is verified at the destination against the manifest (size always; a
  checksum when the manifest carries one) before the manifest is written, and the
  manifest is copied LAST, byte for byte, so the destination becomes "complete" in one
  step and a half-finished copy is never resumable;
* any destination manifest is deleted FIRST, so overwriting an older copy cannot leave
  a stale manifest over new, half-copied files;
* on failure what was written is removed (best effort, incl. dangling multipart uploads)
  and `TransferFailed` says which file failed and why.

Methods (recorded in `TransferResult.method`): local->local `local-copy`; local->S3
`upload` (multipart, parallel parts); S3->local `download` (ranged GETs in parallel);
S3->S3 on one endpoint `server-side-copy` (CopyObject, or UploadPartCopy above the
multipart threshold: bytes never leave the store, as in real cross-region S3 copies);
S3->S3 across endpoints, or where the store refuses server-side copy, `stream`
(download to a spool file, then upload).

Retries: botocore retries single requests (parts) a few times; tenacity retries a whole
file on throttling, 5xx, connection errors and verification mismatches with exponential
backoff, bounded by `RetryPolicy.attempts`. Checkpoint naming, manifest parsing, digests,
"latest complete", the retry policy, the transient-error check and the S3 client come
from `checkpoint_layout`, the torch-free package the trainer's storage layer uses too, so
the agent and the trainer cannot disagree about any of them.

Verification details: a streamed copy hashes the bytes that land at the destination
(the downloaded file or the spool file that is then uploaded with S3's per-request CRC
checks); an upload hashes its local source (S3 validates each request's CRC, so what
landed is what was read); a server-side copy compares size and, for single-part
objects, the ETag (an MD5 of the content), and re-reads the copy only when the manifest
has a checksum.

Over 400 lines on purpose: one copy protocol (plan, per-file method, verification,
retries, progress, manifest last) whose parts share the same entries and progress state;
the two kinds of place it copies between are in ``checkpoint_dirs.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from s3transfer.subscribers import BaseSubscriber

from checkpoint_layout import (
    MANIFEST,
    MOVER_RETRY,
    RetryPolicy,
    TransientError,
    check_scheme,
    expected_digest,
    hash_file,
    is_transient,
    make_s3_client,
    new_hasher,
    normalize,
    parse_step,
    split_step_uri,
)
from checkpoint_layout import latest_complete_checkpoint as _latest_complete
from checkpoint_layout import manifest as manifest_format
from checkpoint_layout.retry import chain as _chain
from checkpoint_layout.retry import error_code as _error_code
from region_agents.checkpoint_dirs import LocalDir, S3Dir, place

__all__ = [
    "IncompleteCheckpoint",
    "MovePlan",
    "RetryPolicy",
    "TransferError",
    "TransferFailed",
    "TransferResult",
    "copy_checkpoint",
    "is_transient",
    "latest_complete_checkpoint",
    "make_s3_client",
    "plan_move",
]

MiB = 1024 * 1024
_COPY_CHUNK = 8 * MiB

ProgressFn = Callable[[int, int], None]


class TransferError(Exception):
    """Base of the mover's errors; the message is meant for users and operators."""


class IncompleteCheckpoint(TransferError):
    """The source is not a complete checkpoint (no manifest.json): never copy or resume it."""


class TransferFailed(TransferError):
    """The copy did not complete; the destination has no manifest (it is not resumable)."""


@dataclass(frozen=True)
class TransferResult:
    src: str
    dst: str
    bytes: int  # checkpoint bytes (data files + manifest) now at the destination
    files: int  # files including the manifest
    seconds: float
    mb_per_s: float  # bytes / seconds / 1e6
    method: str  # local-copy | upload | download | server-side-copy | stream | already-complete
    retries: int = 0  # whole-file retries tenacity made

    @classmethod
    def timed(cls, src: str, dst: str, total: int, files: int, t0: float, method: str,
              retries: int = 0) -> TransferResult:
        """The result of a transfer that started at ``perf_counter()`` ``t0`` and ends now."""
        secs = time.perf_counter() - t0
        return cls(src, dst, total, files, secs, total / max(secs, 1e-9) / 1e6, method, retries)


@dataclass(frozen=True)
class MovePlan:
    """What moving a job's checkpoint to another region's store means, before any I/O."""

    mode: str  # "copy" | "direct" | "same-store"
    src_uri: str  # the complete checkpoint to move
    dst_uri: str  # where it will live ("" for direct: nothing is written)
    resume_from: str  # what the next attempt's Launch.resume_from must be

    @property
    def needs_copy(self) -> bool:
        return self.mode == "copy"

    def execute(self, **kwargs: Any) -> TransferResult | None:
        """Run the copy this plan calls for (kwargs go to copy_checkpoint); None if none."""
        if not self.needs_copy:
            return None
        return copy_checkpoint(self.src_uri, self.dst_uri, **kwargs)


# ----------------------------------------------------------------------------- URIs


# --------------------------------------------------------------------------- errors


def _copy_refused(exc: BaseException) -> bool:
    """The store does not do (or allow) server-side copy: stream instead (MinIO gateways,
    some S3-compatibles, bucket policies that deny s3:GetObject on a copy source)."""
    for e in _chain(exc):
        code, status = _error_code(e)
        if status in (501, 403, 405) or code in {
            "NotImplemented",
            "XNotImplemented",
            "AccessDenied",
            "MethodNotAllowed",
        }:
            return True
    return False


def _describe(exc: BaseException) -> str:
    for e in _chain(exc):
        code, status = _error_code(e)
        if code or status:
            msg = getattr(e, "response", {}).get("Error", {}).get("Message", "")
            return f"{code or 'HTTP'} {status}: {msg}".strip().rstrip(":")
    return f"{type(exc).__name__}: {exc}"


class _Mismatch(TransientError):
    """Destination bytes do not match the manifest (retried, then reported)."""


# --------------------------------------------------------------------------- progress


class _Progress:
    """Monotonic (bytes_done, bytes_total) across threads and retries.

    s3transfer reports negative progress when it rewinds a part for a retry, and a
    retried file starts again from 0: each file counts as the most it ever reached.
    """

    def __init__(self, total: int, fn: ProgressFn | None) -> None:
        self.total, self.fn = total, fn
        self.done = 0
        self._best: dict[str, int] = {}
        self._cur: dict[str, int] = {}
        self._lock = threading.Lock()

    def restart(self, name: str) -> None:
        with self._lock:
            self._cur[name] = 0

    def add(self, name: str, n: int, cap: int) -> None:
        with self._lock:
            cur = self._cur.get(name, 0) + n
            self._cur[name] = cur
            best = self._best.get(name, 0)
            new = min(cur, cap)
            if new > best:
                self._best[name] = new
                self.done += new - best
                if self.fn is not None:
                    self.fn(self.done, self.total)

    def complete(self, name: str, size: int) -> None:
        with self._lock:
            best = self._best.get(name, 0)
            if size > best:
                self._best[name] = size
                self.done += size - best
            if self.fn is not None and (size > best or size == 0):
                self.fn(self.done, self.total)


class _Subscriber(BaseSubscriber):
    """s3transfer subscriber that forwards on_progress to _Progress."""

    def __init__(self, prog: _Progress, name: str, size: int) -> None:
        self.prog, self.name, self.size = prog, name, size

    def on_progress(self, bytes_transferred: int = 0, **kwargs: Any) -> None:
        self.prog.add(self.name, bytes_transferred, self.size)


def _subscriber(prog: _Progress, name: str, size: int) -> Any:
    return _Subscriber(prog, name, size)


# --------------------------------------------------------------------------- checksums


def _hash_s3(client: Any, bucket: str, key: str, algo: str) -> str:
    h = new_hasher(algo)
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    for chunk in body.iter_chunks(_COPY_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _check_digest(name: str, got: str, want: tuple[str, str] | None) -> None:
    if want is not None and got != want[1]:
        raise _Mismatch(f"{name}: {want[0]} {got} != manifest {want[1]}")


# --------------------------------------------------------------------------- copier


@dataclass
class _Copier:
    src: LocalDir | S3Dir
    dst: LocalDir | S3Dir
    method: str
    prog: _Progress
    verify_checksums: bool
    down: Any  # s3transfer TransferManager on the source's client (GETs), or None
    up: Any  # ... on the destination's client (PUTs, server-side copies), or None
    spool_dir: str
    fallbacks: list[str] = field(default_factory=list)

    def copy(self, entry: dict[str, Any]) -> None:
        name, size = entry["name"], int(entry["size"])
        want = expected_digest(entry) if self.verify_checksums else None
        self.prog.restart(name)
        src, dst = self.src, self.dst
        if isinstance(src, LocalDir) and isinstance(dst, LocalDir):
            self._local_copy(name, size, want)
        elif isinstance(src, LocalDir) and isinstance(dst, S3Dir):
            if want is not None:
                _check_digest(name, hash_file(src.file(name), want[0]), want)
            self.up.upload(
                str(src.file(name)),
                dst.bucket,
                dst.key(name),
                subscribers=[_subscriber(self.prog, name, size)],
            ).result()
        elif isinstance(src, S3Dir) and isinstance(dst, LocalDir):
            with dst.open_write(name) as fo:  # through no link the job could have planted
                self.down.download(
                    src.bucket,
                    src.key(name),
                    fo,
                    subscribers=[_subscriber(self.prog, name, size)],
                ).result()
                fo.flush()
                os.fsync(fo.fileno())  # durable before the manifest can say "complete"
            if want is not None:
                _check_digest(name, hash_file(dst.file(name), want[0]), want)
        else:
            assert isinstance(src, S3Dir) and isinstance(dst, S3Dir)
            if self.method == "server-side-copy" and name not in self.fallbacks:
                try:
                    self._server_copy(name, size, want)
                except Exception as exc:
                    if not _copy_refused(exc):
                        raise
                    self.fallbacks.append(name)  # the store refuses copies: stream this file
                    self.prog.restart(name)
                    self._stream(name, size, want)
            else:
                self._stream(name, size, want)
        self._verify_size(name, size)
        self.prog.complete(name, size)

    def _local_copy(self, name: str, size: int, want: tuple[str, str] | None) -> None:
        assert isinstance(self.src, LocalDir) and isinstance(self.dst, LocalDir)
        h = new_hasher(want[0]) if want else None
        with open(self.src.file(name), "rb") as fi, self.dst.open_write(name) as fo:
            while chunk := fi.read(_COPY_CHUNK):
                fo.write(chunk)  # hash exactly what is written to the destination
                if h is not None:
                    h.update(chunk)
                self.prog.add(name, len(chunk), size)
            fo.flush()
            os.fsync(fo.fileno())  # durable before the manifest can say "complete"
        if h is not None:
            _check_digest(name, h.hexdigest(), want)

    def _server_copy(self, name: str, size: int, want: tuple[str, str] | None) -> None:
        assert isinstance(self.src, S3Dir) and isinstance(self.dst, S3Dir)
        src, dst = self.src, self.dst
        self.up.copy(
            {"Bucket": src.bucket, "Key": src.key(name)},
            dst.bucket,
            dst.key(name),
            subscribers=[_subscriber(self.prog, name, size)],
            source_client=src.client,
        ).result()
        if want is not None:  # the manifest has a checksum: re-read the copy
            _check_digest(name, _hash_s3(dst.client, dst.bucket, dst.key(name), want[0]), want)
            return
        s_etag = (src.head(name) or {}).get("ETag", "")
        d_etag = (dst.head(name) or {}).get("ETag", "")
        if s_etag and d_etag and "-" not in s_etag and "-" not in d_etag and s_etag != d_etag:
            raise _Mismatch(f"{name}: ETag {d_etag} != source {s_etag}")

    def _stream(self, name: str, size: int, want: tuple[str, str] | None) -> None:
        assert isinstance(self.src, S3Dir) and isinstance(self.dst, S3Dir)
        fd, tmp = tempfile.mkstemp(prefix="cb-xfer-", dir=self.spool_dir)
        os.close(fd)
        try:
            self.down.download(self.src.bucket, self.src.key(name), tmp).result()
            if want is not None:
                _check_digest(name, hash_file(Path(tmp), want[0]), want)
            self.up.upload(
                tmp,
                self.dst.bucket,
                self.dst.key(name),
                subscribers=[_subscriber(self.prog, name, size)],
            ).result()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _verify_size(self, name: str, size: int) -> None:
        got = self.dst.size(name)
        if got != size:
            raise _Mismatch(f"{name}: {got} bytes at the destination, manifest says {size}")


def _retrying(policy: RetryPolicy, counter: list[int]) -> Any:
    """The policy's tenacity loop, counting whole-file retries into `counter`."""
    return policy.retrying(before_sleep=lambda _: counter.append(1))


def _load_manifest(src: LocalDir | S3Dir) -> tuple[bytes, list[dict[str, Any]]]:
    raw = src.read(MANIFEST)
    if raw is None:
        raise IncompleteCheckpoint(
            f"{src.uri} is not a complete checkpoint: it has no {MANIFEST} "
            "(still being written, or abandoned); refusing to copy it"
        )
    try:
        manifest = manifest_format.loads(raw, f"{src.uri}/{MANIFEST}")
    except manifest_format.ManifestError as exc:
        raise TransferFailed(f"{exc}; refusing to copy") from None
    return raw, manifest_format.entries(manifest)


def copy_checkpoint(
    src_uri: str,
    dst_uri: str,
    *,
    progress: ProgressFn | None = None,
    workers: int = 8,
    max_concurrency: int = 10,
    part_size: int = 16 * MiB,
    multipart_threshold: int = 16 * MiB,
    server_side: bool | None = None,
    verify_checksums: bool = True,
    retry: RetryPolicy | None = None,
    s3_client: Any = None,
    dst_s3_client: Any = None,
    endpoint_url: str | None = None,
) -> TransferResult:
    """Copy the complete checkpoint `src_uri` (.../step-NNNNNNNNN) to the directory `dst_uri`.

    `progress(bytes_done, bytes_total)` is called from worker threads with monotonically
    increasing bytes, last with (total, total). `workers` files move at once; large files
    move in `part_size` parts, `max_concurrency` requests in flight in all. `server_side`:
    None = S3->S3 copies server-side when both sides share one endpoint (client), True =
    the same, False = always stream. `s3_client` serves both sides (default: one built from
    AWS_ENDPOINT_URL or `endpoint_url`); `dst_s3_client` gives the destination its own
    endpoint. Raises IncompleteCheckpoint (no manifest at src), TransferFailed (the copy
    did not complete; the destination is left without a manifest, partial files removed)
    and ValueError (bad URIs).
    """
    from s3transfer.manager import TransferConfig, TransferManager

    retry = retry or MOVER_RETRY
    split_step_uri(src_uri)
    check_scheme(src_uri)
    check_scheme(dst_uri)
    if src_uri.rstrip("/") == dst_uri.rstrip("/"):
        raise ValueError(f"source and destination are the same checkpoint: {src_uri}")
    s3_uris = [u for u in (src_uri, dst_uri) if u.startswith("s3://")]
    pool = max(32, max_concurrency + 2 * workers + 4)
    if s3_uris and s3_client is None:
        s3_client = make_s3_client(endpoint_url, retry=retry, max_pool=pool)
    dst_client = dst_s3_client or s3_client
    src = place(src_uri, s3_client)
    dst = place(dst_uri, dst_client)

    t0 = time.perf_counter()
    raw_manifest, entries = _load_manifest(src)
    have = src.sizes()
    for e in entries:
        if have.get(e["name"]) != e["size"]:
            raise TransferFailed(
                f"source checkpoint {src.uri} is corrupt: {e['name']} has "
                f"{have.get(e['name'])} bytes, its manifest says {e['size']}; refusing to copy"
            )
    total = sum(e["size"] for e in entries) + len(raw_manifest)
    prog = _Progress(total, progress)

    if dst.read(MANIFEST) == raw_manifest and all(
        dst.size(e["name"]) == e["size"] for e in entries
    ):
        prog.complete(MANIFEST, total)  # nothing to do: report done
        return TransferResult.timed(src.uri, dst.uri, total, len(entries) + 1, t0,
                                    "already-complete")

    if isinstance(src, LocalDir):
        method = "local-copy" if isinstance(dst, LocalDir) else "upload"
    elif isinstance(dst, LocalDir):
        method = "download"
    else:
        same = s3_client is dst_client or (
            s3_client.meta.endpoint_url == dst_client.meta.endpoint_url
        )
        method = "server-side-copy" if (server_side is not False and same) else "stream"

    managers: list[Any] = []
    down = up = None
    if s3_uris:
        cfg = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=part_size,
            max_request_concurrency=max_concurrency,
            num_download_attempts=max(1, retry.botocore_attempts),
        )
        if isinstance(src, S3Dir):
            down = TransferManager(src.client, cfg)
            managers.append(down)
        if isinstance(dst, S3Dir):
            up = (
                down
                if (down is not None and dst.client is src.client)
                else TransferManager(dst.client, cfg)
            )
            if up is not down:
                managers.append(up)
    spool = tempfile.mkdtemp(prefix="cb-xfer-") if method in ("stream", "server-side-copy") else ""
    copier = _Copier(src, dst, method, prog, verify_checksums, down, up, spool)
    retries: list[int] = []
    try:
        with contextlib.suppress(Exception):
            dst.delete([MANIFEST])  # an older copy's manifest must not vouch for new files
        if dst.read(MANIFEST) is not None:
            raise TransferFailed(f"cannot remove the existing {MANIFEST} at {dst.uri}")
        _run_parallel(copier, entries, workers, retry, retries)
        dst.write_durable(MANIFEST, raw_manifest)  # LAST: now the copy is complete
        if dst.read(MANIFEST) != raw_manifest:
            raise TransferFailed(f"{MANIFEST} at {dst.uri} does not read back as written")
        prog.complete(MANIFEST, len(raw_manifest))
    except BaseException as exc:
        dst.delete([MANIFEST])
        dst.cleanup()
        if isinstance(exc, TransferError) or not isinstance(exc, Exception):
            raise
        raise TransferFailed(f"copying {src.uri} -> {dst.uri} failed: {exc}") from exc
    finally:
        for m in managers:
            m.shutdown()
        if spool:
            shutil.rmtree(spool, ignore_errors=True)
    if copier.fallbacks:
        method = "stream (server-side copy refused)"
    return TransferResult.timed(src.uri, dst.uri, total, len(entries) + 1, t0, method,
                                len(retries))


def _run_parallel(
    copier: _Copier,
    entries: list[dict[str, Any]],
    workers: int,
    policy: RetryPolicy,
    retries: list[int],
) -> None:
    """Copy every entry (biggest first, so the tail is short); stop early on a hard failure."""
    stop = threading.Event()

    def one(entry: dict[str, Any]) -> None:
        if stop.is_set():
            return
        try:
            for attempt in _retrying(policy, retries):
                with attempt:
                    if stop.is_set():
                        return
                    copier.copy(entry)
        except BaseException as exc:
            stop.set()
            reason = (
                _describe(exc) if not isinstance(exc, _Mismatch) else f"verification failed: {exc}"
            )
            tries = "" if not is_transient(exc) else f" after {policy.attempts} attempts"
            raise TransferFailed(
                f"copying {copier.src.uri} -> {copier.dst.uri} failed on {entry['name']}{tries}: {reason}"
            ) from exc

    order = sorted(entries, key=lambda e: -e["size"])
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="cb-xfer") as ex:
        futs = [ex.submit(one, e) for e in order]
        done, _ = wait(futs, return_when=FIRST_EXCEPTION)
        for f in futs:
            f.cancel()
        wait(futs)
    for f in futs:
        if not f.cancelled() and f.exception() is not None:
            raise f.exception()  # type: ignore[misc]


# --------------------------------------------------------------------------- queries


def latest_complete_checkpoint(base_uri: str, *, s3_client: Any = None) -> str | None:
    """The highest-step checkpoint under `base_uri` that has a manifest, or None
    (checkpoint_layout's discovery: the same listing the trainer's Store uses)."""
    return _latest_complete(base_uri, s3_client=s3_client)


def plan_move(
    src_uri: str, dst_base_uri: str, mode: str = "copy", *, s3_client: Any = None
) -> MovePlan:
    """Decide how a job's checkpoint follows it to another region's store.

    `src_uri` is a complete checkpoint (.../step-N) or a job's checkpoint root (its latest
    complete checkpoint is used; that lists the store). `mode="copy"`: copy into
    `<dst_base_uri>/step-N` and resume from there (fast loads, one bulk transfer);
    `"direct"`: no copy, the destination reads the source cross-region (resume_from=src;
    right for a short remaining run or a huge checkpoint). If the checkpoint already lives
    under `dst_base_uri` nothing moves ("same-store").
    """
    if mode not in ("copy", "direct"):
        raise ValueError(f"unknown move mode {mode!r}: use 'copy' or 'direct'")
    check_scheme(src_uri)
    check_scheme(dst_base_uri)
    src = src_uri.rstrip("/")
    if parse_step(src.rpartition("/")[2]) is None:
        found = latest_complete_checkpoint(src, s3_client=s3_client)
        if found is None:
            raise IncompleteCheckpoint(f"no complete checkpoint under {src_uri}: nothing to move")
        src = found
    parent, name = split_step_uri(src)
    base = dst_base_uri.rstrip("/")
    if normalize(parent) == normalize(base):
        return MovePlan("same-store", src, src, src)
    if mode == "direct":
        return MovePlan("direct", src, "", src)
    dst = f"{base}/{name}"
    return MovePlan("copy", src, dst, dst)

