"""Checkpoint storage: a local directory or `s3://bucket/prefix` (any S3-compatible endpoint).

A `Store` is one checkpoint root: it lists step directories, reads and writes manifests
and builds the DCP StorageWriter / StorageReader for one checkpoint. The bytes of the
shard files move through trainer/shardio.py (layout: trainer/shardfile.py); this module
binds that data path to a local directory or to S3.

Decision (measured in benchmarks/bench_checkpoint.py): every rank writes its own shard
files straight into the store inside DCP's save, and DCP's coordinator writes `.metadata`
only after all ranks reported success, so "rank 0's save returned" means "every byte is
in the store", on one node or many, with no extra barrier or shared staging disk. On S3
each file is a multipart upload whose parts are cut straight out of the tensors' memory
(no spool file: an earlier version wrote each shard to local disk first, which cost a
third of the save time) and uploaded `s3_max_concurrency` at a time per file.

Retries (bounded by `RETRY`, a `checkpoint_layout.RetryPolicy`, the policy the agents'
mover uses too, with the same transient-error check): botocore's "standard" mode retries
throttling and 5xx per request a few times; tenacity retries a part, a whole small
object or a whole file read (a stream cut mid-body is not a request botocore can
retry) on connection errors, throttling and 5xx, with exponential backoff. The two
layers multiply: the defaults allow 4 x 3 tries of one request (botocore's backoff of
up to 1 + 2 s per try, tenacity's 0.25 + 0.5 + 1 s between tries: about 15 s, more only
when requests hit the 60 s read timeout) before a save fails and the trainer reports it.
Reachability is probed once at start with a short deadline, so a wrong endpoint is a
clear exit 2, not a hang.

Visibility: a checkpoint counts only when its `manifest.json` exists (written last by
checkpoint.py), on both backends. Names, manifest format, listings and S3 client setup
come from `checkpoint_layout` (torch-free, shared with the region agents).

Over 400 lines on purpose: the two backends of one ``Store`` interface, with the hashing
file-system wrappers and the one retry policy (``RETRY``) they share.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import os
import shutil
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemBase

from checkpoint_layout import (
    MANIFEST,
    STEP_PREFIX,
    LayoutError,
    RetryPolicy,
    check_scheme,
    hash_bytes,
    hash_file,
    list_local_steps,
    list_s3_steps,
    make_probe_client,
    make_s3_client,
    new_hasher,
    split_s3_uri,
    split_step_uri,
    step_name,
)
from checkpoint_layout import manifest as manifest_format
from checkpoint_layout.faults import describe, is_outage
from trainer.errors import StoreUnavailable, TrainerError
from trainer.shardio import (
    EncodedFile,
    ShardReaderMixin,
    ShardWriterMixin,
    chunks_of,
    write_local,
)

__all__ = [
    "MANIFEST",
    "RETRY",
    "LocalStore",
    "RetryPolicy",
    "S3Store",
    "Store",
    "open_store",
    "split_checkpoint_uri",
    "step_name",
]

RETRY = RetryPolicy()  # read at call time (tests swap it for short waits)


def split_checkpoint_uri(uri: str) -> tuple[str, str]:
    """'s3://b/p/step-000000020' -> ('s3://b/p', 'step-000000020')."""
    try:
        return split_step_uri(uri)
    except LayoutError:
        raise TrainerError(
            f"CB_RESUME_FROM={uri.rstrip('/')!r} does not name a checkpoint directory "
            f"(expected .../{STEP_PREFIX}NNNNNNNNN)"
        ) from None


# ------------------------------------------------------------- .metadata (DCP's own finish)
class _HashingStream(io.RawIOBase):
    """Write-through wrapper that hashes the bytes as DCP's `finish` writes `.metadata`.

    A seek would make the streamed hash wrong, so it marks the hash unusable and the
    caller re-reads the file instead.
    """

    def __init__(self, raw: Any, on_close: Callable[[str | None, int], None]) -> None:
        super().__init__()
        self.raw = raw
        self._h = new_hasher()
        self._n = 0
        self._ok = True
        self._on_close = on_close

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        n = self.raw.write(mv)
        n = len(mv) if n is None else n
        self._h.update(mv[:n])
        self._n += n
        return n

    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        self._ok = False
        return self.raw.seek(offset, whence)

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.closed:
            try:
                self.raw.flush()
                self._on_close(self._h.hexdigest() if self._ok else None, self._n)
            finally:
                self.raw.close()
                super().close()


class _HashRegistry:
    """{file name: (digest, size)} of the files one writer's `fs` produced (thread-safe)."""

    def __init__(self) -> None:
        self.hashes: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def record(self, path: str | os.PathLike, digest: str, size: int) -> None:
        with self._lock:
            self.hashes[_basename(path)] = (digest, size)

    def moved(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        with self._lock:
            got = self.hashes.pop(_basename(path), None)
            if got is not None:
                self.hashes[_basename(new_path)] = got


def _basename(path: str | os.PathLike) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


class _HashingLocalFS(FileSystem, _HashRegistry):
    """Local DCP file system that records the digest of each file written through it."""

    def __init__(self) -> None:
        FileSystem.__init__(self)
        _HashRegistry.__init__(self)

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as f:
                yield f
            return

        def done(digest: str | None, size: int) -> None:
            self.record(path, digest or hash_file(str(path)), size)

        with _HashingStream(open(path, mode), done) as f:  # noqa: SIM115 - closed by wrapper
            yield f

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        self.moved(path, new_path)


class Store:
    """A checkpoint root: lists step directories, reads/writes manifests, builds DCP I/O."""

    root: str

    def uri(self, name: str) -> str:
        return f"{self.root}/{name}"

    def check_reachable(self) -> None: ...

    def list_steps(self) -> dict[int, bool]:
        """{step: has_manifest} for every step directory under the root."""
        raise NotImplementedError

    def read_manifest(self, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def write_manifest(self, name: str, manifest: dict[str, Any]) -> None:
        raise NotImplementedError

    def list_files(self, name: str) -> dict[str, int]:
        """{file name: size in bytes} of one checkpoint directory."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        raise NotImplementedError

    def writer(self, name: str, threads: int) -> FileSystemWriter:
        """A DCP writer; after the save its coordinator's `file_hashes` = {file: digest}."""
        raise NotImplementedError

    def reader(
        self, name: str, expected: dict[str, dict[str, Any]] | None = None
    ) -> FileSystemReader:
        """A DCP reader that checks every file it reads against `expected` (manifest entries)."""
        raise NotImplementedError


class LocalStore(Store):
    def __init__(self, root: str) -> None:
        self.root = str(Path(root.removeprefix("file://")).absolute())

    def check_reachable(self) -> None:
        """The directory exists or can be made; a full or unreachable disk is an outage
        (StoreUnavailable), a permission or path error the job's own (TrainerError)."""
        try:
            Path(self.root).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if is_outage(exc):
                raise StoreUnavailable(
                    f"checkpoint directory {self.root} is unavailable: {exc}") from None
            raise TrainerError(f"cannot create checkpoint directory {self.root}: {exc}") from None

    def list_steps(self) -> dict[int, bool]:
        return list_local_steps(self.root)

    def read_manifest(self, name: str) -> dict[str, Any]:
        path = Path(self.root) / name / MANIFEST
        return manifest_format.loads(path.read_bytes(), str(path))

    def write_manifest(self, name: str, manifest: dict[str, Any]) -> None:
        path = Path(self.root) / name / MANIFEST
        tmp = path.with_suffix(".json.tmp")
        with open(tmp, "wb") as f:
            f.write(manifest_format.dumps(manifest))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def list_files(self, name: str) -> dict[str, int]:
        d = Path(self.root) / name
        return {p.name: p.stat().st_size for p in d.iterdir() if p.is_file()}

    def delete(self, name: str) -> None:
        shutil.rmtree(Path(self.root) / name, ignore_errors=True)

    def writer(self, name: str, threads: int) -> FileSystemWriter:
        return LocalWriter(self.uri(name), threads)

    def reader(
        self, name: str, expected: dict[str, dict[str, Any]] | None = None
    ) -> FileSystemReader:
        return LocalReader(self.uri(name), expected or {})


class LocalWriter(ShardWriterMixin, FileSystemWriter):
    def __init__(self, path: str, threads: int) -> None:
        super().__init__(path, thread_count=threads, sync_files=True)
        self.fs = _HashingLocalFS()
        self.file_hashes = {}

    def _write_file(self, name: str, enc: EncodedFile, hasher: Any) -> None:
        write_local(os.path.join(str(self.path), name), enc.segments, hasher, fsync=True)


class LocalReader(ShardReaderMixin, FileSystemReader):
    def __init__(self, path: str, expected: dict[str, dict[str, Any]]) -> None:
        super().__init__(path)
        self.expected, self.where = expected, path

    @contextmanager
    def _open(self, name: str) -> Iterator[tuple[Callable[[memoryview], int], int]]:
        with open(os.path.join(str(self.path), name), "rb", buffering=0) as f:
            with contextlib.suppress(OSError, AttributeError):  # a hint: read ahead
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            yield f.readinto, os.fstat(f.fileno()).st_size


# --------------------------------------------------------------------------- S3


def _s3_client(max_concurrency: int) -> Any:
    return make_s3_client(retry=RETRY, max_pool=max(10, 2 * max_concurrency))


def _retrying(fn: Any) -> Any:
    """`fn` under the current `RETRY` policy (tenacity over checkpoint_layout.is_transient)."""
    return RETRY.wrap(fn)


class _S3FileSystem(FileSystemBase, _HashRegistry):
    """The DCP FileSystemBase over S3, for what DCP's `finish` writes itself (`.metadata`:
    small, so it is spooled in memory and sent in one PUT). Shard files do not come
    through here: see S3Writer. One instance per writer; its registry holds the digests.
    """

    def __init__(self, client: Any) -> None:
        _HashRegistry.__init__(self)
        self.client = client

    @staticmethod
    def _split(path: str | os.PathLike) -> tuple[str, str]:
        rest = str(path).removeprefix("s3://")
        bucket, _, key = rest.partition("/")
        return bucket, key

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        bucket, key = self._split(path)
        if "w" not in mode:
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
            yield io.BytesIO(body)
            return
        spool = io.BytesIO()
        yield spool
        data = spool.getvalue()
        _retrying(self.client.put_object)(Bucket=bucket, Key=key, Body=data)
        self.record(path, hash_bytes(data), len(data))

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}"

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        sb, sk = self._split(path)
        db, dk = self._split(new_path)
        self.client.copy_object(Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk})
        self.client.delete_object(Bucket=sb, Key=sk)
        self.moved(path, new_path)

    def init_path(self, path: str | os.PathLike) -> str:
        return str(path)

    def mkdir(self, path: str | os.PathLike) -> None:
        """S3 has no directories."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return str(checkpoint_id).startswith("s3://")

    def exists(self, path: str | os.PathLike) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = self._split(path)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise

    def rm_file(self, path: str | os.PathLike) -> None:
        bucket, key = self._split(path)
        self.client.delete_object(Bucket=bucket, Key=key)


COMPLETE_WAIT_S = 180.0  # how long a lost Complete's object may take to appear (_completed)
MULTIPART_THRESHOLD = 8 << 20
PART_SIZE = 16 << 20
MAX_PARTS = 10_000  # S3's limit per multipart upload


class S3Uploader:
    """Uploads one file given as byte segments (header + tensor memory) without a spool.

    Small files are one PUT. Larger ones are a multipart upload whose parts are copied
    out of the segments into a per-thread buffer that is reused across parts and saves
    (warm memory: fresh pages cost more than the copy on these machines) and sent as
    one body, `max_concurrency` parts in flight per file. Parts carry a CRC32 that S3
    checks on receipt, as boto3's own transfer manager sends by default; the whole
    file's xxh3-128 is computed alongside, for the manifest. On any failure the
    multipart upload is aborted, so no invisible parts are left behind (billed on AWS).
    """

    def __init__(self, client: Any, max_concurrency: int) -> None:
        self.client = client
        self.max_concurrency = max(1, max_concurrency)
        self._pools: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def _pool(self) -> ThreadPoolExecutor:
        """A pool per concurrent file (writer threads take one each and give it back)."""
        with self._lock:
            if self._pools:
                return self._pools.pop()
        return ThreadPoolExecutor(self.max_concurrency, "cb-s3-part")

    def _give_back(self, pool: ThreadPoolExecutor) -> None:
        with self._lock:
            self._pools.append(pool)

    def _buffer(self, n: int) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            buf = self._local.buf = bytearray(n)
        return memoryview(buf)

    def put(self, bucket: str, key: str, segments: list[memoryview], hasher: Any) -> None:
        size = sum(len(s) for s in segments)
        if size < MULTIPART_THRESHOLD:
            body = b"".join(segments)
            hasher.update(body)
            _retrying(self.client.put_object)(Bucket=bucket, Key=key, Body=body)
            return
        part = max(PART_SIZE, -(-size // MAX_PARTS))
        starts, pos = [], 0
        for seg in segments:
            starts.append(pos)
            pos += len(seg)
        uid = _retrying(self.client.create_multipart_upload)(
            Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32"
        )["UploadId"]
        pool = self._pool()
        futs = [
            pool.submit(
                self._part, bucket, key, uid, n + 1, off, min(off + part, size), segments, starts
            )
            for n, off in enumerate(range(0, size, part))
        ]
        try:
            for chunk in chunks_of(segments):  # while the parts are in flight
                hasher.update(chunk)
            parts = [f.result() for f in futs]
            self._complete(bucket, key, uid, parts, size)
        except BaseException:
            for f in futs:
                f.cancel()
            wait(futs)
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
            raise
        finally:
            self._give_back(pool)

    def _complete(
        self, bucket: str, key: str, uid: str, parts: list[dict[str, Any]], size: int
    ) -> None:
        """CompleteMultipartUpload, robust to a lost answer: when a retry fails because
        the first call did complete (its response timed out; the upload id is then gone,
        and S3 answers NoSuchUpload, moto a 500), the object is there with exactly our
        parts' multipart ETag. Seen under heavy load with a 1.5 GB part list on moto; a
        real store can lose a response the same way. Any other object is still an error
        (and the manifest's digests would catch a wrong one at load)."""
        try:
            _retrying(self.client.complete_multipart_upload)(
                Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts}
            )
        except Exception:
            if not self._completed(bucket, key, parts, size):
                raise

    def _completed(self, bucket: str, key: str, parts: list[dict[str, Any]], size: int) -> bool:
        """Is the object our completed upload? The first Complete may still be assembling
        it (the upload id is gone, the object not there yet: moto builds a 1.5 GB object
        for a minute under load), so a missing object is looked for again for up to
        COMPLETE_WAIT_S; an object that is not ours answers at once."""
        digests = b"".join(bytes.fromhex(p["ETag"].strip('"')) for p in parts)
        want = f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(parts)}"
        deadline = time.monotonic() + COMPLETE_WAIT_S
        while True:
            try:
                head = self.client.head_object(Bucket=bucket, Key=key)
            except Exception:  # noqa: BLE001 - not there (yet), or unreadable
                head = None
            if head is not None:
                return int(head.get("ContentLength", -1)) == size and head.get("ETag", "").strip('"') == want
            if time.monotonic() >= deadline:
                return False
            time.sleep(1.0)

    def _part(
        self,
        bucket: str,
        key: str,
        uid: str,
        number: int,
        start: int,
        end: int,
        segments: list[memoryview],
        starts: list[int],
    ) -> dict[str, Any]:
        n = end - start
        out = self._buffer(n)
        k = max(0, bisect.bisect_right(starts, start) - 1)
        got = 0
        while got < n:  # gather [start, end) from the segments
            seg, seg_start = segments[k], starts[k]
            lo = start + got - seg_start
            take = min(len(seg) - lo, n - got)
            out[got : got + take] = seg[lo : lo + take]
            got += take
            k += 1
        body: bytes | bytearray = out.obj if len(out) == n else out[:n].tobytes()  # type: ignore[assignment]
        resp = _retrying(self.client.upload_part)(
            Bucket=bucket,
            Key=key,
            UploadId=uid,
            PartNumber=number,
            Body=body,
            ChecksumAlgorithm="CRC32",
        )
        done = {"PartNumber": number, "ETag": resp["ETag"]}
        if "ChecksumCRC32" in resp:
            done["ChecksumCRC32"] = resp["ChecksumCRC32"]
        return done


class S3Writer(ShardWriterMixin, FileSystemWriter):
    def __init__(self, path: str, client: Any, uploader: S3Uploader, threads: int) -> None:
        super().__init__(path, thread_count=threads, sync_files=False)
        self.fs = _S3FileSystem(client)
        self.path = self.fs.init_path(path)
        self.uploader = uploader
        self.file_hashes = {}

    def _write_file(self, name: str, enc: EncodedFile, hasher: Any) -> None:
        bucket, key = _S3FileSystem._split(self.fs.concat_path(self.path, name))
        self.uploader.put(bucket, key, enc.segments, hasher)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _S3FileSystem.validate_checkpoint_id(checkpoint_id)


class S3Reader(ShardReaderMixin, FileSystemReader):
    """Each file is one streamed GET (S3-compatible servers that re-read the whole object
    per range request, like moto, are much slower with ranged GETs); more files per rank
    (option `storage_threads`) means more streams in parallel."""

    def __init__(self, path: str, client: Any, expected: dict[str, dict[str, Any]]) -> None:
        super().__init__(path)
        self.fs = _S3FileSystem(client)
        self.client = client
        self.path = self.fs.init_path(path)
        self.expected, self.where = expected, path

    @contextmanager
    def _open(self, name: str) -> Iterator[tuple[Callable[[memoryview], int], int]]:
        bucket, key = _S3FileSystem._split(self.fs.concat_path(self.path, name))
        resp = self.client.get_object(Bucket=bucket, Key=key)
        body = resp["Body"]
        try:
            yield body.readinto, int(resp["ContentLength"])
        finally:
            body.close()

    def _retry(self, fn: Callable[[], None]) -> None:
        _retrying(fn)()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _S3FileSystem.validate_checkpoint_id(checkpoint_id)


class S3Store(Store):
    def __init__(self, root: str, max_concurrency: int = 8) -> None:
        self.root = root.rstrip("/")
        try:
            self.bucket, self.prefix = split_s3_uri(self.root)
        except LayoutError as exc:
            raise TrainerError(str(exc)) from None
        self.client = _s3_client(max_concurrency)
        self.max_concurrency = max_concurrency
        self.uploader = S3Uploader(self.client, max_concurrency)

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def check_reachable(self) -> None:
        """One cheap call with few retries, so a wrong endpoint fails fast and clearly.

        What the failure means is checkpoint_layout/faults.py's table: an outage (refused,
        reset, DNS, timeout, 5xx, throttling) is StoreUnavailable, which the broker waits
        out; anything else (no bucket, access denied, no credentials) is the job's own
        configuration, TrainerError (exit 2)."""
        from botocore.exceptions import BotoCoreError, ClientError

        probe = make_probe_client()
        endpoint = probe.meta.endpoint_url
        try:
            probe.list_objects_v2(Bucket=self.bucket, Prefix=self._key(""), MaxKeys=1)
        except (ClientError, BotoCoreError) as exc:
            if is_outage(exc):
                raise StoreUnavailable(
                    f"checkpoint storage {self.root} is unreachable at endpoint {endpoint}: "
                    f"{describe(exc)}; the broker retries when the store is back"
                ) from None
            if isinstance(exc, ClientError):
                err = exc.response.get("Error", {})
                raise TrainerError(
                    f"checkpoint storage {self.root} is not usable at {endpoint}: "
                    f"{err.get('Code', '?')}: {err.get('Message', exc)}"
                ) from None
            raise TrainerError(
                f"checkpoint storage {self.root} is not usable at endpoint {endpoint}: {exc}. "
                "Check AWS_ENDPOINT_URL, the credentials and the bucket; retrying will not help."
            ) from None

    def _list(self, prefix: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        for page in pages:
            out.extend(page.get("Contents", []))
        return out

    def list_steps(self) -> dict[int, bool]:
        return list_s3_steps(self.client, self.bucket, self.prefix)

    def read_manifest(self, name: str) -> dict[str, Any]:
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(name, MANIFEST))["Body"]
        return manifest_format.loads(body.read(), self.uri(f"{name}/{MANIFEST}"))

    def write_manifest(self, name: str, manifest: dict[str, Any]) -> None:
        data = manifest_format.dumps(manifest)
        _retrying(self.client.put_object)(
            Bucket=self.bucket, Key=self._key(name, MANIFEST), Body=data
        )

    def list_files(self, name: str) -> dict[str, int]:
        base = self._key(name) + "/"
        return {o["Key"][len(base) :]: int(o["Size"]) for o in self._list(base)}

    def delete(self, name: str) -> None:
        keys = [{"Key": o["Key"]} for o in self._list(self._key(name) + "/")]
        # Delete the manifest first so a half-deleted checkpoint is never "complete".
        keys.sort(key=lambda k: not k["Key"].endswith(MANIFEST))
        for k in keys:
            self.client.delete_object(Bucket=self.bucket, Key=k["Key"])

    def writer(self, name: str, threads: int) -> FileSystemWriter:
        return S3Writer(self.uri(name), self.client, self.uploader, threads)

    def reader(
        self, name: str, expected: dict[str, dict[str, Any]] | None = None
    ) -> FileSystemReader:
        return S3Reader(self.uri(name), self.client, expected or {})


def open_store(root: str, max_concurrency: int = 8) -> Store:
    if root.startswith("s3://"):
        return S3Store(root, max_concurrency)
    try:
        check_scheme(root)
    except LayoutError as exc:
        raise TrainerError(str(exc)) from None
    return LocalStore(root)
