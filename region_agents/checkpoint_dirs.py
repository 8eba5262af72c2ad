"""Where a checkpoint mover reads and writes: a local directory or an S3 prefix, behind
one small interface (sizes, read, size, write_durable, delete, cleanup) that
``transfer.py``'s copier picks its method by.

Why local writes go through directory fds: the (root) agent copies checkpoints into a
directory the job's identity owns. A path-based ``open``/``mkdir``/``unlink``/``rmtree``
there follows whatever link the job planted (``step-000100 -> /root/.ssh``, with file
names the job's manifest chose), i.e. root writes where the job says. So the directory
is opened one component at a time with ``O_NOFOLLOW`` (a symlink is crossed only if
root owns it and only root can write where it sits: an operator's ``/data ->
/mnt/data``), and everything below it is made, written, renamed and removed relative to
fds, never through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path
from typing import Any, BinaryIO

from checkpoint_layout import check_scheme, split_s3_uri
from checkpoint_layout.retry import error_code

__all__ = ["LocalDir", "S3Dir", "fsync_dir", "fsync_file", "open_dir_nofollow", "place"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir_nofollow(path: str | Path, create: bool = False, _depth: int = 0) -> int:
    """An fd of absolute directory ``path``, walked from ``/`` one component at a time
    (made 0755 if missing and ``create``). A symlink on the way is crossed only when
    root owns it *and* its directory is root's and not group/other-writable; any other
    link raises OSError(ELOOP) naming it. The caller closes the fd."""
    if _depth > 8:
        raise OSError(errno.ELOOP, f"{path}: too many operator symlinks")
    fd = os.open("/", _DIR)
    walked = "/"
    try:
        for part in Path(path).parts[1:]:
            if part in (".", ".."):
                raise OSError(errno.EINVAL, f"{path}: '.' or '..' in a checkpoint path")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = os.stat(part, dir_fd=fd, follow_symlinks=False)
                here = os.fstat(fd)
                if (not stat.S_ISLNK(link.st_mode) or link.st_uid != 0 or here.st_uid != 0
                        or here.st_mode & 0o022):
                    raise OSError(errno.ELOOP, f"{os.path.join(walked, part)} is a symlink"
                                  " a job could have planted (or not a directory): not"
                                  " followed") from None
                target = os.path.join(walked, os.readlink(part, dir_fd=fd))
                nxt = open_dir_nofollow(os.path.normpath(target), create, _depth + 1)
            os.close(fd)
            fd = nxt
            walked = os.path.join(walked, part)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _walk_below(fd: int, parts: list[str], create: bool) -> int:
    """From directory ``fd`` down ``parts`` (made if ``create``), no link crossed; a new
    fd (``fd`` itself stays open)."""
    cur = os.dup(fd)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, f"bad path component {part!r}")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=cur)
            nxt = os.open(part, _DIR, dir_fd=cur)
            os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        os.close(cur)
        raise


class LocalDir:
    """A checkpoint directory on a local (or mounted) file system."""

    kind = "local"

    def __init__(self, uri: str) -> None:
        self.path = Path(uri.removeprefix("file://")).absolute()
        self.uri = str(self.path)

    def file(self, name: str) -> Path:
        return self.path / name

    def sizes(self) -> dict[str, int]:
        if not self.path.is_dir():
            return {}
        return {
            p.relative_to(self.path).as_posix(): p.stat().st_size
            for p in self.path.rglob("*")
            if p.is_file()
        }

    def read(self, name: str) -> bytes | None:
        try:
            return self.file(name).read_bytes()
        except FileNotFoundError:
            return None

    def size(self, name: str) -> int | None:
        try:
            return self.file(name).stat().st_size
        except FileNotFoundError:
            return None

    def _parent(self, name: str, create: bool) -> tuple[int, str]:
        """(fd of the directory holding ``name``, its last component); no link crossed."""
        *dirs, leaf = name.split("/")
        root = open_dir_nofollow(self.path, create)
        try:
            return _walk_below(root, dirs, create), leaf
        finally:
            os.close(root)

    def open_write(self, name: str) -> BinaryIO:
        """``name`` opened for writing (made, or truncated), through no link."""
        parent, leaf = self._parent(name, create=True)
        try:
            fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=parent)
        finally:
            os.close(parent)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{self.file(name)} is not a regular file")
        return os.fdopen(fd, "wb")

    def write_durable(self, name: str, data: bytes) -> None:
        parent, leaf = self._parent(name, create=True)
        try:
            tmp = leaf + ".tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644, dir_fd=parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, leaf, src_dir_fd=parent, dst_dir_fd=parent)
            with contextlib.suppress(OSError):
                os.fsync(parent)
        finally:
            os.close(parent)

    def delete(self, names: list[str]) -> None:
        for n in names:
            with contextlib.suppress(OSError):
                parent, leaf = self._parent(n, create=False)
                try:
                    os.unlink(leaf, dir_fd=parent)
                finally:
                    os.close(parent)

    def cleanup(self) -> None:
        with contextlib.suppress(OSError):
            parent = open_dir_nofollow(self.path.parent)
            try:
                shutil.rmtree(self.path.name, ignore_errors=True, dir_fd=parent)
            finally:
                os.close(parent)


class S3Dir:
    """A checkpoint directory: a prefix in an S3 bucket."""

    kind = "s3"

    def __init__(self, uri: str, client: Any) -> None:
        self.bucket, self.prefix = split_s3_uri(uri)
        self.uri = uri.rstrip("/")
        self.client = client

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def sizes(self) -> dict[str, int]:
        base = self.key("")
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base
        )
        return {o["Key"][len(base) :]: int(o["Size"]) for p in pages for o in p.get("Contents", [])}

    def read(self, name: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
        except Exception as exc:  # noqa: BLE001
            if error_code(exc)[0] in {"NoSuchKey", "404"} or error_code(exc)[1] == 404:
                return None
            raise

    def head(self, name: str) -> dict[str, Any] | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key(name))
        except Exception as exc:  # noqa: BLE001
            if error_code(exc)[1] == 404:
                return None
            raise

    def size(self, name: str) -> int | None:
        h = self.head(name)
        return None if h is None else int(h["ContentLength"])

    def write_durable(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def delete(self, names: list[str]) -> None:
        if len(names) == 1:
            self.client.delete_object(Bucket=self.bucket, Key=self.key(names[0]))
            return
        for i in range(0, len(names), 1000):
            objs = [{"Key": self.key(n)} for n in names[i : i + 1000]]
            with contextlib.suppress(Exception):
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objs, "Quiet": True}
                )

    def cleanup(self) -> None:
        """Delete everything under the dir and abort multipart uploads left behind."""
        with contextlib.suppress(Exception):
            self.delete(list(self.sizes()))
        with contextlib.suppress(Exception):
            ups = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.key(""))
            for u in ups.get("Uploads", []):
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"]
                )


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def place(uri: str, client: Any) -> LocalDir | S3Dir:
    """The directory a checkpoint URI names (``s3://`` or a local path)."""
    check_scheme(uri)
    return S3Dir(uri, client) if uri.startswith("s3://") else LocalDir(uri)
