"""Durable, content-addressed blob store for workdir tarballs.

Why content addressing: a blob is named by the sha256 of its bytes, so an upload is
idempotent (same code = same name, uploaded once), a reader can verify what it got,
and a job moved to another region runs exactly the bytes that were submitted.
Writes become visible only complete and verified: the local store writes a temp file
and renames it; the S3 store checks the bytes, uploads them to a temp key, then copies
them to the final key (S3 has no rename; each object write is atomic).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
CHUNK = 1024 * 1024


class BlobError(Exception):
    """A blob could not be stored (bad digest, size mismatch, store failure)."""


class DigestMismatch(BlobError):
    pass


def check_digest(digest: str) -> None:
    if not DIGEST_RE.match(digest):
        raise BlobError(f"digest {digest!r} is not of the form sha256:<64 lowercase hex>")


class BlobStore(Protocol):
    """What the workdir service needs; both stores pass tests/broker/test_blobstore.py."""

    url: str

    def size(self, digest: str) -> int | None:
        """Size of a stored blob, or None when it is not stored."""

    def put(self, digest: str, size: int, chunks: Iterable[bytes]) -> int:
        """Store ``chunks``; verify they are ``size`` bytes hashing to ``digest``."""

    def read(self, digest: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """The blob's bytes in chunks; KeyError when it is not stored."""

    def grant(self, digest: str, team: str) -> None:
        """Record that ``team`` uploaded (proved it holds) the bytes of ``digest``."""

    def granted(self, digest: str, team: str) -> bool:
        """Did ``team`` upload ``digest``? (blobs are shared, their use is not)"""


def team_key(team: str) -> str:
    """A file/object name for a team (any characters the broker allows in team names)."""
    return hashlib.sha256(team.encode()).hexdigest()[:32]


def verify_stream(digest: str, size: int, chunks: Iterable[bytes]) -> int:
    """Consume ``chunks`` and check they are ``size`` bytes hashing to ``digest`` (an
    upload of bytes already stored: nothing is written, the claim is still checked)."""
    h = hashlib.sha256()
    n = 0
    for c in chunks:
        n += len(c)
        if n > size:
            raise BlobError(f"upload of {digest} is longer than the announced {size} bytes")
        h.update(c)
    _verify(digest, size, n, h)
    return n


def _verify(digest: str, size: int, got_size: int, h: Any) -> None:
    if got_size != size:
        raise BlobError(f"upload of {digest} ended after {got_size} bytes; {size} announced")
    got = "sha256:" + h.hexdigest()
    if got != digest:
        raise DigestMismatch(f"uploaded bytes hash to {got}, not the announced {digest}")


class LocalBlobStore:
    """Blobs as files ``<root>/sha256/<hex[:2]>/<hex>``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.url = str(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # users' code: no other local user lists or reads it

    def _path(self, digest: str) -> Path:
        check_digest(digest)
        hexd = digest.removeprefix("sha256:")
        return self.root / "sha256" / hexd[:2] / hexd

    def size(self, digest: str) -> int | None:
        try:
            return self._path(digest).stat().st_size
        except FileNotFoundError:
            return None

    def put(self, digest: str, size: int, chunks: Iterable[bytes]) -> int:
        final = self._path(digest)
        os.makedirs(final.parent, mode=0o700, exist_ok=True)
        h = hashlib.sha256()
        n = 0
        fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=final.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                for c in chunks:
                    n += len(c)
                    if n > size:
                        raise BlobError(
                            f"upload of {digest} is longer than the announced {size} bytes")
                    h.update(c)
                    f.write(c)
                f.flush()
                os.fsync(f.fileno())
            _verify(digest, size, n, h)
            os.replace(tmp, final)  # atomic: readers see nothing or the whole verified blob
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return n

    def _grant_path(self, digest: str, team: str) -> Path:
        check_digest(digest)
        return self.root / "teams" / team_key(team) / digest.removeprefix("sha256:")

    def grant(self, digest: str, team: str) -> None:
        p = self._grant_path(digest, team)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()

    def granted(self, digest: str, team: str) -> bool:
        return self._grant_path(digest, team).exists()

    def read(self, digest: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        path = self._path(digest)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the generator
        except FileNotFoundError:
            raise KeyError(digest) from None
        return _file_chunks(f, chunk_size)


def _file_chunks(f: Any, chunk_size: int) -> Iterator[bytes]:
    with f:
        while True:
            b = f.read(chunk_size)
            if not b:
                return
            yield b


class S3BlobStore:
    """Blobs as objects ``s3://bucket/<prefix>/sha256/<hex>``.

    The bytes are spooled to a local temp file while hashed, sent to a temp key only
    once they verify, then copied to the final key and the temp key deleted, so the
    final key never holds bad or partial bytes.
    """

    def __init__(self, url: str, client: Any | None = None) -> None:
        rest = url.removeprefix("s3://")
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise BlobError(f"workdir_store {url!r} names no bucket (s3://bucket/prefix)")
        self.prefix = prefix.strip("/")
        self.url = url
        if client is None:
            import boto3

            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            client = boto3.client("s3", endpoint_url=endpoint or None)
        self.s3 = client

    def _key(self, digest: str) -> str:
        check_digest(digest)
        name = f"sha256/{digest.removeprefix('sha256:')}"
        return f"{self.prefix}/{name}" if self.prefix else name

    def size(self, digest: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=self._key(digest))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise BlobError(f"cannot reach workdir store {self.url}: {e}") from None
        return int(head["ContentLength"])

    def put(self, digest: str, size: int, chunks: Iterable[bytes]) -> int:
        key = self._key(digest)
        tmp_key = f"{key}.upload-{uuid.uuid4().hex}"
        h = hashlib.sha256()
        n = 0
        # Spool to a local temp file: boto's upload_fileobj wants a seekable stream for
        # multipart retries, and the digest must be known before the final key exists.
        with tempfile.TemporaryFile() as spool:
            for c in chunks:
                n += len(c)
                if n > size:
                    raise BlobError(f"upload of {digest} is longer than the announced {size} bytes")
                h.update(c)
                spool.write(c)
            _verify(digest, size, n, h)
            spool.seek(0)
            self.s3.upload_fileobj(spool, self.bucket, tmp_key)
        try:
            self.s3.copy_object(Bucket=self.bucket, Key=key,
                                CopySource={"Bucket": self.bucket, "Key": tmp_key})
        finally:
            self.s3.delete_object(Bucket=self.bucket, Key=tmp_key)
        return n

    def _grant_key(self, digest: str, team: str) -> str:
        check_digest(digest)
        name = f"teams/{team_key(team)}/{digest.removeprefix('sha256:')}"
        return f"{self.prefix}/{name}" if self.prefix else name

    def grant(self, digest: str, team: str) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self._grant_key(digest, team), Body=b"")

    def granted(self, digest: str, team: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.s3.head_object(Bucket=self.bucket, Key=self._grant_key(digest, team))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise BlobError(f"cannot reach workdir store {self.url}: {e}") from None
        return True

    def read(self, digest: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=self._key(digest))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise KeyError(digest) from None
            raise BlobError(f"cannot read {digest} from {self.url}: {e}") from None
        return obj["Body"].iter_chunks(chunk_size)


def default_store_url(store_url: str) -> str:
    """The broker's default: ``workdirs/`` next to the SQLite file, else ``var/workdirs``."""
    if store_url.startswith("sqlite:///"):
        db = store_url.removeprefix("sqlite:///")
        if db and db != ":memory:":
            return str(Path(db).resolve().parent / "workdirs")
    return str(Path("var/workdirs").resolve())


def open_blob_store(url: str) -> BlobStore:
    """``s3://bucket/prefix`` or a local directory (``file://`` accepted)."""
    if url.startswith("s3://"):
        return S3BlobStore(url)
    if "://" in url and not url.startswith("file://"):
        raise BlobError(f"workdir_store {url!r}: use a directory or s3://bucket/prefix")
    return LocalBlobStore(url.removeprefix("file://"))
